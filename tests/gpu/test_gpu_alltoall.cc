// fuscoAllToAll, fuscoAllToAllv and grouped fuscoSend/fuscoRecv on CUDA comms: device buffers of
// every kind (cudaMalloc, fuscoMemAlloc, registered cudaMalloc), on a created stream and on the
// legacy default stream (NULL). Receive buffers are poisoned with cudaMemset(0xA5) before each
// call; after cudaStreamSynchronize every block is bit-exact against the sequential reference,
// every gap byte still poison and nothing is written past the end.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gpu/gpu_harness.h"
#include "harness/data_gen.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::A2avLayout;
using fusco::test::makeA2avLayout;
using fusco::test::RankCtx;
using fusco::test::runRanks;
using namespace fusco::test::gpu;

// ---------------------------------------------------------------- fuscoAllToAll

class GpuAllToAll : public ::testing::TestWithParam<int> {};

TEST_P(GpuAllToAll, EqualBlocksAreBitExactForEveryReceiveBufferKind) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(
      GetParam(), [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
        for (size_t count : {size_t{1}, size_t{7}, size_t{1001}, size_t{65536 + 3}})
          for (Mem m : kAllMems) {
            auto l = makeA2avLayout(fusco::test::uniformCountMatrix(ctx.nranks, count), ctx.nranks,
                                    ctx.rank, 4, seed, false);
            EXPECT_TRUE(gpuAllToAllChecked(comm, l, fuscoInt32, seed + count, Mem::Cuda, m, true,
                                           stream.get()))
                << "count " << count;
          }
      });
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuAllToAll, ::testing::Values(2, 4, 8), ranksName);

TEST(GpuAllToAllStreams, LegacyDefaultStreamAndRepeatedCallsStayExact) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(4, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    for (int it = 0; it < 40; ++it) {
      const size_t count = 1 + (it * 977) % 5000;
      auto l =
          makeA2avLayout(fusco::test::uniformCountMatrix(4, count), 4, ctx.rank, 2, seed, false);
      auto ok =
          gpuAllToAllChecked(comm, l, fuscoBfloat16, seed + it, it % 3 ? Mem::Cuda : Mem::Arena,
                             Mem::Cuda, true, it % 2 ? nullptr : stream.get());
      if (!ok) {
        ADD_FAILURE() << "iteration " << it << ": " << ok.message();
        break;
      }
    }
  });
}

// An SM budget of one multiprocessor (fuscoConfig_t.maxSms): every grid still moves every byte,
// with sizes from one row to several pipeline slices.
TEST(GpuAllToAllSmBudget, OneMultiprocessorStillMovesEveryByte) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  fuscoConfig_t cfg = gpuConfig(4);
  cfg.maxSms = 1;
  runGpuRanksOnStream(
      4,
      [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
        for (size_t count : {size_t{1}, size_t{4099}, size_t{3} << 20}) {
          auto l = makeA2avLayout(fusco::test::uniformCountMatrix(4, count), 4, ctx.rank, 4,
                                  seed + count, false);
          EXPECT_TRUE(gpuAllToAllChecked(comm, l, fuscoInt32, seed + count, Mem::Cuda, Mem::Cuda,
                                         true, stream.get()))
              << "count " << count;
        }
      },
      &cfg);
}

TEST(GpuAllToAllZero, ZeroCountWithNullBuffersSucceedsAndWritesNothing) {
  FUSCO_GPU_REQUIRE();
  runGpuRanksOnStream(2, [](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    FUSCO_EXPECT_OK(comm, fuscoAllToAll(nullptr, nullptr, 0, fuscoFloat32, comm, stream.api()));
    DevBuf send = poisonedBuf(comm, 256), recv = poisonedBuf(comm, 256);
    FUSCO_EXPECT_OK(comm,
                    fuscoAllToAll(send.get(), recv.get(), 0, fuscoFloat32, comm, stream.api()));
    CUDA_EXPECT_OK(cudaStreamSynchronize(stream.get()));
    EXPECT_TRUE(fusco::test::isPoisoned(recv.download().data(), 256, "recv after count 0"));
    auto l = makeA2avLayout(fusco::test::uniformCountMatrix(2, 33), 2, ctx.rank, 4, 3, false);
    EXPECT_TRUE(
        gpuAllToAllChecked(comm, l, fuscoFloat32, 3, Mem::Cuda, Mem::Cuda, true, stream.get()));
  });
}

// sendbuff == recvbuff: the send side is copied into the comm's scratch on the stream first, so
// every block is exact whatever the buffer kind.
TEST(GpuAllToAllInPlace, SendEqualToRecvIsExactForEveryBufferKind) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(4, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    for (fuscoDataType_t dt : {fuscoInt32, fuscoBfloat16})
      for (size_t count : {size_t{1}, size_t{1001}, size_t{65536 + 3}})
        for (Mem m : kAllMems) {
          const size_t block = count * fusco::test::dtypeSize(dt);
          std::vector<uint8_t> host(block * ctx.nranks);
          for (int j = 0; j < ctx.nranks; ++j)
            fusco::test::fillPayload(host.data() + j * block, seed + count, ctx.rank, j, 0, block);
          DevBuf buf(comm, host.size(), m);
          buf.upload(host);
          FUSCO_EXPECT_OK(comm, fuscoAllToAll(buf.get(), buf.get(), count, dt, comm, stream.api()));
          CUDA_EXPECT_OK(cudaStreamSynchronize(stream.get()));
          const std::vector<uint8_t> got = buf.download();
          for (int i = 0; i < ctx.nranks; ++i) {
            const size_t bad = fusco::test::findPayloadMismatch(
                got.data() + i * block, seed + count, i, ctx.rank, 0, block);
            EXPECT_EQ(bad, SIZE_MAX) << memName(m) << " " << fusco::test::dtypeName(dt) << " count "
                                     << count << ": block from rank " << i << " byte " << bad;
          }
        }
  });
}

// Class C, eager (docs/TESTING.md, "Failure classes"): 8 MiB per peer, with cudaMalloc receive
// buffers (never in place), through a channel of 256 KiB per pair (FUSCO_CUDA_RING_BYTES, read at
// init): each message wraps the ring 32 times, and nothing grows inside the call. A staging area
// that grew inside the call made the first call fail with "has not mapped it yet".
TEST(GpuAllToAllStaging, LargerThanTheStagingAreaIsExact) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  fusco::test::runRanks(
      2,
      [seed](const RankCtx& ctx) {
        setenv("FUSCO_CUDA_RING_BYTES", "262144", 1);
        fuscoComm_t comm = initGpuComm(ctx);
        {
          Stream stream;
          const size_t count = (8u << 20) / 4;
          auto l = makeA2avLayout(fusco::test::uniformCountMatrix(2, count), 2, ctx.rank, 4, seed,
                                  false);
          for (int it = 0; it < 2; ++it)
            EXPECT_TRUE(gpuAllToAllChecked(comm, l, fuscoInt32, seed + it, Mem::Cuda, Mem::Cuda,
                                           true, stream.get()))
                << "call " << it + 1;
        }
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      gpuOptions());
}

// ---------------------------------------------------------------- fuscoAllToAllv

class GpuAllToAllv : public ::testing::TestWithParam<int> {};

TEST_P(GpuAllToAllv, UnevenCountsWithGapsAreBitExact) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(GetParam(),
                      [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
                        for (int round = 0; round < 3; ++round) {
                          const uint64_t s = seed + 100 * round;
                          auto counts = fusco::test::randomCountMatrix(s, ctx.nranks, 30000, 25);
                          auto l = makeA2avLayout(counts, ctx.nranks, ctx.rank, 4, s, true);
                          EXPECT_TRUE(gpuAllToAllChecked(comm, l, fuscoFloat32, s, Mem::Cuda,
                                                         kAllMems[round], false, stream.get()))
                              << "round " << round;
                        }
                      });
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuAllToAllv, ::testing::Values(2, 4, 8), ranksName);

TEST(GpuAllToAllvMemory, EveryMixOfSendAndReceiveBufferKinds) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(4, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    int k = 0;
    for (Mem s : kAllMems)
      for (Mem r : kAllMems) {
        const uint64_t sd = seed + 31 * (k++);
        auto counts = fusco::test::randomCountMatrix(sd, 4, 40000, 15);
        auto l = makeA2avLayout(counts, 4, ctx.rank, 8, sd, true);
        EXPECT_TRUE(gpuAllToAllChecked(comm, l, fuscoFloat64, sd, s, r, false, stream.get()));
      }
  });
}

TEST(GpuAllToAllvTypes, EveryDatatypeMovesBitExact) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(4, [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    for (int t = 0; t < fuscoNumTypes; ++t) {
      const auto dt = static_cast<fuscoDataType_t>(t);
      const size_t es = fusco::test::dtypeSize(dt);
      auto counts = fusco::test::randomCountMatrix(seed + t, 4, 20000 / es + 3, 20);
      auto l = makeA2avLayout(counts, 4, ctx.rank, es, seed + t, true);
      EXPECT_TRUE(
          gpuAllToAllChecked(comm, l, dt, seed + t, Mem::Cuda, Mem::Cuda, false, stream.get()));
    }
  });
}

