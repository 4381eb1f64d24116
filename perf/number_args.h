// The numbers perf binaries take on their command lines: "-np N" style integers and sizes with
// K/M/G suffixes ("64M" = 64 << 20, an optional trailing B).
#pragma once

#include <cstddef>

namespace fusco {
namespace perf {

// Return false (and leave *out alone) on a malformed or out-of-range value.
bool parseSize(const char* s, size_t* out);
bool parseInt(const char* s, int* out);

}  // namespace perf
}  // namespace fusco
