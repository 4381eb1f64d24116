// What NODE dedup's dispatch and combine share: the walk over the segments crossing one network
// pair, and the gates of messages that pass on rows landing in the same operation.
#pragma once

#include <cstddef>
#include <cstdint>

#include "moe/moe_handle.h"

namespace fusco {

// The network side of NODE dedup's pair with remote rank p, in global segment order: fn(g, j) for
// every segment crossing between this rank's NIC and forwarder p; j is g's index in st.relayed
// when this rank relays g for a peer of its node, -1 when g is this rank's own.
template <typename Fn>
void forEachSegmentViaNic(const MoeHandle::NodeState& st, const NodeMap& nodes, int me, int p,
                          Fn fn) {
  // A relay is a rank of its source's node, so only this node's ranks' segments (ascending rank,
  // hence in segment order, as st.relayed) can leave through this rank's NIC.
  size_t j = 0;
  for (int s : nodes.ranksOfNode[nodes.nodeOf[me]]) {
    const auto [first, last] = segmentsOf(st.segs, s);
    for (size_t i = first; i < last; ++i) {
      const NodeSegment& g = st.segs[i];
      if (g.relay != me) continue;
      if (g.forwarder == p) fn(g, s != me ? static_cast<ptrdiff_t>(j) : ptrdiff_t{-1});
      j += s != me;
    }
  }
}

// A relay's pass-through of a contiguous stream: whatever has landed may leave.
inline size_t landedBytes(const void* ctx) { return *static_cast<const size_t*>(ctx); }

// A forwarder's send of rows that land in the same operation: rows[i] of the staging area may
// be read once the bytes up to its end have landed (rows ascending).
struct LandedRows {
  const int64_t* rows = nullptr;
  size_t nrows = 0, rowBytes = 0;
  const size_t* landed = nullptr;
  mutable size_t ready = 0;

  static size_t bytesReady(const void* ctx) {
    const LandedRows& g = *static_cast<const LandedRows*>(ctx);
    while (g.ready < g.nrows && static_cast<size_t>(g.rows[g.ready] + 1) * g.rowBytes <= *g.landed)
      ++g.ready;
    return g.ready * g.rowBytes;
  }
};

// A stream that may leave as far as *landed allows.
inline RowStream gatedOnLanded(RowStream s, const size_t* landed) {
  s.ready = &landedBytes;
  s.readyCtx = landed;
  return s;
}

}  // namespace fusco
