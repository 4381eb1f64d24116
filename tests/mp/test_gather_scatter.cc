// fuscoGatherSend / fuscoScatterRecv in groups: each rank gathers random rows (duplicates allowed)
// to every peer, itself included, and scatters what it receives to random distinct rows. Every rank
// regenerates the whole exchange from the seed; rows nobody writes keep the 0xA5 poison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::kPoison;
using fusco::test::mix64;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;

constexpr double kPromptSec = 5.0;

// gather[s][d]: rows of s's sendbuff sent to d; scatter[d][s]: rows of d's recvbuff they land in.
struct Exchange {
  int n = 0;
  size_t rowBytes = 0;
  std::vector<size_t> sendRows, recvRows;
  std::vector<std::vector<std::vector<int64_t>>> gather, scatter;
};

Exchange makeExchange(uint64_t seed, int n, size_t rowBytes, size_t maxRows) {
  Exchange x;
  x.n = n;
  x.rowBytes = rowBytes;
  auto counts = fusco::test::randomCountMatrix(seed, n, maxRows, 20);
  std::mt19937_64 rng(mix64(seed ^ 0x9a7e));
  x.gather.assign(n, std::vector<std::vector<int64_t>>(n));
  x.scatter.assign(n, std::vector<std::vector<int64_t>>(n));
  for (int s = 0; s < n; ++s) {
    x.sendRows.push_back(1 + rng() % (maxRows + 1));
    for (int d = 0; d < n; ++d)
      for (size_t i = 0; i < counts[s * n + d]; ++i)
        x.gather[s][d].push_back(rng() % x.sendRows[s]);
  }
  for (int d = 0; d < n; ++d) {
    size_t total = 0;
    for (int s = 0; s < n; ++s) total += counts[s * n + d];
    x.recvRows.push_back(total + total / 4 + 1);
    std::vector<int64_t> perm(x.recvRows[d]);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    size_t next = 0;
    for (int s = 0; s < n; ++s)
      for (size_t i = 0; i < counts[s * n + d]; ++i) x.scatter[d][s].push_back(perm[next++]);
  }
  return x;
}

uint8_t rowByte(uint64_t seed, int s, size_t i, size_t j) {
  const uint64_t key =
      mix64(seed ^ (static_cast<uint64_t>(s) << 56) ^ (static_cast<uint64_t>(i) << 24));
  uint8_t b = static_cast<uint8_t>(mix64(key + (j >> 3)) >> (8 * (j & 7)));
  if (b == 0) b = 1;
  if (b == kPoison) b = 0x5A;
  return b;
}

std::string identify(const Exchange& x, uint64_t seed, const uint8_t* row) {
  if (fusco::test::findNotPoison(row, x.rowBytes) == SIZE_MAX) return "unwritten (poison)";
  for (int s = 0; s < x.n; ++s)
    for (size_t i = 0; i < x.sendRows[s]; ++i) {
      size_t j = 0;
      while (j < x.rowBytes && row[j] == rowByte(seed, s, i, j)) ++j;
      if (j == x.rowBytes) return "send row " + std::to_string(i) + " of rank " + std::to_string(s);
    }
  return "unknown bytes";
}

::testing::AssertionResult recvMatches(const Exchange& x, uint64_t seed, int me,
                                       const uint8_t* got) {
  const size_t rb = x.rowBytes;
  std::vector<uint8_t> want(x.recvRows[me] * rb, kPoison);
  std::vector<std::string> origin(x.recvRows[me]);
  for (int s = 0; s < x.n; ++s)
    for (size_t i = 0; i < x.scatter[me][s].size(); ++i) {
      const int64_t dst = x.scatter[me][s][i], src = x.gather[s][me][i];
      for (size_t j = 0; j < rb; ++j) want[dst * rb + j] = rowByte(seed, s, src, j);
      origin[dst] = "row " + std::to_string(i) + " from rank " + std::to_string(s) +
                    " (its send row " + std::to_string(src) + ")";
    }
  if (std::memcmp(want.data(), got, want.size()) == 0) return ::testing::AssertionSuccess();
  auto fail = ::testing::AssertionFailure();
  int shown = 0;
  for (size_t r = 0; r < x.recvRows[me] && shown < 4; ++r) {
    if (std::memcmp(want.data() + r * rb, got + r * rb, rb) == 0) continue;
    fail << "\n  rank " << me << " recv row " << r << " should hold "
         << (origin[r].empty() ? "poison (untouched)" : origin[r]) << " but holds "
         << identify(x, seed, got + r * rb);
    ++shown;
  }
  return fail;
}

fuscoConfig_t testConfig(int timeoutMs = 60000) {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = timeoutMs;
  return cfg;
}

struct GroupResult {
  fuscoResult_t firstCall = fuscoSuccess;  // first failing call inside the group
  fuscoResult_t end = fuscoSuccess;
  double sec = 0;
};

// One group with a gather to and a scatter from every peer; scatter rows for peer p come from
// scatterRows(p).
GroupResult runGroup(fuscoComm_t comm, const Exchange& x, int me, const void* send, void* recv,
                     const std::vector<std::vector<int64_t>>& scatterRows) {
  GroupResult g;
  const double t0 = nowSec();
  EXPECT_EQ(fuscoGroupStart(), fuscoSuccess);
  for (int p = 0; p < x.n; ++p) {
    const auto& gi = x.gather[me][p];
    fuscoResult_t r = fuscoGatherSend(send, gi.empty() ? nullptr : gi.data(), gi.size(), x.rowBytes,
                                      p, comm, nullptr);
    if (r != fuscoSuccess && g.firstCall == fuscoSuccess) g.firstCall = r;
    const auto& si = scatterRows[p];
    r = fuscoScatterRecv(recv, si.empty() ? nullptr : si.data(), si.size(), x.rowBytes, p, comm,
                         nullptr);
    if (r != fuscoSuccess && g.firstCall == fuscoSuccess) g.firstCall = r;
  }
  g.end = fuscoGroupEnd();
  g.sec = nowSec() - t0;
  return g;
}

