// The numbers and names perf binaries take on their command lines: "-np N" style integers, sizes
// with K/M/G suffixes ("64M" = 64 << 20, an optional trailing B) and choices among names.
#pragma once

#include <cstddef>

namespace fusco {
namespace perf {

// Return false (and leave *out alone) on a malformed or out-of-range value.
bool parseSize(const char* s, size_t* out);
bool parseInt(const char* s, int* out);
// A name among names[0..n): *out its index.
bool parseName(const char* v, const char* const* names, int n, int* out);

}  // namespace perf
}  // namespace fusco
