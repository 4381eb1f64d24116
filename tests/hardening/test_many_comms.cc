// Many communicators (hardening): 100 create/destroy cycles on 4 ranks leak no memory, file
// descriptors or shared memory; two communicators on the same 4 ranks, each driven by its own
// thread in every rank at the same time, give correct all-to-all and MoE dispatch results
// (fusco.h: distinct communicators may be used concurrently from different threads).
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/moe_reference.h"
#include "harness/mp_harness.h"
#include "harness/resources.h"

namespace {

using fusco::test::RankCtx;

using Usage = fusco::test::Resources;

// Rank 0 makes `count` fresh unique ids and every rank gets them through `via` (an all-to-all
// in which only rank 0's block carries data). An id serves one communicator, so each new comm
// needs its own.
bool shareNewIds(fuscoComm_t via, const RankCtx& ctx, int count, std::vector<fuscoUniqueId>* ids) {
  const size_t B = sizeof(fuscoUniqueId) * count;
  std::vector<char> send(B * ctx.nranks, 0), recv(B * ctx.nranks, 0);
  if (ctx.rank == 0) {
    for (int i = 0; i < count; ++i) {
      fuscoUniqueId id;
      fuscoResult_t r = fuscoGetUniqueId(&id);
      EXPECT_EQ(r, fuscoSuccess) << fuscoGetLastError(nullptr);
      if (r != fuscoSuccess) return false;
      for (int p = 0; p < ctx.nranks; ++p) memcpy(&send[p * B + i * sizeof(id)], &id, sizeof(id));
    }
  }
  fuscoResult_t r = fuscoAllToAll(send.data(), recv.data(), B, fuscoInt8, via, nullptr);
  EXPECT_EQ(r, fuscoSuccess) << "sharing ids: " << fuscoGetLastError(via);
  if (r != fuscoSuccess) return false;
  ids->resize(count);
  memcpy(ids->data(), recv.data(), B);  // block 0: from rank 0
  return true;
}

// One all-to-all of `bytes` per peer on comm, every block checked; false on a failure.
bool allToAllChecked(fuscoComm_t comm, const RankCtx& ctx, uint64_t seed, size_t bytes,
                     const std::string& what) {
  const int n = ctx.nranks;
  std::vector<uint8_t> send(bytes * n), recv(bytes * n + 1);
  for (int p = 0; p < n; ++p)
    fusco::test::fillPayload(&send[p * bytes], seed, ctx.rank, p, 0, bytes);
  fusco::test::poison(recv.data(), recv.size());
  fuscoResult_t r = fuscoAllToAll(send.data(), recv.data(), bytes, fuscoUint8, comm, nullptr);
  EXPECT_EQ(r, fuscoSuccess) << what << " fuscoAllToAll -> " << fuscoGetErrorString(r) << ": "
                             << fuscoGetLastError(comm);
  if (r != fuscoSuccess) return false;
  bool ok = recv.back() == fusco::test::kPoison;
  EXPECT_TRUE(ok) << what << ": all-to-all wrote past the receive buffer";
  for (int p = 0; p < n; ++p) {
    size_t bad = fusco::test::findPayloadMismatch(&recv[p * bytes], seed, p, ctx.rank, 0, bytes);
    EXPECT_EQ(bad, SIZE_MAX) << what << ": block from rank " << p << " wrong at byte " << bad;
    ok = ok && bad == SIZE_MAX;
  }
  return ok;
}

TEST(ManyComms, HundredCreateDestroyCyclesLeakNothing) {
  const uint64_t seed = fusco::test::testSeed();
  fusco::test::MpOptions opt;
  opt.timeoutSec = 400;
  fusco::test::runRanks(
      4,
      [seed](const RankCtx& ctx) {
        fuscoComm_t keeper = fusco::test::initComm(ctx);
        constexpr int kWarmup = 5, kCycles = 100;
        std::vector<fuscoUniqueId> ids;
        ASSERT_TRUE(shareNewIds(keeper, ctx, kWarmup + kCycles, &ids));
        Usage before;
        for (int i = 0; i < kWarmup + kCycles && !::testing::Test::HasFailure(); ++i) {
          if (i == kWarmup) before = fusco::test::measureResources();
          fuscoComm_t c = nullptr;
          fuscoResult_t r = fuscoCommInitRank(&c, ctx.nranks, ids[i], ctx.rank);
          ASSERT_EQ(r, fuscoSuccess) << "cycle " << i << ": " << fuscoGetLastError(nullptr);
          allToAllChecked(c, ctx, seed + i, 24 + i % 40, "cycle " + std::to_string(i));
          FUSCO_EXPECT_OK(c, fuscoCommDestroy(c));
        }
        Usage after = fusco::test::measureResources();
        fusco::test::expectBoundedGrowth("many-comms", std::to_string(kCycles) + " cycles",
                                         ctx.rank == 0, before, after);
        FUSCO_EXPECT_OK(keeper, fuscoCommDestroy(keeper));
      },
      opt);
}

// Thread body: its own comm from `id`, then all-to-alls of changing sizes and MoE dispatches
// (checked against the reference); the two threads' payloads differ by seed, so a row that
// crossed into the other communicator is caught.
void driveComm(const RankCtx& ctx, fuscoUniqueId id, uint64_t seed, int which) {
  const std::string tag = "comm " + std::to_string(which);
  fuscoComm_t comm = nullptr;
  fuscoResult_t r = fuscoCommInitRank(&comm, ctx.nranks, id, ctx.rank);
  EXPECT_EQ(r, fuscoSuccess) << tag << " init: " << fuscoGetLastError(nullptr);
  if (r != fuscoSuccess) return;
  for (int i = 0; i < 200; ++i) {
    const uint64_t s = seed + 1000 * which + i;
    if (!allToAllChecked(comm, ctx, s, 1 + (i * 37) % 3000, tag + " round " + std::to_string(i)))
      break;
    if (i % 20 != 0) continue;
    fusco::test::MoeCase c;
    c.nranks = ctx.nranks;
    c.numExperts = 8;
    c.topk = 2 + which;
    c.numTokens = {20, 33, 17, 41};
    auto p = fusco::test::makeProblem(c, s);
    auto x = fusco::test::makeRows(p, s, 48);
    auto d = fusco::test::moeRefDispatch(p, x, 48);
    const std::string what = tag + " round " + std::to_string(i);
    fuscoMoeHandle_t h = fusco::test::planChecked(comm, ctx, c, p, d, FUSCO_DEDUP_RANK, what);
    if (h == nullptr) break;
    fusco::test::dispatchChecked(comm, h, ctx, p, d, x, 48, FUSCO_DEDUP_RANK, what);
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  }
  FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
}

TEST(ManyComms, TwoCommsOnTheSameRanksFromTwoThreadsAreCorrect) {
  const uint64_t seed = fusco::test::testSeed();
  fusco::test::MpOptions opt;
  opt.timeoutSec = 300;
  fusco::test::runRanks(
      4,
      [seed](const RankCtx& ctx) {
        fuscoComm_t setup = fusco::test::initComm(ctx);
        std::vector<fuscoUniqueId> ids;
        ASSERT_TRUE(shareNewIds(setup, ctx, 2, &ids));
        // Both threads init and run at the same time; neither starts until the other exists.
        std::thread a(driveComm, ctx, ids[0], seed, 0);
        std::thread b(driveComm, ctx, ids[1], seed, 1);
        a.join();
        b.join();
        FUSCO_EXPECT_OK(setup, fuscoCommDestroy(setup));
      },
      opt);
}

}  // namespace