void exchangeChecked(fuscoComm_t comm, const Exchange& x, int me, uint64_t seed,
                     const std::string& what) {
  std::vector<uint8_t> send(x.sendRows[me] * x.rowBytes), recv(x.recvRows[me] * x.rowBytes);
  for (size_t i = 0; i < x.sendRows[me]; ++i)
    for (size_t j = 0; j < x.rowBytes; ++j) send[i * x.rowBytes + j] = rowByte(seed, me, i, j);
  fusco::test::poison(recv.data(), recv.size());
  GroupResult g = runGroup(comm, x, me, send.data(), recv.data(), x.scatter[me]);
  EXPECT_EQ(g.firstCall, fuscoSuccess) << what << ": " << fuscoGetLastError(comm);
  EXPECT_EQ(g.end, fuscoSuccess) << what << " fuscoGroupEnd -> " << fuscoGetErrorString(g.end)
                                 << ": " << fuscoGetLastError(comm);
  if (g.end == fuscoSuccess) {
    EXPECT_TRUE(recvMatches(x, seed, me, recv.data())) << what;
  }
}

std::string ranksName(const ::testing::TestParamInfo<int>& i) {
  return std::to_string(i.param) + "ranks";
}

class GatherScatterRanks : public ::testing::TestWithParam<int> {};

TEST_P(GatherScatterRanks, RandomRowsToEveryPeerAreBitExact) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(GetParam(), [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    for (int round = 0; round < 3; ++round) {
      const size_t rb = round == 0 ? 27 : round == 1 ? 1 : 4100;
      Exchange x = makeExchange(seed + round, ctx.nranks, rb, rb > 1000 ? 30 : 150);
      exchangeChecked(comm, x, ctx.rank, seed + round, std::to_string(rb) + "-byte rows");
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

INSTANTIATE_TEST_SUITE_P(GatherScatter, GatherScatterRanks, ::testing::Values(1, 2, 3, 5),
                         ranksName);

TEST(GatherScatter, DuplicateScatterRowFailsThatRankAndItsPeer) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig(20000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    Exchange x = makeExchange(17, 2, 12, 20);
    while (x.gather[0][1].size() < 2) {  // rank 1 receives at least two rows from rank 0
      x.gather[0][1].push_back(0);
      x.scatter[1][0].push_back(static_cast<int64_t>(x.recvRows[1]++));
    }
    std::vector<uint8_t> send(x.sendRows[ctx.rank] * 12, 7), recv(x.recvRows[ctx.rank] * 12);
    auto rows = x.scatter[ctx.rank];
    const int badRank = 1;
    if (ctx.rank == badRank) rows[0][1] = rows[0][0];
    GroupResult g = runGroup(comm, x, ctx.rank, send.data(), recv.data(), rows);
    const std::string msg = fuscoGetLastError(comm);
    EXPECT_LT(g.sec, kPromptSec);
    if (ctx.rank == badRank) {
      EXPECT_TRUE(g.firstCall == fuscoInvalidArgument || g.end == fuscoInvalidArgument)
          << "call " << fuscoGetErrorString(g.firstCall) << ", end " << fuscoGetErrorString(g.end)
          << ": " << msg;
      if (g.firstCall == fuscoSuccess) {
        EXPECT_NE(g.end, fuscoSuccess);
      }
    } else {
      EXPECT_NE(g.end, fuscoSuccess) << "the peer of the bad rank reported success";
      EXPECT_TRUE(g.end == fuscoInvalidUsage || g.end == fuscoRemoteError)
          << fuscoGetErrorString(g.end) << ": " << msg;
    }
    // The comm still works.
    Exchange ok = makeExchange(18, 2, 20, 40);
    exchangeChecked(comm, ok, ctx.rank, 18, "after a duplicate scatter row");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(GatherScatter, NegativeGatherRowIsInvalidArgument) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig(20000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    Exchange x = makeExchange(23, 3, 8, 20);
    for (auto& v : x.gather[2])  // rank 2 sends at least one row to everyone
      if (v.empty()) v.push_back(0);
    for (int d = 0; d < 3; ++d)
      if (x.scatter[d][2].empty()) x.scatter[d][2].push_back(static_cast<int64_t>(x.recvRows[d]++));
    if (ctx.rank == 2) x.gather[2][0][0] = -3;
    std::vector<uint8_t> send(x.sendRows[ctx.rank] * 8, 9), recv(x.recvRows[ctx.rank] * 8);
    GroupResult g = runGroup(comm, x, ctx.rank, send.data(), recv.data(), x.scatter[ctx.rank]);
    EXPECT_LT(g.sec, kPromptSec);
    if (ctx.rank == 2) {
      EXPECT_TRUE(g.firstCall == fuscoInvalidArgument || g.end == fuscoInvalidArgument)
          << fuscoGetErrorString(g.firstCall) << "/" << fuscoGetErrorString(g.end) << ": "
          << fuscoGetLastError(comm);
    }
    if (ctx.rank == 0) {
      EXPECT_NE(g.end, fuscoSuccess) << "rank 0 receives from the bad rank";
    }
    Exchange ok = makeExchange(24, 3, 20, 40);
    exchangeChecked(comm, ok, ctx.rank, 24, "after a negative gather row");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace
