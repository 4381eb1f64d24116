// Capacity mode (fuscoMoePlanCapacity, docs/API.md): a receive side sized for recvCapacity rows,
// the plan resolved on the comm's own schedule. Dispatch and combine against the sequential
// reference with rows to spare (the spare rows untouched), the counts on the host and where the
// plan wrote them, a routing past a rank's capacity and an invalid id failing on every rank with
// the numbers, refused arguments, and a comm that stays usable. On host comms the call returns
// the errors; the [twin] run takes the CUDA path's protocol (late sizes on the progress thread).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/moe_reference.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::CombineSetup;
using fusco::test::commConfig;
using fusco::test::initComm;
using fusco::test::MoeCase;
using fusco::test::RankCtx;
using fusco::test::runRanks;

constexpr uint8_t kPoison = 0xA5;

MoeCase capacityCase(int n) {
  MoeCase c;
  c.nranks = n;
  c.numExperts = 4 * n;
  c.topk = std::min(4, c.numExperts);
  c.numTokens.assign(n, 0);
  for (int r = 0; r < n; ++r) c.numTokens[r] = 31 + 13 * r;
  if (n > 2) c.numTokens[1] = 0;
  c.align = 4;
  return c;
}

size_t mostRows(const CombineSetup& s) {
  return *std::max_element(s.d.numRecvRows.begin(), s.d.numRecvRows.end());
}

fuscoMoeHandle_t planCapacity(fuscoComm_t comm, const RankCtx& ctx, const CombineSetup& s,
                              int dedup, size_t capacity, fuscoResult_t* r) {
  fuscoMoeConfig_t cfg = fusco::test::moeConfig(s.c, dedup);
  const auto& idx = s.p.topkIdx[ctx.rank];
  fuscoMoeHandle_t h = nullptr;
  *r = fuscoMoePlanCapacity(&h, comm, &cfg, idx.empty() ? nullptr : idx.data(),
                            s.p.numTokens[ctx.rank], s.p.topk, capacity, nullptr);
  return h;
}

// Dispatch into capacity rows (the spare ones must stay poisoned) and combine from an expert
// output of capacity rows (the spare ones are garbage and must not be read).
void dispatchAndCombine(fuscoComm_t comm, const RankCtx& ctx, const CombineSetup& s,
                        fuscoMoeHandle_t h, size_t capacity, const std::string& what) {
  const size_t rowOut = s.hidden * fusco::test::dtypeSize(s.dt);
  const size_t need = s.d.numRecvRows[ctx.rank];
  std::vector<uint8_t> recvX(capacity * rowOut);
  fusco::test::poison(recvX.data(), recvX.size());
  const auto& x = s.x[ctx.rank];
  FUSCO_EXPECT_OK(
      comm, fuscoMoeDispatch(h, x.empty() ? nullptr : x.data(), rowOut, recvX.data(), nullptr));
  EXPECT_TRUE(memcmp(recvX.data(), s.d.recvX[ctx.rank].data(), need * rowOut) == 0) << what;
  EXPECT_EQ(fusco::test::findNotPoison(recvX.data() + need * rowOut, (capacity - need) * rowOut),
            SIZE_MAX)
      << what << ": dispatch wrote past the real receive rows";
  std::vector<uint8_t> expertOut(capacity * rowOut, 0x3c);  // garbage past the real rows
  std::copy(s.expertOut[ctx.rank].begin(), s.expertOut[ctx.rank].end(), expertOut.begin());
  const size_t nTok = s.p.numTokens[ctx.rank];
  std::vector<uint8_t> out(nTok * rowOut + 1);
  fusco::test::poison(out.data(), out.size());
  FUSCO_EXPECT_OK(comm, fuscoMoeCombine(h, expertOut.data(), s.dt, s.hidden,
                                        nTok ? s.weights[ctx.rank].data() : nullptr,
                                        nTok ? out.data() : nullptr, nullptr));
  EXPECT_EQ(out.back(), kPoison) << what;
  out.pop_back();
  const auto want = fusco::test::moeRefCombine(s.p, s.d, s.expertOut, s.dt, s.hidden, s.weights);
  EXPECT_TRUE(out == want[ctx.rank]) << what << ": combine differs from the reference";
}

// The counts on the host (fuscoMoeGetRecvCounts) and where the plan wrote them.
void expectCounts(fuscoComm_t comm, const RankCtx& ctx, const CombineSetup& s, fuscoMoeHandle_t h) {
  size_t rows = 0;
  std::vector<int64_t> perExpert(s.d.tokensPerLocalExpert[ctx.rank].size() + 1, -7);
  FUSCO_EXPECT_OK(comm, fuscoMoeGetRecvCounts(h, &rows, perExpert.data()));
  EXPECT_EQ(rows, s.d.numRecvRows[ctx.rank]);
  EXPECT_EQ(perExpert.back(), -7);
  perExpert.pop_back();
  EXPECT_EQ(perExpert, s.d.tokensPerLocalExpert[ctx.rank]);
  const int64_t* devRows = nullptr;
  const int64_t* devPerExpert = nullptr;
  FUSCO_EXPECT_OK(comm, fuscoMoeGetRecvCountsDevice(h, &devRows, &devPerExpert));
  ASSERT_NE(devRows, nullptr);
  EXPECT_EQ(static_cast<size_t>(*devRows), s.d.numRecvRows[ctx.rank]);
  for (size_t e = 0; e < perExpert.size(); ++e) EXPECT_EQ(devPerExpert[e], perExpert[e]) << e;
}

class MoeCapacity : public ::testing::TestWithParam<int> {};

TEST_P(MoeCapacity, MatchesTheReferenceAndLeavesSpareRowsAlone) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(GetParam(), [seed](const RankCtx& ctx) {
    const CombineSetup s =
        fusco::test::makeCombine(capacityCase(ctx.nranks), seed, fuscoBfloat16, 24);
    fuscoConfig_t cfg = commConfig(s.c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    const size_t capacity = mostRows(s) + 5;
    for (int dedup : {FUSCO_DEDUP_NONE, FUSCO_DEDUP_RANK}) {
      const std::string what = fusco::test::caseName(s.c, dedup, s.hidden) + " capacity";
      fuscoResult_t r;
      fuscoMoeHandle_t h = planCapacity(comm, ctx, s, dedup, capacity, &r);
      FUSCO_ASSERT_OK(comm, r);
      expectCounts(comm, ctx, s, h);
      for (int rep = 0; rep < 2; ++rep) dispatchAndCombine(comm, ctx, s, h, capacity, what);
      FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, MoeCapacity, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "ranks";
                         });

// Rank 0's capacity one row short: every rank's plan fails with fuscoInvalidArgument naming what
// rank 0 needs and what it has; an exact capacity then works on the same comm.
TEST(MoeCapacityErrors, OneRowShortFailsOnEveryRankWithTheNumbers) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    const CombineSetup s = fusco::test::makeCombine(capacityCase(3), seed, fuscoFloat32, 8);
    fuscoConfig_t cfg = commConfig(s.c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    const size_t need = s.d.numRecvRows[ctx.rank];
    fuscoResult_t r;
    fuscoMoeHandle_t h =
        planCapacity(comm, ctx, s, FUSCO_DEDUP_RANK, ctx.rank == 0 ? need - 1 : need, &r);
    EXPECT_NE(r, fuscoSuccess);
    EXPECT_EQ(h, nullptr);
    if (ctx.rank == 0) {
      EXPECT_EQ(r, fuscoInvalidArgument);
      const std::string msg = fuscoGetLastError(comm);
      EXPECT_NE(msg.find("needs " + std::to_string(need) + " receive rows"), std::string::npos)
          << msg;
      EXPECT_NE(msg.find("recvCapacity of " + std::to_string(need - 1)), std::string::npos) << msg;
    }
    {
      // docs/API.md, "Capacity mode": fuscoInvalidArgument on every rank, with rank 0's numbers.
      const std::string msg = fuscoGetLastError(comm);
      const size_t need0 = s.d.numRecvRows[0];
      EXPECT_EQ(r, fuscoInvalidArgument) << fuscoGetErrorString(r) << ": " << msg;
      EXPECT_NE(msg.find("rank 0: the routing needs " + std::to_string(need0) + " receive rows"),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find("recvCapacity of " + std::to_string(need0 - 1)), std::string::npos) << msg;
    }
    h = planCapacity(comm, ctx, s, FUSCO_DEDUP_RANK, need, &r);
    FUSCO_ASSERT_OK(comm, r);
    dispatchAndCombine(comm, ctx, s, h, need, "exact capacity after an overflow");
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// An invalid id on rank 1 fails every rank's plan with fuscoInvalidArgument naming the token and
// slot; a capacity of 0 is refused on every rank.
TEST(MoeCapacityErrors, InvalidIdAndZeroCapacityFailOnEveryRank) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(2, [seed](const RankCtx& ctx) {
    CombineSetup s = fusco::test::makeCombine(capacityCase(2), seed, fuscoFloat32, 8);
    fuscoConfig_t cfg = commConfig(s.c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    if (ctx.rank == 1) s.p.topkIdx[1][5 * s.p.topk + 2] = s.c.numExperts + 3;
    fuscoResult_t r;
    fuscoMoeHandle_t h = planCapacity(comm, ctx, s, FUSCO_DEDUP_RANK, 1000, &r);
    EXPECT_NE(r, fuscoSuccess);
    EXPECT_EQ(h, nullptr);
    if (ctx.rank == 1) {
      const std::string msg = fuscoGetLastError(comm);
      EXPECT_NE(msg.find("token 5 slot 2"), std::string::npos) << msg;
    }
    {
      // docs/API.md, "Capacity mode": fuscoInvalidArgument on every rank, naming token and slot.
      const std::string msg = fuscoGetLastError(comm);
      EXPECT_EQ(r, fuscoInvalidArgument) << fuscoGetErrorString(r) << ": " << msg;
      EXPECT_NE(msg.find("token 5 slot 2"), std::string::npos) << msg;
    }
    h = planCapacity(comm, ctx, s, FUSCO_DEDUP_RANK, 0, &r);
    EXPECT_EQ(r, fuscoInvalidArgument);
    EXPECT_EQ(h, nullptr);
    EXPECT_NE(std::string(fuscoGetLastError(comm)).find("recvCapacity 0 outside"),
              std::string::npos);
    h = planCapacity(comm, ctx, s, FUSCO_DEDUP_RANK, size_t{1} << 40, &r);
    EXPECT_EQ(r, fuscoInvalidArgument);
    EXPECT_EQ(h, nullptr);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// NODE dedup across nodes plans on the host: capacity mode refuses it on every rank.
TEST(MoeCapacityErrors, NodeDedupAcrossNodesIsInvalidUsage) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    MoeCase c = capacityCase(4);
    c.localSize = 2;
    const CombineSetup s = fusco::test::makeCombine(c, seed, fuscoFloat32, 8);
    fuscoConfig_t cfg = commConfig(s.c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    fuscoResult_t r;
    fuscoMoeHandle_t h = planCapacity(comm, ctx, s, FUSCO_DEDUP_NODE, 1000, &r);
    EXPECT_EQ(r, fuscoInvalidUsage) << fuscoGetLastError(comm);
    EXPECT_EQ(h, nullptr);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// A capacity handle planned again for the next layers keeps its capacity: each layer matches the
// reference; a layer past the capacity fails every rank's replan, and the next one works.
TEST(MoeCapacityErrors, ReplanKeepsTheCapacity) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    std::vector<CombineSetup> layers;
    for (int l = 0; l < 3; ++l) {
      MoeCase c = capacityCase(3);
      for (size_t& t : c.numTokens) t += 11 * l;
      layers.push_back(fusco::test::makeCombine(c, seed + l, fuscoFloat32, 8));
    }
    size_t capacity = 0;
    for (const CombineSetup& s : layers) capacity = std::max(capacity, mostRows(s));
    fuscoConfig_t cfg = commConfig(layers[0].c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    fuscoResult_t r;
    fuscoMoeHandle_t h = planCapacity(comm, ctx, layers[0], FUSCO_DEDUP_RANK, capacity, &r);
    FUSCO_ASSERT_OK(comm, r);
    for (int l : {0, 1, 2, 1}) {
      const CombineSetup& s = layers[l];
      const auto& idx = s.p.topkIdx[ctx.rank];
      if (l != 0)
        FUSCO_ASSERT_OK(comm, fuscoMoeReplan(h, idx.empty() ? nullptr : idx.data(),
                                             s.p.numTokens[ctx.rank], s.p.topk, nullptr));
      dispatchAndCombine(comm, ctx, s, h, capacity, "layer " + std::to_string(l));
    }
    // Every token of every rank to all four experts of rank 0: 4 rows per token there.
    const CombineSetup& s2 = layers[2];
    const size_t tokens = s2.p.numTokens[ctx.rank];
    std::vector<int64_t> all0(tokens * s2.p.topk);
    for (size_t i = 0; i < all0.size(); ++i) all0[i] = static_cast<int64_t>(i % s2.p.topk);
    size_t total = 0;
    for (size_t t : s2.p.numTokens) total += t;
    ASSERT_GT(4 * total, capacity);
    r = fuscoMoeReplan(h, all0.empty() ? nullptr : all0.data(), tokens, s2.p.topk, nullptr);
    EXPECT_NE(r, fuscoSuccess);
    if (ctx.rank == 0) {
      EXPECT_NE(
          std::string(fuscoGetLastError(comm)).find("recvCapacity of " + std::to_string(capacity)),
          std::string::npos)
          << fuscoGetLastError(comm);
    }
    size_t rows = 0;
    EXPECT_EQ(fuscoMoeGetRecvCounts(h, &rows, nullptr), fuscoInvalidUsage);
    const auto& idx = layers[1].p.topkIdx[ctx.rank];
    FUSCO_ASSERT_OK(
        comm, fuscoMoeReplan(h, idx.empty() ? nullptr : idx.data(), layers[1].p.numTokens[ctx.rank],
                             layers[1].p.topk, nullptr));
    dispatchAndCombine(comm, ctx, layers[1], h, capacity, "layer 1 after an overflow");
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// One rank plans in capacity mode and the other with sizes: the call's agreement fails both,
// naming what differs, and neither gets a handle.
TEST(MoeCapacityErrors, CapacityPlanAgainstAPlanWithSizesFailsBothRanks) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(2, [seed](const RankCtx& ctx) {
    const CombineSetup s = fusco::test::makeCombine(capacityCase(2), seed, fuscoFloat32, 8);
    fuscoConfig_t cfg = commConfig(s.c);
    fuscoComm_t comm = initComm(ctx, &cfg);
    fuscoResult_t r;
    fuscoMoeHandle_t h = nullptr;
    if (ctx.rank == 0) {
      h = planCapacity(comm, ctx, s, FUSCO_DEDUP_RANK, 1000, &r);
    } else {
      fuscoMoeConfig_t mc = fusco::test::moeConfig(s.c, FUSCO_DEDUP_RANK);
      r = fuscoMoePlan(&h, comm, &mc, s.p.topkIdx[1].data(), s.p.numTokens[1], s.p.topk, nullptr);
    }
    EXPECT_EQ(r, fuscoInvalidUsage);
    EXPECT_EQ(h, nullptr);
    // The planner or the capacity mode, whichever the agreement compares first.
    EXPECT_NE(std::string(fuscoGetLastError(comm)).find("differs between ranks"), std::string::npos)
        << fuscoGetLastError(comm);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace
