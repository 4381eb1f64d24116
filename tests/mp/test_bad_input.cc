// Bad input (docs/TESTING.md): every case gets a clear fuscoResult_t and message on every rank,
// promptly (well under the timeout), no rank reports success for a call that failed anywhere,
// and the comm stays usable: a correct all-to-all afterwards is bit-exact.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "harness/data_gen.h"
#include "harness/mp_harness.h"
#include "harness/raw_enum.h"

namespace {

using fusco::test::initComm;
using fusco::test::makeA2avLayout;
using fusco::test::namesRank;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;

constexpr double kPromptSec = 5.0;  // with timeoutMs 20000: an error must not wait for the timeout

fuscoConfig_t badInputConfig() {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = 20000;
  return cfg;
}

bool isPeerError(fuscoResult_t r) { return r == fuscoInvalidUsage || r == fuscoRemoteError; }

// "rank 2", "Rank 2", "peer 2", "rank=2", "rank #2".
struct Timed {
  fuscoResult_t r;
  double sec;
};
template <class F>
Timed timed(F&& f) {
  double t0 = nowSec();
  fuscoResult_t r = f();
  return Timed{r, nowSec() - t0};
}

// One rank passed invalid arguments: it gets fuscoInvalidArgument, every other rank an error that
// names it; everyone promptly.
void expectOneRankBad(fuscoComm_t comm, int myRank, int badRank, const Timed& t,
                      const std::string& what) {
  const std::string msg = fuscoGetLastError(comm);
  EXPECT_LT(t.sec, kPromptSec) << what << ": the error took " << t.sec << " s";
  if (myRank == badRank) {
    EXPECT_EQ(t.r, fuscoInvalidArgument) << what << ": " << fuscoGetErrorString(t.r) << ": " << msg;
    EXPECT_FALSE(msg.empty()) << what << ": no message";
  } else {
    EXPECT_TRUE(isPeerError(t.r)) << what << ": a peer of the bad rank got "
                                  << fuscoGetErrorString(t.r) << " (" << msg
                                  << "); expected fuscoInvalidUsage or fuscoRemoteError";
    EXPECT_TRUE(namesRank(msg, badRank))
        << what << ": message '" << msg << "' should name rank " << badRank;
  }
}

// A correct uneven all-to-allv with gaps is bit-exact on this comm.
void expectUsable(fuscoComm_t comm, const RankCtx& ctx, uint64_t seed, const std::string& after) {
  auto counts = fusco::test::randomCountMatrix(seed, ctx.nranks, 2000, 20);
  auto l = makeA2avLayout(counts, ctx.nranks, ctx.rank, 4, seed, true);
  EXPECT_TRUE(fusco::test::allToAllvRoundTrip(comm, l, fuscoInt32, seed))
      << "the comm is not usable after " << after;
}

// ---------------------------------------------------------------- collectives on a valid comm

TEST(BadInput, NullBufferOnOneRankFailsEveryRankPromptly) {
  runRanks(4, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = badInputConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const size_t count = 64;
    std::vector<uint8_t> send(4 * count * 4, 7), recv(4 * count * 4);

    Timed t = timed([&] {
      return fuscoAllToAll(ctx.rank == 1 ? nullptr : send.data(), recv.data(), count, fuscoInt32,
                           comm, nullptr);
    });
    expectOneRankBad(comm, ctx.rank, 1, t, "NULL sendbuff on rank 1");
    expectUsable(comm, ctx, 11, "NULL sendbuff");

    t = timed([&] {
      return fuscoAllToAll(send.data(), ctx.rank == 2 ? nullptr : recv.data(), count, fuscoInt32,
                           comm, nullptr);
    });
    expectOneRankBad(comm, ctx.rank, 2, t, "NULL recvbuff on rank 2");
    expectUsable(comm, ctx, 12, "NULL recvbuff");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(BadInput, NullBuffersOnEveryRankAreInvalidArgumentEverywhere) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = badInputConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    Timed t =
        timed([&] { return fuscoAllToAll(nullptr, nullptr, 16, fuscoFloat32, comm, nullptr); });
    EXPECT_EQ(t.r, fuscoInvalidArgument) << fuscoGetLastError(comm);
    EXPECT_LT(t.sec, kPromptSec);
    EXPECT_STRNE(fuscoGetLastError(comm), "");
    expectUsable(comm, ctx, 13, "NULL buffers everywhere");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(BadInput, NullCountArrayInAllToAllvOnOneRankFailsEveryRank) {
  runRanks(4, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = badInputConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    auto counts = fusco::test::uniformCountMatrix(4, 10);
    auto l = makeA2avLayout(counts, 4, ctx.rank, 4, 1, false);
    std::vector<uint8_t> send(l.sendElems * 4, 1), recv(l.recvElems * 4);
    Timed t = timed([&] {
      return fuscoAllToAllv(send.data(), ctx.rank == 3 ? nullptr : l.sendcounts.data(),
                            l.sdispls.data(), recv.data(), l.recvcounts.data(), l.rdispls.data(),
                            fuscoInt32, comm, nullptr);
    });
    expectOneRankBad(comm, ctx.rank, 3, t, "NULL sendcounts on rank 3");
    expectUsable(comm, ctx, 14, "NULL sendcounts");
    t = timed([&] {
      return fuscoAllToAllv(send.data(), l.sendcounts.data(), l.sdispls.data(), recv.data(),
                            l.recvcounts.data(), ctx.rank == 0 ? nullptr : l.rdispls.data(),
                            fuscoInt32, comm, nullptr);
    });
    expectOneRankBad(comm, ctx.rank, 0, t, "NULL rdispls on rank 0");
    expectUsable(comm, ctx, 15, "NULL rdispls");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(BadInput, InvalidDatatypeOnEveryRankIsInvalidArgument) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = badInputConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    std::vector<uint8_t> send(3 * 64, 1), recv(3 * 64);
    for (int dt : {static_cast<int>(fuscoNumTypes), -1, 1000}) {
      Timed t =
          timed([&] { return fuscoTestAllToAllRawType(send.data(), recv.data(), 8, dt, comm); });
      EXPECT_EQ(t.r, fuscoInvalidArgument) << "datatype " << dt << ": " << fuscoGetLastError(comm);
      EXPECT_LT(t.sec, kPromptSec);
    }
    expectUsable(comm, ctx, 16, "invalid datatype");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(BadInput, InvalidDatatypeOnOneRankFailsEveryRank) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = badInputConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    std::vector<uint8_t> send(3 * 64, 1), recv(3 * 64);
    Timed t = timed([&] {
      return fuscoAllToAll(send.data(), recv.data(), 8, ctx.rank == 0 ? fuscoNumTypes : fuscoInt32,
                           comm, nullptr);
    });
    expectOneRankBad(comm, ctx.rank, 0, t, "invalid datatype on rank 0");
    expectUsable(comm, ctx, 17, "invalid datatype on one rank");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

TEST(BadInput, StreamOnHostCommIsInvalidArgument) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = badInputConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    std::vector<uint8_t> send(3 * 64, 1), recv(3 * 64);
    int fakeStream = 0;
    Timed t = timed(
        [&] { return fuscoAllToAll(send.data(), recv.data(), 16, fuscoUint8, comm, &fakeStream); });
    EXPECT_EQ(t.r, fuscoInvalidArgument) << fuscoGetLastError(comm);
    EXPECT_LT(t.sec, kPromptSec);
    expectUsable(comm, ctx, 18, "a stream on every rank");
    t = timed([&] {
      return fuscoAllToAll(send.data(), recv.data(), 16, fuscoUint8, comm,
                           ctx.rank == 2 ? &fakeStream : nullptr);
    });
    expectOneRankBad(comm, ctx.rank, 2, t, "stream on rank 2");
    expectUsable(comm, ctx, 19, "a stream on one rank");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// sendcounts[2] on rank 0 disagrees with recvcounts[0] on rank 2: fuscoInvalidUsage on both, an
// error on ranks 1 and 3 too (no rank reports success for a call that failed anywhere).
TEST(BadInput, MismatchedAllToAllvCountsFailEveryRank) {
  runRanks(4, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = badInputConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    for (int round = 0; round < 2; ++round) {
      auto counts = fusco::test::randomCountMatrix(20 + round, 4, 500, 0);
      auto l = makeA2avLayout(counts, 4, ctx.rank, 4, 20 + round, false);
      // Room for the extra elements so a library that ignored the mismatch would not overflow.
      std::vector<uint8_t> send((l.sendElems + 100) * 4, 3), recv((l.recvElems + 100) * 4);
      // Round 0: the sender claims more; round 1: the receiver expects more.
      if (round == 0 && ctx.rank == 0) l.sendcounts[2] += 5;
      if (round == 1 && ctx.rank == 2) l.recvcounts[0] += 7;
      Timed t = timed([&] {
        return fuscoAllToAllv(send.data(), l.sendcounts.data(), l.sdispls.data(), recv.data(),
                              l.recvcounts.data(), l.rdispls.data(), fuscoFloat32, comm, nullptr);
      });
      const std::string msg = fuscoGetLastError(comm);
      EXPECT_LT(t.sec, kPromptSec) << "round " << round;
      if (ctx.rank == 0 || ctx.rank == 2) {
        EXPECT_EQ(t.r, fuscoInvalidUsage) << "round " << round << ": " << msg;
      } else {
        EXPECT_TRUE(isPeerError(t.r))
            << "round " << round << ": a rank outside the mismatched "
            << "pair got " << fuscoGetErrorString(t.r) << " (" << msg << ")";
      }
      EXPECT_FALSE(msg.empty()) << "round " << round;
      expectUsable(comm, ctx, 30 + round, "mismatched counts");
    }
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// Both ranks of a pair send in a group and neither receives: fuscoInvalidUsage on both, whose
// message states every count, an empty side as "nothing (0 messages)", never as a blank; the
// comm stays usable (a bit-exact all-to-all afterwards).
TEST(BadInput, UnpairedSendsNameEveryCountInTheMismatchMessage) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = badInputConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    const int peer = 1 - ctx.rank;
    std::vector<int32_t> send(10, 5);
    Timed t = timed([&] {
      FUSCO_EXPECT_OK(comm, fuscoGroupStart());
      FUSCO_EXPECT_OK(comm, fuscoSend(send.data(), 10, fuscoInt32, peer, comm, nullptr));
      return fuscoGroupEnd();
    });
    const std::string msg = fuscoGetLastError(comm);
    EXPECT_LT(t.sec, kPromptSec);
    EXPECT_EQ(t.r, fuscoInvalidUsage) << msg;
    const std::string me = std::to_string(ctx.rank), other = std::to_string(peer);
    const std::string want = "this rank (" + me + ") sends 40 (1 messages) and expects nothing " +
                             "(0 messages); rank " + other + " expects nothing (0 messages) and " +
                             "sends 40 (1 messages)";
    EXPECT_NE(msg.find(want), std::string::npos) << "'" << msg << "'";
    EXPECT_FALSE(std::regex_search(msg, std::regex("(sends|expects) +\\("))) << "'" << msg << "'";
    expectUsable(comm, ctx, 41, "unpaired sends");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// Point-to-point arguments are checked locally: no peer is involved.
TEST(BadInput, SendRecvWithInvalidPeerOrNullBufferIsInvalidArgument) {
  runRanks(2, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = badInputConfig();
    fuscoComm_t comm = initComm(ctx, &cfg);
    std::vector<uint8_t> buf(64, 1);
    for (int peer : {-1, 2, 1000}) {
      EXPECT_EQ(fuscoSend(buf.data(), 4, fuscoInt32, peer, comm, nullptr), fuscoInvalidArgument)
          << "peer " << peer;
      EXPECT_EQ(fuscoRecv(buf.data(), 4, fuscoInt32, peer, comm, nullptr), fuscoInvalidArgument)
          << "peer " << peer;
    }
    EXPECT_EQ(fuscoSend(nullptr, 4, fuscoInt32, 1 - ctx.rank, comm, nullptr), fuscoInvalidArgument);
    EXPECT_EQ(fuscoRecv(nullptr, 4, fuscoInt32, 1 - ctx.rank, comm, nullptr), fuscoInvalidArgument);
    EXPECT_EQ(fuscoSend(buf.data(), 4, fuscoNumTypes, 1 - ctx.rank, comm, nullptr),
              fuscoInvalidArgument);
    EXPECT_STRNE(fuscoGetLastError(comm), "");
    expectUsable(comm, ctx, 40, "invalid point-to-point arguments");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

// ---------------------------------------------------------------- init

// Each rank runs init with the arguments args(ctx) gives; the result must match want(ctx) and
// come promptly.
void runBadInit(int n, const std::function<void(const RankCtx&, int*, int*)>& args,
                const std::function<void(const RankCtx&, fuscoResult_t)>& check) {
  runRanks(n, [&](const RankCtx& ctx) {
    fuscoConfig_t cfg = badInputConfig();
    int nranks = ctx.nranks, rank = ctx.rank;
    args(ctx, &nranks, &rank);
    fuscoComm_t comm = nullptr;
    Timed t = timed([&] { return fuscoCommInitRankConfig(&comm, nranks, ctx.id, rank, &cfg); });
    EXPECT_LT(t.sec, kPromptSec) << "init (nranks " << nranks << ", rank " << rank << ") took "
                                 << t.sec << " s -> " << fuscoGetErrorString(t.r);
    EXPECT_NE(t.r, fuscoSuccess) << "init (nranks " << nranks << ", rank " << rank
                                 << ") succeeded in a broken job";
    EXPECT_STRNE(fuscoGetLastError(nullptr), "");
    if (t.r == fuscoSuccess) {
      fuscoCommDestroy(comm);
    } else {
      EXPECT_EQ(comm, nullptr) << "an out-parameter was written on failure";
    }
    check(ctx, t.r);
  });
}

TEST(BadInit, ZeroOrNegativeNranksIsInvalidArgument) {
  for (int bad : {0, -3}) {
    runBadInit(
        2, [bad](const RankCtx&, int* nranks, int*) { *nranks = bad; },
        [bad](const RankCtx&, fuscoResult_t r) {
          EXPECT_EQ(r, fuscoInvalidArgument) << "nranks " << bad;
        });
  }
}

TEST(BadInit, RankOutOfRangeFailsEveryRankPromptly) {
  for (int bad : {3, -1}) {
    runBadInit(
        3,
        [bad](const RankCtx& ctx, int*, int* rank) {
          if (ctx.rank == 2) *rank = bad;
        },
        [bad](const RankCtx& ctx, fuscoResult_t r) {
          if (ctx.rank == 2) {
            EXPECT_EQ(r, fuscoInvalidArgument)
                << "rank " << bad << " of 3: " << fuscoGetLastError(nullptr);
          }
        });
  }
}

TEST(BadInit, RanksDisagreeingOnNranksGetInvalidUsage) {
  runBadInit(
      3,
      [](const RankCtx& ctx, int* nranks, int*) {
        if (ctx.rank == 1) *nranks = 4;
      },
      [](const RankCtx& ctx, fuscoResult_t r) {
        EXPECT_EQ(r, fuscoInvalidUsage) << fuscoGetLastError(nullptr);
      });
}

TEST(BadInit, DuplicateRankGetsInvalidUsage) {
  runBadInit(
      3,
      [](const RankCtx& ctx, int*, int* rank) {
        if (ctx.rank == 2) *rank = 1;
      },
      [](const RankCtx& ctx, fuscoResult_t r) {
        EXPECT_EQ(r, fuscoInvalidUsage) << fuscoGetLastError(nullptr);
      });
}

TEST(BadInit, IdNotMadeByGetUniqueIdIsInvalidArgument) {
  runRanks(3, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = badInputConfig();
    fuscoUniqueId zero;
    memset(&zero, 0, sizeof(zero));
    fuscoComm_t comm = nullptr;
    Timed t =
        timed([&] { return fuscoCommInitRankConfig(&comm, ctx.nranks, zero, ctx.rank, &cfg); });
    EXPECT_EQ(t.r, fuscoInvalidArgument) << fuscoGetLastError(nullptr);
    EXPECT_EQ(comm, nullptr);
    EXPECT_LT(t.sec, kPromptSec);
    EXPECT_STRNE(fuscoGetLastError(nullptr), "");
    // Random bytes are not an id either.
    fuscoUniqueId junk;
    fusco::test::fillPayload(&junk, 99, 0, 0, 0, sizeof(junk));
    EXPECT_EQ(fuscoCommInitRankConfig(&comm, ctx.nranks, junk, ctx.rank, &cfg),
              fuscoInvalidArgument);
    // The real id still works afterwards.
    comm = initComm(ctx, &cfg);
    expectUsable(comm, ctx, 50, "bad ids");
    FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
  });
}

}  // namespace
