// fuscoMoePlan's and fuscoMoeReplan's collective part: the routing checked and planned on this
// rank, then the plan exchanges (per-row metadata sizes and words, then the receivers' fan rows
// back to the sources) that give every rank its receive plan and tell each source where its rows
// land. NODE dedup adds its own steps (plan_node.cc). A replan writes the same lists into the
// handle's storage, which keeps its capacity.
#include <string>
#include <vector>

#include "core/params.h"
#include "device/cuda_rt.h"
#include "moe/moe.h"
#include "moe/moe_exec.h"
#include "moe/plan_layer.h"
#include "moe/plan_lists.h"

namespace fusco {

namespace {

#define FUSCO_PLAN_NAMES(call)                                                     \
  PlanNames {                                                                      \
    call, call " (node counts)", call " (metadata)", call " (forwarded metadata)", \
        call " (fan rows)", call " (checks)", call " (counts)", call " (bases)",   \
        call " (routing)", call " (fan lists)"                                     \
  }
constexpr PlanNames kPlanNames = FUSCO_PLAN_NAMES("fuscoMoePlan");
constexpr PlanNames kCapacityNames = FUSCO_PLAN_NAMES("fuscoMoePlanCapacity");
constexpr PlanNames kReplanNames = FUSCO_PLAN_NAMES("fuscoMoeReplan");
#undef FUSCO_PLAN_NAMES

// Each receiver tells each source where that source's rows land (its fan rows), so dispatch can
// write the final rows directly when the receiver's buffer is reachable.
fuscoResult_t exchangeFanRows(MoeHandle& h, const ArgCheck& a) {
  if (h.dedup == Dedup::Node) return exchangeNodeFanRows(h, a);
  const int n = h.comm->nranks();
  std::vector<RowStream> s(n), r(n);
  h.remoteFanRows.resize(n);
  for (int p = 0; p < n; ++p) {
    s[p] = RowStream::flat(h.recv.fanRows[p].data(), h.recv.fanRows[p].size() * sizeof(int64_t));
    h.remoteFanRows[p].resize(h.send.kSlots[p].size());
    r[p] = RowStream::flat(h.remoteFanRows[p].data(), h.remoteFanRows[p].size() * sizeof(int64_t));
  }
  return exchange(*h.comm, h.names->fanRows, a, s, r);
}

// Index of weight (t, k) for every fan-out entry of every row sent to each rank.
void buildWeightIndex(MoeHandle& h) {
  const int n = h.shape.nranks;
  h.weightIdx.resize(n);
  for (int r = 0; r < n; ++r) {
    const auto& rows = h.send.rows[r];
    auto& w = h.weightIdx[r];
    w.clear();
    w.reserve(h.send.kSlots[r].size());
    for (size_t i = 0; i < rows.size(); ++i)
      for (uint32_t j = h.send.kStart[r][i]; j < h.send.kStart[r][i + 1]; ++j)
        w.push_back(rows[i] * h.topk + h.send.kSlots[r][j]);
  }
}

// A CUDA comm's routing is on the device: the plan's one host synchronization brings it here.
// Returns the host copy to plan from (h.topkIdx), or topkIdx itself on a host comm.
const int64_t* routingOnHost(MoeHandle& h, const int64_t* topkIdx, void* stream, ArgCheck* a) {
  Communicator& c = *h.comm;
  if (c.memType() != fuscoMemCuda || !a->ok()) return topkIdx;
  bool capturing = false;
  joinFailure(cudaStreamCapturing(stream, &capturing), a);
  if (capturing) {
    a->fail(
        "%s: cannot be captured into a CUDA graph: it copies topkIdx to the host and "
        "synchronizes the stream; plan before the capture and capture dispatch and combine",
        h.names->call);
    a->status = fuscoInvalidUsage;
  }
  if (!a->ok() || h.numTokens == 0) return topkIdx;
  if (h.topk <= 0) {
    a->fail("%s: topk %d must be > 0", h.names->call, h.topk);
    return topkIdx;
  }
  joinFailure(c.useDevice(), a);
  if (!a->ok()) return topkIdx;
  h.topkIdx.resize(h.numTokens * static_cast<size_t>(h.topk));
  if (cudaCopyToHostSync(h.topkIdx.data(), topkIdx, h.topkIdx.size() * sizeof(int64_t), stream) !=
      fuscoSuccess)
    a->fail("%s: reading topkIdx: %s", h.names->call, threadLastError().c_str());
  return h.topkIdx.data();
}

// What a plan keeps of its config: the dedup mode, the balancer mode and the shape.
void configure(const fuscoMoeConfig_t* config, ArgCheck* a, MoeHandle* h) {
  if (!a->ok()) return;
  const Communicator& c = *h->comm;
  // A CUDA comm across nodes moves rows through its network bridge with dedup NONE or RANK
  // (AUTO picks RANK); NODE's forwarders run on host comms only.
  const bool deviceNodes = c.memType() == fuscoMemCuda && c.nodes().numNodes > 1;
  if (deviceNodes && config->dedup == FUSCO_DEDUP_NODE) {
    a->fail(
        "%s: dedup NODE (forwarders) is not available on a fuscoMemCuda communicator across "
        "nodes; use FUSCO_DEDUP_RANK or FUSCO_DEDUP_NONE",
        h->names->call);
    return;
  }
  h->dedup = chooseDedup(config->dedup, deviceNodes ? 1 : c.nodes().numNodes);
  h->node.balance = balanceMode(config->balance);
  if (buildMoeShape(h->comm->nranks(), config->numExperts, config->expertToRank,
                    config->expertAlignment, &h->shape) != fuscoSuccess)
    a->fail("%s", threadLastError().c_str());
}

// This rank's routing check and send plan (nothing exchanged yet).
void planLocal(const int64_t* topkIdx, ArgCheck* a, MoeHandle* h) {
  if (a->ok() && validateTopk(h->shape, topkIdx, h->numTokens, h->topk) != fuscoSuccess)
    a->fail("%s", threadLastError().c_str());
  if (a->ok())
    planSendInto(h->shape, h->comm->rank(), topkIdx, h->numTokens, h->topk,
                 h->dedup == Dedup::Node ? Dedup::Rank : h->dedup, &h->send);
}

// A receive plan that failed (malformed metadata) still takes part in the last exchange, so the
// other ranks fail promptly too: it is left empty and *b records why.
void planReceive(MoeHandle* h, const std::vector<std::vector<int32_t>>& metaFrom, ArgCheck* b) {
  const int n = h->comm->nranks();
  if (b->ok() && planRecv(h->shape, h->comm->rank(), metaFrom, &h->recv) == fuscoSuccess) return;
  if (b->ok()) b->message = threadLastError();
  b->status = fuscoRemoteError;
  h->recv = MoeRecvPlan();
  h->recv.fanStart.assign(n, {});
  h->recv.fanRows.assign(n, {});
}

// The sizes the device paths read, from the host planner's lists.
void fillSizes(MoeHandle* h) {
  const int n = h->comm->nranks();
  MoeHandle::Sizes& z = h->sizes;
  z.rowsTo.assign(n, 0), z.slotsTo.assign(n, 0), z.rowsFrom.assign(n, 0), z.slotsFrom.assign(n, 0);
  for (int p = 0; p < n; ++p) {
    if (p < static_cast<int>(h->send.rows.size())) z.rowsTo[p] = h->send.rows[p].size();
    if (p < static_cast<int>(h->send.kSlots.size())) z.slotsTo[p] = h->send.kSlots[p].size();
    if (p < static_cast<int>(h->recv.fanStart.size())) z.rowsFrom[p] = h->recv.rowsFrom(p);
    if (p < static_cast<int>(h->recv.fanRows.size())) z.slotsFrom[p] = h->recv.fanRows[p].size();
  }
}

// The collective part every plan and replan shares, from this rank's routing on the host.
fuscoResult_t planRouting(const int64_t* topkIdx, void* stream, ArgCheck a, MoeHandle* h) {
  Communicator& c = *h->comm;
  planLocal(topkIdx, &a, h);
  if (a.ok()) c.agreeInCall(planAgreement(*h));
  std::vector<std::vector<int32_t>>& metaFrom = h->scratch.metaFrom;
  ArgCheck b;
  if (a.ok() && h->dedup == Dedup::Node)
    FUSCO_CHECK(planNodeDedup(*h, a, &metaFrom, &b));
  else
    FUSCO_CHECK(exchangeWords(c, h->names->metadata, a, h->send.meta, &metaFrom));
  planReceive(h, metaFrom, &b);
  FUSCO_CHECK(exchangeFanRows(*h, b));
  buildWeightIndex(*h);
  fillSizes(h);
  keepRouting(topkIdx, h);
  if (c.memType() == fuscoMemCuda) FUSCO_CHECK(uploadMoePlan(*h, stream));
  if (paramPlanTrace() != 0)
    FUSCO_LOG_ALWAYS(
        LogLevel::Info, kPlan, "%s",
        describePlan(h->shape, c.nodes(), c.rank(), h->send, h->recv, 0, h->dedup).c_str());
  h->planned = true;
  return fuscoSuccess;
}

// The GPU planner's steps or the host planner, for the config the handle keeps.
fuscoResult_t planWith(const int64_t* topkIdx, void* stream, ArgCheck a, MoeHandle* h) {
  Communicator& c = *h->comm;
  if (a.ok() && h->capacity != 0 && h->dedup == Dedup::Node) {
    a.fail(
        "fuscoMoePlanCapacity: capacity mode supports dedup NONE and RANK (AUTO on one node); "
        "NODE dedup across nodes needs fuscoMoePlan");
    a.status = fuscoInvalidUsage;
  }
  h->bySteps = h->capacity != 0 || planBySteps(c, h->dedup);
  if (h->bySteps) return planMoeSteps(topkIdx, stream, a, h);
  topkIdx = routingOnHost(*h, topkIdx, stream, &a);
  return planRouting(topkIdx, stream, a, h);
}

}  // namespace

Dedup chooseDedup(int requested, int numNodes) {
  if (requested == FUSCO_DEDUP_NONE) return Dedup::None;
  if (requested == FUSCO_DEDUP_RANK || numNodes <= 1) return Dedup::Rank;
  return Dedup::Node;
}

fuscoResult_t planMoe(const fuscoMoeConfig_t* config, const int64_t* topkIdx, void* stream,
                      ArgCheck a, MoeHandle* h) {
  h->names = h->capacity != 0 ? &kCapacityNames : &kPlanNames;
  configure(config, &a, h);
  return planWith(topkIdx, stream, a, h);
}

fuscoResult_t planNewMoe(const fuscoMoeConfig_t* config, const int64_t* topkIdx, void* stream,
                         ArgCheck a, MoeHandle* h, bool* inUse) {
  *inUse = false;
  const fuscoResult_t r = planMoe(config, topkIdx, stream, a, h);
  if (r == fuscoSuccess) return r;
  // Operations it enqueued may still refer to it: when they cannot be waited for, the handle is
  // left allocated rather than freed under them.
  const std::string why = threadLastError();
  if (moeQuiesce(*h) == fuscoSuccess) return r;
  *inUse = true;
  return FUSCO_FAIL(r, kApi, "%s", why.c_str());  // the plan's failure, not the wait's
}

fuscoResult_t replanMoe(const int64_t* topkIdx, size_t numTokens, int topk, void* stream,
                        ArgCheck a, MoeHandle* h) {
  // A capacity plan resolves on the progress thread. On a CUDA comm it resolves from a copy of
  // its own, with its tables and summary in its half of the handle's pinned buffer, so a replan
  // never waits for it (docs/DESIGN.md, "Capacity mode"); a host comm's plan has one buffer, and
  // nothing queued may still read it when this call rewrites it.
  if (h->capacity != 0 && h->comm->memType() != fuscoMemCuda) FUSCO_CHECK(moeQuiesce(*h));
  h->planned = false;
  h->names = &kReplanNames;
  h->numTokens = numTokens;
  h->topk = topk;
  // As a new handle's. A capacity plan's on a CUDA comm become so when it resolves, in call
  // order (its dispatch and combine note their traffic on the progress thread).
  if (h->capacity == 0 || h->comm->memType() != fuscoMemCuda) resetStats(*h);
  return planWith(topkIdx, stream, a, h);
}

}  // namespace fusco
