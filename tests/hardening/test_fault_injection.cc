// Fault injection through FUSCO_FAULT (core/fault.h): one rank is killed, stalled, drops its
// connections or sends a corrupt call header at a named phase. Every survivor must return
// fuscoRemoteError or fuscoTimeout from that phase's call within timeoutMs plus a margin, with a
// message naming the faulty rank and the phase's operation; no rank may report success for it;
// no process and no /dev/shm entry may be left behind (runRanks checks /dev/shm).
#include <gtest/gtest.h>

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/fault.h"
#include "fault_workload.h"
#include "harness/mp_harness.h"

namespace {

using fusco::FaultAction;
using fusco::FaultPhase;
using fusco::FaultSpec;
using namespace fusco::hardening;
using fusco::test::MpOptions;
using fusco::test::RankCtx;
using fusco::test::runRanks;

constexpr int kRanks = 4;
constexpr int kTimeoutMs = 2000;
constexpr int kRounds = 1;
// timeoutMs, plus the bootstrap's longer peer deadline, plus slack for 2 oversubscribed cores.
constexpr double kLimitSec = kTimeoutMs / 1000.0 + 4.0;

struct FaultCase {
  const char* action;
  int step;  // Step (bootstrap, plan, ...)
  int rank;  // the faulty rank
};

std::string specOf(const FaultCase& c) {
  std::string s =
      std::string(c.action) + ":" + stepName(c.step) + ":rank=" + std::to_string(c.rank);
  // A stall outlives the survivors' timeout, then the rank goes on (and must fail too).
  if (std::string(c.action) == "stall") s += ":ms=" + std::to_string(kTimeoutMs + 1500);
  return s;
}

// What every rank checks, from the shared reports, after a run with one fault that fired at
// sequence index `at` on rank `faulty`.
void checkFaultOutcome(SharedReports& rep, int n, int faulty, const std::string& action, int at,
                       const std::string& spec) {
  const std::vector<int> seq = stepSequence(kRounds);
  const int step = seq[at];
  for (int r = 0; r < n; ++r) {
    const RankReport& x = rep[r];
    SCOPED_TRACE("FUSCO_FAULT=" + spec + ", rank " + std::to_string(r));
    ASSERT_EQ(x.nsteps, at + 1) << "every rank must stop at the faulty step '" << stepName(step)
                                << "' (last error: " << x.msg << ")";
    for (int i = 0; i < at; ++i)
      EXPECT_EQ(x.result[i], fuscoSuccess) << "step " << stepName(seq[i]) << " before the fault";
    const int res = x.result[at];
    EXPECT_EQ(x.dataBad, 0) << "an all-to-all delivered wrong bytes";
    if (r == faulty) {
      if (action == "kill") {
        EXPECT_EQ(res, kInProgress) << "the killed rank returned from the call";
      } else {
        EXPECT_NE(res, kInProgress) << "the faulty rank never returned (hang)";
        EXPECT_NE(res, fuscoSuccess) << "the faulty rank reported success for a failed call";
        EXPECT_TRUE(x.destroyed) << "destroy on the faulty rank";
      }
      continue;
    }
    const std::string msg = x.msg;
    EXPECT_NE(res, kInProgress) << "survivor did not return (hang)";
    EXPECT_NE(res, fuscoSuccess) << "silent success: survivor reported success for a call that "
                                    "failed on rank "
                                 << faulty;
    EXPECT_TRUE(isFaultError(res))
        << "got " << fuscoGetErrorString(static_cast<fuscoResult_t>(res)) << ": " << msg;
    EXPECT_LT(x.sec[at], kLimitSec) << "the failed call took " << x.sec[at] << " s: " << msg;
    EXPECT_TRUE(namesRank(msg, faulty)) << "message should name rank " << faulty << ": " << msg;
    EXPECT_NE(msg.find(stepToken(step)), std::string::npos)
        << "message should name the phase (" << stepToken(step) << "): " << msg;
    EXPECT_TRUE(x.destroyed) << "fuscoCommDestroy after the failure";
    EXPECT_LT(x.destroySec, 5.0) << "destroy waited for the faulty rank";
  }
}

void runFaultCase(const FaultCase& c) {
  const std::string spec = specOf(c);
  SharedReports rep(kRanks);
  ASSERT_TRUE(rep.ok());
  MpOptions opt;
  opt.timeoutSec = 30;
  opt.env = {{"FUSCO_FAULT", spec}};
  opt.mayDie = {c.rank};
  runRanks(
      kRanks, [&](const RankCtx& ctx) { runWorkload(ctx, kTimeoutMs, kRounds, &rep[ctx.rank]); },
      opt);
  checkFaultOutcome(rep, kRanks, c.rank, c.action, faultStepIndex(kRounds, c.step, 1), spec);
  EXPECT_EQ(livingChildren(), 0) << "rank processes left behind";
  std::cout << "[fault] FUSCO_FAULT=" << spec << ": survivors failed in " << stepName(c.step)
            << "; e.g. rank " << (c.rank + 1) % kRanks << ": " << rep[(c.rank + 1) % kRanks].msg
            << "\n";
}

class FaultInjection : public ::testing::TestWithParam<FaultCase> {};

TEST_P(FaultInjection, EverySurvivorFailsPromptlyNamingTheRankAndPhase) {
  runFaultCase(GetParam());
}

std::vector<FaultCase> allCases() {
  std::vector<FaultCase> v;
  for (const char* a : {"kill", "stall", "drop-connection", "corrupt-header"}) {
    for (int s : {kInit, kPlan, kDispatch, kCombine, kAllToAll}) {
      if (std::string(a) == "corrupt-header" && s == kInit) continue;  // no engine header there
      v.push_back({a, s, (s + 1) % kRanks});                           // vary the faulty rank
    }
  }
  v.push_back({"kill", kInit, 0});  // the bootstrap root itself
  v.push_back({"drop-connection", kInit, 0});
  return v;
}

std::string caseLabel(const ::testing::TestParamInfo<FaultCase>& i) {
  std::string s = std::string(i.param.action) + "_" + stepName(i.param.step) + "_rank" +
                  std::to_string(i.param.rank);
  for (char& ch : s)
    if (ch == '-') ch = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Faults, FaultInjection, ::testing::ValuesIn(allCases()), caseLabel);

// after=N: the fault fires on the N-th arrival at the phase; earlier calls succeed everywhere.
TEST(FaultInjectionAfter, KillAtThirdAllToAllLetsTheFirstTwoSucceed) {
  constexpr int kLoopRounds = 3;
  SharedReports rep(3);
  ASSERT_TRUE(rep.ok());
  MpOptions opt;
  opt.timeoutSec = 30;
  opt.env = {{"FUSCO_FAULT", "kill:alltoall:rank=1:after=3"}};
  opt.mayDie = {1};
  runRanks(
      3, [&](const RankCtx& ctx) { runWorkload(ctx, kTimeoutMs, kLoopRounds, &rep[ctx.rank]); },
      opt);
  const int at = faultStepIndex(kLoopRounds, kAllToAll, 3);
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(rep[r].nsteps, at + 1) << rep[r].msg;
    for (int i = 0; i < at; ++i) EXPECT_EQ(rep[r].result[i], fuscoSuccess) << "step " << i;
    if (r == 1) continue;
    EXPECT_TRUE(isFaultError(rep[r].result[at])) << rep[r].msg;
    EXPECT_TRUE(namesRank(rep[r].msg, 1)) << rep[r].msg;
    EXPECT_NE(std::string(rep[r].msg).find("fuscoAllToAll"), std::string::npos) << rep[r].msg;
  }
}

// Several specs at once: the first that is reached fires (rank 2's plan comes before dispatch).
TEST(FaultInjectionSpecs, SeveralSpecsTheFirstReachedFires) {
  SharedReports rep(3);
  ASSERT_TRUE(rep.ok());
  MpOptions opt;
  opt.timeoutSec = 30;
  opt.env = {{"FUSCO_FAULT", "kill:dispatch:rank=1 ; drop-connection:plan:rank=2"}};
  opt.mayDie = {1, 2};
  runRanks(
      3, [&](const RankCtx& ctx) { runWorkload(ctx, kTimeoutMs, 1, &rep[ctx.rank]); }, opt);
  const int at = faultStepIndex(1, kPlan, 1);
  for (int r : {0, 1}) {
    ASSERT_EQ(rep[r].nsteps, at + 1) << "rank " << r << ": " << rep[r].msg;
    EXPECT_TRUE(isFaultError(rep[r].result[at])) << rep[r].msg;
    EXPECT_TRUE(namesRank(rep[r].msg, 2)) << rep[r].msg;
    EXPECT_NE(std::string(rep[r].msg).find("drop-connection"), std::string::npos) << rep[r].msg;
  }
  EXPECT_EQ(rep[2].result[at], fuscoSystemError) << rep[2].msg;
}

// A malformed FUSCO_FAULT is logged and ignored: the library behaves as without it.
TEST(FaultInjectionSpecs, MalformedSpecIsIgnoredAndEverythingSucceeds) {
  SharedReports rep(3);
  ASSERT_TRUE(rep.ok());
  MpOptions opt;
  opt.env = {
      {"FUSCO_FAULT", "explode:dispatch:rank=1;kill:nowhere:rank=1;kill:plan;stall:plan:rank=x"}};
  runRanks(
      3, [&](const RankCtx& ctx) { runWorkload(ctx, kTimeoutMs, 1, &rep[ctx.rank]); }, opt);
  const int steps = static_cast<int>(stepSequence(1).size());
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(rep[r].nsteps, steps) << "rank " << r << ": " << rep[r].msg;
    for (int i = 0; i < rep[r].nsteps; ++i) EXPECT_EQ(rep[r].result[i], fuscoSuccess) << rep[r].msg;
  }
}

TEST(FaultSpecParse, AcceptsTheDocumentedGrammar) {
  std::vector<FaultSpec> v;
  std::string err;
  ASSERT_TRUE(fusco::faultParse(
      "kill:dispatch:rank=2; stall:combine:rank=1:ms=60000;drop-connection:alltoall:rank=0;"
      "corrupt-header:plan:rank=3:after=4;;",
      &v, &err))
      << err;
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].action, FaultAction::Kill);
  EXPECT_EQ(v[0].phase, FaultPhase::Dispatch);
  EXPECT_EQ(v[0].rank, 2);
  EXPECT_EQ(v[0].after, 1);
  EXPECT_EQ(v[1].action, FaultAction::Stall);
  EXPECT_EQ(v[1].ms, 60000);
  EXPECT_EQ(v[2].action, FaultAction::DropConnection);
  EXPECT_EQ(v[2].phase, FaultPhase::AllToAll);
  EXPECT_EQ(v[3].action, FaultAction::CorruptHeader);
  EXPECT_EQ(v[3].after, 4);
}

TEST(FaultSpecParse, RejectsMalformedSpecsButKeepsTheGoodOnes) {
  for (const char* bad : {"kill", "kill:dispatch", "boom:dispatch:rank=1", "kill:launch:rank=1",
                          "kill:plan:rank=-1", "kill:plan:rank=1:after=0", "kill:plan:rank=1:x=2",
                          "stall:plan:rank=1:ms=abc", "corrupt-header:bootstrap:rank=0"}) {
    std::vector<FaultSpec> v;
    std::string err;
    EXPECT_FALSE(fusco::faultParse(std::string(bad) + ";kill:plan:rank=1", &v, &err)) << bad;
    EXPECT_NE(err.find(bad), std::string::npos) << "error should quote the spec: " << err;
    ASSERT_EQ(v.size(), 1u) << bad;
    EXPECT_EQ(v[0].phase, FaultPhase::Plan);
  }
}

// oom (a shortage after K operations of the call): K defaults to 1, 0 is before the first; it
// applies to engine phases only.
TEST(FaultSpecParse, AcceptsOomWithAnOperationCountAndRejectsItAtBootstrap) {
  std::vector<FaultSpec> v;
  std::string err;
  ASSERT_TRUE(fusco::faultParse("oom:plan:rank=2:ops=3; oom:combine:rank=1", &v, &err)) << err;
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].action, FaultAction::Oom);
  EXPECT_EQ(v[0].phase, FaultPhase::Plan);
  EXPECT_EQ(v[0].ops, 3);
  EXPECT_EQ(v[1].ops, 1);
  for (const char* bad :
       {"oom:bootstrap:rank=0", "oom:plan:rank=1:ops=-1", "oom:plan:rank=1:ops="}) {
    v.clear();
    EXPECT_FALSE(fusco::faultParse(bad, &v, &err)) << bad;
    EXPECT_TRUE(v.empty()) << bad;
  }
}

}  // namespace
