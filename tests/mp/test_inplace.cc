// In-place all-to-all and overlapping buffers (docs/API.md, "All-to-all and all-to-allv"):
// fuscoAllToAll with sendbuff == recvbuff is exact (host buffers from malloc and fuscoMemAlloc,
// several sizes and datatypes); partial overlap in fuscoAllToAll, overlapping send and receive
// ranges in one fuscoAllToAllv and in one group are refused with fuscoInvalidArgument on the rank
// that passed them, and the comm stays usable.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::RankCtx;
using fusco::test::runRanks;

fuscoConfig_t quickConfig() {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = 20000;
  return cfg;
}

// One in-place all-to-all of `count` elements per block in buf (nranks blocks), checked bytewise
// against the payload each peer put in its block for this rank.
void inPlaceRoundTrip(fuscoComm_t comm, const RankCtx& ctx, char* buf, size_t count,
                      fuscoDataType_t dt, uint64_t seed) {
  const size_t es = fusco::test::dtypeSize(dt), block = count * es;
  for (int j = 0; j < ctx.nranks; ++j)
    fusco::test::fillPayload(buf + j * block, seed, ctx.rank, j, 0, block);
  FUSCO_ASSERT_OK(comm, fuscoAllToAll(buf, buf, count, dt, comm, nullptr));
  for (int i = 0; i < ctx.nranks; ++i) {
    const size_t bad =
        fusco::test::findPayloadMismatch(buf + i * block, seed, i, ctx.rank, 0, block);
    EXPECT_EQ(bad, SIZE_MAX) << "in-place " << fusco::test::dtypeName(dt) << " count " << count
                             << ": block from rank " << i << " wrong at byte " << bad;
  }
}

void expectInvalid(fuscoResult_t r, const char* needle, const std::string& what) {
  const std::string msg = fuscoGetLastError(nullptr);
  EXPECT_EQ(r, fuscoInvalidArgument) << what << ": " << fuscoGetErrorString(r) << ": " << msg;
  EXPECT_NE(msg.find(needle), std::string::npos) << what << ": message '" << msg << "'";
}

TEST(InPlace, AllToAllWithSendEqualToRecvIsExactOnMallocBuffers) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = quickConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const fuscoDataType_t types[] = {fuscoInt8, fuscoInt32, fuscoFloat64, fuscoBfloat16};
    const size_t counts[] = {1, 13, 4096, 1 << 20};
    for (fuscoDataType_t dt : types)
      for (size_t count : counts) {
        std::vector<char> buf(count * fusco::test::dtypeSize(dt) * ctx.nranks);
        inPlaceRoundTrip(comm, ctx, buf.data(), count, dt, seed + count);
      }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(InPlace, AllToAllWithSendEqualToRecvIsExactOnMemAllocBuffers) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = quickConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const fuscoDataType_t types[] = {fuscoUint8, fuscoFloat32, fuscoInt64, fuscoFloat16};
    const size_t counts[] = {1, 77, 65536, 300000};
    for (fuscoDataType_t dt : types)
      for (size_t count : counts) {
        void* buf = nullptr;
        FUSCO_ASSERT_OK(comm,
                        fuscoMemAlloc(comm, &buf, count * fusco::test::dtypeSize(dt) * ctx.nranks));
        inPlaceRoundTrip(comm, ctx, static_cast<char*>(buf), count, dt, seed + 3 * count);
        FUSCO_EXPECT_OK(comm, fuscoMemFree(comm, buf));
      }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(InPlace, PartlyOverlappingAllToAllBuffersAreInvalidArgumentAndCommStaysUsable) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = quickConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    std::vector<int32_t> buf(3 * 8 + 1, 1);
    expectInvalid(fuscoAllToAll(buf.data(), buf.data() + 1, 8, fuscoInt32, comm, nullptr),
                  "overlap", "recvbuff one element after sendbuff");
    std::vector<char> own(3 * 8 * 4);
    inPlaceRoundTrip(comm, ctx, own.data(), 8, fuscoInt32, 5);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(InPlace, OverlappingSendAndRecvRangesInOneAllToAllvAreInvalidArgument) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = quickConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    std::vector<int32_t> buf(64, 1);
    // Sends from [0, 12), receives into [10, 22): elements 10 and 11 are on both sides.
    const std::vector<size_t> counts = {4, 4, 4}, sdispls = {0, 4, 8}, rdispls = {10, 14, 18};
    expectInvalid(fuscoAllToAllv(buf.data(), counts.data(), sdispls.data(), buf.data(),
                                 counts.data(), rdispls.data(), fuscoInt32, comm, nullptr),
                  "overlaps the receive block", "all-to-allv over one buffer");
    // Disjoint ranges of one buffer are fine.
    const std::vector<size_t> apart = {20, 24, 28};
    FUSCO_EXPECT_OK(comm, fuscoAllToAllv(buf.data(), counts.data(), sdispls.data(), buf.data(),
                                         counts.data(), apart.data(), fuscoInt32, comm, nullptr));
    std::vector<char> own(3 * 8 * 4);
    inPlaceRoundTrip(comm, ctx, own.data(), 8, fuscoInt32, 6);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(InPlace, OverlappingSendAndRecvInOneGroupAreInvalidArgument) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = quickConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const int peer = 1 - ctx.rank;
    std::vector<int32_t> buf(32, 1);
    FUSCO_ASSERT_OK(comm, fuscoGroupStart());
    FUSCO_EXPECT_OK(comm, fuscoSend(buf.data(), 16, fuscoInt32, peer, comm, nullptr));
    FUSCO_EXPECT_OK(comm, fuscoRecv(buf.data() + 8, 16, fuscoInt32, peer, comm, nullptr));
    expectInvalid(fuscoGroupEnd(), "overlaps a receive", "send [0, 16) and receive [8, 24)");
    // Row lists: a gathered row that is also a scattered row.
    const int64_t sendRows[] = {0, 3}, recvRows[] = {1, 3};
    FUSCO_ASSERT_OK(comm, fuscoGroupStart());
    FUSCO_EXPECT_OK(comm, fuscoGatherSend(buf.data(), sendRows, 2, 8, peer, comm, nullptr));
    FUSCO_EXPECT_OK(comm, fuscoScatterRecv(buf.data(), recvRows, 2, 8, peer, comm, nullptr));
    expectInvalid(fuscoGroupEnd(), "overlaps a receive", "gathered and scattered row 3");
    // The comm is usable: disjoint rows of one buffer move exactly.
    for (int i = 0; i < 32; ++i) buf[i] = 1000 * ctx.rank + i;
    const int64_t recvApart[] = {1, 2};
    FUSCO_ASSERT_OK(comm, fuscoGroupStart());
    FUSCO_EXPECT_OK(comm, fuscoGatherSend(buf.data(), sendRows, 2, 8, peer, comm, nullptr));
    FUSCO_EXPECT_OK(comm, fuscoScatterRecv(buf.data(), recvApart, 2, 8, peer, comm, nullptr));
    FUSCO_EXPECT_OK(comm, fuscoGroupEnd());
    EXPECT_EQ(buf[2], 1000 * peer + 0);
    EXPECT_EQ(buf[3], 1000 * peer + 1);
    EXPECT_EQ(buf[4], 1000 * peer + 6);
    EXPECT_EQ(buf[5], 1000 * peer + 7);
    EXPECT_EQ(buf[0], 1000 * ctx.rank);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace
