// The low-latency kernel (ll_ops.h) on the twin CUDA runtime (a build with FUSCO_TWIN_CUDA): one
// item on its stream that runs the steps' host twin (ll_twin.cc, hostRun) when the stream reaches
// it. As the kernel does, it waits for its peers' words itself, bounded by the timeout and the
// host's release word, and reports a timeout through the host words, not to the caller.
#include <twin_cuda.h>

#include "core/result.h"
#include "device/kernel_grid.cuh"
#include "device/ll_ops.h"

namespace fusco {

namespace ll {

namespace {

const char kLl = 0;

// The kernel checks no liveness of its own: the host's watch releases it (release word).
fuscoResult_t noCheck(void*, int) { return fuscoSuccess; }

}  // namespace

fuscoResult_t deviceRun(const Args& a, uint32_t phases, void* stream) {
  twincuda::Launch l;
  l.kernel = &kLl;
  l.stream = static_cast<cudaStream_t>(stream);
  l.body = [a, phases] {
    HostWait w;
    w.check = noCheck;
    w.timeoutMs = static_cast<int64_t>(a.timeoutNs / 1000000);
    w.livenessMs = INT64_MAX / 2;
    hostRun(a, phases, w);  // a failed wait wrote the host words, as the kernel does
  };
  const cudaError_t e = twincuda::launch(std::move(l));
  return e == cudaSuccess ? fuscoSuccess
                          : FUSCO_CUDA_FAIL(e, kEngine, "launching the low-latency kernel");
}

}  // namespace ll

// Registered when the library loads, as nvcc's generated code does; loaded by the device init.
[[maybe_unused]] const bool kLlKernelsRegistered = [] {
  twincuda::registerKernel(&ll::kLl, "llKernel");
  return true;
}();

fuscoResult_t loadLlKernels(KernelLoader& l) { return l.load(&ll::kLl, 256, nullptr); }

}  // namespace fusco
