// The guard of the CUDA rule (core/cuda_guard.h, docs/DESIGN.md "The CUDA rules"), driven on the
// host: a setup call made while a host-released stream wait is pending is refused naming the call,
// setup windows wait for the waits to drain and hold new ones back, the progress thread's waits are
// counted until satisfied or released, and a job stuck past the timeout is reported by the
// watchdog, which releases the waits.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "core/clock.h"
#include "core/cuda_guard.h"
#include "core/result.h"
#include "exec/progress.h"

namespace {

using fusco::CudaSetupWindow;
using fusco::Progress;

// Waits (up to 2 s) until the guard counts `n` pending waits.
bool pendingBecomes(size_t n) {
  for (int i = 0; i < 2000 && fusco::cudaGuardPending() != n; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return fusco::cudaGuardPending() == n;
}

// aborts (may be null) counts the times the progress thread set the abort word.
std::unique_ptr<Progress> quietProgress(int64_t timeoutMs, std::atomic<int>* broken,
                                        std::string* why, std::atomic<int>* aborts = nullptr) {
  auto p = std::make_unique<Progress>(
      timeoutMs, 5, [](int) { return fuscoSuccess; },
      [broken, why](fuscoResult_t, const std::string& w) {
        *why = w;
        broken->fetch_add(1);
      });
  p->setAbort(
      [aborts] {
        if (aborts != nullptr) aborts->fetch_add(1);
      },
      [] { return std::string(); });
  return p;
}

TEST(CudaGuard, SetupCallWhileAWaitIsPendingIsAnInternalErrorNamingTheCall) {
  ASSERT_EQ(fusco::cudaGuardPending(), 0u);
  const uint64_t before = fusco::cudaGuardViolations();
  EXPECT_EQ(fusco::cudaGuardSetup("cudaMalloc (a test)"), fuscoSuccess);
  fusco::cudaGuardWaitAdded();
  EXPECT_EQ(fusco::cudaGuardSetup("cudaMalloc (a test)"), fuscoInternalError);
  std::string last;
  EXPECT_EQ(fusco::cudaGuardViolations(&last), before + 1);
  EXPECT_NE(last.find("cudaMalloc (a test)"), std::string::npos) << last;
  EXPECT_NE(last.find("1 stream wait"), std::string::npos) << last;
  fusco::cudaGuardWaitsDone(1);
  EXPECT_EQ(fusco::cudaGuardSetup("cudaMalloc (a test)"), fuscoSuccess);
  EXPECT_EQ(fusco::cudaGuardViolations(), before + 1);
}

TEST(CudaGuard, WindowWaitsForPendingWaitsAndHoldsNewOnesBack) {
  fusco::cudaGuardWaitAdded();
  const int64_t start = fusco::nowNs();
  std::thread releaser([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    fusco::cudaGuardWaitsDone(1);
  });
  std::atomic<bool> added{false};
  std::thread adder;
  {
    CudaSetupWindow w;
    ASSERT_EQ(w.open(5000, "a test window"), fuscoSuccess);
    EXPECT_GE(fusco::nowNs() - start, 90 * 1000000LL);
    EXPECT_EQ(fusco::cudaGuardSetup("cudaFree (inside the window)"), fuscoSuccess);
    adder = std::thread([&added] {
      fusco::cudaGuardWaitAdded();  // blocks until the window closes
      added = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(added.load());
  }
  adder.join();
  releaser.join();
  EXPECT_TRUE(added.load());
  fusco::cudaGuardWaitsDone(1);
  EXPECT_EQ(fusco::cudaGuardPending(), 0u);
}

TEST(CudaGuard, WindowGivesUpAfterTheTimeoutNamingWhatItWasFor) {
  fusco::cudaGuardWaitAdded();
  CudaSetupWindow w;
  fusco::clearThreadLastError();
  EXPECT_EQ(w.open(50, "growing the test's scratch"), fuscoTimeout);
  EXPECT_NE(fusco::threadLastError().find("growing the test's scratch"), std::string::npos)
      << fusco::threadLastError();
  EXPECT_FALSE(w.isOpen());
  fusco::cudaGuardWaitsDone(1);
}

TEST(CudaGuard, ProgressCountsItsWaitsUntilSatisfiedOrReleased) {
  std::atomic<int> broken{0};
  std::string why;
  std::atomic<int> aborts{0};
  auto p = quietProgress(10000, &broken, &why, &aborts);
  volatile uint32_t a = 0, b = 0;
  p->add(1, &a, 1, "rank 1's data");
  p->add(2, &b, 1, "rank 2's data");
  EXPECT_EQ(fusco::cudaGuardPending(), 2u);
  EXPECT_EQ(fusco::cudaGuardSetup("cudaIpcOpenMemHandle (a test)"), fuscoInternalError);
  a = 1;
  EXPECT_TRUE(pendingBecomes(1));
  p->release(fuscoRemoteError, "a test breaks the comm");
  EXPECT_EQ(fusco::cudaGuardPending(), 0u);
  EXPECT_EQ(aborts.load(), 1);  // released: the abort word ends the kernel's wait
  EXPECT_EQ(b, 0u);
  p.reset();
  EXPECT_EQ(fusco::cudaGuardPending(), 0u);
}

// The misplacement the first GPU run deadlocked on, as the code made it: a progress job (resolving
// an operation) makes a setup call while the operation's GO wait is still pending.
TEST(CudaGuard, CatchesASetupCallOfAProgressJobWhileItsOperationWaits) {
  std::atomic<int> broken{0};
  std::string why;
  auto p = quietProgress(10000, &broken, &why);
  volatile uint32_t go = 0;
  p->add(-1, &go, 1, "the call's peers to agree");
  fuscoResult_t inJob = fuscoSuccess;
  std::string message;
  p->post([&] {
    inJob = fusco::cudaGuardSetup("cudaMalloc (scratch while resolving an operation)");
    message = fusco::threadLastError();
    go = 1;
  });
  EXPECT_EQ(p->runSync([] { return fuscoSuccess; }), fuscoSuccess);
  EXPECT_EQ(inJob, fuscoInternalError);
  EXPECT_NE(message.find("scratch while resolving an operation"), std::string::npos) << message;
  EXPECT_TRUE(pendingBecomes(0));
}

TEST(CudaGuard, WatchdogReleasesTheStreamsOfAJobStuckPastTheTimeout) {
  std::atomic<int> broken{0};
  std::string why;
  std::atomic<int> aborts{0};
  auto p = quietProgress(200, &broken, &why, &aborts);
  volatile uint32_t go = 0;
  p->add(-1, &go, 7, "the call's peers to agree");
  std::atomic<bool> leave{false};
  p->post(
      [&] {
        p->setDoing("a test job stuck in cudaIpcOpenMemHandle");
        while (!leave) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      },
      "a test job");
  for (int i = 0; i < 300 && broken.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(broken.load(), 1);
  EXPECT_EQ(aborts.load(), 1);  // the kernel's GO wait was released through the abort word
  EXPECT_NE(why.find("stuck in cudaIpcOpenMemHandle"), std::string::npos) << why;
  EXPECT_EQ(fusco::cudaGuardPending(), 0u);
  leave = true;
  p.reset();
}

}  // namespace
