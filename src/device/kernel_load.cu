// The device init (kernel_load.h): every kernel loaded, its geometry cached, the stack limit set.
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>

#include "core/cuda_guard.h"
#include "device/device_share.h"
#include "device/kernel_grid.cuh"
#include "device/kernel_load.h"

namespace fusco {

namespace {

constexpr int kMaxDevices = 64;
// Multiprocessors of each device the kernels were loaded on (0: not loaded there). Written once
// per device under gLoadMu, before the kernels' geometry is read by any launch on that device.
std::atomic<int> gDeviceSms[kMaxDevices];
// Ranks sharing each device (deviceSetShare; 0 or 1: the device is this process's alone).
std::atomic<int> gDeviceShare[kMaxDevices];
// The smallest SM budget (fuscoConfig_t.maxSms) a communicator of the process set on each device
// (0: none set).
std::atomic<int> gDeviceBudget[kMaxDevices];
std::mutex gLoadMu;

fuscoResult_t loadAll(KernelLoader* l) {
  FUSCO_CHECK(loadCopyKernels(*l));
  FUSCO_CHECK(loadOpKernel(*l));
  FUSCO_CHECK(loadPlanKernels(*l));
  return loadLlKernels(*l);
}

// Raises the per-thread stack to the largest kernel's need, so that no launch reconfigures the
// device's memory (which would wait for it).
fuscoResult_t raiseStack(size_t need) {
  size_t cur = 0;
  FUSCO_CUDACHECK(cudaDeviceGetLimit(&cur, cudaLimitStackSize), kInit);
  if (need > cur) FUSCO_CUDACHECK(cudaDeviceSetLimit(cudaLimitStackSize, need), kInit);
  return fuscoSuccess;
}

}  // namespace

int64_t usableSms() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 0;
  const int sms = gDeviceSms[dev].load(std::memory_order_acquire);
  if (sms == 0) return 0;
  const int budget = gDeviceBudget[dev].load(std::memory_order_relaxed);
  return budgetSms(sms, gDeviceShare[dev].load(std::memory_order_relaxed),
                   budget > 0 ? budget : paramCudaSms());
}

void deviceSetBudget(int device, int sms) {
  if (device < 0 || device >= kMaxDevices || sms <= 0) return;
  int cur = gDeviceBudget[device].load(std::memory_order_relaxed);
  while ((cur == 0 || sms < cur) && !gDeviceBudget[device].compare_exchange_weak(cur, sms)) {
  }
}

void deviceSetShare(int device, int ranks) {
  if (device < 0 || device >= kMaxDevices) return;
  int cur = gDeviceShare[device].load(std::memory_order_relaxed);
  while (ranks > cur && !gDeviceShare[device].compare_exchange_weak(cur, ranks)) {
  }
}

bool deviceKernelsLoaded() { return usableSms() > 0; }

fuscoResult_t deviceLoadKernelsHere() {
  if (deviceKernelsLoaded()) return fuscoSuccess;
  int device = 0;
  FUSCO_CUDACHECK(cudaGetDevice(&device), kInit);
  return deviceLoadKernels(device);
}

fuscoResult_t deviceLoadKernels(int device) {
  if (device < 0 || device >= kMaxDevices)
    return FUSCO_FAIL(fuscoInvalidArgument, kInit, "CUDA device %d: at most %d devices", device,
                      kMaxDevices);
  if (gDeviceSms[device].load(std::memory_order_acquire) > 0) return fuscoSuccess;
  std::lock_guard<std::mutex> g(gLoadMu);
  if (gDeviceSms[device].load(std::memory_order_acquire) > 0) return fuscoSuccess;
  FUSCO_CHECK(cudaGuardSetup("loading the library's kernels (device init)"));
  FUSCO_CUDACHECK(cudaSetDevice(device), kInit);
  KernelLoader l;
  FUSCO_CHECK(loadAll(&l));
  FUSCO_CHECK(raiseStack(l.maxLocalBytes));
  int sms = 0;
  FUSCO_CUDACHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), kInit);
  gDeviceSms[device].store(sms > 0 ? sms : 1, std::memory_order_release);
  FUSCO_INFO(kInit, "device %d: kernels loaded, %d multiprocessors, stack %zu bytes per thread",
             device, sms, l.maxLocalBytes);
  return fuscoSuccess;
}

}  // namespace fusco
