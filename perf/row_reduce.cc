// The multiply and the add of every term are separate roundings, so contraction is off for this
// file (the build also passes -ffp-contract=off); the dynamic cost model lets the row loops
// vectorize at -O2 too, and each x86-64 instruction set gets its own clone (same IEEE operations
// in the same order in every clone: identical results).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "vect-cost-model=dynamic")
#endif
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define PERF_ROW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PERF_ROW_CLONES
#endif

#include "row_reduce.h"

#include <algorithm>
#include <cstring>

namespace fusco {
namespace perf {

namespace {

inline uint32_t asBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float asFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
// All-ones when c holds: the conversions compute every case and select with masks, so the row
// loops have no branches and vectorize.
inline uint32_t maskIf(bool c) { return 0u - static_cast<uint32_t>(c); }

inline float halfBitsToFloat(uint16_t h) {
  const uint32_t o = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent + mantissa in place
  const uint32_t exp = o & 0x0f800000u;
  const uint32_t normal = o + 0x38000000u;  // rebias 15 -> 127
  const uint32_t infNan = (o + 0x70000000u) | (static_cast<uint32_t>((o & 0x007fffffu) != 0) << 22);
  // Subnormal: m * 2^-24, exactly (2^-14 * (1 + m/1024)) - 2^-14.
  const uint32_t sub = asBits(asFloat(o + 0x38800000u) - asFloat(0x38800000u));
  const uint32_t mInf = maskIf(exp == 0x0f800000u), mSub = maskIf(exp == 0);
  const uint32_t r = (infNan & mInf) | (sub & mSub) | (normal & ~(mInf | mSub));
  return asFloat(r | (static_cast<uint32_t>(h & 0x8000u) << 16));
}

inline uint16_t floatToBf16Bits(float f) {
  const uint32_t x = asBits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t quiet = (x >> 16) | 0x40u;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

inline uint16_t floatToHalfBits(float f) {
  const uint32_t bits = asBits(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t x = bits & 0x7fffffffu;
  const uint32_t big = x > 0x7f800000u ? (0x7e00u | ((x >> 13) & 0x3ffu)) : 0x7c00u;
  // Below 2^-14: adding 0.5 puts the 2^-24 unit at the mantissa's last bit; the add rounds (RNE).
  const uint32_t sub = asBits(asFloat(x) + 0.5f) - 0x3f000000u;
  // Normal: rebias, add half an ulp minus one plus the odd bit (ties to even); a carry into
  // exponent 31 gives inf for [65520, 65536).
  const uint32_t normal = (x + 0xc8000fffu + ((x >> 13) & 1u)) >> 13;
  const uint32_t mBig = maskIf(x >= 0x47800000u), mSub = maskIf(x < 0x38800000u);
  return static_cast<uint16_t>(((big & mBig) | (sub & mSub) | (normal & ~(mBig | mSub))) | sign);
}

// Element j of a row of dt (rows may be unaligned: loads go through memcpy).
template <fuscoDataType_t DT>
inline float widen(const unsigned char* row, size_t j) {
  if (DT == fuscoFloat32) {
    float f;
    std::memcpy(&f, row + 4 * j, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, row + 2 * j, 2);
  return DT == fuscoBfloat16 ? asFloat(static_cast<uint32_t>(h) << 16) : halfBitsToFloat(h);
}

template <fuscoDataType_t DT>
inline void accumulate(float* __restrict acc, const unsigned char* __restrict row, size_t n,
                       const float* w) {
  if (w == nullptr) {
    for (size_t j = 0; j < n; ++j) acc[j] = acc[j] + widen<DT>(row, j);
    return;
  }
  const float wi = *w;
  for (size_t j = 0; j < n; ++j) {
    const float p = wi * widen<DT>(row, j);  // the product rounded before the add
    acc[j] = acc[j] + p;
  }
}

void store(fuscoDataType_t dt, const float* acc, size_t n, unsigned char* out) {
  if (dt == fuscoFloat32) {
    std::memcpy(out, acc, n * sizeof(float));
    return;
  }
  if (dt == fuscoBfloat16) {
    for (size_t j = 0; j < n; ++j) {
      const uint16_t h = floatToBf16Bits(acc[j]);
      std::memcpy(out + 2 * j, &h, 2);
    }
    return;
  }
  for (size_t j = 0; j < n; ++j) {
    const uint16_t h = floatToHalfBits(acc[j]);
    std::memcpy(out + 2 * j, &h, 2);
  }
}

// Columns in chunks small enough that the accumulator stays in L1 while every row is added.
constexpr size_t kChunk = 1024;

}  // namespace

uint16_t floatToBf16(float f) { return floatToBf16Bits(f); }
float bf16ToFloat(uint16_t h) { return asFloat(static_cast<uint32_t>(h) << 16); }
uint16_t floatToHalf(float f) { return floatToHalfBits(f); }
float halfToFloat(uint16_t h) { return halfBitsToFloat(h); }

PERF_ROW_CLONES
void weightedSumRows(fuscoDataType_t dt, size_t hidden, const void* const* rows,
                     const float* weights, size_t m, void* out) {
  alignas(64) float acc[kChunk];
  const size_t es = dt == fuscoFloat32 ? 4 : 2;
  for (size_t c0 = 0; c0 < hidden; c0 += kChunk) {
    const size_t n = std::min(kChunk, hidden - c0);
    std::fill(acc, acc + n, 0.0f);
    for (size_t i = 0; i < m; ++i) {
      const unsigned char* row = static_cast<const unsigned char*>(rows[i]) + c0 * es;
      const float* w = weights != nullptr ? weights + i : nullptr;
      if (dt == fuscoBfloat16)
        accumulate<fuscoBfloat16>(acc, row, n, w);
      else if (dt == fuscoFloat16)
        accumulate<fuscoFloat16>(acc, row, n, w);
      else
        accumulate<fuscoFloat32>(acc, row, n, w);
    }
    store(dt, acc, n, static_cast<unsigned char*>(out) + c0 * es);
  }
}

}  // namespace perf
}  // namespace fusco
