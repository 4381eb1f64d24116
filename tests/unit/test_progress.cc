// The progress thread of a CUDA comm (exec/progress.h), on host memory: jobs in order, runSync
// after earlier jobs with the job's error message, watched waits satisfied, released on a dead
// peer or the timeout (by the abort word alone: a wait's own word is never written), a kernel's
// timeout report, and a thread that sleeps when idle.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/result.h"
#include "exec/progress.h"

namespace {

using fusco::Progress;

struct Broken {
  std::atomic<int> count{0};
  fuscoResult_t result = fuscoSuccess;
  std::string why;
};

std::unique_ptr<Progress> makeProgress(Broken* b, int64_t timeoutMs,
                                       std::function<fuscoResult_t(int)> check = nullptr) {
  if (!check) check = [](int) { return fuscoSuccess; };
  return std::make_unique<Progress>(timeoutMs, 5, check,
                                    [b](fuscoResult_t r, const std::string& why) {
                                      b->result = r;
                                      b->why = why;
                                      b->count++;
                                    });
}

double processCpuSec() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

TEST(Progress, RunsJobsInOrderAndRunSyncAfterThem) {
  Broken b;
  auto p = makeProgress(&b, 1000);
  std::vector<int> order;
  for (int i = 0; i < 100; ++i) p->post([&order, i] { order.push_back(i); });
  fuscoResult_t r = p->runSync([&] {
    order.push_back(100);
    return fuscoSuccess;
  });
  EXPECT_EQ(r, fuscoSuccess);
  ASSERT_EQ(order.size(), 101u);
  for (int i = 0; i <= 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(Progress, RunSyncCarriesTheJobsErrorMessageToTheCaller) {
  Broken b;
  auto p = makeProgress(&b, 1000);
  fusco::clearThreadLastError();
  fuscoResult_t r = p->runSync(
      [] { return FUSCO_FAIL(fuscoInvalidUsage, fusco::kEngine, "the job says no (%d)", 42); });
  EXPECT_EQ(r, fuscoInvalidUsage);
  EXPECT_NE(fusco::threadLastError().find("the job says no (42)"), std::string::npos)
      << fusco::threadLastError();
}

TEST(Progress, SatisfiedWaitsLeaveTheCommAlone) {
  Broken b;
  auto p = makeProgress(&b, 300);
  volatile uint32_t flag = 0;
  p->add(1, &flag, 3, "its data");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  flag = 3;
  p->drain();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(b.count.load(), 0) << b.why;
}

TEST(Progress, ReleasesWaitsAfterTheTimeoutAndNamesThePeer) {
  Broken b;
  auto p = makeProgress(&b, 100);
  std::atomic<int> aborts{0};
  p->setAbort([&aborts] { aborts++; }, [] { return std::string(); });
  volatile uint32_t flag = 0;
  p->add(2, &flag, 5, "its data");
  for (int i = 0; i < 200 && b.count == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(b.count.load(), 1);
  EXPECT_EQ(b.result, fuscoTimeout);
  EXPECT_EQ(aborts.load(), 1) << "the abort word ends the stream's waits";
  EXPECT_EQ(flag, 0u) << "a wait's own word is never written";
  EXPECT_NE(b.why.find("rank 2"), std::string::npos) << b.why;
  volatile uint32_t later = 0;
  p->add(2, &later, 9, "its data");
  p->drain();  // a broken comm watches no new wait: nothing to wait for
  EXPECT_EQ(later, 0u);
  EXPECT_EQ(b.count.load(), 1);
}

TEST(Progress, ReleasesWaitsWhenThePeerDies) {
  Broken b;
  auto p = makeProgress(&b, 60000, [](int peer) {
    return peer == 3 ? FUSCO_FAIL(fuscoRemoteError, fusco::kEngine, "rank 3 exited") : fuscoSuccess;
  });
  std::atomic<int> aborts{0};
  p->setAbort([&aborts] { aborts++; }, [] { return std::string(); });
  volatile uint32_t a = 0, c = 0;
  p->add(1, &a, 1, "its buffers to be free");
  p->add(3, &c, 1, "its data");
  for (int i = 0; i < 400 && b.count == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(b.count.load(), 1);
  EXPECT_EQ(b.result, fuscoRemoteError);
  EXPECT_EQ(aborts.load(), 1);
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(c, 0u);
  EXPECT_NE(b.why.find("rank 3"), std::string::npos) << b.why;
}

// A kernel's wait that gave up after its own bound (device/op_steps.h) breaks the comm with the
// kernel's report, naming its peer and phase, while a wait is watched.
TEST(Progress, AKernelsTimeoutBreaksTheCommWithItsReport) {
  Broken b;
  auto p = makeProgress(&b, 60000);
  std::atomic<bool> timedOut{false};
  std::atomic<int> aborts{0};
  p->setAbort([&aborts] { aborts++; },
              [&timedOut] {
                return timedOut ? std::string("kernel waited for rank 4 (done)") : std::string();
              });
  volatile uint32_t flag = 0;
  p->add(4, &flag, 1, "its data");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(b.count.load(), 0);
  timedOut = true;
  for (int i = 0; i < 400 && b.count == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(b.count.load(), 1);
  EXPECT_EQ(b.result, fuscoTimeout);
  EXPECT_EQ(aborts.load(), 1);
  EXPECT_NE(b.why.find("rank 4 (done)"), std::string::npos) << b.why;
}

TEST(Progress, SleepsWhenIdle) {
  Broken b;
  auto p = makeProgress(&b, 1000);
  ASSERT_EQ(p->runSync([] { return fuscoSuccess; }), fuscoSuccess);
  const double before = processCpuSec();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_LT(processCpuSec() - before, 0.05) << "an idle progress thread burnt a core";
}

TEST(Progress, DestructionRunsQueuedJobsFirst) {
  Broken b;
  std::atomic<int> ran{0};
  {
    auto p = makeProgress(&b, 1000);
    p->post([] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); });
    for (int i = 0; i < 10; ++i) p->post([&ran] { ran++; });
  }
  EXPECT_EQ(ran.load(), 10);
}

}  // namespace
