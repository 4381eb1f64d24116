// The engine's pair header on the wire (engine_wire.h): every field survives a round trip, the
// send offers of pull operations included, and malformed or truncated headers are refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/engine_wire.h"

namespace fusco {
namespace {

PairHeader sample() {
  PairHeader h;
  h.kind = OpKind::Moe;
  h.call = 0xfedcba987ull;
  h.seq = 0x123456789abcull;
  h.status = 7;
  h.sendBytes = {14336, 0, 28672};
  h.recvBytes = {4096, 8192};
  h.recvTokens = {kStagedToken, 42};
  h.recvExtents = {4096, 8192 | kLayoutSharedBit};
  h.agree = {9, 16};
  return h;
}

void expectSame(const PairHeader& a, const PairHeader& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.call, b.call);
  EXPECT_EQ(a.seq, b.seq);
  EXPECT_EQ(a.status, b.status);
  EXPECT_EQ(a.sendBytes, b.sendBytes);
  EXPECT_EQ(a.recvBytes, b.recvBytes);
  EXPECT_EQ(a.recvTokens, b.recvTokens);
  EXPECT_EQ(a.recvExtents, b.recvExtents);
  EXPECT_EQ(a.sendTokens, b.sendTokens);
  EXPECT_EQ(a.sendExtents, b.sendExtents);
  EXPECT_EQ(a.agree, b.agree);
}

TEST(EngineWire, HeaderRoundTripsWithoutAndWithPullOffers) {
  for (bool pull : {false, true}) {
    PairHeader h = sample();
    if (pull) {
      h.sendTokens = {(3ull << 40) | 128, kStagedToken, 9};
      h.sendExtents = {1 << 20, 0, 28672};
    }
    std::vector<char> buf(1024);
    size_t len = 0;
    ASSERT_TRUE(encodeHeader(h, buf.data(), buf.size(), &len));
    PairHeader back;
    ASSERT_TRUE(decodeHeader(buf.data(), len, &back)) << "pull " << pull;
    expectSame(h, back);
    // The size the engine checks against a slot is exactly what the encoder writes.
    EXPECT_EQ(encodedHeaderBytes(h), len) << "pull " << pull;
    EXPECT_TRUE(encodeHeader(h, buf.data(), len, &len));
    EXPECT_FALSE(encodeHeader(h, buf.data(), len - 1, &len));
  }
}

TEST(EngineWire, HeaderWithMismatchedOffersOrTruncatedIsRefused) {
  std::vector<char> buf(1024);
  size_t len = 0;
  PairHeader h = sample();
  h.sendTokens = {1, 2};  // three messages sent, two offers
  h.sendExtents = {10, 20};
  ASSERT_TRUE(encodeHeader(h, buf.data(), buf.size(), &len));
  PairHeader back;
  EXPECT_FALSE(decodeHeader(buf.data(), len, &back));

  h = sample();
  h.sendTokens = {1, 2, 3};
  h.sendExtents = {10};  // extents do not match the offers
  ASSERT_TRUE(encodeHeader(h, buf.data(), buf.size(), &len));
  EXPECT_FALSE(decodeHeader(buf.data(), len, &back));

  h = sample();
  ASSERT_TRUE(encodeHeader(h, buf.data(), buf.size(), &len));
  for (size_t cut = 0; cut < len; ++cut)
    EXPECT_FALSE(decodeHeader(buf.data(), cut, &back)) << "cut at " << cut;
  // A slot too small to hold the header: encoding says so instead of writing past it.
  EXPECT_FALSE(encodeHeader(h, buf.data(), len - 1, &len));
}

// Two ranks a call apart (one left a call early) must never pair: the message names both call
// numbers and both operation numbers.
TEST(EngineWire, HeadersOfDifferentCallsAreOutOfStepNamingBothNumbers) {
  PairHeader mine = sample(), theirs = sample();
  std::string why;
  EXPECT_TRUE(pairInStep(mine, theirs, 2, &why));
  mine.call = 4, mine.seq = 17;
  theirs.call = 5, theirs.seq = 17;
  ASSERT_FALSE(pairInStep(mine, theirs, 2, &why));
  for (const char* part : {"rank 2", "call #5", "call #4", "operation #17"})
    EXPECT_NE(why.find(part), std::string::npos) << part << " in: " << why;
  theirs.call = 4, theirs.seq = 18;
  ASSERT_FALSE(pairInStep(mine, theirs, 2, &why));
  EXPECT_NE(why.find("operation #18"), std::string::npos) << why;
  EXPECT_NE(why.find("operation #17"), std::string::npos) << why;
}

// Call values that differ name the first differing value, both ranks and both values.
TEST(EngineWire, DifferingCallValuesNameTheValueBothRanksAndBothValues) {
  auto name = [](uint64_t v) { return "type" + std::to_string(v); };
  const std::vector<AgreeValue> mine = {{"datatype", 7, name}, {"hidden", 16}};
  std::string why;
  EXPECT_TRUE(valuesAgree(mine, {7, 16}, 0, 3, &why));
  ASSERT_FALSE(valuesAgree(mine, {7, 8}, 0, 3, &why));
  for (const char* part : {"hidden", "rank 3 passed 8", "rank 0 passed 16"})
    EXPECT_NE(why.find(part), std::string::npos) << part << " in: " << why;
  ASSERT_FALSE(valuesAgree(mine, {9, 8}, 0, 3, &why));
  EXPECT_NE(why.find("datatype differs"), std::string::npos) << why;
  EXPECT_NE(why.find("type9"), std::string::npos) << why;
  EXPECT_FALSE(valuesAgree(mine, {7}, 0, 3, &why));
}

}  // namespace
}  // namespace fusco
