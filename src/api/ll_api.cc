// The low-latency entry points (docs/API.md, "Low-latency dispatch and combine"): the
// communicator's checks (stream, device pointers) around the buffer's (src/moe/ll_calls.h), then
// the buffer (src/moe/ll_buffer.h). These calls join no engine operation (no header round), so a
// local check failure returns before anything is enqueued and leaves the communicator as it was.
#include <memory>
#include <stdexcept>

#include "api/api_internal.h"
#include "moe/ll_buffer.h"
#include "moe/ll_calls.h"

struct fuscoLowLatency {
  fuscoComm_t comm = nullptr;  // the comm handle it was made on (api_internal.h, liveCommOf)
  std::unique_ptr<fusco::LowLatency> impl;
};

using namespace fusco;

namespace {

// A live buffer whose communicator is live.
fuscoResult_t checkLive(fuscoLowLatency_t ll, fuscoComm_t comm, const char* fn) {
  FUSCO_CHECK(checkObject(LiveKind::LowLatency, ll, fn));
  FUSCO_CHECK(checkOwnerComm(comm, ll, fn));
  return checkComm(comm, fn);
}

// The buffer behind a live handle (checked by the caller).
LowLatency& llOf(fuscoLowLatency_t ll) {
  fuscoLowLatency* h = objectOf<fuscoLowLatency>(LiveKind::LowLatency, ll);
  if (h == nullptr) throw std::logic_error("a low-latency buffer in use is not live");
  return *h->impl;
}

fuscoResult_t failed(const ArgCheck& a) {
  return FUSCO_FAIL(a.status, kApi, "%s", a.message.c_str());
}

}  // namespace

extern "C" {

fuscoResult_t fuscoLowLatencyCreate(fuscoLowLatency_t* ll, fuscoComm_t comm,
                                    const fuscoLowLatencyConfig_t* config) {
  return guarded(comm, "fuscoLowLatencyCreate", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkComm(comm, "fuscoLowLatencyCreate"));
    LlConfig cfg;
    ArgCheck a = llCheckConfig(config, implOf(comm).nranks(), &cfg);
    if (ll == nullptr) a.fail("fuscoLowLatencyCreate: ll is NULL");
    std::unique_ptr<fuscoLowLatency> h(new fuscoLowLatency());
    h->comm = comm;
    FUSCO_CHECK(LowLatency::create(implOf(comm), cfg, a, &h->impl));
    *ll = static_cast<fuscoLowLatency_t>(registerLive(LiveKind::LowLatency, h.get()));
    h.release();
    return fuscoSuccess;
  });
}

fuscoResult_t fuscoLowLatencyDispatch(fuscoLowLatency_t ll, const void* x, const int64_t* topkIdx,
                                      int numTokens, int topk, int format, unsigned int flags,
                                      fuscoLowLatencyDispatch_t* out, void* stream) {
  fuscoComm_t comm = liveCommOf<fuscoLowLatency>(LiveKind::LowLatency, ll);
  return guarded(comm, "fuscoLowLatencyDispatch", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkLive(ll, comm, "fuscoLowLatencyDispatch"));
    const char* fn = "fuscoLowLatencyDispatch";
    ArgCheck a;
    checkStream(comm, stream, fn, &a);
    llCheckDispatch(llOf(ll), x, topkIdx, numTokens, topk, format, flags, out, &a);
    checkDevicePtr(comm, x, fn, "x", &a);
    checkDevicePtr(comm, topkIdx, fn, "topkIdx", &a);
    if (!a.ok()) return failed(a);
    return llOf(ll).dispatch(llDispatchCall(x, topkIdx, numTokens, topk, format, flags), out,
                             stream);
  });
}

fuscoResult_t fuscoLowLatencyCombine(fuscoLowLatency_t ll,
                                     const fuscoLowLatencyDispatch_t* dispatched,
                                     const void* expertOut, const int64_t* topkIdx,
                                     const float* topkWeights, int numTokens, int topk, void* out,
                                     unsigned int flags, unsigned long long* hook, void* stream) {
  fuscoComm_t comm = liveCommOf<fuscoLowLatency>(LiveKind::LowLatency, ll);
  return guarded(comm, "fuscoLowLatencyCombine", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkLive(ll, comm, "fuscoLowLatencyCombine"));
    const char* fn = "fuscoLowLatencyCombine";
    LlCall call = llCombineCall(expertOut, topkIdx, topkWeights, numTokens, topk, out, flags);
    ArgCheck a;
    checkStream(comm, stream, fn, &a);
    if (llCheckCombine(llOf(ll), dispatched, call, flags, hook, &a)) {
      checkDevicePtr(comm, call.expertOut, fn, "expertOut", &a);
      checkDevicePtr(comm, call.topkIdx, fn, "topkIdx", &a);
      checkDevicePtr(comm, call.weights, fn, "topkWeights", &a);
      checkDevicePtr(comm, call.out, fn, "out", &a);
    }
    if (!a.ok()) return failed(a);
    call.half = dispatched->buffer;
    return llOf(ll).combine(call, hook, stream);
  });
}

fuscoResult_t fuscoLowLatencyRecvHook(fuscoLowLatency_t ll, unsigned long long hook, void* stream) {
  fuscoComm_t comm = liveCommOf<fuscoLowLatency>(LiveKind::LowLatency, ll);
  return guarded(comm, "fuscoLowLatencyRecvHook", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkLive(ll, comm, "fuscoLowLatencyRecvHook"));
    ArgCheck a;
    checkStream(comm, stream, "fuscoLowLatencyRecvHook", &a);
    if (!a.ok()) return failed(a);
    return llOf(ll).recvHook(hook, stream);
  });
}

fuscoResult_t fuscoLowLatencyDestroy(fuscoLowLatency_t ll) {
  fuscoComm_t comm = liveCommOf<fuscoLowLatency>(LiveKind::LowLatency, ll);
  return guarded(comm, "fuscoLowLatencyDestroy", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkObject(LiveKind::LowLatency, ll, "fuscoLowLatencyDestroy"));
    auto* obj = static_cast<fuscoLowLatency*>(unregisterLive(LiveKind::LowLatency, ll));
    if (obj == nullptr)
      return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                        "fuscoLowLatencyDestroy: %p is not a live low-latency buffer",
                        static_cast<void*>(ll));
    std::unique_ptr<fuscoLowLatency> owned(obj);
    // The comm is gone: its memory went with it; only the object is left to free.
    if (comm == nullptr) return fuscoSuccess;
    return owned->impl->destroy();
  });
}

}  // extern "C"
