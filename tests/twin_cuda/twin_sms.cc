// The device's multiprocessors (T7).
//
// CUDA programming guide, "Hardware Implementation": the blocks of a grid are distributed to the
// multiprocessors with available execution capacity, and blocks that do not fit wait for earlier
// ones to finish; nothing guarantees that two kernels, of one process or of several processes
// sharing the GPU, are resident together. Cooperative groups, "Grid Synchronization": a grid that
// synchronizes must be resident whole, so it is launched with cudaLaunchCooperativeKernel (or
// cudaLaunchAttributeCooperative), which refuses a grid of more blocks than
// cudaOccupancyMaxActiveBlocksPerMultiprocessor times cudaDevAttrMultiProcessorCount
// (runtime API, cudaErrorCooperativeLaunchTooLarge).
//
// The twin's device has FUSCO_TWIN_SMS multiprocessors (default 132, an H100 SXM's count; what the
// device properties report), one pool shared by every process of this user on this machine, as
// ranks sharing a GPU share its multiprocessors: a file in the temporary directory (TMPDIR, else
// /tmp; the device's state, not a segment of the library, so not in /dev/shm, where the tests
// hold the library to leaving nothing behind) (another pool per
// FUSCO_TWIN_SM_POOL name). A kernel occupies ceil(blocks / blocks per multiprocessor) of them
// while its body runs: a cooperative kernel takes all of them before it starts, any other kernel
// as many as are free, at least one (its other blocks run in waves on those). A kernel that cannot
// take them waits at the head of its hardware queue (T6). Each hold is a slot of the file naming
// its process (pid and start time, against a reused pid) and kernel. The file is locked with
// flock, which the kernel drops when a process dies, and the slots of a process that no longer
// runs are freed, so a killed process leaks nothing.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "twin_internal.h"

