// Call numbers: every operation's header carries the communicator's collective call number and
// the pair's operation number. A rank whose call fails between the operations of a collective (or
// before its first) while its peers go on breaks the communicator on every rank, promptly, so no
// later call pairs one rank's call k+1 with its peers' call k; every failure that leaves the comm
// usable (bad arguments in the first exchange, values the ranks disagree on, point-to-point groups
// among some ranks) keeps the numbers in step on every rank. The mid-call failure is injected with
// FUSCO_FAULT=oom (core/fault.h): the rank runs out of host memory after K operations of its call.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/moe_reference.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::combineChecked;
using fusco::test::initComm;
using fusco::test::makeA2avLayout;
using fusco::test::makeCombine;
using fusco::test::makeProblem;
using fusco::test::MoeCase;
using fusco::test::moeConfig;
using fusco::test::MoeRefProblem;
using fusco::test::MpOptions;
using fusco::test::namesRank;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;

constexpr int kRanks = 4;
constexpr double kPromptSec = 5.0;  // with timeoutMs 20000: nothing may wait for the timeout

fuscoConfig_t seqConfig() {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = 20000;
  return cfg;
}

MoeCase moeCase() {
  MoeCase c;
  c.nranks = kRanks;
  c.numExperts = 8;
  c.topk = 2;
  c.numTokens = {6, 9, 4, 7};
  return c;
}

// A correct fuscoAllToAll of int32 blocks (value = source * 1000 + destination * 10 + i).
fuscoResult_t allToAll(fuscoComm_t comm, const RankCtx& ctx, bool* exact) {
  const size_t count = 5;
  std::vector<int32_t> send(kRanks * count), recv(kRanks * count, -1);
  for (int p = 0; p < kRanks; ++p)
    for (size_t i = 0; i < count; ++i) send[p * count + i] = ctx.rank * 1000 + p * 10 + int(i);
  fuscoResult_t r = fuscoAllToAll(send.data(), recv.data(), count, fuscoInt32, comm, nullptr);
  *exact = true;
  for (int p = 0; p < kRanks; ++p)
    for (size_t i = 0; i < count; ++i)
      *exact = *exact && recv[p * count + i] == p * 1000 + ctx.rank * 10 + int(i);
  return r;
}

// Every rank: `call` fails, promptly (the faulty rank with fuscoSystemError, "out of memory"; the
// others naming it), then every later call fails at once saying the comm cannot be used, and the
// comm reports the error, instead of pairing the faulty rank's next call with its peers' last.
void expectBrokenEverywhere(const std::string& spec, int faulty,
                            const std::function<fuscoResult_t(fuscoComm_t, const RankCtx&)>& call) {
  MpOptions opt;
  opt.env = {{"FUSCO_FAULT", spec}};
  runRanks(
      kRanks,
      [&](const RankCtx& ctx) {
        fuscoConfig_t cfg = seqConfig();
        fuscoComm_t comm = initComm(ctx, &cfg);
        SCOPED_TRACE("FUSCO_FAULT=" + spec + ", rank " + std::to_string(ctx.rank));
        double t0 = nowSec();
        fuscoResult_t r = call(comm, ctx);
        std::string msg = fuscoGetLastError(comm);
        EXPECT_LT(nowSec() - t0, kPromptSec) << msg;
        EXPECT_NE(r, fuscoSuccess) << "silent success of a call that failed on rank " << faulty;
        if (ctx.rank == faulty) {
          EXPECT_EQ(r, fuscoSystemError) << fuscoGetErrorString(r) << ": " << msg;
          EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
        } else {
          EXPECT_TRUE(namesRank(msg, faulty)) << "should name rank " << faulty << ": " << msg;
        }
        for (int i = 0; i < 2; ++i) {
          bool exact = false;
          t0 = nowSec();
          r = allToAll(comm, ctx, &exact);
          msg = fuscoGetLastError(comm);
          EXPECT_LT(nowSec() - t0, kPromptSec) << msg;
          EXPECT_NE(r, fuscoSuccess) << "all-to-all " << i << " after the failed call succeeded"
                                     << (exact ? "" : " with wrong data");
          EXPECT_NE(msg.find("cannot be used"), std::string::npos) << msg;
          EXPECT_TRUE(namesRank(msg, faulty)) << "should name rank " << faulty << ": " << msg;
        }
        fuscoResult_t async = fuscoSuccess;
        EXPECT_EQ(fuscoCommGetAsyncError(comm, &async), fuscoSuccess);
        EXPECT_NE(async, fuscoSuccess) << "the comm must report that it is broken";
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      opt);
}

fuscoResult_t plan(fuscoComm_t comm, const RankCtx& ctx) {
  MoeCase c = moeCase();
  MoeRefProblem p = makeProblem(c, 5);
  fuscoMoeConfig_t m = moeConfig(c, FUSCO_DEDUP_AUTO);
  fuscoMoeHandle_t h = nullptr;
  fuscoResult_t r =
      fuscoMoePlan(&h, comm, &m, p.topkIdx[ctx.rank].data(), p.numTokens[ctx.rank], 2, nullptr);
  if (r == fuscoSuccess) fuscoMoeHandleDestroy(h);
  return r;
}

}  // namespace

TEST(CallSequence, FailureBetweenPlanOperationsOnOneRankBreaksTheCommOnEveryRank) {
  expectBrokenEverywhere("oom:plan:rank=2:ops=1", 2, plan);
}

TEST(CallSequence, FailureBeforeTheFirstExchangeOnOneRankBreaksTheCommOnEveryRank) {
  expectBrokenEverywhere("oom:alltoall:rank=1:ops=0", 1, [](fuscoComm_t comm, const RankCtx& ctx) {
    bool exact = false;
    return allToAll(comm, ctx, &exact);
  });
}

// Combine runs the routing weights, then the partial rows: rank 3 fails between the two.
TEST(CallSequence, FailureBetweenCombineOperationsOnOneRankBreaksTheCommOnEveryRank) {
  expectBrokenEverywhere("oom:combine:rank=3:ops=1", 3, [](fuscoComm_t comm, const RankCtx& ctx) {
    fusco::test::CombineSetup s = makeCombine(moeCase(), 8, fuscoFloat32, 8);
    fuscoMoeConfig_t m = moeConfig(s.c, FUSCO_DEDUP_RANK);
    fuscoMoeHandle_t h = nullptr;
    fuscoResult_t r = fuscoMoePlan(&h, comm, &m, s.p.topkIdx[ctx.rank].data(),
                                   s.p.numTokens[ctx.rank], s.c.topk, nullptr);
    if (r != fuscoSuccess) return r;
    std::vector<uint8_t> out(s.p.numTokens[ctx.rank] * 8 * sizeof(float) + 64);
    r = fuscoMoeCombine(h, s.expertOut[ctx.rank].data(), fuscoFloat32, 8,
                        s.weights[ctx.rank].data(), out.data(), nullptr);
    fuscoMoeHandleDestroy(h);
    return r;
  });
}

// Failures that leave the comm usable, each a different way a call ends early on every rank, and
// groups that only some ranks call: afterwards every rank is still at the same call number, so
// correct calls pair up and are bit-exact, and the comm was never broken.
TEST(CallSequence, EveryFailureThatKeepsTheCommUsableKeepsCallsInStep) {
  runRanks(kRanks, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = seqConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    std::vector<int32_t> buf(64, 7), buf2(64);
    // 1. Bad arguments on one rank, in the call's first (and only) exchange.
    EXPECT_NE(fuscoAllToAll(ctx.rank == 1 ? nullptr : buf.data(), buf2.data(), 4, fuscoInt32, comm,
                            nullptr),
              fuscoSuccess);
    // 2. A group between ranks 0 and 1 only; a group with no peer (to itself) on rank 3.
    if (ctx.rank <= 1) {
      FUSCO_EXPECT_OK(comm, fuscoGroupStart());
      FUSCO_EXPECT_OK(comm, fuscoSend(buf.data(), 8, fuscoInt32, 1 - ctx.rank, comm, nullptr));
      FUSCO_EXPECT_OK(comm, fuscoRecv(buf2.data(), 8, fuscoInt32, 1 - ctx.rank, comm, nullptr));
      FUSCO_EXPECT_OK(comm, fuscoGroupEnd());
    } else if (ctx.rank == 3) {
      FUSCO_EXPECT_OK(comm, fuscoGroupStart());
      FUSCO_EXPECT_OK(comm, fuscoSend(buf.data(), 8, fuscoInt32, 3, comm, nullptr));
      FUSCO_EXPECT_OK(comm, fuscoRecv(buf2.data(), 8, fuscoInt32, 3, comm, nullptr));
      FUSCO_EXPECT_OK(comm, fuscoGroupEnd());
    }
    // 3. A plan with bad routing on rank 2, and one with a config that differs on rank 0.
    MoeCase c = moeCase();
    MoeRefProblem p = makeProblem(c, 3);
    std::vector<int64_t> idx = p.topkIdx[ctx.rank];
    if (ctx.rank == 2) idx[1] = 99;
    fuscoMoeConfig_t m = moeConfig(c, FUSCO_DEDUP_AUTO);
    fuscoMoeHandle_t h = nullptr;
    EXPECT_NE(fuscoMoePlan(&h, comm, &m, idx.data(), p.numTokens[ctx.rank], 2, nullptr),
              fuscoSuccess);
    if (ctx.rank == 0) m.expertAlignment = 8;
    EXPECT_NE(
        fuscoMoePlan(&h, comm, &m, p.topkIdx[ctx.rank].data(), p.numTokens[ctx.rank], 2, nullptr),
        fuscoSuccess);
    // 4. Counts that do not pair up between ranks 0 and 2 (a pair mismatch, agreed by verdict).
    auto l =
        makeA2avLayout(fusco::test::uniformCountMatrix(kRanks, 3), kRanks, ctx.rank, 4, 1, false);
    if (ctx.rank == 0) l.sendcounts[2] += 1;  // rank 2 expects 3
    std::vector<int32_t> send(l.sendElems + 8, 1), recv(l.recvElems + 8);
    EXPECT_NE(fuscoAllToAllv(send.data(), l.sendcounts.data(), l.sdispls.data(), recv.data(),
                             l.recvcounts.data(), l.rdispls.data(), fuscoInt32, comm, nullptr),
              fuscoSuccess);
    // 5. A layout with rowBytes 0 on rank 3.
    std::vector<size_t> lc(kRanks, 1);
    std::vector<int64_t> rows(kRanks);
    for (int q = 0; q < kRanks; ++q) rows[q] = q;
    fuscoLayout_t layout = nullptr;
    EXPECT_NE(fuscoLayoutCreate(&layout, comm, ctx.rank == 3 ? 0 : 4, lc.data(), rows.data(),
                                lc.data(), rows.data()),
              fuscoSuccess);
    // Correct calls pair up: plan, dispatch and combine bit-exact, then an all-to-all.
    combineChecked(comm, ctx, makeCombine(c, 4, fuscoFloat32, 8), FUSCO_DEDUP_AUTO);
    bool exact = false;
    FUSCO_EXPECT_OK(comm, allToAll(comm, ctx, &exact));
    EXPECT_TRUE(exact) << "an all-to-all paired blocks of different calls";
    fuscoResult_t async = fuscoInternalError;
    EXPECT_EQ(fuscoCommGetAsyncError(comm, &async), fuscoSuccess);
    EXPECT_EQ(async, fuscoSuccess) << fuscoGetLastError(comm);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}
