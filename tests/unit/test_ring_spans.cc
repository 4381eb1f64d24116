// The parameter ring's bookkeeping (core/ring_spans.h): spans in order, wrap-around, reclaiming,
// full and oversized requests, checked against a byte map of live spans.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "core/ring_spans.h"

namespace {

using fusco::RingSpans;

TEST(RingSpans, PlacesSpansInOrderAndWrapsWhenTheEndHasNoRoom) {
  RingSpans r(1000);
  size_t a, b, c;
  ASSERT_TRUE(r.reserve(400, 1, &a, 1));
  ASSERT_TRUE(r.reserve(400, 2, &b, 1));
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 400u);
  EXPECT_FALSE(r.reserve(300, 3, &c, 1)) << "200 bytes at the end, none at the start";
  r.retire(1);
  ASSERT_TRUE(r.reserve(300, 3, &c, 1));
  EXPECT_EQ(c, 0u) << "the end had 200 bytes: the span wraps to the start";
  EXPECT_FALSE(r.reserve(150, 4, &c, 1)) << "only [300, 400) is free";
  ASSERT_TRUE(r.reserve(100, 4, &c, 1));
  EXPECT_EQ(c, 300u);
}

TEST(RingSpans, FullRingAcceptsNothingUntilRetiredAndOversizedNever) {
  RingSpans r(512);
  size_t at;
  ASSERT_TRUE(r.reserve(256, 1, &at));
  ASSERT_TRUE(r.reserve(256, 2, &at));
  EXPECT_FALSE(r.reserve(1, 3, &at));
  r.retire(0);
  EXPECT_FALSE(r.reserve(1, 3, &at)) << "retiring nothing frees nothing";
  r.retire(2);
  EXPECT_TRUE(r.empty());
  EXPECT_TRUE(r.reserve(512, 3, &at));
  EXPECT_EQ(at, 0u);
  r.retire(3);
  EXPECT_FALSE(r.reserve(513, 4, &at)) << "larger than the ring";
  EXPECT_TRUE(r.reserve(0, 4, &at)) << "an empty request still takes one aligned unit";
}

// Random reserves and retires: no live span overlaps another or leaves the ring, and a request
// fails only when no hole of its size is where the next span must go.
TEST(RingSpans, RandomTrafficNeverOverlapsLiveSpans) {
  std::mt19937_64 rng(7);
  const size_t cap = 4096;
  RingSpans r(cap);
  std::map<uint64_t, std::pair<size_t, size_t>> live;  // op -> [offset, end)
  uint64_t op = 0, retired = 0;
  for (int step = 0; step < 20000; ++step) {
    if (rng() % 3 == 0 && retired < op) {
      retired += 1 + rng() % (op - retired);
      r.retire(retired);
      live.erase(live.begin(), live.upper_bound(retired));
      continue;
    }
    const size_t bytes = 1 + rng() % 1500;
    size_t at;
    if (!r.reserve(bytes, op + 1, &at, 64)) {
      EXPECT_FALSE(live.empty()) << "an empty ring refused " << bytes << " bytes";
      continue;
    }
    ++op;
    const size_t end = at + (bytes + 63) / 64 * 64;
    ASSERT_LE(end, cap);
    for (const auto& kv : live)
      ASSERT_TRUE(end <= kv.second.first || at >= kv.second.second)
          << "span [" << at << "," << end << ") overlaps live [" << kv.second.first << ","
          << kv.second.second << ")";
    live[op] = {at, end};
  }
  EXPECT_GT(op, 1000u);
}

}  // namespace

namespace {

// The parameter ring frees blocks oldest first, as their operations finish (in any order).
TEST(RingSpans, FrontAndPopFrontFreeTheOldestSpanFirst) {
  RingSpans r(1024);
  size_t a, b, front;
  ASSERT_TRUE(r.reserve(512, 1, &a));
  ASSERT_TRUE(r.reserve(512, 2, &b));
  ASSERT_TRUE(r.front(&front));
  EXPECT_EQ(front, a);
  r.popFront();
  ASSERT_TRUE(r.front(&front));
  EXPECT_EQ(front, b);
  size_t c;
  ASSERT_TRUE(r.reserve(512, 3, &c));
  EXPECT_EQ(c, a) << "the freed oldest block is reused";
  r.popFront();
  r.popFront();
  EXPECT_FALSE(r.front(&front));
}

}  // namespace
