// Faults: a rank killed before or during a call, a rank that never arrives at init, an abort from
// another thread. Survivors must get fuscoRemoteError or fuscoTimeout within the timeout plus a
// margin, with a message naming the dead rank; nothing hangs and nothing is left in /dev/shm.
#include <fcntl.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "core/bootstrap.h"
#include "harness/data_gen.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::makeA2avLayout;
using fusco::test::MpOptions;
using fusco::test::namesRank;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;

constexpr int kTimeoutMs = 5000;
constexpr double kSurviveSec = 15.0;  // timeoutMs + a generous margin on 2 oversubscribed cores

fuscoConfig_t faultConfig(int timeoutMs = kTimeoutMs) {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = timeoutMs;
  return cfg;
}

bool isFaultError(fuscoResult_t r) { return r == fuscoRemoteError || r == fuscoTimeout; }

// What a survivor checks after its call failed because `dead` died.
void expectSurvivorSawDeath(fuscoComm_t comm, fuscoResult_t r, double sec, int dead) {
  const std::string msg = fuscoGetLastError(comm);
  EXPECT_TRUE(isFaultError(r)) << "got " << fuscoGetErrorString(r) << " (" << msg
                               << "); expected fuscoRemoteError or fuscoTimeout";
  EXPECT_LT(sec, kSurviveSec) << "the failed call took " << sec << " s";
  EXPECT_TRUE(namesRank(msg, dead)) << "message '" << msg << "' should name rank " << dead;
  fuscoResult_t async = fuscoSuccess;
  EXPECT_EQ(fuscoCommGetAsyncError(comm, &async), fuscoSuccess);
  EXPECT_NE(async, fuscoSuccess) << "a comm whose peer died must report an async error";
  double t0 = nowSec();
  EXPECT_EQ(fuscoCommDestroy(comm), fuscoSuccess)
      << "destroy after a peer died: " << fuscoGetLastError(nullptr);
  EXPECT_LT(nowSec() - t0, 5.0) << "destroy must not wait for the dead peer";
}

// Rank 3 dies (SIGKILL) while the others are entering a 4 MiB-per-peer all-to-all.
TEST(FaultKill, PeerKilledBeforeLargeAllToAllFailsEverySurvivor) {
  MpOptions opt;
  opt.mayDie = {3};
  runRanks(
      4,
      [](const RankCtx& ctx) {
        fuscoConfig_t cfg = faultConfig();
        fuscoComm_t comm = initComm(ctx, &cfg);
        // One good call first, so every connection is up.
        auto small =
            makeA2avLayout(fusco::test::uniformCountMatrix(4, 100), 4, ctx.rank, 4, 1, false);
        ASSERT_TRUE(fusco::test::allToAllvRoundTrip(comm, small, fuscoInt32, 1));
        if (ctx.rank == 3) {
          usleep(300 * 1000);
          raise(SIGKILL);
        }
        const size_t count = 1 << 20;  // 4 MiB of float32 per peer
        std::vector<float> send(4 * count, 1.0f), recv(4 * count);
        double t0 = nowSec();
        fuscoResult_t r =
            fuscoAllToAll(send.data(), recv.data(), count, fuscoFloat32, comm, nullptr);
        expectSurvivorSawDeath(comm, r, nowSec() - t0, 3);
      },
      opt);
}

// Rank 2 is killed by a timer thread while the ranks loop over medium all-to-alls, so it dies in
// the middle of some call.
TEST(FaultKill, PeerKilledDuringALoopOfCallsFailsEverySurvivor) {
  MpOptions opt;
  opt.mayDie = {2};
  runRanks(
      3,
      [](const RankCtx& ctx) {
        fuscoConfig_t cfg = faultConfig();
        fuscoComm_t comm = initComm(ctx, &cfg);
        if (ctx.rank == 2) {
          std::thread([] {
            usleep(500 * 1000);
            raise(SIGKILL);
          }).detach();
        }
        const size_t count = 256 * 1024;  // 1 MiB per peer
        std::vector<uint8_t> send(3 * count * 4), recv(3 * count * 4);
        auto l =
            makeA2avLayout(fusco::test::uniformCountMatrix(3, count), 3, ctx.rank, 4, 7, false);
        fusco::test::fillSend(l, send.data(), 7);
        const double start = nowSec();
        for (int it = 0; nowSec() - start < 60; ++it) {
          double t0 = nowSec();
          fuscoResult_t r =
              fuscoAllToAll(send.data(), recv.data(), count, fuscoFloat32, comm, nullptr);
          if (r != fuscoSuccess) {
            expectSurvivorSawDeath(comm, r, nowSec() - t0, 2);
            return;
          }
          // Every call that did succeed moved the right bytes.
          ASSERT_TRUE(fusco::test::checkRecv(l, recv.data(), 7)) << "iteration " << it;
        }
        ADD_FAILURE() << "calls kept succeeding for 60 s after rank 2 was killed";
      },
      opt);
}

// Rank 2 kills itself at the start of iteration 50 of a loop of small calls.
TEST(FaultKill, PeerKilledBetweenSmallCallsFailsTheNextCall) {
  MpOptions opt;
  opt.mayDie = {2};
  runRanks(
      3,
      [](const RankCtx& ctx) {
        fuscoConfig_t cfg = faultConfig();
        fuscoComm_t comm = initComm(ctx, &cfg);
        for (int it = 0; it < 200; ++it) {
          if (ctx.rank == 2 && it == 50) raise(SIGKILL);
          auto l =
              makeA2avLayout(fusco::test::uniformCountMatrix(3, 16), 3, ctx.rank, 4, it, false);
          std::vector<uint8_t> send(l.sendElems * 4), recv(l.recvElems * 4);
          fusco::test::fillSend(l, send.data(), it);
          fusco::test::poisonRecv(l, recv.data());
          double t0 = nowSec();
          fuscoResult_t r = fuscoAllToAll(send.data(), recv.data(), 16, fuscoInt32, comm, nullptr);
          if (r != fuscoSuccess) {
            // Iteration 49 completed on rank 2 before it died; its data may or may not have been
            // collected, so the first failure is iteration 49 at the earliest.
            EXPECT_GE(it, 49) << "a call failed before rank 2 died";
            EXPECT_LE(it, 50) << "calls succeeded without rank 2";
            expectSurvivorSawDeath(comm, r, nowSec() - t0, 2);
            return;
          }
          ASSERT_TRUE(fusco::test::checkRecv(l, recv.data(), it)) << "iteration " << it;
        }
        ADD_FAILURE() << "200 calls succeeded although rank 2 died at iteration 50";
      },
      opt);
}

// A peer that dies during a group of sends and receives.
TEST(FaultKill, PeerKilledDuringGroupSendRecvFailsTheOtherSide) {
  MpOptions opt;
  opt.mayDie = {1};
  runRanks(
      2,
      [](const RankCtx& ctx) {
        fuscoConfig_t cfg = faultConfig();
        fuscoComm_t comm = initComm(ctx, &cfg);
        if (ctx.rank == 1) {
          usleep(300 * 1000);
          raise(SIGKILL);
        }
        const size_t count = 4 << 20;
        std::vector<uint8_t> send(count, 1), recv(count);
        double t0 = nowSec();
        fuscoResult_t r = fuscoGroupStart();
        EXPECT_EQ(r, fuscoSuccess);
        EXPECT_EQ(fuscoSend(send.data(), count, fuscoUint8, 1, comm, nullptr), fuscoSuccess);
        EXPECT_EQ(fuscoRecv(recv.data(), count, fuscoUint8, 1, comm, nullptr), fuscoSuccess);
        r = fuscoGroupEnd();
        expectSurvivorSawDeath(comm, r, nowSec() - t0, 1);
      },
      opt);
}

// A rank that never calls init: the others time out (timeoutMs 2000) promptly, naming it.
TEST(FaultInit, RankThatNeverCallsInitMakesOthersTimeOut) {
  runRanks(3, [](const RankCtx& ctx) {
    if (ctx.rank == 2) {
      usleep(3 * 1000 * 1000);  // outlives the others' 2 s timeout
      return;
    }
    fuscoConfig_t cfg = faultConfig(2000);
    fuscoComm_t comm = nullptr;
    double t0 = nowSec();
    fuscoResult_t r = fuscoCommInitRankConfig(&comm, ctx.nranks, ctx.id, ctx.rank, &cfg);
    double sec = nowSec() - t0;
    const std::string msg = fuscoGetLastError(nullptr);
    EXPECT_EQ(r, fuscoTimeout) << msg;
    EXPECT_EQ(comm, nullptr);
    EXPECT_GE(sec, 1.5) << "gave up before the timeout";
    EXPECT_LT(sec, 4.5) << "timeoutMs 2000 took " << sec << " s";
    EXPECT_TRUE(namesRank(msg, 2)) << "message '" << msg << "' should name the missing rank 2";
  });
}

TEST(FaultInit, RootThatNeverCallsInitMakesOthersTimeOut) {
  runRanks(3, [](const RankCtx& ctx) {
    if (ctx.rank == 0) {
      usleep(3 * 1000 * 1000);  // holds the root's socket but never accepts
      return;
    }
    fuscoConfig_t cfg = faultConfig(2000);
    fuscoComm_t comm = nullptr;
    double t0 = nowSec();
    fuscoResult_t r = fuscoCommInitRankConfig(&comm, ctx.nranks, ctx.id, ctx.rank, &cfg);
    double sec = nowSec() - t0;
    EXPECT_EQ(r, fuscoTimeout) << fuscoGetLastError(nullptr);
    EXPECT_EQ(comm, nullptr);
    EXPECT_LT(sec, 4.5) << "timeoutMs 2000 took " << sec << " s";
  });
}

// fuscoCommAbort from a second thread wakes a call that waits for peers that never come.
TEST(FaultAbort, AbortFromAnotherThreadWakesABlockedCall) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = faultConfig(30000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    if (ctx.rank != 0) {
      // Never join the call; stay alive (so no liveness check fires) until rank 0 is done.
      usleep(2 * 1000 * 1000);
      FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      return;
    }
    std::thread aborter([comm] {
      usleep(500 * 1000);
      EXPECT_EQ(fuscoCommAbort(comm), fuscoSuccess);
    });
    std::vector<int32_t> send(3 * 1000, 5), recv(3 * 1000);
    double t0 = nowSec();
    fuscoResult_t r = fuscoAllToAll(send.data(), recv.data(), 1000, fuscoInt32, comm, nullptr);
    double sec = nowSec() - t0;
    aborter.join();
    EXPECT_NE(r, fuscoSuccess) << "an aborted call must not report success";
    EXPECT_LT(sec, 2.5) << "abort took " << sec << " s to wake the call (timeout is 30 s)";
  });
}

// The call that fuscoCommAbort woke says it was aborted, and does not quote the timeout as if it
// had expired.
TEST(FaultAbort, AbortedCallSaysItWasAbortedNotThatItTimedOut) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = faultConfig(30000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    if (ctx.rank != 0) {
      usleep(2 * 1000 * 1000);  // never joins the call, stays alive
      FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      return;
    }
    std::thread aborter([comm] {
      usleep(300 * 1000);
      EXPECT_EQ(fuscoCommAbort(comm), fuscoSuccess);
    });
    std::vector<int32_t> send(2 * 100, 5), recv(2 * 100);
    fuscoResult_t r = fuscoAllToAll(send.data(), recv.data(), 100, fuscoInt32, comm, nullptr);
    const std::string msg = fuscoGetLastError(nullptr);  // the comm is gone: this thread's error
    aborter.join();
    EXPECT_EQ(r, fuscoInvalidUsage) << msg;
    EXPECT_NE(msg.find("aborted (fuscoCommAbort)"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("timeout"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("30000 ms"), std::string::npos) << msg;
  });
}

// ---------------------------------------------------------------- the harness itself
// The fault tests rely on the harness noticing crashes, hangs and leftovers; these check that it
// does, by collecting what runRanks reports instead of letting it fail this test.

std::vector<std::string> failuresOf(const std::function<void()>& fn) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter rep(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    fn();
  }
  std::vector<std::string> out;
  for (int i = 0; i < results.size(); ++i)
    if (results.GetTestPartResult(i).failed())
      out.push_back(results.GetTestPartResult(i).message());
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += "\n  [" + x + "]";
  return s;
}

TEST(MpHarness, RankFailuresReachTheParentNamedByRank) {
  auto f = failuresOf([] {
    runRanks(3, [](const RankCtx& ctx) {
      if (ctx.rank == 1) ADD_FAILURE() << "marker-from-the-rank";
    });
  });
  ASSERT_EQ(f.size(), 1u) << joined(f);
  EXPECT_NE(f[0].find("rank 1: "), std::string::npos) << f[0];
  EXPECT_NE(f[0].find("marker-from-the-rank"), std::string::npos) << f[0];
}

TEST(MpHarness, FatalFailureEndsOnlyThatRanksBody) {
  auto f = failuresOf([] {
    runRanks(2, [](const RankCtx& ctx) {
      if (ctx.rank == 0) {
        ASSERT_EQ(1, 2) << "fatal-marker";
        ADD_FAILURE() << "not reached";
      }
    });
  });
  ASSERT_EQ(f.size(), 1u) << joined(f);
  EXPECT_NE(f[0].find("fatal-marker"), std::string::npos) << f[0];
}

