// MoE dispatch and combine with the receive buffer in the communicator's shared arena: peers on
// the node then write final rows straight into it (dispatch, with replication per local expert)
// and partial sums straight into the source's landing rows (combine). Same checks as the staged
// path: bit-exact against the reference in every dedup mode.
#include <gtest/gtest.h>

#include "harness/moe_cases.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::combineAllModes;
using fusco::test::commConfig;
using fusco::test::initComm;
using fusco::test::kAllModes;
using fusco::test::makeCombine;
using fusco::test::MoeCase;
using fusco::test::RankCtx;
using fusco::test::runDispatchCase;
using fusco::test::runRanks;
using fusco::test::setMoeArenaBuffers;

TEST(MoeArena, DirectDispatchIntoArenaRecvBufferIsBitExactInEveryMode) {
  const uint64_t seed = 0xa7e4a001;
  runRanks(4, [seed](const RankCtx& ctx) {
    setMoeArenaBuffers(true);
    MoeCase c;
    c.nranks = ctx.nranks;
    c.numExperts = 12;
    c.topk = 4;
    c.numTokens = {37, 0, 64, 5};
    c.align = 4;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    runDispatchCase(comm, ctx, c, seed, 7168 * 2 + 6, kAllModes);
    runDispatchCase(comm, ctx, c, seed + 1, 3, kAllModes);
    fuscoCommDestroy(comm);
  });
}

TEST(MoeArena, DirectWritesWithSmallSlicesCutRowsAndStayExact) {
  const uint64_t seed = 0xa7e4a002;
  fusco::test::MpOptions opt;
  opt.env = {{"FUSCO_CHUNK_BYTES", "4096"}};
  runRanks(
      3,
      [seed](const RankCtx& ctx) {
        setMoeArenaBuffers(true);
        MoeCase c;
        c.nranks = ctx.nranks;
        c.numExperts = 9;
        c.placement = {2, 0, 1, 1, 2, 0, 0, 2, 1};
        c.topk = 3;
        c.numTokens = {20, 33, 7};
        fuscoConfig_t cfg = commConfig(c);
        fuscoComm_t comm = initComm(ctx, &cfg);
        runDispatchCase(comm, ctx, c, seed, 5000, kAllModes);
        combineAllModes(comm, ctx, makeCombine(c, seed, fuscoBfloat16, 3001));
        fuscoCommDestroy(comm);
      },
      opt);
}

TEST(MoeArena, CombineIntoArenaLandingMatchesReferenceForEveryType) {
  const uint64_t seed = 0xa7e4a003;
  runRanks(4, [seed](const RankCtx& ctx) {
    setMoeArenaBuffers(true);
    MoeCase c;
    c.nranks = ctx.nranks;
    c.numExperts = 16;
    c.topk = 5;
    c.numTokens = {40, 9, 0, 31};
    c.localSize = 2;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    for (fuscoDataType_t dt : {fuscoFloat32, fuscoBfloat16, fuscoFloat16})
      combineAllModes(comm, ctx, makeCombine(c, seed, dt, 129));
    fuscoCommDestroy(comm);
  });
}

}  // namespace
