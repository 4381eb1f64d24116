// MoE bad input: bad routing, configs and handle-level arguments on one or every rank fail
// promptly with fuscoInvalidArgument (or a peer error on the other ranks), and the comm and handle
// stay usable afterwards.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/moe_reference.h"
#include "harness/mp_harness.h"
#include "harness/raw_enum.h"

namespace {

using fusco::test::combineChecked;
using fusco::test::CombineSetup;
using fusco::test::dispatchChecked;
using fusco::test::initComm;
using fusco::test::makeCombine;
using fusco::test::makeProblem;
using fusco::test::MoeCase;
using fusco::test::moeConfig;
using fusco::test::MoeRefProblem;
using fusco::test::nowSec;
using fusco::test::planChecked;
using fusco::test::RankCtx;
using fusco::test::runRanks;

constexpr double kPromptSec = 5.0;

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
    if (ctx.rank == 1) {
      EXPECT_EQ(r, fuscoInvalidArgument) << fuscoGetLastError(comm);
    } else {
      EXPECT_TRUE(isPeerError(r)) << fuscoGetErrorString(r) << ": " << fuscoGetLastError(comm);
    }
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
    if (ctx.rank == 0) {
      EXPECT_EQ(r, fuscoInvalidArgument) << fuscoGetLastError(comm);
    } else {
      EXPECT_TRUE(isPeerError(r)) << "rowBytes 0 on rank 0: " << fuscoGetErrorString(r) << ": "
                                  << fuscoGetLastError(comm);
    }
    dispatchChecked(comm, h, ctx, s.p, s.d, s.x, 64, FUSCO_DEDUP_RANK, "dispatch after rowBytes 0");

    for (int bad : {static_cast<int>(fuscoInt32), static_cast<int>(fuscoFloat64), 99}) {
      t0 = nowSec();
      r = fuscoTestCombineRawType(h, s.expertOut[ctx.rank].data(), bad, 16, out.data());
      EXPECT_LT(nowSec() - t0, kPromptSec);
      EXPECT_EQ(r, fuscoInvalidArgument) << "datatype " << bad << ": " << fuscoGetLastError(comm);
    }
    t0 = nowSec();
    r = fuscoMoeCombine(h, s.expertOut[ctx.rank].data(), ctx.rank == 2 ? fuscoInt32 : fuscoFloat32,
                        16, nullptr, out.data(), nullptr);
    EXPECT_LT(nowSec() - t0, kPromptSec);
    if (ctx.rank == 2) {
      EXPECT_EQ(r, fuscoInvalidArgument) << fuscoGetLastError(comm);
    } else {
      EXPECT_TRUE(isPeerError(r)) << "int32 on rank 2: " << fuscoGetErrorString(r) << ": "
                                  << fuscoGetLastError(comm);
    }
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    expectUsable(comm, ctx, "bad combine datatype");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace
