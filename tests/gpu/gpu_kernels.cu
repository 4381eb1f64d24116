#include "gpu/gpu_kernels.h"

namespace fusco::test::gpu {

namespace {

__device__ unsigned long long globalTimerNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spinKernel(unsigned long long ns) {
  const unsigned long long start = globalTimerNs();
  while (globalTimerNs() - start < ns) __nanosleep(20000);
}

}  // namespace

cudaError_t spinAsync(cudaStream_t stream, double seconds) {
  spinKernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(seconds * 1e9));
  return cudaGetLastError();
}

}  // namespace fusco::test::gpu
