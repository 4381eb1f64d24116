// The GPU planner's steps (src/device/plan_steps.h) on their host twin, every rank in one
// process: each list must equal the host planner's (src/plan/moe_plan.h) byte for byte on seeded
// routings (uniform, one hot expert, idle experts, empty ranks, top-1 to top-8 and more, 1 to 8
// ranks, NONE and RANK, padding, explicit placement); invalid routing and a receive side sized too
// small write nothing. tests/gpu/test_gpu_plan.cc runs the same cases on the kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/result.h"
#include "harness/data_gen.h"
#include "harness/gpu_plan_cases.h"
#include "harness/moe_cases.h"
#include "plan/moe_plan.h"

namespace fusco {
namespace {

using test::GpuPlanCase;
using test::gpuPlanCases;
using test::GpuPlanRun;

// The twin's executor for GpuPlanRun: host buffers, the host steps.
struct TwinExec {
  char* alloc(size_t bytes) {
    bufs.emplace_back(bytes);
    test::poison(bufs.back().data(), bytes);
    return bufs.back().data();
  }
  void send(const gplan::SendArgs& a) { hostPlanSend(a); }
  void recv(const gplan::RecvArgs& a) { hostPlanRecv(a); }
  void terms(const gplan::SendArgs& a, const int64_t* fan) { hostPlanTermRows(a, fan); }
  void toDevice(void* dst, const void* src, size_t bytes) {
    if (bytes > 0) memcpy(dst, src, bytes);
  }
  void toHost(void* dst, const void* src, size_t bytes) {
    if (bytes > 0) memcpy(dst, src, bytes);
  }
  std::vector<std::vector<char>> bufs;
};

class GpuPlanTwin : public ::testing::TestWithParam<GpuPlanCase> {};

TEST_P(GpuPlanTwin, EveryListEqualsTheHostPlanner) {
  const GpuPlanCase& c = GetParam();
  const test::MoeRefProblem p = test::makeProblem(c.moe, test::testSeed(c.salt));
  TwinExec x;
  GpuPlanRun run(p, c.dedup, c.entrySlack);
  run.execute(x);
  EXPECT_EQ(run.compareWithHostPlanner(), "") << c.name;
}

INSTANTIATE_TEST_SUITE_P(Routings, GpuPlanTwin, ::testing::ValuesIn(gpuPlanCases()),
                         [](const ::testing::TestParamInfo<GpuPlanCase>& i) {
                           return i.param.name;
                         });

// An id out of range or repeated in a token: the first bad slot is the host check's, and no list
// is written (the lists are sized for valid routing only).
TEST(GpuPlanTwinInvalid, FirstBadSlotIsTheHostChecksAndNothingIsWritten) {
  test::MoeCase mc;
  mc.nranks = 4;
  mc.numExperts = 16;
  mc.topk = 4;
  mc.numTokens = {40, 40, 40, 40};
  for (int kind = 0; kind < 3; ++kind) {
    test::MoeRefProblem p = test::makeProblem(mc, test::testSeed(kind));
    std::vector<int64_t>& idx = p.topkIdx[1];
    const size_t t = 23;
    if (kind == 0) idx[t * 4 + 2] = 16;                                              // out of range
    if (kind == 1) idx[t * 4 + 3] = -2;                                              // below -1
    if (kind == 2) idx[t * 4 + 3] = idx[t * 4], idx[t * 4] = 5, idx[t * 4 + 3] = 5;  // repeated
    idx[30 * 4 + 1] = 99;  // a later bad slot: the first one wins
    MoeShape shape;
    ASSERT_EQ(buildMoeShape(4, 16, nullptr, 0, &shape), fuscoSuccess);
    ASSERT_NE(validateTopk(shape, idx.data(), 40, 4), fuscoSuccess);
    const std::string hostMessage = threadLastError();
    TwinExec x;
    test::GpuPlanSendOnly one(shape, idx.data(), 40, 4, Dedup::Rank);
    one.execute(x);
    EXPECT_EQ(one.badSlot(), kind == 0 ? t * 4 + 2 : t * 4 + 3) << hostMessage;
    EXPECT_TRUE(hostMessage.find("token 23 slot " + std::to_string(one.badSlot() % 4)) !=
                std::string::npos)
        << hostMessage;
    EXPECT_TRUE(one.listsUntouched()) << "kind " << kind;
  }
}

// A receive side sized for fewer entries than arrive reports the overflow and writes no fan row.
TEST(GpuPlanTwinCapacity, TooManyEntriesAreReportedAndNothingIsWritten) {
  test::MoeCase mc;
  mc.nranks = 3;
  mc.numExperts = 6;
  mc.topk = 2;
  mc.numTokens = {30, 30, 30};
  const test::MoeRefProblem p = test::makeProblem(mc, test::testSeed(7));
  TwinExec x;
  GpuPlanRun run(p, Dedup::Rank, 0);
  run.capEntries(1);  // every rank receives more than one entry
  run.execute(x);
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(run.recvErrors(r) & gplan::kErrOverflow, 0u) << "rank " << r;
    EXPECT_TRUE(run.fanRowsUntouched(r)) << "rank " << r;
  }
}

// A layer plan (fuscoMoePlan's steps) on a routing with a repeated id, in a buffer of garbage:
// the send side reports the bad slot and the fan steps read and write nothing (the slot lists
// they would walk were never written). ASan runs this in CI.
TEST(GpuPlanTwinInvalid, LayerFanStepsTouchNothingForAnInvalidRouting) {
  LayerPlanDims d;
  d.numTokens = 3;
  d.topk = 2;
  d.nranks = 1;
  d.numExperts = 4;
  d.numLocal = 4;
  LayerPlan p;
  std::vector<char> buf(carveLayerPlan(nullptr, d, &p), 0x7f);
  carveLayerPlan(buf.data(), d, &p);
  const std::vector<int64_t> topk = {0, 1, 2, 2, 3, -1};  // token 1 names expert 2 twice
  for (int e = 0; e < 4; ++e) {
    p.rankOf[e] = 0;
    p.localOf[e] = e;
    p.msgPos[e] = 2 + e;
    p.basePos[e] = e;
  }
  p.msgOff[0] = 0;
  p.send.topkIdx = topk.data();
  hostPlanSend(p.send);
  EXPECT_EQ(*p.send.badSlot, 3u);
  hostPlanFan(p.fan, p.send);
  const size_t slots = d.numTokens * d.topk;
  const auto untouched = [](const void* at, size_t bytes) {
    const char* c = static_cast<const char*>(at);
    return std::all_of(c, c + bytes, [](char b) { return b == 0x7f; });
  };
  EXPECT_TRUE(untouched(p.fan.remoteFan, slots * sizeof(int64_t))) << "fan rows written";
  EXPECT_TRUE(untouched(p.send.termRow, slots * sizeof(int64_t))) << "term rows written";
}

}  // namespace
}  // namespace fusco
