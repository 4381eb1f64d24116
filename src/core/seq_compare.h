// Comparisons of 32-bit counters that only grow and may wrap (the CUDA path's flag words, the
// network bridge's posts): a value is ahead of another when it is less than 2^31 steps past it.
#pragma once

#include <cstdint>

namespace fusco {

// value has reached `expected` (equal or past it).
inline bool seqReached(uint32_t value, uint32_t expected) {
  return static_cast<int32_t>(value - expected) >= 0;
}

// value is strictly past `than`.
inline bool seqAfter(uint32_t value, uint32_t than) {
  return static_cast<int32_t>(value - than) > 0;
}

}  // namespace fusco
