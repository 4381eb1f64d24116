// The network bridge's bookkeeping (exec/bridge_ledger.h): posts passed on once, each
// operation's rows in slices of a slot before its done post, counters that wrap, a channel
// without credits, landings filled in order and checked, and a sender and a receiver joined by a
// channel of few slots moving seeded random operations byte for byte.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "exec/bridge_ledger.h"

namespace {

using fusco::BridgeLedger;
using Kind = BridgeLedger::Kind;

std::vector<char> seeded(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<char> v(n);
  for (char& c : v) c = static_cast<char>(rng());
  return v;
}

TEST(BridgeLedger, ReadyPostsPassOnOnceWithTheNewestValue) {
  BridgeLedger l;
  EXPECT_EQ(l.next(0, 0, 64).kind, Kind::None) << "nothing posted, nothing due";
  EXPECT_FALSE(l.owes(0, 0));
  BridgeLedger::Step s = l.next(3, 0, 64);
  ASSERT_EQ(s.kind, Kind::Ready);
  EXPECT_EQ(s.value, 3u) << "three posts since the last look go out as one";
  EXPECT_TRUE(l.owes(3, 0));
  l.sent(s);
  EXPECT_EQ(l.next(3, 0, 64).kind, Kind::None);
  EXPECT_FALSE(l.owes(3, 0));
}

TEST(BridgeLedger, CountersThatWrapStayInOrder) {
  BridgeLedger l;
  for (uint32_t v : {0x7fffffffu, 0xfffffffeu, 0x00000001u, 0x00000005u}) {
    BridgeLedger::Step s = l.next(v, 0, 64);
    ASSERT_EQ(s.kind, Kind::Ready) << v;
    EXPECT_EQ(s.value, v);
    l.sent(s);
    EXPECT_EQ(l.next(v, 0, 64).kind, Kind::None) << v;
    EXPECT_EQ(l.next(v - 1, 0, 64).kind, Kind::None) << "an older value is not news: " << v;
  }
}

TEST(BridgeLedger, ADonePostShipsItsRowsInSlotsThenTheDone) {
  BridgeLedger l;
  const std::vector<char> rows = seeded(1000, 1);
  l.expect({rows.data(), rows.size()}, {nullptr, 0});
  EXPECT_TRUE(l.owes(0, 0)) << "a registered operation is owed until its done went out";
  EXPECT_EQ(l.next(0, 0, 300).kind, Kind::None) << "the stream has not posted done yet";
  std::string wire;
  for (size_t want : {300u, 300u, 300u, 100u}) {
    BridgeLedger::Step s = l.next(0, 1, 300);
    ASSERT_EQ(s.kind, Kind::Slice);
    ASSERT_EQ(s.bytes, want);
    wire.append(s.data, s.bytes);
    l.sent(s);
  }
  BridgeLedger::Step d = l.next(0, 1, 300);
  ASSERT_EQ(d.kind, Kind::Done);
  EXPECT_EQ(d.value, 1u);
  l.sent(d);
  EXPECT_EQ(wire, std::string(rows.data(), rows.size()));
  EXPECT_FALSE(l.owes(0, 1));
  EXPECT_EQ(l.shipmentsPending(), 0u);
}

TEST(BridgeLedger, ADonePostWithoutARegisteredOperationWaits) {
  BridgeLedger l;
  EXPECT_EQ(l.next(0, 1, 64).kind, Kind::None) << "no operation resolved: nothing to ship yet";
  l.expect({nullptr, 0}, {nullptr, 0});
  BridgeLedger::Step d = l.next(0, 1, 64);
  ASSERT_EQ(d.kind, Kind::Done) << "an operation without rows ships its done alone";
  l.sent(d);
  EXPECT_EQ(l.next(0, 1, 64).kind, Kind::None);
}

// An operation whose stream never posts on the bridge's words (a refused captured call) ships its
// empty done once it is first in line; the next operation's post, which counted it, then ships
// that operation's own done with the value the receiver's stream waits for.
TEST(BridgeLedger, AnOperationThatNeverPostsKeepsTheCountersPaired) {
  BridgeLedger l;
  const std::vector<char> rows = seeded(3, 4);
  l.expect({nullptr, 0}, {nullptr, 0}, false);
  l.expect({rows.data(), rows.size()}, {nullptr, 0});
  BridgeLedger::Step d = l.next(0, 0, 64);
  ASSERT_EQ(d.kind, Kind::Done) << "nothing is posted for it: its done goes at once";
  EXPECT_EQ(d.value, 1u);
  l.sent(d);
  EXPECT_TRUE(l.owes(0, 0)) << "the second operation is still owed";
  EXPECT_EQ(l.next(0, 1, 64).kind, Kind::None) << "post 1 was the unposted operation's number";
  BridgeLedger::Step s = l.next(0, 2, 64);
  ASSERT_EQ(s.kind, Kind::Slice);
  l.sent(s);
  d = l.next(0, 2, 64);
  ASSERT_EQ(d.kind, Kind::Done);
  EXPECT_EQ(d.value, 2u);
  l.sent(d);
  EXPECT_FALSE(l.owes(0, 2));
}

TEST(BridgeLedger, ReadyGoesBeforeRowsAndOperationsKeepTheirOrder) {
  BridgeLedger l;
  const std::vector<char> a = seeded(10, 2), b = seeded(5, 3);
  l.expect({a.data(), a.size()}, {nullptr, 0});
  l.expect({b.data(), b.size()}, {nullptr, 0});
  std::vector<std::pair<Kind, std::string>> out;
  for (BridgeLedger::Step s = l.next(2, 2, 8); s.kind != Kind::None; s = l.next(2, 2, 8)) {
    out.emplace_back(
        s.kind, s.kind == Kind::Slice ? std::string(s.data, s.bytes) : std::to_string(s.value));
    l.sent(s);
  }
  const std::vector<std::pair<Kind, std::string>> want = {
      {Kind::Ready, "2"},
      {Kind::Slice, std::string(a.data(), 8)},
      {Kind::Slice, std::string(a.data() + 8, 2)},
      {Kind::Done, "1"},
      {Kind::Slice, std::string(b.data(), 5)},
      {Kind::Done, "2"}};
  EXPECT_EQ(out, want);
}

TEST(BridgeLedger, LandingsFillInOrderAndCompleteOnlyWithTheirDone) {
  BridgeLedger l;
  std::vector<char> first(12, 0), second(4, 0);
  l.expect({nullptr, 0}, {first.data(), first.size()});
  l.expect({nullptr, 0}, {second.data(), second.size()});
  std::string why;
  ASSERT_TRUE(l.onSlice("abcdefgh", 8, &why)) << why;
  EXPECT_FALSE(l.onDone(1, &why)) << "4 bytes are still missing";
  EXPECT_NE(why.find("8 of 12"), std::string::npos) << why;
  ASSERT_TRUE(l.onSlice("ijkl", 4, &why)) << why;
  ASSERT_TRUE(l.onDone(1, &why)) << why;
  EXPECT_EQ(std::string(first.data(), 12), "abcdefghijkl");
  EXPECT_FALSE(l.onSlice("12345", 5, &why)) << "5 bytes into a landing of 4";
  EXPECT_NE(why.find("5 bytes where 4 of 4"), std::string::npos) << why;
  ASSERT_TRUE(l.onSlice("wxyz", 4, &why)) << why;
  ASSERT_TRUE(l.onDone(2, &why)) << why;
  EXPECT_EQ(std::string(second.data(), 4), "wxyz");
  EXPECT_FALSE(l.onSlice("x", 1, &why)) << "no operation is resolved";
  EXPECT_FALSE(l.onDone(3, &why));
  EXPECT_NE(why.find("not resolved"), std::string::npos) << why;
}

// A peer's refused operation needs no stream work, so its empty done may arrive before this rank
// registers the operation: it is kept and completes the landing once expect registers it; a done
// kept ahead of an operation that expects rows is an error naming them.
TEST(BridgeLedger, ADoneAheadOfItsOperationIsKeptUntilTheOperationIsRegistered) {
  BridgeLedger l;
  std::string why;
  bool early = false;
  ASSERT_TRUE(l.onDone(1, &why, &early)) << why;
  EXPECT_TRUE(early);
  ASSERT_TRUE(l.onDone(2, &why, &early)) << why;
  uint32_t value = 0;
  EXPECT_EQ(l.applyEarlyDone(&value, &why), 0) << "nothing registered yet";
  l.expect({nullptr, 0}, {nullptr, 0}, false);
  ASSERT_EQ(l.applyEarlyDone(&value, &why), 1) << why;
  EXPECT_EQ(value, 1u);
  EXPECT_EQ(l.landingsPending(), 0u);
  std::vector<char> rows(4, 0);
  l.expect({nullptr, 0}, {rows.data(), rows.size()});
  EXPECT_EQ(l.applyEarlyDone(&value, &why), -1) << "done 2 came before its 4 bytes";
  EXPECT_NE(why.find("before the 4 bytes"), std::string::npos) << why;
  BridgeLedger strict;  // without `early`, a done before its operation is an error at once
  EXPECT_FALSE(strict.onDone(1, &why));
  EXPECT_NE(why.find("not resolved"), std::string::npos) << why;
}

// A channel of `slots` slots of `slotBytes` between a sender's and a receiver's ledger: seeded
// operations of random sizes (zeros included) move byte for byte; while the receiver stops
// reading, nothing more goes out and the sender still owes the rest.
TEST(BridgeLedger, APairJoinedByAFewSlotsMovesEveryOperationExactly) {
  std::mt19937 rng(7);
  const size_t slotBytes = 37;
  const size_t slots = 3;
  BridgeLedger tx, rx;
  std::vector<std::vector<char>> sent, landed;
  for (int op = 0; op < 40; ++op) {
    const size_t n = op % 7 == 3 ? 0 : rng() % 500;
    sent.push_back(seeded(n, 100 + op));
    landed.emplace_back(n, '\x5a');
    tx.expect({sent.back().data(), n}, {nullptr, 0});
    rx.expect({nullptr, 0}, {landed.back().data(), n});
  }
  std::deque<BridgeLedger::Step> wire;
  uint32_t done = 0, ready = 0, rxDone = 0;
  bool stopped = false;
  for (int round = 0; round < 100000 && rxDone < 40; ++round) {
    if (done < 40 && rng() % 3 == 0) ++done;  // the stream posts when its copy finished
    if (rng() % 5 == 0) ++ready;
    for (BridgeLedger::Step s = tx.next(ready, done, slotBytes);
         s.kind != Kind::None && wire.size() < slots; s = tx.next(ready, done, slotBytes)) {
      wire.push_back(s);
      tx.sent(s);
    }
    if (round == 500) stopped = true;  // the receiver stops reading for a while
    if (stopped) {
      EXPECT_LE(wire.size(), slots) << "nothing beyond the channel's credits went out";
      if (round == 1500) stopped = false;
      if (round == 1499) {
        EXPECT_TRUE(tx.owes(ready, done)) << "the sender still owes the rest";
      }
      continue;
    }
    while (!wire.empty()) {
      const BridgeLedger::Step s = wire.front();
      wire.pop_front();
      std::string why;
      if (s.kind == Kind::Slice) {
        ASSERT_TRUE(rx.onSlice(s.data, s.bytes, &why)) << why;
      }
      if (s.kind == Kind::Done) {
        ASSERT_TRUE(rx.onDone(s.value, &why)) << why;
        EXPECT_EQ(s.value, ++rxDone);
      }
    }
  }
  ASSERT_EQ(rxDone, 40u);
  EXPECT_EQ(landed, sent);
  EXPECT_EQ(rx.landingsPending(), 0u);
  EXPECT_FALSE(tx.owes(ready, done));
}

}  // namespace
