// fuscoMoeReplan (docs/API.md, "Replanning a handle"): a handle replanned in place for the next
// layer gives exactly what a new plan gives (receive counts, recvX, combine `out`, stats) in every
// dedup mode, for routings with more, fewer and no tokens and another topk; a replan fails like
// fuscoMoePlan (same codes on every rank, promptly) and leaves every rank's handle refusing
// dispatch, combine and the receive counts until a replan succeeds; and a replan that fits in
// what the handle holds allocates none of its lists again (checked through the internal
// api/moe_inspect.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "api/moe_inspect.h"
#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/moe_reference.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::combineOnHandle;
using fusco::test::CombineSetup;
using fusco::test::commConfig;
using fusco::test::dedupName;
using fusco::test::initComm;
using fusco::test::kAllModes;
using fusco::test::makeCombine;
using fusco::test::makeCombineFor;
using fusco::test::MoeCase;
using fusco::test::moeConfig;
using fusco::test::MoeRefProblem;
using fusco::test::nowSec;
using fusco::test::planChecked;
using fusco::test::RankCtx;
using fusco::test::ranksName;
using fusco::test::recvCountsChecked;
using fusco::test::runRanks;
using Storage = std::vector<fusco::ListStorage>;

constexpr double kPromptSec = 5.0;

std::string what(const CombineSetup& s, int dedup, const std::string& step) {
  return fusco::test::caseName(s.c, dedup, s.hidden) + " " + step;
}

const int64_t* routingOf(const CombineSetup& s, int rank) {
  return s.p.topkIdx[rank].empty() ? nullptr : s.p.topkIdx[rank].data();
}

// Replans h for s (every rank does), then checks the receive counts and that the stats start
// from zero, as a new handle's do.
bool replanChecked(fuscoComm_t comm, fuscoMoeHandle_t h, const RankCtx& ctx, const CombineSetup& s,
                   const std::string& step) {
  const fuscoResult_t r =
      fuscoMoeReplan(h, routingOf(s, ctx.rank), s.p.numTokens[ctx.rank], s.c.topk, nullptr);
  EXPECT_EQ(r, fuscoSuccess) << step << " fuscoMoeReplan -> " << fuscoGetErrorString(r) << ": "
                             << fuscoGetLastError(comm);
  if (r != fuscoSuccess) return false;
  recvCountsChecked(comm, h, ctx, s.d, step);
  fuscoMoeStats_t st;
  std::memset(&st, 0x77, sizeof st);
  st.size = sizeof st;
  FUSCO_EXPECT_OK(comm, fuscoMoeGetStats(h, &st));
  fuscoMoeStats_t zero{};
  zero.size = sizeof zero;
  EXPECT_EQ(std::memcmp(&st, &zero, sizeof st), 0) << step << ": stats after a replan are not 0";
  return true;
}

// What a layer gives on a handle: combineOnHandle's outputs (checked against the reference),
// its recvX and the stats after it.
struct LayerBytes {
  std::vector<std::vector<uint8_t>> out;
  std::vector<uint8_t> recvX;
  fuscoMoeStats_t stats{};
};

LayerBytes runLayer(fuscoComm_t comm, fuscoMoeHandle_t h, const RankCtx& ctx, const CombineSetup& s,
                    int dedup) {
  LayerBytes b;
  b.out = combineOnHandle(comm, h, ctx, s, dedup, &b.recvX);
  b.stats.size = sizeof b.stats;
  FUSCO_EXPECT_OK(comm, fuscoMoeGetStats(h, &b.stats));
  return b;
}

// The same layer on a handle made for it by fuscoMoePlan.
LayerBytes freshLayer(fuscoComm_t comm, const RankCtx& ctx, const CombineSetup& s, int dedup) {
  fuscoMoeHandle_t h = planChecked(comm, ctx, s.c, s.p, s.d, dedup, what(s, dedup, "fresh plan"));
  if (h == nullptr) return {};
  LayerBytes b = runLayer(comm, h, ctx, s, dedup);
  FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  return b;
}

void expectSameBytes(const LayerBytes& replanned, const LayerBytes& fresh, const std::string& w) {
  EXPECT_TRUE(replanned.recvX == fresh.recvX) << w << ": recvX differs from a fresh plan's";
  EXPECT_TRUE(replanned.out == fresh.out) << w << ": combine out differs from a fresh plan's";
  EXPECT_EQ(std::memcmp(&replanned.stats, &fresh.stats, sizeof fresh.stats), 0)
      << w << ": stats differ from a fresh plan's";
}

// Layer i of the changing routing on n ranks (the config fields stay those of layer 0): more
// tokens, fewer with an empty rank, another topk, no tokens on rank 0, then layer 1 again.
MoeCase layerCase(int n, int layer) {
  MoeCase c;
  c.nranks = n;
  c.numExperts = n % 2 ? 3 * n + 1 : 4 * n;
  if (n % 2)
    for (int e = 0; e < c.numExperts; ++e) c.placement.push_back((e * 7 + 3) % n);
  c.align = 4;
  static const int kTopk[] = {4, 4, 4, 2, 6, 4};
  c.topk = std::min(kTopk[layer], c.numExperts);
  c.numTokens.resize(n);
  for (int r = 0; r < n; ++r) {
    static const size_t kBase[] = {20, 45, 9, 30, 25, 45}, kStep[] = {7, 11, 3, 5, 3, 11};
    c.numTokens[r] = kBase[layer] + kStep[layer] * r;
  }
  if (layer == 2) c.numTokens[1] = 0, c.numTokens[n - 1] = 1;
  if (layer == 4) c.numTokens[0] = 0;
  return c;
}
constexpr int kLayers = 6;

class MoeReplanRanks : public ::testing::TestWithParam<int> {};

TEST_P(MoeReplanRanks, ChangingRoutingMatchesReferenceAndFreshPlansInEveryDedupMode) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(GetParam(), [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = commConfig(layerCase(ctx.nranks, 0));
    fuscoComm_t comm = initComm(ctx, &cfg);
    for (int dedup : kAllModes) {
      fuscoMoeHandle_t h = nullptr;
      for (int layer = 0; layer < kLayers; ++layer) {
        const uint64_t layerSeed = seed + 31 * (layer == 5 ? 1 : layer);
        const CombineSetup s =
            makeCombine(layerCase(ctx.nranks, layer), layerSeed, fuscoBfloat16, 24);
        const std::string w = what(s, dedup, "layer " + std::to_string(layer));
        if (layer == 0)
          h = planChecked(comm, ctx, s.c, s.p, s.d, dedup, w);
        else if (!replanChecked(comm, h, ctx, s, w))
          break;
        if (h == nullptr) break;
        const LayerBytes replanned = runLayer(comm, h, ctx, s, dedup);
        expectSameBytes(replanned, freshLayer(comm, ctx, s, dedup), w);
      }
      if (h != nullptr) FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

INSTANTIATE_TEST_SUITE_P(Moe, MoeReplanRanks, ::testing::Values(2, 3, 4, 5, 8), ranksName);

// ---------------------------------------------------------------- errors

bool isPeerError(fuscoResult_t r) { return r == fuscoInvalidUsage || r == fuscoRemoteError; }

// One rank's arguments to a plan or a replan.
struct Args {
  const int64_t* topkIdx;
  size_t numTokens;
  int topk;
  void* stream;
};

// Dispatch, combine and the receive counts (host and device) on an unplanned handle:
// fuscoInvalidUsage on this rank alone, at once, saying that the last replan failed; the stats
// still answer.
void expectUnplanned(fuscoComm_t comm, fuscoMoeHandle_t h, const CombineSetup& s, int rank,
                     const std::string& w) {
  std::vector<uint8_t> buf(1 << 16);
  const double t0 = nowSec();
  const auto& x = s.x[rank];
  const fuscoResult_t rd =
      fuscoMoeDispatch(h, x.empty() ? nullptr : x.data(), 4, buf.data(), nullptr);
  const std::string msg = fuscoGetLastError(comm);
  const fuscoResult_t rc =
      fuscoMoeCombine(h, buf.data(), fuscoFloat32, 4, nullptr, buf.data(), nullptr);
  size_t rows = 12345;
  const fuscoResult_t rn = fuscoMoeGetRecvCounts(h, &rows, nullptr);
  EXPECT_LT(nowSec() - t0, kPromptSec) << w;
  EXPECT_EQ(rd, fuscoInvalidUsage) << w << ": dispatch on an unplanned handle: " << msg;
  EXPECT_NE(msg.find("fuscoMoeReplan failed"), std::string::npos) << w << ": '" << msg << "'";
  EXPECT_EQ(rc, fuscoInvalidUsage) << w << ": combine on an unplanned handle";
  EXPECT_EQ(rn, fuscoInvalidUsage) << w << ": receive counts of an unplanned handle";
  EXPECT_EQ(rows, 12345u) << w << ": numRecvRows written on failure";
  // The device variant refuses alike (on any planner), before saying anything of the planner,
  // and writes neither pointer: the counts it would point at are the rejected routing's.
  const int64_t* const unset = reinterpret_cast<const int64_t*>(&rows);
  const int64_t *devRows = unset, *devPerExpert = unset;
  const fuscoResult_t rv = fuscoMoeGetRecvCountsDevice(h, &devRows, &devPerExpert);
  const std::string dmsg = fuscoGetLastError(nullptr);
  EXPECT_EQ(rv, fuscoInvalidUsage) << w << ": device receive counts of an unplanned handle";
  EXPECT_NE(dmsg.find("fuscoMoeGetRecvCountsDevice"), std::string::npos) << w << ": '" << dmsg;
  EXPECT_NE(dmsg.find("fuscoMoeReplan failed"), std::string::npos) << w << ": '" << dmsg << "'";
  EXPECT_EQ(devRows, unset) << w << ": numRecvRows written on failure";
  EXPECT_EQ(devPerExpert, unset) << w << ": tokensPerLocalExpert written on failure";
  fuscoMoeStats_t st{};
  st.size = sizeof st;
  FUSCO_EXPECT_OK(comm, fuscoMoeGetStats(h, &st));
}

// `bad` fails fuscoMoePlan somewhere; fuscoMoeReplan with it then returns, on every rank and
// promptly, what fuscoMoePlan returned there, and leaves the handle unplanned on every rank; a
// replan with `next` makes it exact again. Returns this rank's replan result and message.
std::pair<fuscoResult_t, std::string> expectReplanFailsLikePlan(
    fuscoComm_t comm, const RankCtx& ctx, const CombineSetup& first, const CombineSetup& next,
    const Args& bad, int dedup, const std::string& w) {
  const fuscoMoeConfig_t m = moeConfig(first.c, dedup);
  fuscoMoeHandle_t none = nullptr;
  const fuscoResult_t planned =
      fuscoMoePlan(&none, comm, &m, bad.topkIdx, bad.numTokens, bad.topk, bad.stream);
  EXPECT_NE(planned, fuscoSuccess) << w << ": the bad arguments must fail fuscoMoePlan";
  fuscoMoeHandle_t h = planChecked(comm, ctx, first.c, first.p, first.d, dedup, w);
  if (h == nullptr) return {fuscoInternalError, ""};
  combineOnHandle(comm, h, ctx, first, dedup);
  const double t0 = nowSec();
  const fuscoResult_t r = fuscoMoeReplan(h, bad.topkIdx, bad.numTokens, bad.topk, bad.stream);
  const std::string msg = fuscoGetLastError(comm);
  EXPECT_LT(nowSec() - t0, kPromptSec) << w;
  EXPECT_EQ(r, planned) << w << ": fuscoMoeReplan gave " << fuscoGetErrorString(r)
                        << ", fuscoMoePlan " << fuscoGetErrorString(planned) << ": " << msg;
  expectUnplanned(comm, h, first, ctx.rank, w);
  if (replanChecked(comm, h, ctx, next, w + ", then a good replan"))
    combineOnHandle(comm, h, ctx, next, dedup);
  // A handle left unplanned is still destroyed.
  EXPECT_NE(fuscoMoeReplan(h, bad.topkIdx, bad.numTokens, bad.topk, bad.stream), fuscoSuccess);
  FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  return {r, msg};
}

// Two layers on 4 ranks (the second with other token counts) for the error tests.
std::pair<CombineSetup, CombineSetup> twoLayers(uint64_t seed) {
  MoeCase c;
  c.nranks = 4;
  c.numExperts = 8;
  c.topk = 3;
  c.align = 2;
  c.numTokens.assign(4, 10);
  CombineSetup first = makeCombine(c, seed, fuscoFloat32, 8);
  c.numTokens = {13, 0, 10, 7};
  return {first, makeCombine(c, seed + 1, fuscoFloat32, 8)};
}

// Runs body on 4 ranks, each with a comm and twoLayers' layers.
using TwoLayerBody = std::function<void(const RankCtx&, fuscoComm_t, const CombineSetup& first,
                                        const CombineSetup& next)>;
void runTwoLayers(const TwoLayerBody& body) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed, &body](const RankCtx& ctx) {
    const std::pair<CombineSetup, CombineSetup> layers = twoLayers(seed);
    fuscoConfig_t cfg = commConfig(layers.first.c, 20000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    body(ctx, comm, layers.first, layers.second);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

bool namesNumbered(const std::string& msg, const char* word, int v) {
  const std::regex re(std::string(word) + "\\s*#?\\s*" + std::to_string(v) + "\\b",
                      std::regex::icase);
  return std::regex_search(msg, re);
}

TEST(MoeReplan, BadExpertIdOnOneRankFailsEveryRankAndUnplansTheHandle) {
  runTwoLayers([](const RankCtx& ctx, fuscoComm_t comm, const CombineSetup& first,
                  const CombineSetup& next) {
    const int badRank = 2;
    std::vector<int64_t> idx = next.p.topkIdx[ctx.rank];
    if (ctx.rank == badRank) idx[6 * 3 + 1] = first.c.numExperts;  // token 6, slot 1
    for (int dedup : kAllModes) {
      const std::string w = std::string("bad expert id, dedup ") + dedupName(dedup);
      const Args bad{idx.data(), next.p.numTokens[ctx.rank], 3, nullptr};
      const auto [r, msg] = expectReplanFailsLikePlan(comm, ctx, first, next, bad, dedup, w);
      if (ctx.rank == badRank) {
        EXPECT_EQ(r, fuscoInvalidArgument) << w << ": " << msg;
        EXPECT_TRUE(namesNumbered(msg, "token", 6)) << w << ": '" << msg << "'";
        EXPECT_TRUE(namesNumbered(msg, "slot", 1)) << w << ": '" << msg << "'";
      } else {
        EXPECT_TRUE(isPeerError(r)) << w << ": " << fuscoGetErrorString(r) << ": " << msg;
        EXPECT_TRUE(fusco::test::namesRank(msg, badRank)) << w << ": '" << msg << "'";
      }
    }
  });
}

// The other checks fuscoMoePlan makes, each on one rank or on all: a NULL topkIdx with tokens, a
// topk out of range, a duplicate expert in one token, a stream on a host comm.
TEST(MoeReplan, EveryBadArgumentOfFuscoMoePlanFailsTheReplanAlike) {
  runTwoLayers([](const RankCtx& ctx, fuscoComm_t comm, const CombineSetup& first,
                  const CombineSetup& next) {
    const int64_t* good = routingOf(next, ctx.rank);
    const size_t tokens = next.p.numTokens[ctx.rank];
    std::vector<int64_t> dup = next.p.topkIdx[ctx.rank];
    if (!dup.empty()) dup[1] = dup[2] = 5;  // token 0 names expert 5 in slots 1 and 2
    int streamWord = 0;
    const std::vector<std::pair<std::string, Args>> cases = {
        {"NULL topkIdx with tokens on rank 0",
         {ctx.rank == 0 ? nullptr : good, tokens, 3, nullptr}},
        {"topk 0 on every rank", {good, tokens, 0, nullptr}},
        {"topk 256 on rank 3", {good, tokens, ctx.rank == 3 ? 256 : 3, nullptr}},
        {"duplicate expert on rank 0", {ctx.rank == 0 ? dup.data() : good, tokens, 3, nullptr}},
        {"a stream on a host comm on rank 2",
         {good, tokens, 3, ctx.rank == 2 ? &streamWord : nullptr}}};
    for (const auto& [name, bad] : cases)
      for (int dedup : {FUSCO_DEDUP_RANK, FUSCO_DEDUP_NODE})
        expectReplanFailsLikePlan(comm, ctx, first, next, bad, dedup,
                                  name + ", dedup " + dedupName(dedup));
  });
}

TEST(MoeReplan, NullOrDestroyedHandleIsInvalidArgument) {
  const int64_t idx[2] = {0, 1};
  EXPECT_EQ(fuscoMoeReplan(nullptr, idx, 1, 2, nullptr), fuscoInvalidArgument);
  EXPECT_NE(std::string(fuscoGetLastError(nullptr)).find("fuscoMoeReplan"), std::string::npos)
      << fuscoGetLastError(nullptr);
  runRanks(2, [&idx](const RankCtx& ctx) {
    fuscoComm_t comm = initComm(ctx);
    MoeCase c;
    c.numExperts = 8;
    const fuscoMoeConfig_t m = moeConfig(c, FUSCO_DEDUP_RANK);
    fuscoMoeHandle_t h = nullptr;
    FUSCO_ASSERT_OK(comm, fuscoMoePlan(&h, comm, &m, idx, 1, 2, nullptr));
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    EXPECT_EQ(fuscoMoeReplan(h, idx, 1, 2, nullptr), fuscoInvalidArgument);
    EXPECT_NE(std::string(fuscoGetLastError(nullptr)).find("not a live MoE handle"),
              std::string::npos)
        << fuscoGetLastError(nullptr);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// ---------------------------------------------------------------- storage reuse

Storage storageOf(fuscoMoeHandle_t h) {
  Storage s;
  EXPECT_TRUE(fusco::moeHandleStorage(h, &s)) << "not a live handle";
  return s;
}

// Every list of the plan still has its elements where they were, in as many bytes.
void expectSameStorage(const Storage& before, const Storage& after, const std::string& w) {
  EXPECT_EQ(before.size(), after.size()) << w << ": the handle holds another number of lists";
  std::string moved;
  for (size_t i = 0; i < std::min(before.size(), after.size()); ++i) {
    EXPECT_EQ(before[i].name, after[i].name) << w;
    if (!(before[i] == after[i]))
      moved += " " + before[i].name + " (" + std::to_string(before[i].bytes) + " -> " +
               std::to_string(after[i].bytes) + " bytes)";
  }
  EXPECT_TRUE(moved.empty()) << w << ": lists allocated again:" << moved;
}

// The first layer's routing with a third of its tokens and every fifth slot left out: every list
// of the plan is at most as long as the first layer's (same topk; with STATIC balance the NODE
// routes are the same flows, each with fewer rows).
MoeRefProblem subsetOf(const MoeRefProblem& p) {
  MoeRefProblem q = p;
  for (int s = 0; s < p.nranks; ++s) {
    q.numTokens[s] = p.numTokens[s] * 2 / 3;
    q.topkIdx[s].resize(q.numTokens[s] * p.topk);
    for (size_t i = 0; i < q.topkIdx[s].size(); ++i)
      if (i % 5 == 3) q.topkIdx[s][i] = -1;
  }
  return q;
}

TEST(MoeReplan, ReplanThatFitsAllocatesNoListAgain) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 4;
    c.numExperts = 16;
    c.topk = 4;
    c.align = 4;
    c.numTokens = {40, 33, 47, 38};
    c.unusedPercent = 10;
    c.localSize = 2;  // two nodes: NODE dedup runs with forwarders
    c.balance = FUSCO_BALANCE_STATIC;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    const CombineSetup big = makeCombine(c, seed, fuscoFloat32, 16);
    MoeCase cs = c;
    MoeRefProblem ps = subsetOf(big.p);
    cs.numTokens = ps.numTokens;
    const CombineSetup small = makeCombineFor(cs, std::move(ps), seed + 1, fuscoFloat32, 16);
    for (int dedup : kAllModes) {
      const std::string w = std::string("dedup ") + dedupName(dedup);
      fuscoMoeHandle_t h = planChecked(comm, ctx, big.c, big.p, big.d, dedup, w);
      if (h == nullptr) continue;
      combineOnHandle(comm, h, ctx, big, dedup);
      const Storage first = storageOf(h);
      if (replanChecked(comm, h, ctx, small, w + ", smaller layer")) {
        combineOnHandle(comm, h, ctx, small, dedup);
        expectSameStorage(first, storageOf(h), w + ", after a smaller layer");
      }
      if (replanChecked(comm, h, ctx, big, w + ", first layer again")) {
        combineOnHandle(comm, h, ctx, big, dedup);
        expectSameStorage(first, storageOf(h), w + ", after the first layer again");
      }
      FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace
