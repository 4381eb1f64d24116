// Row-indexed transfers on CUDA comms: fuscoGatherSend / fuscoScatterRecv in groups with DEVICE
// int64 row lists, and persistent layouts (fuscoLayoutCreate with host arrays, fuscoShuffle on
// device buffers). Each rank gathers random rows (duplicates allowed) for every peer, itself
// included, and scatters what it receives to random distinct rows; every rank regenerates the
// whole exchange from the seed. Rows nobody writes keep the 0xA5 poison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_harness.h"
#include "harness/data_gen.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::kPoison;
using fusco::test::mix64;
using fusco::test::RankCtx;
using namespace fusco::test::gpu;

// send[s][d]: rows of s's sendbuff for d, in order (duplicates allowed); recv[d][s]: rows of d's
// recvbuff the rows from s land in (distinct over all s).
struct Exchange {
  int n = 0;
  size_t rowBytes = 0;
  std::vector<size_t> sendRowsOf, recvRowsOf;
  std::vector<std::vector<std::vector<int64_t>>> send, recv;
};

Exchange makeExchange(uint64_t seed, int n, size_t rowBytes, size_t maxRows, int zeroPercent) {
  Exchange x;
  x.n = n;
  x.rowBytes = rowBytes;
  auto counts = fusco::test::randomCountMatrix(seed, n, maxRows, zeroPercent);
  std::mt19937_64 rng(mix64(seed ^ 0x6e0a7u));
  x.send.assign(n, std::vector<std::vector<int64_t>>(n));
  x.recv.assign(n, std::vector<std::vector<int64_t>>(n));
  for (int s = 0; s < n; ++s) {
    x.sendRowsOf.push_back(1 + rng() % (maxRows + 1));
    for (int d = 0; d < n; ++d)
      for (size_t i = 0; i < counts[s * n + d]; ++i)
        x.send[s][d].push_back(rng() % x.sendRowsOf[s]);
  }
  for (int d = 0; d < n; ++d) {
    size_t total = 0;
    for (int s = 0; s < n; ++s) total += counts[s * n + d];
    const size_t rows = total + total / 3 + 2;  // some rows stay untouched
    x.recvRowsOf.push_back(rows);
    std::vector<int64_t> perm(rows);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    size_t next = 0;
    for (int s = 0; s < n; ++s)
      for (size_t i = 0; i < counts[s * n + d]; ++i) x.recv[d][s].push_back(perm[next++]);
  }
  return x;
}

// Byte j of row i of rank s's sendbuff; never 0, never the poison.
uint8_t sendByte(uint64_t seed, int s, size_t i, size_t j) {
  const uint64_t key =
      mix64(seed ^ (static_cast<uint64_t>(s) << 56) ^ (static_cast<uint64_t>(i) << 24));
  uint8_t b = static_cast<uint8_t>(mix64(key + (j >> 3)) >> (8 * (j & 7)));
  if (b == 0) b = 1;
  if (b == kPoison) b = 0x5A;
  return b;
}

std::vector<uint8_t> sendData(const Exchange& x, uint64_t seed, int s) {
  std::vector<uint8_t> buf(x.sendRowsOf[s] * x.rowBytes);
  for (size_t i = 0; i < x.sendRowsOf[s]; ++i)
    for (size_t j = 0; j < x.rowBytes; ++j) buf[i * x.rowBytes + j] = sendByte(seed, s, i, j);
  return buf;
}

std::string identify(const Exchange& x, uint64_t seed, const uint8_t* row) {
  if (fusco::test::findNotPoison(row, x.rowBytes) == SIZE_MAX) return "unwritten (poison)";
  for (int s = 0; s < x.n; ++s)
    for (size_t i = 0; i < x.sendRowsOf[s]; ++i) {
      size_t j = 0;
      while (j < x.rowBytes && row[j] == sendByte(seed, s, i, j)) ++j;
      if (j == x.rowBytes) return "send row " + std::to_string(i) + " of rank " + std::to_string(s);
    }
  return "unknown bytes";
}

::testing::AssertionResult recvMatches(const Exchange& x, uint64_t seed, int me,
                                       const std::vector<uint8_t>& got) {
  const size_t rb = x.rowBytes;
  std::vector<uint8_t> want(got.size(), kPoison);  // tail included: must stay poison
  std::vector<std::string> origin(x.recvRowsOf[me]);
  for (int s = 0; s < x.n; ++s)
    for (size_t i = 0; i < x.recv[me][s].size(); ++i) {
      const int64_t dst = x.recv[me][s][i], src = x.send[s][me][i];
      for (size_t j = 0; j < rb; ++j) want[dst * rb + j] = sendByte(seed, s, src, j);
      origin[dst] = "row " + std::to_string(i) + " from rank " + std::to_string(s) +
                    " (its send row " + std::to_string(src) + ")";
    }
  if (want == got) return ::testing::AssertionSuccess();
  auto fail = ::testing::AssertionFailure();
  const size_t rows = x.recvRowsOf[me];
  if (std::memcmp(want.data() + rows * rb, got.data() + rows * rb, got.size() - rows * rb) != 0)
    fail << "\n  rank " << me << " wrote past the receive buffer";
  int shown = 0;
  for (size_t r = 0; r < rows && shown < 4; ++r) {
    if (std::memcmp(want.data() + r * rb, got.data() + r * rb, rb) == 0) continue;
    fail << "\n  rank " << me << " recv row " << r << " should hold "
         << (origin[r].empty() ? "poison (untouched)" : origin[r]) << " but holds "
         << identify(x, seed, got.data() + r * rb);
    ++shown;
  }
  return fail;
}

// ---------------------------------------------------------------- gather / scatter

// One group with a gather to and a scatter from every peer (device row lists), checked.
void gatherScatterChecked(fuscoComm_t comm, const Exchange& x, int me, uint64_t seed, Mem recvKind,
                          cudaStream_t stream, const std::string& what) {
  const size_t rb = x.rowBytes;
  DevBuf send(comm, x.sendRowsOf[me] * rb, Mem::Cuda);
  DevBuf recv = poisonedBuf(comm, x.recvRowsOf[me] * rb + kTailBytes, recvKind);
  ASSERT_TRUE(send.ok() && recv.ok());
  send.upload(sendData(x, seed, me));
  std::vector<DevBuf> gatherIdx, scatterIdx;
  for (int p = 0; p < x.n; ++p) {
    gatherIdx.push_back(toDevice(comm, x.send[me][p]));
    scatterIdx.push_back(toDevice(comm, x.recv[me][p]));
  }
  FUSCO_ASSERT_OK(comm, fuscoGroupStart());
  for (int i = 0; i < x.n; ++i) {
    const int p = (i + me) % x.n;  // rank-dependent posting order
    FUSCO_EXPECT_OK(comm,
                    fuscoGatherSend(send.get(), static_cast<const int64_t*>(gatherIdx[p].get()),
                                    x.send[me][p].size(), rb, p, comm, stream));
    FUSCO_EXPECT_OK(comm,
                    fuscoScatterRecv(recv.get(), static_cast<const int64_t*>(scatterIdx[p].get()),
                                     x.recv[me][p].size(), rb, p, comm, stream));
  }
  FUSCO_ASSERT_OK(comm, fuscoGroupEnd());
  CUDA_ASSERT_OK(cudaStreamSynchronize(stream));
  EXPECT_TRUE(recvMatches(x, seed, me, recv.download())) << what << ", recv " << memName(recvKind);
}

class GpuGatherScatter : public ::testing::TestWithParam<int> {};

TEST_P(GpuGatherScatter, DeviceRowListsMoveRowsBitExact) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(
      GetParam(), [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
        int k = 0;
        for (size_t rb : {size_t{52}, size_t{1}, size_t{7168 * 2 + 4}}) {
          const Mem m = kAllMems[k++ % 3];
          Exchange x = makeExchange(seed + rb, ctx.nranks, rb, rb > 1000 ? 40 : 300, 15);
          gatherScatterChecked(comm, x, ctx.rank, seed + rb, m, stream.get(),
                               std::to_string(rb) + "-byte rows");
        }
      });
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuGatherScatter, ::testing::Values(2, 4, 8), ranksName);

// ---------------------------------------------------------------- layouts

// Creates the layout (host arrays), shuffles `runs` times with fresh send data into a poisoned
// device recvbuff of kind recvKind, checks each, destroys it.
void shuffleChecked(fuscoComm_t comm, const Exchange& x, int me, uint64_t seed, int runs,
                    Mem recvKind, cudaStream_t stream, const std::string& what) {
  std::vector<size_t> sendCounts, recvCounts;
  std::vector<int64_t> sendRows, recvRows;
  for (int p = 0; p < x.n; ++p) {
    sendCounts.push_back(x.send[me][p].size());
    sendRows.insert(sendRows.end(), x.send[me][p].begin(), x.send[me][p].end());
    recvCounts.push_back(x.recv[me][p].size());
    recvRows.insert(recvRows.end(), x.recv[me][p].begin(), x.recv[me][p].end());
  }
  fuscoLayout_t layout = nullptr;
  fuscoResult_t r = fuscoLayoutCreate(
      &layout, comm, x.rowBytes, sendCounts.data(), sendRows.empty() ? nullptr : sendRows.data(),
      recvCounts.data(), recvRows.empty() ? nullptr : recvRows.data());
  ASSERT_EQ(r, fuscoSuccess) << what << " fuscoLayoutCreate -> " << fuscoGetErrorString(r) << ": "
                             << fuscoGetLastError(comm);
  DevBuf send(comm, x.sendRowsOf[me] * x.rowBytes, Mem::Cuda);
  DevBuf recv(comm, x.recvRowsOf[me] * x.rowBytes + kTailBytes, recvKind);
  for (int run = 0; run < runs; ++run) {
    const uint64_t s = seed + 1000 * run;
    send.upload(sendData(x, s, me));
    recv.poison();
    r = fuscoShuffle(send.get(), recv.get(), layout, stream);
    EXPECT_EQ(r, fuscoSuccess) << what << " run " << run << " fuscoShuffle -> "
                               << fuscoGetErrorString(r) << ": " << fuscoGetLastError(comm);
    if (r != fuscoSuccess) break;
    CUDA_ASSERT_OK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(recvMatches(x, s, me, recv.download()))
        << what << " run " << run << ", recv " << memName(recvKind);
  }
  FUSCO_EXPECT_OK(comm, fuscoLayoutDestroy(layout));
}

class GpuLayoutShuffle : public ::testing::TestWithParam<int> {};

TEST_P(GpuLayoutShuffle, RandomLayoutIsBitExactOverRunsWithNewData) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanksOnStream(
      GetParam(), [seed](const RankCtx& ctx, fuscoComm_t comm, const Stream& stream) {
        for (Mem m : kAllMems) {
          Exchange x = makeExchange(seed + static_cast<int>(m), ctx.nranks, 52, 300, 15);
          shuffleChecked(comm, x, ctx.rank, seed + static_cast<int>(m), 3, m, stream.get(),
                         "52-byte rows");
        }
      });
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuLayoutShuffle, ::testing::Values(2, 4, 8), ranksName);

TEST(GpuLayout, OddRowBytesZeroRowsAndLegacyStreamAreBitExact) {
  FUSCO_GPU_REQUIRE();
  const uint64_t seed = fusco::test::testSeed();
  runGpuRanks(4, [seed](const RankCtx& ctx, fuscoComm_t comm) {
    for (size_t rb : {size_t{1}, size_t{33}, size_t{7168 * 2 + 4}}) {
      Exchange x = makeExchange(seed + rb, 4, rb, rb > 1000 ? 40 : 200, 40);
      shuffleChecked(comm, x, ctx.rank, seed + rb, 2, Mem::Cuda, nullptr,
                     std::to_string(rb) + "-byte rows");
    }
  });
}

TEST(GpuLayout, NothingToSendOrReceiveAnywhereSucceeds) {
  FUSCO_GPU_REQUIRE();
  runGpuRanks(2, [](const RankCtx&, fuscoComm_t comm) {
    std::vector<size_t> zeros(2, 0);
    fuscoLayout_t layout = nullptr;
    FUSCO_ASSERT_OK(
        comm, fuscoLayoutCreate(&layout, comm, 16, zeros.data(), nullptr, zeros.data(), nullptr));
    FUSCO_EXPECT_OK(comm, fuscoShuffle(nullptr, nullptr, layout, nullptr));
    CUDA_EXPECT_OK(cudaStreamSynchronize(nullptr));
    FUSCO_EXPECT_OK(comm, fuscoLayoutDestroy(layout));
  });
}

}  // namespace
