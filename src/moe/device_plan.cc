// The plan's index lists on the device for fuscoMemCuda comms: one packed upload per plan
// (stream-ordered; dispatch and combine wait for it), including the terms of combine's sum at the
// source in the fixed order of docs/API.md.
#include <algorithm>
#include <cstring>
#include <vector>

#include "moe/moe_exec.h"

namespace fusco {

namespace {

// Places sections in one buffer, each 16-byte aligned.
struct Packer {
  size_t at = 0;
  size_t take(size_t bytes) {
    size_t off = at;
    at += (bytes + 15) / 16 * 16;
    return off;
  }
};

template <typename T>
void put(char* host, size_t off, const std::vector<T>& v) {
  if (!v.empty()) memcpy(host + off, v.data(), v.size() * sizeof(T));
}

// The combine sum's terms, read from the ranks' expert outputs (docs/API.md's tree on one node):
// per token, one group per rank that holds rows of it (rank ascending), closed by `last`; in a
// group, each of the token's (t, k) rows at that rank, weighted, in the order the rank received
// them (its fan rows, as it sent this rank in remoteFanRows).
struct SumTerms {
  std::vector<uint32_t> start, rank;  // start: [numTokens + 1]
  std::vector<int64_t> row, weight;
  std::vector<uint8_t> last;
};

void combineSumTerms(const MoeHandle& h, SumTerms* st) {
  const int n = h.shape.nranks;
  std::vector<size_t> cursor(n, 0);
  st->start.assign(1, 0);
  for (size_t t = 0; t < h.numTokens; ++t) {
    for (int r = 0; r < n; ++r) {
      const auto& rows = h.send.rows[r];
      size_t& cur = cursor[r];
      if (cur >= rows.size() || rows[cur] != static_cast<int64_t>(t)) continue;
      for (; cur < rows.size() && rows[cur] == static_cast<int64_t>(t); ++cur) {
        for (uint32_t j = h.send.kStart[r][cur]; j < h.send.kStart[r][cur + 1]; ++j) {
          st->rank.push_back(static_cast<uint32_t>(r));
          st->row.push_back(h.remoteFanRows[r][j]);
          st->weight.push_back(h.weightIdx[r][j]);  // t * topk + k (buildWeightIndex)
          st->last.push_back(0);
        }
      }
      if (!st->last.empty()) st->last.back() = 1;
    }
    st->start.push_back(static_cast<uint32_t>(st->row.size()));
  }
}

}  // namespace

fuscoResult_t uploadMoePlan(MoeHandle& h, void* stream) {
  const int n = h.shape.nranks;
  SumTerms st;
  combineSumTerms(h, &st);
  Packer pk;
  std::vector<size_t> sRows(n), rFan(n), sK(n), rStart(n), rRows(n);
  for (int p = 0; p < n; ++p) {
    sRows[p] = pk.take(h.send.rows[p].size() * 8);
    rFan[p] = pk.take(h.remoteFanRows[p].size() * 8);
    sK[p] = pk.take(h.send.kStart[p].size() * 4);
    rStart[p] = pk.take(h.recv.fanStart[p].size() * 4);
    rRows[p] = pk.take(h.recv.fanRows[p].size() * 8);
  }
  static_assert(sizeof(RowRange) == 16, "a padding range is two int64s on the device");
  const size_t pad = pk.take(h.recv.padding.size() * sizeof(RowRange));
  const size_t tstart = pk.take(st.start.size() * 4), trank = pk.take(st.rank.size() * 4);
  const size_t trow = pk.take(st.row.size() * 8), twt = pk.take(st.weight.size() * 8);
  const size_t tlast = pk.take(st.last.size());
  // The host side is rewritten once the previous upload's copy is done; the upload waits for the
  // dispatches and combines that read the previous lists (DeviceBuffer::markUsed).
  FUSCO_CHECK(h.devBuffer.reserve(pk.at, h.comm->timeoutMs()));
  char* host = h.devBuffer.host();
  for (int p = 0; p < n; ++p) {
    put(host, sRows[p], h.send.rows[p]);
    put(host, rFan[p], h.remoteFanRows[p]);
    put(host, sK[p], h.send.kStart[p]);
    put(host, rStart[p], h.recv.fanStart[p]);
    put(host, rRows[p], h.recv.fanRows[p]);
  }
  put(host, pad, h.recv.padding);
  put(host, tstart, st.start);
  put(host, trank, st.rank);
  put(host, trow, st.row);
  put(host, twt, st.weight);
  put(host, tlast, st.last);
  FUSCO_CHECK(h.devBuffer.upload(pk.at, stream));
  const char* d = h.devBuffer.device();
  auto& dv = h.dev;
  dv.sendRows.resize(n), dv.remoteFanRows.resize(n), dv.recvFanRows.resize(n);
  dv.sendKStart.resize(n), dv.recvFanStart.resize(n);
  for (int p = 0; p < n; ++p) {
    dv.sendRows[p] = reinterpret_cast<const int64_t*>(d + sRows[p]);
    dv.remoteFanRows[p] = reinterpret_cast<const int64_t*>(d + rFan[p]);
    dv.sendKStart[p] = reinterpret_cast<const uint32_t*>(d + sK[p]);
    dv.recvFanStart[p] = reinterpret_cast<const uint32_t*>(d + rStart[p]);
    dv.recvFanRows[p] = reinterpret_cast<const int64_t*>(d + rRows[p]);
  }
  dv.paddingRanges = reinterpret_cast<const int64_t*>(d + pad);
  dv.paddingLongest = 0;
  for (const RowRange& r : h.recv.padding) dv.paddingLongest = std::max(dv.paddingLongest, r.count);
  dv.termStart = reinterpret_cast<const uint32_t*>(d + tstart);
  dv.termRank = reinterpret_cast<const uint32_t*>(d + trank);
  dv.termRow = reinterpret_cast<const int64_t*>(d + trow);
  dv.termWeight = reinterpret_cast<const int64_t*>(d + twt);
  dv.termLast = reinterpret_cast<const uint8_t*>(d + tlast);
  return fuscoSuccess;
}

}  // namespace fusco
