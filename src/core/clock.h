// Monotonic time and deadlines: every blocking wait in the library takes a Deadline.
#pragma once

#include <cstdint>
#include <ctime>

namespace fusco {

inline int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

class Deadline {
 public:
  explicit Deadline(int64_t timeoutMs) : end_(nowNs() + timeoutMs * 1000000LL), ms_(timeoutMs) {}
  bool expired() const { return nowNs() >= end_; }
  int64_t remainingMs() const {
    int64_t r = (end_ - nowNs()) / 1000000LL;
    return r < 0 ? 0 : r;
  }
  int64_t timeoutMs() const { return ms_; }

 private:
  int64_t end_;
  int64_t ms_;
};

}  // namespace fusco
