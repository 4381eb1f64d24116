// The CUDA variant of the check macros (result.h), for the layers that call the CUDA runtime
// (device, transport/cuda_ipc). Only CUDA-enabled translation units include it: it needs the
// toolkit's <cuda_runtime.h>, never nvcc.
#pragma once

#include <cuda_runtime.h>

#include "core/result.h"

namespace fusco {

// Logs and records a failed CUDA runtime call `what` (file:line of the caller) and returns
// fuscoUnhandledCudaError. Clears the runtime's last error, so a non-sticky failure is not
// reported again by the next, unrelated call.
inline fuscoResult_t cudaFailure(cudaError_t e, Subsys s, const char* file, int line,
                                 const char* what) {
  cudaGetLastError();
  return setError(fuscoUnhandledCudaError, s, file, line, "%s failed: %s (%s)", what,
                  cudaGetErrorName(e), cudaGetErrorString(e));
}

}  // namespace fusco

#define FUSCO_CUDA_FAIL(err, subsys, what) \
  ::fusco::cudaFailure((err), (subsys), __FILE__, __LINE__, (what))

// Return fuscoUnhandledCudaError (logged once, here) if a CUDA runtime call fails.
#define FUSCO_CUDACHECK(call, subsys)                                               \
  do {                                                                              \
    cudaError_t fusco_ce_ = (call);                                                 \
    if (fusco_ce_ != cudaSuccess) return FUSCO_CUDA_FAIL(fusco_ce_, subsys, #call); \
  } while (0)
