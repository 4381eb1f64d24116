// Byte sizes computed from caller-supplied counts: every product and sum that a count reaches is
// checked here, in one place, so a huge count is an error instead of a size that wrapped around
// (a wrapped size looks valid and can even hide a mismatch between ranks).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fusco {

// *out = a * b; false (and *out untouched) when the product does not fit in size_t.
inline bool checkedMul(size_t a, size_t b, size_t* out) {
  size_t r;
  if (__builtin_mul_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

// *out = a + b; false (and *out untouched) when the sum does not fit in size_t.
inline bool checkedAdd(size_t a, size_t b, size_t* out) {
  size_t r;
  if (__builtin_add_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

// *out = (a + b) * c: the end in bytes of a range that starts at element a and holds b elements
// of c bytes each. false when any step overflows.
inline bool checkedEnd(size_t a, size_t b, size_t c, size_t* out) {
  size_t n;
  return checkedAdd(a, b, &n) && checkedMul(n, c, out);
}

}  // namespace fusco
