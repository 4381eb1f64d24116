// MoE dispatch and combine (API.md, "MoE dispatch and combine") against the sequential reference
// in harness/moe_reference.h. Every rank regenerates every rank's routing and rows from the test
// seed, so the reference sees all inputs; each rank checks its own recvX (bit-exact, padding rows
// zero over a 0xA5 poison), numRecvRows, tokensPerLocalExpert, stats and combine `out`.
//
// Stats asserted (payload bytes this rank put on each path, self excluded):
//  - dispatch, RANK: one row per (token, distinct remote rank); NONE: one per (token, remote slot).
//  - combine, NONE: every received row goes back raw: rows * hidden * elemSize.
//  - combine, RANK: one partial row per (source token, this rank) back to the source, plus the
//    routing weights this rank ships to the expert side first (4 bytes per own (token, slot) whose
//    expert is on a remote rank; ones when topkWeights is NULL).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/moe_reference.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::kPoison;
using fusco::test::mix64;
using fusco::test::MoeRefDispatch;
using fusco::test::MoeRefProblem;
using fusco::test::MpOptions;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;

using Bytes2D = std::vector<std::vector<uint8_t>>;

constexpr double kPromptSec = 5.0;

enum class Route { Random, OneExpert, SomeExpertsIdle };

struct MoeCase {
  int nranks = 2;
  int numExperts = 8;
  int topk = 2;
  std::vector<size_t> numTokens;  // [nranks]
  int align = 0;
  std::vector<int> placement;  // empty: contiguous blocks
  int localSize = 0;           // config.localSize of the comm (0: env or one node)
  Route route = Route::Random;
  int unusedPercent = 15;  // chance that a slot is -1
  int fixedExpert = 0;     // Route::OneExpert
};

const char* dedupName(int d) {
  return d == FUSCO_DEDUP_NONE   ? "NONE"
         : d == FUSCO_DEDUP_RANK ? "RANK"
         : d == FUSCO_DEDUP_NODE ? "NODE"
                                 : "AUTO";
}

// Ranks per node the comm will use: config wins, then FUSCO_LOCAL_SIZE, else everything on one
// node.
int effectiveLocalSize(const MoeCase& c) {
  if (c.localSize > 0) return c.localSize;
  const char* env = std::getenv("FUSCO_LOCAL_SIZE");
  if (env && std::atoi(env) > 0) return std::atoi(env);
  return c.nranks;
}

MoeRefProblem makeProblem(const MoeCase& c, uint64_t seed) {
  MoeRefProblem p;
  p.nranks = c.nranks;
  p.numExperts = c.numExperts;
  p.placement = c.placement;
  p.expertAlignment = c.align;
  p.topk = c.topk;
  p.numTokens = c.numTokens;
  const int L = effectiveLocalSize(c);
  for (int r = 0; r < c.nranks; ++r) p.nodeOf.push_back(r / L);
  std::vector<int64_t> candidates;
  for (int e = 0; e < c.numExperts; ++e)
    if (c.route != Route::SomeExpertsIdle || e % 3 != 1) candidates.push_back(e);
  p.topkIdx.resize(c.nranks);
  for (int s = 0; s < c.nranks; ++s) {
    std::mt19937_64 rng(mix64(seed ^ (0x517ull + s)));
    auto& idx = p.topkIdx[s];
    idx.assign(c.numTokens[s] * c.topk, -1);
    for (size_t t = 0; t < c.numTokens[s]; ++t) {
      if (c.route == Route::OneExpert) {
        idx[t * c.topk + t % c.topk] = c.fixedExpert;
        continue;
      }
      std::shuffle(candidates.begin(), candidates.end(), rng);
      for (int k = 0; k < c.topk && k < static_cast<int>(candidates.size()); ++k)
        if (static_cast<int>(rng() % 100) >= c.unusedPercent) idx[t * c.topk + k] = candidates[k];
    }
  }
  return p;
}

// Row t of rank s: byte j depends on (seed, s, t, j); never 0, never the poison.
uint8_t rowByte(uint64_t seed, int s, size_t t, size_t j) {
  const uint64_t key =
      mix64(seed ^ (static_cast<uint64_t>(s) << 56) ^ (static_cast<uint64_t>(t) << 20));
  uint8_t b = static_cast<uint8_t>(mix64(key + (j >> 3)) >> (8 * (j & 7)));
  if (b == 0) b = 1;
  if (b == kPoison) b = 0x5A;
  return b;
}

Bytes2D makeRows(const MoeRefProblem& p, uint64_t seed, size_t rowBytes) {
  Bytes2D x(p.nranks);
  for (int s = 0; s < p.nranks; ++s) {
    x[s].resize(p.numTokens[s] * rowBytes);
    for (size_t t = 0; t < p.numTokens[s]; ++t)
      for (size_t j = 0; j < rowBytes; ++j) x[s][t * rowBytes + j] = rowByte(seed, s, t, j);
  }
  return x;
}

// Rows of `hidden` elements of dt whose values are nonzero multiples of 1/64 below 4 in magnitude
// (exact in every combine type), derived from (seed, s, t, j).
Bytes2D makeValueRows(const MoeRefProblem& p, uint64_t seed, fuscoDataType_t dt, size_t hidden) {
  const size_t es = fusco::test::dtypeSize(dt);
  Bytes2D x(p.nranks);
  for (int s = 0; s < p.nranks; ++s) {
    x[s].resize(p.numTokens[s] * hidden * es);
    for (size_t t = 0; t < p.numTokens[s]; ++t)
      for (size_t j = 0; j < hidden; ++j) {
        const uint64_t h = mix64(seed ^ (static_cast<uint64_t>(s) << 56) ^ (t << 24) ^ j);
        float v = static_cast<float>(h % 255 + 1) / 64.0f;
        if (h & 0x100) v = -v;
        fusco::test::refFromFloat(dt, v, x[s].data() + (t * hidden + j) * es);
      }
  }
  return x;
}

