// Low-latency bad input and faults on host communicators (docs/API.md, "Low-latency dispatch and
// combine", "Errors"): arguments past the buffer's limits and bad configs are fuscoInvalidArgument
// at once on every rank making the call, leaving the comm and the buffer usable (the next round is
// exact and on the half it would have used); ranks on two nodes are fuscoInvalidUsage; an invalid
// expert id fails only the rank that passed it, naming token and slot, while every other row
// arrives; a rank killed before a dispatch fails every survivor within the timeout, naming it.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/ll_cases.h"
#include "harness/ll_reference.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::LlCase;
using fusco::test::LlInputs;
using fusco::test::LlRecv;
using fusco::test::LlRound;
using fusco::test::makeLlInputs;
using fusco::test::MpOptions;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;

constexpr int kTimeoutMs = 5000;
constexpr double kPromptSec = 5.0;    // an argument error must not wait for the timeout
constexpr double kSurviveSec = 15.0;  // timeoutMs + a generous margin on 2 oversubscribed cores

// 16 tokens per rank at most, hidden 96 (so FP8 is refused), top-4 at most.
LlCase limitsCase(int n) {
  LlCase c;
  c.nranks = n;
  c.numExperts = 4 * n;
  c.topk = 3;
  c.maxTopk = 4;
  c.maxTokensPerRank = 16;
  c.hidden = 96;
  c.numTokens.assign(n, 8);
  return c;
}

// `call` returns fuscoInvalidArgument promptly with a message.
void expectRefused(fuscoComm_t comm, const std::string& what,
                   const std::function<fuscoResult_t()>& call) {
  const double t0 = nowSec();
  const fuscoResult_t r = call();
  const double sec = nowSec() - t0;
  EXPECT_EQ(r, fuscoInvalidArgument) << what << ": " << fuscoGetErrorString(r);
  EXPECT_LT(sec, kPromptSec) << what << " took " << sec << " s";
  if (comm != nullptr) {
    EXPECT_STRNE(fuscoGetLastError(comm), "") << what << ": no message";
  }
}

// Dispatches past the limits, with the inputs sized for the largest count tried so that nothing
// reads past them.
void badDispatches(fuscoComm_t comm, fuscoLowLatency_t ll, const LlCase& c) {
  LlCase big = c;
  big.numTokens.assign(c.nranks, c.maxTokensPerRank + 1);
  big.topk = c.maxTopk + 1;
  const LlInputs in = makeLlInputs(big, 5);
  const void* x = in.x[0].data();
  const int64_t* idx = in.topkIdx[0].data();
  fuscoLowLatencyDispatch_t d;
  auto call = [&](fuscoLowLatency_t h, int nTok, int topk, int format,
                  fuscoLowLatencyDispatch_t* out) {
    return [=] { return fuscoLowLatencyDispatch(h, x, idx, nTok, topk, format, 0, out, nullptr); };
  };
  const int n = c.maxTokensPerRank;
  expectRefused(comm, "numTokens past maxTokensPerRank", call(ll, n + 1, 2, FUSCO_LL_BF16, &d));
  expectRefused(comm, "numTokens -1", call(ll, -1, 2, FUSCO_LL_BF16, &d));
  expectRefused(comm, "topk 0", call(ll, 4, 0, FUSCO_LL_BF16, &d));
  expectRefused(comm, "topk past maxTopk", call(ll, 4, c.maxTopk + 1, FUSCO_LL_BF16, &d));
  expectRefused(comm, "FP8 with hidden 96", call(ll, 4, 2, FUSCO_LL_FP8, &d));
  expectRefused(comm, "format 2", call(ll, 4, 2, 2, &d));
  expectRefused(comm, "format -1", call(ll, 4, 2, -1, &d));
  expectRefused(nullptr, "a NULL handle", call(nullptr, 4, 2, FUSCO_LL_BF16, &d));
  expectRefused(comm, "a NULL out", call(ll, 4, 2, FUSCO_LL_BF16, nullptr));
}

TEST(LowLatencyLimits, DispatchPastTheLimitsIsRefusedOnEveryRankAndTheBufferStaysUsable) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(2, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx, 20000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    const LlCase c = limitsCase(2);
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
    ASSERT_NE(ll, nullptr);
    badDispatches(comm, ll, c);
    LlRound o;  // nothing was enqueued: the first good dispatch uses half 0
    fusco::test::llRoundChecked(comm, ll, ctx, makeLlInputs(c, seed), o, "after bad dispatches");
    badDispatches(comm, ll, c);
    o.buffer = 1;
    fusco::test::llRoundChecked(comm, ll, ctx, makeLlInputs(c, seed + 1), o, "and again");
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// Combines that do not match their dispatch (numTokens, topk), a NULL handle, dispatch or out:
// refused; the right combine then gives the reference's bytes.
TEST(LowLatencyLimits, CombineMustMatchItsDispatch) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(2, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx, 20000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    const LlCase c = limitsCase(2);
    const LlInputs in = makeLlInputs(c, seed);
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
    ASSERT_NE(ll, nullptr);
    fuscoLowLatencyDispatch_t d;
    LlRecv got;
    ASSERT_TRUE(fusco::test::llDispatchChecked(comm, ll, ctx, in, LlRound{}, "dispatch", &d, &got));
    const std::vector<uint8_t> eo = fusco::test::llExpertOut(c, FUSCO_LL_BF16, ctx.rank, got);
    // Inputs and out sized for one token and one slot more than the dispatch had.
    std::vector<int64_t> idx = in.topkIdx[ctx.rank];
    idx.resize((c.numTokens[ctx.rank] + 1) * (c.topk + 1), -1);
    std::vector<float> w(idx.size(), 1.0f);
    std::vector<uint8_t> out((c.numTokens[ctx.rank] + 1) * c.hidden * 2, fusco::test::kPoison);
    auto call = [&](fuscoLowLatency_t h, const fuscoLowLatencyDispatch_t* dd, int nTok, int topk,
                    void* o) {
      return [=, &eo, &idx, &w] {
        return fuscoLowLatencyCombine(h, dd, eo.data(), idx.data(), w.data(), nTok, topk, o, 0,
                                      nullptr, nullptr);
      };
    };
    const int n = c.numTokens[ctx.rank], k = c.topk;
    expectRefused(comm, "combine with one token more", call(ll, &d, n + 1, k, out.data()));
    expectRefused(comm, "combine with one token fewer", call(ll, &d, n - 1, k, out.data()));
    expectRefused(comm, "combine with topk + 1", call(ll, &d, n, k + 1, out.data()));
    expectRefused(comm, "combine with topk - 1", call(ll, &d, n, k - 1, out.data()));
    expectRefused(nullptr, "combine with a NULL handle", call(nullptr, &d, n, k, out.data()));
    expectRefused(comm, "combine with a NULL dispatch", call(ll, nullptr, n, k, out.data()));
    expectRefused(comm, "combine with a NULL out", call(ll, &d, n, k, nullptr));
    fusco::test::llCombineChecked(comm, ll, ctx, in, LlRound{}, d, got, "the matching combine");
    LlRound o;
    o.buffer = 1;
    fusco::test::llRoundChecked(comm, ll, ctx, makeLlInputs(c, seed + 1), o, "the next round");
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// fuscoLowLatencyCreate with cfg: fuscoInvalidArgument, the handle untouched, a message naming
// `field` (when given).
void expectCreateRefused(fuscoComm_t comm, const fuscoLowLatencyConfig_t& cfg,
                         const std::string& what, const char* field) {
  fuscoLowLatency_t ll = reinterpret_cast<fuscoLowLatency_t>(0x1);
  expectRefused(comm, what, [&] { return fuscoLowLatencyCreate(&ll, comm, &cfg); });
  EXPECT_EQ(ll, reinterpret_cast<fuscoLowLatency_t>(0x1)) << what << ": the handle was written";
  const std::string msg = fuscoGetLastError(comm);
  if (field != nullptr) {
    EXPECT_NE(msg.find(field), std::string::npos) << what << ": " << msg;
  }
}

TEST(LowLatencyCreate, BadConfigFieldsAreInvalidArgument) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(2, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx, 20000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    const LlCase c = limitsCase(2);
    const fuscoLowLatencyConfig_t good = fusco::test::llConfig(c);
    struct Bad {
      const char* what;
      const char* field;
      std::function<void(fuscoLowLatencyConfig_t&)> set;
    };
    const std::vector<Bad> bad = {
        {"maxTokensPerRank 0", "maxTokensPerRank", [](auto& f) { f.maxTokensPerRank = 0; }},
        {"maxTokensPerRank 65537", "maxTokensPerRank", [](auto& f) { f.maxTokensPerRank = 65537; }},
        {"hidden 0", "hidden", [](auto& f) { f.hidden = 0; }},
        {"hidden 65537", "hidden", [](auto& f) { f.hidden = 65537; }},
        {"numExperts 7 on 2 ranks", "numExperts", [](auto& f) { f.numExperts = 7; }},
        {"numExperts 0", "numExperts", [](auto& f) { f.numExperts = 0; }},
        {"numExperts 65538", "numExperts", [](auto& f) { f.numExperts = 65538; }},
        {"maxTopk 0", "maxTopk", [](auto& f) { f.maxTopk = 0; }},
        {"maxTopk 65", "maxTopk", [](auto& f) { f.maxTopk = 65; }},
        {"a wrong size", nullptr, [](auto& f) { f.size = sizeof f - 4; }},
        {"a wrong magic", nullptr, [](auto& f) { f.magic ^= 1u; }},
        {"a wrong version", nullptr, [](auto& f) { f.version += 1; }},
    };
    for (const Bad& b : bad) {
      fuscoLowLatencyConfig_t f = good;
      b.set(f);
      expectCreateRefused(comm, f, b.what, b.field);
    }
    expectRefused(comm, "a NULL config", [&] {
      fuscoLowLatency_t ll = nullptr;
      return fuscoLowLatencyCreate(&ll, comm, nullptr);
    });
    expectRefused(comm, "a NULL handle pointer",
                  [&] { return fuscoLowLatencyCreate(nullptr, comm, &good); });
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
    ASSERT_NE(ll, nullptr);
    fusco::test::llRoundChecked(comm, ll, ctx, makeLlInputs(c, seed), LlRound{},
                                "after bad configs");
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// Create is collective and every field of the config sizes the buffers peers write into: a field
// that differs on one rank fails create on every rank with fuscoInvalidUsage (a value ranks must
// pass alike, docs/API.md "The collective error rule") naming the field and both values, writes no
// handle and nothing into other memory of the comm (a fuscoMemAlloc buffer of seeded bytes stays as
// it was), and the same config on every rank then works.
TEST(LowLatencyCreate, ConfigsThatDifferBetweenRanksFailEveryRankNamingTheField) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(2, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx, 20000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    const size_t bytes = 1 << 20;
    void* mem = nullptr;
    FUSCO_ASSERT_OK(comm, fuscoMemAlloc(comm, &mem, bytes));
    std::vector<uint8_t> want(bytes);
    uint64_t s = seed * 31 + ctx.rank;
    for (auto& b : want) b = static_cast<uint8_t>((s = s * 6364136223846793005ull + 1) >> 56);
    std::memcpy(mem, want.data(), bytes);
    const LlCase c = limitsCase(2);
    struct Differ {
      const char* field;
      int mine, other;  // rank 0's value, rank 1's
      std::function<void(fuscoLowLatencyConfig_t&, int)> set;
    };
    const std::vector<Differ> cases = {
        {"hidden", 96, 4096, [](auto& f, int v) { f.hidden = v; }},
        {"maxTopk", 2, 8, [](auto& f, int v) { f.maxTopk = v; }},
        {"maxTokensPerRank", 16, 64, [](auto& f, int v) { f.maxTokensPerRank = v; }},
        {"numExperts", 8, 16, [](auto& f, int v) { f.numExperts = v; }},
    };
    for (const Differ& d : cases) {
      const std::string what = std::string(d.field) + " " + std::to_string(d.mine) +
                               " on rank 0, " + std::to_string(d.other) + " on rank 1";
      fuscoLowLatencyConfig_t f = fusco::test::llConfig(c);
      d.set(f, ctx.rank == 0 ? d.mine : d.other);
      fuscoLowLatency_t ll = reinterpret_cast<fuscoLowLatency_t>(0x1);
      const double t0 = nowSec();
      const fuscoResult_t r = fuscoLowLatencyCreate(&ll, comm, &f);
      const std::string msg = fuscoGetLastError(comm);
      EXPECT_LT(nowSec() - t0, kPromptSec) << what;
      EXPECT_EQ(r, fuscoInvalidUsage) << what << ": " << fuscoGetErrorString(r) << ": " << msg;
      EXPECT_NE(msg.find(std::string("config->") + d.field), std::string::npos)
          << what << ": " << msg;
      EXPECT_NE(msg.find(std::to_string(d.mine) + " on rank 0"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(d.other) + " on rank 1"), std::string::npos) << msg;
      if (r == fuscoSuccess) {
        fuscoLowLatencyDestroy(ll);  // the old behaviour: keep the ranks in step
      } else {
        EXPECT_EQ(ll, reinterpret_cast<fuscoLowLatency_t>(0x1)) << what << ": handle written";
      }
      EXPECT_EQ(std::memcmp(mem, want.data(), bytes), 0) << what << ": other memory written";
    }
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
    ASSERT_NE(ll, nullptr);
    fusco::test::llRoundChecked(comm, ll, ctx, makeLlInputs(c, seed), LlRound{},
                                "after configs that differed");
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
    EXPECT_EQ(std::memcmp(mem, want.data(), bytes), 0) << "other memory written by the round";
    FUSCO_EXPECT_OK(comm, fuscoMemFree(comm, mem));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// Two virtual nodes (localSize 1): the ranks cannot map each other's memory, so every rank's
// create is fuscoInvalidUsage, and the comm still moves data.
TEST(LowLatencyCreate, RanksOnTwoNodesAreInvalidUsage) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx, 20000);
    cfg.localSize = 1;
    fuscoComm_t comm = initComm(ctx, &cfg);
    const fuscoLowLatencyConfig_t f = fusco::test::llConfig(limitsCase(2));
    fuscoLowLatency_t ll = nullptr;
    const double t0 = nowSec();
    EXPECT_EQ(fuscoLowLatencyCreate(&ll, comm, &f), fuscoInvalidUsage) << fuscoGetLastError(comm);
    EXPECT_LT(nowSec() - t0, kSurviveSec);
    EXPECT_EQ(ll, nullptr);
    auto l = fusco::test::makeA2avLayout(fusco::test::uniformCountMatrix(2, 33), 2, ctx.rank, 4, 3,
                                         false);
    EXPECT_TRUE(fusco::test::allToAllvRoundTrip(comm, l, fuscoInt32, 3));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// Rank 1 routes token 5 slot 1 to expert numExperts + 3: its dispatch returns
// fuscoInvalidArgument naming the token and slot after completing with its peers, which succeed
// with every other row; the next rounds use the following halves and are exact.
TEST(LowLatencyInvalidId, OnlyTheRankWithTheIdFailsNamingTokenAndSlot) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx, 20000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    LlCase c = limitsCase(3);
    c.numTokens = {10, 10, 7};
    LlInputs in = makeLlInputs(c, seed);
    in.topkIdx[1][5 * c.topk + 1] = c.numExperts + 3;
    fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
    ASSERT_NE(ll, nullptr);
    fuscoLowLatencyDispatch_t d;
    std::memset(&d, fusco::test::kPoison, sizeof d);
    const double t0 = nowSec();
    const fuscoResult_t r = fusco::test::llDispatchCall(ll, in, ctx.rank, FUSCO_LL_BF16, 0, &d);
    EXPECT_LT(nowSec() - t0, kSurviveSec);
    if (ctx.rank == 1) {
      const std::string msg = fuscoGetLastError(comm);
      EXPECT_EQ(r, fuscoInvalidArgument) << fuscoGetErrorString(r) << ": " << msg;
      EXPECT_TRUE(fusco::test::llNamesNumber(msg, "token", 5)) << msg;
      EXPECT_TRUE(fusco::test::llNamesNumber(msg, "slot", 1)) << msg;
    } else {
      FUSCO_EXPECT_OK(comm, r);
      EXPECT_TRUE(fusco::test::llDispatchFields(d, FUSCO_LL_BF16, 0, false));
      const LlRecv got = fusco::test::llFetchHost(d, c, FUSCO_LL_BF16);
      EXPECT_TRUE(fusco::test::llRecvMatches(
          c, FUSCO_LL_BF16, fusco::test::llRefDispatch(in, ctx.rank, FUSCO_LL_BF16), got))
          << "rank " << ctx.rank << " next to an invalid id";
    }
    for (int round = 1; round <= 2; ++round) {
      LlRound o;
      o.buffer = round % 2;
      fusco::test::llRoundChecked(comm, ll, ctx, makeLlInputs(c, seed + round), o,
                                  "round " + std::to_string(round) + " after an invalid id");
    }
    FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

bool isFaultError(fuscoResult_t r) { return r == fuscoRemoteError || r == fuscoTimeout; }

// A survivor's dispatch after `dead` died: a fault error naming it within the timeout; the comm
// reports it as its async error; the buffer and the comm are freed promptly.
void expectSurvivorSawDeath(fuscoComm_t comm, fuscoLowLatency_t ll, fuscoResult_t r, double sec,
                            int dead) {
  const std::string msg = fuscoGetLastError(comm);
  EXPECT_TRUE(isFaultError(r)) << "got " << fuscoGetErrorString(r) << " (" << msg
                               << "); expected fuscoRemoteError or fuscoTimeout";
  EXPECT_LT(sec, kSurviveSec) << "the failed dispatch took " << sec << " s";
  EXPECT_TRUE(fusco::test::namesRank(msg, dead)) << "'" << msg << "' should name rank " << dead;
  fuscoResult_t async = fuscoSuccess;
  EXPECT_EQ(fuscoCommGetAsyncError(comm, &async), fuscoSuccess);
  EXPECT_NE(async, fuscoSuccess) << "a comm whose peer died must report an async error";
  double t0 = nowSec();
  fuscoLowLatencyDestroy(ll);  // its result after a fault is not specified; its time is
  EXPECT_LT(nowSec() - t0, kSurviveSec) << "fuscoLowLatencyDestroy after a peer died";
  t0 = nowSec();
  EXPECT_EQ(fuscoCommDestroy(comm), fuscoSuccess) << fuscoGetLastError(nullptr);
  EXPECT_LT(nowSec() - t0, 5.0) << "destroy must not wait for the dead peer";
}

// After one good round rank 2 dies (SIGKILL) while the others enter a dispatch.
TEST(LowLatencyFault, PeerKilledBeforeDispatchFailsEverySurvivorNamingIt) {
  const uint64_t seed = fusco::test::testSeed();
  MpOptions opt;
  opt.mayDie = {2};
  runRanks(
      3,
      [seed](const RankCtx& ctx) {
        fuscoConfig_t cfg = fusco::test::llCommConfig(ctx, kTimeoutMs);
        fuscoComm_t comm = initComm(ctx, &cfg);
        const LlCase c = limitsCase(3);
        fuscoLowLatency_t ll = fusco::test::llCreate(comm, c);
        ASSERT_NE(ll, nullptr);
        fusco::test::llRoundChecked(comm, ll, ctx, makeLlInputs(c, seed), LlRound{}, "first");
        if (ctx.rank == 2) {
          usleep(300 * 1000);
          raise(SIGKILL);
        }
        const LlInputs in = makeLlInputs(c, seed + 1);
        fuscoLowLatencyDispatch_t d;
        const double t0 = nowSec();
        const fuscoResult_t r = fusco::test::llDispatchCall(ll, in, ctx.rank, FUSCO_LL_BF16, 0, &d);
        expectSurvivorSawDeath(comm, ll, r, nowSec() - t0, 2);
      },
      opt);
}

}  // namespace
