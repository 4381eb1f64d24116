// Combine's reduce role (src/device/chan_reduce.h) on the host: rank 0 sums its tokens from its
// own expert output and rank 2's (mapped, read in place) and from rank 1's rows, which rank 1's
// producer role pushes through the pair's ring and the reducer reads in the ring's slots. Both
// ranks' roles are stepped in turn as their executors step them. Every output byte must equal the
// host combine's sum (src/device/reduce.h: each rank's group rounded, the groups summed in
// order), over ring depths 2 to 4, rows that straddle slots, several operations on the same ring
// (positions carry on), tokens with no terms or none from the pushing rank, and every datatype.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "device/chan_roles.h"
#include "device/reduce.h"
#include "unit/chan_test_ring.h"

namespace {

using namespace fusco;

constexpr int kRanks = 3;
constexpr uint32_t kPush = 1;  // the rank that pushes its rows to rank 0

const auto kCopy = fusco::test::chanCopy;

// Rank 1 -> rank 0: the ring and both sides' state; one message each way.
struct Ring10 : fusco::test::ChanDirection {
  using ChanDirection::ChanDirection;
  chan::Role role(chan::RoleKind kind, uint32_t peer, const DevCopyTask* task) {
    return ChanDirection::role(kind, peer, task, 1);
  }
};

// One combine at rank 0: per token, terms from ranks 0, 1, 2 in that order (a group each); rank
// r's rows of the token are the next ones of r's slot order. Rank 1's expert output holds them
// at rows its fan list names; ranks 0 and 2 at rows termRow names.
struct Combine {
  uint32_t dt;
  uint64_t hidden, rowBytes, ntokens;
  std::vector<char> expertOut[kRanks], out, want;
  std::vector<uint32_t> termStart{0}, termRank, termSeq;
  std::vector<int64_t> termRow, termWeight, pushRows;
  std::vector<uint8_t> termLast;
  std::vector<float> weights;
  uint64_t slotsTo[kRanks] = {};

  Combine(uint32_t type, uint64_t h, uint64_t tokens, int topk, std::mt19937_64& rng)
      : dt(type), hidden(h), rowBytes(h * (type == fuscoFloat32 ? 4 : 2)), ntokens(tokens) {
    weights.resize(tokens * topk);
    for (float& w : weights) w = static_cast<float>(rng() % 1000) / 250.0f - 2.0f;
    std::vector<std::vector<uint32_t>> seqOf(kRanks);
    for (uint64_t t = 0; t < tokens; ++t) {
      int k = 0;
      for (int r = 0; r < kRanks; ++r) {
        const int terms = static_cast<int>(rng() % 3);  // 0 to 2 experts of the token on r
        for (int j = 0; j < terms && k < topk; ++j, ++k) {
          termRank.push_back(r);
          termSeq.push_back(static_cast<uint32_t>(slotsTo[r]++));
          termWeight.push_back(rng() % 5 == 0 ? -1 : static_cast<int64_t>(t * topk + k));
          termLast.push_back(j + 1 == terms || k + 1 == topk);
        }
      }
      termStart.push_back(static_cast<uint32_t>(termRank.size()));
    }
    // Packed slot order: rank 0's slots, then rank 1's, then rank 2's.
    for (size_t i = 0; i < termRank.size(); ++i)
      for (int r = 0; r < static_cast<int>(termRank[i]); ++r) termSeq[i] += slotsTo[r];
    for (int r = 0; r < kRanks; ++r) {
      const uint64_t rows = slotsTo[r] + 3;
      expertOut[r].resize(rows * rowBytes);
      for (char& c : expertOut[r]) c = static_cast<char>(rng() % 7 * 16);  // finite values
    }
    // Rank 1 keeps its rows for rank 0 permuted; ranks 0 and 2 are read at termRow.
    for (uint64_t j = 0; j < slotsTo[kPush]; ++j)
      pushRows.push_back((j * 5 + 2) % (slotsTo[1] + 3));
    uint64_t base[kRanks] = {0, slotsTo[0], slotsTo[0] + slotsTo[1]};
    for (size_t i = 0; i < termRank.size(); ++i) {
      const uint32_t r = termRank[i];
      const uint64_t j = termSeq[i] - base[r];
      termRow.push_back(r == kPush ? -7 : static_cast<int64_t>((j * 3 + 1) % (slotsTo[r] + 3)));
    }
    out.assign(tokens * rowBytes, static_cast<char>(0xA5));
    reference();
  }

  // The host combine's bits.
  void reference() {
    want.assign(ntokens * rowBytes, 0);
    const auto type = static_cast<fuscoDataType_t>(dt);
    std::vector<std::vector<char>> partials;
    for (uint64_t t = 0; t < ntokens; ++t) {
      std::vector<const void*> rows, groups;
      std::vector<float> w;
      partials.clear();
      for (uint32_t k = termStart[t]; k < termStart[t + 1]; ++k) {
        rows.push_back(rowOf(k));
        w.push_back(termWeight[k] < 0 ? 1.0f : weights[termWeight[k]]);
        if (termLast[k] == 0) continue;
        partials.emplace_back(rowBytes);
        weightedSumRows(type, hidden, rows.data(), w.data(), rows.size(), partials.back().data());
        rows.clear(), w.clear();
      }
      for (const auto& p : partials) groups.push_back(p.data());
      sumRows(type, hidden, groups.data(), groups.size(), want.data() + t * rowBytes);
    }
  }
  const char* rowOf(uint32_t k) const {
    const uint32_t r = termRank[k];
    if (r != kPush) return expertOut[r].data() + termRow[k] * rowBytes;
    return expertOut[kPush].data() + pushRows[termSeq[k] - slotsTo[0]] * rowBytes;
  }
};

// Rank 0's reduce arguments and state, rank 1's message.
struct Roles {
  DevCopyTask send{}, feed{};
  const char* bases[kRanks] = {};
  uint64_t seqBase[kRanks] = {};
  int32_t feedOf[kRanks] = {-1, 0, -1};
  chan::FeedState feeds[kRanks] = {};
  chan::ReduceArgs args{};
  std::vector<chan::Role> rank0, rank1;

  Roles(Combine& c, Ring10& ring) {
    send = DevCopyTask{c.expertOut[kPush].data(),
                       c.pushRows.data(),
                       nullptr,
                       nullptr,
                       nullptr,
                       nullptr,
                       c.rowBytes,
                       c.slotsTo[kPush],
                       c.slotsTo[kPush] * c.rowBytes};
    feed = DevCopyTask{nullptr,    nullptr,          nullptr,
                       nullptr,    nullptr,          nullptr,
                       c.rowBytes, c.slotsTo[kPush], c.slotsTo[kPush] * c.rowBytes};
    bases[0] = c.expertOut[0].data(), bases[2] = c.expertOut[2].data();
    seqBase[1] = c.slotsTo[0], seqBase[2] = c.slotsTo[0] + c.slotsTo[1];
    auto at = [](const void* p) { return reinterpret_cast<uint64_t>(p); };
    args = chan::ReduceArgs{at(c.termStart.data()),
                            at(c.termRank.data()),
                            at(c.termRow.data()),
                            at(c.termSeq.data()),
                            at(c.termWeight.data()),
                            at(c.termLast.data()),
                            at(c.weights.data()),
                            at(c.out.data()),
                            at(bases),
                            at(seqBase),
                            at(feedOf),
                            at(feeds),
                            c.ntokens,
                            c.hidden,
                            c.dt,
                            0,
                            0};
    rank0.push_back(ring.role(chan::kFeed, kPush, &feed));
    chan::Role reduce{};
    reduce.kind = chan::kReduce;
    reduce.tasks = at(&args);
    reduce.ntasks = kRanks;
    rank0.push_back(reduce);
    rank1.push_back(ring.role(chan::kProduce, 0, &send));
  }
};

// Steps both ranks' roles until both finish; true when both did.
bool run(Roles& r) {
  chan::RolesState s0, s1;
  op::OpWords w0{}, w1{};
  bool done0 = false, done1 = false;
  for (int i = 0; i < 1000000 && !(done0 && done1); ++i) {
    if (!done0) {
      const op::WaitStatus x = chan::stepRoles(
          r.rank0.data(), static_cast<uint32_t>(r.rank0.size()), s0, &w0, 0, 1000000, kCopy);
      if (x != op::kPending && x != op::kReady) return false;
      done0 = x == op::kReady;
    }
    if (!done1) {
      const op::WaitStatus x = chan::stepRoles(
          r.rank1.data(), static_cast<uint32_t>(r.rank1.size()), s1, &w1, 0, 1000000, kCopy);
      if (x != op::kPending && x != op::kReady) return false;
      done1 = x == op::kReady;
    }
  }
  return done0 && done1;
}

void reduceOps(chan::RingDims d, uint32_t dt, uint64_t hidden, int ops, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Ring10 ring(d);
  for (int op = 0; op < ops; ++op) {
    Combine c(dt, hidden, 5 + rng() % 40, 4, rng);
    Roles roles(c, ring);
    ASSERT_TRUE(run(roles)) << "operation " << op;
    EXPECT_EQ(c.out, c.want) << "operation " << op << ": sums differ from the host combine's";
    EXPECT_EQ(ring.heads[0], ring.tails[0]) << "every slot handed back";
  }
}

TEST(ChanReduce, PushedAndPulledRowsSumLikeTheHostCombineAtEveryDepth) {
  for (uint32_t depth = 2; depth <= 4; ++depth)
    for (uint32_t dt : {fuscoBfloat16, fuscoFloat16, fuscoFloat32}) {
      SCOPED_TRACE(::testing::Message() << "depth " << depth << " dt " << dt);
      // Slots of 3 rows and a bit: rows straddle slots. A token's rows from one rank (4 at most)
      // must fit in depth - 1 slots (chan_reduce.h), so the two-slot ring gets larger slots.
      const uint64_t hidden = 24, rowBytes = hidden * (dt == fuscoFloat32 ? 4 : 2);
      const uint64_t payload = depth == 2 ? 4 * rowBytes + 16 : 3 * rowBytes + 16;
      reduceOps({1, depth, (payload + 16 + 15) / 16 * 16}, dt, hidden, 4, 11 + depth * 7 + dt);
    }
}

TEST(ChanReduce, SplitRingsCarryTheMessageInTheFirstSubRing) {
  reduceOps({4, 3, 256}, fuscoBfloat16, 40, 3, 5);
}

TEST(ChanReduce, AStaleSlotIsReportedNotRead) {
  std::mt19937_64 rng(9);
  Ring10 ring({1, 4, 512});
  Combine c(fuscoBfloat16, 32, 20, 4, rng);
  Roles roles(c, ring);
  ring.prodEpoch = 5;  // the producer is an operation ahead: its slots name another epoch
  op::OpWords w{};
  chan::RolesState s0, s1;
  op::WaitStatus x = op::kPending;
  for (int i = 0; i < 1000 && x == op::kPending; ++i) {
    (void)chan::stepRoles(roles.rank1.data(), 1, s1, &w, 0, 1000000, kCopy);
    x = chan::stepRoles(roles.rank0.data(), 2, s0, &w, 0, 1000000, kCopy);
  }
  if (c.slotsTo[kPush] == 0) GTEST_SKIP() << "the routing sent rank 1 nothing";
  EXPECT_EQ(x, op::kTimedOut);
  EXPECT_EQ(w.timedOut, kPush + 1) << "the reducer names the rank whose slot it refused";
  EXPECT_EQ(w.phase, op::kPhaseSlot);
}

}  // namespace
