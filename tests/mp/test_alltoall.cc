// fuscoAllToAll / fuscoAllToAllv against the sequential reference: every block from every peer is
// bit-exact and every receive byte nobody should write keeps its poison.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::A2avLayout;
using fusco::test::initComm;
using fusco::test::makeA2avLayout;
using fusco::test::MpOptions;
using fusco::test::RankCtx;
using fusco::test::runRanks;

enum class Mem { Heap, Arena, Registered };

const char* memName(Mem m) {
  return m == Mem::Heap ? "heap" : m == Mem::Arena ? "arena" : "registered";
}

// A buffer of one of the three kinds the API accepts; freed in the destructor.
class Buffer {
 public:
  Buffer(fuscoComm_t comm, size_t bytes, Mem kind) : comm_(comm), kind_(kind) {
    size_t alloc = bytes > 0 ? bytes : 1;
    if (kind == Mem::Arena) {
      fuscoResult_t r = fuscoMemAlloc(comm, &ptr_, alloc);
      EXPECT_EQ(r, fuscoSuccess) << "fuscoMemAlloc(" << alloc << "): " << fuscoGetLastError(comm);
      if (r != fuscoSuccess) ptr_ = nullptr;
    } else {
      ptr_ = malloc(alloc);
      if (kind == Mem::Registered) {
        fuscoResult_t r = fuscoCommRegister(comm, ptr_, alloc, &handle_);
        EXPECT_EQ(r, fuscoSuccess) << "fuscoCommRegister: " << fuscoGetLastError(comm);
        if (r != fuscoSuccess) handle_ = nullptr;
      }
    }
  }
  ~Buffer() {
    if (kind_ == Mem::Arena) {
      if (ptr_) {
        EXPECT_EQ(fuscoMemFree(comm_, ptr_), fuscoSuccess) << fuscoGetLastError(comm_);
      }
    } else {
      if (handle_) {
        EXPECT_EQ(fuscoCommDeregister(comm_, handle_), fuscoSuccess) << fuscoGetLastError(comm_);
      }
      free(ptr_);
    }
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* get() const { return ptr_; }

 private:
  fuscoComm_t comm_;
  Mem kind_;
  void* ptr_ = nullptr;
  void* handle_ = nullptr;
};

// One all-to-all(v) on comm with the given layout and buffer kinds, checked against the reference.
// uniform: call fuscoAllToAll (the layout must be contiguous with equal counts).
::testing::AssertionResult runChecked(fuscoComm_t comm, const A2avLayout& l, fuscoDataType_t dt,
                                      uint64_t seed, Mem sendKind, Mem recvKind, bool uniform) {
  Buffer send(comm, l.sendElems * l.esize, sendKind);
  Buffer recv(comm, l.recvElems * l.esize, recvKind);
  if (send.get() == nullptr || recv.get() == nullptr)
    return ::testing::AssertionFailure() << "buffer allocation failed";
  fusco::test::fillSend(l, send.get(), seed);
  fusco::test::poisonRecv(l, recv.get());
  fuscoResult_t r;
  if (uniform) {
    r = fuscoAllToAll(send.get(), recv.get(), l.sendcounts[0], dt, comm, nullptr);
  } else {
    r = fuscoAllToAllv(send.get(), l.sendcounts.data(), l.sdispls.data(), recv.get(),
                       l.recvcounts.data(), l.rdispls.data(), dt, comm, nullptr);
  }
  if (r != fuscoSuccess)
    return ::testing::AssertionFailure()
           << "rank " << l.rank << ": " << (uniform ? "fuscoAllToAll" : "fuscoAllToAllv") << " ("
           << fusco::test::dtypeName(dt) << ", send " << memName(sendKind) << ", recv "
           << memName(recvKind) << ") -> " << fuscoGetErrorString(r) << ": "
           << fuscoGetLastError(comm);
  auto ok = fusco::test::checkRecv(l, recv.get(), seed);
  if (!ok)
    return ok << " [" << fusco::test::dtypeName(dt) << ", send " << memName(sendKind) << ", recv "
              << memName(recvKind) << "]";
  return ok;
}

fuscoConfig_t testConfig() {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = 60000;
  return cfg;
}

std::string ranksName(const ::testing::TestParamInfo<int>& i) {
  return std::to_string(i.param) + "ranks";
}

// ---------------------------------------------------------------- fuscoAllToAll

class AllToAll : public ::testing::TestWithParam<int> {};

TEST_P(AllToAll, EqualBlocksAreBitExact) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(GetParam(), [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    for (size_t count : {size_t{1}, size_t{7}, size_t{1001}, size_t{65536 + 3}}) {
      auto l = makeA2avLayout(fusco::test::uniformCountMatrix(ctx.nranks, count), ctx.nranks,
                              ctx.rank, 4, seed, false);
      EXPECT_TRUE(runChecked(comm, l, fuscoInt32, seed + count, Mem::Heap, Mem::Heap, true))
          << "count " << count;
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllToAll, ::testing::Values(1, 2, 3, 4, 5, 8), ranksName);

TEST(AllToAllZero, ZeroCountWithNullBuffersSucceeds) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    FUSCO_EXPECT_OK(comm, fuscoAllToAll(nullptr, nullptr, 0, fuscoFloat32, comm, nullptr));
    // Non-NULL buffers with count 0: nothing is written.
    std::vector<uint8_t> send(64, 1), recv(64);
    fusco::test::poison(recv.data(), recv.size());
    FUSCO_EXPECT_OK(comm, fuscoAllToAll(send.data(), recv.data(), 0, fuscoFloat32, comm, nullptr));
    EXPECT_TRUE(fusco::test::isPoisoned(recv.data(), recv.size(), "recv after count 0"));
    // The comm still moves data afterwards.
    auto l = makeA2avLayout(fusco::test::uniformCountMatrix(3, 33), 3, ctx.rank, 4, 3, false);
    EXPECT_TRUE(runChecked(comm, l, fuscoFloat32, 3, Mem::Heap, Mem::Heap, true));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// 4 ranks x 16 MiB each (64 MiB in all), heap and arena buffers.
TEST(AllToAllLarge, SixtyFourMiBTotalIsBitExact) {
  const uint64_t seed = fusco::test::testSeed();
  MpOptions opt;
  opt.timeoutSec = 120;
  runRanks(
      4,
      [seed](const RankCtx& ctx) {
        fuscoConfig_t cfg = testConfig();
        fuscoComm_t comm = initComm(ctx, &cfg);
        const size_t count = (4u << 20) / 4;  // 4 MiB of float32 per peer
        auto l =
            makeA2avLayout(fusco::test::uniformCountMatrix(4, count), 4, ctx.rank, 4, seed, false);
        EXPECT_TRUE(runChecked(comm, l, fuscoFloat32, seed, Mem::Heap, Mem::Heap, true));
        EXPECT_TRUE(runChecked(comm, l, fuscoFloat32, seed + 1, Mem::Arena, Mem::Arena, true));
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      opt);
}

TEST(AllToAllRepeat, ThousandSmallCallsStayCorrect) {
  const uint64_t seed = fusco::test::testSeed();
  MpOptions opt;
  opt.timeoutSec = 120;
  runRanks(
      4,
      [seed](const RankCtx& ctx) {
        fuscoConfig_t cfg = testConfig();
        fuscoComm_t comm = initComm(ctx, &cfg);
        const int n = ctx.nranks;
        std::vector<uint8_t> send(n * 64 * 4), recv(n * 64 * 4);
        int failures = 0;
        for (int it = 0; it < 1000 && failures < 3; ++it) {
          const size_t count = 1 + it % 37;
          auto l =
              makeA2avLayout(fusco::test::uniformCountMatrix(n, count), n, ctx.rank, 4, 0, false);
          fusco::test::fillSend(l, send.data(), seed + it);
          fusco::test::poisonRecv(l, recv.data());
          fuscoResult_t r =
              fuscoAllToAll(send.data(), recv.data(), count, fuscoUint32, comm, nullptr);
          if (r != fuscoSuccess) {
            ADD_FAILURE() << "iteration " << it << ": " << fuscoGetErrorString(r) << ": "
                          << fuscoGetLastError(comm);
            break;
          }
          auto ok = fusco::test::checkRecv(l, recv.data(), seed + it);
          if (!ok) {
            ++failures;
            ADD_FAILURE() << "iteration " << it << ": " << ok.message();
          }
        }
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      opt);
}

// ---------------------------------------------------------------- fuscoAllToAllv

class AllToAllv : public ::testing::TestWithParam<int> {};

TEST_P(AllToAllv, UnevenCountsWithGapsAreBitExact) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(GetParam(), [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    for (int round = 0; round < 3; ++round) {
      const uint64_t s = seed + 100 * round;
      auto counts = fusco::test::randomCountMatrix(s, ctx.nranks, 3000, 25);
      auto l = makeA2avLayout(counts, ctx.nranks, ctx.rank, 4, s, true);
      EXPECT_TRUE(runChecked(comm, l, fuscoFloat32, s, Mem::Heap, Mem::Heap, false))
          << "round " << round;
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllToAllv, ::testing::Values(1, 2, 3, 4, 6, 8), ranksName);

TEST(AllToAllvZero, AllZeroCountsWithNullBuffersSucceed) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    std::vector<size_t> zeros(3, 0);
    FUSCO_EXPECT_OK(comm, fuscoAllToAllv(nullptr, zeros.data(), zeros.data(), nullptr, zeros.data(),
                                         zeros.data(), fuscoInt8, comm, nullptr));
    auto l = makeA2avLayout(fusco::test::randomCountMatrix(9, 3, 100, 0), 3, ctx.rank, 1, 9, true);
    EXPECT_TRUE(runChecked(comm, l, fuscoInt8, 9, Mem::Heap, Mem::Heap, false));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// Rank 1 sends nothing at all (NULL sendbuff) and rank 2 receives nothing (NULL recvbuff).
TEST(AllToAllvZero, RanksThatSendOrReceiveNothingMayPassNull) {
  runRanks(4, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const int n = 4;
    auto counts = fusco::test::randomCountMatrix(77, n, 500, 0);
    for (int p = 0; p < n; ++p) {
      counts[1 * n + p] = 0;  // row: what rank 1 sends
      counts[p * n + 2] = 0;  // column: what rank 2 receives
    }
    auto l = makeA2avLayout(counts, n, ctx.rank, 2, 77, true);
    std::vector<uint8_t> send(l.sendElems * 2 + 1), recv(l.recvElems * 2 + 1);
    fusco::test::fillSend(l, send.data(), 77);
    fusco::test::poisonRecv(l, recv.data());
    const void* sp = ctx.rank == 1 ? nullptr : send.data();
    void* rp = ctx.rank == 2 ? nullptr : recv.data();
    FUSCO_EXPECT_OK(
        comm, fuscoAllToAllv(sp, l.sendcounts.data(), l.sdispls.data(), rp, l.recvcounts.data(),
                             l.rdispls.data(), fuscoBfloat16, comm, nullptr));
    if (rp) {
      EXPECT_TRUE(fusco::test::checkRecv(l, recv.data(), 77));
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

class AllToAllvTypes : public ::testing::TestWithParam<fuscoDataType_t> {};

TEST_P(AllToAllvTypes, EveryDatatypeMovesBitExact) {
  const fuscoDataType_t dt = GetParam();
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [dt, seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const size_t es = fusco::test::dtypeSize(dt);
    auto counts = fusco::test::randomCountMatrix(seed, 3, 20000 / es + 3, 20);
    auto l = makeA2avLayout(counts, 3, ctx.rank, es, seed, true);
    EXPECT_TRUE(runChecked(comm, l, dt, seed, Mem::Heap, Mem::Heap, false));
    auto u = makeA2avLayout(fusco::test::uniformCountMatrix(3, 999), 3, ctx.rank, es, seed, false);
    EXPECT_TRUE(runChecked(comm, u, dt, seed + 1, Mem::Heap, Mem::Heap, true));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

INSTANTIATE_TEST_SUITE_P(Types, AllToAllvTypes,
                         ::testing::Values(fuscoInt8, fuscoUint8, fuscoInt32, fuscoUint32,
                                           fuscoInt64, fuscoUint64, fuscoFloat16, fuscoFloat32,
                                           fuscoFloat64, fuscoBfloat16, fuscoFloat8e4m3,
                                           fuscoFloat8e5m2),
                         [](const ::testing::TestParamInfo<fuscoDataType_t>& i) {
                           return std::string(fusco::test::dtypeName(i.param));
                         });

TEST(AllToAllvMemory, ArenaRegisteredAndHeapBuffersInEveryMix) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const Mem kinds[] = {Mem::Heap, Mem::Arena, Mem::Registered};
    int k = 0;
    for (Mem s : kinds) {
      for (Mem r : kinds) {
        const uint64_t sd = seed + 31 * (k++);
        auto counts = fusco::test::randomCountMatrix(sd, 4, 40000, 15);
        auto l = makeA2avLayout(counts, 4, ctx.rank, 8, sd, true);
        EXPECT_TRUE(runChecked(comm, l, fuscoFloat64, sd, s, r, false));
      }
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(AllToAllvLayouts, ChangingLayoutEveryCallStaysCorrect) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    for (int it = 0; it < 100; ++it) {
      const uint64_t s = seed + it;
      auto counts = fusco::test::randomCountMatrix(s, 3, it % 10 == 0 ? 20000 : 200, 30);
      auto l = makeA2avLayout(counts, 3, ctx.rank, it % 2 ? 2 : 4, s, it % 3 != 0);
      auto ok =
          runChecked(comm, l, it % 2 ? fuscoFloat16 : fuscoInt32, s, Mem::Heap, Mem::Heap, false);
      if (!ok) {
        ADD_FAILURE() << "iteration " << it << ": " << ok.message();
        break;
      }
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// MPI allows send blocks to overlap: here every peer gets the same bytes from one block.
TEST(AllToAllvLayouts, SendBlocksMayOverlap) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const size_t count = 777;
    std::vector<uint8_t> send(count * 4);
    fusco::test::fillPayload(send.data(), 5, ctx.rank, -1, 0, send.size());
    std::vector<size_t> sc(3, count), sd(3, 0), rc(3, count), rd{0, count, 2 * count};
    std::vector<uint8_t> recv(3 * count * 4);
    fusco::test::poison(recv.data(), recv.size());
    FUSCO_ASSERT_OK(comm, fuscoAllToAllv(send.data(), sc.data(), sd.data(), recv.data(), rc.data(),
                                         rd.data(), fuscoUint32, comm, nullptr));
    for (int p = 0; p < 3; ++p)
      EXPECT_TRUE(fusco::test::payloadMatches(recv.data() + rd[p] * 4, 4, count, 5, p, -1, 0, 3,
                                              "block from " + std::to_string(p)));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// Small slices (64 KiB, 2 in flight) so one message spans many pipeline steps.
TEST(AllToAllvSlices, EnvSmallChunksSpanManySlices) {
  const uint64_t seed = fusco::test::testSeed();
  MpOptions opt;
  opt.env = {{"FUSCO_CHUNK_BYTES", "65536"}, {"FUSCO_PIPELINE_DEPTH", "2"}};
  opt.timeoutSec = 120;
  runRanks(
      4,
      [seed](const RankCtx& ctx) {
        fuscoConfig_t cfg = testConfig();
        fuscoComm_t comm = initComm(ctx, &cfg);
        // Up to ~1.2 MiB per pair, sizes that are not multiples of the slice.
        auto counts = fusco::test::randomCountMatrix(seed, 4, 300000, 10);
        auto l = makeA2avLayout(counts, 4, ctx.rank, 4, seed, true);
        EXPECT_TRUE(runChecked(comm, l, fuscoFloat32, seed, Mem::Heap, Mem::Heap, false));
        EXPECT_TRUE(runChecked(comm, l, fuscoFloat32, seed + 1, Mem::Arena, Mem::Arena, false));
        auto u = makeA2avLayout(fusco::test::uniformCountMatrix(4, (1 << 20) + 1), 4, ctx.rank, 1,
                                seed, false);
        EXPECT_TRUE(runChecked(comm, u, fuscoUint8, seed + 2, Mem::Heap, Mem::Heap, true));
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      opt);
}

TEST(AllToAllvSlices, ConfigSmallestChunksWithOddSizes) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    cfg.chunkBytes = 16384;  // the smallest slice the library accepts
    cfg.pipelineDepth = 1;
    fuscoComm_t comm = initComm(ctx, &cfg);
    auto counts = fusco::test::randomCountMatrix(seed, 3, 9000, 10);
    auto l = makeA2avLayout(counts, 3, ctx.rank, 8, seed, true);
    EXPECT_TRUE(runChecked(comm, l, fuscoInt64, seed, Mem::Heap, Mem::Heap, false));
    EXPECT_TRUE(runChecked(comm, l, fuscoInt64, seed + 1, Mem::Arena, Mem::Heap, false));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace
