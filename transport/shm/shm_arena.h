// First-fit allocator over this rank's shared arena (the memory fuscoMemAlloc hands out).
// Only the owner allocates in its arena, so the bookkeeping lives in process-local memory; peers
// only see offsets (tokens). Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "fusco.h"

namespace fusco {

class ShmArena {
 public:
  static constexpr uint64_t kAlign = 256;

  // Manages [base, base + bytes); bytes is rounded down to kAlign.
  void init(uint8_t* base, uint64_t bytes);

  // [out] *ptr: kAlign-aligned memory of at least `bytes` (0 counts as 1). fuscoSystemError
  // (naming the request and the largest free block) when no free block is large enough.
  fuscoResult_t alloc(size_t bytes, void** ptr);
  // fuscoInvalidArgument if ptr is not the start of a live allocation.
  fuscoResult_t release(void* ptr);

  // true with *offset = ptr - base if [ptr, ptr + bytes) lies inside the arena.
  bool contains(const void* ptr, size_t bytes, uint64_t* offset) const;

  uint64_t size() const { return bytes_; }
  uint64_t largestFree() const;
  size_t liveAllocations() const;

 private:
  uint64_t largestFreeLocked() const;

  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  mutable std::mutex mu_;
  std::map<uint64_t, uint64_t> free_;  // offset -> size, non-adjacent (coalesced)
  std::map<uint64_t, uint64_t> used_;  // offset -> size
};

}  // namespace fusco
