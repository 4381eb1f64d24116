// Tiny device helpers for the [gpu] suites (kernels in gpu_kernels.cu); host-only header.
#pragma once

#include <cuda_runtime_api.h>

namespace fusco::test::gpu {

// Enqueues a one-thread kernel on `stream` that spins for `seconds` (device global timer), so the
// work a test enqueues after it is held back that long: a library call that is not stream-ordered
// reads its inputs too early, one that syncs the host returns too late.
cudaError_t spinAsync(cudaStream_t stream, double seconds);

}  // namespace fusco::test::gpu
