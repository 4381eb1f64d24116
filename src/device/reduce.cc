// Host twins of the combine math. The multiply and the add of every term are separate roundings
// (API.md's tree is defined without FMA), so contraction is switched off for this file; the
// dynamic cost model lets -O2 builds vectorize the row loops too (GCC 12 -O2 defaults to
// "very cheap", which skips loops of unknown trip count).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "vect-cost-model=dynamic")
#endif

#include "device/reduce.h"

#include <algorithm>
#include <cstring>

namespace fusco {

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

// All-ones when c holds, else 0. The conversions below compute every case and select with masks:
// no branches (and no conditionally executed fp op), so the row loops vectorize.
inline uint32_t maskIf(bool c) { return 0u - static_cast<uint32_t>(c); }

inline float halfToFloatInline(uint16_t h) {
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

inline uint16_t floatToBf16Inline(float f) {
  const uint32_t x = asBits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t quiet = (x >> 16) | 0x40u;
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

inline uint16_t floatToHalfInline(float f) {
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

size_t elemSize(fuscoDataType_t dt) { return dt == fuscoFloat32 ? 4 : 2; }

// acc[j] = acc[j] + w * src[j], the product rounded first.
void addScaled(float* __restrict acc, const float* __restrict src, float w, size_t n) {
  for (size_t j = 0; j < n; ++j) {
    const float p = w * src[j];
    acc[j] = acc[j] + p;
  }
}
void addPlain(float* __restrict acc, const float* __restrict src, size_t n) {
  for (size_t j = 0; j < n; ++j) acc[j] = acc[j] + src[j];
}

// Columns are reduced in chunks small enough that the accumulator and one converted input row
// stay in L1 while every row of the chunk is added, row by row (contiguous inner loops).
constexpr size_t kChunk = 1024;

void reduceRows(fuscoDataType_t dt, size_t hidden, const void* const* rows, const float* weights,
                size_t m, void* out) {
  alignas(64) float acc[kChunk];
  alignas(64) float tmp[kChunk];
  const size_t es = elemSize(dt);
  for (size_t c0 = 0; c0 < hidden; c0 += kChunk) {
    const size_t n = std::min(kChunk, hidden - c0);
    std::fill(acc, acc + n, 0.0f);
    for (size_t i = 0; i < m; ++i) {
      const char* row = static_cast<const char*>(rows[i]) + c0 * es;
      const float* src = tmp;
      if (dt == fuscoFloat32 && reinterpret_cast<uintptr_t>(row) % alignof(float) == 0) {
        src = reinterpret_cast<const float*>(row);
      } else {
        loadAsFloat(dt, row, n, tmp);
      }
      if (weights) {
        addScaled(acc, src, weights[i], n);
      } else {
        addPlain(acc, src, n);
      }
    }
    storeFromFloat(dt, acc, n, static_cast<char*>(out) + c0 * es);
  }
}

}  // namespace

uint16_t floatToBf16(float f) { return floatToBf16Inline(f); }
float bf16ToFloat(uint16_t h) { return asFloat(static_cast<uint32_t>(h) << 16); }
uint16_t floatToHalf(float f) { return floatToHalfInline(f); }
float halfToFloat(uint16_t h) { return halfToFloatInline(h); }

bool isReduceType(fuscoDataType_t dt) {
  return dt == fuscoFloat32 || dt == fuscoBfloat16 || dt == fuscoFloat16;
}

void loadAsFloat(fuscoDataType_t dt, const void* src, size_t n, float* dst) {
  if (n == 0) return;  // pointers may be null then
  if (dt == fuscoFloat32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  // Inputs may be unaligned (rows of odd byte offsets): copy through memcpy-sized loads.
  const unsigned char* s = static_cast<const unsigned char*>(src);
  if (dt == fuscoBfloat16) {
    for (size_t j = 0; j < n; ++j) {
      uint16_t h;
      std::memcpy(&h, s + 2 * j, 2);
      dst[j] = asFloat(static_cast<uint32_t>(h) << 16);
    }
  } else {
    for (size_t j = 0; j < n; ++j) {
      uint16_t h;
      std::memcpy(&h, s + 2 * j, 2);
      dst[j] = halfToFloatInline(h);
    }
  }
}

void storeFromFloat(fuscoDataType_t dt, const float* src, size_t n, void* dst) {
  if (n == 0) return;  // pointers may be null then
  if (dt == fuscoFloat32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  unsigned char* d = static_cast<unsigned char*>(dst);
  if (dt == fuscoBfloat16) {
    for (size_t j = 0; j < n; ++j) {
      const uint16_t h = floatToBf16Inline(src[j]);
      std::memcpy(d + 2 * j, &h, 2);
    }
  } else {
    for (size_t j = 0; j < n; ++j) {
      const uint16_t h = floatToHalfInline(src[j]);
      std::memcpy(d + 2 * j, &h, 2);
    }
  }
}

void weightedSumRows(fuscoDataType_t dt, size_t hidden, const void* const* rows,
                     const float* weights, size_t m, void* out) {
  reduceRows(dt, hidden, rows, weights, m, out);
}

void sumRows(fuscoDataType_t dt, size_t hidden, const void* const* rows, size_t m, void* out) {
  reduceRows(dt, hidden, rows, nullptr, m, out);
}

}  // namespace fusco
