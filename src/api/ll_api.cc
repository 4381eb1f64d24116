// The low-latency entry points (docs/API.md, "Low-latency dispatch and combine"): argument checks
// against the buffer's limits, then the buffer (src/moe/ll_buffer.h). These calls join no engine
// operation (no header round), so a local check failure returns before anything is enqueued and
// leaves the communicator as it was.
#include <memory>

#include "api/api_internal.h"
#include "moe/ll_buffer.h"

struct fuscoLowLatency {
  fuscoComm_t comm = nullptr;
  uint64_t commSerial = 0;  // the comm's registration (api_internal.h, liveCommOf)
  std::unique_ptr<fusco::LowLatency> impl;
};

using namespace fusco;

namespace {

void checkRange(const char* field, int v, int lo, int hi, ArgCheck* a) {
  if (v < lo || v > hi)
    a->fail("fuscoLowLatencyCreate: config->%s is %d, outside the supported [%d, %d]", field, v, lo,
            hi);
}

ArgCheck checkConfig(const fuscoLowLatencyConfig_t* cfg, int nranks, LlConfig* out) {
  ArgCheck a;
  if (cfg == nullptr) {
    a.fail("fuscoLowLatencyCreate: config is NULL");
    return a;
  }
  if (cfg->size != sizeof(fuscoLowLatencyConfig_t) ||
      cfg->magic != FUSCO_LOW_LATENCY_CONFIG_MAGIC ||
      cfg->version != FUSCO_LOW_LATENCY_CONFIG_VERSION) {
    a.fail(
        "fuscoLowLatencyCreate: config was not set up with FUSCO_LOW_LATENCY_CONFIG_INITIALIZER "
        "(size, magic or version differ)");
    return a;
  }
  checkRange("maxTokensPerRank", cfg->maxTokensPerRank, 1, 65536, &a);
  checkRange("hidden", cfg->hidden, 1, 65536, &a);
  checkRange("numExperts", cfg->numExperts, 1, 65536, &a);
  checkRange("maxTopk", cfg->maxTopk, 1, static_cast<int>(ll::kMaxTopk), &a);
  if (a.ok() && cfg->numExperts % nranks != 0)
    a.fail("fuscoLowLatencyCreate: config->numExperts %d is not a multiple of the %d ranks",
           cfg->numExperts, nranks);
  if (nranks > 1024)
    a.fail("fuscoLowLatencyCreate: %d ranks; the path supports at most 1024", nranks);
  *out = {cfg->maxTokensPerRank, cfg->hidden, cfg->numExperts, cfg->maxTopk};
  return a;
}

// The checks dispatch and combine share: the routing's shape against the buffer's limits.
void checkShape(const char* fn, const LlConfig& cfg, int numTokens, int topk, unsigned flags,
                ArgCheck* a) {
  if (numTokens < 0 || numTokens > cfg.maxTokensPerRank)
    a->fail("%s: numTokens %d is outside [0, maxTokensPerRank %d]", fn, numTokens,
            cfg.maxTokensPerRank);
  if (topk < 1 || topk > cfg.maxTopk)
    a->fail("%s: topk %d is outside [1, maxTopk %d]", fn, topk, cfg.maxTopk);
  if ((flags & ~FUSCO_LL_RECV_HOOK) != 0)
    a->fail("%s: flags 0x%x has bits other than FUSCO_LL_RECV_HOOK", fn, flags);
}

ArgCheck checkDispatch(fuscoComm_t comm, const LowLatency& l, const void* x, const int64_t* idx,
                       int numTokens, int topk, int format, unsigned flags,
                       const fuscoLowLatencyDispatch_t* out, void* stream) {
  const char* fn = "fuscoLowLatencyDispatch";
  ArgCheck a;
  checkStream(comm, stream, fn, &a);
  checkShape(fn, l.config(), numTokens, topk, flags, &a);
  if (format != FUSCO_LL_BF16 && format != FUSCO_LL_FP8)
    a.fail("%s: format %d is neither FUSCO_LL_BF16 nor FUSCO_LL_FP8", fn, format);
  if (format == FUSCO_LL_FP8 && l.config().hidden % 128 != 0)
    a.fail("%s: FP8 needs hidden to be a multiple of 128 (one scale per 128 channels); it is %d",
           fn, l.config().hidden);
  if (out == nullptr) a.fail("%s: out is NULL", fn);
  if (numTokens > 0 && (x == nullptr || idx == nullptr))
    a.fail("%s: x or topkIdx is NULL with %d tokens", fn, numTokens);
  checkDevicePtr(comm, x, fn, "x", &a);
  checkDevicePtr(comm, idx, fn, "topkIdx", &a);
  return a;
}

ArgCheck checkCombine(fuscoComm_t comm, const LowLatency& l, const fuscoLowLatencyDispatch_t* d,
                      const LlCall& call, unsigned flags, const unsigned long long* hook,
                      void* stream) {
  const char* fn = "fuscoLowLatencyCombine";
  ArgCheck a;
  checkStream(comm, stream, fn, &a);
  checkShape(fn, l.config(), call.numTokens, call.topk, flags, &a);
  if (d == nullptr || (d->buffer != 0 && d->buffer != 1)) {
    a.fail("%s: dispatched is NULL or not the output of fuscoLowLatencyDispatch", fn);
    return a;
  }
  // A dispatch made with or followed on its half by one with FUSCO_LL_RECV_HOOK carries a hook
  // unique to it: one that is not the half's last is stale (docs/API.md, "Low-latency dispatch
  // and combine"). Two dispatches without the flag look alike, so that order stays the caller's.
  if (a.ok() && d->hook != l.hookOn(d->buffer)) {
    a.fail(
        "%s: dispatched (hook %llu) is not the last dispatch on buffer %d (hook %llu): the "
        "buffer was dispatched again since and holds that dispatch's rows; a combine must come "
        "before the dispatch two calls later",
        fn, d->hook, d->buffer, l.hookOn(d->buffer));
    a.status = fuscoInvalidUsage;
    return a;
  }
  if (l.tokensOn(d->buffer) != call.numTokens || l.topkOn(d->buffer) != call.topk)
    a.fail("%s: numTokens %d and topk %d differ from the dispatch's %d and %d on buffer %d", fn,
           call.numTokens, call.topk, l.tokensOn(d->buffer), l.topkOn(d->buffer), d->buffer);
  if (call.expertOut == nullptr) a.fail("%s: expertOut is NULL", fn);
  if (call.numTokens > 0 && (call.out == nullptr || call.topkIdx == nullptr))
    a.fail("%s: out or topkIdx is NULL with %d tokens", fn, call.numTokens);
  if ((flags & FUSCO_LL_RECV_HOOK) != 0 && hook == nullptr)
    a.fail("%s: FUSCO_LL_RECV_HOOK with hook NULL", fn);
  checkDevicePtr(comm, call.expertOut, fn, "expertOut", &a);
  checkDevicePtr(comm, call.topkIdx, fn, "topkIdx", &a);
  checkDevicePtr(comm, call.weights, fn, "topkWeights", &a);
  checkDevicePtr(comm, call.out, fn, "out", &a);
  return a;
}

// A live buffer whose communicator is live.
fuscoResult_t checkLive(fuscoLowLatency_t ll, fuscoComm_t comm, const char* fn) {
  FUSCO_CHECK(checkObject(LiveKind::LowLatency, ll, fn));
  FUSCO_CHECK(checkOwnerComm(comm, ll, fn));
  return checkComm(comm, fn);
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
    ArgCheck a = checkConfig(config, comm->impl->nranks(), &cfg);
    if (ll == nullptr) a.fail("fuscoLowLatencyCreate: ll is NULL");
    std::unique_ptr<fuscoLowLatency> h(new fuscoLowLatency());
    h->comm = comm;
    h->commSerial = liveSerial(LiveKind::Comm, comm);
    FUSCO_CHECK(LowLatency::create(*comm->impl, cfg, a, &h->impl));
    registerLive(LiveKind::LowLatency, h.get());
    *ll = h.release();
    return fuscoSuccess;
  });
}

fuscoResult_t fuscoLowLatencyDispatch(fuscoLowLatency_t ll, const void* x, const int64_t* topkIdx,
                                      int numTokens, int topk, int format, unsigned int flags,
                                      fuscoLowLatencyDispatch_t* out, void* stream) {
  fuscoComm_t comm = liveCommOf(LiveKind::LowLatency, ll);
  return guarded(comm, "fuscoLowLatencyDispatch", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkLive(ll, comm, "fuscoLowLatencyDispatch"));
    const ArgCheck a =
        checkDispatch(comm, *ll->impl, x, topkIdx, numTokens, topk, format, flags, out, stream);
    if (!a.ok()) return failed(a);
    LlCall call;
    call.x = x;
    call.topkIdx = topkIdx;
    call.numTokens = numTokens;
    call.topk = topk;
    call.format = format;
    call.hook = (flags & FUSCO_LL_RECV_HOOK) != 0;
    return ll->impl->dispatch(call, out, stream);
  });
}

fuscoResult_t fuscoLowLatencyCombine(fuscoLowLatency_t ll,
                                     const fuscoLowLatencyDispatch_t* dispatched,
                                     const void* expertOut, const int64_t* topkIdx,
                                     const float* topkWeights, int numTokens, int topk, void* out,
                                     unsigned int flags, unsigned long long* hook, void* stream) {
  fuscoComm_t comm = liveCommOf(LiveKind::LowLatency, ll);
  return guarded(comm, "fuscoLowLatencyCombine", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkLive(ll, comm, "fuscoLowLatencyCombine"));
    LlCall call;
    call.expertOut = expertOut;
    call.topkIdx = topkIdx;
    call.weights = topkWeights;
    call.out = out;
    call.numTokens = numTokens;
    call.topk = topk;
    call.hook = (flags & FUSCO_LL_RECV_HOOK) != 0;
    const ArgCheck a = checkCombine(comm, *ll->impl, dispatched, call, flags, hook, stream);
    if (!a.ok()) return failed(a);
    call.half = dispatched->buffer;
    return ll->impl->combine(call, hook, stream);
  });
}

fuscoResult_t fuscoLowLatencyRecvHook(fuscoLowLatency_t ll, unsigned long long hook, void* stream) {
  fuscoComm_t comm = liveCommOf(LiveKind::LowLatency, ll);
  return guarded(comm, "fuscoLowLatencyRecvHook", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkLive(ll, comm, "fuscoLowLatencyRecvHook"));
    ArgCheck a;
    checkStream(comm, stream, "fuscoLowLatencyRecvHook", &a);
    if (!a.ok()) return failed(a);
    return ll->impl->recvHook(hook, stream);
  });
}

fuscoResult_t fuscoLowLatencyDestroy(fuscoLowLatency_t ll) {
  fuscoComm_t comm = liveCommOf(LiveKind::LowLatency, ll);
  return guarded(comm, "fuscoLowLatencyDestroy", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkObject(LiveKind::LowLatency, ll, "fuscoLowLatencyDestroy"));
    if (!unregisterLive(LiveKind::LowLatency, ll))
      return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                        "fuscoLowLatencyDestroy: %p is not a live low-latency buffer",
                        static_cast<void*>(ll));
    std::unique_ptr<fuscoLowLatency> owned(ll);
    // The comm is gone: its memory went with it; only the object is left to free.
    if (comm == nullptr) return fuscoSuccess;
    return owned->impl->destroy();
  });
}

}  // extern "C"
