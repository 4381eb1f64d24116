// Internals shared by the twin CUDA runtime's files (not for its users: see twin_cuda.h).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "twin_cuda.h"

namespace twincuda {
namespace detail {

// ------------------------------------------------------------------ knobs, messages, errors
// An integer from the environment, read at each use (tests change knobs between cases).
int64_t knob(const char* name, int64_t fallback);
int64_t nowNs();
// One line on stderr, prefixed "twin-cuda: ".
void report(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Records e as the calling thread's last error (cudaGetLastError) unless it is cudaSuccess.
cudaError_t fail(cudaError_t e);
// The context's sticky error (cudaErrorIllegalAddress after a fault): every later call returns it.
cudaError_t stickyError();
void setSticky(cudaError_t e);
// Every entry point starts here: creates the context at first use and returns its sticky error.
cudaError_t enter();

#define TWIN_ENTER()                                        \
  do {                                                      \
    const cudaError_t twinE_ = ::twincuda::detail::enter(); \
    if (twinE_ != cudaSuccess) return twinE_;               \
  } while (0)

std::string fmtPtr(const void* p);

// ------------------------------------------------------------------ checked accesses (T3)
struct Access {
  const void* ptr = nullptr;
  size_t bytes = 0;
  bool write = false;
  // Strict: must be device-accessible memory (an allocation, an opened IPC mapping, pinned or
  // registered host memory). Lenient (a copy's host side): pageable host memory is fine too, but
  // memory taken away from a dead peer (T5) is not.
  bool strict = true;
};
// True when every access is allowed; on a miss prints "twin-cuda: illegal address ...", counts it
// and makes cudaErrorIllegalAddress sticky. The caller holds holdMappings().
bool checkAccesses(const std::vector<Access>& a, const std::string& item);
// Held while an item touches memory, so a dead peer's mapping is not taken away under it (T5).
std::shared_lock<std::shared_mutex> holdMappings();
std::unique_lock<std::shared_mutex> revokeMappings();
void countIllegalAddress();
void noteSyncLimit();
void noteRefusedLaunch();
void noteRevoked(size_t n);

// ------------------------------------------------------------------ multiprocessors (T7)
// The device's multiprocessors: FUSCO_TWIN_SMS (default 132), read once.
uint32_t multiprocessors();
// Blocks of `threads` threads one multiprocessor holds (the occupancy query's answer); 0 threads
// (not known): one.
uint32_t blocksPerMultiprocessor(uint64_t threads);
// What a launch's grid occupies: `sms` multiprocessors, all at once when `cooperative`.
// Refuses (cudaErrorCooperativeLaunchTooLarge, with a message) a cooperative grid larger than the
// device. [in] cfg: the configuration of the cudaLaunchKernelExC call the launch is made from, or
// null.
cudaError_t residency(const Launch& l, const cudaLaunchConfig_t* cfg, const std::string& kernel,
                      uint32_t* sms, bool* cooperative);
// Multiprocessors held in the pool shared by every process on the device.
struct SmHold {
  int slot = -1;
  uint32_t count = 0;
};
// Takes `want` multiprocessors for the kernel `what`: all of them when `all`, else as many as are
// free, at least one. False (nothing taken) when that many are not free now.
bool acquireSms(uint32_t want, bool all, const std::string& what, SmHold* h);
void releaseSms(SmHold* h);
// Who holds the pool now, for a wait's message.
std::string smHolders();
void noteSmWait();

// ------------------------------------------------------------------ streams (T1, T6)
struct Stream;

// One entry of a stream: a kernel, copy, memset, event record, event wait or memory operation.
struct Item {
  std::string desc;
  // Work (kernels, copies) runs on its own thread so the queue moves on (another stream's work
  // may run beside it); the rest runs on the queue's thread.
  bool work = false;
  std::function<void(Item&)> prepare;  // at each submission (an event record names its record)
  std::function<bool()> ready;         // a wait: true once the item may start
  std::function<void()> run;
  std::vector<Access> accesses;
  // A kernel's multiprocessors (T7): how many its grid occupies (0: not a kernel), whether all of
  // them must be held before it starts (a cooperative launch) or at least one; while it waits for
  // them at its queue's head, and what it holds while it runs (filled by the queue).
  uint32_t sms = 0;
  bool cooperative = false;
  bool waitingSms = false;
  SmHold smHold;
  // Filled at submission.
  Stream* stream = nullptr;
  std::vector<std::pair<Stream*, uint64_t>> after;  // the legacy stream's implicit ordering
};
using ItemPtr = std::shared_ptr<Item>;

struct Capture;

struct Stream {
  int id = 0;
  unsigned flags = 0;
  bool legacy = false;
  int queue = 0;
  std::atomic<uint64_t> submitted{0};
  std::atomic<uint64_t> completed{0};
  // Guarded by the context's mutex.
  bool running = false;
  bool destroyed = false;
  std::deque<ItemPtr> pending;
  Capture* capture = nullptr;
};

std::mutex& contextMutex();
// The stream a handle names (0 and cudaStreamLegacy: the legacy default stream;
// cudaStreamPerThread: this thread's default stream); null for a destroyed or unknown handle.
Stream* findStream(cudaStream_t s);
// Enqueues, or appends to the stream's capture. Calls prepare.
cudaError_t submit(Stream* s, ItemPtr item);
cudaError_t submitLocked(Stream* s, ItemPtr item);  // with contextMutex() held
// T4: waits until every stream of the process is idle, at most FUSCO_TWIN_SYNC_LIMIT_MS.
cudaError_t waitIdle(const char* call);
// Waits until `done` holds (checked under the context's mutex after each completion), at most
// FUSCO_TWIN_SYNC_LIMIT_MS; `holder` is the stream whose work it waits for (named in the message).
cudaError_t waitFor(const char* call, Stream* holder, const std::function<bool()>& done);
std::string streamName(const Stream* s);

// ------------------------------------------------------------------ capture (T1)
struct Capture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id owner;
  Stream* origin = nullptr;
  bool invalidated = false;
  std::vector<ItemPtr> items;
  uint64_t id = 0;
};
// The capture rule for "potentially unsafe API calls" (cudaStreamBeginCapture's modes): returns
// cudaErrorStreamCaptureUnsupported, and invalidates the captures it conflicts with, when this
// thread may not make `call` now.
cudaError_t captureGuard(const char* call);

// ------------------------------------------------------------------ kernels (T4)
cudaError_t loadKernel(const void* fn, const char* call);

// ------------------------------------------------------------------ memory (T2)
enum class RegionKind { kDevice, kIpc, kPinned, kRegistered };
struct Region {
  uintptr_t base = 0;
  size_t bytes = 0;
  RegionKind kind = RegionKind::kDevice;
  unsigned flags = 0;    // cudaHostAlloc / cudaHostRegister flags
  int fd = -1;           // kDevice: the memfd; kIpc: -1
  uint64_t uid = 0;      // kDevice, kIpc: the allocation's unique id
  int owner = 0;         // kIpc: the exporting process
  int refs = 1;          // kIpc: opens of the same handle
  bool revoked = false;  // kIpc: the owner exited (T5)
};
std::mutex& memoryMutex();
// Regions by base address; guarded by memoryMutex().
std::map<uintptr_t, Region>& regionsLocked();
// The region holding [p, p + bytes), or null.
Region* findRegionLocked(const void* p, size_t bytes);
bool isDeviceAccessible(const void* p, size_t bytes);
// The device allocation (or opened IPC mapping) holding p.
bool allocationRange(const void* p, void** base, size_t* bytes);

}  // namespace detail
}  // namespace twincuda
