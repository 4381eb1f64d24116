// The host twins of the combine math (src/device/reduce.h): conversions against known bit
// patterns and the independent reference conversions, and the row reductions against plain loops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "device/reduce.h"
#include "harness/moe_reference.h"

namespace fusco {
namespace {

uint32_t bitsOf(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
float floatOf(uint32_t u) {
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

TEST(ReduceConvert, Bf16KnownPatterns) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(floatToBf16(0.0f), 0x0000);
  EXPECT_EQ(floatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(floatToBf16(floatOf(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(floatToBf16(floatOf(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(floatToBf16(floatOf(0x3f808001u)), 0x3f81);  // just above the tie
  EXPECT_EQ(floatToBf16(floatOf(0x3f807fffu)), 0x3f80);  // just below the tie
  EXPECT_EQ(floatToBf16(floatOf(0x7f7fffffu)), 0x7f80);  // max float rounds to inf
  EXPECT_EQ(floatToBf16(INFINITY), 0x7f80);
  EXPECT_EQ(floatToBf16(-INFINITY), 0xff80);
  EXPECT_EQ(floatToBf16(floatOf(0x00010000u)), 0x0001);     // fp32 subnormal stays exact
  const uint16_t snan = floatToBf16(floatOf(0x7f800001u));  // signaling NaN, payload low bits
  EXPECT_EQ(snan & 0x7f80, 0x7f80);
  EXPECT_NE(snan & 0x0040, 0) << "NaN must come out quiet";
  EXPECT_EQ(floatToBf16(floatOf(0xffc00000u)), 0xffc0);  // sign of a NaN kept
  EXPECT_EQ(bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(bitsOf(bf16ToFloat(0x8000)), 0x80000000u);
}

TEST(ReduceConvert, HalfKnownPatterns) {
  EXPECT_EQ(floatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(floatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(floatToHalf(0.1f), 0x2e66);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(65519.99f), 0x7bff);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);  // the tie above max rounds to inf (even)
  EXPECT_EQ(floatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(floatToHalf(-INFINITY), 0xfc00);
  EXPECT_EQ(floatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, even
  EXPECT_EQ(floatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, odd up
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -14)), 0x0400);             // smallest normal
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -24)), 0x0001);             // smallest subnormal
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -25)), 0x0000);             // tie to even 0
  EXPECT_EQ(floatToHalf(std::ldexp(1.5f, -25)), 0x0001);             // above the tie
  EXPECT_EQ(floatToHalf(std::ldexp(3.0f, -25)), 0x0002);             // 1.5 units: tie, even 2
  EXPECT_EQ(floatToHalf(std::ldexp(1023.5f, -24)), 0x0400);          // subnormal carries to normal
  const uint16_t nan = floatToHalf(floatOf(0x7f800001u));
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x0200, 0) << "NaN must come out quiet";
  EXPECT_EQ(halfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(halfToFloat(0x83ff), -std::ldexp(1023.0f, -24));
  EXPECT_EQ(halfToFloat(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(halfToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(halfToFloat(0x7c01)));
  EXPECT_NE(bitsOf(halfToFloat(0x7c01)) & 0x00400000u, 0u) << "NaN must come out quiet";
}

TEST(ReduceConvert, EveryHalfRoundTripsAndMatchesReference) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = halfToFloat(static_cast<uint16_t>(h));
    const float ref = test::refHalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      continue;
    }
    ASSERT_EQ(bitsOf(f), bitsOf(ref)) << std::hex << h;
    ASSERT_EQ(floatToHalf(f), h) << std::hex << h;
  }
}

TEST(ReduceConvert, RandomFloatsMatchReferenceRounding) {
  std::mt19937_64 rng(0x5eed0001);
  for (int i = 0; i < 400000; ++i) {
    uint32_t b = static_cast<uint32_t>(rng());
    if (i % 2) b = (b & 0x8001ffffu) | ((0x30u + (b >> 17) % 0x20u) << 23);  // fp16's range
    if (i % 7 == 0) b = (b & 0xffff0000u) | 0x8000u | (rng() % 2 ? 0x0000u : 0x10000u);  // ties
    const float f = floatOf(b);
    if (std::isnan(f)) continue;
    ASSERT_EQ(floatToBf16(f), test::refFloatToBf16(f)) << std::hex << b;
    ASSERT_EQ(floatToHalf(f), test::refFloatToHalf(f)) << std::hex << b;
  }
}

// A plain element-by-element loop with the same rounding points, using the reference conversions.
std::vector<uint8_t> plainWeightedSum(fuscoDataType_t dt, size_t hidden,
                                      const std::vector<std::vector<uint8_t>>& rows,
                                      const float* weights) {
  const size_t es = dt == fuscoFloat32 ? 4 : 2;
  std::vector<uint8_t> out(hidden * es);
  for (size_t j = 0; j < hidden; ++j) {
    float acc = 0.0f;
    for (size_t i = 0; i < rows.size(); ++i) {
      const float x = test::refToFloat(dt, rows[i].data() + j * es);
      const float p = weights ? weights[i] * x : x;
      acc = acc + p;
    }
    test::refFromFloat(dt, acc, out.data() + j * es);
  }
  return out;
}

std::vector<uint8_t> randomRow(fuscoDataType_t dt, size_t hidden, std::mt19937_64& rng) {
  const size_t es = dt == fuscoFloat32 ? 4 : 2;
  std::vector<uint8_t> row(hidden * es);
  std::uniform_real_distribution<float> mag(0.01f, 8.0f);
  for (size_t j = 0; j < hidden; ++j) {
    const float v = (rng() % 2 ? 1.0f : -1.0f) * mag(rng);
    test::refFromFloat(dt, v, row.data() + j * es);
  }
  return row;
}

TEST(ReduceRows, WeightedAndPlainSumsMatchPlainLoopBitwise) {
  std::mt19937_64 rng(0x5eed0002);
  for (fuscoDataType_t dt : {fuscoFloat32, fuscoBfloat16, fuscoFloat16}) {
    for (size_t hidden : {1, 7, 1023, 1024, 1025, 3001}) {
      for (size_t m : {0, 1, 2, 5, 8}) {
        std::vector<std::vector<uint8_t>> rows;
        std::vector<const void*> ptrs;
        std::vector<float> w;
        for (size_t i = 0; i < m; ++i) {
          rows.push_back(randomRow(dt, hidden, rng));
          w.push_back(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng));
        }
        for (auto& r : rows) ptrs.push_back(r.data());
        const size_t es = dt == fuscoFloat32 ? 4 : 2;
        std::vector<uint8_t> got(hidden * es, 0xA5);
        weightedSumRows(dt, hidden, ptrs.data(), w.data(), m, got.data());
        ASSERT_EQ(got, plainWeightedSum(dt, hidden, rows, w.data()))
            << "weighted dt " << dt << " hidden " << hidden << " m " << m;
        std::fill(got.begin(), got.end(), 0xA5);
        sumRows(dt, hidden, ptrs.data(), m, got.data());
        ASSERT_EQ(got, plainWeightedSum(dt, hidden, rows, nullptr))
            << "sum dt " << dt << " hidden " << hidden << " m " << m;
        // Double check: within a few dt roundings of the exact sum.
        weightedSumRows(dt, hidden, ptrs.data(), w.data(), m, got.data());
        for (size_t j = 0; j < hidden && m > 0; ++j) {
          double exact = 0, absSum = 0;
          for (size_t i = 0; i < m; ++i) {
            const double x = test::refToFloat(dt, rows[i].data() + j * es);
            exact += static_cast<double>(w[i]) * x;
            absSum += std::fabs(static_cast<double>(w[i]) * x);
          }
          const double eps = dt == fuscoFloat32 ? 0x1p-23 : dt == fuscoBfloat16 ? 0x1p-8 : 0x1p-11;
          const double v = test::refToFloat(dt, got.data() + j * es);
          ASSERT_LE(std::fabs(v - exact), eps * std::fabs(exact) + (m + 1) * 0x1p-23 * absSum)
              << "dt " << dt << " column " << j;
        }
      }
    }
  }
}

TEST(ReduceRows, FollowsTheGivenOrderExactly) {
  const float a[1] = {1e8f}, b[1] = {1.0f}, c[1] = {-1e8f};
  float out = -1;
  const void* abc[3] = {a, b, c};
  const void* acb[3] = {a, c, b};
  sumRows(fuscoFloat32, 1, abc, 3, &out);
  EXPECT_EQ(out, 0.0f);  // (1e8 + 1) rounds back to 1e8
  sumRows(fuscoFloat32, 1, acb, 3, &out);
  EXPECT_EQ(out, 1.0f);
  const float w[3] = {1.0f, 1.0f, 1.0f};
  weightedSumRows(fuscoFloat32, 1, abc, w, 3, &out);
  EXPECT_EQ(out, 0.0f);
  // bf16: the fp32 accumulator keeps 1 + 2^-9 that a bf16 accumulator would lose.
  const uint16_t one = floatToBf16(1.0f), tiny = floatToBf16(0x1p-9f), mone = floatToBf16(-1.0f);
  const void* rows[3] = {&one, &tiny, &mone};
  uint16_t o16 = 0;
  sumRows(fuscoBfloat16, 1, rows, 3, &o16);
  EXPECT_EQ(bf16ToFloat(o16), 0x1p-9f);
}

TEST(ReduceRows, MultiplyAndAddRoundSeparately) {
  // w * x is not exact in fp32; a fused multiply-add would keep the low bits and differ.
  const float w = 1.0f + 0x1p-12f, x = 1.0f + 0x1p-12f, y = -(1.0f + 0x1p-11f);
  const float xr[1] = {x}, yr[1] = {y};
  const void* rows[2] = {xr, yr};
  const float ws[2] = {w, 1.0f};
  float out = 0;
  weightedSumRows(fuscoFloat32, 1, rows, ws, 2, &out);
  EXPECT_EQ(out, 0.0f) << "the product's 2^-24 term must be rounded away before the add";
}

TEST(ReduceRows, ZeroRowsWriteZerosAndNegativeZeroBecomesPositive) {
  uint16_t out[3] = {0xA5A5, 0xA5A5, 0xA5A5};
  sumRows(fuscoFloat16, 3, nullptr, 0, out);
  EXPECT_EQ(out[0] | out[1] | out[2], 0);
  const float nz[1] = {-0.0f};
  const void* rows[1] = {nz};
  float o = 1;
  sumRows(fuscoFloat32, 1, rows, 1, &o);
  EXPECT_EQ(bitsOf(o), 0u) << "sums start at +0";
}

TEST(ReduceRows, NanAndInfPropagate) {
  const uint16_t inf = 0x7c00, big = floatToHalf(60000.0f), nan = 0x7e00, one = 0x3c00;
  uint16_t o = 0;
  const void* r1[2] = {&inf, &one};
  sumRows(fuscoFloat16, 1, r1, 2, &o);
  EXPECT_EQ(o, 0x7c00);
  const void* r2[2] = {&big, &big};
  sumRows(fuscoFloat16, 1, r2, 2, &o);
  EXPECT_EQ(o, 0x7c00) << "fp32 sum 120000 overflows fp16 on the store";
  const void* r3[2] = {&one, &nan};
  sumRows(fuscoFloat16, 1, r3, 2, &o);
  EXPECT_TRUE(std::isnan(halfToFloat(o)));
}

TEST(ReduceRows, UnalignedRowsWork) {
  std::mt19937_64 rng(0x5eed0003);
  for (fuscoDataType_t dt : {fuscoFloat32, fuscoBfloat16}) {
    const size_t hidden = 37, es = dt == fuscoFloat32 ? 4 : 2;
    std::vector<std::vector<uint8_t>> rows = {randomRow(dt, hidden, rng),
                                              randomRow(dt, hidden, rng)};
    std::vector<uint8_t> buf(2 * hidden * es + 8);
    std::memcpy(buf.data() + 1, rows[0].data(), hidden * es);
    std::memcpy(buf.data() + 3 + hidden * es, rows[1].data(), hidden * es);
    const void* ptrs[2] = {buf.data() + 1, buf.data() + 3 + hidden * es};
    const float w[2] = {0.75f, -1.25f};
    std::vector<uint8_t> out(hidden * es + 1);
    weightedSumRows(dt, hidden, ptrs, w, 2, out.data() + 1);
    EXPECT_EQ(std::vector<uint8_t>(out.begin() + 1, out.end()),
              plainWeightedSum(dt, hidden, rows, w));
  }
}

}  // namespace
}  // namespace fusco
