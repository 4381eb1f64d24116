// Destroyed and foreign MoE handles and layouts (docs/API.md, "Conventions"): every entry point
// that takes one answers fuscoInvalidArgument "not a live MoE handle / layout (destroyed or never
// created)" for a handle destroyed already, destroyed twice or never made, without touching freed
// memory; a handle or layout whose communicator was destroyed fails clearly in every call but its
// own destroy, which still frees it.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::RankCtx;
using fusco::test::runRanks;

void expectInvalid(fuscoResult_t r, const char* needle, const std::string& what) {
  const std::string msg = fuscoGetLastError(nullptr);
  EXPECT_EQ(r, fuscoInvalidArgument) << what << ": " << fuscoGetErrorString(r) << ": " << msg;
  EXPECT_NE(msg.find(needle), std::string::npos) << what << ": message '" << msg << "'";
}

fuscoMoeHandle_t planSmall(fuscoComm_t comm) {
  fuscoMoeConfig_t mc = FUSCO_MOE_CONFIG_INITIALIZER;
  mc.numExperts = 2;
  const int64_t topk[] = {0, 1, 1, -1};
  fuscoMoeHandle_t h = nullptr;
  EXPECT_EQ(fuscoMoePlan(&h, comm, &mc, topk, 2, 2, nullptr), fuscoSuccess)
      << fuscoGetLastError(comm);
  return h;
}

fuscoLayout_t layoutSmall(fuscoComm_t comm) {
  const size_t counts[] = {1, 1};
  const int64_t rows[] = {0, 1};
  fuscoLayout_t l = nullptr;
  EXPECT_EQ(fuscoLayoutCreate(&l, comm, 8, counts, rows, counts, rows), fuscoSuccess)
      << fuscoGetLastError(comm);
  return l;
}

// Every handle entry point on h fails with `needle` in the message.
void expectEveryMoeCallFails(fuscoMoeHandle_t h, const char* needle, bool destroyToo) {
  std::vector<char> x(64, 1), recvX(256), out(64);
  size_t rows = 12345;
  int64_t perExpert[2] = {-7, -7};
  expectInvalid(fuscoMoeGetRecvCounts(h, &rows, perExpert), needle, "fuscoMoeGetRecvCounts");
  EXPECT_EQ(rows, 12345u) << "out-parameter written on failure";
  EXPECT_EQ(perExpert[0], -7);
  fuscoMoeStats_t st{};
  st.size = sizeof(st);
  expectInvalid(fuscoMoeGetStats(h, &st), needle, "fuscoMoeGetStats");
  expectInvalid(fuscoMoeDispatch(h, x.data(), 8, recvX.data(), nullptr), needle,
                "fuscoMoeDispatch");
  expectInvalid(fuscoMoeCombine(h, recvX.data(), fuscoFloat32, 2, nullptr, out.data(), nullptr),
                needle, "fuscoMoeCombine");
  if (destroyToo) expectInvalid(fuscoMoeHandleDestroy(h), needle, "fuscoMoeHandleDestroy");
}

void expectEveryLayoutCallFails(fuscoLayout_t l, const char* needle, bool destroyToo) {
  std::vector<char> send(64, 1), recv(64);
  expectInvalid(fuscoShuffle(send.data(), recv.data(), l, nullptr), needle, "fuscoShuffle");
  if (destroyToo) expectInvalid(fuscoLayoutDestroy(l), needle, "fuscoLayoutDestroy");
}

