// fuscoMoeDispatch and fuscoMoeCombine: one engine operation for dispatch, two for combine
// (routing weights to the expert side, then one partial row per (token, rank) back).
//
// Dispatch writes each row straight into its final expert-major rows: in the receiver's buffer
// when it can be mapped (the sender knows the receiver's fan rows from the plan), else through a
// staging slot that the receiver scatters. Combine computes each partial row at the expert rank
// directly into the slot (or the source's landing buffer), never into a buffer of its own.
#include <cstring>
#include <vector>

#include "api/api_internal.h"
#include "api/moe_device.h"
#include "api/moe_handle.h"
#include "core/fault.h"
#include "device/reduce.h"
#include "engine/engine.h"

using namespace fusco;

fuscoResult_t fusco::runMoeOp(fuscoComm_t comm, const char* name, const ArgCheck& a,
                              const std::vector<PeerWork>& work, bool agreed, void* stream, bool onDevice) {
  Communicator& c = *comm->impl;
  Op op(c.nranks());
  op.stream = stream;
  op.hostData = !onDevice;
  op.name = name;
  op.kind = OpKind::Moe;
  op.collective = true;
  op.argStatus = a.status;
  op.argError = a.message;
  op.agreed = agreed;
  if (a.status == fuscoSuccess) op.peers = work;
  return runOp(c, op);
}

namespace {

enum ScratchSlot { kLandingScratch = 1 };

struct Traffic {
  size_t intraRows = 0, interRows = 0, intraBytes = 0, interBytes = 0;
  void add(const Communicator& c, int peer, size_t rows, size_t bytes) {
    if (peer == c.rank()) return;  // rows a rank keeps for itself are not traffic
    if (c.nodes().sameNode(c.rank(), peer)) intraRows += rows, intraBytes += bytes;
    else interRows += rows, interBytes += bytes;
  }
};

size_t rowsToSend(const fuscoMoeHandle& h) {
  size_t n = 0;
  for (const auto& r : h.send.rows) n += r.size();
  return n;
}

// Produces bytes of the partial rows for one source: row i = weighted sum (k order) of the
// expert outputs of its fan rows. Slices may cut rows; a cut on an element boundary computes
// just those columns, any other cut goes through one temporary row.
struct PartialSource {
  const fuscoMoeHandle* h;
  int src;
  const char* expertOut;
  fuscoDataType_t dt;
  size_t hidden, rowOut, elem;
  mutable std::vector<const void*> ptrs;
  mutable std::vector<char> tmp;

  void columns(size_t row, size_t col0, size_t ncols, void* dst) const {
    uint32_t b = h->recv.fanStart[src][row], e = h->recv.fanStart[src][row + 1];
    ptrs.clear();
    for (uint32_t f = b; f < e; ++f)
      ptrs.push_back(expertOut + h->recv.fanRows[src][f] * rowOut + col0 * elem);
    weightedSumRows(dt, ncols, ptrs.data(), h->recvWeights[src].data() + b, e - b, dst);
  }

  static void produce(const void* ctx, size_t off, size_t len, void* dst) {
    const PartialSource& p = *static_cast<const PartialSource*>(ctx);
    char* d = static_cast<char*>(dst);
    for (size_t at = 0; at < len;) {
      size_t row = (off + at) / p.rowOut, inRow = (off + at) - row * p.rowOut;
      size_t n = std::min(p.rowOut - inRow, len - at);
      if (inRow % p.elem == 0 && n % p.elem == 0) {
        p.columns(row, inRow / p.elem, n / p.elem, d + at);
      } else {
        p.tmp.resize(p.rowOut);
        p.columns(row, 0, p.hidden, p.tmp.data());
        memcpy(d + at, p.tmp.data() + inRow, n);
      }
      at += n;
    }
  }
};

// out = the fixed tree's sum of rows (one level). A single term needs no arithmetic.
void sumLevel(fuscoDataType_t dt, size_t hidden, const std::vector<const void*>& rows, void* out) {
  if (rows.size() == 1) canonicalCopyRow(dt, hidden, rows[0], out);
  else sumRows(dt, hidden, rows.data(), rows.size(), out);
}

// Source side: out[t] = sum over nodes (ascending) of sum over the node's ranks (ascending) of
// the token's partial from that rank. In NONE mode the partial is formed here from the raw rows.
void finalSum(fuscoMoeHandle& h, const Communicator& c, fuscoDataType_t dt, size_t rowOut, size_t hidden,
              const float* weights, const std::vector<char*>& landing, void* out) {
  const NodeMap& nodes = c.nodes();
  int n = h.shape.nranks;
  std::vector<size_t> cursor(n, 0);
  std::vector<char> rankScratch(n * rowOut), nodeScratch(nodes.numNodes * rowOut);
  std::vector<const void*> rankPtrs, nodePtrs, rowPtrs;
  std::vector<float> w;
  for (size_t t = 0; t < h.numTokens; ++t) {
    nodePtrs.clear();
    for (int node = 0; node < nodes.numNodes; ++node) {
      rankPtrs.clear();
      for (int r : nodes.ranksOfNode[node]) {
        const auto& rows = h.send.rows[r];
        size_t& cur = cursor[r];
        if (cur >= rows.size() || rows[cur] != static_cast<int64_t>(t)) continue;
        if (h.dedup != Dedup::None) {
          rankPtrs.push_back(landing[r] + cur * rowOut);
          ++cur;
          continue;
        }
        rowPtrs.clear();
        w.clear();
        for (; cur < rows.size() && rows[cur] == static_cast<int64_t>(t); ++cur) {
          rowPtrs.push_back(landing[r] + cur * rowOut);
          uint8_t k = h.send.kSlots[r][h.send.kStart[r][cur]];
          w.push_back(weights ? weights[t * h.topk + k] : 1.0f);
        }
        char* dst = rankScratch.data() + r * rowOut;
        weightedSumRows(dt, hidden, rowPtrs.data(), w.data(), rowPtrs.size(), dst);
        rankPtrs.push_back(dst);
      }
      if (rankPtrs.empty()) continue;
      // One node: the node level's sum goes straight to out; the final level (a single term,
      // round(0 + x)) then only turns -0 into +0, in place.
      char* dst = nodes.numNodes == 1 ? static_cast<char*>(out) + t * rowOut
                                      : nodeScratch.data() + node * rowOut;
      sumLevel(dt, hidden, rankPtrs, dst);
      nodePtrs.push_back(dst);
    }
    char* o = static_cast<char*>(out) + t * rowOut;
    if (nodePtrs.empty()) memset(o, 0, rowOut);
    else if (nodePtrs.size() == 1 && nodePtrs[0] == o) canonicalCopyRow(dt, hidden, o, o);
    else sumLevel(dt, hidden, nodePtrs, o);
  }
}

// Routing weights to the expert side (ones when the caller passes none, so every rank ships the
// same shape of message whatever its peers passed).
fuscoResult_t shipWeights(fuscoMoeHandle& h, const float* topkWeights, const ArgCheck& a) {
  Communicator& c = *h.comm->impl;
  int n = c.nranks();
  std::vector<float> ones;
  const float* w = topkWeights;
  if (w == nullptr) {
    ones.assign(h.numTokens * h.topk, 1.0f);
    w = ones.data();
  }
  std::vector<PeerWork> work(n);
  h.recvWeights.resize(n);
  for (int p = 0; p < n && a.status == fuscoSuccess; ++p) {
    work[p].sends.push_back(RowStream::indexed(w, sizeof(float), h.weightIdx[p].data(), h.weightIdx[p].size()));
    h.recvWeights[p].resize(h.recv.fanRows[p].size());
    work[p].recvs.push_back(RowStream::flat(h.recvWeights[p].data(), h.recvWeights[p].size() * sizeof(float)));
  }
  return runMoeOp(h.comm, "fuscoMoeCombine (weights)", a, work);
}

fuscoResult_t combine(fuscoMoeHandle& h, const void* expertOut, fuscoDataType_t dt, size_t hidden,
                      const float* topkWeights, void* out, const ArgCheck& a) {
  Communicator& c = *h.comm->impl;
  int n = c.nranks();
  const size_t elem = dataTypeSize(dt), rowOut = hidden * elem;
  if (h.dedup != Dedup::None) FUSCO_CHECK(shipWeights(h, topkWeights, a));
  // Landing rows for what comes back, in the communicator's scratch (peers write it directly).
  std::vector<char*> landing(n, nullptr);
  size_t total = 0;
  for (int p = 0; p < n; ++p) total += h.send.rows[p].size() * rowOut;
  char* base = nullptr;
  if (a.status == fuscoSuccess && total > 0) FUSCO_CHECK(c.scratch(kLandingScratch, total, &base));
  std::vector<PartialSource> sources(n);
  std::vector<PeerWork> work(n);
  size_t at = 0;
  for (int p = 0; p < n && a.status == fuscoSuccess; ++p) {
    size_t back = h.recv.rowsFrom(p);
    if (h.dedup != Dedup::None) {
      sources[p] = PartialSource{&h, p, static_cast<const char*>(expertOut), dt, hidden, rowOut, elem, {}, {}};
      work[p].sends.push_back(RowStream::produced(rowOut, back, &PartialSource::produce, &sources[p]));
    } else {
      work[p].sends.push_back(RowStream::indexed(expertOut, rowOut, h.recv.fanRows[p].data(), back));
    }
    landing[p] = base + at;
    size_t bytes = h.send.rows[p].size() * rowOut;
    work[p].recvs.push_back(RowStream::flat(landing[p], bytes));
    at += bytes;
  }
  // After the weights exchange every rank knows the call is valid everywhere.
  FUSCO_CHECK(runMoeOp(h.comm, "fuscoMoeCombine", a, work, h.dedup != Dedup::None));
  finalSum(h, c, dt, rowOut, hidden, topkWeights, landing, out);
  return fuscoSuccess;
}

// Dispatch on a host comm: rows by token index, written straight into the receivers' final rows
// when their buffer is mappable (the plan told each source the receiver's fan rows), else staged.
fuscoResult_t hostDispatch(fuscoMoeHandle& h, const void* x, size_t rowBytes, void* recvX, const ArgCheck& a,
                           std::vector<PeerWork>* work) {
  const int n = h.shape.nranks;
  for (int p = 0; p < n && a.status == fuscoSuccess; ++p) {
    const size_t rows = h.send.rows[p].size();
    auto& w = (*work)[p];
    w.sends.push_back(RowStream::indexed(x, rowBytes, h.send.rows[p].data(), rows));
    w.remoteDst.push_back(RowStream::fanOut(nullptr, rowBytes, h.send.kStart[p].data(), h.remoteFanRows[p].data(), rows));
    RowStream r = RowStream::fanOut(recvX, rowBytes, h.recv.fanStart[p].data(), h.recv.fanRows[p].data(),
                                    h.recv.rowsFrom(p));
    r.layoutShared = true;
    r.extent = h.recv.numRecvRows * rowBytes;
    w.recvs.push_back(r);
  }
  if (a.status == fuscoSuccess)
    for (int64_t row : h.recv.paddingRows) memset(static_cast<char*>(recvX) + row * rowBytes, 0, rowBytes);
  return runMoeOp(h.comm, "fuscoMoeDispatch", a, *work);
}

}  // namespace

