// MoE plan / dispatch / combine on a CUDA comm, checked against the sequential host reference
// (harness/moe_reference.h) for the cases of harness/moe_cases.h. Inputs (topkIdx, x, expertOut,
// topkWeights) are uploaded to device memory, outputs land in poisoned device buffers (0xA5, with
// a poisoned tail past the end) and are copied back after the stream is synchronized.
//
// Each check returns a ::testing::AssertionResult instead of recording a failure, so the
// standalone program run under compute-sanitizer (sanitizer_moe_main.cc) can use them too.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fusco.h"
#include "gpu/gpu_harness.h"
#include "harness/moe_cases.h"
#include "harness/moe_reference.h"

namespace fusco::test::gpu {

// A case on one node of nranks (the only shape a CUDA comm has); the rest as MoeCase defaults.
MoeCase oneNodeCase(int nranks);

// One rank's buffers for a test that calls fuscoMoeDispatch / fuscoMoeCombine itself: device
// copies (cudaMalloc; NULL where empty) of its x, expertOut and weights, and the outputs, both
// poisoned: recvX (numRecvRows rows, kind recvKind) and out (numTokens rows), rows of
// s.hidden * dtypeSize(s.dt) bytes.
struct MoeRankBufs {
  DevBuf x, recvX, expertOut, weights, out;
};
MoeRankBufs moeRankBufs(fuscoComm_t comm, const CombineSetup& s, int rank,
                        Mem recvKind = Mem::Cuda);

// fuscoMoePlan with this rank's routing in a device int64 array, on `stream`; then checks
// numRecvRows and tokensPerLocalExpert against the reference. *h is set only on success.
::testing::AssertionResult gpuPlan(fuscoComm_t comm, int rank, const MoeCase& c,
                                   const MoeRefProblem& p, const MoeRefDispatch& d, int dedup,
                                   int balance, cudaStream_t stream, fuscoMoeHandle_t* h);

// fuscoMoeReplan of h with this rank's routing in a device int64 array, on `stream` (synchronized
// afterwards, so the routing's copy is done); then the receive counts as gpuPlan checks them.
::testing::AssertionResult gpuReplan(fuscoComm_t comm, fuscoMoeHandle_t h, int rank,
                                     const MoeCase& c, const MoeRefProblem& p,
                                     const MoeRefDispatch& d, cudaStream_t stream);

// numRecvRows and tokensPerLocalExpert of h against the reference (nothing written past the
// local experts).
::testing::AssertionResult recvCountsMatch(fuscoComm_t comm, fuscoMoeHandle_t h, int rank,
                                           const MoeRefDispatch& d);

// fuscoMoeDispatch of x[rank] (a device buffer of kind xKind) into a poisoned recvX of kind
// recvKind on `stream`; recvX (numRecvRows * rowBytes) must equal the reference bit for bit, the
// padding rows must be zero and the tail untouched. *got receives recvX when non-NULL.
::testing::AssertionResult gpuDispatch(fuscoComm_t comm, fuscoMoeHandle_t h, int rank,
                                       const MoeRefProblem& p, const MoeRefDispatch& d,
                                       const Bytes2D& x, size_t rowBytes, Mem xKind, Mem recvKind,
                                       cudaStream_t stream, std::vector<uint8_t>* got = nullptr);

// Dispatch stats of the last dispatch on h: RANK one row per (token, distinct remote rank), NONE
// one per (token, remote slot); on one node NODE and AUTO count like RANK.
::testing::AssertionResult dispatchStatsMatch(fuscoMoeHandle_t h, const MoeRefProblem& p, int rank,
                                              int dedup, size_t rowBytes);

// fuscoMoeCombine of s.expertOut[rank] (device, kind inKind) with device weights (or NULL) into a
// poisoned `out` of kind outKind; out must equal moeRefCombine bit for bit. *got receives out.
::testing::AssertionResult gpuCombine(fuscoComm_t comm, fuscoMoeHandle_t h, int rank,
                                      const CombineSetup& s, bool weighted, Mem inKind, Mem outKind,
                                      cudaStream_t stream, std::vector<uint8_t>* got = nullptr);

// Payload bytes of combine stats with NONE dedup: every received row goes back raw.
size_t noneCombineBytes(const MoeRefProblem& p, int rank, size_t rowOutBytes);

}  // namespace fusco::test::gpu
