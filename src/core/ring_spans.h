// Space in a ring of `capacity` bytes handed out to numbered operations and taken back in order:
// reserve() places a span after the newest one (wrapping to the start when the end has no room),
// retire(k) frees every span of an operation numbered <= k. Spans never overlap a live one. Pure
// bookkeeping (the memory is the caller's): the CUDA path's deferred operation parameters
// (engine_async.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>

namespace fusco {

class RingSpans {
 public:
  explicit RingSpans(size_t capacity = 0) : cap_(capacity) {}
  size_t capacity() const { return cap_; }
  bool empty() const { return live_.empty(); }
  size_t liveSpans() const { return live_.size(); }

  // Reserves `bytes` (rounded up to `align`, a power of two) for operation `op` (numbers must not
  // decrease). False when the ring has no room now (retire first) or never will (bytes > capacity).
  bool reserve(size_t bytes, uint64_t op, size_t* offset, size_t align = 256) {
    bytes = (bytes + align - 1) & ~(align - 1);
    if (bytes == 0) bytes = align;
    if (bytes > cap_) return false;
    size_t at = live_.empty() ? 0 : head_;
    if (!live_.empty()) {
      // Live spans occupy [tail, head) around the ring; head == tail means it is full.
      const size_t tail = live_.front().offset;
      if (at == tail) return false;
      if (at > tail) {  // free: [at, cap) and [0, tail)
        if (cap_ - at < bytes) {
          if (tail < bytes) return false;
          at = 0;
        }
      } else if (tail - at < bytes) {  // free: [at, tail)
        return false;
      }
    }
    live_.push_back(Span{at, bytes, op});
    head_ = at + bytes == cap_ ? 0 : at + bytes;
    *offset = at;
    return true;
  }

  // The oldest live span's offset (false when none), and freeing it.
  bool front(size_t* offset) const {
    if (live_.empty()) return false;
    *offset = live_.front().offset;
    return true;
  }
  void popFront() { retire(live_.front().op); }

  // Frees the spans of every operation numbered <= op (oldest first).
  void retire(uint64_t op) {
    while (!live_.empty() && live_.front().op <= op) live_.pop_front();
    if (live_.empty()) head_ = 0;
  }

 private:
  struct Span {
    size_t offset, bytes;
    uint64_t op;
  };
  size_t cap_;
  size_t head_ = 0;  // where the next span goes (if it fits)
  std::deque<Span> live_;
};

}  // namespace fusco