// What each row of rank r's recvX should hold, for messages.
std::vector<std::string> rowOrigins(const MoeRefProblem& p, const MoeRefDispatch& d, int r) {
  std::vector<std::string> o(d.numRecvRows[r], "a zero padding row");
  for (int s = 0; s < p.nranks; ++s)
    for (size_t t = 0; t < p.numTokens[s]; ++t)
      for (int k = 0; k < p.topk; ++k) {
        const int64_t e = p.topkIdx[s][t * p.topk + k];
        if (e < 0 || p.rankOfExpert(static_cast<int>(e)) != r) continue;
        o[d.slotRow[s][t * p.topk + k]] = "token " + std::to_string(t) + " of rank " +
                                          std::to_string(s) + " for expert " + std::to_string(e);
      }
  return o;
}

std::string identifyRow(const uint8_t* row, size_t rowBytes, const Bytes2D& x) {
  if (fusco::test::findNotPoison(row, rowBytes) == SIZE_MAX) return "unwritten (all poison)";
  bool zero = std::all_of(row, row + rowBytes, [](uint8_t b) { return b == 0; });
  if (zero) return "all zero";
  for (size_t s = 0; s < x.size(); ++s)
    for (size_t t = 0; t * rowBytes < x[s].size(); ++t)
      if (std::memcmp(row, x[s].data() + t * rowBytes, rowBytes) == 0)
        return "token " + std::to_string(t) + " of rank " + std::to_string(s);
  return "unknown bytes";
}

::testing::AssertionResult recvXMatches(const MoeRefProblem& p, const MoeRefDispatch& d, int r,
                                        const uint8_t* got, size_t rowBytes, const Bytes2D& x) {
  const auto& want = d.recvX[r];
  if (std::memcmp(want.data(), got, want.size()) == 0) return ::testing::AssertionSuccess();
  auto origins = rowOrigins(p, d, r);
  auto fail = ::testing::AssertionFailure();
  int shown = 0;
  for (size_t i = 0; i < d.numRecvRows[r] && shown < 3; ++i) {
    const uint8_t* w = want.data() + i * rowBytes;
    const uint8_t* g = got + i * rowBytes;
    if (std::memcmp(w, g, rowBytes) == 0) continue;
    size_t j = 0;
    while (w[j] == g[j]) ++j;
    fail << "\n  rank " << r << " recvX row " << i << " should be " << origins[i] << "; byte " << j
         << " expected " << fusco::test::hexBytes(w + j, 1) << " got "
         << fusco::test::hexBytes(g + j, 1) << "; the row holds " << identifyRow(g, rowBytes, x);
    ++shown;
  }
  return fail;
}

// Expected combine payload bytes this rank sends, per path (see the file comment).
void expectedCombineBytes(const MoeRefProblem& p, int me, int dedup, size_t rowOut, size_t* intra,
                          size_t* inter) {
  *intra = *inter = 0;
  for (int s = 0; s < p.nranks; ++s) {
    if (s == me) continue;
    size_t& acc = p.nodeOf[s] == p.nodeOf[me] ? *intra : *inter;
    for (size_t t = 0; t < p.numTokens[s]; ++t) {
      size_t slots = 0;
      for (int k = 0; k < p.topk; ++k) {
        const int64_t e = p.topkIdx[s][t * p.topk + k];
        if (e >= 0 && p.rankOfExpert(static_cast<int>(e)) == me) ++slots;
      }
      acc += (dedup == FUSCO_DEDUP_NONE ? slots : (slots > 0 ? 1 : 0)) * rowOut;
    }
  }
  if (dedup == FUSCO_DEDUP_NONE) return;
  for (size_t t = 0; t < p.numTokens[me]; ++t)
    for (int k = 0; k < p.topk; ++k) {
      const int64_t e = p.topkIdx[me][t * p.topk + k];
      if (e < 0) continue;
      const int r = p.rankOfExpert(static_cast<int>(e));
      if (r != me) (p.nodeOf[r] == p.nodeOf[me] ? *intra : *inter) += sizeof(float);
    }
}

fuscoConfig_t commConfig(const MoeCase& c, int timeoutMs = 60000) {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = timeoutMs;
  cfg.localSize = c.localSize;
  return cfg;
}

fuscoMoeConfig_t moeConfig(const MoeCase& c, int dedup) {
  fuscoMoeConfig_t m = FUSCO_MOE_CONFIG_INITIALIZER;
  m.numExperts = c.numExperts;
  m.expertToRank = c.placement.empty() ? nullptr : c.placement.data();
  m.dedup = dedup;
  m.expertAlignment = c.align;
  return m;
}

std::string caseName(const MoeCase& c, int dedup, size_t rowBytes) {
  std::ostringstream os;
  os << "[" << c.nranks << " ranks, " << c.numExperts << " experts, top-" << c.topk << ", rowBytes "
     << rowBytes << ", align " << c.align << ", dedup " << dedupName(dedup)
     << (c.placement.empty() ? "" : ", explicit placement") << ", tokens";
  for (size_t n : c.numTokens) os << " " << n;
  os << "]";
  return os.str();
}

// Plans on comm and checks the receive counts; returns the handle or nullptr (failure recorded).
fuscoMoeHandle_t planChecked(fuscoComm_t comm, const RankCtx& ctx, const MoeCase& c,
                             const MoeRefProblem& p, const MoeRefDispatch& d, int dedup,
                             const std::string& what) {
  fuscoMoeConfig_t m = moeConfig(c, dedup);
  fuscoMoeHandle_t h = nullptr;
  const auto& idx = p.topkIdx[ctx.rank];
  fuscoResult_t r = fuscoMoePlan(&h, comm, &m, idx.empty() ? nullptr : idx.data(),
                                 p.numTokens[ctx.rank], c.topk, nullptr);
  EXPECT_EQ(r, fuscoSuccess) << what << " fuscoMoePlan -> " << fuscoGetErrorString(r) << ": "
                             << fuscoGetLastError(comm);
  if (r != fuscoSuccess) return nullptr;
  const size_t nLocal = d.tokensPerLocalExpert[ctx.rank].size();
  std::vector<int64_t> perExpert(nLocal + 1, -7);
  size_t numRecv = 12345678;
  FUSCO_EXPECT_OK(comm, fuscoMoeGetRecvCounts(h, &numRecv, perExpert.data()));
  EXPECT_EQ(numRecv, d.numRecvRows[ctx.rank]) << what << " numRecvRows";
  perExpert.resize(nLocal);
  EXPECT_EQ(perExpert, d.tokensPerLocalExpert[ctx.rank]) << what << " tokensPerLocalExpert";
  size_t again = 0;
  FUSCO_EXPECT_OK(comm, fuscoMoeGetRecvCounts(h, &again, nullptr));
  EXPECT_EQ(again, numRecv) << what << " numRecvRows with tokensPerLocalExpert NULL";
  return h;
}

// Dispatch on h into a poisoned recvX; checks bytes and dispatch stats. Returns recvX.
std::vector<uint8_t> dispatchChecked(fuscoComm_t comm, fuscoMoeHandle_t h, const RankCtx& ctx,
                                     const MoeRefProblem& p, const MoeRefDispatch& d,
                                     const Bytes2D& x, size_t rowBytes, int dedup,
                                     const std::string& what) {
  const size_t n = d.numRecvRows[ctx.rank];
  std::vector<uint8_t> recvX(n * rowBytes + 1);
  fusco::test::poison(recvX.data(), recvX.size());
  const auto& mine = x[ctx.rank];
  fuscoResult_t r = fuscoMoeDispatch(h, mine.empty() ? nullptr : mine.data(), rowBytes,
                                     n == 0 ? nullptr : recvX.data(), nullptr);
  EXPECT_EQ(r, fuscoSuccess) << what << " fuscoMoeDispatch -> " << fuscoGetErrorString(r) << ": "
                             << fuscoGetLastError(comm);
  if (r != fuscoSuccess) return {};
  EXPECT_TRUE(recvXMatches(p, d, ctx.rank, recvX.data(), rowBytes, x)) << what;
  EXPECT_EQ(recvX.back(), kPoison) << what << " wrote past numRecvRows * rowBytes";
  recvX.pop_back();

  fuscoMoeStats_t st;
  std::memset(&st, 0x77, sizeof st);
  st.size = sizeof st;
  FUSCO_EXPECT_OK(comm, fuscoMoeGetStats(h, &st));
  if (dedup == FUSCO_DEDUP_RANK || dedup == FUSCO_DEDUP_NONE) {
    auto ref = fusco::test::moeRefSendStats(p, ctx.rank);
    const size_t intra = dedup == FUSCO_DEDUP_RANK ? ref.rankIntra : ref.noneIntra;
    const size_t inter = dedup == FUSCO_DEDUP_RANK ? ref.rankInter : ref.noneInter;
    EXPECT_EQ(st.dispatchRowsIntraNode, intra) << what << " dispatchRowsIntraNode";
    EXPECT_EQ(st.dispatchRowsInterNode, inter) << what << " dispatchRowsInterNode";
    EXPECT_EQ(st.dispatchBytesIntraNode, intra * rowBytes) << what << " dispatchBytesIntraNode";
    EXPECT_EQ(st.dispatchBytesInterNode, inter * rowBytes) << what << " dispatchBytesInterNode";
  }
  return recvX;
}

// Plan + dispatch + checks for every dedup mode in `modes` on one comm.
void runDispatchCase(fuscoComm_t comm, const RankCtx& ctx, const MoeCase& c, uint64_t seed,
                     size_t rowBytes, const std::vector<int>& modes) {
  MoeRefProblem p = makeProblem(c, seed);
  Bytes2D x = makeRows(p, seed + 1, rowBytes);
  MoeRefDispatch d = fusco::test::moeRefDispatch(p, x, rowBytes);
  for (int dedup : modes) {
    const std::string what = caseName(c, dedup, rowBytes);
    fuscoMoeHandle_t h = planChecked(comm, ctx, c, p, d, dedup, what);
    if (!h) continue;
    dispatchChecked(comm, h, ctx, p, d, x, rowBytes, dedup, what);
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  }
}

const std::vector<int> kAllModes = {FUSCO_DEDUP_NONE, FUSCO_DEDUP_RANK, FUSCO_DEDUP_AUTO};

std::vector<size_t> unevenTokens(int n, size_t base) {
  std::vector<size_t> t(n);
  for (int r = 0; r < n; ++r) t[r] = base + 17 * r;
  if (n > 1) t[1] = 0;
  if (n > 2) t[2] = 1;
  return t;
}

std::string ranksName(const ::testing::TestParamInfo<int>& i) {
  return std::to_string(i.param) + "ranks";
}

// ---------------------------------------------------------------- dispatch

class MoeDispatchRanks : public ::testing::TestWithParam<int> {};

TEST_P(MoeDispatchRanks, UnevenTokensMatchReferenceInEveryDedupMode) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(GetParam(), [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = ctx.nranks;
    c.numExperts = 4 * ctx.nranks;
    c.topk = std::min(4, c.numExperts);
    c.numTokens = unevenTokens(ctx.nranks, 23);
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    runDispatchCase(comm, ctx, c, seed, 36, kAllModes);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

INSTANTIATE_TEST_SUITE_P(Moe, MoeDispatchRanks, ::testing::Values(1, 2, 3, 4, 5, 8), ranksName);

TEST(MoeDispatch, ZeroTokensOnEveryRankGivesNoRows) {
  runRanks(3, [](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 3;
    c.numExperts = 6;
    c.numTokens = {0, 0, 0};
    c.align = 4;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    runDispatchCase(comm, ctx, c, 5, 64, kAllModes);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeDispatch, TopkOneToEightWithUnusedSlotsMatchesReference) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 3;
    c.numExperts = 24;
    c.numTokens = {40, 7, 31};
    c.unusedPercent = 30;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    for (int k = 1; k <= 8; ++k) {
      c.topk = k;
      runDispatchCase(comm, ctx, c, seed + k, 20, {FUSCO_DEDUP_NONE, FUSCO_DEDUP_RANK});
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeDispatch, RowBytesNotAMultipleOf16AreCopiedVerbatim) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(2, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 2;
    c.numExperts = 8;
    c.topk = 3;
    c.numTokens = {19, 12};
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    for (size_t rb : {size_t{1}, size_t{36}, size_t{7168 * 2 + 4}})
      runDispatchCase(comm, ctx, c, seed + rb, rb, kAllModes);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeDispatch, EveryTokenToOneExpertLeavesOtherExpertsEmpty) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 4;
    c.numExperts = 8;
    c.topk = 3;
    c.numTokens = {30, 0, 1, 45};
    c.route = Route::OneExpert;
    c.fixedExpert = 5;  // rank 2's second expert
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    runDispatchCase(comm, ctx, c, seed, 40, kAllModes);
    c.align = 16;
    runDispatchCase(comm, ctx, c, seed, 40, {FUSCO_DEDUP_RANK});
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeDispatch, ExpertsThatReceiveNothingGetEmptyBlocks) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 3;
    c.numExperts = 12;
    c.topk = 4;
    c.numTokens = {25, 33, 9};
    c.route = Route::SomeExpertsIdle;
    c.align = 4;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    runDispatchCase(comm, ctx, c, seed, 24, kAllModes);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeDispatch, ExplicitPlacementWithExpertsNotAMultipleOfRanks) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 3;
    c.numExperts = 10;
    c.topk = 4;
    c.numTokens = {28, 1, 36};
    c.placement = {2, 0, 1, 1, 2, 0, 2, 2, 1, 0};  // interleaved, uneven: 3, 3, 4 experts
    c.align = 1;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    runDispatchCase(comm, ctx, c, seed, 33, kAllModes);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeDispatch, ExpertAlignmentPadsEachBlockWithZeroRows) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 3;
    c.numExperts = 9;
    c.topk = 3;
    c.numTokens = {21, 5, 14};
    c.unusedPercent = 25;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    for (int align : {0, 1, 4, 16}) {
      c.align = align;
      runDispatchCase(comm, ctx, c, seed + align, 13, kAllModes);
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeDispatch, EightRanksWithPlacementAndAlignment) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(8, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 8;
    c.numExperts = 20;  // not a multiple of 8
    c.topk = 6;
    c.numTokens = {12, 0, 1, 30, 7, 19, 0, 25};
    for (int e = 0; e < c.numExperts; ++e) c.placement.push_back((e * 5 + 3) % 8);
    c.align = 4;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    runDispatchCase(comm, ctx, c, seed, 50, kAllModes);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeDispatch, LargeBf16HiddenTopEightMatchesReference) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 4;
    c.numExperts = 64;
    c.topk = 8;
    c.numTokens = {512, 512, 512, 512};
    c.unusedPercent = 5;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    runDispatchCase(comm, ctx, c, seed, 7168 * 2, {FUSCO_DEDUP_RANK});
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// ---------------------------------------------------------------- stats

TEST(MoeStats, TokenToTwoExpertsOnOneRankCrossesOnceWithRankDedup) {
  runRanks(2, [](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 2;
    c.numExperts = 4;  // experts 2, 3 on rank 1
    c.topk = 2;
    c.numTokens = {3, 0};
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    MoeRefProblem p = makeProblem(c, 1);
    p.topkIdx[0] = {2, 3, 3, 2, 0, 3};  // rows to rank 1: RANK 3, NONE 5
    Bytes2D x = makeRows(p, 9, 16);
    MoeRefDispatch d = fusco::test::moeRefDispatch(p, x, 16);
    for (int dedup : {FUSCO_DEDUP_RANK, FUSCO_DEDUP_NONE}) {
      fuscoMoeHandle_t h = planChecked(comm, ctx, c, p, d, dedup, dedupName(dedup));
      if (!h) continue;
      dispatchChecked(comm, h, ctx, p, d, x, 16, dedup, dedupName(dedup));
      fuscoMoeStats_t st{};
      st.size = sizeof st;
      FUSCO_EXPECT_OK(comm, fuscoMoeGetStats(h, &st));
      if (ctx.rank == 0) {
        EXPECT_EQ(st.dispatchRowsIntraNode, dedup == FUSCO_DEDUP_RANK ? 3u : 5u);
      }
      EXPECT_EQ(st.dispatchRowsInterNode, 0u);
      FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeStats, VirtualNodesSplitRowsBetweenIntraAndInterNode) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 4;
    c.numExperts = 16;
    c.topk = 5;
    c.numTokens = {33, 20, 0, 41};
    c.localSize = 2;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    int node = -1, numNodes = -1, lr = -1, ls = -1;
    FUSCO_EXPECT_OK(comm, fuscoCommNodeInfo(comm, &node, &numNodes, &lr, &ls));
    EXPECT_EQ(numNodes, 2);
    EXPECT_EQ(node, ctx.rank / 2);
    runDispatchCase(comm, ctx, c, seed, 72, kAllModes);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeStats, WrongStatsSizeOrNullIsInvalidArgument) {
  runRanks(2, [](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 2;
    c.numTokens = {4, 4};
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    MoeRefProblem p = makeProblem(c, 3);
    Bytes2D x = makeRows(p, 4, 8);
    MoeRefDispatch d = fusco::test::moeRefDispatch(p, x, 8);
    fuscoMoeHandle_t h = planChecked(comm, ctx, c, p, d, FUSCO_DEDUP_RANK, "stats");
    ASSERT_NE(h, nullptr);
    fuscoMoeStats_t st;
    std::memset(&st, 0x33, sizeof st);
    st.size = sizeof st - 8;
    EXPECT_EQ(fuscoMoeGetStats(h, &st), fuscoInvalidArgument);
    EXPECT_EQ(st.dispatchRowsIntraNode, 0x3333333333333333ull) << "written on failure";
    EXPECT_EQ(fuscoMoeGetStats(h, nullptr), fuscoInvalidArgument);
    EXPECT_EQ(fuscoMoeGetStats(nullptr, &st), fuscoInvalidArgument);
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// ---------------------------------------------------------------- combine

struct CombineSetup {
  MoeCase c;
  MoeRefProblem p;
  Bytes2D x;  // dispatch input: hidden elements of dt per row
  MoeRefDispatch d;
  Bytes2D expertOut;                        // [rank] per-row transform of the reference recvX
  std::vector<std::vector<float>> weights;  // [rank][token * topk]
  fuscoDataType_t dt;
  size_t hidden;
};

CombineSetup makeCombine(const MoeCase& c, uint64_t seed, fuscoDataType_t dt, size_t hidden) {
  CombineSetup s{c, makeProblem(c, seed), {}, {}, {}, {}, dt, hidden};
  const size_t es = fusco::test::dtypeSize(dt), rowOut = hidden * es;
  // Token 0 of every rank has no valid expert: its output must be zeros.
  for (auto& idx : s.p.topkIdx)
    for (int k = 0; k < c.topk && !idx.empty(); ++k) idx[k] = -1;
  s.x = makeValueRows(s.p, seed + 1, dt, hidden);
  s.d = fusco::test::moeRefDispatch(s.p, s.x, rowOut);
  s.expertOut.resize(c.nranks);
  s.weights.resize(c.nranks);
  for (int r = 0; r < c.nranks; ++r) {
    const auto& in = s.d.recvX[r];
    auto& out = s.expertOut[r];
    out.resize(in.size());
    for (size_t i = 0; i * rowOut < in.size(); ++i) {
      const float scale = 1.0f + static_cast<float>((r * 5 + i) % 4) * 0.3f;
      for (size_t j = 0; j < hidden; ++j) {
        const size_t off = (i * hidden + j) * es;
        fusco::test::refFromFloat(dt, fusco::test::refToFloat(dt, in.data() + off) * scale,
                                  out.data() + off);
      }
    }
    std::mt19937 rng(static_cast<uint32_t>(mix64(seed ^ (0xabcull + r))));
    std::uniform_real_distribution<float> u(0.05f, 1.2f);
    for (size_t k = 0; k < s.p.numTokens[r] * c.topk; ++k) s.weights[r].push_back(u(rng));
  }
  return s;
}

::testing::AssertionResult outMatches(const CombineSetup& s, const std::vector<uint8_t>& want,
                                      const std::vector<uint8_t>& got, int rank) {
  if (want == got) return ::testing::AssertionSuccess();
  if (want.size() != got.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  const size_t es = fusco::test::dtypeSize(s.dt);
  auto fail = ::testing::AssertionFailure();
  int shown = 0;
  for (size_t i = 0; i < want.size() / es && shown < 4; ++i) {
    if (std::memcmp(want.data() + i * es, got.data() + i * es, es) == 0) continue;
    fail << "\n  rank " << rank << " out token " << i / s.hidden << " element " << i % s.hidden
         << ": expected " << fusco::test::refToFloat(s.dt, want.data() + i * es) << " ("
         << fusco::test::hexBytes(want.data() + i * es, es) << ") got "
         << fusco::test::refToFloat(s.dt, got.data() + i * es) << " ("
         << fusco::test::hexBytes(got.data() + i * es, es) << ")";
    ++shown;
  }
  return fail;
}

// Plans, dispatches (checked), combines twice with and without weights and checks `out` bitwise
// against the reference and the combine stats. Returns the outputs (weighted, unweighted).
std::vector<std::vector<uint8_t>> combineChecked(fuscoComm_t comm, const RankCtx& ctx,
                                                 const CombineSetup& s, int dedup) {
  const std::string what = caseName(s.c, dedup, s.hidden) + " " + fusco::test::dtypeName(s.dt);
  const size_t es = fusco::test::dtypeSize(s.dt), rowOut = s.hidden * es;
  std::vector<std::vector<uint8_t>> results;
  fuscoMoeHandle_t h = planChecked(comm, ctx, s.c, s.p, s.d, dedup, what);
  if (!h) return results;
  auto recvX = dispatchChecked(comm, h, ctx, s.p, s.d, s.x, rowOut, dedup, what);
  const auto& eo = s.expertOut[ctx.rank];
  const size_t nTok = s.p.numTokens[ctx.rank];
  for (bool weighted : {true, false}) {
    std::vector<std::vector<float>> w;
    if (weighted) w = s.weights;
    auto want = fusco::test::moeRefCombine(s.p, s.d, s.expertOut, s.dt, s.hidden, w)[ctx.rank];
    std::vector<uint8_t> first;
    for (int rep = 0; rep < 2; ++rep) {
      std::vector<uint8_t> out(nTok * rowOut + 1);
      fusco::test::poison(out.data(), out.size());
      fuscoResult_t r = fuscoMoeCombine(h, eo.empty() ? nullptr : eo.data(), s.dt, s.hidden,
                                        weighted && nTok ? s.weights[ctx.rank].data() : nullptr,
                                        nTok ? out.data() : nullptr, nullptr);
      EXPECT_EQ(r, fuscoSuccess) << what << " fuscoMoeCombine -> " << fuscoGetErrorString(r) << ": "
                                 << fuscoGetLastError(comm);
      if (r != fuscoSuccess) break;
      EXPECT_EQ(out.back(), kPoison) << what << " combine wrote past the output";
      out.pop_back();
      EXPECT_TRUE(outMatches(s, want, out, ctx.rank))
          << what << (weighted ? " with weights" : " with NULL weights") << ", call " << rep + 1;
      if (rep == 0)
        first = out;
      else
        EXPECT_TRUE(first == out) << what << " second combine differs from the first";
      fuscoMoeStats_t st{};
      st.size = sizeof st;
      FUSCO_EXPECT_OK(comm, fuscoMoeGetStats(h, &st));
      if (dedup == FUSCO_DEDUP_NONE || dedup == FUSCO_DEDUP_RANK) {
        size_t intra = 0, inter = 0;
        expectedCombineBytes(s.p, ctx.rank, dedup, rowOut, &intra, &inter);
        EXPECT_EQ(st.combineBytesIntraNode, intra) << what << " combineBytesIntraNode";
        EXPECT_EQ(st.combineBytesInterNode, inter) << what << " combineBytesInterNode";
      }
    }
    results.push_back(first);
  }
  FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  return results;
}

// Runs combineChecked in NONE, RANK and AUTO and checks they agree bitwise.
void combineAllModes(fuscoComm_t comm, const RankCtx& ctx, const CombineSetup& s) {
  auto none = combineChecked(comm, ctx, s, FUSCO_DEDUP_NONE);
  auto rank = combineChecked(comm, ctx, s, FUSCO_DEDUP_RANK);
  auto autoMode = combineChecked(comm, ctx, s, FUSCO_DEDUP_AUTO);
  EXPECT_TRUE(none == rank) << "combine NONE and RANK differ on rank " << ctx.rank;
  EXPECT_TRUE(none == autoMode) << "combine NONE and AUTO differ on rank " << ctx.rank;
}

class MoeCombineTypes : public ::testing::TestWithParam<fuscoDataType_t> {};

TEST_P(MoeCombineTypes, OutMatchesReferenceTreeInEveryDedupMode) {
  const uint64_t seed = fusco::test::testSeed();
  const fuscoDataType_t dt = GetParam();
  runRanks(3, [seed, dt](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 3;
    c.numExperts = 12;
    c.topk = 6;
    c.numTokens = {37, 1, 22};
    c.unusedPercent = 20;
    c.align = 4;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    combineAllModes(comm, ctx, makeCombine(c, seed, dt, 67));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

INSTANTIATE_TEST_SUITE_P(Moe, MoeCombineTypes,
                         ::testing::Values(fuscoFloat32, fuscoBfloat16, fuscoFloat16),
                         [](const ::testing::TestParamInfo<fuscoDataType_t>& i) {
                           return std::string(fusco::test::dtypeName(i.param));
                         });

TEST(MoeCombine, ZeroTokensOnSomeRanksAndExplicitPlacement) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 4;
    c.numExperts = 7;
    c.topk = 3;
    c.numTokens = {0, 26, 1, 18};
    c.placement = {3, 3, 1, 0, 2, 1, 0};
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    combineAllModes(comm, ctx, makeCombine(c, seed, fuscoBfloat16, 40));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeCombine, VirtualNodesFollowTheNodeLevelOfTheTree) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(5, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 5;
    c.numExperts = 15;
    c.topk = 8;
    c.numTokens = {24, 11, 0, 30, 9};
    c.localSize = 2;  // nodes {0,1} {2,3} {4}
    c.unusedPercent = 10;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    for (fuscoDataType_t dt : {fuscoBfloat16, fuscoFloat16})
      combineAllModes(comm, ctx, makeCombine(c, seed + dt, dt, 48));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// ---------------------------------------------------------------- bad input

fuscoConfig_t badConfig() {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = 20000;
  return cfg;
}

bool isPeerError(fuscoResult_t r) { return r == fuscoInvalidUsage || r == fuscoRemoteError; }

// A correct plan + dispatch + combine still works on comm.
void expectUsable(fuscoComm_t comm, const RankCtx& ctx, const std::string& after) {
  SCOPED_TRACE("comm usable after " + after);
  MoeCase c;
  c.nranks = ctx.nranks;
  c.numExperts = 2 * ctx.nranks;
  c.topk = 2;
  c.numTokens.assign(ctx.nranks, 9);
  combineChecked(comm, ctx, makeCombine(c, 77, fuscoFloat32, 8), FUSCO_DEDUP_RANK);
}

// One rank's routing is bad: it gets fuscoInvalidArgument naming token and slot, the others an
// error promptly; nobody gets a handle.
void expectBadRouting(int badToken, int badSlot, int64_t badValue, bool duplicate,
                      const char* what) {
  runRanks(4, [=](const RankCtx& ctx) {
    fuscoConfig_t cfg = badConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    MoeCase c;
    c.nranks = 4;
    c.numExperts = 8;
    c.topk = 3;
    c.numTokens.assign(4, 10);
    MoeRefProblem p = makeProblem(c, 21);
    const int badRank = 2;
    auto idx = p.topkIdx[ctx.rank];
    if (ctx.rank == badRank) {
      int64_t* row = idx.data() + badToken * 3;
      if (duplicate) {  // slots 0 and badSlot (> 0) both name expert 4
        for (int k = 0; k < 3; ++k) row[k] = 5 + k;
        row[0] = row[badSlot] = 4;
      } else {
        row[badSlot] = badValue;
      }
    }
    fuscoMoeConfig_t m = moeConfig(c, FUSCO_DEDUP_RANK);
    fuscoMoeHandle_t h = reinterpret_cast<fuscoMoeHandle_t>(0x1);
    const double t0 = nowSec();
    fuscoResult_t r = fuscoMoePlan(&h, comm, &m, idx.data(), 10, 3, nullptr);
    const double sec = nowSec() - t0;
    const std::string msg = fuscoGetLastError(comm);
    EXPECT_LT(sec, kPromptSec) << what;
    EXPECT_EQ(h, reinterpret_cast<fuscoMoeHandle_t>(0x1)) << what << ": handle written on failure";
    if (ctx.rank == badRank) {
      EXPECT_EQ(r, fuscoInvalidArgument) << what << ": " << fuscoGetErrorString(r) << ": " << msg;
      EXPECT_TRUE(std::regex_search(
          msg, std::regex("token\\s*#?\\s*" + std::to_string(badToken) + "\\b", std::regex::icase)))
          << what << ": message '" << msg << "' should name token " << badToken;
      EXPECT_TRUE(std::regex_search(
          msg, std::regex("slot\\s*#?\\s*" + std::to_string(badSlot) + "\\b", std::regex::icase)))
          << what << ": message '" << msg << "' should name slot " << badSlot;
    } else {
      EXPECT_TRUE(isPeerError(r)) << what << ": peer got " << fuscoGetErrorString(r) << ": " << msg;
      EXPECT_NE(msg.find(std::to_string(badRank)), std::string::npos)
          << what << ": '" << msg << "'";
    }
    expectUsable(comm, ctx, what);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeBadInput, ExpertIdOutOfRangeOnOneRankFailsEveryRankPromptly) {
  expectBadRouting(6, 1, 8, false, "expert id 8 of 8");
}

TEST(MoeBadInput, NegativeExpertIdBelowMinusOneIsInvalid) {
  expectBadRouting(3, 2, -2, false, "expert id -2");
}

TEST(MoeBadInput, DuplicateExpertInOneTokenOnOneRankFailsEveryRankPromptly) {
  expectBadRouting(4, 2, 0, true, "duplicate expert in token 4");
}

// Every rank passes the same bad argument to fuscoMoePlan: fuscoInvalidArgument everywhere.
void expectPlanInvalidEverywhere(const std::function<void(fuscoMoeConfig_t*)>& spoil,
                                 const char* what, bool nullHandle = false) {
  runRanks(3, [=](const RankCtx& ctx) {
    fuscoConfig_t cfg = badConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    MoeCase c;
    c.nranks = 3;
    c.numExperts = 6;
    c.topk = 2;
    c.numTokens.assign(3, 5);
    MoeRefProblem p = makeProblem(c, 8);
    fuscoMoeConfig_t m = moeConfig(c, FUSCO_DEDUP_AUTO);
    spoil(&m);
    fuscoMoeHandle_t h = nullptr;
    const double t0 = nowSec();
    fuscoResult_t r = fuscoMoePlan(nullHandle ? nullptr : &h, comm, &m, p.topkIdx[ctx.rank].data(),
                                   5, 2, nullptr);
    EXPECT_LT(nowSec() - t0, kPromptSec) << what;
    EXPECT_EQ(r, fuscoInvalidArgument)
        << what << ": " << fuscoGetErrorString(r) << ": " << fuscoGetLastError(comm);
    EXPECT_STRNE(fuscoGetLastError(comm), "") << what;
    EXPECT_EQ(h, nullptr) << what;
    expectUsable(comm, ctx, what);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeBadInput, NumExpertsNotAMultipleOfRanksWithoutPlacementIsInvalidArgument) {
  expectPlanInvalidEverywhere([](fuscoMoeConfig_t* m) { m->numExperts = 7; },
                              "7 experts on 3 ranks");
}

TEST(MoeBadInput, MoeConfigWithBadSizeIsInvalidArgument) {
  expectPlanInvalidEverywhere([](fuscoMoeConfig_t* m) { m->size = sizeof(*m) + 8; }, "config.size");
}

TEST(MoeBadInput, MoeConfigWithBadMagicIsInvalidArgument) {
  expectPlanInvalidEverywhere([](fuscoMoeConfig_t* m) { m->magic = 0x12345678u; }, "config.magic");
}

TEST(MoeBadInput, NullHandlePointerInPlanIsInvalidArgument) {
  expectPlanInvalidEverywhere([](fuscoMoeConfig_t*) {}, "NULL handle pointer", true);
}

TEST(MoeBadInput, BadMoeConfigOnOneRankFailsEveryRank) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = badConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    MoeCase c;
    c.nranks = 3;
    c.numExperts = 6;
    c.numTokens.assign(3, 5);
    MoeRefProblem p = makeProblem(c, 8);
    fuscoMoeConfig_t m = moeConfig(c, FUSCO_DEDUP_RANK);
    if (ctx.rank == 1) m.magic = 0;
    fuscoMoeHandle_t h = nullptr;
    const double t0 = nowSec();
    fuscoResult_t r = fuscoMoePlan(&h, comm, &m, p.topkIdx[ctx.rank].data(), 5, 2, nullptr);
    EXPECT_LT(nowSec() - t0, kPromptSec);
    if (ctx.rank == 1)
      EXPECT_EQ(r, fuscoInvalidArgument) << fuscoGetLastError(comm);
    else
      EXPECT_TRUE(isPeerError(r)) << fuscoGetErrorString(r) << ": " << fuscoGetLastError(comm);
    EXPECT_EQ(h, nullptr);
    expectUsable(comm, ctx, "bad magic on rank 1");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeBadInput, NullHandleInEveryHandleCallIsInvalidArgument) {
  size_t n = 0;
  std::vector<uint8_t> buf(64);
  fuscoMoeStats_t st{};
  st.size = sizeof st;
  EXPECT_EQ(fuscoMoeGetRecvCounts(nullptr, &n, nullptr), fuscoInvalidArgument);
  EXPECT_EQ(fuscoMoeDispatch(nullptr, buf.data(), 8, buf.data(), nullptr), fuscoInvalidArgument);
  EXPECT_EQ(fuscoMoeCombine(nullptr, buf.data(), fuscoFloat32, 4, nullptr, buf.data(), nullptr),
            fuscoInvalidArgument);
  EXPECT_EQ(fuscoMoeGetStats(nullptr, &st), fuscoInvalidArgument);
  EXPECT_EQ(fuscoMoeHandleDestroy(nullptr), fuscoInvalidArgument);
  EXPECT_STRNE(fuscoGetLastError(nullptr), "");
}

// A handle-level call with a bad argument on every rank: fuscoInvalidArgument everywhere, promptly,
// and the same handle still works afterwards.
TEST(MoeBadInput, RowBytesZeroAndBadCombineDatatypeFailEveryRankAndHandleStaysUsable) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = badConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    MoeCase c;
    c.nranks = 3;
    c.numExperts = 6;
    c.topk = 2;
    c.numTokens = {6, 3, 8};
    CombineSetup s = makeCombine(c, seed, fuscoFloat32, 16);
    fuscoMoeHandle_t h = planChecked(comm, ctx, c, s.p, s.d, FUSCO_DEDUP_RANK, "bad args");
    ASSERT_NE(h, nullptr);
    std::vector<uint8_t> recvX(s.d.numRecvRows[ctx.rank] * 64 + 64),
        out(s.p.numTokens[ctx.rank] * 64 + 64);
    double t0 = nowSec();
    fuscoResult_t r = fuscoMoeDispatch(h, s.x[ctx.rank].data(), 0, recvX.data(), nullptr);
    EXPECT_LT(nowSec() - t0, kPromptSec);
    EXPECT_EQ(r, fuscoInvalidArgument) << "rowBytes 0: " << fuscoGetLastError(comm);
    // rowBytes 0 on one rank only.
    t0 = nowSec();
    r = fuscoMoeDispatch(h, s.x[ctx.rank].data(), ctx.rank == 0 ? 0 : 64, recvX.data(), nullptr);
    EXPECT_LT(nowSec() - t0, kPromptSec);
    if (ctx.rank == 0)
      EXPECT_EQ(r, fuscoInvalidArgument) << fuscoGetLastError(comm);
    else
      EXPECT_TRUE(isPeerError(r)) << "rowBytes 0 on rank 0: " << fuscoGetErrorString(r) << ": "
                                  << fuscoGetLastError(comm);
    dispatchChecked(comm, h, ctx, s.p, s.d, s.x, 64, FUSCO_DEDUP_RANK, "dispatch after rowBytes 0");

    for (fuscoDataType_t bad : {fuscoInt32, fuscoFloat64, static_cast<fuscoDataType_t>(99)}) {
      t0 = nowSec();
      r = fuscoMoeCombine(h, s.expertOut[ctx.rank].data(), bad, 16, nullptr, out.data(), nullptr);
      EXPECT_LT(nowSec() - t0, kPromptSec);
      EXPECT_EQ(r, fuscoInvalidArgument) << "datatype " << bad << ": " << fuscoGetLastError(comm);
    }
    t0 = nowSec();
    r = fuscoMoeCombine(h, s.expertOut[ctx.rank].data(), ctx.rank == 2 ? fuscoInt32 : fuscoFloat32,
                        16, nullptr, out.data(), nullptr);
    EXPECT_LT(nowSec() - t0, kPromptSec);
    if (ctx.rank == 2)
      EXPECT_EQ(r, fuscoInvalidArgument) << fuscoGetLastError(comm);
    else
      EXPECT_TRUE(isPeerError(r)) << "int32 on rank 2: " << fuscoGetErrorString(r) << ": "
                                  << fuscoGetLastError(comm);
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    expectUsable(comm, ctx, "bad combine datatype");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace
