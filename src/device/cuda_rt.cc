#include "device/cuda_rt.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/bootstrap.h"
#include "core/clock.h"
#include "core/cuda_guard.h"
#include "core/log.h"
#include "core/params.h"
#include "core/result.h"
#include "device/device_ops.h"
#include "device/device_plan_ops.h"
#include "device/kernel_load.h"

#ifdef FUSCO_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#endif

namespace fusco {

FUSCO_PARAM_INT(
    CudaSms, "FUSCO_CUDA_SMS", 0, 0, INT32_MAX,
    "CUDA path: multiprocessors the kernels may use (0: all, or the rank's part of a GPU that "
    "several ranks share), like DeepEP's num_sms");

#ifdef FUSCO_HAVE_CUDA

namespace {

// Driver entry points, through the runtime (the library never links libcuda itself).
template <typename Fn>
Fn driverFn(const char* name) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<Fn>(f);
}

using RangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

}  // namespace

bool cudaBuilt() { return true; }

fuscoResult_t cudaUseDevice(int requested, int* device) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return FUSCO_FAIL(fuscoUnhandledCudaError, kInit, "no usable CUDA device: %s (%s)",
                      cudaGetErrorName(e), cudaGetErrorString(e));
  }
  if (n == 0) return FUSCO_FAIL(fuscoUnhandledCudaError, kInit, "no CUDA device is present");
  int dev = requested;
  if (dev < 0) FUSCO_CUDACHECK(cudaGetDevice(&dev), kInit);
  if (dev >= n)
    return FUSCO_FAIL(fuscoInvalidArgument, kInit,
                      "config.cudaDevice %d: only %d CUDA device(s) present", dev, n);
  FUSCO_CUDACHECK(cudaSetDevice(dev), kInit);
  *device = dev;
  return fuscoSuccess;
}

fuscoResult_t cudaDeviceIdentity(int device, std::string* uuid) {
  cudaDeviceProp prop;
  FUSCO_CUDACHECK(cudaGetDeviceProperties(&prop, device), kInit);
  static const char kHex[] = "0123456789abcdef";
  uuid->clear();
  for (int i = 0; i < 16; ++i) {
    const unsigned char b = static_cast<unsigned char>(prop.uuid.bytes[i]);
    uuid->push_back(kHex[b >> 4]);
    uuid->push_back(kHex[b & 15]);
  }
  return fuscoSuccess;
}

fuscoResult_t cudaSetCurrent(int device) {
  int cur = -1;
  if (cudaGetDevice(&cur) == cudaSuccess && cur == device) return fuscoSuccess;
  FUSCO_CUDACHECK(cudaSetDevice(device), kEngine);
  return fuscoSuccess;
}

bool cudaIsDevicePointer(const void* p) {
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

fuscoResult_t cudaAllocationRange(const void* p, void** base, size_t* bytes) {
  static RangeFn fn = driverFn<RangeFn>("cuMemGetAddressRange");
  if (fn == nullptr)
    return FUSCO_FAIL(fuscoUnhandledCudaError, kEngine, "cuMemGetAddressRange is unavailable");
  CUdeviceptr b = 0;
  size_t n = 0;
  if (fn(&b, &n, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS)
    return FUSCO_FAIL(fuscoInvalidArgument, kEngine, "%p is not in a CUDA allocation", p);
  *base = reinterpret_cast<void*>(b);
  *bytes = n;
  return fuscoSuccess;
}

fuscoResult_t cudaAllocDevice(size_t bytes, void** ptr) {
  FUSCO_CHECK(cudaGuardSetup("cudaMalloc"));
  FUSCO_CUDACHECK(cudaMalloc(ptr, bytes), kEngine);
  return fuscoSuccess;
}

fuscoResult_t cudaFreeDevice(void* ptr) {
  FUSCO_CHECK(cudaGuardSetup("cudaFree"));
  FUSCO_CUDACHECK(cudaFree(ptr), kEngine);
  return fuscoSuccess;
}

fuscoResult_t cudaCopyToHostSync(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return fuscoSuccess;
  // Planning on a caller's thread: earlier operations' waits drain first (a setup window).
  CudaSetupWindow w;
  FUSCO_CHECK(w.open(paramTimeoutMs(), "a synchronous copy to the host (planning)"));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  FUSCO_CUDACHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s), kEngine);
  FUSCO_CUDACHECK(cudaStreamSynchronize(s), kEngine);
  return fuscoSuccess;
}

fuscoResult_t cudaCopyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return fuscoSuccess;
  FUSCO_CUDACHECK(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
      kEngine);
  return fuscoSuccess;
}

fuscoResult_t cudaCopySync(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return fuscoSuccess;
  FUSCO_CHECK(cudaGuardSetup("cudaMemcpy"));
  FUSCO_CUDACHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), kEngine);
  return fuscoSuccess;
}

