// Monotonic time and deadlines: every blocking wait in the library takes a Deadline.
#pragma once

#include <atomic>
#include <cstdint>
#include <ctime>

namespace fusco {

inline int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// The timeout of a wait counts time without progress (docs/DESIGN.md, "Timeouts"): a wait that
// sees its data move calls progressed(), which starts the clock again, so a large transfer that
// keeps moving is never cut off. An abort flag (fuscoCommAbort's) ends a wait early: the waits
// that take one poll it (aborted()) at least every kAbortPollMs.
class Deadline {
 public:
  static constexpr int64_t kAbortPollMs = 50;
  explicit Deadline(int64_t timeoutMs, const std::atomic<bool>* abort = nullptr)
      : end_(nowNs() + timeoutMs * 1000000LL), ms_(timeoutMs), abort_(abort) {}
  bool expired() const { return nowNs() >= end_; }
  int64_t remainingMs() const {
    int64_t r = (end_ - nowNs()) / 1000000LL;
    return r < 0 ? 0 : r;
  }
  int64_t timeoutMs() const { return ms_; }
  // Data moved: the timeout starts again (const: every wait is handed its deadline by reference).
  void progressed() const { end_ = nowNs() + ms_ * 1000000LL; }
  bool aborted() const { return abort_ != nullptr && abort_->load(std::memory_order_relaxed); }
  const std::atomic<bool>* abortFlag() const { return abort_; }

 private:
  mutable int64_t end_;
  int64_t ms_;
  const std::atomic<bool>* abort_;
};

}  // namespace fusco
