// Chaos: a bounded loop (at most kMaxIterations and about kMaxSeconds) where each iteration starts
// 4 ranks and kills or stalls a random rank at a random phase and arrival (FUSCO_FAULT, seeded
// RNG; the seed is printed, FUSCO_CHAOS_SEED repeats a run). Every rank runs two rounds of
// plan/dispatch/combine/all-to-all. Each iteration is classified:
//   clean          the fault point was never reached and every call succeeded everywhere
//   failed-cleanly the fault fired; every survivor failed that call (remote error or timeout,
//                  naming the faulty rank and the operation) within the deadline
//   hang           a rank never returned, or a call took longer than timeoutMs plus the margin
//   silent-success a rank reported success for a call that failed on another rank or that the
//                  faulty rank never completed, or an all-to-all that "succeeded" with wrong data
//   wrong-error    anything else (an early failure, a wrong code, a message missing the rank)
// The counts are printed; hangs, silent successes and wrong errors must all be zero.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fault_workload.h"
#include "harness/data_gen.h"
#include "harness/mp_harness.h"

namespace {

using namespace fusco::hardening;
using fusco::test::MpOptions;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;

constexpr int kRanks = 4;
constexpr int kRounds = 2;
constexpr int kTimeoutMs = 1000;
constexpr double kLimitSec = kTimeoutMs / 1000.0 + 4.0;
constexpr int kMaxIterations = 40;
constexpr double kMaxSeconds = 50.0;

struct Chaos {
  int faulty;
  bool kill;
  int step;
  int after;
  std::string spec() const {
    std::string s = std::string(kill ? "kill" : "stall") + ":" + stepName(step) +
                    ":rank=" + std::to_string(faulty) + ":after=" + std::to_string(after);
    if (!kill) s += ":ms=" + std::to_string(kTimeoutMs + 1000);
    return s;
  }
};

Chaos pick(std::mt19937_64& rng) {
  Chaos c;
  c.faulty = static_cast<int>(rng() % kRanks);
  c.kill = rng() % 10 < 7;  // stalls cost a timeout each: fewer of them
  c.step = static_cast<int>(rng() % 5);
  c.after = 1 + static_cast<int>(rng() % (kRounds + 1));  // sometimes never reached
  return c;
}

std::string outcome(std::string* why, const std::string& text, const char* kind) {
  *why = text;
  return kind;
}

// Returns the outcome class of one iteration; *why explains a bad one.
std::string classify(SharedReports& rep, const Chaos& c, std::string* why) {
  const int at = faultStepIndex(kRounds, c.step, c.after);
  const int total = static_cast<int>(stepSequence(kRounds).size());
  std::ostringstream os;
  // Hangs first: a call that never returned (other than the killed rank's) or ran too long.
  for (int r = 0; r < kRanks; ++r) {
    const RankReport& x = rep[r];
    for (int i = 0; i < x.nsteps; ++i) {
      const bool killedHere = c.kill && r == c.faulty && i == at;
      if ((x.result[i] == kInProgress && !killedHere) ||
          x.sec[i] > kLimitSec + (r == c.faulty && !c.kill ? 3.0 : 0.0)) {
        os << "rank " << r << " step " << i << " (" << stepName(stepSequence(kRounds)[i])
           << ") result " << x.result[i] << " after " << x.sec[i] << " s";
        return outcome(why, os.str(), "hang");
      }
    }
  }
  // Silent success: any step where one rank failed (or was killed) and another succeeded, or a
  // success at or after the fault step, or wrong data.
  for (int r = 0; r < kRanks; ++r) {
    if (rep[r].dataBad)
      return outcome(why, "rank " + std::to_string(r) + " got wrong all-to-all data",
                     "silent-success");
    for (int i = 0; i < rep[r].nsteps; ++i) {
      if (rep[r].result[i] != fuscoSuccess) continue;
      for (int q = 0; q < kRanks; ++q) {
        const bool qFailed = rep[q].nsteps > i && rep[q].result[i] != fuscoSuccess;
        if (qFailed || (at >= 0 && i >= at)) {
          os << "rank " << r << " succeeded at step " << i << " ("
             << stepName(stepSequence(kRounds)[i]) << ") but rank " << q << " "
             << (qFailed ? "failed it: " + std::string(rep[q].msg) : "faulted there");
          return outcome(why, os.str(), "silent-success");
        }
      }
    }
  }
  if (at < 0) {
    for (int r = 0; r < kRanks; ++r)
      if (rep[r].nsteps != total)
        return outcome(why, "rank " + std::to_string(r) + " stopped early: " + rep[r].msg,
                       "wrong-error");
    return "clean";
  }
  for (int r = 0; r < kRanks; ++r) {
    if (r == c.faulty) continue;
    const RankReport& x = rep[r];
    const std::string msg = x.msg;
    const bool named = namesRank(msg, c.faulty);
    if (x.nsteps != at + 1 || !isFaultError(x.result[at]) || !named ||
        msg.find(stepToken(c.step)) == std::string::npos || !x.destroyed) {
      os << "rank " << r << " stopped at step " << x.nsteps - 1 << " with "
         << fuscoGetErrorString(static_cast<fuscoResult_t>(x.result[x.nsteps - 1])) << ": " << msg;
      return outcome(why, os.str(), "wrong-error");
    }
  }
  return "failed-cleanly";
}

uint64_t chaosSeed() {
  const char* s = getenv("FUSCO_CHAOS_SEED");
  return s != nullptr && *s != '\0' ? strtoull(s, nullptr, 0) : fusco::test::testSeed(0xc4a05);
}

TEST(Chaos, RandomKillsAndStallsNeverHangOrSucceedSilently) {
  const uint64_t seed = chaosSeed();
  std::mt19937_64 rng(seed);
  std::map<std::string, int> counts = {
      {"clean", 0}, {"failed-cleanly", 0}, {"hang", 0}, {"silent-success", 0}, {"wrong-error", 0}};
  const double start = nowSec();
  int it = 0;
  for (; it < kMaxIterations && nowSec() - start < kMaxSeconds; ++it) {
    const Chaos c = pick(rng);
    SharedReports rep(kRanks);
    ASSERT_TRUE(rep.ok());
    MpOptions opt;
    opt.timeoutSec = 20;  // the harness kills a hung iteration (and reports it)
    opt.env = {{"FUSCO_FAULT", c.spec()}};
    opt.mayDie = {c.faulty};
    runRanks(
        kRanks, [&](const RankCtx& ctx) { runWorkload(ctx, kTimeoutMs, kRounds, &rep[ctx.rank]); },
        opt);
    std::string why;
    const std::string outcome = classify(rep, c, &why);
    ++counts[outcome];
    if (outcome != "clean" && outcome != "failed-cleanly")
      ADD_FAILURE() << "iteration " << it << " FUSCO_FAULT=" << c.spec() << ": " << outcome << ": "
                    << why;
    EXPECT_EQ(livingChildren(), 0) << "iteration " << it << " left rank processes behind";
  }
  std::cout << "[chaos] seed 0x" << std::hex << seed << std::dec << ", " << it << " iterations in "
            << static_cast<int>(nowSec() - start) << " s:";
  for (const auto& kv : counts) std::cout << " " << kv.first << "=" << kv.second;
  std::cout << std::endl;
  EXPECT_EQ(counts["hang"], 0);
  EXPECT_EQ(counts["silent-success"], 0);
  EXPECT_EQ(counts["wrong-error"], 0);
  EXPECT_GT(counts["failed-cleanly"], 0) << "no fault fired in " << it << " iterations";
}

}  // namespace
