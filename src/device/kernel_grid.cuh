// Grid sizes for the library's persistent kernels (CUDA sources only): the blocks resident on the
// device at once, capped at FUSCO_CUDA_SMS multiprocessors so communication leaves the rest of
// the GPU to compute.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/log.h"
#include "device/device_ops.h"

namespace fusco {

// The device's multiprocessors that kernels may use (looked up once per process).
inline int64_t usableSms() {
  static const int sms = [] {
    int dev = 0, n = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n > 0 ? n : 1;
  }();
  const int64_t cap = paramCudaSms();
  return cap > 0 && cap < sms ? cap : sms;
}

// Blocks for a persistent grid: enough for the work, at most `perSm` per allowed multiprocessor.
inline unsigned gridFor(uint64_t units, int perSm) {
  const uint64_t blocks = std::min<uint64_t>(units, static_cast<uint64_t>(usableSms()) * perSm);
  return static_cast<unsigned>(std::max<uint64_t>(blocks, 1));
}

// The launch just made: fuscoSuccess, or the runtime's error naming `what`.
inline fuscoResult_t launchResult(const char* what, Subsys subsys = kEngine) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? fuscoSuccess : FUSCO_CUDA_FAIL(e, subsys, what);
}

// Blocks of `threads` threads of `kernel` resident on one multiprocessor at once (its registers
// and shared memory decide): a persistent grid of more would run in a second, partial wave.
template <typename Kernel>
int residentPerSm(Kernel kernel, int threads) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0) != cudaSuccess) {
    cudaGetLastError();  // not sticky; the launch itself reports a real failure
    n = 1;
  }
  return n > 0 ? n : 1;
}

}  // namespace fusco
