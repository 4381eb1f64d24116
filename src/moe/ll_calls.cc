// The low-latency calls' checks against a buffer's limits and state, and their arguments
// (ll_calls.h).
#include "moe/ll_calls.h"

namespace fusco {

namespace {

void checkRange(const char* field, int v, int lo, int hi, ArgCheck* a) {
  if (v < lo || v > hi)
    a->fail("fuscoLowLatencyCreate: config->%s is %d, outside the supported [%d, %d]", field, v, lo,
            hi);
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

}  // namespace

ArgCheck llCheckConfig(const fuscoLowLatencyConfig_t* cfg, int nranks, LlConfig* out) {
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

void llCheckDispatch(const LowLatency& l, const void* x, const int64_t* idx, int numTokens,
                     int topk, int format, unsigned flags, const fuscoLowLatencyDispatch_t* out,
                     ArgCheck* a) {
  const char* fn = "fuscoLowLatencyDispatch";
  checkShape(fn, l.config(), numTokens, topk, flags, a);
  if (format != FUSCO_LL_BF16 && format != FUSCO_LL_FP8)
    a->fail("%s: format %d is neither FUSCO_LL_BF16 nor FUSCO_LL_FP8", fn, format);
  if (format == FUSCO_LL_FP8 && l.config().hidden % 128 != 0)
    a->fail("%s: FP8 needs hidden to be a multiple of 128 (one scale per 128 channels); it is %d",
            fn, l.config().hidden);
  if (out == nullptr) a->fail("%s: out is NULL", fn);
  if (numTokens > 0 && (x == nullptr || idx == nullptr))
    a->fail("%s: x or topkIdx is NULL with %d tokens", fn, numTokens);
}

bool llCheckCombine(const LowLatency& l, const fuscoLowLatencyDispatch_t* d, const LlCall& call,
                    unsigned flags, const unsigned long long* hook, ArgCheck* a) {
  const char* fn = "fuscoLowLatencyCombine";
  checkShape(fn, l.config(), call.numTokens, call.topk, flags, a);
  if (d == nullptr || (d->buffer != 0 && d->buffer != 1)) {
    a->fail("%s: dispatched is NULL or not the output of fuscoLowLatencyDispatch", fn);
    return false;
  }
  // A dispatch made with or followed on its half by one with FUSCO_LL_RECV_HOOK carries a hook
  // unique to it: one that is not the half's last is stale (docs/API.md, "Low-latency dispatch
  // and combine"). Two dispatches without the flag look alike, so that order stays the caller's.
  if (a->ok() && l.supersededOn(d->buffer, d)) {
    a->fail(
        "%s: dispatched is the output of an earlier dispatch on buffer %d, which a later dispatch "
        "has reused since: that buffer holds the later dispatch's rows; a combine must come "
        "before the dispatch two calls later",
        fn, d->buffer);
    a->status = fuscoInvalidUsage;
    return false;
  }
  if (a->ok() && d->hook != l.hookOn(d->buffer)) {
    a->fail(
        "%s: dispatched (hook %llu) is not the last dispatch on buffer %d (hook %llu): the "
        "buffer was dispatched again since and holds that dispatch's rows; a combine must come "
        "before the dispatch two calls later",
        fn, d->hook, d->buffer, l.hookOn(d->buffer));
    a->status = fuscoInvalidUsage;
    return false;
  }
  if (l.tokensOn(d->buffer) != call.numTokens || l.topkOn(d->buffer) != call.topk)
    a->fail("%s: numTokens %d and topk %d differ from the dispatch's %d and %d on buffer %d", fn,
            call.numTokens, call.topk, l.tokensOn(d->buffer), l.topkOn(d->buffer), d->buffer);
  if (call.expertOut == nullptr) a->fail("%s: expertOut is NULL", fn);
  if (call.numTokens > 0 && (call.out == nullptr || call.topkIdx == nullptr))
    a->fail("%s: out or topkIdx is NULL with %d tokens", fn, call.numTokens);
  if ((flags & FUSCO_LL_RECV_HOOK) != 0 && hook == nullptr)
    a->fail("%s: FUSCO_LL_RECV_HOOK with hook NULL", fn);
  return true;
}

LlCall llDispatchCall(const void* x, const int64_t* topkIdx, int numTokens, int topk, int format,
                      unsigned flags) {
  LlCall call;
  call.x = x;
  call.topkIdx = topkIdx;
  call.numTokens = numTokens;
  call.topk = topk;
  call.format = format;
  call.hook = (flags & FUSCO_LL_RECV_HOOK) != 0;
  return call;
}

LlCall llCombineCall(const void* expertOut, const int64_t* topkIdx, const float* topkWeights,
                     int numTokens, int topk, void* out, unsigned flags) {
  LlCall call;
  call.expertOut = expertOut;
  call.topkIdx = topkIdx;
  call.weights = topkWeights;
  call.out = out;
  call.numTokens = numTokens;
  call.topk = topk;
  call.hook = (flags & FUSCO_LL_RECV_HOOK) != 0;
  return call;
}

}  // namespace fusco
