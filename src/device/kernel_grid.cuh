// Grid sizes for the library's persistent kernels (CUDA sources only): the blocks resident on the
// device at once, capped at the SM budget (fuscoConfig_t.maxSms or FUSCO_CUDA_SMS) so
// communication leaves the rest of the GPU to compute.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/log.h"
#include "device/device_ops.h"

namespace fusco {

// What the device init learned of one kernel (kernel_load.h): resident blocks per
// multiprocessor, 0 until the kernel was loaded.
struct KernelGeometry {
  const char* name = "";
  int perSm = 0;
};

// The multiprocessors of the current device that kernels may use, as cached by the device init
// (0: not loaded on this device). No runtime query: a launch site must never wait for the device.
int64_t usableSms();

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

// A kernel about to be launched was loaded by the device init; fuscoInternalError naming it
// otherwise (a launch would load it lazily, which may wait for the device).
inline fuscoResult_t checkLoaded(const KernelGeometry& g) {
  if (g.perSm > 0 && usableSms() > 0) return fuscoSuccess;
  return FUSCO_FAIL(fuscoInternalError, kEngine,
                    "kernel %s is launched before the device init loaded it (deviceLoadKernels)",
                    g.name);
}

// Collects what the device init learns of each kernel: loads it (cudaFuncGetAttributes) and
// computes its resident blocks per multiprocessor, and the largest per-thread stack any needs.
class KernelLoader {
 public:
  template <typename Kernel>
  fuscoResult_t load(Kernel kernel, int threads, KernelGeometry* g) {
    cudaFuncAttributes attr;
    const void* fn = reinterpret_cast<const void*>(kernel);
    cudaError_t e = cudaFuncGetAttributes(&attr, fn);
    if (e != cudaSuccess) return FUSCO_CUDA_FAIL(e, kInit, g ? g->name : "loading a kernel");
    if (attr.localSizeBytes > maxLocalBytes) maxLocalBytes = attr.localSizeBytes;
    if (g == nullptr) return fuscoSuccess;
    int n = 0;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0);
    if (e != cudaSuccess) return FUSCO_CUDA_FAIL(e, kInit, g->name);
    // The smallest of the devices loaded so far: a grid sized by it fits every one of them.
    n = n > 0 ? n : 1;
    if (g->perSm == 0 || n < g->perSm) g->perSm = n;
    return fuscoSuccess;
  }
  size_t maxLocalBytes = 0;
};

// Each kernel source's loader (kernel_load.cu runs them all).
fuscoResult_t loadCopyKernels(KernelLoader& l);
fuscoResult_t loadPlanKernels(KernelLoader& l);
fuscoResult_t loadOpKernel(KernelLoader& l);
fuscoResult_t loadLlKernels(KernelLoader& l);

}  // namespace fusco