namespace twincuda {
namespace detail {
namespace {

// One hold of multiprocessors. Guarded by the pool's lock.
struct Slot {
  int32_t pid;  // 0: free
  uint32_t sms;
  uint64_t start;  // the process's start time (/proc/<pid>/stat), against a reused pid
  char what[48];   // the kernel, for messages
};
constexpr int kSlots = 512;  // holds at once on the device (a GPU runs at most 128 kernels)
constexpr size_t kPoolBytes = sizeof(Slot) * kSlots;

struct Pool {
  std::mutex mu;  // flock does not exclude the threads of one process from each other
  int fd = -1;    // -1: a pool of this process alone (the file could not be opened)
  Slot* slots = nullptr;
  std::string path;
  int32_t pid = 0;
  uint64_t start = 0;
};

std::atomic<uint32_t> gHeldHere{0};
std::atomic<uint64_t> gSmWaits{0};

// The start time of a process that runs (field 22 of /proc/<pid>/stat); 0 when it is gone or has
// exited unreaped (a zombie: a GPU's context dies with its process).
uint64_t startTime(int32_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  const char* p = strrchr(buf, ')');  // the command name may hold spaces and parentheses
  if (p == nullptr || p[1] != ' ') return 0;
  p += 2;  // field 3, the state
  if (*p == 'Z' || *p == 'X') return 0;
  for (int field = 3; field < 22 && p != nullptr; ++field) {
    p = strchr(p, ' ');
    if (p != nullptr) ++p;
  }
  return p != nullptr ? strtoull(p, nullptr, 10) : 0;
}

std::string poolPath() {
  const char* dir = getenv("TMPDIR");
  std::string path = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") +
                     "/fusco-twin-sms-v1-u" + std::to_string(getuid()) + "-dev0";
  const char* name = getenv("FUSCO_TWIN_SM_POOL");
  if (name == nullptr || *name == '\0') return path;
  path += '-';
  for (const char* c = name; *c != '\0' && path.size() < 200; ++c)
    path += (isalnum(static_cast<unsigned char>(*c)) || *c == '-' || *c == '.') ? *c : '_';
  return path;
}

Pool* openPool() {
  static Slot alone[kSlots];
  Pool* p = new Pool;
  p->path = poolPath();
  p->pid = getpid();
  p->start = startTime(p->pid);
  const int fd = open(p->path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  struct stat st;
  void* m = MAP_FAILED;
  if (fd >= 0 && fstat(fd, &st) == 0 &&
      (static_cast<size_t>(st.st_size) >= kPoolBytes || ftruncate(fd, kPoolBytes) == 0))
    m = mmap(nullptr, kPoolBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    report("multiprocessor pool %s: %s; this process shares its multiprocessors with no other",
           p->path.c_str(), strerror(errno));
    if (fd >= 0) close(fd);
    p->slots = alone;
    return p;
  }
  p->fd = fd;
  p->slots = static_cast<Slot*>(m);
  return p;
}

Pool& pool() {
  static Pool* p = openPool();  // never unmapped: kernels may run while the process exits
  return *p;
}

class PoolLock {
 public:
  explicit PoolLock(Pool& p) : p_(p), g_(p.mu) {
    if (p_.fd >= 0)
      while (flock(p_.fd, LOCK_EX) != 0 && errno == EINTR) {
      }
  }
  ~PoolLock() {
    if (p_.fd >= 0) flock(p_.fd, LOCK_UN);
  }

 private:
  Pool& p_;
  std::lock_guard<std::mutex> g_;
};

bool mine(const Pool& p, const Slot& s) { return s.pid == p.pid && s.start == p.start; }

uint32_t heldLocked(const Pool& p) {
  uint64_t n = 0;
  for (int i = 0; i < kSlots; ++i)
    if (p.slots[i].pid != 0) n += p.slots[i].sms;
  return n > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(n);
}

// Frees the holds of processes that no longer run; true when it freed any.
bool reapLocked(Pool& p) {
  bool freed = false;
  for (int i = 0; i < kSlots; ++i) {
    Slot& s = p.slots[i];
    if (s.pid == 0 || mine(p, s) || (s.pid != p.pid && startTime(s.pid) == s.start)) continue;
    std::memset(&s, 0, sizeof s);
    freed = true;
  }
  return freed;
}

uint64_t volume(const dim3& d) { return uint64_t{d.x} * d.y * d.z; }

bool cooperativeAttr(const cudaLaunchConfig_t* cfg) {
  if (cfg == nullptr || cfg->attrs == nullptr) return false;
  for (unsigned i = 0; i < cfg->numAttrs; ++i)
    if (cfg->attrs[i].id == cudaLaunchAttributeCooperative && cfg->attrs[i].val.cooperative != 0)
      return true;
  return false;
}

}  // namespace

uint32_t multiprocessors() {
  static const uint32_t n = [] {
    const int64_t v = knob("FUSCO_TWIN_SMS", 132);  // an H100 SXM's count: grids look real
    return static_cast<uint32_t>(v < 1 ? 1 : v > 65536 ? 65536 : v);
  }();
  return n;
}

uint32_t blocksPerMultiprocessor(uint64_t threads) {
  // A multiprocessor of compute capability 9.0 holds 2048 threads and 32 blocks.
  if (threads == 0) return 1;
  return static_cast<uint32_t>(std::max<uint64_t>(1, std::min<uint64_t>(32, 2048 / threads)));
}

cudaError_t residency(const Launch& l, const cudaLaunchConfig_t* cfg, const std::string& kernel,
                      uint32_t* sms, bool* cooperative) {
  uint64_t blocks = l.blocks, threads = l.threads;
  if (blocks == 0 && cfg != nullptr) blocks = volume(cfg->gridDim);
  if (threads == 0 && cfg != nullptr) threads = volume(cfg->blockDim);
  if (blocks == 0) blocks = 1;
  *cooperative = l.cooperative || cooperativeAttr(cfg);
  const uint64_t perSm = blocksPerMultiprocessor(threads);
  const uint64_t need = (blocks + perSm - 1) / perSm;
  const uint32_t total = multiprocessors();
  if (*cooperative && need > total) {
    report(
        "cooperative launch of %s refused: %llu blocks of %llu threads, %llu per multiprocessor, "
        "need %llu multiprocessors and the device has %u (FUSCO_TWIN_SMS)",
        kernel.c_str(), static_cast<unsigned long long>(blocks),
        static_cast<unsigned long long>(threads), static_cast<unsigned long long>(perSm),
        static_cast<unsigned long long>(need), total);
    return fail(cudaErrorCooperativeLaunchTooLarge);
  }
  *sms = static_cast<uint32_t>(need > total ? total : need);
  return cudaSuccess;
}

bool acquireSms(uint32_t want, bool all, const std::string& what, SmHold* h) {
  Pool& p = pool();
  const uint32_t total = multiprocessors();
  const uint32_t need = all ? want : 1;
  PoolLock lk(p);
  uint32_t held = heldLocked(p);
  if ((held >= total || total - held < need) && reapLocked(p)) held = heldLocked(p);
  if (held >= total || total - held < need) return false;
  int i = 0;
  while (i < kSlots && p.slots[i].pid != 0) ++i;
  if (i == kSlots) return false;  // as many kernels run as the pool records: wait for one
  Slot& s = p.slots[i];
  s.pid = p.pid;
  s.start = p.start;
  s.sms = all ? want : std::min(want, total - held);
  snprintf(s.what, sizeof s.what, "%s", what.c_str());
  h->slot = i;
  h->count = s.sms;
  gHeldHere.fetch_add(h->count);
  return true;
}

void releaseSms(SmHold* h) {
  if (h->slot < 0) return;
  Pool& p = pool();
  {
    PoolLock lk(p);
    Slot& s = p.slots[h->slot];
    if (mine(p, s)) std::memset(&s, 0, sizeof s);
  }
  gHeldHere.fetch_sub(h->count);
  h->slot = -1;
  h->count = 0;
}

std::string smHolders() {
  Pool& p = pool();
  PoolLock lk(p);
  reapLocked(p);
  std::string r = std::to_string(heldLocked(p)) + " of " + std::to_string(multiprocessors()) +
                  " (FUSCO_TWIN_SMS) held";
  int shown = 0, more = 0;
  for (int i = 0; i < kSlots; ++i) {
    const Slot& s = p.slots[i];
    if (s.pid == 0) continue;
    if (shown == 4) {
      ++more;
      continue;
    }
    ++shown;
    r += ", " + std::to_string(s.sms) + " by " +
         std::string(s.what, strnlen(s.what, sizeof s.what)) + " of process " +
         std::to_string(s.pid) + (mine(p, s) ? " (this one)" : "");
  }
  return more == 0 ? r : r + ", and " + std::to_string(more) + " more";
}

void noteSmWait() { gSmWaits.fetch_add(1); }

}  // namespace detail

uint32_t smsHeldByProcess() { return detail::gHeldHere.load(); }

uint32_t smsHeldOnDevice() {
  detail::Pool& p = detail::pool();
  detail::PoolLock lk(p);
  detail::reapLocked(p);
  return detail::heldLocked(p);
}

uint64_t smWaitCount() { return detail::gSmWaits.load(); }

std::string smPoolPath() { return detail::pool().path; }

}  // namespace twincuda
