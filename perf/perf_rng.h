// Seeded, deterministic numbers for the perf binaries (routing, rows, payloads): the splitmix64
// finalizer and its stream, so every rank derives the same values from (seed, rank, index).
#pragma once

#include <cstdint>

namespace fusco {
namespace perf {

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The splitmix64 stream: the next value of state *s.
inline uint64_t splitmixNext(uint64_t* s) {
  const uint64_t x = *s;
  *s += 0x9e3779b97f4a7c15ULL;
  return mix64(x);
}

}  // namespace perf
}  // namespace fusco
