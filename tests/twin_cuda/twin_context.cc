// The twin's context: knobs, messages, the last and the sticky error, error names, and the one
// device it shows (device management in the CUDA runtime API reference).
#include <time.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "twin_internal.h"

namespace twincuda {
namespace detail {

int64_t knob(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  return end != v ? static_cast<int64_t>(x) : fallback;
}

int64_t nowNs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000LL + t.tv_nsec;
}

void report(const char* fmt, ...) {
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  // One write per line, so lines of several threads and processes do not interleave.
  std::string s = "twin-cuda: ";
  s += line;
  s += '\n';
  fwrite(s.data(), 1, s.size(), stderr);
  fflush(stderr);
}

std::string fmtPtr(const void* p) {
  char b[32];
  snprintf(b, sizeof b, "%p", p);
  return b;
}

namespace {
std::atomic<int> gSticky{cudaSuccess};
thread_local cudaError_t tLast = cudaSuccess;
}  // namespace

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) tLast = e;
  return e;
}

cudaError_t stickyError() { return static_cast<cudaError_t>(gSticky.load()); }

void setSticky(cudaError_t e) {
  int none = cudaSuccess;
  gSticky.compare_exchange_strong(none, e);
}

// The twin's one device, unless CUDA_VISIBLE_DEVICES hides it: the programming guide's
// environment variables ("CUDA_VISIBLE_DEVICES"): the devices listed are visible, enumeration
// stops at the first invalid index, and an empty list or -1 leaves none (every call then fails
// with cudaErrorNoDevice, as the runtime does when it finds no device).
int visibleDevices() {
  static const int n = [] {
    const char* v = getenv("CUDA_VISIBLE_DEVICES");
    if (v == nullptr) return 1;
    while (*v == ' ') ++v;
    return (v[0] == '0' && (v[1] == '\0' || v[1] == ',')) ? 1 : 0;
  }();
  return n;
}

cudaError_t enter() {
  if (visibleDevices() == 0) return fail(cudaErrorNoDevice);
  // "Sticky" errors (CUDA runtime API, cudaGetLastError; programming guide, error checking): a
  // fault leaves the context unusable, and every later call of the process returns the error.
  const cudaError_t s = stickyError();
  return s == cudaSuccess ? s : fail(s);
}

}  // namespace detail
}  // namespace twincuda

using namespace twincuda::detail;

namespace {

struct ErrorName {
  cudaError_t e;
  const char* name;
  const char* text;
};

#define TWIN_ERR(n, t) \
  { n, #n, t }
const ErrorName kErrors[] = {
    TWIN_ERR(cudaSuccess, "no error"),
    TWIN_ERR(cudaErrorInvalidValue, "invalid argument"),
    TWIN_ERR(cudaErrorMemoryAllocation, "out of memory"),
    TWIN_ERR(cudaErrorInitializationError, "initialization error"),
    TWIN_ERR(cudaErrorInvalidDevice, "invalid device ordinal"),
    TWIN_ERR(cudaErrorInvalidDeviceFunction, "invalid device function"),
    TWIN_ERR(cudaErrorNoDevice, "no CUDA-capable device is detected"),
    TWIN_ERR(cudaErrorMapBufferObjectFailed, "mapping of buffer object failed"),
    TWIN_ERR(cudaErrorOperatingSystem, "OS call failed or operation not supported on this OS"),
    TWIN_ERR(cudaErrorInvalidResourceHandle, "invalid resource handle"),
    TWIN_ERR(cudaErrorIllegalState, "the operation cannot be performed in the present state"),
    TWIN_ERR(cudaErrorSymbolNotFound, "named symbol not found"),
    TWIN_ERR(cudaErrorNotReady, "device not ready"),
    TWIN_ERR(cudaErrorIllegalAddress, "an illegal memory access was encountered"),
    TWIN_ERR(cudaErrorHostMemoryAlreadyRegistered,
             "part or all of the requested memory range is already mapped"),
    TWIN_ERR(cudaErrorHostMemoryNotRegistered,
             "pointer does not correspond to a registered memory region"),
    TWIN_ERR(cudaErrorLaunchFailure, "unspecified launch failure"),
    TWIN_ERR(cudaErrorCooperativeLaunchTooLarge, "too many blocks in cooperative launch"),
    TWIN_ERR(cudaErrorNotPermitted, "operation not permitted"),
    TWIN_ERR(cudaErrorNotSupported, "operation not supported"),
    TWIN_ERR(cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing"),
    TWIN_ERR(cudaErrorStreamCaptureInvalidated,
             "operation failed due to a previous error during capture"),
    TWIN_ERR(cudaErrorStreamCaptureUnmatched, "capture was not initiated in this stream"),
    TWIN_ERR(cudaErrorStreamCaptureUnjoined, "capturing stream has unjoined work"),
    TWIN_ERR(cudaErrorStreamCaptureIsolation,
             "dependency created on uncaptured work in another stream"),
    TWIN_ERR(cudaErrorStreamCaptureImplicit,
             "operation would make the legacy stream depend on a capturing blocking stream"),
    TWIN_ERR(cudaErrorStreamCaptureWrongThread,
             "attempt to terminate a thread-local capture sequence from another thread"),
    TWIN_ERR(cudaErrorTimeout, "wait operation timed out"),
    TWIN_ERR(cudaErrorUnknown, "unknown error"),
};
#undef TWIN_ERR

const ErrorName* findError(cudaError_t e) {
  for (const ErrorName& n : kErrors)
    if (n.e == e) return &n;
  return nullptr;
}

struct Limits {
  size_t stack = 1024;
  size_t printfFifo = 1 << 20;
  size_t heap = 8 << 20;
};
Limits gLimits;
std::mutex gLimitsMu;
thread_local int tDevice = 0;

}  // namespace

extern "C" {

const char* cudaGetErrorName(cudaError_t error) {
  const ErrorName* n = findError(error);
  return n ? n->name : "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  const ErrorName* n = findError(error);
  return n ? n->text : "unrecognized error code";
}

cudaError_t cudaGetLastError(void) {
  // Resets the thread's error, except a sticky one (CUDA runtime API, cudaGetLastError).
  const cudaError_t s = stickyError();
  if (s != cudaSuccess) return s;
  const cudaError_t e = std::exchange(tLast, cudaSuccess);
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  const cudaError_t s = stickyError();
  return s != cudaSuccess ? s : tLast;
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = visibleDevices();
  return *count > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
  TWIN_ENTER();
  if (device != 0) return fail(cudaErrorInvalidDevice);
  tDevice = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  TWIN_ENTER();
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = tDevice;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  TWIN_ENTER();
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "twin-cuda CPU device");
  // One UUID per machine: every process of a test sees the same device, as ranks sharing a GPU do.
  const char kUuid[] = "twin-cuda-dev-0";
  std::memcpy(prop->uuid.bytes, kUuid, sizeof prop->uuid.bytes);
  prop->totalGlobalMem = size_t{80} << 30;
  prop->sharedMemPerBlock = 48 << 10;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->multiProcessorCount = static_cast<int>(multiprocessors());  // FUSCO_TWIN_SMS (T7)
  prop->maxBlocksPerMultiProcessor = static_cast<int>(blocksPerMultiprocessor(1));
  prop->major = 9;
  prop->minor = 0;
  prop->canMapHostMemory = 1;
  prop->unifiedAddressing = 1;
  prop->cooperativeLaunch = 1;
  prop->maxThreadsPerMultiProcessor = 2048;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  TWIN_ENTER();
  if (value == nullptr) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = static_cast<int>(multiprocessors());  // FUSCO_TWIN_SMS (T7)
      break;
    case cudaDevAttrMaxBlocksPerMultiprocessor:
      *value = static_cast<int>(blocksPerMultiprocessor(1));
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      break;
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      break;
    case cudaDevAttrMaxThreadsPerMultiProcessor:
      *value = 2048;
      break;
    case cudaDevAttrWarpSize:
      *value = 32;
      break;
    case cudaDevAttrUnifiedAddressing:
    case cudaDevAttrCanMapHostMemory:
    case cudaDevAttrCooperativeLaunch:
    case cudaDevAttrHostRegisterSupported:
      *value = 1;
      break;
    default:
      *value = 0;
      break;  // not modelled: "absent" is the careful answer
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSetLimit(cudaLimit limit, size_t value) {
  TWIN_ENTER();
  std::lock_guard<std::mutex> g(gLimitsMu);
  switch (limit) {
    case cudaLimitStackSize:
      gLimits.stack = value;
      return cudaSuccess;
    case cudaLimitPrintfFifoSize:
      gLimits.printfFifo = value;
      return cudaSuccess;
    case cudaLimitMallocHeapSize:
      gLimits.heap = value;
      return cudaSuccess;
    default:
      return fail(cudaErrorNotSupported);
  }
}

cudaError_t cudaDeviceGetLimit(size_t* value, cudaLimit limit) {
  TWIN_ENTER();
  if (value == nullptr) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> g(gLimitsMu);
  switch (limit) {
    case cudaLimitStackSize:
      *value = gLimits.stack;
      return cudaSuccess;
    case cudaLimitPrintfFifoSize:
      *value = gLimits.printfFifo;
      return cudaSuccess;
    case cudaLimitMallocHeapSize:
      *value = gLimits.heap;
      return cudaSuccess;
    default:
      return fail(cudaErrorNotSupported);
  }
}

}  // extern "C"
