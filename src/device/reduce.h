// Host twins of the combine math (docs/API.md, "Combine"): fp32 <-> bf16 / fp16 conversion and the
// row reductions every level of the fixed combine tree uses. Host C++ only (no CUDA headers), so
// the host path, the kernels' tests and the planner tests share one definition of the arithmetic.
//
// Exact semantics (the device kernels must match them bit for bit):
//   * Conversions to bf16 / fp16 round to nearest, ties to even. NaN stays NaN (quiet, sign and top
//     payload bits kept), +-inf stays inf, fp16 overflow (|x| >= 65520) gives inf, fp16 subnormals
//     are produced and read exactly. bf16 / fp16 -> fp32 is exact.
//   * Every reduction accumulates in fp32, starting from +0.0f, adding the terms in the given
//     order, with the multiply and the add rounded separately (no FMA):
//       acc = 0.0f; for i in order: p = w_i * x_i; acc = acc + p;   then out = round_dt(acc).
//     A term with weight "none" is x_i itself (no multiply). Starting from +0 matters only for
//     signed zeros: a single -0 term yields +0. Every level of the combine tree (expert rank,
//     node, final) uses these, so a level with one term is round_dt(0 + x), not a plain copy.
//   * In NONE dedup the expert rank ships raw rows back; the source applies the rank level
//     (weightedSumRows over that rank's rows of the token, k order) so the bits match RANK mode.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fusco.h"

namespace fusco {

// Scalar conversions (RNE, NaN quiet, inf and fp16 subnormals exact).
uint16_t floatToBf16(float f);
float bf16ToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float halfToFloat(uint16_t h);

// True for the datatypes combine supports: fuscoFloat32, fuscoBfloat16, fuscoFloat16.
bool isReduceType(fuscoDataType_t dt);

// Converts n elements of dt at src to fp32 (dst) and back (src fp32 -> dst of dt, rounded).
void loadAsFloat(fuscoDataType_t dt, const void* src, size_t n, float* dst);
void storeFromFloat(fuscoDataType_t dt, const float* src, size_t n, void* dst);

// out[j] = round_dt( (((0 + w0*x0[j]) + w1*x1[j]) + ...) ) over rows 0..m-1 in that order, fp32
// accumulation. weights == nullptr means every weight is 1 (the term is the element itself).
// m == 0 writes zeros. out may not alias an input row. [in] rows: m pointers to `hidden`
// elements of dt. [out] out: `hidden` elements of dt.
void weightedSumRows(fuscoDataType_t dt, size_t hidden, const void* const* rows,
                     const float* weights, size_t m, void* out);

// out[j] = round_dt( ((0 + x0[j]) + x1[j]) + ... ) in row order, fp32 accumulation.
void sumRows(fuscoDataType_t dt, size_t hidden, const void* const* rows, size_t m, void* out);

// out = sumRows over the single row src, without arithmetic: a copy in which -0 becomes +0 (the
// only value round_dt(0 + x) changes; NaN payloads are already quiet in rows this library made).
void canonicalCopyRow(fuscoDataType_t dt, size_t hidden, const void* src, void* out);

}  // namespace fusco
