// A call returns only once what this rank sent has left it: a rank that stops calling fusco
// right after a call (it computes, sleeps, or waits on something else) must not hold back the
// bytes its peers are still receiving in the same call. On one node this is shared memory (every
// post completes at once); on virtual nodes ([net]) it is UCX, where a large message completes
// only after the receiver fetched it, which needs the sender to keep stepping UCX.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::nowSec;
using fusco::test::RankCtx;
using fusco::test::runRanks;

constexpr int kTimeoutMs = 3000;

uint32_t valueAt(int src, int dst, size_t i) {
  return static_cast<uint32_t>(src) * 0x01000193u ^ static_cast<uint32_t>(dst) * 0x9e3779b1u ^
         static_cast<uint32_t>(i) * 2654435761u;
}

// Ranks of the first half leave the call and sleep past the others' timeout without calling
// fusco; the second half must still finish the same call promptly, with every byte right.
TEST(Completion, SenderThatStopsCallingAfterACallDoesNotStallItsReceivers) {
  runRanks(4, [](const RankCtx& ctx) {
    fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
    cfg.timeoutMs = kTimeoutMs;
    fuscoComm_t comm = initComm(ctx, &cfg);
    const int n = ctx.nranks;
    std::vector<uint32_t> warm(n), warmOut(n);
    FUSCO_ASSERT_OK(comm,
                    fuscoAllToAll(warm.data(), warmOut.data(), 1, fuscoUint32, comm, nullptr));
    const size_t count = size_t{4} << 20;  // 16 MiB per peer: many slices, rendezvous-sized ones
    std::vector<uint32_t> send(n * count), recv(n * count, 0xdeadbeefu);
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < count; ++i) send[p * count + i] = valueAt(ctx.rank, p, i);
    const bool sleeper = ctx.rank < n / 2;
    const double t0 = nowSec();
    FUSCO_EXPECT_OK(comm,
                    fuscoAllToAll(send.data(), recv.data(), count, fuscoUint32, comm, nullptr));
    const double took = nowSec() - t0;
    if (!sleeper) {
      EXPECT_LT(took, kTimeoutMs / 1000.0)
          << "the call waited on a sender that had already returned";
    }
    // The first half is blocked elsewhere (not stepping any transport) for twice the timeout
    // right after its call; the second half waits as long before the next call, so that call
    // does not time out on them.
    const int sleepMs = sleeper ? 2 * kTimeoutMs : 2 * kTimeoutMs - static_cast<int>(took * 1000);
    if (sleepMs > 0) usleep(static_cast<useconds_t>(sleepMs) * 1000);
    size_t wrong = 0;
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < count; ++i) wrong += recv[p * count + i] != valueAt(p, ctx.rank, i);
    EXPECT_EQ(wrong, 0u);
    // The comm is still whole: one more call on every rank.
    FUSCO_EXPECT_OK(comm,
                    fuscoAllToAll(warm.data(), warmOut.data(), 1, fuscoUint32, comm, nullptr));
    EXPECT_EQ(fuscoCommDestroy(comm), fuscoSuccess);
  });
}

}  // namespace
