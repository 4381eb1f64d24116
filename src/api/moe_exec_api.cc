// fuscoMoeDispatch and fuscoMoeCombine: one engine operation for dispatch, two for combine
// (routing weights to the expert side, then one partial row per (token, rank) back).
#include <cstring>
#include <vector>

#include "api/api_internal.h"
#include "api/moe_handle.h"
#include "device/reduce.h"
#include "engine/engine.h"

using namespace fusco;

namespace {

struct Traffic {
  size_t intraRows = 0, interRows = 0, intraBytes = 0, interBytes = 0;
  void add(const Communicator& c, int peer, size_t rows, size_t bytes) {
    if (peer == c.rank()) return;  // rows a rank keeps for itself are not traffic
    if (c.nodes().sameNode(c.rank(), peer)) intraRows += rows, intraBytes += bytes;
    else interRows += rows, interBytes += bytes;
  }
};

fuscoResult_t runMoeOp(fuscoMoeHandle& h, const char* name, const ArgCheck& a,
                       const std::vector<RowStream>& sends, const std::vector<RowStream>& recvs) {
  Communicator& c = *h.comm->impl;
  Op op(c.nranks());
  op.name = name;
  op.kind = OpKind::Moe;
  op.collective = true;
  op.argStatus = a.status;
  op.argError = a.message;
  if (a.status == fuscoSuccess) {
    for (int p = 0; p < c.nranks(); ++p) {
      op.peers[p].sends.push_back(sends[p]);
      op.peers[p].recvs.push_back(recvs[p]);
    }
  }
  InFlight f(h.comm);
  return runOp(c, op);
}

size_t rowsToSend(const fuscoMoeHandle& h) {
  size_t n = 0;
  for (const auto& r : h.send.rows) n += r.size();
  return n;
}

// Expert side: one weighted partial per received row, summed over its experts in k order.
void reducePartials(fuscoMoeHandle& h, const void* expertOut, fuscoDataType_t dt, size_t rowOut, size_t hidden) {
  int n = h.shape.nranks;
  std::vector<const void*> ptrs;
  for (int s = 0; s < n; ++s) {
    size_t rows = h.recv.rowsFrom(s);
    h.partials[s].resize(rows * rowOut);
    for (size_t i = 0; i < rows; ++i) {
      uint32_t b = h.recv.fanStart[s][i], e = h.recv.fanStart[s][i + 1];
      ptrs.clear();
      for (uint32_t f = b; f < e; ++f)
        ptrs.push_back(static_cast<const char*>(expertOut) + h.recv.fanRows[s][f] * rowOut);
      weightedSumRows(dt, hidden, ptrs.data(), h.recvWeights[s].data() + b, e - b,
                      h.partials[s].data() + i * rowOut);
    }
  }
}

// Source side: out[t] = sum over nodes (ascending) of sum over the node's ranks (ascending) of
// the token's partial from that rank. In NONE mode the partial is formed here from the raw rows.
void finalSum(fuscoMoeHandle& h, const Communicator& c, fuscoDataType_t dt, size_t rowOut,
              size_t hidden, const float* weights, void* out) {
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
          rankPtrs.push_back(h.landing[r].data() + cur * rowOut);
          ++cur;
          continue;
        }
        rowPtrs.clear();
        w.clear();
        for (; cur < rows.size() && rows[cur] == static_cast<int64_t>(t); ++cur) {
          rowPtrs.push_back(h.landing[r].data() + cur * rowOut);
          uint8_t k = h.send.kSlots[r][h.send.kStart[r][cur]];
          w.push_back(weights ? weights[t * h.topk + k] : 1.0f);
        }
        char* dst = rankScratch.data() + r * rowOut;
        weightedSumRows(dt, hidden, rowPtrs.data(), w.data(), rowPtrs.size(), dst);
        rankPtrs.push_back(dst);
      }
      if (rankPtrs.empty()) continue;
      char* dst = nodeScratch.data() + node * rowOut;
      sumRows(dt, hidden, rankPtrs.data(), rankPtrs.size(), dst);
      nodePtrs.push_back(dst);
    }
    char* o = static_cast<char*>(out) + t * rowOut;
    if (nodePtrs.empty()) memset(o, 0, rowOut);
    else sumRows(dt, hidden, nodePtrs.data(), nodePtrs.size(), o);
  }
}

fuscoResult_t combine(fuscoMoeHandle& h, const void* expertOut, fuscoDataType_t dt, size_t hidden,
                      const float* topkWeights, void* out, ArgCheck& a) {
  Communicator& c = *h.comm->impl;
  int n = c.nranks();
  size_t rowOut = hidden * dataTypeSize(dt);
  std::vector<RowStream> s(n), r(n);
  Traffic traffic;
  h.partials.resize(n);
  h.landing.resize(n);
  std::vector<float> ones;
  if (h.dedup != Dedup::None) {
    // Weights to the expert side (ones when the caller passes none, so every rank ships the same
    // shape of message whatever its peers passed).
    const float* w = topkWeights;
    if (w == nullptr) {
      ones.assign(h.numTokens * h.topk, 1.0f);
      w = ones.data();
    }
    h.recvWeights.resize(n);
    for (int p = 0; p < n && a.status == fuscoSuccess; ++p) {
      s[p] = RowStream::indexed(w, sizeof(float), h.weightIdx[p].data(), h.weightIdx[p].size());
      h.recvWeights[p].resize(h.recv.fanRows[p].size());
      r[p] = RowStream::flat(h.recvWeights[p].data(), h.recvWeights[p].size() * sizeof(float));
      traffic.add(c, p, 0, h.weightIdx[p].size() * sizeof(float));
    }
    FUSCO_CHECK(runMoeOp(h, "fuscoMoeCombine (weights)", a, s, r));
    reducePartials(h, expertOut, dt, rowOut, hidden);
  }
  for (int p = 0; p < n && a.status == fuscoSuccess; ++p) {
    size_t back = h.recv.rowsFrom(p);
    if (h.dedup != Dedup::None) s[p] = RowStream::flat(h.partials[p].data(), back * rowOut);
    else s[p] = RowStream::indexed(expertOut, rowOut, h.recv.fanRows[p].data(), back);
    h.landing[p].resize(h.send.rows[p].size() * rowOut);
    r[p] = RowStream::flat(h.landing[p].data(), h.landing[p].size());
    traffic.add(c, p, back, back * rowOut);
  }
  FUSCO_CHECK(runMoeOp(h, "fuscoMoeCombine", a, s, r));
  finalSum(h, c, dt, rowOut, hidden, topkWeights, out);
  h.stats.combineBytesIntraNode = traffic.intraBytes;
  h.stats.combineBytesInterNode = traffic.interBytes;
  return fuscoSuccess;
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
    fuscoMoeHandle& h = *handle;
    ArgCheck a;
    if (c.memType() == fuscoMemHost && stream != nullptr)
      a.fail("fuscoMoeDispatch: stream must be NULL for a host-memory communicator");
    if (rowBytes == 0) a.fail("fuscoMoeDispatch: rowBytes is 0");
    if (x == nullptr && rowsToSend(h) > 0) a.fail("fuscoMoeDispatch: x is NULL with %zu rows to send", rowsToSend(h));
    if (recvX == nullptr && h.recv.numRecvRows > 0)
      a.fail("fuscoMoeDispatch: recvX is NULL with %zu rows to receive", h.recv.numRecvRows);
    int n = c.nranks();
    std::vector<RowStream> s(n), r(n);
    Traffic traffic;
    for (int p = 0; p < n && a.status == fuscoSuccess; ++p) {
      s[p] = RowStream::indexed(x, rowBytes, h.send.rows[p].data(), h.send.rows[p].size());
      r[p] = RowStream::fanOut(recvX, rowBytes, h.recv.fanStart[p].data(), h.recv.fanRows[p].data(), h.recv.rowsFrom(p));
      traffic.add(c, p, h.send.rows[p].size(), h.send.rows[p].size() * rowBytes);
    }
    if (a.status == fuscoSuccess)
      for (int64_t row : h.recv.paddingRows) memset(static_cast<char*>(recvX) + row * rowBytes, 0, rowBytes);
    FUSCO_CHECK(runMoeOp(h, "fuscoMoeDispatch", a, s, r));
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
    fuscoMoeHandle& h = *handle;
    ArgCheck a;
    if (comm->impl->memType() == fuscoMemHost && stream != nullptr)
      a.fail("fuscoMoeCombine: stream must be NULL for a host-memory communicator");
    if (datatype != fuscoFloat32 && datatype != fuscoBfloat16 && datatype != fuscoFloat16)
      a.fail("fuscoMoeCombine: datatype %d is not fuscoFloat32, fuscoBfloat16 or fuscoFloat16", (int)datatype);
    if (hidden == 0) a.fail("fuscoMoeCombine: hidden is 0");
    if (expertOut == nullptr && h.recv.numRecvRows > 0)
      a.fail("fuscoMoeCombine: expertOut is NULL with %zu rows", h.recv.numRecvRows);
    if (out == nullptr && h.numTokens > 0) a.fail("fuscoMoeCombine: out is NULL with %zu tokens", h.numTokens);
    return combine(h, expertOut, datatype, hidden, topkWeights, out, a);
  });
}

}  // extern "C"
