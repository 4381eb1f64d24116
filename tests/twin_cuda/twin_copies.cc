// Copies and memsets (CUDA runtime API, "Memory Management" and "API synchronization behavior").
//
// The asynchronous calls are stream items and return once enqueued. Their one documented host
// side effect is kept: a copy from pageable host memory returns "once the pageable buffer has
// been copied to the staging memory", so the twin takes the source bytes at the call. The
// synchronous calls may wait for the device ("exhibits synchronous behavior for most use cases"):
// the twin takes the worst case the documentation allows and waits for every stream (T4) before
// it does the work on the caller's thread.
#include <cstring>

#include "twin_internal.h"

namespace twincuda {
namespace detail {
namespace {

bool validKind(cudaMemcpyKind k) {
  return k == cudaMemcpyHostToHost || k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToHost ||
         k == cudaMemcpyDeviceToDevice || k == cudaMemcpyDefault;
}

// The two accesses of a copy: the device side of a directed copy must be device-accessible.
std::vector<Access> copyAccesses(void* dst, const void* src, size_t n, cudaMemcpyKind k) {
  const bool dstDev = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
  const bool srcDev = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
  return {Access{src, n, false, srcDev}, Access{dst, n, true, dstDev}};
}

const char* kindName(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost:
      return "HostToHost";
    case cudaMemcpyHostToDevice:
      return "HostToDevice";
    case cudaMemcpyDeviceToHost:
      return "DeviceToHost";
    case cudaMemcpyDeviceToDevice:
      return "DeviceToDevice";
    default:
      return "Default";
  }
}

std::string copyName(const char* call, void* dst, const void* src, size_t n, cudaMemcpyKind k) {
  return std::string(call) + "(" + fmtPtr(dst) + " <- " + fmtPtr(src) + ", " + std::to_string(n) +
         " bytes, " + kindName(k) + ")";
}

// Runs on the caller's thread once the device is idle.
cudaError_t runNow(const std::vector<Access>& a, const std::string& what,
                   const std::function<void()>& fn) {
  auto hold = holdMappings();
  if (!checkAccesses(a, what)) return fail(cudaErrorIllegalAddress);
  fn();
  return cudaSuccess;
}

}  // namespace
}  // namespace detail
}  // namespace twincuda

using namespace twincuda::detail;

extern "C" {

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  TWIN_ENTER();
  if (!validKind(kind)) return fail(cudaErrorInvalidValue);
  if (count == 0) return cudaSuccess;
  cudaError_t e = captureGuard("cudaMemcpy");
  if (e == cudaSuccess) e = waitIdle("cudaMemcpy");
  if (e != cudaSuccess) return e;
  return runNow(copyAccesses(dst, src, count, kind), copyName("cudaMemcpy", dst, src, count, kind),
                [=] { std::memmove(dst, src, count); });
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  TWIN_ENTER();
  if (!validKind(kind)) return fail(cudaErrorInvalidValue);
  Stream* s = findStream(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  auto it = std::make_shared<Item>();
  it->desc = copyName("cudaMemcpyAsync", dst, src, count, kind);
  it->work = true;
  it->accesses = copyAccesses(dst, src, count, kind);
  const bool pageableSrc = kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDeviceToDevice &&
                           !isDeviceAccessible(src, count);
  if (pageableSrc) {
    // Staged at the call, as the runtime stages pageable memory (an access to memory taken away
    // from a dead peer is still refused: it is checked here, not only when the item runs).
    std::vector<Access> a{Access{src, count, false, false}};
    {
      auto hold = holdMappings();
      if (!checkAccesses(a, it->desc)) return fail(cudaErrorIllegalAddress);
    }
    auto staged = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + count);
    it->accesses.erase(it->accesses.begin());
    it->run = [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); };
  } else {
    it->run = [dst, src, count] { std::memmove(dst, src, count); };
  }
  return fail(submit(s, std::move(it)));
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  TWIN_ENTER();
  if (count == 0) return cudaSuccess;
  cudaError_t e = captureGuard("cudaMemset");
  if (e == cudaSuccess) e = waitIdle("cudaMemset");
  if (e != cudaSuccess) return e;
  return runNow({Access{devPtr, count, true, true}},
                "cudaMemset(" + fmtPtr(devPtr) + ", " + std::to_string(count) + " bytes)",
                [=] { std::memset(devPtr, value, count); });
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  TWIN_ENTER();
  Stream* s = findStream(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  auto it = std::make_shared<Item>();
  it->desc = "cudaMemsetAsync(" + fmtPtr(devPtr) + ", " + std::to_string(count) + " bytes)";
  it->work = true;
  it->accesses = {Access{devPtr, count, true, true}};
  it->run = [=] { std::memset(devPtr, value, count); };
  return fail(submit(s, std::move(it)));
}

}  // extern "C"
