// Tearing a communicator down with network traffic in flight (hardening): on virtual nodes of two
// ranks (FUSCO_LOCAL_SIZE=2, UCX over TCP on loopback), four ranks run a loop of 16 MiB-per-peer
// all-to-alls and rank 3 is stopped (SIGSTOP) in the middle of one. Then either rank 0 aborts the
// communicator from another thread while its main thread is inside the call, or every survivor
// waits for the (short) timeout and destroys it. The UCX requests still in flight must be cancelled
// and completed before the endpoints close and the workers go: every survivor returns an error
// and exits normally (no signal: the harness fails a rank that crashed).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "harness/mp_harness.h"

namespace {

using fusco::test::MpOptions;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;

constexpr int kRanks = 4;
constexpr int kStopped = 3;                 // on node 1: ranks 0 and 1 reach it over UCX
constexpr size_t kPeerBytes = 16ull << 20;  // per peer and call
constexpr double kLoopLimitSec = 20.0;      // no call may take longer than this in all
constexpr double kDestroyLimitSec = 10.0;   // destroy is bounded, also with a stopped peer

// Memory shared between the rank processes (made before the fork).
struct Shared {
  std::atomic<int> pid3{0};       // rank 3's pid, published after init
  std::atomic<int> stopped{0};    // rank 3 was stopped
  std::atomic<int> callsOf0{0};   // all-to-alls rank 0 started
  std::atomic<int> inCallOf0{0};  // rank 0 is inside one
  std::atomic<int> survivorsDone{0};
};

Shared* makeShared() {
  void* p =
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  return new (p) Shared();
}

MpOptions netOptions() {
  MpOptions opt;
  opt.timeoutSec = 40;
  opt.mayDie = {kStopped};
  opt.env = {{"FUSCO_LOCAL_SIZE", "2"},
             {"UCX_TLS", "tcp,self"},
             {"UCX_NET_DEVICES", "lo"},
             {"UCX_WARN_UNUSED_ENV_VARS", "n"}};
  return opt;
}

// Rank 3: runs the loop until it is stopped (and later killed).
void stoppedRank(fuscoComm_t comm, Shared* sh) {
  sh->pid3 = getpid();
  std::vector<char> send(kPeerBytes * kRanks, 3), recv(kPeerBytes * kRanks);
  while (fuscoAllToAll(send.data(), recv.data(), kPeerBytes, fuscoInt8, comm, nullptr) ==
         fuscoSuccess) {
  }
}

// Rank 0's helper: stops rank 3 once rank 0 has been inside its second (or a later) call for a
// while, so the stop lands in the data phase with slices on the wire.
void stopRank3MidCall(Shared* sh) {
  const double t0 = nowSec();
  while (nowSec() - t0 < kLoopLimitSec) {
    const int call = sh->callsOf0.load();
    if (call < 2 || sh->inCallOf0.load() == 0 || sh->pid3.load() == 0) {
      usleep(1000);
      continue;
    }
    usleep(20 * 1000);
    if (sh->callsOf0.load() != call || sh->inCallOf0.load() == 0) continue;
    kill(sh->pid3.load(), SIGSTOP);
    sh->stopped = 1;
    return;
  }
}

// A survivor: the loop of all-to-alls until one fails (the stopped peer, or the abort).
fuscoResult_t survivorLoop(fuscoComm_t comm, const RankCtx& ctx, Shared* sh, std::string* msg) {
  std::vector<char> send(kPeerBytes * kRanks, static_cast<char>(ctx.rank)),
      recv(kPeerBytes * kRanks);
  const double t0 = nowSec();
  fuscoResult_t r = fuscoSuccess;
  while (r == fuscoSuccess && nowSec() - t0 < kLoopLimitSec) {
    if (ctx.rank == 0) sh->inCallOf0 = 1, sh->callsOf0++;
    r = fuscoAllToAll(send.data(), recv.data(), kPeerBytes, fuscoInt8, comm, nullptr);
    if (ctx.rank == 0) sh->inCallOf0 = 0;
  }
  *msg = fuscoGetLastError(nullptr);
  EXPECT_LT(nowSec() - t0, kLoopLimitSec + 5.0) << "the loop's last call hung";
  return r;
}

// Rank 0, once every survivor is done: the stopped rank is killed so the test ends.
void endStoppedRank(Shared* sh) {
  const double t0 = nowSec();
  while (sh->survivorsDone.load() < kRanks - 1 && nowSec() - t0 < 30.0) usleep(10 * 1000);
  if (sh->pid3.load() > 0) kill(sh->pid3.load(), SIGKILL);
}

void destroyBounded(fuscoComm_t comm) {
  const double t0 = nowSec();
  EXPECT_EQ(fuscoCommDestroy(comm), fuscoSuccess)
      << "destroy with a stopped peer: " << fuscoGetLastError(nullptr);
  EXPECT_LT(nowSec() - t0, kDestroyLimitSec) << "destroy took " << nowSec() - t0 << " s";
}

void runScenario(bool abortFromThread, int timeoutMs) {
#ifndef FUSCO_HAVE_UCX
  GTEST_SKIP() << "built without UCX: no inter-node transport for virtual nodes";
#endif
  Shared* sh = makeShared();
  ASSERT_NE(sh, nullptr);
  runRanks(
      kRanks,
      [&](const RankCtx& ctx) {
        fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
        cfg.timeoutMs = timeoutMs;
        fuscoComm_t comm = fusco::test::initComm(ctx, &cfg);
        if (ctx.rank == kStopped) return stoppedRank(comm, sh);
        std::thread stopper, aborter;
        if (ctx.rank == 0) stopper = std::thread([sh] { stopRank3MidCall(sh); });
        if (abortFromThread && ctx.rank == 0) {
          aborter = std::thread([sh, comm] {
            const double t0 = nowSec();
            while (sh->stopped.load() == 0 && nowSec() - t0 < kLoopLimitSec) usleep(1000);
            usleep(300 * 1000);  // the survivors are blocked on the stopped rank by now
            EXPECT_EQ(fuscoCommAbort(comm), fuscoSuccess) << fuscoGetLastError(nullptr);
          });
        }
        std::string msg;
        fuscoResult_t r = survivorLoop(comm, ctx, sh, &msg);
        if (stopper.joinable()) stopper.join();
        EXPECT_NE(r, fuscoSuccess) << "a call with a stopped peer must fail";
        EXPECT_FALSE(msg.empty()) << "a failed call leaves a message";
        if (aborter.joinable()) {
          aborter.join();  // the abort freed the communicator
        } else {
          destroyBounded(comm);
        }
        sh->survivorsDone++;
        if (ctx.rank == 0) endStoppedRank(sh);
      },
      netOptions());
  munmap(sh, sizeof(Shared));
}

TEST(NetTeardown, AbortFromAnotherThreadWithTrafficInFlightEndsEverySurvivorCleanly) {
  runScenario(true, 4000);
}

TEST(NetTeardown, DestroyAfterTimeoutWithTrafficInFlightEndsEverySurvivorCleanly) {
  runScenario(false, 1500);
}

}  // namespace
