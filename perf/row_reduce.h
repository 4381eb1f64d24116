// The row arithmetic of moe_perf's host baselines and checks: fp32 <-> bf16 / fp16 conversions and
// the weighted row sum the unfused pipeline's un-permute applies. They follow the combine math the
// library documents (docs/API.md, "Combine"): conversions round to nearest, ties to even (NaN stays
// a quiet NaN, fp16 overflow gives inf, fp16 subnormals exact); a sum accumulates in fp32 from +0
// in the given order with the multiply and the add rounded separately (no FMA), then rounds once to
// the row type. So the baseline computes what fuscoMoeCombine computes, bit for bit, at the speed
// of a vectorized loop. Host C++ only; perf keeps its own copy so it needs only the public API.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fusco.h"

namespace fusco {
namespace perf {

uint16_t floatToBf16(float f);
float bf16ToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float halfToFloat(uint16_t h);

// out[j] = round_dt(((0 + w0*x0[j]) + w1*x1[j]) + ...) over rows 0..m-1 in that order, for dt
// fuscoFloat32, fuscoBfloat16 or fuscoFloat16. weights == nullptr: every term is the element
// itself. m == 0 writes zeros. [in] rows: m pointers to `hidden` elements of dt (any alignment).
// [out] out: `hidden` elements of dt, not aliasing an input row.
void weightedSumRows(fuscoDataType_t dt, size_t hidden, const void* const* rows,
                     const float* weights, size_t m, void* out);

}  // namespace perf
}  // namespace fusco
