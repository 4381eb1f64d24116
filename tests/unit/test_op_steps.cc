// The operation kernel's waits (src/device/op_steps.h) on the host, with a fake clock: a wait ends
// when its word arrives, when the abort word is set, or after the timeout without progress, which
// it reports once (the first timeout's peer and phase) before aborting every other wait.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "device/op_steps.h"

namespace {

using namespace fusco::op;

constexpr uint64_t kTimeout = 1000;

// One wait on one word, polled at a time the test chooses.
struct Waiter {
  uint64_t word = 0;
  OpWords words{};
  Wait w{};
  WaitStatus poll(uint64_t want, uint64_t now, uint32_t peer = 3, uint32_t phase = kPhaseReady) {
    return pollWait(w, &word, want, &words, now, kTimeout, peer, phase);
  }
};

uint64_t steadyNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

TEST(OpSteps, ReadyWhenTheWordReachesTheValue) {
  Waiter a;
  a.word = 3;
  EXPECT_EQ(a.poll(0, 0), kReady);
  EXPECT_EQ(a.poll(5, 0), kPending);
  EXPECT_EQ(a.poll(5, 10), kPending);
  a.word = 5;
  EXPECT_EQ(a.poll(5, 20), kReady);
  a.word = 9;
  EXPECT_EQ(a.poll(5, 30), kReady);
  EXPECT_EQ(a.words.abort, 0u);
  EXPECT_EQ(a.words.timedOut, 0u);
}

TEST(OpSteps, AbortIsHonouredAtEveryPhase) {
  for (uint32_t phase = 0; phase < kPhases; ++phase) {
    Waiter a;
    for (int i = 0; i < 10; ++i) ASSERT_EQ(a.poll(1, 0, 2, phase), kPending) << phaseName(phase);
    a.words.abort = 1;
    uint32_t polls = 0;
    WaitStatus s = kPending;
    while (s == kPending && polls <= kAbortEvery) {
      s = a.poll(1, 0, 2, phase);
      ++polls;
    }
    EXPECT_EQ(s, kAborted) << phaseName(phase);
    EXPECT_EQ(a.words.timedOut, 0u);
    EXPECT_EQ(a.words.phase, 0u);
    EXPECT_EQ(a.words.claim, 0u);
  }
}

TEST(OpSteps, ATimeoutNamesItsPeerAndPhase) {
  Waiter a;
  a.word = 4;
  EXPECT_EQ(a.poll(5, 100, 6, kPhaseHead), kPending);
  EXPECT_EQ(a.poll(5, 100 + kTimeout, 6, kPhaseHead), kPending);
  EXPECT_EQ(a.words.abort, 0u);
  EXPECT_EQ(a.poll(5, 101 + kTimeout, 6, kPhaseHead), kTimedOut);
  EXPECT_EQ(a.words.timedOut, 7u);
  EXPECT_EQ(a.words.phase, static_cast<uint32_t>(kPhaseHead));
  EXPECT_EQ(a.words.abort, 1u);
  EXPECT_STREQ(phaseName(a.words.phase), "ring credit");
}

TEST(OpSteps, TheClockRestartsWhenTheWordMoves) {
  Waiter a;
  const uint64_t want = 1000000;
  uint64_t now = 0, moved = 0;
  for (; now < 50 * kTimeout; now += 10) {
    if (now % (kTimeout / 2) == 0) {
      ++a.word;
      moved = now;
    }
    ASSERT_EQ(a.poll(want, now), kPending) << now;
  }
  WaitStatus s = kPending;
  for (; now < moved + 3 * kTimeout; now += 10) {
    s = a.poll(want, now);
    if (s != kPending) break;
  }
  EXPECT_EQ(s, kTimedOut);
  EXPECT_GT(now - moved, kTimeout);
  EXPECT_LE(now - moved, kTimeout + 10);
  EXPECT_EQ(a.words.timedOut, 4u);
}

TEST(OpSteps, TheFirstTimeoutWins) {
  Waiter a;
  Wait second{};
  const uint64_t other = 0;
  // The second wait reads the abort word on its first poll, before anything timed out.
  EXPECT_EQ(pollWait(second, &other, 1, &a.words, 0, kTimeout, 9, kPhaseDone), kPending);
  EXPECT_EQ(a.poll(1, 0, 2, kPhaseTail), kPending);
  EXPECT_EQ(a.poll(1, kTimeout + 1, 2, kPhaseTail), kTimedOut);
  EXPECT_EQ(pollWait(second, &other, 1, &a.words, kTimeout + 2, kTimeout, 9, kPhaseDone),
            kTimedOut);
  EXPECT_EQ(a.words.timedOut, 3u);
  EXPECT_EQ(a.words.phase, static_cast<uint32_t>(kPhaseTail));
  EXPECT_EQ(a.words.abort, 1u);
}

TEST(OpSteps, AWordAnotherThreadWritesEndsTheWait) {
  Waiter a;
  std::thread writer([&] {
    for (uint64_t v = 1; v <= 20; ++v) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      __atomic_store_n(&a.word, v, __ATOMIC_RELEASE);
    }
  });
  const uint64_t timeout = 10ull * 1000 * 1000 * 1000;
  auto clock = [] {
    std::this_thread::yield();
    return steadyNs();
  };
  const WaitStatus s = waitFor(&a.word, 20, &a.words, clock, timeout, 1, kPhaseDone);
  writer.join();
  EXPECT_EQ(s, kReady);
  EXPECT_EQ(a.words.timedOut, 0u);
}

TEST(OpSteps, AnAbortFromAnotherThreadEndsTheWait) {
  Waiter a;
  std::thread host([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    __atomic_store_n(&a.words.abort, 1u, __ATOMIC_RELEASE);
  });
  const uint64_t timeout = 10ull * 1000 * 1000 * 1000;
  const WaitStatus s = waitFor(&a.word, 1, &a.words, steadyNs, timeout, 1, kPhaseGo);
  host.join();
  EXPECT_EQ(s, kAborted);
  EXPECT_EQ(a.words.timedOut, 0u);
}

}  // namespace
