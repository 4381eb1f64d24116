#include "transport/shm/shm_arena.h"

#include <iterator>

#include "core/log.h"
#include "core/result.h"

namespace fusco {

void ShmArena::init(uint8_t* base, uint64_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  base_ = base;
  bytes_ = bytes / kAlign * kAlign;
  free_.clear();
  used_.clear();
  if (bytes_ > 0) free_[0] = bytes_;
}

uint64_t ShmArena::largestFreeLocked() const {
  uint64_t m = 0;
  for (const auto& f : free_) m = f.second > m ? f.second : m;
  return m;
}

uint64_t ShmArena::largestFree() const {
  std::lock_guard<std::mutex> g(mu_);
  return largestFreeLocked();
}

size_t ShmArena::liveAllocations() const {
  std::lock_guard<std::mutex> g(mu_);
  return used_.size();
}

fuscoResult_t ShmArena::alloc(size_t bytes, void** ptr) {
  std::lock_guard<std::mutex> g(mu_);
  uint64_t want = bytes == 0 ? kAlign : (uint64_t(bytes) + kAlign - 1) / kAlign * kAlign;
  if (want < bytes) want = UINT64_MAX;  // overflowed: no block fits
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    uint64_t off = it->first, rest = it->second - want;
    free_.erase(it);
    if (rest > 0) free_[off + want] = rest;
    used_[off] = want;
    *ptr = base_ + off;
    return fuscoSuccess;
  }
  return FUSCO_FAIL(fuscoSystemError, kShm,
                    "shared arena exhausted: asked %zu bytes, largest free %llu; raise "
                    "FUSCO_SHM_ARENA_BYTES (now %llu)",
                    bytes, (unsigned long long)largestFreeLocked(), (unsigned long long)bytes_);
}

fuscoResult_t ShmArena::release(void* ptr) {
  std::lock_guard<std::mutex> g(mu_);
  auto p = static_cast<uint8_t*>(ptr);
  auto it = (p >= base_ && p < base_ + bytes_) ? used_.find(uint64_t(p - base_)) : used_.end();
  if (it == used_.end())
    return FUSCO_FAIL(fuscoInvalidArgument, kShm,
                      "%p is not memory from fuscoMemAlloc on this communicator (or was freed)",
                      ptr);
  uint64_t off = it->first, len = it->second;
  used_.erase(it);
  // Merge with the following and the preceding free block.
  auto next = free_.lower_bound(off);
  if (next != free_.end() && next->first == off + len) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return fuscoSuccess;
    }
  }
  free_[off] = len;
  return fuscoSuccess;
}

bool ShmArena::contains(const void* ptr, size_t bytes, uint64_t* offset) const {
  auto p = static_cast<const uint8_t*>(ptr);
  if (base_ == nullptr || p < base_ || p >= base_ + bytes_) return false;
  uint64_t off = uint64_t(p - base_);
  if (bytes > bytes_ - off) return false;
  *offset = off;
  return true;
}

}  // namespace fusco
