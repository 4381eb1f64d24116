// The [gpu] suites' spin kernel (gpu_kernels.h) on the twin CUDA runtime: an item that holds its
// stream for the given time.
#include <twin_cuda.h>

#include <chrono>
#include <thread>

#include "gpu/gpu_kernels.h"

namespace fusco::test::gpu {

namespace {
const char kSpin = 0;
}  // namespace

cudaError_t spinAsync(cudaStream_t stream, double seconds) {
  static const cudaError_t loaded = [] {
    twincuda::registerKernel(&kSpin, "spinKernel");
    cudaFuncAttributes attr;
    return cudaFuncGetAttributes(&attr, &kSpin);  // its first launch would load it, as on a GPU
  }();
  if (loaded != cudaSuccess) return loaded;
  twincuda::Launch l;
  l.kernel = &kSpin;
  l.stream = stream;
  l.body = [seconds] { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); };
  return twincuda::launch(std::move(l));
}

}  // namespace fusco::test::gpu