extern "C" {

fuscoResult_t fuscoMoeDispatch(fuscoMoeHandle_t handle, const void* x, size_t rowBytes, void* recvX,
                               void* stream) {
  fuscoComm_t comm = handle ? handle->comm : nullptr;
  return guarded(comm, "fuscoMoeDispatch", [&]() -> fuscoResult_t {
    if (handle == nullptr) return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoMoeDispatch: handle is NULL");
    FUSCO_CHECK(checkComm(comm, "fuscoMoeDispatch"));
    Communicator& c = *comm->impl;
    FUSCO_CHECK(faultPoint(FaultPhase::Dispatch, c.rank(), [&](const char* w) { c.markBroken(fuscoRemoteError, w); }));
    fuscoMoeHandle& h = *handle;
    ArgCheck a;
    if (c.memType() == fuscoMemHost && stream != nullptr)
      a.fail("fuscoMoeDispatch: stream must be NULL for a host-memory communicator");
    if (rowBytes == 0) a.fail("fuscoMoeDispatch: rowBytes is 0");
    if (x == nullptr && rowsToSend(h) > 0) a.fail("fuscoMoeDispatch: x is NULL with %zu rows to send", rowsToSend(h));
    if (recvX == nullptr && h.recv.numRecvRows > 0)
      a.fail("fuscoMoeDispatch: recvX is NULL with %zu rows to receive", h.recv.numRecvRows);
    checkDevicePtr(comm, x, "fuscoMoeDispatch", "x", &a);
    checkDevicePtr(comm, recvX, "fuscoMoeDispatch", "recvX", &a);
    int n = c.nranks();
    std::vector<PeerWork> work(n);
    Traffic traffic;
    for (int p = 0; p < n; ++p) {
      const size_t rows = h.send.rows[p].size();
      traffic.add(c, p, rows, rows * rowBytes);
    }
    if (isCudaComm(comm)) {
      FUSCO_CHECK(deviceDispatch(h, x, rowBytes, recvX, a, stream, &work));
    } else {
      FUSCO_CHECK(hostDispatch(h, x, rowBytes, recvX, a, &work));
    }
    h.stats.dispatchRowsIntraNode = traffic.intraRows;
    h.stats.dispatchRowsInterNode = traffic.interRows;
    h.stats.dispatchBytesIntraNode = traffic.intraBytes;
    h.stats.dispatchBytesInterNode = traffic.interBytes;
    return fuscoSuccess;
  });
}

fuscoResult_t fuscoMoeCombine(fuscoMoeHandle_t handle, const void* expertOut, fuscoDataType_t datatype,
                              size_t hidden, const float* topkWeights, void* out, void* stream) {
  fuscoComm_t comm = handle ? handle->comm : nullptr;
  return guarded(comm, "fuscoMoeCombine", [&]() -> fuscoResult_t {
    if (handle == nullptr) return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoMoeCombine: handle is NULL");
    FUSCO_CHECK(checkComm(comm, "fuscoMoeCombine"));
    FUSCO_CHECK(faultPoint(FaultPhase::Combine, comm->impl->rank(), [&](const char* w) { comm->impl->markBroken(fuscoRemoteError, w); }));
    fuscoMoeHandle& h = *handle;
    ArgCheck a;
    if (comm->impl->memType() == fuscoMemHost && stream != nullptr)
      a.fail("fuscoMoeCombine: stream must be NULL for a host-memory communicator");
    const int dt = rawEnum(datatype);
    if (dt != fuscoFloat32 && dt != fuscoBfloat16 && dt != fuscoFloat16)
      a.fail("fuscoMoeCombine: datatype %d is not fuscoFloat32, fuscoBfloat16 or fuscoFloat16", dt);
    if (hidden == 0) a.fail("fuscoMoeCombine: hidden is 0");
    if (expertOut == nullptr && h.recv.numRecvRows > 0)
      a.fail("fuscoMoeCombine: expertOut is NULL with %zu rows", h.recv.numRecvRows);
    if (out == nullptr && h.numTokens > 0) a.fail("fuscoMoeCombine: out is NULL with %zu tokens", h.numTokens);
    checkDevicePtr(comm, expertOut, "fuscoMoeCombine", "expertOut", &a);
    checkDevicePtr(comm, topkWeights, "fuscoMoeCombine", "topkWeights", &a);
    checkDevicePtr(comm, out, "fuscoMoeCombine", "out", &a);
    // Only a validated value is used as the enum (any int is legal from C).
    const fuscoDataType_t type = a.status == fuscoSuccess ? static_cast<fuscoDataType_t>(dt) : fuscoFloat32;
    // What this rank puts on each path: the routing weights (RANK), then one row per row received.
    Traffic traffic;
    const size_t rowOut = hidden * dataTypeSize(type);
    for (int p = 0; p < comm->impl->nranks(); ++p) {
      if (h.dedup != Dedup::None) traffic.add(*comm->impl, p, 0, h.weightIdx[p].size() * sizeof(float));
      traffic.add(*comm->impl, p, h.recv.rowsFrom(p), h.recv.rowsFrom(p) * rowOut);
    }
    if (isCudaComm(comm)) FUSCO_CHECK(deviceCombine(h, expertOut, type, hidden, topkWeights, out, a, stream));
    else FUSCO_CHECK(combine(h, expertOut, type, hidden, topkWeights, out, a));
    h.stats.combineBytesIntraNode = traffic.intraBytes;
    h.stats.combineBytesInterNode = traffic.interBytes;
    return fuscoSuccess;
  });
}

}  // extern "C"
