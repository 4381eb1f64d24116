// MoE execution: the plan exchange, dispatch and combine for every dedup mode, on host and device
// memory. The api layer checks what it can see locally and calls these; each joins the collective
// even when `a` already failed, so no peer waits for this rank (docs/API.md).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/arg_check.h"
#include "fusco.h"
#include "moe/moe_handle.h"

namespace fusco {

// The dedup mode a plan uses. NODE on a single node moves exactly what RANK moves, so it is RANK
// there; AUTO is NODE across nodes.
Dedup chooseDedup(int requested, int numNodes);

// fuscoMoePlan's collective part: shape, send plan, the metadata exchanges and the receive plan
// into *h (h->comm, numTokens and topk set). config and topkIdx are read only when a is ok.
fuscoResult_t planMoe(const fuscoMoeConfig_t* config, const int64_t* topkIdx, void* stream,
                      ArgCheck a, MoeHandle* h);
// fuscoMoePlan on a new handle: planMoe, and after a failure a wait for the operations it
// enqueued; *inUse when they cannot be waited for (the handle must then stay allocated).
fuscoResult_t planNewMoe(const fuscoMoeConfig_t* config, const int64_t* topkIdx, void* stream,
                         ArgCheck a, MoeHandle* h, bool* inUse);
// fuscoMoeReplan's: the same for a new routing with the config *h was planned with, into the
// storage *h already holds (byte-identical to a new plan). h->planned is false until it succeeds.
fuscoResult_t replanMoe(const int64_t* topkIdx, size_t numTokens, int topk, void* stream,
                        ArgCheck a, MoeHandle* h);

// A capacity plan (fuscoMoePlanCapacity) resolves on the comm's progress thread: waits until it
// did; fuscoInvalidUsage when it failed (on every rank). Any other plan: fuscoSuccess at once.
fuscoResult_t moeWaitPlan(MoeHandle& h);
// Waits until nothing the comm's progress thread still has queued refers to h (handle destroy).
fuscoResult_t moeQuiesce(MoeHandle& h);
// The handle's stats as a new handle's (fuscoMoeGetStats), under h.statsMu.
void resetStats(MoeHandle& h);
// The plan's receive count and tokens per local expert where its stream wrote them (device
// memory on a CUDA comm); fuscoInvalidUsage for a plan made on the host.
fuscoResult_t moeRecvCountsDevice(const MoeHandle& h, const int64_t** numRecvRows,
                                  const int64_t** tokensPerLocalExpert);

// Dispatch's and combine's checks against the handle's plan (the row counts it bounds, the byte
// sizes they make, the buffers they need), into *a.
void moeCheckDispatch(const MoeHandle& h, const void* x, size_t rowBytes, void* recvX, ArgCheck* a);
void moeCheckCombine(const MoeHandle& h, const void* expertOut, int dt, size_t hidden,
                     const void* out, ArgCheck* a);
// fuscoMoeGetRecvCounts of a planned handle: a capacity plan resolved first (its comm live).
fuscoResult_t moeRecvCounts(MoeHandle& h, bool commLive, size_t* numRecvRows,
                            int64_t* tokensPerLocalExpert);
// fuscoMoeGetStats: the handle's stats, with the struct's size set.
void moeCopyStats(MoeHandle& h, fuscoMoeStats_t* stats);

// Dispatch and combine (host or device by the comm's memory type); they update h.stats.
fuscoResult_t moeDispatch(MoeHandle& h, const void* x, size_t rowBytes, void* recvX,
                          const ArgCheck& a, void* stream);
fuscoResult_t moeCombine(MoeHandle& h, const void* expertOut, fuscoDataType_t dt, size_t hidden,
                         const float* topkWeights, void* out, const ArgCheck& a, void* stream);

}  // namespace fusco
