// Persistent layouts (fuscoLayoutCreate / fuscoShuffle / fuscoLayoutDestroy) against a sequential
// reference: every rank regenerates every rank's layout from the seed, so it knows which (source
// rank, source row) must land in each of its receive rows; rows nobody writes keep the 0xA5 poison.
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
using fusco::test::MpOptions;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;

constexpr double kPromptSec = 5.0;

// Every rank's layout. send[s][d]: rows of s's sendbuff sent to d, in order (duplicates allowed);
// recv[d][s]: rows of d's recvbuff the rows from s land in (distinct over all s).
struct GlobalLayout {
  int n = 0;
  size_t rowBytes = 0;
  std::vector<size_t> sendRowsOf, recvRowsOf;  // buffer sizes in rows
  std::vector<std::vector<std::vector<int64_t>>> send, recv;

  size_t count(int s, int d) const { return send[s][d].size(); }
};

GlobalLayout makeLayout(uint64_t seed, int n, size_t rowBytes, size_t maxRows, int zeroPercent) {
  GlobalLayout g;
  g.n = n;
  g.rowBytes = rowBytes;
  auto counts = fusco::test::randomCountMatrix(seed, n, maxRows, zeroPercent);
  std::mt19937_64 rng(mix64(seed ^ 0x1a70u));
  g.send.assign(n, std::vector<std::vector<int64_t>>(n));
  g.recv.assign(n, std::vector<std::vector<int64_t>>(n));
  for (int s = 0; s < n; ++s) {
    g.sendRowsOf.push_back(1 + rng() % (maxRows + 1));
    for (int d = 0; d < n; ++d)
      for (size_t i = 0; i < counts[s * n + d]; ++i)
        g.send[s][d].push_back(rng() % g.sendRowsOf[s]);
  }
  for (int d = 0; d < n; ++d) {
    size_t total = 0;
    for (int s = 0; s < n; ++s) total += counts[s * n + d];
    const size_t rows = total + total / 3 + 2;  // some rows stay untouched
    g.recvRowsOf.push_back(rows);
    std::vector<int64_t> perm(rows);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    size_t next = 0;
    for (int s = 0; s < n; ++s)
      for (size_t i = 0; i < counts[s * n + d]; ++i) g.recv[d][s].push_back(perm[next++]);
  }
  return g;
}

// The arguments of fuscoLayoutCreate for one rank.
struct RankLayout {
  std::vector<size_t> sendCounts, recvCounts;
  std::vector<int64_t> sendRows, recvRows;
};

RankLayout rankLayout(const GlobalLayout& g, int me) {
  RankLayout l;
  for (int p = 0; p < g.n; ++p) {
    l.sendCounts.push_back(g.send[me][p].size());
    l.sendRows.insert(l.sendRows.end(), g.send[me][p].begin(), g.send[me][p].end());
    l.recvCounts.push_back(g.recv[me][p].size());
    l.recvRows.insert(l.recvRows.end(), g.recv[me][p].begin(), g.recv[me][p].end());
  }
  return l;
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

std::vector<uint8_t> sendData(const GlobalLayout& g, uint64_t seed, int s) {
  std::vector<uint8_t> buf(g.sendRowsOf[s] * g.rowBytes);
  for (size_t i = 0; i < g.sendRowsOf[s]; ++i)
    for (size_t j = 0; j < g.rowBytes; ++j) buf[i * g.rowBytes + j] = sendByte(seed, s, i, j);
  return buf;
}

// Where a wrong row came from: "(rank s, send row i)", "poison" or "unknown".
std::string identify(const GlobalLayout& g, uint64_t seed, const uint8_t* row) {
  if (fusco::test::findNotPoison(row, g.rowBytes) == SIZE_MAX) return "unwritten (poison)";
  for (int s = 0; s < g.n; ++s)
    for (size_t i = 0; i < g.sendRowsOf[s]; ++i) {
      size_t j = 0;
      while (j < g.rowBytes && row[j] == sendByte(seed, s, i, j)) ++j;
      if (j == g.rowBytes) return "send row " + std::to_string(i) + " of rank " + std::to_string(s);
    }
  return "unknown bytes";
}

::testing::AssertionResult recvMatches(const GlobalLayout& g, uint64_t seed, int me,
                                       const uint8_t* got) {
  const size_t rb = g.rowBytes;
  std::vector<std::string> origin(g.recvRowsOf[me]);
  std::vector<uint8_t> want(g.recvRowsOf[me] * rb, kPoison);
  for (int s = 0; s < g.n; ++s)
    for (size_t i = 0; i < g.recv[me][s].size(); ++i) {
      const int64_t dst = g.recv[me][s][i], src = g.send[s][me][i];
      for (size_t j = 0; j < rb; ++j) want[dst * rb + j] = sendByte(seed, s, src, j);
      origin[dst] = "row " + std::to_string(i) + " from rank " + std::to_string(s) +
                    " (its send row " + std::to_string(src) + ")";
    }
  if (std::memcmp(want.data(), got, want.size()) == 0) return ::testing::AssertionSuccess();
  auto fail = ::testing::AssertionFailure();
  int shown = 0;
  for (size_t r = 0; r < g.recvRowsOf[me] && shown < 4; ++r) {
    if (std::memcmp(want.data() + r * rb, got + r * rb, rb) == 0) continue;
    fail << "\n  rank " << me << " recv row " << r << " should hold "
         << (origin[r].empty() ? "poison (untouched)" : origin[r]) << " but holds "
         << identify(g, seed, got + r * rb);
    ++shown;
  }
  return fail;
}

fuscoConfig_t testConfig(int timeoutMs = 60000) {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = timeoutMs;
  return cfg;
}

// Creates the layout, shuffles `runs` times with fresh send data, checks each, destroys it.
void shuffleChecked(fuscoComm_t comm, const GlobalLayout& g, int me, uint64_t seed, int runs,
                    const std::string& what) {
  RankLayout l = rankLayout(g, me);
  fuscoLayout_t layout = nullptr;
  fuscoResult_t r = fuscoLayoutCreate(&layout, comm, g.rowBytes, l.sendCounts.data(),
                                      l.sendRows.data(), l.recvCounts.data(), l.recvRows.data());
  ASSERT_EQ(r, fuscoSuccess) << what << " fuscoLayoutCreate -> " << fuscoGetErrorString(r) << ": "
                             << fuscoGetLastError(comm);
  for (int run = 0; run < runs; ++run) {
    const uint64_t s = seed + 1000 * run;
    std::vector<uint8_t> send = sendData(g, s, me);
    std::vector<uint8_t> recv(g.recvRowsOf[me] * g.rowBytes);
    fusco::test::poison(recv.data(), recv.size());
    r = fuscoShuffle(send.data(), recv.data(), layout, nullptr);
    EXPECT_EQ(r, fuscoSuccess) << what << " run " << run << " fuscoShuffle -> "
                               << fuscoGetErrorString(r) << ": " << fuscoGetLastError(comm);
    if (r != fuscoSuccess) break;
    EXPECT_TRUE(recvMatches(g, s, me, recv.data())) << what << " run " << run;
  }
  FUSCO_EXPECT_OK(comm, fuscoLayoutDestroy(layout));
}

std::string ranksName(const ::testing::TestParamInfo<int>& i) {
  return std::to_string(i.param) + "ranks";
}

// ---------------------------------------------------------------- data

class LayoutShuffle : public ::testing::TestWithParam<int> {};

TEST_P(LayoutShuffle, RandomLayoutIsBitExactOverThreeRunsWithNewData) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(GetParam(), [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    GlobalLayout g = makeLayout(seed, ctx.nranks, 52, 300, 15);
    shuffleChecked(comm, g, ctx.rank, seed, 3, "52-byte rows");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

INSTANTIATE_TEST_SUITE_P(Layout, LayoutShuffle, ::testing::Values(1, 2, 3, 4, 5, 6), ranksName);

TEST(Layout, OddRowBytesAndZeroRowsToSomePeersAreBitExact) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(4, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    for (size_t rb : {size_t{1}, size_t{33}, size_t{7168 * 2 + 4}}) {
      GlobalLayout g = makeLayout(seed + rb, 4, rb, rb > 1000 ? 40 : 200, 40);
      shuffleChecked(comm, g, ctx.rank, seed + rb, 2, std::to_string(rb) + "-byte rows");
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(Layout, NothingToSendOrReceiveAnywhereSucceeds) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    std::vector<size_t> zeros(3, 0);
    fuscoLayout_t layout = nullptr;
    FUSCO_ASSERT_OK(
        comm, fuscoLayoutCreate(&layout, comm, 16, zeros.data(), nullptr, zeros.data(), nullptr));
    FUSCO_EXPECT_OK(comm, fuscoShuffle(nullptr, nullptr, layout, nullptr));
    FUSCO_EXPECT_OK(comm, fuscoLayoutDestroy(layout));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(Layout, TwoLayoutsAliveAtOnceStayIndependent) {
  const uint64_t seed = fusco::test::testSeed();
  runRanks(3, [seed](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    GlobalLayout a = makeLayout(seed, 3, 24, 100, 10), b = makeLayout(seed + 1, 3, 40, 100, 10);
    RankLayout la = rankLayout(a, ctx.rank), lb = rankLayout(b, ctx.rank);
    fuscoLayout_t ha = nullptr, hb = nullptr;
    FUSCO_ASSERT_OK(comm, fuscoLayoutCreate(&ha, comm, 24, la.sendCounts.data(), la.sendRows.data(),
                                            la.recvCounts.data(), la.recvRows.data()));
    FUSCO_ASSERT_OK(comm, fuscoLayoutCreate(&hb, comm, 40, lb.sendCounts.data(), lb.sendRows.data(),
                                            lb.recvCounts.data(), lb.recvRows.data()));
    for (int run = 0; run < 2; ++run) {
      for (auto [g, h] : {std::make_pair(&b, hb), std::make_pair(&a, ha)}) {
        auto send = sendData(*g, seed + run, ctx.rank);
        std::vector<uint8_t> recv(g->recvRowsOf[ctx.rank] * g->rowBytes);
        fusco::test::poison(recv.data(), recv.size());
        FUSCO_EXPECT_OK(comm, fuscoShuffle(send.data(), recv.data(), h, nullptr));
        EXPECT_TRUE(recvMatches(*g, seed + run, ctx.rank, recv.data()))
            << g->rowBytes << "-byte layout";
      }
    }
    FUSCO_EXPECT_OK(comm, fuscoLayoutDestroy(ha));
    FUSCO_EXPECT_OK(comm, fuscoLayoutDestroy(hb));
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(LayoutSlices, RowsStraddleSlicesWithSmallChunkEnv) {
  const uint64_t seed = fusco::test::testSeed();
  MpOptions opt;
  opt.env = {{"FUSCO_CHUNK_BYTES", "4096"}};
  runRanks(
      3,
      [seed](const RankCtx& ctx) {
        fuscoConfig_t cfg = testConfig();
        fuscoComm_t comm = initComm(ctx, &cfg);
        for (size_t rb : {size_t{1001}, size_t{5000}, size_t{7}}) {
          GlobalLayout g = makeLayout(seed + rb, 3, rb, 120, 10);
          shuffleChecked(comm, g, ctx.rank, seed + rb, 3,
                         std::to_string(rb) + "-byte rows, 4 KiB chunks");
        }
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      opt);
}

// ---------------------------------------------------------------- bad input

bool isPeerError(fuscoResult_t r) { return r == fuscoInvalidUsage || r == fuscoRemoteError; }

struct Timed {
  fuscoResult_t r;
  double sec;
  fuscoLayout_t layout;
};

// fuscoLayoutCreate with l; checks the handle is not written on failure.
Timed createTimed(fuscoComm_t comm, size_t rowBytes, const RankLayout& l) {
  fuscoLayout_t layout = reinterpret_cast<fuscoLayout_t>(0x1);
  const double t0 = nowSec();
  fuscoResult_t r = fuscoLayoutCreate(&layout, comm, rowBytes, l.sendCounts.data(),
                                      l.sendRows.data(), l.recvCounts.data(), l.recvRows.data());
  Timed t{r, nowSec() - t0, layout};
  if (r != fuscoSuccess) {
    EXPECT_EQ(layout, reinterpret_cast<fuscoLayout_t>(0x1)) << "layout written on failure";
  }
  EXPECT_LT(t.sec, kPromptSec) << "fuscoLayoutCreate took " << t.sec << " s";
  return t;
}

void expectUsable(fuscoComm_t comm, const RankCtx& ctx, const std::string& after) {
  SCOPED_TRACE("comm usable after " + after);
  GlobalLayout g = makeLayout(99, ctx.nranks, 20, 50, 10);
  shuffleChecked(comm, g, ctx.rank, 99, 1, "usable");
}

TEST(LayoutBadInput, MismatchedCountsBetweenAPairFailBothAndEveryRank) {
  runRanks(4, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig(20000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    GlobalLayout g = makeLayout(5, 4, 16, 40, 0);
    RankLayout l = rankLayout(g, ctx.rank);
    if (ctx.rank == 0) {  // rank 0 sends one row more to rank 1 than rank 1 expects
      size_t at = l.sendCounts[0] + l.sendCounts[1];
      l.sendRows.insert(l.sendRows.begin() + at, 0);
      l.sendCounts[1] += 1;
    }
    Timed t = createTimed(comm, 16, l);
    const std::string msg = fuscoGetLastError(comm);
    if (ctx.rank <= 1) {
      EXPECT_EQ(t.r, fuscoInvalidUsage) << fuscoGetErrorString(t.r) << ": " << msg;
    } else {
      EXPECT_TRUE(isPeerError(t.r)) << fuscoGetErrorString(t.r) << ": " << msg;
    }
    EXPECT_FALSE(msg.empty());
    expectUsable(comm, ctx, "mismatched counts");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// Rank badRank's arguments are spoiled by `spoil`: it gets fuscoInvalidArgument, the others an
// error.
void expectOneRankInvalid(int nranks, int badRank, void (*spoil)(RankLayout*), const char* what) {
  runRanks(nranks, [=](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig(20000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    GlobalLayout g = makeLayout(6, nranks, 12, 30, 0);
    RankLayout l = rankLayout(g, ctx.rank);
    if (ctx.rank == badRank) spoil(&l);
    Timed t = createTimed(comm, 12, l);
    const std::string msg = fuscoGetLastError(comm);
    if (ctx.rank == badRank) {
      EXPECT_EQ(t.r, fuscoInvalidArgument)
          << what << ": " << fuscoGetErrorString(t.r) << ": " << msg;
      EXPECT_FALSE(msg.empty()) << what;
    } else {
      EXPECT_TRUE(isPeerError(t.r))
          << what << ": peer got " << fuscoGetErrorString(t.r) << ": " << msg;
      EXPECT_NE(msg.find(std::to_string(badRank)), std::string::npos)
          << what << ": '" << msg << "' names no rank";
    }
    if (t.r == fuscoSuccess) fuscoLayoutDestroy(t.layout);
    expectUsable(comm, ctx, what);
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(LayoutBadInput, ReceiveRowListedTwiceIsInvalidArgumentOnThatRank) {
  expectOneRankInvalid(
      3, 1, [](RankLayout* l) { l->recvRows.back() = l->recvRows.front(); },
      "receive row listed twice");
}

TEST(LayoutBadInput, ReceiveRowListedTwiceForDifferentPeersIsInvalid) {
  expectOneRankInvalid(
      4, 3,
      [](RankLayout* l) {
        // first row from peer 0 and the last row from peer 3 name the same receive row
        l->recvRows[l->recvRows.size() - 1] = l->recvRows[0];
      },
      "receive row listed for two peers");
}

TEST(LayoutBadInput, NegativeSendRowIsInvalidArgument) {
  expectOneRankInvalid(
      3, 2, [](RankLayout* l) { l->sendRows[l->sendRows.size() / 2] = -1; }, "negative send row");
}

TEST(LayoutBadInput, NegativeReceiveRowIsInvalidArgument) {
  expectOneRankInvalid(
      3, 0, [](RankLayout* l) { l->recvRows[0] = -5; }, "negative receive row");
}

TEST(LayoutBadInput, NullArgumentsAreInvalidArgument) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = testConfig(20000);
    fuscoComm_t comm = initComm(ctx, &cfg);
    GlobalLayout g = makeLayout(7, 2, 8, 20, 0);
    RankLayout l = rankLayout(g, ctx.rank);
    fuscoResult_t r = fuscoLayoutCreate(nullptr, comm, 8, l.sendCounts.data(), l.sendRows.data(),
                                        l.recvCounts.data(), l.recvRows.data());
    EXPECT_EQ(r, fuscoInvalidArgument) << "NULL layout pointer: " << fuscoGetLastError(comm);
    Timed t = createTimed(comm, 0, l);
    EXPECT_EQ(t.r, fuscoInvalidArgument) << "rowBytes 0: " << fuscoGetLastError(comm);
    size_t total = 0;
    for (size_t c : l.sendCounts) total += c;
    ASSERT_GT(total, 0u) << "the seed gave rank " << ctx.rank << " nothing to send";
    fuscoLayout_t layout = reinterpret_cast<fuscoLayout_t>(0x1);
    r = fuscoLayoutCreate(&layout, comm, 8, l.sendCounts.data(), nullptr, l.recvCounts.data(),
                          l.recvRows.data());
    EXPECT_EQ(r, fuscoInvalidArgument) << "NULL sendRows with rows: " << fuscoGetLastError(comm);
    if (r == fuscoSuccess) fuscoLayoutDestroy(layout);
    std::vector<uint8_t> buf(64);
    EXPECT_EQ(fuscoShuffle(buf.data(), buf.data(), nullptr, nullptr), fuscoInvalidArgument);
    expectUsable(comm, ctx, "NULL arguments");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace
