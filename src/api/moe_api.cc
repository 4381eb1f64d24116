// MoE dispatch and combine on top of the planner (plan/) and the engine.
//
// fuscoMoePlan exchanges the per-row metadata once (sizes, then metadata) and keeps both plans in
// the handle. Dispatch is one engine operation: rows gathered from x by token index, scattered
// (and replicated per local expert) straight into their final expert-major rows. Combine ships
// the routing weights to the expert side, reduces each received row's expert outputs there
// (k order) into one partial per (token, rank), sends the partials back, and sums them over the
// ranks of a node and then over nodes, always in the same order (API.md's fixed tree).
#include <cstring>
#include <vector>

#include "api/api_internal.h"
#include "api/moe_handle.h"
#include "core/fault.h"
#include "core/params.h"
#include "device/cuda_rt.h"
#include "device/reduce.h"
#include "engine/engine.h"

using namespace fusco;

namespace {

fuscoResult_t checkMoeConfig(const fuscoMoeConfig_t* cfg, ArgCheck* a) {
  if (cfg == nullptr) {
    a->fail("fuscoMoePlan: config is NULL");
    return fuscoSuccess;
  }
  if (cfg->size != sizeof(fuscoMoeConfig_t) || cfg->magic != FUSCO_MOE_CONFIG_MAGIC ||
      cfg->version != FUSCO_MOE_CONFIG_VERSION) {
    a->fail("fuscoMoePlan: config has size %zu, magic 0x%x, version %u; expected %zu, 0x%x, %u "
            "(initialize it with FUSCO_MOE_CONFIG_INITIALIZER)",
            cfg->size, cfg->magic, cfg->version, sizeof(fuscoMoeConfig_t), FUSCO_MOE_CONFIG_MAGIC,
            FUSCO_MOE_CONFIG_VERSION);
    return fuscoSuccess;
  }
  if (cfg->dedup < FUSCO_DEDUP_AUTO || cfg->dedup > FUSCO_DEDUP_NODE)
    a->fail("fuscoMoePlan: config.dedup %d is not a FUSCO_DEDUP_* value", cfg->dedup);
  if (cfg->balance < FUSCO_BALANCE_AUTO || cfg->balance > FUSCO_BALANCE_GREEDY)
    a->fail("fuscoMoePlan: config.balance %d is not a FUSCO_BALANCE_* value", cfg->balance);
  if (cfg->expertAlignment < 0)
    a->fail("fuscoMoePlan: config.expertAlignment %d must be >= 0", cfg->expertAlignment);
  return fuscoSuccess;
}

// The dedup mode a plan uses. NODE on a single node moves exactly what RANK moves, so it is RANK
// there; AUTO is NODE across nodes.
Dedup chooseDedup(int requested, int numNodes) {
  if (requested == FUSCO_DEDUP_NONE) return Dedup::None;
  if (requested == FUSCO_DEDUP_RANK || numNodes <= 1) return Dedup::Rank;
  return Dedup::Node;
}

// A plan-time exchange of plain host buffers: sends[p] to rank p, recvs[p] from it.
fuscoResult_t exchange(fuscoComm_t comm, const char* name, const ArgCheck& a,
                       const std::vector<RowStream>& sends, const std::vector<RowStream>& recvs) {
  std::vector<PeerWork> work(sends.size());
  for (size_t p = 0; p < work.size(); ++p) {
    work[p].sends.push_back(sends[p]);
    work[p].recvs.push_back(recvs[p]);
  }
  return runMoeOp(comm, name, a, work);
}

}  // namespace

// Sizes first, then the words themselves.
fuscoResult_t fusco::exchangeWords(fuscoComm_t comm, const char* name, const ArgCheck& a,
                                   const std::vector<std::vector<int32_t>>& out,
                                   std::vector<std::vector<int32_t>>* in) {
  int n = comm->impl->nranks();
  std::vector<uint64_t> mySizes(n, 0), theirSizes(n, 0);
  std::vector<RowStream> s(n), r(n);
  for (int p = 0; p < n && a.status == fuscoSuccess; ++p) {
    mySizes[p] = out[p].size();
    s[p] = RowStream::flat(&mySizes[p], sizeof(uint64_t));
    r[p] = RowStream::flat(&theirSizes[p], sizeof(uint64_t));
  }
  FUSCO_CHECK(exchange(comm, name, a, s, r));
  in->assign(n, {});
  for (int p = 0; p < n; ++p) {
    if (theirSizes[p] > kMaxPlanWords)
      return FUSCO_FAIL(fuscoRemoteError, kPlan, "%s: rank %d announced %llu words", name, p,
                        static_cast<unsigned long long>(theirSizes[p]));
    (*in)[p].resize(theirSizes[p]);
    s[p] = RowStream::flat(out[p].data(), out[p].size() * sizeof(int32_t));
    r[p] = RowStream::flat((*in)[p].data(), theirSizes[p] * sizeof(int32_t));
  }
  return exchange(comm, name, a, s, r);
}

namespace {

// Each receiver tells each source where that source's rows land (its fan rows), so dispatch can
// write the final rows directly when the receiver's buffer is reachable.
fuscoResult_t exchangeFanRows(fuscoComm_t comm, fuscoMoeHandle& h, const ArgCheck& a) {
  if (h.dedup == Dedup::Node) return exchangeNodeFanRows(comm, h, a);
  int n = comm->impl->nranks();
  std::vector<RowStream> s(n), r(n);
  h.remoteFanRows.assign(n, {});
  for (int p = 0; p < n; ++p) {
    s[p] = RowStream::flat(h.recv.fanRows[p].data(), h.recv.fanRows[p].size() * sizeof(int64_t));
    h.remoteFanRows[p].resize(h.send.kSlots[p].size());
    r[p] = RowStream::flat(h.remoteFanRows[p].data(), h.remoteFanRows[p].size() * sizeof(int64_t));
  }
  return exchange(comm, "fuscoMoePlan (fan rows)", a, s, r);
}

// Index of weight (t, k) for every fan-out entry of every row sent to each rank.
void buildWeightIndex(fuscoMoeHandle& h) {
  int n = h.shape.nranks;
  h.weightIdx.assign(n, {});
  for (int r = 0; r < n; ++r) {
    const auto& rows = h.send.rows[r];
    auto& w = h.weightIdx[r];
    w.reserve(h.send.kSlots[r].size());
    for (size_t i = 0; i < rows.size(); ++i)
      for (uint32_t j = h.send.kStart[r][i]; j < h.send.kStart[r][i + 1]; ++j)
        w.push_back(rows[i] * h.topk + h.send.kSlots[r][j]);
  }
}

}  // namespace

extern "C" {

fuscoResult_t fuscoMoePlan(fuscoMoeHandle_t* handle, fuscoComm_t comm, const fuscoMoeConfig_t* config,
                           const int64_t* topkIdx, size_t numTokens, int topk, void* stream) {
  return guarded(comm, "fuscoMoePlan", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkComm(comm, "fuscoMoePlan"));
    Communicator& c = *comm->impl;
    FUSCO_CHECK(faultPoint(FaultPhase::Plan, c.rank(), [&](const char* w) { c.markBroken(fuscoRemoteError, w); }));
    std::unique_ptr<fuscoMoeHandle> h(new fuscoMoeHandle());
    h->comm = comm;
    h->numTokens = numTokens;
    h->topk = topk;
    ArgCheck a;
    if (handle == nullptr) a.fail("fuscoMoePlan: handle is NULL");
    if (c.memType() == fuscoMemHost && stream != nullptr)
      a.fail("fuscoMoePlan: stream must be NULL for a host-memory communicator");
    checkMoeConfig(config, &a);
    if (numTokens > 0 && topkIdx == nullptr) a.fail("fuscoMoePlan: topkIdx is NULL with %zu tokens", numTokens);
    checkDevicePtr(comm, topkIdx, "fuscoMoePlan", "topkIdx", &a);
    // A CUDA comm's routing is on the device: the plan's one host synchronization brings it here.
    if (isCudaComm(comm) && a.status == fuscoSuccess && numTokens > 0 && topk <= 0)
      a.fail("fuscoMoePlan: topk %d must be > 0", topk);
    if (isCudaComm(comm) && a.status == fuscoSuccess && numTokens > 0) {
      FUSCO_CHECK(c.useDevice());
      h->topkIdx.resize(numTokens * static_cast<size_t>(topk));
      if (cudaCopyToHostSync(h->topkIdx.data(), topkIdx, h->topkIdx.size() * sizeof(int64_t), stream) != fuscoSuccess)
        a.fail("fuscoMoePlan: reading topkIdx: %s", threadLastError().c_str());
      topkIdx = h->topkIdx.data();
    }
    if (a.status == fuscoSuccess) {
      h->dedup = chooseDedup(config->dedup, c.nodes().numNodes);
      if (buildMoeShape(c.nranks(), config->numExperts, config->expertToRank,
                        config->expertAlignment, &h->shape) != fuscoSuccess)
        a.fail("%s", threadLastError().c_str());
    }
    if (a.status == fuscoSuccess && validateTopk(h->shape, topkIdx, numTokens, topk) != fuscoSuccess)
      a.fail("%s", threadLastError().c_str());
    const bool node = a.status == fuscoSuccess && h->dedup == Dedup::Node;
    if (a.status == fuscoSuccess)
      h->send = planSend(h->shape, c.rank(), topkIdx, numTokens, topk, node ? Dedup::Rank : h->dedup);
    std::vector<std::vector<int32_t>> metaFrom;
    // A receive plan that fails (malformed metadata) still takes part in the last exchange, so
    // the other ranks fail promptly too.
    ArgCheck b;
    if (node) FUSCO_CHECK(planNodeDedup(comm, *h, a, config->balance, &metaFrom, &b));
    else FUSCO_CHECK(exchangeWords(comm, "fuscoMoePlan (metadata)", a, h->send.meta, &metaFrom));
    if (b.status != fuscoSuccess || planRecv(h->shape, c.rank(), metaFrom, &h->recv) != fuscoSuccess) {
      if (b.status == fuscoSuccess) b.message = threadLastError();
      b.status = fuscoRemoteError;
      h->recv = MoeRecvPlan();
      h->recv.fanStart.assign(c.nranks(), {});
      h->recv.fanRows.assign(c.nranks(), {});
    }
    FUSCO_CHECK(exchangeFanRows(comm, *h, b));
    buildWeightIndex(*h);
    if (topkIdx != nullptr && topkIdx != h->topkIdx.data()) h->topkIdx.assign(topkIdx, topkIdx + numTokens * topk);
    if (isCudaComm(comm)) FUSCO_CHECK(uploadMoePlan(*h, stream));
    if (paramPlanTrace() != 0)
      FUSCO_LOG_ALWAYS(
          LogLevel::Info, kPlan, "%s",
          describePlan(h->shape, c.nodes(), c.rank(), h->send, h->recv, 0, h->dedup).c_str());
    *handle = h.release();
    return fuscoSuccess;
  });
}

fuscoResult_t fuscoMoeGetRecvCounts(fuscoMoeHandle_t handle, size_t* numRecvRows,
                                    int64_t* tokensPerLocalExpert) {
  return guarded(nullptr, "fuscoMoeGetRecvCounts", [&]() -> fuscoResult_t {
    if (handle == nullptr || numRecvRows == nullptr)
      return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoMoeGetRecvCounts: handle and numRecvRows must be non-NULL");
    *numRecvRows = handle->recv.numRecvRows;
    if (tokensPerLocalExpert != nullptr)
      for (size_t e = 0; e < handle->recv.tokensPerLocalExpert.size(); ++e)
        tokensPerLocalExpert[e] = handle->recv.tokensPerLocalExpert[e];
    return fuscoSuccess;
  });
}

fuscoResult_t fuscoMoeGetStats(fuscoMoeHandle_t handle, fuscoMoeStats_t* stats) {
  return guarded(nullptr, "fuscoMoeGetStats", [&]() -> fuscoResult_t {
    if (handle == nullptr || stats == nullptr)
      return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoMoeGetStats: handle and stats must be non-NULL");
    if (stats->size != sizeof(fuscoMoeStats_t))
      return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoMoeGetStats: stats->size is %zu, expected %zu",
                        stats->size, sizeof(fuscoMoeStats_t));
    *stats = handle->stats;
    stats->size = sizeof(fuscoMoeStats_t);
    return fuscoSuccess;
  });
}

fuscoResult_t fuscoMoeHandleDestroy(fuscoMoeHandle_t handle) {
  return guarded(nullptr, "fuscoMoeHandleDestroy", [&]() -> fuscoResult_t {
    if (handle == nullptr) return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoMoeHandleDestroy: handle is NULL");
    delete handle;
    return fuscoSuccess;
  });
}

}  // extern "C"
