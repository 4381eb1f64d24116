// fuscoMoeDispatch and fuscoMoeCombine on fuscoMemCuda comms: the same plan and the same engine
// operations as on the host, with the plan's index lists on the device and the rows moved by
// kernels (engine_device.h). Dispatch: one pass, source rows straight into the receivers' final
// expert-major rows (replicated per local expert). Combine: one operation too; the source gathers
// its routing weights into its landing area, each expert rank's kernel reads them there and writes
// one weighted partial per (token, rank) straight into the source's landing rows, then the source
// sums them in the fixed order of API.md.
#include <cstring>
#include <vector>

#include "api/moe_device.h"
#include "api/moe_handle.h"
#include "device/device_ops.h"

namespace fusco {

namespace {

enum ScratchSlot { kLandingScratch = 1 };

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

// The final sum's terms (API.md's tree on one node): per token, one group per rank that holds a
// row of it (rank ascending), termLast closing each group; RANK: the rank's partial; NONE: the
// token's raw rows from that rank, weighted (k order).
struct FinalTerms {
  std::vector<uint32_t> start;  // [numTokens + 1]
  std::vector<int64_t> row, weight;
  std::vector<uint8_t> last;
};

void finalSumTerms(const fuscoMoeHandle& h, FinalTerms* ft) {
  const int n = h.shape.nranks;
  std::vector<size_t> base(n, 0), cursor(n, 0);
  for (int r = 1; r < n; ++r) base[r] = base[r - 1] + h.send.rows[r - 1].size();
  ft->start.assign(1, 0);
  ft->row.clear();
  ft->weight.clear();
  ft->last.clear();
  for (size_t t = 0; t < h.numTokens; ++t) {
    for (int r = 0; r < n; ++r) {
      const auto& rows = h.send.rows[r];
      size_t& cur = cursor[r];
      if (cur >= rows.size() || rows[cur] != static_cast<int64_t>(t)) continue;
      for (; cur < rows.size() && rows[cur] == static_cast<int64_t>(t); ++cur) {
        ft->row.push_back(static_cast<int64_t>(base[r] + cur));
        ft->weight.push_back(h.dedup == Dedup::None
                                 ? static_cast<int64_t>(t) * h.topk + h.send.kSlots[r][h.send.kStart[r][cur]]
                                 : -1);
        ft->last.push_back(0);
        if (h.dedup != Dedup::None) {
          ++cur;
          break;
        }
      }
      ft->last.back() = 1;
    }
    ft->start.push_back(static_cast<uint32_t>(ft->row.size()));
  }
}

}  // namespace

fuscoResult_t uploadMoePlan(fuscoMoeHandle& h, void* stream) {
  const int n = h.shape.nranks;
  FinalTerms ft;
  finalSumTerms(h, &ft);
  Packer pk;
  std::vector<size_t> sRows(n), rFan(n), wIdx(n), sK(n), rStart(n), rRows(n);
  for (int p = 0; p < n; ++p) {
    sRows[p] = pk.take(h.send.rows[p].size() * 8);
    rFan[p] = pk.take(h.remoteFanRows[p].size() * 8);
    wIdx[p] = pk.take(h.weightIdx[p].size() * 8);
    sK[p] = pk.take(h.send.kStart[p].size() * 4);
    rStart[p] = pk.take(h.recv.fanStart[p].size() * 4);
    rRows[p] = pk.take(h.recv.fanRows[p].size() * 8);
  }
  const size_t pad = pk.take(h.recv.paddingRows.size() * 8);
  const size_t tstart = pk.take(ft.start.size() * 4), trow = pk.take(ft.row.size() * 8);
  const size_t twt = pk.take(ft.weight.size() * 8), tlast = pk.take(ft.last.size());
  const size_t ones = pk.take(h.numTokens * h.topk * sizeof(float));
  FUSCO_CHECK(h.devBuffer.reserve(pk.at));
  char* host = h.devBuffer.host();
  for (int p = 0; p < n; ++p) {
    put(host, sRows[p], h.send.rows[p]);
    put(host, rFan[p], h.remoteFanRows[p]);
    put(host, wIdx[p], h.weightIdx[p]);
    put(host, sK[p], h.send.kStart[p]);
    put(host, rStart[p], h.recv.fanStart[p]);
    put(host, rRows[p], h.recv.fanRows[p]);
  }
  put(host, pad, h.recv.paddingRows);
  put(host, tstart, ft.start);
  put(host, trow, ft.row);
  put(host, twt, ft.weight);
  put(host, tlast, ft.last);
  const std::vector<float> one(h.numTokens * h.topk, 1.0f);
  put(host, ones, one);
  FUSCO_CHECK(h.devBuffer.upload(pk.at, stream));
  const char* d = h.devBuffer.device();
  auto& dv = h.dev;
  dv.sendRows.resize(n), dv.remoteFanRows.resize(n), dv.recvFanRows.resize(n), dv.weightIdx.resize(n);
  dv.sendKStart.resize(n), dv.recvFanStart.resize(n);
  for (int p = 0; p < n; ++p) {
    dv.sendRows[p] = reinterpret_cast<const int64_t*>(d + sRows[p]);
    dv.remoteFanRows[p] = reinterpret_cast<const int64_t*>(d + rFan[p]);
    dv.weightIdx[p] = reinterpret_cast<const int64_t*>(d + wIdx[p]);
    dv.sendKStart[p] = reinterpret_cast<const uint32_t*>(d + sK[p]);
    dv.recvFanStart[p] = reinterpret_cast<const uint32_t*>(d + rStart[p]);
    dv.recvFanRows[p] = reinterpret_cast<const int64_t*>(d + rRows[p]);
  }
  dv.paddingRows = reinterpret_cast<const int64_t*>(d + pad);
  dv.termStart = reinterpret_cast<const uint32_t*>(d + tstart);
  dv.termRow = reinterpret_cast<const int64_t*>(d + trow);
  dv.termWeight = reinterpret_cast<const int64_t*>(d + twt);
  dv.termLast = reinterpret_cast<const uint8_t*>(d + tlast);
  dv.ones = reinterpret_cast<const float*>(d + ones);
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
  const int n = c.nranks();
  const size_t rowOut = hidden * dataTypeSize(dt);
  if (a.status == fuscoSuccess) joinFailure(c.useDevice(), &a);
  if (a.status == fuscoSuccess) joinFailure(h.devBuffer.waitUploaded(stream), &a);
  // The landing area: first, per expert rank p, the routing weights p's kernel reads from here
  // (RANK: one per row p received from this rank, in p's order), then every rank's partial rows
  // (or raw rows, NONE) in rank order, as the final sum's terms index them.
  const bool weighted = h.dedup != Dedup::None;
  std::vector<size_t> wAt(n, 0), rowsAt(n, 0);
  size_t wBytes = 0, rowBytes = 0;
  for (int p = 0; p < n; ++p) {
    wAt[p] = wBytes;
    if (weighted) wBytes += (h.weightIdx[p].size() * sizeof(float) + 15) / 16 * 16;
  }
  for (int p = 0; p < n; ++p) rowsAt[p] = wBytes + rowBytes, rowBytes += h.send.rows[p].size() * rowOut;
  char* landing = joinScratch(c, kLandingScratch, wBytes + rowBytes, &a);
  if (weighted && a.status == fuscoSuccess) {
    std::vector<DevGatherTask> gather(n);
    for (int p = 0; p < n; ++p)
      gather[p] = DevGatherTask{topkWeights ? topkWeights : h.dev.ones, h.dev.weightIdx[p],
                                reinterpret_cast<float*>(landing + wAt[p]), h.weightIdx[p].size()};
    joinFailure(deviceGatherFloats(gather, stream), &a);
  }
  // One operation: each expert rank's kernel reads the weights and writes one partial (RANK) or
  // raw row (NONE) per received row straight into the source's landing rows.
  std::vector<DevProducer> producers(n);
  std::vector<PeerWork>& work = *workOut;
  for (int p = 0; p < n && a.status == fuscoSuccess; ++p) {
    const size_t back = h.recv.rowsFrom(p);
    if (weighted) {
      producers[p] = DevProducer{dt, hidden, static_cast<const char*>(expertOut), h.dev.recvFanStart[p],
                                 h.dev.recvFanRows[p], h.recv.fanRows[p].size()};
      RowStream s = RowStream::indexed(nullptr, rowOut, nullptr, back);
      s.devProduce = &producers[p];
      work[p].sends.push_back(s);
    } else {
      work[p].sends.push_back(RowStream::indexed(expertOut, rowOut, h.dev.recvFanRows[p], back));
    }
    RowStream r = RowStream::flat(landing + rowsAt[p], h.send.rows[p].size() * rowOut);
    r.pullBytes = weighted ? rowsAt[p] - wAt[p] : 0;
    work[p].recvs.push_back(r);
  }
  FUSCO_CHECK(runMoeOp(h.comm, "fuscoMoeCombine", a, work, false, stream, true));
  // The source's sum over ranks, in rank order.
  DevFinalSum f;
  f.landing = landing + wBytes;
  f.termStart = h.dev.termStart;
  f.termRow = h.dev.termRow;
  f.termWeight = h.dev.termWeight;
  f.termLast = h.dev.termLast;
  f.weights = topkWeights;
  f.out = static_cast<char*>(out);
  f.ntokens = h.numTokens;
  return deviceFinalSum(dt, hidden, f, stream);
}

}  // namespace fusco
