// Init that cannot succeed: every rank is told why, promptly, with the right result code and a
// message that names what to fix (a reused unique id, ranks per node that differ between ranks,
// a shared arena the system cannot map).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;

constexpr int kTimeoutMs = 10000;
constexpr double kPromptSec = 3.0;  // well under the timeout

fuscoConfig_t testConfig() {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = kTimeoutMs;
  return cfg;
}

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

// Inits with ctx's id and config; returns the result, the message and how long it took.
fuscoResult_t tryInit(const RankCtx& ctx, const fuscoConfig_t& cfg, std::string* msg, double* sec) {
  fuscoComm_t comm = nullptr;
  const double t0 = nowSec();
  fuscoResult_t r = fuscoCommInitRankConfig(&comm, ctx.nranks, ctx.id, ctx.rank, &cfg);
  *sec = nowSec() - t0;
  *msg = fuscoGetLastError(nullptr);
  if (r == fuscoSuccess) fuscoCommDestroy(comm);
  return r;
}

TEST(InitErrors, ReusedUniqueIdFailsEveryRankPromptly) {
  runRanks(4, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
    std::string msg;
    double sec = 0;
    EXPECT_EQ(tryInit(ctx, cfg, &msg, &sec), fuscoInvalidUsage) << msg;
    EXPECT_TRUE(contains(msg, "already used")) << msg;
    EXPECT_TRUE(contains(msg, "fuscoGetUniqueId")) << msg;
    EXPECT_LT(sec, kPromptSec) << "the reused id was refused after " << sec << " s: " << msg;
  });
}

// Rank 3 is given two ranks per node, the others one: the node maps would differ, so every rank
// fails at init naming the setting and both values.
TEST(InitErrors, LocalSizeDifferingAcrossRanksNamesTheSettingAndTheValues) {
  runRanks(4, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    cfg.localSize = ctx.rank == 3 ? 2 : 1;
    std::string msg;
    double sec = 0;
    EXPECT_EQ(tryInit(ctx, cfg, &msg, &sec), fuscoInvalidUsage) << msg;
    EXPECT_TRUE(contains(msg, "localSize")) << msg;
    EXPECT_TRUE(contains(msg, "FUSCO_LOCAL_SIZE")) << msg;
    EXPECT_TRUE(contains(msg, "rank 0 uses 1")) << msg;
    EXPECT_TRUE(contains(msg, "rank 3 uses 2")) << msg;
    EXPECT_LT(sec, kPromptSec) << msg;
  });
}

// Different settings that give the same nodes are fine: 0 (by host: one node here) and 4.
TEST(InitErrors, LocalSizesThatMakeTheSameNodesAreAccepted) {
  runRanks(4, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    cfg.localSize = ctx.rank % 2 == 0 ? 0 : 4;
    fuscoComm_t comm = initComm(ctx, &cfg);
    int node = -1, numNodes = -1, localRank = -1, localSize = -1;
    FUSCO_EXPECT_OK(comm, fuscoCommNodeInfo(comm, &node, &numNodes, &localRank, &localSize));
    EXPECT_EQ(numNodes, 1);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// Rank 1 asks for a shared arena larger than any address space: mapping it fails, which is a
// system error on that rank (not a usage error), and a remote error naming it everywhere else.
TEST(InitErrors, ArenaThatCannotBeMappedIsASystemError) {
  runRanks(3, [](const RankCtx& ctx) {
    if (ctx.rank == 1) setenv("FUSCO_SHM_ARENA_BYTES", "1125899906842624", 1);  // 2^50
    fuscoConfig_t cfg = testConfig();
    cfg.localSize = 3;  // one node: every pair over shm
    std::string msg;
    double sec = 0;
    fuscoResult_t r = tryInit(ctx, cfg, &msg, &sec);
    if (ctx.rank == 1) {
      EXPECT_EQ(r, fuscoSystemError) << msg;
      EXPECT_TRUE(contains(msg, "shm setup failed")) << msg;
      EXPECT_TRUE(contains(msg, "mmap")) << msg;
    } else {
      EXPECT_EQ(r, fuscoRemoteError) << msg;
      EXPECT_TRUE(contains(msg, "rank 1")) << msg;
    }
    EXPECT_LT(sec, kPromptSec) << msg;
  });
}

}  // namespace
