// Device, pinned and registered memory, pointer attributes (CUDA runtime API, "Memory
// Management" and "Unified Addressing"), and the access check every item makes (T3).
//
// Device memory is a memfd mapped into this process, in 2 MiB units, so that an IPC handle can
// name it to another process (twin_ipc.cc). With unified addressing a device pointer and its host
// address are the same number, as they are on a GPU with UVA.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "twin_internal.h"

namespace twincuda {
namespace detail {
namespace {

constexpr size_t kGranularity = size_t{2} << 20;

std::shared_mutex gAccessMu;
std::atomic<uint64_t> gIllegal{0}, gSyncLimit{0}, gRefused{0}, gRevoked{0};
std::atomic<uint64_t> gNextUid{1};

const char* kindName(RegionKind k) {
  switch (k) {
    case RegionKind::kDevice:
      return "device allocation";
    case RegionKind::kIpc:
      return "IPC mapping";
    case RegionKind::kPinned:
      return "pinned host allocation";
    case RegionKind::kRegistered:
      return "registered host range";
  }
  return "region";
}

// Any region [p, p + bytes) overlaps.
Region* overlapLocked(const void* p, size_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto& m = regionsLocked();
  auto it = m.upper_bound(a + bytes - 1);
  if (it == m.begin()) return nullptr;
  --it;
  return it->second.base + it->second.bytes > a ? &it->second : nullptr;
}

// Why an access misses, or "" when it is allowed.
std::string missLocked(const Access& x) {
  Region* r = findRegionLocked(x.ptr, x.bytes);
  if (r != nullptr && !r->revoked) return "";
  Region* o = r ? r : overlapLocked(x.ptr, x.bytes);
  if (o == nullptr)
    return x.strict
               ? "outside every allocation, opened IPC mapping and pinned range of this process"
               : "";
  if (o->revoked)
    return "in the memory of process " + std::to_string(o->owner) +
           ", which exited: its mapping was taken away";
  return "past the end of the " + std::string(kindName(o->kind)) + " at " +
         fmtPtr(reinterpret_cast<void*>(o->base)) + " (" + std::to_string(o->bytes) + " bytes)";
}

}  // namespace

std::mutex& memoryMutex() {
  static auto* m = new std::mutex;
  return *m;
}

std::map<uintptr_t, Region>& regionsLocked() {
  static auto* m = new std::map<uintptr_t, Region>;
  return *m;
}

Region* findRegionLocked(const void* p, size_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto& m = regionsLocked();
  auto it = m.upper_bound(a);
  if (it == m.begin()) return nullptr;
  --it;
  Region& r = it->second;
  return a >= r.base && a + bytes <= r.base + r.bytes ? &r : nullptr;
}

bool isDeviceAccessible(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> g(memoryMutex());
  const Region* r = findRegionLocked(p, bytes);
  return r != nullptr && !r->revoked;
}

bool allocationRange(const void* p, void** base, size_t* bytes) {
  std::lock_guard<std::mutex> g(memoryMutex());
  const Region* r = findRegionLocked(p, 1);
  if (r == nullptr || r->revoked || (r->kind != RegionKind::kDevice && r->kind != RegionKind::kIpc))
    return false;
  *base = reinterpret_cast<void*>(r->base);
  *bytes = r->bytes;
  return true;
}

std::shared_lock<std::shared_mutex> holdMappings() {
  return std::shared_lock<std::shared_mutex>(gAccessMu);
}
std::unique_lock<std::shared_mutex> revokeMappings() {
  return std::unique_lock<std::shared_mutex>(gAccessMu);
}

void countIllegalAddress() { gIllegal.fetch_add(1); }
void noteSyncLimit() { gSyncLimit.fetch_add(1); }
void noteRefusedLaunch() { gRefused.fetch_add(1); }
void noteRevoked(size_t n) { gRevoked.fetch_add(n); }
uint64_t newUid() { return (static_cast<uint64_t>(getpid()) << 32) ^ gNextUid.fetch_add(1); }

bool checkAccesses(const std::vector<Access>& accesses, const std::string& item) {
  for (const Access& x : accesses) {
    if (x.bytes == 0) continue;
    std::string why;
    {
      std::lock_guard<std::mutex> g(memoryMutex());
      why = missLocked(x);
    }
    if (why.empty()) continue;
    // "cudaErrorIllegalAddress: The device encountered a load or store instruction on an invalid
    // memory address. This leaves the process in an inconsistent state and any further CUDA work
    // will return the same error" (runtime API, cudaError).
    countIllegalAddress();
    setSticky(cudaErrorIllegalAddress);
    report("illegal address: %s of %zu bytes at %s by %s: %s (sticky cudaErrorIllegalAddress)",
           x.write ? "write" : "read", x.bytes, fmtPtr(x.ptr).c_str(), item.c_str(), why.c_str());
    return false;
  }
  return true;
}

}  // namespace detail

bool checkAccess(const void* ptr, size_t bytes, bool write, const char* what) {
  // The body runs inside its item, which holds the mappings already (execute()).
  return detail::checkAccesses({detail::Access{ptr, bytes, write, true}}, what);
}

uint64_t illegalAddressCount() { return detail::gIllegal.load(); }
uint64_t syncLimitCount() { return detail::gSyncLimit.load(); }
uint64_t refusedLaunchCount() { return detail::gRefused.load(); }
uint64_t revokedMappingCount() { return detail::gRevoked.load(); }

}  // namespace twincuda

using namespace twincuda::detail;

extern "C" {

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  TWIN_ENTER();
  if (devPtr == nullptr) return fail(cudaErrorInvalidValue);
  cudaError_t e = captureGuard("cudaMalloc");
  if (e == cudaSuccess) e = waitIdle("cudaMalloc");  // T4: may wait for the device
  if (e != cudaSuccess) return e;
  *devPtr = nullptr;
  if (size == 0) return cudaSuccess;
  const size_t bytes = (size + kGranularity - 1) / kGranularity * kGranularity;
  const uint64_t uid = twincuda::detail::newUid();
  const std::string name = "twin-cuda-" + std::to_string(uid);
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return fail(cudaErrorMemoryAllocation);
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0)
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return fail(cudaErrorMemoryAllocation);
  }
  Region r;
  r.base = reinterpret_cast<uintptr_t>(p);
  r.bytes = bytes;
  r.kind = RegionKind::kDevice;
  r.fd = fd;
  r.uid = uid;
  std::lock_guard<std::mutex> g(memoryMutex());
  regionsLocked()[r.base] = r;
  *devPtr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* devPtr) {
  TWIN_ENTER();
  if (devPtr == nullptr) return cudaSuccess;  // "If devPtr is 0, no operation is performed."
  cudaError_t e = captureGuard("cudaFree");
  if (e == cudaSuccess) e = waitIdle("cudaFree");
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> g(memoryMutex());
  auto it = regionsLocked().find(reinterpret_cast<uintptr_t>(devPtr));
  if (it == regionsLocked().end() || it->second.kind != RegionKind::kDevice)
    return fail(cudaErrorInvalidValue);
  munmap(devPtr, it->second.bytes);
  close(it->second.fd);
  regionsLocked().erase(it);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  TWIN_ENTER();
  const unsigned known = cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined;
  if (pHost == nullptr || (flags & ~known) != 0) return fail(cudaErrorInvalidValue);
  cudaError_t e = captureGuard("cudaHostAlloc");
  if (e == cudaSuccess) e = waitIdle("cudaHostAlloc");
  if (e != cudaSuccess) return e;
  *pHost = nullptr;
  if (size == 0) return cudaSuccess;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  Region r;
  r.base = reinterpret_cast<uintptr_t>(p);
  r.bytes = size;
  r.kind = RegionKind::kPinned;
  r.flags = flags;
  std::lock_guard<std::mutex> g(memoryMutex());
  regionsLocked()[r.base] = r;
  *pHost = p;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  return cudaHostAlloc(ptr, size, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void* ptr) {
  TWIN_ENTER();
  if (ptr == nullptr) return cudaSuccess;
  cudaError_t e = captureGuard("cudaFreeHost");
  if (e == cudaSuccess) e = waitIdle("cudaFreeHost");
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> g(memoryMutex());
  auto it = regionsLocked().find(reinterpret_cast<uintptr_t>(ptr));
  if (it == regionsLocked().end() || it->second.kind != RegionKind::kPinned)
    return fail(cudaErrorInvalidValue);
  munmap(ptr, it->second.bytes);
  regionsLocked().erase(it);
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  TWIN_ENTER();
  if (ptr == nullptr || size == 0) return fail(cudaErrorInvalidValue);
  cudaError_t e = captureGuard("cudaHostRegister");
  if (e == cudaSuccess) e = waitIdle("cudaHostRegister");
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> g(memoryMutex());
  if (overlapLocked(ptr, size) != nullptr) return fail(cudaErrorHostMemoryAlreadyRegistered);
  Region r;
  r.base = reinterpret_cast<uintptr_t>(ptr);
  r.bytes = size;
  r.kind = RegionKind::kRegistered;
  r.flags = flags;
  regionsLocked()[r.base] = r;
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* ptr) {
  TWIN_ENTER();
  cudaError_t e = captureGuard("cudaHostUnregister");
  if (e == cudaSuccess) e = waitIdle("cudaHostUnregister");
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> g(memoryMutex());
  auto it = regionsLocked().find(reinterpret_cast<uintptr_t>(ptr));
  if (it == regionsLocked().end() || it->second.kind != RegionKind::kRegistered)
    return fail(cudaErrorHostMemoryNotRegistered);
  regionsLocked().erase(it);
  return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void** pDevice, void* pHost, unsigned int flags) {
  TWIN_ENTER();
  if (pDevice == nullptr || flags != 0) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> g(memoryMutex());
  const Region* r = findRegionLocked(pHost, 1);
  if (r == nullptr || (r->kind != RegionKind::kPinned && r->kind != RegionKind::kRegistered))
    return fail(cudaErrorInvalidValue);
  *pDevice = pHost;  // unified addressing: the same address on both sides
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  TWIN_ENTER();
  if (attributes == nullptr) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> g(memoryMutex());
  const Region* r = findRegionLocked(ptr, 1);
  cudaPointerAttributes& a = *attributes;
  std::memset(&a, 0, sizeof a);
  // Since CUDA 11, memory the runtime does not know is cudaMemoryTypeUnregistered, not an error.
  if (r == nullptr) {
    a.type = cudaMemoryTypeUnregistered;
    a.device = -2;
    a.hostPointer = const_cast<void*>(ptr);
    return cudaSuccess;
  }
  a.device = 0;
  if (r->kind == RegionKind::kDevice || r->kind == RegionKind::kIpc) {
    a.type = cudaMemoryTypeDevice;
    a.devicePointer = const_cast<void*>(ptr);
  } else {
    // Registered host memory reports cudaMemoryTypeHost, as pinned allocations do.
    a.type = cudaMemoryTypeHost;
    a.devicePointer = const_cast<void*>(ptr);
    a.hostPointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}

}  // extern "C"
