// Host twins of the combine math. The multiply and the add of every term are separate roundings
// (docs/API.md's tree is defined without FMA), so contraction is switched off for this file; the
// dynamic cost model lets -O2 builds vectorize the row loops too (GCC 12 -O2 defaults to
// "very cheap", which skips loops of unknown trip count).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off", "vect-cost-model=dynamic")

// Clone resolvers run while the program is being relocated, before a ThreadSanitizer runtime
// exists, so TSan builds use the baseline code only.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define FUSCO_ROW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FUSCO_ROW_CLONES
#endif
#endif

#include "device/reduce.h"

#include <algorithm>
#include <cstring>

#include "device/reduce_math.h"

namespace fusco {

namespace {

size_t elemSize(fuscoDataType_t dt) { return dt == fuscoFloat32 ? 4 : 2; }

inline void loadAsFloatImpl(fuscoDataType_t dt, const void* src, size_t n, float* dst) {
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

inline void storeFromFloatImpl(fuscoDataType_t dt, const float* src, size_t n, void* dst) {
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

// Element j of a row as fp32 (rows may be unaligned: loads go through memcpy).
inline float widenBf16(const unsigned char* row, size_t j) {
  uint16_t h;
  std::memcpy(&h, row + 2 * j, 2);
  return asFloat(static_cast<uint32_t>(h) << 16);
}
inline float widenHalf(const unsigned char* row, size_t j) {
  uint16_t h;
  std::memcpy(&h, row + 2 * j, 2);
  return halfToFloatInline(h);
}
inline float widenFloat(const unsigned char* row, size_t j) {
  float f;
  std::memcpy(&f, row + 4 * j, 4);
  return f;
}
// acc[j] = acc[j] + w * x[j] (product rounded first), and acc[j] = acc[j] + x[j].
template <typename Widen>
inline void accumulate(float* __restrict acc, const unsigned char* __restrict row, size_t n,
                       float w, Widen widen) {
  for (size_t j = 0; j < n; ++j) {
    const float p = w * widen(row, j);
    acc[j] = acc[j] + p;
  }
}
template <typename Widen>
inline void accumulatePlain(float* __restrict acc, const unsigned char* __restrict row, size_t n,
                            Widen widen) {
  for (size_t j = 0; j < n; ++j) acc[j] = acc[j] + widen(row, j);
}

// Columns are reduced in chunks small enough that the accumulator and one converted input row
// stay in L1 while every row of the chunk is added, row by row (contiguous inner loops).
constexpr size_t kChunk = 1024;

// Cloned per instruction set (chosen once at load time): the conversions and adds vectorize to
// the widest units the CPU has. Every clone does the same IEEE operations in the same order
// (no FMA: -ffp-contract=off), so results are identical whichever clone runs.
FUSCO_ROW_CLONES
void reduceRows(fuscoDataType_t dt, size_t hidden, const void* const* rows, const float* weights,
                size_t m, void* out) {
  alignas(64) float acc[kChunk];
  const size_t es = elemSize(dt);
  for (size_t c0 = 0; c0 < hidden; c0 += kChunk) {
    const size_t n = std::min(kChunk, hidden - c0);
    std::fill(acc, acc + n, 0.0f);
    for (size_t i = 0; i < m; ++i) {
      const unsigned char* row = static_cast<const unsigned char*>(rows[i]) + c0 * es;
      // One pass per row: load, widen, scale, add (the product rounded before the add).
      if (dt == fuscoBfloat16) {
        if (weights)
          accumulate(acc, row, n, weights[i], widenBf16);
        else
          accumulatePlain(acc, row, n, widenBf16);
      } else if (dt == fuscoFloat16) {
        if (weights)
          accumulate(acc, row, n, weights[i], widenHalf);
        else
          accumulatePlain(acc, row, n, widenHalf);
      } else {
        if (weights)
          accumulate(acc, row, n, weights[i], widenFloat);
        else
          accumulatePlain(acc, row, n, widenFloat);
      }
    }
    storeFromFloatImpl(dt, acc, n, static_cast<char*>(out) + c0 * es);
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

FUSCO_ROW_CLONES
void loadAsFloat(fuscoDataType_t dt, const void* src, size_t n, float* dst) {
  loadAsFloatImpl(dt, src, n, dst);
}

FUSCO_ROW_CLONES
void storeFromFloat(fuscoDataType_t dt, const float* src, size_t n, void* dst) {
  storeFromFloatImpl(dt, src, n, dst);
}

void weightedSumRows(fuscoDataType_t dt, size_t hidden, const void* const* rows,
                     const float* weights, size_t m, void* out) {
  reduceRows(dt, hidden, rows, weights, m, out);
}

void sumRows(fuscoDataType_t dt, size_t hidden, const void* const* rows, size_t m, void* out) {
  reduceRows(dt, hidden, rows, nullptr, m, out);
}

FUSCO_ROW_CLONES
void canonicalCopyRow(fuscoDataType_t dt, size_t hidden, const void* src, void* out) {
  if (dt == fuscoFloat32) {
    const uint32_t* in = static_cast<const uint32_t*>(src);
    uint32_t* o = static_cast<uint32_t*>(out);
    for (size_t j = 0; j < hidden; ++j) o[j] = in[j] == 0x80000000u ? 0u : in[j];
    return;
  }
  const uint16_t* in = static_cast<const uint16_t*>(src);
  uint16_t* o = static_cast<uint16_t*>(out);
  for (size_t j = 0; j < hidden; ++j) o[j] = in[j] == 0x8000u ? 0u : in[j];
}

}  // namespace fusco
