// fuscoMoeDispatch and fuscoMoeCombine on fuscoMemCuda comms: the same plan and the same engine
// operations as on the host, with the plan's index lists on the device and the rows moved by
// kernels (engine_device.h). Dispatch: one pass, source rows straight into the receivers' final
// expert-major rows (replicated per local expert). Combine: one pull operation; each source's
// kernel reads its tokens' rows straight from every rank's expert output (mapped through CUDA
// IPC) and writes the weighted sum in the fixed order of API.md: one pass, no partials, no
// landing area, and the routing weights never leave the source.
#include <cstring>
#include <vector>

#include "api/moe_device.h"
#include "api/moe_handle.h"
#include "device/device_ops.h"

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

// The combine sum's terms, read from the ranks' expert outputs (API.md's tree on one node): per
// token, one group per rank that holds rows of it (rank ascending), closed by `last`; in a group,
// each of the token's (t, k) rows at that rank, weighted, in the order the rank received them (its
// fan rows, as it sent this rank in remoteFanRows).
struct SumTerms {
  std::vector<uint32_t> start, rank;  // start: [numTokens + 1]
  std::vector<int64_t> row, weight;
  std::vector<uint8_t> last;
};

void combineSumTerms(const fuscoMoeHandle& h, SumTerms* st) {
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

fuscoResult_t uploadMoePlan(fuscoMoeHandle& h, void* stream) {
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
  const size_t pad = pk.take(h.recv.paddingRows.size() * 8);
  const size_t tstart = pk.take(st.start.size() * 4), trank = pk.take(st.rank.size() * 4);
  const size_t trow = pk.take(st.row.size() * 8), twt = pk.take(st.weight.size() * 8);
  const size_t tlast = pk.take(st.last.size());
  FUSCO_CHECK(h.devBuffer.reserve(pk.at));
  char* host = h.devBuffer.host();
  for (int p = 0; p < n; ++p) {
    put(host, sRows[p], h.send.rows[p]);
    put(host, rFan[p], h.remoteFanRows[p]);
    put(host, sK[p], h.send.kStart[p]);
    put(host, rStart[p], h.recv.fanStart[p]);
    put(host, rRows[p], h.recv.fanRows[p]);
  }
  put(host, pad, h.recv.paddingRows);
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
  dv.paddingRows = reinterpret_cast<const int64_t*>(d + pad);
  dv.termStart = reinterpret_cast<const uint32_t*>(d + tstart);
  dv.termRank = reinterpret_cast<const uint32_t*>(d + trank);
  dv.termRow = reinterpret_cast<const int64_t*>(d + trow);
  dv.termWeight = reinterpret_cast<const int64_t*>(d + twt);
  dv.termLast = reinterpret_cast<const uint8_t*>(d + tlast);
  return fuscoSuccess;
}

fuscoResult_t deviceDispatch(fuscoMoeHandle& h, const void* x, size_t rowBytes, void* recvX, ArgCheck a,
                             void* stream, std::vector<PeerWork>* work) {
  Communicator& c = *h.comm->impl;
  const int n = c.nranks();
  if (a.status == fuscoSuccess) joinFailure(c.useDevice(), &a);
  if (a.status == fuscoSuccess) joinFailure(h.devBuffer.waitUploaded(stream), &a);
  if (a.status == fuscoSuccess) {
    for (int p = 0; p < n; ++p) {
      const size_t rows = h.send.rows[p].size();
      auto& w = (*work)[p];
      w.sends.push_back(RowStream::indexed(x, rowBytes, h.dev.sendRows[p], rows));
      w.remoteDst.push_back(RowStream::fanOut(nullptr, rowBytes, h.dev.sendKStart[p], h.dev.remoteFanRows[p], rows));
      RowStream r = RowStream::fanOut(recvX, rowBytes, h.dev.recvFanStart[p], h.dev.recvFanRows[p], h.recv.rowsFrom(p));
      r.layoutShared = true;
      r.extent = h.recv.numRecvRows * rowBytes;
      w.recvs.push_back(r);
    }
    joinFailure(deviceZeroRows(recvX, rowBytes, h.dev.paddingRows, h.recv.paddingRows.size(), stream), &a);
  }
  return runMoeOp(h.comm, "fuscoMoeDispatch", a, *work, false, stream, true);
}

fuscoResult_t deviceCombine(fuscoMoeHandle& h, const void* expertOut, fuscoDataType_t dt, size_t hidden,
                            const float* topkWeights, void* out, ArgCheck a, void* stream,
                            std::vector<PeerWork>* workOut) {
  Communicator& c = *h.comm->impl;
  const int n = c.nranks(), me = c.rank();
  const size_t rowOut = hidden * dataTypeSize(dt);
  if (a.status == fuscoSuccess) joinFailure(c.useDevice(), &a);
  if (a.status == fuscoSuccess) joinFailure(h.devBuffer.waitUploaded(stream), &a);
  // Peers read this rank's expert output in place when every one of them can map it (fuscoMemAlloc
  // or registered), else a copy of it in the comm's scratch.
  const size_t extent = h.recv.numRecvRows * rowOut;
  const char* offered = static_cast<const char*>(expertOut);
  bool mappable = true;
  uint64_t token = 0;
  for (int p = 0; p < n && mappable && extent > 0 && a.status == fuscoSuccess; ++p)
    mappable = p == me || c.regionToken(p, expertOut, extent, &token);
  if (a.status == fuscoSuccess && !mappable) {
    char* copy = joinScratch(c, kExpertCopyScratch, extent, &a);
    if (copy != nullptr) joinFailure(deviceCopy({flatCopyTask(expertOut, copy, extent)}, stream), &a);
    offered = copy;
  }
  // The sum kernel's table of the ranks' bases in the comm's scratch: allocated before any flag
  // is posted, filled on the stream once the peers' buffers are mapped.
  char* basesDev = joinScratch(c, kBasesScratch, n * sizeof(char*), &a);
  // One pull operation: the message from p is the (t, k) rows this rank sent p, read by this
  // rank's sum kernel in p's expert output.
  std::vector<PeerWork>& work = *workOut;
  for (int p = 0; p < n && a.status == fuscoSuccess; ++p) {
    RowStream s = RowStream::indexed(offered, rowOut, nullptr, h.recv.fanRows[p].size());
    s.extent = extent;
    work[p].sends.push_back(s);
    work[p].recvs.push_back(RowStream::indexed(nullptr, rowOut, nullptr, h.send.kSlots[p].size()));
  }
  auto sum = [&h, basesDev, n, dt, hidden, topkWeights, out](const std::vector<const char*>& bases,
                                                                void* s) -> fuscoResult_t {
    if (h.numTokens == 0) return fuscoSuccess;
    const char** table = reinterpret_cast<const char**>(basesDev);
    FUSCO_CHECK(deviceStorePointers(table, bases.data(), n, s));
    DevFinalSum f;
    f.bases = table;
    f.basesAligned = true;
    for (const char* b : bases) f.basesAligned = f.basesAligned && (reinterpret_cast<uintptr_t>(b) & 15) == 0;
    f.termStart = h.dev.termStart;
    f.termRank = h.dev.termRank;
    f.termRow = h.dev.termRow;
    f.termWeight = h.dev.termWeight;
    f.termLast = h.dev.termLast;
    f.weights = topkWeights;
    f.out = static_cast<char*>(out);
    f.ntokens = h.numTokens;
    return deviceFinalSum(dt, hidden, f, s);
  };
  return runMoeOp(h.comm, "fuscoMoeCombine", a, work, false, stream, true, sum);
}

}  // namespace fusco
