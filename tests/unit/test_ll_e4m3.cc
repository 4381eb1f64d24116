// The low-latency reference's FP8 quantiser (tests/harness/ll_reference.h), which the FP8
// dispatch tests trust: the e4m3fn conversion against hand-computed bytes (signed zeros,
// saturation at 448, NaN, subnormals, ties to even) and every tie between neighbouring codes, and
// the per-128-channel scale with its 1e-4 floor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "harness/ll_reference.h"

namespace {

using fusco::test::refE4m3ToFloat;
using fusco::test::refFloatToE4m3;

struct Case {
  float v;
  uint8_t want;
};

void expectCases(const std::vector<Case>& cases) {
  for (const Case& c : cases)
    EXPECT_EQ(refFloatToE4m3(c.v), c.want)
        << "e4m3(" << c.v << " = " << std::hexfloat << c.v << std::defaultfloat << ")";
}

TEST(LlReferenceE4m3, HandComputedValues) {
  const float inf = std::numeric_limits<float>::infinity();
  expectCases({
      {0.0f, 0x00},     {-0.0f, 0x80},     {1.0f, 0x38},      {-1.0f, 0xb8},
      {2.0f, 0x40},     {0.5f, 0x30},      {0.1f, 0x1d},      {240.0f, 0x77},
      {256.0f, 0x78},   {416.0f, 0x7d},    {448.0f, 0x7e},    {-448.0f, 0xfe},
      {464.0f, 0x7e},   {500.0f, 0x7e},    {-500.0f, 0xfe},   {1e30f, 0x7e},
      {inf, 0x7e},      {-inf, 0xfe},      {0x1p-6f, 0x08},   {0x1p-9f, 0x01},
      {-0x1p-9f, 0x81}, {0x1p-10f, 0x00},  {-0x1p-10f, 0x80}, {0x1.00002p-10f, 0x01},
      {0x3p-10f, 0x02}, {0x5p-10f, 0x02},  {0x7p-10f, 0x04},  {0x7p-9f, 0x07},
      {0xfp-10f, 0x08}, {0x1.1p-7f, 0x04}, {1e-30f, 0x00},    {1e-45f, 0x00},
      {-1e-45f, 0x80},  {1.0625f, 0x38},   {1.1875f, 0x3a},   {0x1.10002p0f, 0x39},
  });
}

TEST(LlReferenceE4m3, NanKeepsItsSign) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(refFloatToE4m3(nan), 0x7f);
  EXPECT_EQ(refFloatToE4m3(-nan), 0xff);
  EXPECT_TRUE(std::isnan(refE4m3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(refE4m3ToFloat(0xff)));
}

TEST(LlReferenceE4m3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(refFloatToE4m3(refE4m3ToFloat(static_cast<uint8_t>(c))), c)
        << "code " << c << " = " << refE4m3ToFloat(static_cast<uint8_t>(c));
  }
  EXPECT_EQ(refE4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(refE4m3ToFloat(0x01), 0x1p-9f);
  EXPECT_EQ(refE4m3ToFloat(0x08), 0x1p-6f);
}

// Between neighbouring codes c and c + 1: the midpoint goes to the even one, anything a float ulp
// either side to the nearer one; both signs.
TEST(LlReferenceE4m3, TiesGoToEvenAndNeighboursToTheNearer) {
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = refE4m3ToFloat(static_cast<uint8_t>(c));
    const float hi = refE4m3ToFloat(static_cast<uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;  // exact in fp32: five significant bits at most
    const int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(refFloatToE4m3(mid), even) << "midpoint of codes " << c << " and " << c + 1;
    EXPECT_EQ(refFloatToE4m3(-mid), even | 0x80) << "-midpoint of codes " << c << ", " << c + 1;
    EXPECT_EQ(refFloatToE4m3(std::nextafter(mid, 0.0f)), c) << "below midpoint " << c;
    EXPECT_EQ(refFloatToE4m3(std::nextafter(mid, 1000.0f)), c + 1) << "above midpoint " << c;
  }
}

// Group 0 has amax 448 (scale 1: the codes are those of the values), group 1 amax 896 (scale 2),
// group 2 is all zero (the 1e-4 floor: scale 1e-4f / 448, codes 0).
TEST(LlReferenceQuantize, ScalePerGroupOf128WithTheFloor) {
  const int hidden = 3 * fusco::test::kLlGroup;
  std::vector<float> x(hidden, 0.0f);
  x[0] = 448.0f;
  x[1] = 1.0f;
  x[2] = -2.0f;
  x[3] = 0.0625f;
  x[128] = -896.0f;
  x[129] = 3.0f;
  x[130] = 0x1p-8f;  // 2^-9 after scaling: the smallest subnormal
  std::vector<uint8_t> row(hidden * 2);
  for (int j = 0; j < hidden; ++j) {
    uint32_t u;
    std::memcpy(&u, &x[j], 4);  // every value here is exact in bf16
    row[2 * j] = static_cast<uint8_t>((u >> 16) & 0xff);
    row[2 * j + 1] = static_cast<uint8_t>(u >> 24);
  }
  std::vector<uint8_t> q(hidden, 0xA5);
  std::vector<float> scales(3, -1.0f);
  fusco::test::llRefQuantize(row.data(), hidden, q.data(), scales.data());
  EXPECT_EQ(scales[0], 1.0f);
  EXPECT_EQ(scales[1], 2.0f);
  EXPECT_EQ(scales[2], 1e-4f / 448.0f);
  EXPECT_EQ(q[0], 0x7e);
  EXPECT_EQ(q[1], 0x38);
  EXPECT_EQ(q[2], 0xc0);
  EXPECT_EQ(q[3], 0x18);
  EXPECT_EQ(q[4], 0x00);
  EXPECT_EQ(q[128], 0xfe);
  EXPECT_EQ(q[129], 0x3c);
  EXPECT_EQ(q[130], 0x01);
  for (int j = 256; j < hidden; ++j) EXPECT_EQ(q[j], 0x00) << j;
}

}  // namespace