// Rank 1 sends nothing (NULL sendbuff), rank 0 receives nothing (NULL recvbuff).
TEST(GpuAllToAllvZero, RanksThatSendOrReceiveNothingMayPassNull) {
  FUSCO_GPU_REQUIRE();
  runGpuRanksOnStream(4, [](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
    const int n = 4;
    auto counts = fusco::test::randomCountMatrix(77, n, 500, 0);
    for (int p = 0; p < n; ++p) {
      counts[1 * n + p] = 0;
      counts[p * n + 0] = 0;
    }
    auto l = makeA2avLayout(counts, n, ctx.rank, 2, 77, true);
    DevBuf send = sendBufFor(comm, l, 77), recv = poisonedBuf(comm, l.recvElems * 2 + 1);
    const void* sp = ctx.rank == 1 ? nullptr : send.get();
    void* rp = ctx.rank == 0 ? nullptr : recv.get();
    FUSCO_EXPECT_OK(
        comm, fuscoAllToAllv(sp, l.sendcounts.data(), l.sdispls.data(), rp, l.recvcounts.data(),
                             l.rdispls.data(), fuscoFloat16, comm, stream.api()));
    CUDA_EXPECT_OK(cudaStreamSynchronize(stream.get()));
    if (rp) {
      EXPECT_TRUE(fusco::test::checkRecv(l, recv.download().data(), 77));
    }
  });
}

// ---------------------------------------------------------------- grouped send / receive

class GpuGroup : public ::testing::TestWithParam<int> {};

// Every rank sends to and receives from every rank (itself included) with uneven counts (some 0),
// posted in a rank-dependent order; receive buffers of every kind.
TEST_P(GpuGroup, SendRecvToEveryPeerIsBitExact) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(
      GetParam(), [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
        const int n = ctx.nranks;
        for (int round = 0; round < 3; ++round) {
          const uint64_t s = seed + round;
          auto counts = fusco::test::randomCountMatrix(s, n, 20000, 20);
          auto l = makeA2avLayout(counts, n, ctx.rank, 2, s, true);
          DevBuf send = sendBufFor(comm, l, s, Mem::Cuda);
          DevBuf recv = poisonedBuf(comm, l.recvElems * 2 + kTailBytes, kAllMems[round]);
          FUSCO_ASSERT_OK(comm, fuscoGroupStart());
          for (int i = 0; i < n; ++i) {
            const int q = (i + ctx.rank) % n;
            FUSCO_EXPECT_OK(comm, fuscoRecv(recv.bytes() + l.rdispls[q] * 2, l.recvcounts[q],
                                            fuscoBfloat16, q, comm, stream.api()));
            FUSCO_EXPECT_OK(comm, fuscoSend(send.bytes() + l.sdispls[q] * 2, l.sendcounts[q],
                                            fuscoBfloat16, q, comm, stream.api()));
          }
          FUSCO_ASSERT_OK(comm, fuscoGroupEnd());
          CUDA_ASSERT_OK(cudaStreamSynchronize(stream.get()));
          std::vector<uint8_t> got = recv.download();
          EXPECT_TRUE(fusco::test::checkRecv(l, got.data(), s))
              << "round " << round << ", recv " << memName(kAllMems[round]);
          EXPECT_TRUE(fusco::test::isPoisoned(got.data() + l.recvElems * 2, kTailBytes, "tail"));
        }
      });
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuGroup, ::testing::Values(2, 4, 8), ranksName);

TEST(GpuGroupRing, SendToNextReceiveFromPreviousOnLegacyStream) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanks(4, [seed](const RankCtx& ctx, fuscoComm_t comm) {
    const int n = ctx.nranks, next = (ctx.rank + 1) % n, prev = (ctx.rank + n - 1) % n;
    for (size_t count : {size_t{1}, size_t{4099}, size_t{1 << 20}}) {
      std::vector<uint8_t> hs(count * 4);
      fusco::test::fillPayload(hs.data(), seed, ctx.rank, next, 0, hs.size());
      DevBuf send = toDevice(comm, hs), recv = poisonedBuf(comm, count * 4);
      FUSCO_ASSERT_OK(comm, fuscoGroupStart());
      FUSCO_EXPECT_OK(comm, fuscoSend(send.get(), count, fuscoFloat32, next, comm, nullptr));
      FUSCO_EXPECT_OK(comm, fuscoRecv(recv.get(), count, fuscoFloat32, prev, comm, nullptr));
      FUSCO_ASSERT_OK(comm, fuscoGroupEnd());
      CUDA_ASSERT_OK(cudaStreamSynchronize(nullptr));
      EXPECT_TRUE(fusco::test::payloadMatches(recv.download().data(), 4, count, seed, prev,
                                              ctx.rank, 0, n,
                                              "ring recv, count " + std::to_string(count)));
    }
  });
}

}  // namespace
