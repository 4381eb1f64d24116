// Values every rank must pass alike in a MoE call: the plan's config (dedup, numExperts, placement,
// expertAlignment; balance under NODE dedup is MoeNode's) and combine's datatype and hidden size.
// One rank that differs fails the call on every rank, promptly, with fuscoInvalidUsage and a
// message naming the value, both ranks and both values, before any row moves; the comm stays
// usable. On virtual nodes (net2.*) the same holds under NODE dedup, where not every pair exchanges
// rows.
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/moe_reference.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::combineChecked;
using fusco::test::CombineSetup;
using fusco::test::initComm;
using fusco::test::makeCombine;
using fusco::test::makeProblem;
using fusco::test::MoeCase;
using fusco::test::moeConfig;
using fusco::test::MoeRefProblem;
using fusco::test::namesRank;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;

constexpr int kRanks = 4;
constexpr int kOddRank = 1;  // the rank that passes another value
constexpr double kPromptSec = 5.0;

fuscoConfig_t agreementConfig() {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = 20000;
  return cfg;
}

MoeCase baseCase() {
  MoeCase c;
  c.nranks = kRanks;
  c.numExperts = 8;
  c.topk = 2;
  c.numTokens = {7, 5, 9, 6};
  return c;
}

// The call failed on every rank with fuscoInvalidUsage, promptly, naming `field`, both values and
// the other side of the disagreement (the odd rank on its peers; some peer on the odd rank).
void expectDisagreement(fuscoComm_t comm, const RankCtx& ctx, fuscoResult_t r, double sec,
                        const std::string& field, const std::string& mine, const std::string& odd) {
  const std::string msg = fuscoGetLastError(comm);
  SCOPED_TRACE("rank " + std::to_string(ctx.rank) + ": " + msg);
  EXPECT_EQ(r, fuscoInvalidUsage) << fuscoGetErrorString(r);
  EXPECT_LT(sec, kPromptSec) << "the mismatch waited for the timeout";
  EXPECT_NE(msg.find(field), std::string::npos) << "should name " << field;
  EXPECT_NE(msg.find(mine), std::string::npos) << "should name this rank's value " << mine;
  EXPECT_NE(msg.find(odd), std::string::npos) << "should name the other value " << odd;
  EXPECT_TRUE(namesRank(msg, ctx.rank)) << "should name this rank";
  if (ctx.rank != kOddRank) {
    EXPECT_TRUE(namesRank(msg, kOddRank)) << "should name rank " << kOddRank;
  }
}

// A correct plan, dispatch and combine still work on comm, bit-exact.
void expectUsable(fuscoComm_t comm, const RankCtx& ctx, const std::string& after) {
  SCOPED_TRACE("comm usable after " + after);
  MoeCase c = baseCase();
  combineChecked(comm, ctx, makeCombine(c, 91, fuscoFloat32, 8), FUSCO_DEDUP_AUTO);
  fuscoResult_t async = fuscoInternalError;
  EXPECT_EQ(fuscoCommGetAsyncError(comm, &async), fuscoSuccess);
  EXPECT_EQ(async, fuscoSuccess) << "the comm was broken by " << after;
}

// Plans with `odd` applied to the config of rank kOddRank only; the plan must fail everywhere.
template <typename Odd>
void expectPlanDisagreement(const std::string& field, const std::string& value,
                            const std::string& oddValue, Odd odd) {
  runRanks(kRanks, [&](const RankCtx& ctx) {
    fuscoConfig_t cfg = agreementConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    MoeCase c = baseCase();
    MoeRefProblem p = makeProblem(c, 17);
    fuscoMoeConfig_t m = moeConfig(c, FUSCO_DEDUP_AUTO);
    std::vector<int> placement;
    if (ctx.rank == kOddRank) odd(&m, &placement);
    fuscoMoeHandle_t h = reinterpret_cast<fuscoMoeHandle_t>(0x1);
    const double t0 = nowSec();
    fuscoResult_t r = fuscoMoePlan(&h, comm, &m, p.topkIdx[ctx.rank].data(), p.numTokens[ctx.rank],
                                   c.topk, nullptr);
    const bool isOdd = ctx.rank == kOddRank;
    expectDisagreement(comm, ctx, r, nowSec() - t0, field, isOdd ? oddValue : value,
                       isOdd ? value : oddValue);
    EXPECT_EQ(h, reinterpret_cast<fuscoMoeHandle_t>(0x1)) << "handle written on failure";
    expectUsable(comm, ctx, field + " differing on rank " + std::to_string(kOddRank));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace

// NONE on one rank, AUTO (RANK on one node, NODE across nodes) on the others.
TEST(MoePlanAgreement, DedupDifferingOnOneRankFailsThePlanOnEveryRankNamingTheField) {
  const char* autoName = getenv("FUSCO_LOCAL_SIZE") != nullptr ? "NODE" : "RANK";
  expectPlanDisagreement(
      "config.dedup", autoName, "NONE",
      [](fuscoMoeConfig_t* m, std::vector<int>*) { m->dedup = FUSCO_DEDUP_NONE; });
}

// A placement that differs on one rank would misroute every row: it fails the plan instead.
TEST(MoePlanAgreement, PlacementDifferingOnOneRankFailsThePlanOnEveryRankNamingTheField) {
  expectPlanDisagreement("config.expertToRank", "digest", "digest",
                         [](fuscoMoeConfig_t* m, std::vector<int>* placement) {
                           *placement = {1, 0, 0, 1, 2, 2, 3, 3};  // experts 0 and 2 swapped
                           m->expertToRank = placement->data();
                         });
}

TEST(MoePlanAgreement, NumExpertsDifferingOnOneRankFailsThePlanOnEveryRankNamingTheField) {
  expectPlanDisagreement("config.numExperts", "8", "12",
                         [](fuscoMoeConfig_t* m, std::vector<int>*) { m->numExperts = 12; });
}

TEST(MoePlanAgreement, AlignmentDifferingOnOneRankFailsThePlanOnEveryRankNamingTheField) {
  expectPlanDisagreement("config.expertAlignment", "1", "4",
                         [](fuscoMoeConfig_t* m, std::vector<int>*) { m->expertAlignment = 4; });
}

namespace {

// Plans (AUTO dedup) and combines with `dt`/`hidden` on every rank but kOddRank, which passes
// `oddDt`/`oddHidden`: the combine fails everywhere, then the same handle combines correctly.
void expectCombineDisagreement(fuscoDataType_t oddDt, size_t oddHidden, const std::string& field,
                               const std::string& value, const std::string& oddValue) {
  runRanks(kRanks, [&](const RankCtx& ctx) {
    fuscoConfig_t cfg = agreementConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const size_t hidden = 16;
    CombineSetup s = makeCombine(baseCase(), 23, fuscoFloat32, hidden);
    fuscoMoeConfig_t m = moeConfig(s.c, FUSCO_DEDUP_AUTO);
    fuscoMoeHandle_t h = nullptr;
    FUSCO_ASSERT_OK(comm, fuscoMoePlan(&h, comm, &m, s.p.topkIdx[ctx.rank].data(),
                                       s.p.numTokens[ctx.rank], s.c.topk, nullptr));
    std::vector<uint8_t> out(s.p.numTokens[ctx.rank] * hidden * sizeof(float) + 64);
    const bool isOdd = ctx.rank == kOddRank;
    const double t0 = nowSec();
    fuscoResult_t r = fuscoMoeCombine(h, s.expertOut[ctx.rank].data(), isOdd ? oddDt : fuscoFloat32,
                                      isOdd ? oddHidden : hidden, s.weights[ctx.rank].data(),
                                      out.data(), nullptr);
    expectDisagreement(comm, ctx, r, nowSec() - t0, field, isOdd ? oddValue : value,
                       isOdd ? value : oddValue);
    // The same handle still combines: every rank gets a result, and the comm is not broken.
    FUSCO_EXPECT_OK(comm, fuscoMoeCombine(h, s.expertOut[ctx.rank].data(), fuscoFloat32, hidden,
                                          s.weights[ctx.rank].data(), out.data(), nullptr));
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    expectUsable(comm, ctx, field + " differing in combine");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace

TEST(MoeCombineAgreement, DatatypeDifferingOnOneRankFailsEveryRankPromptlyAndCommStaysUsable) {
  expectCombineDisagreement(fuscoBfloat16, 16, "datatype", "fuscoFloat32", "fuscoBfloat16");
}

TEST(MoeCombineAgreement, HiddenDifferingOnOneRankFailsEveryRankPromptlyAndCommStaysUsable) {
  expectCombineDisagreement(fuscoFloat32, 8, "hidden", "16", "8");
}

// Rank kOddRank dispatches rows of 16 bytes while every other rank passes 32: the dispatch fails
// on every rank naming rowBytes and both values, nothing is written, and the handle dispatches
// correctly afterwards.
TEST(MoeDispatchAgreement, RowBytesDifferingOnOneRankFailsEveryRankPromptlyAndCommStaysUsable) {
  runRanks(kRanks, [&](const RankCtx& ctx) {
    fuscoConfig_t cfg = agreementConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    CombineSetup s = makeCombine(baseCase(), 29, fuscoFloat32, 8);  // rows of 32 bytes
    fuscoMoeConfig_t m = moeConfig(s.c, FUSCO_DEDUP_AUTO);
    fuscoMoeHandle_t h = nullptr;
    FUSCO_ASSERT_OK(comm, fuscoMoePlan(&h, comm, &m, s.p.topkIdx[ctx.rank].data(),
                                       s.p.numTokens[ctx.rank], s.c.topk, nullptr));
    const size_t recvRows = s.d.numRecvRows[ctx.rank];
    std::vector<uint8_t> recv(recvRows * 32 + 64);
    fusco::test::poison(recv.data(), recv.size());
    const bool isOdd = ctx.rank == kOddRank;
    const double t0 = nowSec();
    fuscoResult_t r =
        fuscoMoeDispatch(h, s.x[ctx.rank].data(), isOdd ? 16 : 32, recv.data(), nullptr);
    expectDisagreement(comm, ctx, r, nowSec() - t0, "rowBytes", isOdd ? "16" : "32",
                       isOdd ? "32" : "16");
    EXPECT_TRUE(
        fusco::test::isPoisoned(recv.data(), recv.size(), "recvX after the failed dispatch"))
        << "a failed dispatch wrote bytes";
    FUSCO_EXPECT_OK(comm, fuscoMoeDispatch(h, s.x[ctx.rank].data(), 32, recv.data(), nullptr));
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    expectUsable(comm, ctx, "rowBytes differing in dispatch");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}
