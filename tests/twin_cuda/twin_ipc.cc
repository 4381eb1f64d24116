// Legacy CUDA IPC (runtime API, "Interprocess Communication"; programming guide, "Interprocess
// Communication") and the death of a peer (T2, T5).
//
// A handle names the exporter's memfd: {pid, fd, offset, size, unique id}. Opening it maps
// /proc/<pid>/fd/<fd> (or takes the fd with pidfd_getfd), but only FUSCO_TWIN_IPC_OPEN_US after
// the call: the delayed acknowledgement that makes a peer's late mapping visible on CPUs. Opening
// is a setup call (T4). Opens of one handle are counted, and the same address is returned ("If the
// memory handle has already been opened by the current context, the reference count on the handle
// is incremented by 1 and the existing device pointer is returned", cuIpcOpenMemHandle).
//
// The documentation leaves an importer's access to memory whose exporter exited undefined (and
// under MPS it is a fault). The twin makes it a fault: a pidfd watcher takes the mappings of an
// exited process away (PROT_NONE, out of the checked ranges), so the next access is an illegal
// address (T3).
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstring>

#include "twin_internal.h"

namespace twincuda {
namespace detail {
namespace {

constexpr uint32_t kMagic = 0x7477494e;  // "twIN"

struct Wire {
  uint32_t magic;
  int32_t pid;
  int32_t fd;
  uint32_t reserved;
  uint64_t offset;
  uint64_t bytes;
  uint64_t uid;
};
static_assert(sizeof(Wire) <= CUDA_IPC_HANDLE_SIZE, "a handle holds 64 bytes");

struct Watcher {
  std::mutex mu;
  std::map<int, int> pidfds;  // pid -> pidfd
  int wake = -1;
  bool started = false;
};
Watcher& watcher() {
  static auto* w = new Watcher;
  return *w;
}

void revoke(int pid) {
  auto hold = revokeMappings();  // no item is touching memory now
  size_t n = 0;
  std::lock_guard<std::mutex> g(memoryMutex());
  for (auto& kv : regionsLocked()) {
    Region& r = kv.second;
    if (r.kind != RegionKind::kIpc || r.owner != pid || r.revoked) continue;
    mprotect(reinterpret_cast<void*>(r.base), r.bytes, PROT_NONE);
    r.revoked = true;
    ++n;
  }
  if (n == 0) return;
  noteRevoked(n);
  report(
      "process %d exited: %zu IPC mapping(s) of its memory taken away (legacy IPC leaves "
      "access to them undefined)",
      pid, n);
}

void watchLoop() {
  Watcher& w = watcher();
  for (;;) {
    std::vector<pollfd> fds{{w.wake, POLLIN, 0}};
    std::vector<int> pids{0};
    {
      std::lock_guard<std::mutex> g(w.mu);
      for (auto& kv : w.pidfds) {
        fds.push_back({kv.second, POLLIN, 0});
        pids.push_back(kv.first);
      }
    }
    if (poll(fds.data(), fds.size(), -1) < 0) continue;
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      (void)!read(w.wake, &v, sizeof v);
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      revoke(pids[i]);
      std::lock_guard<std::mutex> g(w.mu);
      close(fds[i].fd);
      w.pidfds.erase(pids[i]);
    }
  }
}

void watch(int pid) {
  Watcher& w = watcher();
  std::lock_guard<std::mutex> g(w.mu);
  if (w.pidfds.count(pid)) return;
  if (!w.started) {
    w.wake = eventfd(0, EFD_CLOEXEC);
    std::thread(watchLoop).detach();
    w.started = true;
  }
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) {
    std::thread(revoke, pid).detach();  // already gone
    return;
  }
  w.pidfds[pid] = fd;
  const uint64_t one = 1;
  (void)!write(w.wake, &one, sizeof one);
}

// The exporter's memfd, checked to be the allocation the handle names (a pid or fd reused since
// is refused).
int openPeerFd(const Wire& h) {
  const std::string link = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  char target[PATH_MAX] = {};
  const ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
  const std::string want = "/memfd:twin-cuda-" + std::to_string(h.uid) + " ";
  if (n <= 0 || std::strncmp(target, want.c_str(), want.size()) != 0) return -1;
  int fd = open(link.c_str(), O_RDWR | O_CLOEXEC);
  if (fd >= 0) return fd;
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, h.pid, 0));
  if (pidfd < 0) return -1;
  fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, h.fd, 0));
  close(pidfd);
  return fd;
}

}  // namespace
}  // namespace detail
}  // namespace twincuda

using namespace twincuda::detail;

extern "C" {

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* devPtr) {
  TWIN_ENTER();
  if (handle == nullptr) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> g(memoryMutex());
  const Region* r = findRegionLocked(devPtr, 1);
  if (r == nullptr || r->kind != RegionKind::kDevice) return fail(cudaErrorInvalidValue);
  Wire w{};
  w.magic = kMagic;
  w.pid = getpid();
  w.fd = r->fd;
  w.offset = 0;  // a handle names the whole allocation; opening returns its base
  w.bytes = r->bytes;
  w.uid = r->uid;
  std::memset(handle, 0, sizeof *handle);
  std::memcpy(handle->reserved, &w, sizeof w);
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
  TWIN_ENTER();
  Wire h;
  std::memcpy(&h, handle.reserved, sizeof h);
  // "flags: Flags for this operation. Must be specified as cudaIpcMemLazyEnablePeerAccess".
  if (devPtr == nullptr || flags != cudaIpcMemLazyEnablePeerAccess || h.magic != kMagic)
    return fail(cudaErrorInvalidValue);
  // IPC is between processes; a process opening its own handle is refused.
  if (h.pid == getpid()) return fail(cudaErrorInvalidValue);
  cudaError_t e = captureGuard("cudaIpcOpenMemHandle");
  if (e != cudaSuccess) return e;
  const int64_t delayUs = knob("FUSCO_TWIN_IPC_OPEN_US", 0);
  if (delayUs > 0) usleep(static_cast<useconds_t>(delayUs));
  e = waitIdle("cudaIpcOpenMemHandle");
  if (e != cudaSuccess) return e;
  {
    std::lock_guard<std::mutex> g(memoryMutex());
    for (auto& kv : regionsLocked()) {
      Region& r = kv.second;
      if (r.kind == RegionKind::kIpc && r.owner == h.pid && r.uid == h.uid && !r.revoked) {
        ++r.refs;
        *devPtr = reinterpret_cast<void*>(r.base + h.offset);
        return cudaSuccess;
      }
    }
  }
  const int fd = openPeerFd(h);
  if (fd < 0) {
    report("cudaIpcOpenMemHandle: cannot open allocation %llu of process %d (exited, or freed)",
           static_cast<unsigned long long>(h.uid), h.pid);
    return fail(cudaErrorMapBufferObjectFailed);
  }
  void* p = mmap(nullptr, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);  // the mapping keeps the memory
  if (p == MAP_FAILED) return fail(cudaErrorMapBufferObjectFailed);
  Region r;
  r.base = reinterpret_cast<uintptr_t>(p);
  r.bytes = h.bytes;
  r.kind = RegionKind::kIpc;
  r.uid = h.uid;
  r.owner = h.pid;
  {
    std::lock_guard<std::mutex> g(memoryMutex());
    regionsLocked()[r.base] = r;
  }
  watch(h.pid);
  *devPtr = static_cast<char*>(p) + h.offset;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* devPtr) {
  TWIN_ENTER();
  cudaError_t e = captureGuard("cudaIpcCloseMemHandle");
  if (e == cudaSuccess) e = waitIdle("cudaIpcCloseMemHandle");
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> g(memoryMutex());
  auto it = regionsLocked().find(reinterpret_cast<uintptr_t>(devPtr));
  if (it == regionsLocked().end() || it->second.kind != RegionKind::kIpc)
    return fail(cudaErrorInvalidValue);
  if (--it->second.refs > 0) return cudaSuccess;
  munmap(devPtr, it->second.bytes);
  regionsLocked().erase(it);
  return cudaSuccess;
}

}  // extern "C"
