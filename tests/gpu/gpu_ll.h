// Low-latency dispatch and combine on CUDA comms (docs/API.md, "Low-latency dispatch and
// combine") for the [gpu] suites: a rank's inputs uploaded to device memory, the calls on a
// stream, the receive slots copied back after the stream finished and checked with the host
// reference of harness/ll_reference.h, combine `out` in a poisoned device buffer (with a poisoned
// tail). Host-only header.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fusco.h"
#include "gpu/gpu_harness.h"
#include "harness/ll_reference.h"

namespace fusco::test::gpu {

// A stream may wait this long for its peers (well past gpuConfig's 30 s timeout).
constexpr double kLlWaitSec = 60.0;

// One rank's inputs on the device (cudaMalloc; NULL where empty).
struct LlDevInputs {
  DevBuf x, idx, w;
  const void* xPtr() const { return x.ok() ? x.get() : nullptr; }
  const int64_t* idxPtr() const {
    return static_cast<const int64_t*>(idx.ok() ? idx.get() : nullptr);
  }
  const float* wPtr() const { return static_cast<const float*>(w.ok() ? w.get() : nullptr); }
};
LlDevInputs llUpload(fuscoComm_t comm, const LlInputs& in, int rank);
// Overwrites the contents of b (same sizes) with in's, synchronously.
void llReload(LlDevInputs& b, const LlInputs& in, int rank);

fuscoResult_t llGpuDispatch(fuscoLowLatency_t ll, const LlDevInputs& b, const LlInputs& in,
                            int rank, int format, unsigned int flags, fuscoLowLatencyDispatch_t* d,
                            cudaStream_t stream);
fuscoResult_t llGpuCombine(fuscoLowLatency_t ll, const fuscoLowLatencyDispatch_t* d,
                           const DevBuf& expertOut, const LlDevInputs& b, const LlInputs& in,
                           int rank, bool weighted, unsigned int flags, void* out,
                           unsigned long long* hook, cudaStream_t stream);

// Waits for s (with a deadline) and checks that the comm reports no asynchronous error.
::testing::AssertionResult llFinish(cudaStream_t s, fuscoComm_t comm, const std::string& what);

// The received rows copied out of device memory (cudaMemcpy; failures recorded).
LlRecv llFetchDevice(const fuscoLowLatencyDispatch_t& d, const LlCase& c, int format);

// A device buffer holding llExpertOut for got.
DevBuf llDevExpertOut(fuscoComm_t comm, const LlCase& c, int format, int rank, const LlRecv& got);

struct LlGpuRound {
  int format = FUSCO_LL_BF16;
  bool hook = false;                  // both calls with FUSCO_LL_RECV_HOOK
  cudaStream_t hookStream = nullptr;  // where the hooks run (NULL: the calls' stream)
  bool weighted = true;
  int buffer = 0;  // the half the dispatch must use; -1: either
};

// Dispatch (and hook), wait, check the fields and the received rows; *got and *d hold them.
bool llGpuDispatchChecked(fuscoComm_t comm, fuscoLowLatency_t ll, const RankCtx& ctx,
                          const LlInputs& in, const LlDevInputs& b, const LlGpuRound& o,
                          cudaStream_t stream, const std::string& what,
                          fuscoLowLatencyDispatch_t* d, LlRecv* got);

// Combine of d with the expert outputs of got into a poisoned out, wait, check against the
// reference. Returns out (without the tail).
std::vector<uint8_t> llGpuCombineChecked(fuscoComm_t comm, fuscoLowLatency_t ll, const RankCtx& ctx,
                                         const LlInputs& in, const LlDevInputs& b,
                                         const LlGpuRound& o, const fuscoLowLatencyDispatch_t& d,
                                         const LlRecv& got, cudaStream_t stream,
                                         const std::string& what);

// Both of the above, with in's rows uploaded first.
std::vector<uint8_t> llGpuRoundChecked(fuscoComm_t comm, fuscoLowLatency_t ll, const RankCtx& ctx,
                                       const LlInputs& in, const LlGpuRound& o, cudaStream_t stream,
                                       const std::string& what);

}  // namespace fusco::test::gpu
