// moe_perf's data: seeded routing weights and token rows, and the element reader its checks use.
// Deterministic in (seed, rank), so every contender sees the same inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fusco.h"

namespace fusco {
namespace perf {

// [out] w: n routing weights in [0.05, 1), seeded by (seed, rank).
void makeWeights(uint64_t seed, int rank, size_t n, std::vector<float>* w);

// Fills tokens rows of `hidden` elements of dt at x with seeded values in [-1, 1).
void fillRows(fuscoDataType_t dt, size_t hidden, size_t tokens, uint64_t seed, int rank, void* x);

// Reads element j of a row of dt as float (bf16 / fp16 / fp32).
float loadElement(fuscoDataType_t dt, const void* row, size_t j);

}  // namespace perf
}  // namespace fusco