TEST(DeadHandles, DestroyedMoeHandleFailsEveryEntryPointAndSecondDestroy) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoComm_t comm = initComm(ctx);
    fuscoMoeHandle_t h = planSmall(comm);
    ASSERT_NE(h, nullptr);
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    expectEveryMoeCallFails(h, "not a live MoE handle (destroyed or never created)", true);
    // The comm and fresh handles are unaffected.
    fuscoMoeHandle_t h2 = planSmall(comm);
    size_t rows = 0;
    FUSCO_EXPECT_OK(comm, fuscoMoeGetRecvCounts(h2, &rows, nullptr));
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h2));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(DeadHandles, DestroyedLayoutFailsShuffleAndSecondDestroy) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoComm_t comm = initComm(ctx);
    fuscoLayout_t l = layoutSmall(comm);
    ASSERT_NE(l, nullptr);
    FUSCO_EXPECT_OK(comm, fuscoLayoutDestroy(l));
    expectEveryLayoutCallFails(l, "not a live layout (destroyed or never created)", true);
    fuscoLayout_t l2 = layoutSmall(comm);
    std::vector<char> send(16, 3), recv(16);
    FUSCO_EXPECT_OK(comm, fuscoShuffle(send.data(), recv.data(), l2, nullptr));
    FUSCO_EXPECT_OK(comm, fuscoLayoutDestroy(l2));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(DeadHandles, GarbagePointersAreNotLiveHandlesOrLayouts) {
  runRanks(1, [](const RankCtx& ctx) {
    fuscoComm_t comm = initComm(ctx);
    for (uintptr_t v : {uintptr_t{0x10}, uintptr_t{0xdeadbeef0}, ~uintptr_t{0} - 7}) {
      expectEveryMoeCallFails(reinterpret_cast<fuscoMoeHandle_t>(v), "not a live MoE handle", true);
      expectEveryLayoutCallFails(reinterpret_cast<fuscoLayout_t>(v), "not a live layout", true);
    }
    // A live layout is not a MoE handle, and the reverse.
    fuscoLayout_t l = layoutSmall(comm);
    fuscoMoeHandle_t h = planSmall(comm);
    expectEveryMoeCallFails(reinterpret_cast<fuscoMoeHandle_t>(l), "not a live MoE handle", true);
    expectEveryLayoutCallFails(reinterpret_cast<fuscoLayout_t>(h), "not a live layout", true);
    FUSCO_EXPECT_OK(comm, fuscoLayoutDestroy(l));
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(DeadHandles, HandleAndLayoutOfADestroyedCommFailClearlyAndStillFree) {
  // One rank, so it can make a second communicator from a fresh id of its own.
  runRanks(1, [](const RankCtx& ctx) {
    fuscoComm_t comm = initComm(ctx);
    fuscoMoeHandle_t h = planSmall(comm);
    fuscoLayout_t l = layoutSmall(comm);
    ASSERT_NE(h, nullptr);
    ASSERT_NE(l, nullptr);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
    // A comm made afterwards (possibly at the same address) is not the handle's comm.
    fuscoUniqueId id;
    FUSCO_ASSERT_OK(nullptr, fuscoGetUniqueId(&id));
    fuscoComm_t other = nullptr;
    FUSCO_ASSERT_OK(nullptr, fuscoCommInitRank(&other, 1, id, 0));
    std::vector<char> x(64, 1), recvX(256), out(64);
    expectInvalid(fuscoMoeDispatch(h, x.data(), 8, recvX.data(), nullptr), "has been destroyed",
                  "fuscoMoeDispatch after fuscoCommDestroy");
    expectInvalid(fuscoMoeCombine(h, recvX.data(), fuscoFloat32, 2, nullptr, out.data(), nullptr),
                  "has been destroyed", "fuscoMoeCombine after fuscoCommDestroy");
    expectInvalid(fuscoShuffle(x.data(), out.data(), l, nullptr), "has been destroyed",
                  "fuscoShuffle after fuscoCommDestroy");
    FUSCO_EXPECT_OK(nullptr, fuscoMoeHandleDestroy(h));
    FUSCO_EXPECT_OK(nullptr, fuscoLayoutDestroy(l));
    expectInvalid(fuscoMoeHandleDestroy(h), "not a live MoE handle", "second destroy");
    FUSCO_EXPECT_OK(other, fuscoCommDestroy(other));
  });
}

}  // namespace
