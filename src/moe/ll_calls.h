// The low-latency calls' checks against a buffer's limits and state, and their arguments as the
// buffer takes them (docs/API.md, "Low-latency dispatch and combine"). src/api/ll_api.cc checks
// the communicator, the stream and the device pointers around them and hands the call over.
#pragma once

#include <cstdint>

#include "core/arg_check.h"
#include "fusco.h"
#include "moe/ll_buffer.h"

namespace fusco {

// fuscoLowLatencyCreate's config: its version fields and every field's range; *out its values.
ArgCheck llCheckConfig(const fuscoLowLatencyConfig_t* cfg, int nranks, LlConfig* out);

// Dispatch: the routing's shape against the buffer's limits, the format, the outputs, into *a.
void llCheckDispatch(const LowLatency& l, const void* x, const int64_t* idx, int numTokens,
                     int topk, int format, unsigned flags, const fuscoLowLatencyDispatch_t* out,
                     ArgCheck* a);
// Combine: the shape and the dispatch it names (its half's last one), the outputs, into *a.
// False when d cannot name a half (nothing more is checked then).
bool llCheckCombine(const LowLatency& l, const fuscoLowLatencyDispatch_t* d, const LlCall& call,
                    unsigned flags, const unsigned long long* hook, ArgCheck* a);

// The calls' arguments as LowLatency::dispatch and combine take them.
LlCall llDispatchCall(const void* x, const int64_t* topkIdx, int numTokens, int topk, int format,
                      unsigned flags);
LlCall llCombineCall(const void* expertOut, const int64_t* topkIdx, const float* topkWeights,
                     int numTokens, int topk, void* out, unsigned flags);

}  // namespace fusco