TEST(MpHarness, FailedInitCommEndsTheRankBody) {
  auto f = failuresOf([] {
    runRanks(1, [](const RankCtx& ctx) {
      RankCtx bad = ctx;
      memset(&bad.id, 0, sizeof(bad.id));
      initComm(bad);
      ADD_FAILURE() << "not reached";
    });
  });
  ASSERT_EQ(f.size(), 1u) << joined(f);
  EXPECT_NE(f[0].find("fuscoCommInitRank"), std::string::npos) << f[0];
}

TEST(MpHarness, CrashedOrFailingExitRankIsAFailureNamingIt) {
  auto f = failuresOf([] {
    runRanks(3, [](const RankCtx& ctx) {
      if (ctx.rank == 1) raise(SIGABRT);
      if (ctx.rank == 2) _exit(7);
    });
  });
  ASSERT_EQ(f.size(), 2u) << joined(f);
  EXPECT_NE(f[0].find("rank 1 was killed by signal"), std::string::npos) << f[0];
  EXPECT_NE(f[1].find("rank 2 exited with status 7"), std::string::npos) << f[1];
}

TEST(MpHarness, RankInMayDieMayBeKilled) {
  MpOptions opt;
  opt.mayDie = {1};
  auto f = failuresOf([&] {
    runRanks(
        2,
        [](const RankCtx& ctx) {
          if (ctx.rank == 1) raise(SIGKILL);
        },
        opt);
  });
  EXPECT_TRUE(f.empty()) << joined(f);
}

TEST(MpHarness, HungRankIsKilledAtTheTimeout) {
  MpOptions opt;
  opt.timeoutSec = 1;
  // The hung rank's stacks from /proc (milliseconds; a debugger's take longer than this test's
  // bound). The stacks themselves: MpHarnessStacks.*.
  const char* oldTool = getenv("FUSCO_TEST_STACK_TOOL");
  const std::string savedTool = oldTool != nullptr ? oldTool : "";
  setenv("FUSCO_TEST_STACK_TOOL", "proc", 1);
  double t0 = nowSec();
  auto f = failuresOf([&] {
    runRanks(
        2,
        [](const RankCtx& ctx) {
          if (ctx.rank == 0) sleep(30);
        },
        opt);
  });
  if (oldTool != nullptr)
    setenv("FUSCO_TEST_STACK_TOOL", savedTool.c_str(), 1);
  else
    unsetenv("FUSCO_TEST_STACK_TOOL");
  EXPECT_LT(nowSec() - t0, 5.0);
  ASSERT_EQ(f.size(), 1u) << joined(f);
  EXPECT_NE(f[0].find("rank 0 did not finish within 1 s"), std::string::npos) << f[0];
}

TEST(MpHarness, EnvironmentIsSetInEveryRankBeforeTheBody) {
  MpOptions opt;
  opt.env = {{"FUSCO_TIMEOUT_MS", "4321"}, {"FUSCO_HARNESS_MARKER", "yes"}};
  runRanks(
      2,
      [](const RankCtx& ctx) {
        const char* m = getenv("FUSCO_HARNESS_MARKER");
        EXPECT_TRUE(m != nullptr && std::string(m) == "yes");
        EXPECT_EQ(fusco::paramTimeoutMs(), 4321) << "params must be reloaded";
        EXPECT_EQ(ctx.nranks, 2);
      },
      opt);
  EXPECT_EQ(getenv("FUSCO_HARNESS_MARKER"), nullptr) << "the parent's environment must not change";
}

TEST(MpHarness, LeftoverShmEntryIsAFailureAndIsRemoved) {
  const std::string name = "/dev/shm/fusco-harness-selftest-" + std::to_string(getpid());
  auto f = failuresOf([&] {
    runRanks(1, [&](const RankCtx&) {
      int fd = open(name.c_str(), O_CREAT | O_RDWR, 0600);
      ASSERT_GE(fd, 0);
      close(fd);
    });
  });
  ASSERT_EQ(f.size(), 1u) << joined(f);
  EXPECT_NE(f[0].find("left behind"), std::string::npos) << f[0];
  EXPECT_NE(access(name.c_str(), F_OK), 0) << name << " should have been removed";
}

TEST(MpHarness, ManyFailuresAreCappedAndDoNotBlockTheRank) {
  auto f = failuresOf([] {
    runRanks(1, [](const RankCtx&) {
      for (int i = 0; i < 20000; ++i) ADD_FAILURE() << "failure " << i << std::string(100, 'x');
    });
  });
  ASSERT_EQ(f.size(), 31u);
  EXPECT_NE(f.back().find("19970 more failures not shown"), std::string::npos) << f.back();
}

}  // namespace
