// Destroyed and foreign MoE handles and layouts (docs/API.md, "Conventions"): every entry point
// that takes one answers fuscoInvalidArgument "not a live MoE handle / layout (destroyed or never
// created)" for a handle destroyed already, destroyed twice or never made, without touching freed
// memory; a handle or layout whose communicator was destroyed fails clearly in every call but its
// own destroy, which still frees it. Handles are numbers the library never gives out twice: a
// destroyed communicator, MoE handle, layout, low-latency buffer or registration stays dead even
// when a new object is made at the same address, and the new object is untouched.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "harness/ll_cases.h"
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

// Several rounds of destroy-then-make: allocators hand the freed address back at once, which is
// how a stale handle used to reach the new object.
TEST(StaleHandles, DestroyedMoeHandleStaysDeadWhenANewPlanTakesItsPlace) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoComm_t comm = initComm(ctx);
    for (int round = 0; round < 4; ++round) {
      fuscoMoeHandle_t h1 = planSmall(comm);
      FUSCO_ASSERT_OK(comm, fuscoMoeHandleDestroy(h1));
      fuscoMoeHandle_t h2 = planSmall(comm);
      ASSERT_NE(h2, nullptr);
      EXPECT_NE(h1, h2) << "a handle was given out twice";
      size_t rows = 777;
      expectInvalid(fuscoMoeGetRecvCounts(h1, &rows, nullptr), "not a live MoE handle",
                    "fuscoMoeGetRecvCounts on the destroyed handle");
      EXPECT_EQ(rows, 777u);
      expectInvalid(fuscoMoeHandleDestroy(h1), "not a live MoE handle",
                    "fuscoMoeHandleDestroy on the destroyed handle");
      // The new plan is untouched by the calls on the stale handle.
      FUSCO_EXPECT_OK(comm, fuscoMoeGetRecvCounts(h2, &rows, nullptr));
      FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h2));
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(StaleHandles, DestroyedLayoutStaysDeadWhenANewLayoutTakesItsPlace) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoComm_t comm = initComm(ctx);
    std::vector<char> send(16, 3), recv(16, 0);
    for (int round = 0; round < 4; ++round) {
      fuscoLayout_t l1 = layoutSmall(comm);
      FUSCO_ASSERT_OK(comm, fuscoLayoutDestroy(l1));
      fuscoLayout_t l2 = layoutSmall(comm);
      EXPECT_NE(l1, l2) << "a layout handle was given out twice";
      expectInvalid(fuscoLayoutDestroy(l1), "not a live layout", "fuscoLayoutDestroy (stale)");
      FUSCO_EXPECT_OK(comm, fuscoShuffle(send.data(), recv.data(), l2, nullptr));
      FUSCO_EXPECT_OK(comm, fuscoLayoutDestroy(l2));
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(StaleHandles, DestroyedLowLatencyBufferStaysDeadWhenANewOneTakesItsPlace) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = fusco::test::llCommConfig(ctx, 10000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    const fusco::test::LlCase c = fusco::test::llSmallCase(2);
    for (int round = 0; round < 3; ++round) {
      fuscoLowLatency_t l1 = fusco::test::llCreate(comm, c);
      FUSCO_ASSERT_OK(comm, fuscoLowLatencyDestroy(l1));
      fuscoLowLatency_t l2 = fusco::test::llCreate(comm, c);
      ASSERT_NE(l2, nullptr);
      EXPECT_NE(l1, l2) << "a low-latency handle was given out twice";
      expectInvalid(fuscoLowLatencyDestroy(l1), "not a live low-latency buffer",
                    "fuscoLowLatencyDestroy (stale)");
      // The thread's own failure, not an older message of the comm.
      EXPECT_NE(std::string(fuscoGetLastError(comm)).find("not a live low-latency buffer"),
                std::string::npos)
          << fuscoGetLastError(comm);
      FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(l2));
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// One-rank comms, each from its own unique id, made and destroyed in turn.
fuscoComm_t soloComm() {
  fuscoUniqueId id;
  EXPECT_EQ(fuscoGetUniqueId(&id), fuscoSuccess) << fuscoGetLastError(nullptr);
  fuscoComm_t c = nullptr;
  EXPECT_EQ(fuscoCommInitRank(&c, 1, id, 0), fuscoSuccess) << fuscoGetLastError(nullptr);
  return c;
}

TEST(StaleHandles, DestroyedCommStaysDeadWhenANewCommTakesItsPlace) {
  runRanks(1, [](const RankCtx&) {
    for (int round = 0; round < 3; ++round) {
      fuscoComm_t c1 = soloComm();
      FUSCO_ASSERT_OK(c1, fuscoCommDestroy(c1));
      fuscoComm_t c2 = soloComm();
      ASSERT_NE(c2, nullptr);
      EXPECT_NE(c1, c2) << "a comm handle was given out twice";
      int n = -1;
      expectInvalid(fuscoCommCount(c1, &n), "not a live communicator", "fuscoCommCount (stale)");
      expectInvalid(fuscoCommDestroy(c1), "not a live communicator", "fuscoCommDestroy (stale)");
      FUSCO_EXPECT_OK(c2, fuscoCommCount(c2, &n));
      EXPECT_EQ(n, 1);
      FUSCO_EXPECT_OK(c2, fuscoCommDestroy(c2));
    }
  });
}

// A registration handle taken back stays dead: deregistering it again fails and leaves the
// registration made after it (which may have reused its value before) in place.
TEST(StaleHandles, StaleRegistrationHandleLeavesTheNextRegistrationAlone) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoComm_t comm = initComm(ctx);
    std::vector<char> a(4096), b(4096);
    for (int round = 0; round < 4; ++round) {
      void* ha = nullptr;
      void* hb = nullptr;
      FUSCO_ASSERT_OK(comm, fuscoCommRegister(comm, a.data(), a.size(), &ha));
      FUSCO_ASSERT_OK(comm, fuscoCommDeregister(comm, ha));
      FUSCO_ASSERT_OK(comm, fuscoCommRegister(comm, b.data(), b.size(), &hb));
      EXPECT_NE(ha, hb) << "a registration handle was given out twice";
      expectInvalid(fuscoCommDeregister(comm, ha), "not a registration of this comm",
                    "fuscoCommDeregister (stale)");
      FUSCO_EXPECT_OK(comm, fuscoCommDeregister(comm, hb));
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(StaleHandles, RegisteringARangePastTheEndOfTheAddressSpaceIsRefused) {
  runRanks(1, [](const RankCtx& ctx) {
    fuscoComm_t comm = initComm(ctx);
    std::vector<char> a(64);
    void* h = nullptr;
    expectInvalid(fuscoCommRegister(comm, a.data(), SIZE_MAX, &h), "past the end of the address",
                  "fuscoCommRegister(SIZE_MAX)");
    EXPECT_EQ(h, nullptr);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace
