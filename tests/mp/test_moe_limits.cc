// MoE config limits (docs/API.md, "MoE dispatch and combine"): numExperts and expertAlignment
// have documented ranges, checked at plan time with a message naming the range, so no config can
// make the library allocate without bound; padding costs one range per local expert, so the
// largest supported alignment is cheap and exact against the reference.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/mp_harness.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FUSCO_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FUSCO_TEST_SANITIZED 1
#endif
#endif

namespace {

using fusco::test::combineChecked;
using fusco::test::commConfig;
using fusco::test::initComm;
using fusco::test::kAllModes;
using fusco::test::makeCombine;
using fusco::test::MoeCase;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runDispatchCase;
using fusco::test::runRanks;

// Caps this rank's address space at what it maps now plus 2 GiB, so an allocation of gigabytes
// fails at once instead of waking the OOM killer (sanitizers reserve terabytes: no cap there).
void capAddressSpace() {
#ifndef FUSCO_TEST_SANITIZED
  FILE* f = fopen("/proc/self/status", "r");
  ASSERT_NE(f, nullptr);
  char line[256];
  unsigned long long vmKb = 0;
  while (fgets(line, sizeof(line), f))
    if (sscanf(line, "VmSize: %llu kB", &vmKb) == 1) break;
  fclose(f);
  ASSERT_GT(vmKb, 0u);
  const rlim_t cap = static_cast<rlim_t>(vmKb) * 1024 + (rlim_t{2} << 30);
  struct rlimit rl = {cap, cap};
  ASSERT_EQ(setrlimit(RLIMIT_AS, &rl), 0);
#endif
}

// Every rank plans with the same out-of-range config: each gets fuscoInvalidArgument naming the
// field and its supported range, promptly, and no handle; the comm then runs a correct combine.
void expectConfigRefused(int numExperts, int alignment, const char* needle) {
  runRanks(4, [=](const RankCtx& ctx) {
    fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
    cfg.timeoutMs = 20000;
    fuscoComm_t comm = initComm(ctx, &cfg);
    capAddressSpace();
    fuscoMoeConfig_t mc = FUSCO_MOE_CONFIG_INITIALIZER;
    mc.numExperts = numExperts;
    mc.expertAlignment = alignment;
    const int64_t topk[] = {0, 1, 2, 3};  // 4 tokens, top-1
    fuscoMoeHandle_t h = nullptr;
    const double t0 = nowSec();
    const fuscoResult_t r = fuscoMoePlan(&h, comm, &mc, topk, 4, 1, nullptr);
    const std::string msg = fuscoGetLastError(comm);
    EXPECT_EQ(r, fuscoInvalidArgument) << fuscoGetErrorString(r) << ": " << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "message '" << msg << "'";
    EXPECT_LT(nowSec() - t0, 5.0);
    EXPECT_EQ(h, nullptr);
    MoeCase c;
    c.nranks = ctx.nranks;
    c.numExperts = 2 * ctx.nranks;
    c.numTokens.assign(ctx.nranks, 9);
    combineChecked(comm, ctx, makeCombine(c, 31, fuscoFloat32, 8), FUSCO_DEDUP_RANK);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(MoeLimits, HugeExpertAlignmentFailsEveryRankPromptlyWithoutAllocating) {
  expectConfigRefused(8, INT_MAX,
                      "expertAlignment 2147483647 outside the supported range [0, 65536]");
}

TEST(MoeLimits, HugeNumExpertsFailsEveryRankPromptlyWithoutAllocating) {
  expectConfigRefused(1 << 30, 0, "numExperts 1073741824 outside the supported range [1, 1048576]");
}

TEST(MoeLimits, LargestSupportedAlignmentIsExactInEveryMode) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    MoeCase c;
    c.nranks = 4;
    c.numExperts = 8;
    c.topk = 2;
    c.numTokens = {5, 0, 3, 7};
    c.align = 65536;
    fuscoConfig_t cfg = commConfig(c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    capAddressSpace();
    runDispatchCase(comm, ctx, c, seed, 12, kAllModes);
    combineChecked(comm, ctx, makeCombine(c, seed + 1, fuscoBfloat16, 6), FUSCO_DEDUP_RANK);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace
