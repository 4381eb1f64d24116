// The guard of the CUDA rule (docs/DESIGN.md, "The CUDA rules"): once an operation has enqueued a
// stream wait that only a host thread releases (GO, a peer's flag, a bridge word), no thread of
// the process may make a CUDA call that can wait for the device until that wait is released, or
// the process deadlocks without an error. The guard keeps a process-wide count of such waits
// (counted before the wait is enqueued, uncounted once the host saw it satisfied or released it).
//
// Every setup call (one that may wait for the device: allocation and free, host registration, IPC
// open and close, synchronous copies, synchronize, module loading) checks the count first:
// cudaGuardSetup makes one that would run while a wait is pending an internal error naming the
// call, and counts it (tests fail on any). Setup calls on a caller's thread (registration,
// planning, a call's scratch before its first wait) run inside a CudaSetupWindow, which waits
// until no wait is pending and holds new waits back while it lives. The host twin of the stream
// (FUSCO_ASYNC_HOST=1) counts its waits and checks its setup calls the same way, so a misplaced
// call fails on machines without a GPU too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "fusco.h"

namespace fusco {

// A stream wait that a host thread releases is about to be enqueued (blocks while a setup window
// is open), and `n` such waits were satisfied or released.
void cudaGuardWaitAdded();
void cudaGuardWaitsDone(size_t n);
size_t cudaGuardPending();

// Before a setup call `what`: fuscoSuccess when nothing can be waiting, else fuscoInternalError
// naming the call (logged, and counted in cudaGuardViolations).
fuscoResult_t cudaGuardSetup(const char* what);
// Violations so far, and the message of the last (tests check that there were none).
uint64_t cudaGuardViolations(std::string* last = nullptr);

// A place where setup calls are legal: open() waits until no wait of the process is pending
// (polling; past timeoutMs fuscoTimeout naming `what`, and fuscoRemoteError at once when `stop`
// says so) and from then until destruction holds back every new wait, so the setup calls inside
// run while nothing waits for the host. Never open one on a progress thread or while holding a
// lock that a progress thread takes.
class CudaSetupWindow {
 public:
  CudaSetupWindow() = default;
  ~CudaSetupWindow();
  CudaSetupWindow(const CudaSetupWindow&) = delete;
  CudaSetupWindow& operator=(const CudaSetupWindow&) = delete;
  fuscoResult_t open(int64_t timeoutMs, const char* what,
                     const std::function<bool()>& stop = nullptr);
  bool isOpen() const { return open_; }

 private:
  bool open_ = false;
  bool locked_ = false;  // false for a window nested in another of the same thread
};

}  // namespace fusco
