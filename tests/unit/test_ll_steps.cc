// The low-latency kernels' shared steps (src/device/ll_steps.h) against the tests' independent
// reference: the e4m3 conversion over a spread of every fp32 exponent and mantissa, and the order
// of a token's combine terms (ranks ascending, slots ascending within a rank).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "device/ll_steps.h"
#include "harness/ll_reference.h"

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

}  // namespace
