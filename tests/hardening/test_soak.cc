// Soak (hardening): thousands of MoE plan + dispatch + combine rounds on 4 ranks with routing,
// shape and datatype changing every round, every result checked against the sequential reference
// (harness/moe_reference.h), and the rank's resources measured after a warmup and at the end:
// resident memory, open file descriptors, mapped fusco shared-memory segments (memfd) and
// /dev/shm entries must not grow. FUSCO_SOAK_ITERS overrides the round count (default 10000).
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/moe_reference.h"
#include "harness/mp_harness.h"
#include "harness/resources.h"

namespace {

using fusco::test::CombineSetup;
using fusco::test::MoeCase;
using fusco::test::RankCtx;

using fusco::test::measureResources;
using fusco::test::Resources;

int soakIters() {
  const char* e = getenv("FUSCO_SOAK_ITERS");
  if (e == nullptr || *e == '\0') return 10000;
  return std::max(1, atoi(e));
}

// Round i's case: 16-64 tokens per rank, top-2..4, 8 or 16 experts (an explicit uneven placement
// every third round), hidden 32-64 in bf16 or fp32, dedup cycling NONE / RANK / AUTO.
MoeCase roundCase(uint64_t seed, int i, int nranks, fuscoDataType_t* dt, size_t* hidden,
                  int* dedup) {
  uint64_t h = fusco::test::mix64(seed ^ (0x50a4ull + static_cast<uint64_t>(i)));
  MoeCase c;
  c.nranks = nranks;
  c.numExperts = (h & 1) ? 16 : 8;
  c.topk = 2 + static_cast<int>((h >> 1) % 3);
  c.numTokens.resize(nranks);
  for (int r = 0; r < nranks; ++r) c.numTokens[r] = 16 + (fusco::test::mix64(h + r) % 49);
  c.unusedPercent = 10;
  if (i % 3 == 2) {
    c.numExperts = 10;  // not a multiple of nranks: explicit placement
    c.placement.resize(c.numExperts);
    for (int e = 0; e < c.numExperts; ++e) c.placement[e] = (e * 7 + i) % nranks;
  }
  *dt = (h >> 8) & 1 ? fuscoBfloat16 : fuscoFloat32;
  *hidden = 32 + (h >> 9) % 33;
  static const int kModes[] = {FUSCO_DEDUP_NONE, FUSCO_DEDUP_RANK, FUSCO_DEDUP_AUTO};
  *dedup = kModes[i % 3];
  return c;
}

// One checked round: plan (receive counts), dispatch (bytes, padding, stats) and a weighted
// combine (bitwise against the reference).
void soakRound(fuscoComm_t comm, const RankCtx& ctx, uint64_t seed, int i) {
  fuscoDataType_t dt;
  size_t hidden;
  int dedup;
  MoeCase c = roundCase(seed, i, ctx.nranks, &dt, &hidden, &dedup);
  CombineSetup s = fusco::test::makeCombine(c, seed + static_cast<uint64_t>(i), dt, hidden);
  const std::string what = "round " + std::to_string(i) + " " +
                           fusco::test::caseName(c, dedup, hidden) + " " +
                           fusco::test::dtypeName(dt);
  const size_t rowOut = hidden * fusco::test::dtypeSize(dt);
  fuscoMoeHandle_t h = fusco::test::planChecked(comm, ctx, c, s.p, s.d, dedup, what);
  if (h == nullptr) return;
  fusco::test::dispatchChecked(comm, h, ctx, s.p, s.d, s.x, rowOut, dedup, what);
  const size_t nTok = s.p.numTokens[ctx.rank];
  const auto& eo = s.expertOut[ctx.rank];
  std::vector<uint8_t> out(nTok * rowOut + 1);
  fusco::test::poison(out.data(), out.size());
  FUSCO_EXPECT_OK(comm, fuscoMoeCombine(h, eo.empty() ? nullptr : eo.data(), dt, hidden,
                                        nTok ? s.weights[ctx.rank].data() : nullptr,
                                        nTok ? out.data() : nullptr, nullptr));
  EXPECT_EQ(out.back(), fusco::test::kPoison) << what << ": combine wrote past the output";
  out.pop_back();
  auto want = fusco::test::moeRefCombine(s.p, s.d, s.expertOut, dt, hidden, s.weights)[ctx.rank];
  EXPECT_TRUE(out == want) << what << ": combine output differs from the reference";
  FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
}

TEST(Soak, TenThousandChangingMoeRoundsLeakNothingAndStayExact) {
  const uint64_t seed = fusco::test::testSeed();
  const int iters = soakIters();
  const int warmup = std::min(100, iters / 10);
  fusco::test::MpOptions opt;
  opt.timeoutSec = 580;
  const double t0 = fusco::test::nowSec();
  fusco::test::runRanks(
      4,
      [&](const RankCtx& ctx) {
        MoeCase c0;
        c0.nranks = ctx.nranks;
        fuscoConfig_t cfg = fusco::test::commConfig(c0);
        fuscoComm_t comm = fusco::test::initComm(ctx, &cfg);
        Resources before;
        int done = 0;
        for (int i = 0; i < iters && !::testing::Test::HasFailure(); ++i, ++done) {
          if (i == warmup) before = measureResources();
          soakRound(comm, ctx, seed, i);
        }
        EXPECT_EQ(done, iters) << "stopped at the first failing round";
        Resources after = measureResources();
        fusco::test::expectBoundedGrowth("soak", std::to_string(done) + " rounds", ctx.rank == 0,
                                         before, after);
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      opt);
  printf("[soak] %d rounds on 4 ranks took %.1f s\n", iters, fusco::test::nowSec() - t0);
}

}  // namespace
