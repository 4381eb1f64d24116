// The scalar arithmetic of the combine math, shared by the host twins (reduce.cc) and the CUDA
// kernels (device_kernels.cu) so both compute the same bits: bit-exact bf16 / fp16 conversions
// (round to nearest even, NaN quiet, fp16 subnormals exact) written with integer operations and
// masks only. See reduce.h for the semantics.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define FUSCO_HD __host__ __device__
#else
#define FUSCO_HD
#endif

namespace fusco {
namespace {

FUSCO_HD inline uint32_t asBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
FUSCO_HD inline float asFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Arithmetic rounded as written: no multiply and add fuse into one, on the device by CUDA's _rn
// intrinsics, on the host because the build turns contraction off (-ffp-contract=off).
FUSCO_HD inline float divRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
FUSCO_HD inline float mulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FUSCO_HD inline float addRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// All-ones when c holds, else 0. The conversions below compute every case and select with masks:
// no branches (and no conditionally executed fp op), so the row loops vectorize.
FUSCO_HD inline uint32_t maskIf(bool c) { return 0u - static_cast<uint32_t>(c); }

FUSCO_HD inline float halfToFloatInline(uint16_t h) {
  const uint32_t o = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent + mantissa in place
  const uint32_t exp = o & 0x0f800000u;
  const uint32_t normal = o + 0x38000000u;  // rebias 15 -> 127
  // Inf/NaN: exponent all ones; a NaN gets the quiet bit.
  const uint32_t infNan = (o + 0x70000000u) | (static_cast<uint32_t>((o & 0x007fffffu) != 0) << 22);
  // Subnormal: m * 2^-24, computed exactly as (2^-14 * (1 + m/1024)) - 2^-14.
  const uint32_t sub = asBits(asFloat(o + 0x38800000u) - asFloat(0x38800000u));
  const uint32_t mInf = maskIf(exp == 0x0f800000u), mSub = maskIf(exp == 0);
  const uint32_t r = (infNan & mInf) | (sub & mSub) | (normal & ~(mInf | mSub));
  return asFloat(r | (static_cast<uint32_t>(h & 0x8000u) << 16));
}

FUSCO_HD inline uint16_t floatToBf16Inline(float f) {
  const uint32_t x = asBits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t quiet = (x >> 16) | 0x40u;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

FUSCO_HD inline uint16_t floatToHalfInline(float f) {
  const uint32_t bits = asBits(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t x = bits & 0x7fffffffu;
  // |x| >= 65536, inf or NaN (a NaN stays NaN, quiet, with its top payload bits).
  const uint32_t big = x > 0x7f800000u ? (0x7e00u | ((x >> 13) & 0x3ffu)) : 0x7c00u;
  // Below 2^-14 (fp16 subnormal or zero): adding 0.5 puts the 2^-24 unit at the mantissa's last
  // bit and the fp32 add rounds to nearest even.
  const uint32_t sub = asBits(asFloat(x) + 0.5f) - 0x3f000000u;
  // Normal: rebias 127 -> 15 (mod 2^32), add half an ulp minus one plus the odd bit (ties to
  // even); a carry into exponent 31 yields inf for [65520, 65536).
  const uint32_t normal = (x + 0xc8000fffu + ((x >> 13) & 1u)) >> 13;
  const uint32_t mBig = maskIf(x >= 0x47800000u), mSub = maskIf(x < 0x38800000u);
  const uint32_t o = (big & mBig) | (sub & mSub) | (normal & ~(mBig | mSub));
  return static_cast<uint16_t>(o | sign);
}

}  // namespace
}  // namespace fusco
