// Node-level dedup (FUSCO_DEDUP_NODE): a token crosses the network once per remote node, to a
// forwarder rank there, which fans it out over the intra-node path to the ranks of its node that
// need it, straight into their final rows. Pure host code, like the rest of the planner.
//
// Protocol (run by the API layer over the engine, after the RANK plan of moe_plan.h):
//   1. Every rank counts its tokens per remote node; the counts are all-gathered and every rank
//      runs the same balancer (balance.h), so all ranks know every route: a segment is the rows
//      of one route, tokens [pos0, pos0 + rows) of what src sends to node, leaving through the
//      relay's NIC and landing at the forwarder.
//   2. The source sends each forwarder the forward metadata of its segments: per local rank, the
//      segment's rows it needs and their RANK metadata (planNodeSend).
//   3. Each forwarder checks and keeps those per-rank blocks (planNodeForward) and sends every
//      rank of its node one block per segment (nodeBlocksFor): the rows it will forward there, in
//      the RANK metadata format.
//   4. Each rank assembles, per remote source, exactly the metadata RANK dedup would have sent it
//      (planNodeReceive), so its receive plan, and hence recvX, is the same in every mode.
// Combine mirrors the path: partial sums per (token, rank) go to the forwarder, which adds them
// over its node's ranks (rank ascending: the fixed tree's middle level) and sends one row per
// (token, node) back across the network.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/topology.h"
#include "fusco.h"
#include "plan/balance.h"
#include "plan/moe_plan.h"

namespace fusco {

// relay: the rank whose NIC carries the rows (src, or a rank of src's node that receives them
// over the intra-node path first and passes them on as they land); forwarder: a rank of node.
struct NodeSegment {
  int src = 0, node = 0, route = 0, relay = 0, forwarder = 0;
  uint64_t pos0 = 0, rows = 0;
};

// Every segment of the communicator, ordered by (src, node, route); the same on every rank. The
// functions below that take segments expect exactly this list: they find a rank's own segments
// by binary search on that order.
std::vector<NodeSegment> nodeSegments(const NodeMap& nodes, const BalancePlan& plan);
// The same list written into *out, reusing its storage (no allocation once sizes settle).
void nodeSegmentsInto(const NodeMap& nodes, const BalancePlan& plan, std::vector<NodeSegment>* out);

// [first, last): the indices of src's segments to `node` (node < 0: to every node) in segs, a
// list ordered as nodeSegments makes it. O(log segs.size()).
std::pair<size_t, size_t> segmentsOf(const std::vector<NodeSegment>& segs, int src, int node = -1);

// What one rank sends across the network under NODE dedup.
struct NodeSendPlan {
  std::vector<std::vector<int64_t>>
      nodeTokens;                             // [numNodes] tokens with an expert there, ascending
  std::vector<size_t> segs;                   // this rank's segments (indices), global order
  std::vector<std::vector<int32_t>> fwdMeta;  // [nranks] forward metadata for forwarder f
  // planNodeSend's working storage, kept so that planning layer after layer reuses it.
  struct Scratch {
    // token -> segment (of those being planned) << 32 | its row there; SIZE_MAX: not in them
    std::vector<size_t> tokenRow;
    std::vector<uint64_t> blockSize;  // per (segment, local rank) block: rows, then metadata words
    std::vector<int32_t*> blockAt;    // per block: where its next row, and next metadata word, go
    std::vector<size_t> segStart;  // per segment being planned: its start in its forwarder's list
  } scratch;
};

// Tokens per node of this rank (nodeTokens), for the balancer's counts and planNodeSend, read
// from the routing (the API takes the cheaper form below; tests and perf use this one as an
// independent check and where no send plan exists). The lists' storage is reused.
void nodeTokensOf(const MoeShape& shape, const NodeMap& nodes, const int64_t* topkIdx,
                  size_t numTokens, int topk, std::vector<std::vector<int64_t>>* nodeTokens);
// The same lists from this rank's send plan (planSend's output, RANK or NONE) for that routing:
// the union of the rows sent to each node's ranks. Cheaper than reading the routing again.
void nodeTokensOf(const NodeMap& nodes, const MoeSendPlan& plan,
                  std::vector<std::vector<int64_t>>* nodeTokens);

// This rank's row of the balancer's counts (planBalance's rowsTo): out[node] = the tokens it
// sends to each remote node (nodeTokens[node].size()), 0 for its own node; out holds numNodes
// entries. Returns their sum: the rows this rank puts on the network.
uint64_t remoteNodeRows(const NodeMap& nodes, int rank,
                        const std::vector<std::vector<int64_t>>& nodeTokens, uint64_t* out);

// Builds the forward metadata from the RANK plan (rankPlan, planSend's output) of this rank: for
// each segment, for each local rank lr of its node in order, a block [c, c rows of the segment
// (ascending, counted from the segment's first row) that lr needs, w, w words of lr's RANK
// metadata for those rows]. Blocks are rank-major, so building and reading them runs long
// regular loops rather than one short loop per row. out->nodeTokens must hold nodeTokensOf's lists
// for the routing rankPlan was made from. Cost: O(numTokens + log segs.size()) plus the rows of
// this rank's segments and the RANK rows of their nodes' ranks; out's vectors (fwdMeta, scratch)
// keep their storage.
void planNodeSend(const NodeMap& nodes, int rank, const MoeSendPlan& rankPlan,
                  const std::vector<NodeSegment>& segs, NodeSendPlan* out);

// One segment this rank forwards.
struct NodeFwdSeg {
  size_t seg = 0;                            // index into the segments
  std::vector<std::vector<int64_t>> rowsTo;  // [localSize] staging rows for local rank lr
  std::vector<std::vector<int32_t>> meta;    // [localSize] their RANK-format metadata
  // Combine: the partials of staging row i come from termLr[termStart[i] .. termStart[i+1])
  // (local ranks ascending), row termIdx[...] of what that rank returns for this segment.
  std::vector<uint32_t> termStart;
  std::vector<int32_t> termLr;
  std::vector<uint32_t> termIdx;
};

// The segments this rank forwards, in global order, from the forward metadata each source sent
// (metaFrom[s]; only remote sources are read). fuscoRemoteError naming the source if malformed.
fuscoResult_t planNodeForward(const MoeShape& shape, const NodeMap& nodes, int rank,
                              const std::vector<NodeSegment>& segs,
                              const std::vector<std::vector<int32_t>>& metaFrom,
                              std::vector<NodeFwdSeg>* out);

// The blocks this forwarder sends local rank lr: per forwarded segment, [src, route, rows,
// metaLen, meta...].
void nodeBlocksFor(const std::vector<NodeFwdSeg>& fwd, const std::vector<NodeSegment>& segs, int lr,
                   std::vector<int32_t>* out);

// A segment forwarded to this rank: rows [rowOffset, rowOffset + rows) of its rows from src.
struct NodeInSeg {
  size_t seg = 0;
  size_t rowOffset = 0, rows = 0;
};

// Appends to metaFrom[s] (remote s, empty on entry) the metadata of every segment forwarded to
// this rank, in route order, from blocksFrom[f] (the blocks of each forwarder f of this node);
// inFrom[f] lists f's segments in the order f sends them. fuscoRemoteError if a block is missing
// or malformed.
fuscoResult_t planNodeReceive(const NodeMap& nodes, int rank, const std::vector<NodeSegment>& segs,
                              const std::vector<std::vector<int32_t>>& blocksFrom,
                              std::vector<std::vector<int32_t>>* metaFrom,
                              std::vector<std::vector<NodeInSeg>>* inFrom);

}  // namespace fusco
