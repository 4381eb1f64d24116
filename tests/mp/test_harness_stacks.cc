// A hang shows where it waits: when a rank outlives the harness's timeout, the harness prints every
// thread's stack of that rank before it kills it (harness/stack_dump.h). With a debugger (gdb here,
// cuda-gdb on a GPU machine) the stacks name the functions; the /proc view, used when no debugger
// is installed, names each thread and the kernel function it sleeps in.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdlib>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "harness/mp_harness.h"
#include "harness/stack_dump.h"

// Where the hung rank's main thread waits: a named, external, never-inlined function that the
// stacks must show. The harness kills the rank.
extern "C" __attribute__((noinline)) void fuscoTestRankWaitsHere() {
  for (;;) {
    sleep(1000);  // long: the thread is asleep (state S) whenever the harness looks
    asm volatile("" ::: "memory");
  }
}

namespace {

using fusco::test::MpOptions;
using fusco::test::RankCtx;
using fusco::test::runRanks;

// Sets an environment variable for one test and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

struct HangResult {
  std::vector<std::string> failures;  // what runRanks reported
  std::string stderrText;             // what the harness printed meanwhile
};

// Two ranks with a 2 s timeout: rank 0 finishes, rank 1 starts a thread named "fusco-waiter" that
// sleeps and then waits in fuscoTestRankWaitsHere until the harness kills it.
HangResult hangOneRank() {
  MpOptions opt;
  opt.timeoutSec = 2;
  HangResult res;
  ::testing::TestPartResultArray results;
  ::testing::internal::CaptureStderr();
  {
    ::testing::ScopedFakeTestPartResultReporter rep(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    runRanks(
        2,
        [](const RankCtx& ctx) {
          if (ctx.rank != 1) return;
          std::thread waiter([] {
            pthread_setname_np(pthread_self(), "fusco-waiter");
            for (;;) sleep(1000);
          });
          waiter.detach();
          fuscoTestRankWaitsHere();
        },
        opt);
  }
  res.stderrText = ::testing::internal::GetCapturedStderr();
  for (int i = 0; i < results.size(); ++i)
    if (results.GetTestPartResult(i).failed())
      res.failures.push_back(results.GetTestPartResult(i).message());
  return res;
}

void expectOneTimeoutOfRank1(const HangResult& r) {
  ASSERT_EQ(r.failures.size(), 1u) << r.stderrText;
  EXPECT_NE(r.failures[0].find("rank 1 did not finish within 2 s"), std::string::npos)
      << r.failures[0];
  EXPECT_NE(r.failures[0].find("stacks are printed above"), std::string::npos) << r.failures[0];
  EXPECT_NE(r.stderrText.find("=== stacks of rank 1 of 2"), std::string::npos) << r.stderrText;
  EXPECT_EQ(r.stderrText.find("=== stacks of rank 0"), std::string::npos)
      << "rank 0 finished; only rank 1's stacks belong in the output:\n"
      << r.stderrText;
  EXPECT_NE(r.stderrText.find("=== end of the stacks of rank 1 of 2"), std::string::npos)
      << r.stderrText;
}

TEST(MpHarnessStacks, TimedOutRankPrintsEveryThreadsStackNamingWhereItWaits) {
  // The default tool: cuda-gdb or gdb where installed (CI installs gdb), else the /proc view.
  ScopedEnv timeout("FUSCO_TEST_STACK_TIMEOUT_SEC", "60");
  const std::string tool = fusco::test::stackToolName();
  HangResult r = hangOneRank();
  expectOneTimeoutOfRank1(r);
  EXPECT_NE(r.stderrText.find("fusco-waiter"), std::string::npos)
      << "every thread's stack, the helper thread's too:\n"
      << r.stderrText;
  if ((tool == "gdb" || tool == "cuda-gdb") &&
      r.stderrText.find("printed no stack; what it printed, then /proc") != std::string::npos) {
    // The debugger exists but may not attach here (no ptrace in this container): the harness
    // said so and fell back to /proc, which must then hold the threads.
    EXPECT_TRUE(std::regex_search(r.stderrText, std::regex("thread [0-9]+ \\(.*\\) state . wchan")))
        << r.stderrText;
    GTEST_SKIP() << tool << " could not read the rank's stacks here (the /proc view was checked):\n"
                 << r.stderrText;
  } else if (tool == "gdb" || tool == "cuda-gdb") {
    EXPECT_NE(r.stderrText.find("fuscoTestRankWaitsHere"), std::string::npos)
        << tool << " must show the function the rank waits in:\n"
        << r.stderrText;
  } else {
    EXPECT_TRUE(std::regex_search(r.stderrText, std::regex("thread [0-9]+ \\(.*\\) state . wchan")))
        << "no debugger here (" << tool << "): the /proc view of each thread:\n"
        << r.stderrText;
  }
}

TEST(MpHarnessStacks, WithoutADebuggerProcNamesEachThreadAndWhereItSleeps) {
  ScopedEnv tool("FUSCO_TEST_STACK_TOOL", "proc");
  HangResult r = hangOneRank();
  expectOneTimeoutOfRank1(r);
  EXPECT_NE(r.stderrText.find(", proc) ==="), std::string::npos) << r.stderrText;
  EXPECT_TRUE(std::regex_search(r.stderrText,
                                std::regex("thread [0-9]+ \\(fusco-waiter\\) state S wchan \\S+")))
      << r.stderrText;
  EXPECT_TRUE(
      std::regex_search(r.stderrText, std::regex("thread [0-9]+ \\(fusco_mp_tests\\) state S")))
      << r.stderrText;
}

TEST(MpHarnessStacks, AMissingDebuggerFallsBackToProc) {
  ScopedEnv tool("FUSCO_TEST_STACK_TOOL", "no-such-debugger");
  HangResult r = hangOneRank();
  expectOneTimeoutOfRank1(r);
  EXPECT_NE(r.stderrText.find("no-such-debugger is not installed; /proc instead"),
            std::string::npos)
      << r.stderrText;
  EXPECT_NE(r.stderrText.find("(fusco-waiter) state S"), std::string::npos) << r.stderrText;
}

}  // namespace
