// fuscoCommAbort from another thread, as a careless user (or a watchdog) makes it (fusco.h: an
// abort may come from any thread while the comm is in use, and wakes every blocked call): the text
// of fuscoGetLastError stays the reader's, calls racing the abort get a clean error, and every wait
// of a comm, its bootstrap's included, ends within half a second of the abort.
#include <gtest/gtest.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "harness/ll_cases.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::MpOptions;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;

// A comm of this process alone, made from a fresh unique id.
fuscoComm_t soloComm() {
  fuscoUniqueId id;
  fuscoComm_t comm = nullptr;
  EXPECT_EQ(fuscoGetUniqueId(&id), fuscoSuccess) << fuscoGetLastError(nullptr);
  EXPECT_EQ(fuscoCommInitRank(&comm, 1, id, 0), fuscoSuccess) << fuscoGetLastError(nullptr);
  return comm;
}

double threadCpuSec() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// The text fuscoGetLastError(comm) returned before another thread aborted comm is still the same
// text afterwards, also once the heap has handed out the comm's memory again; and reading it
// while the abort runs never touches the freed comm (ASan in CI sees every such read).
TEST(AbortRace, LastErrorTextStaysTheReadersWhileAnotherThreadAborts) {
  runRanks(1, [](const RankCtx&) {
    const std::string want = "fuscoMemAlloc: bytes is 0";
    for (int i = 0; i < 40; ++i) {
      fuscoComm_t comm = soloComm();
      ASSERT_NE(comm, nullptr);
      // Another thread's failure is the comm's last error; this thread has none of its own.
      std::thread([comm] {
        void* p = nullptr;
        EXPECT_EQ(fuscoMemAlloc(comm, &p, 0), fuscoInvalidArgument);
      }).join();
      const char* text = fuscoGetLastError(comm);
      ASSERT_STREQ(text, want.c_str());
      std::atomic<bool> done{false};
      std::thread aborter([&] {
        usleep(static_cast<useconds_t>((i % 5) * 200));
        EXPECT_EQ(fuscoCommAbort(comm), fuscoSuccess) << fuscoGetLastError(nullptr);
        done = true;
      });
      // Another reader races the abort: it sees the text or, once the comm is gone, "".
      std::thread racer([&] {
        while (!done) {
          const std::string got = fuscoGetLastError(comm);
          if (got != want && !got.empty()) {
            ADD_FAILURE() << "fuscoGetLastError during an abort: '" << got << "'";
            break;
          }
        }
      });
      aborter.join();
      racer.join();
      std::vector<std::string> churn(256, std::string(want.size(), 'x'));  // reuse freed blocks
      EXPECT_STREQ(text, want.c_str()) << "the text changed under its reader after the abort";
    }
  });
}

// A thread keeps calling on a comm while another aborts it: every call succeeds or fails cleanly
// (fuscoInvalidArgument: not live; fuscoInvalidUsage: aborted), never fuscoInternalError.
TEST(AbortRace, CallsRacingAnAbortGetACleanErrorNeverAnInternalOne) {
  runRanks(1, [](const RankCtx&) {
    int failures = 0;
    for (int i = 0; i < 60; ++i) {
      fuscoComm_t comm = soloComm();
      ASSERT_NE(comm, nullptr);
      std::atomic<bool> go{false};
      std::thread caller([&] {
        go = true;
        for (int k = 0; k < 100000; ++k) {
          fuscoResult_t async = fuscoSuccess;
          int count = 0;
          fuscoResult_t r =
              k % 2 == 0 ? fuscoCommGetAsyncError(comm, &async) : fuscoCommCount(comm, &count);
          if (r == fuscoSuccess) continue;
          const std::string why = fuscoGetLastError(nullptr);
          EXPECT_TRUE(r == fuscoInvalidArgument || r == fuscoInvalidUsage)
              << fuscoGetErrorString(r) << ": " << why;
          EXPECT_TRUE(why.find("not a live communicator") != std::string::npos ||
                      why.find("aborted") != std::string::npos)
              << why;
          ++failures;
          return;
        }
      });
      while (!go) std::this_thread::yield();
      usleep(static_cast<useconds_t>((i % 7) * 100));
      EXPECT_EQ(fuscoCommAbort(comm), fuscoSuccess) << fuscoGetLastError(nullptr);
      caller.join();
    }
    EXPECT_GT(failures, 0) << "no call ever met the abort";
  });
}

// Rank `waiter` blocks in `call` while the other rank is late; another thread of the waiter aborts
// its comm after 300 ms. The call returns within half a second of the abort with an error saying
// so, and the abort itself sleeps while it waits for the call to leave. The late rank then meets
// a comm whose peer is gone and fails instead of waiting (its `late` body says how).
struct AbortCase {
  std::function<fuscoResult_t(fuscoComm_t)> setup;  // both ranks, before the late one sleeps
  std::function<fuscoResult_t(fuscoComm_t)> call;   // the blocked call
  std::function<void(fuscoComm_t)> late;            // the late rank, after its sleep
};

void abortWakes(int waiter, const AbortCase& k) {
  runRanks(2, [waiter, &k](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx, 60000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    if (k.setup) FUSCO_ASSERT_OK(comm, k.setup(comm));
    if (ctx.rank != waiter) {
      usleep(2500 * 1000);
      k.late(comm);
      return;
    }
    double abortWall = 0, abortCpu = 0;
    std::thread aborter([&] {
      usleep(300 * 1000);
      const double t0 = nowSec(), c0 = threadCpuSec();
      EXPECT_EQ(fuscoCommAbort(comm), fuscoSuccess) << fuscoGetLastError(nullptr);
      abortWall = nowSec() - t0;
      abortCpu = threadCpuSec() - c0;
    });
    const double t0 = nowSec();
    const fuscoResult_t r = k.call(comm);
    const double took = nowSec() - t0;
    const std::string why = fuscoGetLastError(nullptr);
    aborter.join();
    EXPECT_EQ(r, fuscoInvalidUsage) << fuscoGetErrorString(r) << ": " << why;
    EXPECT_NE(why.find("abort"), std::string::npos) << why;
    EXPECT_LT(took, 0.8) << "the call woke " << took - 0.3 << " s after the abort";
    EXPECT_LT(abortWall, 0.8);
    EXPECT_LT(abortCpu, 0.5 * abortWall + 0.01) << "the abort spun while it waited";
  });
}

void gatherLate(fuscoComm_t comm) {
  char mine = 1, all[2];
  EXPECT_NE(fuscoCommHostAllGather(comm, &mine, all, 1), fuscoSuccess) << "a peer aborted";
  EXPECT_EQ(fuscoCommDestroy(comm), fuscoSuccess) << fuscoGetLastError(nullptr);
}

fuscoResult_t gather(fuscoComm_t comm) {
  char mine = 1, all[2];
  return fuscoCommHostAllGather(comm, &mine, all, 1);
}

TEST(AbortWakes, AHostAllGatherOfTheRootWaitingForALatePeer) {
  abortWakes(0, AbortCase{nullptr, gather, gatherLate});
}

TEST(AbortWakes, AHostAllGatherOfAPeerWaitingForTheRoot) {
  abortWakes(1, AbortCase{nullptr, gather, gatherLate});
}

fuscoResult_t llCreateOnly(fuscoComm_t comm) {
  const fuscoLowLatencyConfig_t lc = fusco::test::llConfig(fusco::test::llSmallCase(2));
  fuscoLowLatency_t ll = nullptr;
  return fuscoLowLatencyCreate(&ll, comm, &lc);
}

TEST(AbortWakes, ALowLatencyCreateWaitingForALatePeer) {
  abortWakes(0, AbortCase{nullptr, llCreateOnly, [](fuscoComm_t comm) {
                            EXPECT_NE(llCreateOnly(comm), fuscoSuccess) << "a peer aborted";
                            fuscoCommAbort(comm);
                          }});
}

// The buffer the setup of the next cases made (one per rank process).
fuscoLowLatency_t gLl = nullptr;

fuscoResult_t llSetup(fuscoComm_t comm) {
  gLl = fusco::test::llCreate(comm, fusco::test::llSmallCase(2));
  return gLl != nullptr ? fuscoSuccess : fuscoInternalError;
}

// The late rank's buffer goes with an abort (its peer is gone; a destroy would wait for it).
void llLate(fuscoComm_t comm) {
  EXPECT_EQ(fuscoCommAbort(comm), fuscoSuccess);
  EXPECT_EQ(fuscoLowLatencyDestroy(gLl), fuscoSuccess) << fuscoGetLastError(nullptr);
}

TEST(AbortWakes, ALowLatencyDestroyWaitingForALatePeer) {
  abortWakes(1,
             AbortCase{llSetup, [](fuscoComm_t) { return fuscoLowLatencyDestroy(gLl); }, llLate});
}

TEST(AbortWakes, ALowLatencyDispatchWaitingForALatePeer) {
  auto dispatch = [](fuscoComm_t) {
    const fusco::test::LlCase c = fusco::test::llSmallCase(2);
    const fusco::test::LlInputs in = fusco::test::makeLlInputs(c, 7);
    fuscoLowLatencyDispatch_t d;
    const fuscoResult_t r = fusco::test::llDispatchCall(gLl, in, 0, FUSCO_LL_BF16, 0, &d);
    return r;
  };
  abortWakes(0, AbortCase{llSetup, dispatch, [](fuscoComm_t comm) {
                            EXPECT_EQ(fuscoCommAbort(comm), fuscoSuccess);
                            EXPECT_EQ(fuscoLowLatencyDestroy(gLl), fuscoSuccess);
                          }});
}

}  // namespace
