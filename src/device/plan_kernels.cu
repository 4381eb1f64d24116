// The GPU planner's kernels (device_plan_ops.h): each step of plan_steps.h is one grid-stride
// launch with one thread per item, and each segmented scan one block per segment, tile after tile
// (cub::BlockScan), so every list is in the same deterministic order as the host planner's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cub/block/block_scan.cuh>

#include "core/cuda_check.h"
#include "core/result.h"
#include "device/device_plan_ops.h"
#include "device/kernel_grid.cuh"
#include "device/kernel_load.h"

namespace fusco {

namespace {

constexpr int kStepThreads = 256;
constexpr int kScanThreads = 256;
constexpr int kScanItems = 4;

template <typename F>
__global__ void __launch_bounds__(kStepThreads)
    forEachKernel(const F f, uint64_t n, const uint32_t* dynCount) {
  if (dynCount != nullptr) n = min(n, static_cast<uint64_t>(*dynCount));
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    f(i);
}

__global__ void __launch_bounds__(kScanThreads)
    scanKernel(uint32_t* data, uint64_t segLen, uint32_t* totals) {
  using BlockScan = cub::BlockScan<uint32_t, kScanThreads>;
  __shared__ typename BlockScan::TempStorage tmp;
  __shared__ uint32_t carry;
  uint32_t* seg = data + blockIdx.x * segLen;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  constexpr uint64_t kTile = kScanThreads * kScanItems;
  for (uint64_t base = 0; base < segLen; base += kTile) {
    uint32_t v[kScanItems];
    const uint64_t first = base + threadIdx.x * kScanItems;
#pragma unroll
    for (int i = 0; i < kScanItems; ++i) v[i] = first + i < segLen ? seg[first + i] : 0;
    uint32_t tile = 0;
    BlockScan(tmp).ExclusiveSum(v, v, tile);
    const uint32_t c = carry;
#pragma unroll
    for (int i = 0; i < kScanItems; ++i)
      if (first + i < segLen) seg[first + i] = v[i] + c;
    __syncthreads();  // every thread read carry and tmp before they change
    if (threadIdx.x == 0) carry = c + tile;
    __syncthreads();
  }
  if (threadIdx.x == 0) totals[blockIdx.x] = carry;
}

// Runs the steps on one stream; the first failure sticks and later steps are skipped.
KernelGeometry gPlanStep{"a GPU planner step"};

class DeviceExec {
 public:
  explicit DeviceExec(void* stream) : s_(static_cast<cudaStream_t>(stream)) {
    result_ = checkLoaded(gPlanStep);
  }
  template <typename F>
  void forEach(uint64_t n, const uint32_t* dynCount, const F& f) {
    if (n == 0 || result_ != fuscoSuccess) return;
    // Grid-stride over the items, at most a full wave of the multiprocessors FUSCO_CUDA_SMS
    // allows (kernel_grid.cuh), like every other kernel of the library.
    const unsigned blocks = gridFor((n + kStepThreads - 1) / kStepThreads, 2048 / kStepThreads);
    forEachKernel<<<blocks, kStepThreads, 0, s_>>>(f, n, dynCount);
    check("a GPU planner step");
  }
  void scan(uint32_t* data, uint64_t nseg, uint64_t segLen, uint32_t* totals) {
    if (nseg == 0 || result_ != fuscoSuccess) return;
    scanKernel<<<static_cast<unsigned>(nseg), kScanThreads, 0, s_>>>(data, segLen, totals);
    check("a GPU planner scan");
  }
  void zero(void* p, size_t bytes) {
    if (bytes == 0 || result_ != fuscoSuccess) return;
    cudaError_t e = cudaMemsetAsync(p, 0, bytes, s_);
    if (e != cudaSuccess) result_ = FUSCO_CUDA_FAIL(e, kPlan, "cudaMemsetAsync (GPU planner)");
  }
  fuscoResult_t result() const { return result_; }

 private:
  void check(const char* what) { result_ = launchResult(what, kPlan); }
  cudaStream_t s_;
  fuscoResult_t result_ = fuscoSuccess;
};

// The device init's pass over the same pipelines: every step's kernel is loaded, none launched.
class LoadExec {
 public:
  explicit LoadExec(KernelLoader& l) : l_(l) {}
  template <typename F>
  void forEach(uint64_t, const uint32_t*, const F&) {
    if (result_ == fuscoSuccess) result_ = l_.load(forEachKernel<F>, kStepThreads, nullptr);
  }
  void scan(uint32_t*, uint64_t, uint64_t, uint32_t*) {
    if (result_ == fuscoSuccess) result_ = l_.load(scanKernel, kScanThreads, nullptr);
  }
  void zero(void*, size_t) {}
  fuscoResult_t result() const { return result_; }

 private:
  KernelLoader& l_;
  fuscoResult_t result_ = fuscoSuccess;
};

}  // namespace

fuscoResult_t loadPlanKernels(KernelLoader& l) {
  LoadExec x(l);
  const gplan::SendArgs send{};
  const gplan::RecvArgs recv{};
  const gplan::FanArgs fan{};
  gplan::planSendSteps(x, send);
  gplan::planTermRowSteps(x, send, nullptr);
  gplan::planRecvSteps(x, recv);
  gplan::planLayoutSteps(x, recv);
  gplan::planFanSteps(x, fan, send);
  FUSCO_CHECK(x.result());
  // The steps' grids are fixed (2048 threads per multiprocessor); the geometry marks them loaded.
  return l.load(forEachKernel<gplan::ResetBadSlot>, kStepThreads, &gPlanStep);
}

// The planner also runs without a communicator (a caller of the steps alone): its first use on a
// device then loads every kernel (deviceLoadKernelsHere), as a communicator's init would. Loading
// may wait for the device, so it is refused by the guard while an operation of the process waits.

fuscoResult_t devicePlanSend(const gplan::SendArgs& a, void* stream) {
  FUSCO_CHECK(deviceLoadKernelsHere());
  DeviceExec x(stream);
  gplan::planSendSteps(x, a);
  return x.result();
}

fuscoResult_t devicePlanTermRows(const gplan::SendArgs& a, const int64_t* remoteFan, void* stream) {
  FUSCO_CHECK(deviceLoadKernelsHere());
  DeviceExec x(stream);
  gplan::planTermRowSteps(x, a, remoteFan);
  return x.result();
}

fuscoResult_t devicePlanRecv(const gplan::RecvArgs& a, void* stream) {
  FUSCO_CHECK(deviceLoadKernelsHere());
  DeviceExec x(stream);
  gplan::planRecvSteps(x, a);
  return x.result();
}

fuscoResult_t devicePlanLayout(const gplan::RecvArgs& a, void* stream) {
  FUSCO_CHECK(deviceLoadKernelsHere());
  DeviceExec x(stream);
  gplan::planLayoutSteps(x, a);
  return x.result();
}

fuscoResult_t devicePlanFan(const gplan::FanArgs& f, const gplan::SendArgs& a, void* stream) {
  FUSCO_CHECK(deviceLoadKernelsHere());
  DeviceExec x(stream);
  gplan::planFanSteps(x, f, a);
  return x.result();
}

}  // namespace fusco
