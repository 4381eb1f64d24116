// The rule that keeps NODE dedup's two hops free of deadlock (src/moe/moe_op.h): a message is
// never queued on its pair behind one of a stage above its kind's bound, and a message has a
// gate exactly when its kind waits for something.
#include <gtest/gtest.h>

#include <string>

#include "core/result.h"
#include "moe/moe_op.h"

namespace fusco {
namespace {

size_t allLanded(const void*) { return ~size_t{0}; }

RowStream stream(MsgKind k) {
  static char buf[64];
  RowStream s = RowStream::flat(buf, sizeof(buf));
  if (kindRule(k).stage > 0) s.ready = &allLanded;
  return s;
}

MoeWork work(std::initializer_list<MsgKind> kinds) {
  MoeWork w(2);
  for (MsgKind k : kinds) w.send(1, k, stream(k));
  return w;
}

TEST(MoeGateOrder, DispatchOrderOfEachPairIsAccepted) {
  // A rank of this node: RANK rows, handoffs to it as a relay, then forwarded rows.
  EXPECT_EQ(checkGateOrder(work({MsgKind::Plain, MsgKind::Plain, MsgKind::FanOut}), "t"),
            fuscoSuccess);
  // A forwarder on another node: own and relayed segments interleaved in segment order.
  EXPECT_EQ(checkGateOrder(work({MsgKind::NetRelayed, MsgKind::NetOwn, MsgKind::NetRelayed}), "t"),
            fuscoSuccess);
}

TEST(MoeGateOrder, CombineOrderOfEachPairIsAccepted) {
  EXPECT_EQ(checkGateOrder(work({MsgKind::Plain, MsgKind::Plain, MsgKind::SumPass}), "t"),
            fuscoSuccess);
  EXPECT_EQ(checkGateOrder(work({MsgKind::NodeSum, MsgKind::NodeSum}), "t"), fuscoSuccess);
}

TEST(MoeGateOrder, RowsQueuedBehindForwardedRowsAreRefusedAsADeadlock) {
  clearThreadLastError();
  EXPECT_EQ(checkGateOrder(work({MsgKind::FanOut, MsgKind::Plain}), "fuscoMoeDispatch"),
            fuscoInternalError);
  const std::string msg = threadLastError();
  EXPECT_NE(msg.find("fuscoMoeDispatch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("message 1 to rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
}

TEST(MoeGateOrder, PartialsQueuedBehindRelayedSumsAreRefused) {
  EXPECT_EQ(checkGateOrder(work({MsgKind::SumPass, MsgKind::Plain}), "t"), fuscoInternalError);
  // Relayed network rows wait for handoffs: a handoff queued behind them could wait on itself.
  EXPECT_EQ(checkGateOrder(work({MsgKind::NetRelayed, MsgKind::Plain}), "t"), fuscoInternalError);
}

TEST(MoeGateOrder, GateMustMatchTheKind) {
  MoeWork ungated(2);
  RowStream s = stream(MsgKind::Plain);
  ungated.send(1, MsgKind::FanOut, s);  // a forwarded row without its gate
  EXPECT_EQ(checkGateOrder(ungated, "t"), fuscoInternalError);
  MoeWork gated(2);
  gated.send(1, MsgKind::Plain, stream(MsgKind::FanOut));  // plain rows that wait
  EXPECT_EQ(checkGateOrder(gated, "t"), fuscoInternalError);
}

TEST(MoeGateOrder, EveryWaitingKindWaitsOnlyForLowerBounds) {
  for (int k = 0; k < static_cast<int>(MsgKind::Count); ++k) {
    const MsgKindRule& r = kindRule(static_cast<MsgKind>(k));
    EXPECT_GE(r.bound, r.stage) << kindName(static_cast<MsgKind>(k));
    for (int j = 0; j < static_cast<int>(MsgKind::Count); ++j)
      if (r.awaits >> j & 1) {
        EXPECT_LT(kindRule(static_cast<MsgKind>(j)).bound, r.stage)
            << kindName(static_cast<MsgKind>(k)) << " waits for "
            << kindName(static_cast<MsgKind>(j));
      }
  }
}

TEST(MoeGateOrder, SendDirectKeepsRemoteDestinationsParallelToSends) {
  MoeWork w(2);
  w.send(1, MsgKind::Plain, stream(MsgKind::Plain));
  w.send(1, MsgKind::Plain, stream(MsgKind::Plain));
  RowStream dst = RowStream::flat(nullptr, 8);
  w.sendDirect(1, MsgKind::FanOut, stream(MsgKind::FanOut), dst);
  ASSERT_EQ(w.peers[1].remoteDst.size(), 3u);
  EXPECT_EQ(w.peers[1].remoteDst[0].bytes(), 0u);
  EXPECT_EQ(w.peers[1].remoteDst[1].bytes(), 0u);
  EXPECT_EQ(w.peers[1].remoteDst[2].bytes(), 8u);
}

}  // namespace
}  // namespace fusco
