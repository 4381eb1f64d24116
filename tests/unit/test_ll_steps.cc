// The low-latency kernels' shared steps (src/device/ll_steps.h) against the tests' independent
// reference: the e4m3 conversion over a spread of every fp32 exponent and mantissa, and the order
// of a token's combine terms (ranks ascending, slots ascending within a rank).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "device/ll_steps.h"
#include "harness/ll_reference.h"
#include "harness/moe_reference.h"

namespace {

float fromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

TEST(LlSteps, E4m3MatchesTheReferenceConverter) {
  uint64_t checked = 0;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 257) {
    const float f = fromBits(static_cast<uint32_t>(u));
    if (f != f) continue;  // NaN: the unit test of the reference covers its sign rule
    ASSERT_EQ(fusco::ll::floatToE4m3(f), fusco::test::refFloatToE4m3(f)) << std::hex << u;
    ++checked;
  }
  EXPECT_GT(checked, 16000000u);
}

TEST(LlSteps, E4m3KeepsNanAndSaturates) {
  EXPECT_EQ(fusco::ll::floatToE4m3(fromBits(0x7fc00000u)), 0x7f);
  EXPECT_EQ(fusco::ll::floatToE4m3(fromBits(0xffc00000u)), 0xff);
  EXPECT_EQ(fusco::ll::floatToE4m3(fromBits(0x7f800000u)), 0x7e);
  EXPECT_EQ(fusco::ll::floatToE4m3(-1e9f), 0xfe);
}

TEST(LlSteps, TermOrderGroupsByRankThenSlot) {
  // 4 local experts per rank: ids 9 (rank 2), 1 (rank 0), -1, 11 (rank 2), 3 (rank 0), 70 (bad).
  const int64_t ids[6] = {9, 1, -1, 11, 3, 70};
  uint8_t order[fusco::ll::kMaxTopk], last[fusco::ll::kMaxTopk];
  const uint32_t n = fusco::ll::termOrder(ids, 6, 16, 4, order, last);
  ASSERT_EQ(n, 4u);
  const std::vector<int> want = {1, 4, 0, 3}, closes = {0, 1, 0, 1};
  for (uint32_t i = 0; i < n; ++i) {
    EXPECT_EQ(order[i], want[i]) << i;
    EXPECT_EQ(last[i], closes[i]) << i;
  }
}

// The kernels' per-element sum against the tree written out plainly (fp32 groups per rank,
// each rounded to bf16, the groups summed in fp32 and rounded), with and without weights.
TEST(LlSteps, CombineElementFollowsTheTree) {
  std::vector<std::vector<uint16_t>> rows(5, std::vector<uint16_t>(64));
  uint32_t seed = 12345;
  for (auto& r : rows)
    for (auto& v : r) {
      seed = seed * 1664525u + 1013904223u;
      v = static_cast<uint16_t>(0x3c00u + (seed >> 20) % 0x0800u) | ((seed & 1u) << 15);
    }
  const uint16_t* ptrs[5] = {rows[0].data(), rows[1].data(), rows[2].data(), rows[3].data(),
                             rows[4].data()};
  const float w[5] = {0.3f, -1.7f, 0.11f, 2.5f, 0.9f};
  const uint8_t last[5] = {0, 1, 0, 0, 1};
  auto bf = [](uint16_t h) { return fromBits(static_cast<uint32_t>(h) << 16); };
  auto round = [&](float f) { return bf(fusco::test::refFloatToBf16(f)); };
  for (const float* wt : {static_cast<const float*>(w), static_cast<const float*>(nullptr)}) {
    for (uint64_t j = 0; j < 64; ++j) {
      float g1 = 0.0f, g2 = 0.0f;
      for (int i = 0; i < 2; ++i) g1 = g1 + (wt ? wt[i] * bf(rows[i][j]) : bf(rows[i][j]));
      for (int i = 2; i < 5; ++i) g2 = g2 + (wt ? wt[i] * bf(rows[i][j]) : bf(rows[i][j]));
      const float acc = (0.0f + round(g1)) + round(g2);
      ASSERT_EQ(fusco::ll::combineElement(ptrs, wt, last, 5, j), fusco::test::refFloatToBf16(acc))
          << j;
    }
  }
}

}  // namespace
