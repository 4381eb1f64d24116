#include "core/cuda_guard.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "core/clock.h"
#include "core/log.h"
#include "core/result.h"

namespace fusco {

namespace {

// gGate is held by an open setup window; adding a wait takes it briefly, so no wait is enqueued
// while a window's setup calls run. gPending changes under it only when it grows.
std::mutex gGate;
std::atomic<size_t> gPending{0};
std::atomic<uint64_t> gViolations{0};
std::mutex gLastMu;
std::string gLast;
thread_local int tWindows = 0;  // windows open on this thread (their calls pass the check)

}  // namespace

void cudaGuardWaitAdded() {
  if (tWindows > 0) {
    // This thread holds the gate: a wait enqueued inside its own window is the misplacement the
    // guard exists for (its next setup call would run while the wait is pending).
    gPending.fetch_add(1, std::memory_order_acq_rel);
    gViolations.fetch_add(1, std::memory_order_relaxed);
    FUSCO_WARN(kEngine, "a stream wait was enqueued inside a CUDA setup window");
    return;
  }
  std::lock_guard<std::mutex> g(gGate);
  gPending.fetch_add(1, std::memory_order_acq_rel);
}

void cudaGuardWaitsDone(size_t n) {
  if (n > 0) gPending.fetch_sub(n, std::memory_order_acq_rel);
}

size_t cudaGuardPending() { return gPending.load(std::memory_order_acquire); }

fuscoResult_t cudaGuardSetup(const char* what) {
  const size_t pending = cudaGuardPending();
  if (pending == 0 || tWindows > 0) return fuscoSuccess;
  gViolations.fetch_add(1, std::memory_order_relaxed);
  fuscoResult_t r = FUSCO_FAIL(fuscoInternalError, kEngine,
                               "%s: a CUDA call that may wait for the device while %zu stream "
                               "wait(s) of this process wait for a host thread (it would "
                               "deadlock; docs/DESIGN.md, \"The CUDA rules\")",
                               what, pending);
  std::lock_guard<std::mutex> g(gLastMu);
  gLast = threadLastError();
  return r;
}

uint64_t cudaGuardViolations(std::string* last) {
  if (last != nullptr) {
    std::lock_guard<std::mutex> g(gLastMu);
    *last = gLast;
  }
  return gViolations.load(std::memory_order_relaxed);
}

CudaSetupWindow::~CudaSetupWindow() {
  if (!open_) return;
  --tWindows;
  if (locked_) gGate.unlock();
}

fuscoResult_t CudaSetupWindow::open(int64_t timeoutMs, const char* what,
                                    const std::function<bool()>& stop) {
  if (open_) return fuscoSuccess;
  if (tWindows > 0) {  // nested in a window of this thread, which holds the gate already
    open_ = true;
    ++tWindows;
    return fuscoSuccess;
  }
  const Deadline deadline(timeoutMs);
  for (;;) {
    gGate.lock();
    if (cudaGuardPending() == 0) break;
    gGate.unlock();
    if (stop && stop())
      return FUSCO_FAIL(fuscoRemoteError, kEngine,
                        "%s: the communicator failed while waiting for enqueued operations", what);
    if (deadline.expired())
      return FUSCO_FAIL(fuscoTimeout, kEngine,
                        "%s: enqueued operations still waited for their peers after the timeout "
                        "(%lld ms), so the CUDA calls it needs could not run",
                        what, static_cast<long long>(timeoutMs));
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  open_ = locked_ = true;
  ++tWindows;
  return fuscoSuccess;
}

}  // namespace fusco
