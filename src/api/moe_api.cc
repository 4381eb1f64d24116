// The MoE entry points: check what this rank can see of its arguments, then hand the call to the
// moe layer (src/moe/), which joins the collective even when a check failed so that peers fail
// promptly (docs/API.md, "The collective error rule").
#include <memory>
#include <stdexcept>
#include <vector>

#include "api/api_internal.h"
#include "api/moe_inspect.h"
#include "moe/moe.h"
#include "moe/moe_config.h"

struct fuscoMoeHandle {
  fuscoComm_t comm = nullptr;  // the comm handle it was made on (api_internal.h, liveCommOf)
  fusco::MoeHandle impl;
};

using namespace fusco;

namespace {

ArgCheck checkDispatch(fuscoComm_t comm, const MoeHandle& h, const void* x, size_t rowBytes,
                       void* recvX, void* stream) {
  ArgCheck a;
  checkStream(comm, stream, "fuscoMoeDispatch", &a);
  moeCheckDispatch(h, x, rowBytes, recvX, &a);
  checkDevicePtr(comm, x, "fuscoMoeDispatch", "x", &a);
  checkDevicePtr(comm, recvX, "fuscoMoeDispatch", "recvX", &a);
  return a;
}

ArgCheck checkCombine(fuscoComm_t comm, const MoeHandle& h, const void* expertOut, int dt,
                      size_t hidden, const float* topkWeights, void* out, void* stream) {
  ArgCheck a;
  checkStream(comm, stream, "fuscoMoeCombine", &a);
  moeCheckCombine(h, expertOut, dt, hidden, out, &a);
  checkDevicePtr(comm, expertOut, "fuscoMoeCombine", "expertOut", &a);
  checkDevicePtr(comm, topkWeights, "fuscoMoeCombine", "topkWeights", &a);
  checkDevicePtr(comm, out, "fuscoMoeCombine", "out", &a);
  return a;
}

// A handle whose last fuscoMoeReplan failed. That call failed on every rank (docs/API.md, "The
// collective error rule"; a failure that was not agreed broke the communicator), so every rank's
// handle is unplanned alike: a call on it fails on each rank by itself, joining no collective,
// and no peer waits for it.
bool unplanned(fuscoMoeHandle_t handle) {
  const fuscoMoeHandle* h = objectOf<fuscoMoeHandle>(LiveKind::MoeHandle, handle);
  return h != nullptr && !h->impl.planned;
}

// The state behind a live handle (checked by the caller).
MoeHandle& moeOf(fuscoMoeHandle_t handle) {
  fuscoMoeHandle* h = objectOf<fuscoMoeHandle>(LiveKind::MoeHandle, handle);
  if (h == nullptr) throw std::logic_error("a MoE handle in use is not live");
  return h->impl;
}

fuscoComm_t liveCommOf(fuscoMoeHandle_t handle) {
  return fusco::liveCommOf<fuscoMoeHandle>(LiveKind::MoeHandle, handle);
}

fuscoResult_t refuseUnplanned(const char* fn) {
  return FUSCO_FAIL(fuscoInvalidUsage, kApi,
                    "%s: the handle's last fuscoMoeReplan failed; it must be replanned "
                    "(fuscoMoeReplan) before it can be used again",
                    fn);
}

// The calls that use a handle's plan: collective unless the handle is unplanned (see above).
CallKind planUseKind(fuscoMoeHandle_t handle) {
  return unplanned(handle) ? CallKind::None : CallKind::Collective;
}

// fuscoMoePlan and fuscoMoePlanCapacity (capacityMode; capacity 0 is then invalid).
fuscoResult_t planHandle(fuscoMoeHandle_t* handle, fuscoComm_t comm, const fuscoMoeConfig_t* config,
                         const int64_t* topkIdx, size_t numTokens, int topk, bool capacityMode,
                         size_t capacity, void* stream, const char* fn) {
  return guarded(comm, fn, CallKind::Collective, [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkComm(comm, fn));
    FUSCO_CHECK(implOf(comm).injectFault(FaultPhase::Plan));
    std::unique_ptr<fuscoMoeHandle> h(new fuscoMoeHandle());
    h->comm = comm;
    h->impl.comm = &implOf(comm);
    h->impl.numTokens = numTokens;
    h->impl.topk = topk;
    h->impl.capacity = capacity;
    ArgCheck a;
    if (capacityMode && (capacity == 0 || capacity > UINT32_MAX))
      a.fail("%s: recvCapacity %zu outside the supported range [1, 2^32 - 1]", fn, capacity);
    if (handle == nullptr) a.fail("%s: handle is NULL", fn);
    checkStream(comm, stream, fn, &a);
    checkMoeConfig(config, &a);
    if (numTokens > 0 && topkIdx == nullptr)
      a.fail("%s: topkIdx is NULL with %zu tokens", fn, numTokens);
    checkDevicePtr(comm, topkIdx, fn, "topkIdx", &a);
    bool inUse = false;
    const fuscoResult_t r = planNewMoe(config, topkIdx, stream, a, &h->impl, &inUse);
    if (inUse) h.release();  // operations it enqueued may still refer to it
    if (r != fuscoSuccess) return r;
    *handle = static_cast<fuscoMoeHandle_t>(registerLive(LiveKind::MoeHandle, h.get()));
    h.release();
    return fuscoSuccess;
  });
}

}  // namespace

bool fusco::moeHandleStorage(fuscoMoeHandle_t handle, std::vector<ListStorage>* out) {
  const fuscoMoeHandle* h = objectOf<fuscoMoeHandle>(LiveKind::MoeHandle, handle);
  if (h == nullptr) return false;
  *out = h->impl.storage();
  return true;
}

bool fusco::moeHandlePlanRounds(fuscoMoeHandle_t handle, MoeHandle::PlanRounds* out) {
  const fuscoMoeHandle* h = objectOf<fuscoMoeHandle>(LiveKind::MoeHandle, handle);
  if (h == nullptr || !h->impl.bySteps) return false;
  *out = h->impl.steps.rounds;
  return true;
}

extern "C" {

fuscoResult_t fuscoMoePlan(fuscoMoeHandle_t* handle, fuscoComm_t comm,
                           const fuscoMoeConfig_t* config, const int64_t* topkIdx, size_t numTokens,
                           int topk, void* stream) {
  return planHandle(handle, comm, config, topkIdx, numTokens, topk, false, 0, stream,
                    "fuscoMoePlan");
}

fuscoResult_t fuscoMoePlanCapacity(fuscoMoeHandle_t* handle, fuscoComm_t comm,
                                   const fuscoMoeConfig_t* config, const int64_t* topkIdx,
                                   size_t numTokens, int topk, size_t recvCapacity, void* stream) {
  return planHandle(handle, comm, config, topkIdx, numTokens, topk, true, recvCapacity, stream,
                    "fuscoMoePlanCapacity");
}

fuscoResult_t fuscoMoeReplan(fuscoMoeHandle_t handle, const int64_t* topkIdx, size_t numTokens,
                             int topk, void* stream) {
  fuscoComm_t comm = liveCommOf(handle);
  return guarded(comm, "fuscoMoeReplan", CallKind::Collective, [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkObject(LiveKind::MoeHandle, handle, "fuscoMoeReplan"));
    FUSCO_CHECK(checkOwnerComm(comm, handle, "fuscoMoeReplan"));
    FUSCO_CHECK(checkComm(comm, "fuscoMoeReplan"));
    FUSCO_CHECK(implOf(comm).injectFault(FaultPhase::Plan));
    ArgCheck a;
    checkStream(comm, stream, "fuscoMoeReplan", &a);
    if (numTokens > 0 && topkIdx == nullptr)
      a.fail("fuscoMoeReplan: topkIdx is NULL with %zu tokens", numTokens);
    checkDevicePtr(comm, topkIdx, "fuscoMoeReplan", "topkIdx", &a);
    return replanMoe(topkIdx, numTokens, topk, stream, a, &moeOf(handle));
  });
}

fuscoResult_t fuscoMoeDispatch(fuscoMoeHandle_t handle, const void* x, size_t rowBytes, void* recvX,
                               void* stream) {
  fuscoComm_t comm = liveCommOf(handle);
  return guarded(comm, "fuscoMoeDispatch", planUseKind(handle), [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkObject(LiveKind::MoeHandle, handle, "fuscoMoeDispatch"));
    FUSCO_CHECK(checkOwnerComm(comm, handle, "fuscoMoeDispatch"));
    FUSCO_CHECK(checkComm(comm, "fuscoMoeDispatch"));
    if (!moeOf(handle).planned) return refuseUnplanned("fuscoMoeDispatch");
    FUSCO_CHECK(implOf(comm).injectFault(FaultPhase::Dispatch));
    MoeHandle& h = moeOf(handle);
    const ArgCheck a = checkDispatch(comm, h, x, rowBytes, recvX, stream);
    return moeDispatch(h, x, rowBytes, recvX, a, stream);
  });
}

fuscoResult_t fuscoMoeCombine(fuscoMoeHandle_t handle, const void* expertOut,
                              fuscoDataType_t datatype, size_t hidden, const float* topkWeights,
                              void* out, void* stream) {
  fuscoComm_t comm = liveCommOf(handle);
  return guarded(comm, "fuscoMoeCombine", planUseKind(handle), [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkObject(LiveKind::MoeHandle, handle, "fuscoMoeCombine"));
    FUSCO_CHECK(checkOwnerComm(comm, handle, "fuscoMoeCombine"));
    FUSCO_CHECK(checkComm(comm, "fuscoMoeCombine"));
    if (!moeOf(handle).planned) return refuseUnplanned("fuscoMoeCombine");
    FUSCO_CHECK(implOf(comm).injectFault(FaultPhase::Combine));
    MoeHandle& h = moeOf(handle);
    const int dt = rawEnum(datatype);
    const ArgCheck a = checkCombine(comm, h, expertOut, dt, hidden, topkWeights, out, stream);
    // Only a validated value is used as the enum (any int is legal from C).
    const fuscoDataType_t type = a.ok() ? static_cast<fuscoDataType_t>(dt) : fuscoFloat32;
    return moeCombine(h, expertOut, type, hidden, topkWeights, out, a, stream);
  });
}

fuscoResult_t fuscoMoeGetRecvCounts(fuscoMoeHandle_t handle, size_t* numRecvRows,
                                    int64_t* tokensPerLocalExpert) {
  // Pinned: waiting for a capacity plan uses the comm's progress thread (fuscoCommAbort from
  // another thread must not free the comm meanwhile).
  const fuscoComm_t comm = liveCommOf(handle);
  return guarded(comm, "fuscoMoeGetRecvCounts", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkObject(LiveKind::MoeHandle, handle, "fuscoMoeGetRecvCounts"));
    if (numRecvRows == nullptr)
      return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoMoeGetRecvCounts: numRecvRows is NULL");
    if (!moeOf(handle).planned) return refuseUnplanned("fuscoMoeGetRecvCounts");
    return moeRecvCounts(moeOf(handle), comm != nullptr, numRecvRows, tokensPerLocalExpert);
  });
}

fuscoResult_t fuscoMoeGetStats(fuscoMoeHandle_t handle, fuscoMoeStats_t* stats) {
  return guarded(nullptr, "fuscoMoeGetStats", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkObject(LiveKind::MoeHandle, handle, "fuscoMoeGetStats"));
    if (stats == nullptr)
      return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoMoeGetStats: stats is NULL");
    if (stats->size != sizeof(fuscoMoeStats_t))
      return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                        "fuscoMoeGetStats: stats->size is %zu, expected %zu", stats->size,
                        sizeof(fuscoMoeStats_t));
    moeCopyStats(moeOf(handle), stats);
    return fuscoSuccess;
  });
}

fuscoResult_t fuscoMoeHandleDestroy(fuscoMoeHandle_t handle) {
  // Pinned: quiescing the handle uses the comm's progress thread.
  const fuscoComm_t comm = liveCommOf(handle);
  return guarded(comm, "fuscoMoeHandleDestroy", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkObject(LiveKind::MoeHandle, handle, "fuscoMoeHandleDestroy"));
    // Only the call that takes it out of the registry frees it: a second destroy fails above.
    auto* obj = static_cast<fuscoMoeHandle*>(unregisterLive(LiveKind::MoeHandle, handle));
    if (obj == nullptr)
      return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                        "fuscoMoeHandleDestroy: %p is not a live MoE handle (destroyed or never "
                        "created)",
                        static_cast<void*>(handle));
    // Operations still queued on the comm's progress thread may refer to the handle: when they
    // cannot be waited for, the handle is left allocated rather than freed under them.
    if (comm != nullptr) FUSCO_CHECK(moeQuiesce(obj->impl));
    delete obj;
    return fuscoSuccess;
  });
}

fuscoResult_t fuscoMoeGetRecvCountsDevice(fuscoMoeHandle_t handle, const int64_t** numRecvRows,
                                          const int64_t** tokensPerLocalExpert) {
  return guarded(nullptr, "fuscoMoeGetRecvCountsDevice", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkObject(LiveKind::MoeHandle, handle, "fuscoMoeGetRecvCountsDevice"));
    if (numRecvRows == nullptr)
      return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                        "fuscoMoeGetRecvCountsDevice: numRecvRows is NULL");
    // The counts it points at are the rejected routing's after a failed replan.
    if (!moeOf(handle).planned) return refuseUnplanned("fuscoMoeGetRecvCountsDevice");
    return moeRecvCountsDevice(moeOf(handle), numRecvRows, tokensPerLocalExpert);
  });
}

}  // extern "C"