fuscoResult_t cudaZeroSync(void* ptr, size_t bytes) {
  if (bytes == 0) return fuscoSuccess;
  FUSCO_CHECK(cudaGuardSetup("cudaMemset + cudaDeviceSynchronize"));
  FUSCO_CUDACHECK(cudaMemset(ptr, 0, bytes), kEngine);
  FUSCO_CUDACHECK(cudaDeviceSynchronize(), kEngine);
  return fuscoSuccess;
}

void cudaDeviceSyncQuiet() {
  if (cudaGuardSetup("cudaDeviceSynchronize") != fuscoSuccess) return;
  cudaDeviceSynchronize();
  cudaGetLastError();
}

CudaRelaxedCapture::CudaRelaxedCapture() {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  mode_ = static_cast<int>(mode);
}

CudaRelaxedCapture::~CudaRelaxedCapture() {
  cudaStreamCaptureMode mode = static_cast<cudaStreamCaptureMode>(mode_);
  cudaThreadExchangeStreamCaptureMode(&mode);
}

fuscoResult_t cudaAllocMapped(size_t bytes, void** host, void** dev) {
  *host = *dev = nullptr;
  FUSCO_CHECK(cudaGuardSetup("cudaHostAlloc"));
  CudaRelaxedCapture relaxed;
  FUSCO_CUDACHECK(cudaHostAlloc(host, bytes, cudaHostAllocMapped | cudaHostAllocPortable), kEngine);
  cudaError_t e = cudaHostGetDevicePointer(dev, *host, 0);
  if (e != cudaSuccess) {
    cudaFreeHost(*host);
    *host = nullptr;
    return FUSCO_CUDA_FAIL(e, kEngine, "mapping pinned host memory for the device");
  }
  return fuscoSuccess;
}

void cudaFreeMapped(void* host) {
  if (host == nullptr) return;
  if (cudaGuardSetup("cudaFreeHost") != fuscoSuccess) return;  // kept rather than a deadlock
  CudaRelaxedCapture relaxed;
  cudaFreeHost(host);
  cudaGetLastError();
}

fuscoResult_t cudaStreamCapturing(void* stream, bool* capturing) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  FUSCO_CUDACHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &st), kEngine);
  *capturing = st != cudaStreamCaptureStatusNone;
  return fuscoSuccess;
}

void cudaRelaxCaptureOnThisThread() {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
}

namespace {

// Waits on the host until `event` completed, polling, so the wait ends within timeoutMs (a stream
// stalled by a dead peer is released by its communicator within that time).
fuscoResult_t waitEventWithin(void* event, int64_t timeoutMs, const char* what,
                              const std::function<fuscoResult_t()>& alive = nullptr,
                              int64_t aliveEveryMs = 0) {
  const Deadline deadline(timeoutMs);
  int64_t lastAlive = nowNs();
  for (;;) {
    const cudaError_t q = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (q == cudaSuccess) return fuscoSuccess;
    if (q != cudaErrorNotReady) return FUSCO_CUDA_FAIL(q, kEngine, what);
    cudaGetLastError();
    if (alive && nowNs() - lastAlive >= aliveEveryMs * 1000000LL) {
      FUSCO_CHECK(alive());
      lastAlive = nowNs();
    }
    if (deadline.expired())
      return FUSCO_FAIL(fuscoTimeout, kEngine, "%s did not complete within the timeout (%lld ms)",
                        what, static_cast<long long>(timeoutMs));
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace

DeviceBuffer::~DeviceBuffer() {
  for (void* e : useEvents_) {
    cudaEventSynchronize(static_cast<cudaEvent_t>(e));
    cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  for (void* e : events_) {
    if (e == nullptr) continue;
    cudaEventSynchronize(static_cast<cudaEvent_t>(e));
    cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  if (dev_) cudaFree(dev_);
  if (host_) cudaFreeHost(host_);
  cudaGetLastError();
}

fuscoResult_t DeviceBuffer::reserve(size_t bytes, int64_t timeoutMs) {
  if (bytes > cap_) return grow(bytes, timeoutMs);
  half_ = (half_ + 1) % halves_;
  if (events_[half_])
    FUSCO_CHECK(waitEventWithin(events_[half_], timeoutMs, "the last upload from this host side"));
  return fuscoSuccess;
}

// Growing frees and allocates: on the caller's thread (planning), in a setup window.
fuscoResult_t DeviceBuffer::grow(size_t bytes, int64_t timeoutMs) {
  for (void* e : events_)
    if (e != nullptr) FUSCO_CHECK(waitEventWithin(e, timeoutMs, "the previous upload"));
  CudaSetupWindow w;
  FUSCO_CHECK(w.open(timeoutMs, "growing a device buffer (planning)"));
  // The old device memory is freed: every enqueued reader must be done with it.
  for (size_t i = 0; i < uses_; ++i)
    FUSCO_CHECK(waitEventWithin(useEvents_[i], timeoutMs, "enqueued work reading the old lists"));
  uses_ = 0;
  size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 2;
  if (dev_) FUSCO_CUDACHECK(cudaFree(dev_), kEngine);
  if (host_) FUSCO_CUDACHECK(cudaFreeHost(host_), kEngine);
  dev_ = host_ = nullptr;
  cap_ = 0;
  half_ = 0;
  FUSCO_CUDACHECK(cudaMalloc(reinterpret_cast<void**>(&dev_), cap), kEngine);
  FUSCO_CUDACHECK(cudaMallocHost(reinterpret_cast<void**>(&host_), cap * halves_), kEngine);
  cap_ = cap;
  return fuscoSuccess;
}

// Stream-ordered: the upload on `stream` starts after every recorded use of the old contents.
fuscoResult_t DeviceBuffer::waitUsesOn(void* stream) {
  for (size_t i = 0; i < uses_; ++i)
    FUSCO_CUDACHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                        static_cast<cudaEvent_t>(useEvents_[i]), 0),
                    kEngine);
  uses_ = 0;
  return fuscoSuccess;
}

fuscoResult_t DeviceBuffer::upload(size_t bytes, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  FUSCO_CHECK(waitUsesOn(stream));
  if (bytes > 0)
    FUSCO_CUDACHECK(cudaMemcpyAsync(dev_, host(), bytes, cudaMemcpyHostToDevice, s), kEngine);
  void*& event = events_[half_];
  if (event == nullptr) {
    cudaEvent_t e;
    FUSCO_CUDACHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), kEngine);
    event = e;
  }
  FUSCO_CUDACHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), s), kEngine);
  return fuscoSuccess;
}

fuscoResult_t DeviceBuffer::markUsed(void* stream) {
  bool capturing = false;
  FUSCO_CHECK(cudaStreamCapturing(stream, &capturing));
  if (capturing) return fuscoSuccess;
  // One event per stream: a later use on the same stream follows the earlier one there.
  size_t i = 0;
  while (i < uses_ && useStreams_[i] != stream) ++i;
  if (i == uses_) {
    if (uses_ == useEvents_.size()) {
      cudaEvent_t e;
      FUSCO_CUDACHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), kEngine);
      useEvents_.push_back(e);
      useStreams_.push_back(nullptr);
    }
    useStreams_[uses_++] = stream;
  }
  FUSCO_CUDACHECK(
      cudaEventRecord(static_cast<cudaEvent_t>(useEvents_[i]), static_cast<cudaStream_t>(stream)),
      kEngine);
  return fuscoSuccess;
}

fuscoResult_t DeviceBuffer::waitUploaded(void* stream) {
  void* event = events_[half_];  // the last upload is from the current half
  bool capturing = false;
  if (event) FUSCO_CHECK(cudaStreamCapturing(stream, &capturing));
  if (capturing) {
    // A graph cannot wait on work recorded outside it: the upload must be complete already.
    CudaRelaxedCapture relaxed;  // a query is not a legal call on a capturing thread otherwise
    cudaError_t q = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (q == cudaSuccess) return fuscoSuccess;
    cudaGetLastError();
    return FUSCO_FAIL(fuscoInvalidUsage, kEngine,
                      "the plan's index lists are still being uploaded: synchronize the plan's "
                      "stream before capturing a call that uses it");
  }
  if (event)
    FUSCO_CUDACHECK(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
        kEngine);
  return fuscoSuccess;
}

StreamEvent::~StreamEvent() {
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

fuscoResult_t StreamEvent::record(void* stream) {
  if (event_ == nullptr) {
    cudaEvent_t e;
    FUSCO_CUDACHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), kEngine);
    event_ = e;
  }
  FUSCO_CUDACHECK(
      cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream)),
      kEngine);
  recorded_ = true;
  return fuscoSuccess;
}

fuscoResult_t StreamEvent::query(bool* done) const {
  *done = true;
  if (!recorded_) return fuscoSuccess;
  cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    *done = false;
    return fuscoSuccess;
  }
  if (e != cudaSuccess) return FUSCO_CUDA_FAIL(e, kEngine, "cudaEventQuery");
  return fuscoSuccess;
}

fuscoResult_t StreamEvent::waitWithin(int64_t timeoutMs, const char* what,
                                      const std::function<fuscoResult_t()>& alive,
                                      int64_t aliveEveryMs) const {
  return recorded_ ? waitEventWithin(event_, timeoutMs, what, alive, aliveEveryMs) : fuscoSuccess;
}

fuscoResult_t StreamEvent::waitOn(void* stream) const {
  if (recorded_)
    FUSCO_CUDACHECK(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event_), 0),
        kEngine);
  return fuscoSuccess;
}

#else  // no CUDA toolkit in this build

namespace {
fuscoResult_t notBuilt() {
  return FUSCO_FAIL(fuscoInvalidUsage, kInit,
                    "this build of fusco has no CUDA path (configure with the CUDA toolkit)");
}
}  // namespace

bool cudaBuilt() { return false; }
fuscoResult_t cudaUseDevice(int, int*) { return notBuilt(); }
fuscoResult_t cudaDeviceIdentity(int, std::string*) { return notBuilt(); }
fuscoResult_t cudaSetCurrent(int) { return notBuilt(); }
bool cudaIsDevicePointer(const void*) { return false; }
fuscoResult_t cudaCopyToHostSync(void*, const void*, size_t, void*) { return notBuilt(); }
fuscoResult_t cudaCopyAsync(void*, const void*, size_t, void*) { return notBuilt(); }
fuscoResult_t cudaCopySync(void*, const void*, size_t) { return notBuilt(); }
fuscoResult_t cudaZeroSync(void*, size_t) { return notBuilt(); }
fuscoResult_t cudaAllocationRange(const void*, void**, size_t*) { return notBuilt(); }
fuscoResult_t cudaAllocDevice(size_t, void**) { return notBuilt(); }
fuscoResult_t cudaFreeDevice(void*) { return notBuilt(); }
void cudaDeviceSyncQuiet() {}
fuscoResult_t cudaAllocMapped(size_t, void** host, void** dev) {
  *host = *dev = nullptr;
  return notBuilt();
}
void cudaFreeMapped(void*) {}
fuscoResult_t cudaStreamCapturing(void*, bool* capturing) {
  *capturing = false;
  return notBuilt();
}
void cudaRelaxCaptureOnThisThread() {}
CudaRelaxedCapture::CudaRelaxedCapture() : mode_(0) {}
CudaRelaxedCapture::~CudaRelaxedCapture() = default;
StreamEvent::~StreamEvent() = default;
fuscoResult_t StreamEvent::record(void*) { return notBuilt(); }
fuscoResult_t StreamEvent::query(bool* done) const {
  *done = true;
  return fuscoSuccess;
}
fuscoResult_t StreamEvent::waitWithin(int64_t, const char*, const std::function<fuscoResult_t()>&,
                                      int64_t) const {
  return fuscoSuccess;
}
fuscoResult_t StreamEvent::waitOn(void*) const { return notBuilt(); }
DeviceBuffer::~DeviceBuffer() = default;
fuscoResult_t DeviceBuffer::reserve(size_t, int64_t) { return notBuilt(); }
fuscoResult_t DeviceBuffer::upload(size_t, void*) { return notBuilt(); }
fuscoResult_t DeviceBuffer::waitUploaded(void*) { return notBuilt(); }
fuscoResult_t DeviceBuffer::markUsed(void*) { return notBuilt(); }
fuscoResult_t DeviceBuffer::waitUsesOn(void*) { return notBuilt(); }
fuscoResult_t DeviceBuffer::grow(size_t, int64_t) { return notBuilt(); }
fuscoResult_t deviceCopy(const std::vector<DevCopyTask>&, void*) { return notBuilt(); }
size_t deviceCopyBatchBytes() { return 0; }
size_t deviceCopyBatchSlots(size_t) { return 0; }
fuscoResult_t deviceFillCopyBatches(const std::vector<DevCopyTask>&, void*, size_t) {
  return notBuilt();
}
fuscoResult_t deviceLaunchOp(char*, uint32_t, uint32_t, void*) { return notBuilt(); }
fuscoResult_t deviceFinalSum(fuscoDataType_t, size_t, const DevFinalSum&, void*) {
  return notBuilt();
}
fuscoResult_t deviceZeroRowRanges(void*, size_t, const int64_t*, size_t, int64_t, void*) {
  return notBuilt();
}
fuscoResult_t devicePlanSend(const gplan::SendArgs&, void*) { return notBuilt(); }
fuscoResult_t devicePlanTermRows(const gplan::SendArgs&, const int64_t*, void*) {
  return notBuilt();
}
fuscoResult_t devicePlanRecv(const gplan::RecvArgs&, void*) { return notBuilt(); }
fuscoResult_t devicePlanLayout(const gplan::RecvArgs&, void*) { return notBuilt(); }
fuscoResult_t devicePlanFan(const gplan::FanArgs&, const gplan::SendArgs&, void*) {
  return notBuilt();
}
fuscoResult_t deviceLoadKernels(int) { return notBuilt(); }
bool deviceKernelsLoaded() { return false; }
void deviceSetShare(int, int) {}
void deviceSetBudget(int, int) {}

#endif

}  // namespace fusco
