// An operation's ring roles (src/device/chan_roles.h) on the host, two ranks in one process: each
// produces its messages to the other and consumes the other's, both stepped in turn as their
// executors step them. Messages are byte streams each side maps onto its own rows: a flat send
// lands in rows picked by a list, rows gathered by a list land flat, and a row fans out to several
// destination rows. Destinations are poisoned, sources seeded, every byte compared with a
// sequential reference; positions carry across operations; an abort ends a role that cannot move.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "device/chan_roles.h"
#include "unit/chan_test_ring.h"

namespace {

using namespace fusco;

constexpr char kPoison = static_cast<char>(0xA5);

// A ring direction's roles for a list of messages.
struct Direction : fusco::test::ChanDirection {
  using ChanDirection::ChanDirection;
  chan::Role role(bool send, uint32_t peer, const std::vector<DevCopyTask>& tasks) {
    return ChanDirection::role(send ? chan::kProduce : chan::kConsume, peer, tasks.data(),
                               static_cast<uint32_t>(tasks.size()));
  }
};

const auto kCopy = fusco::test::chanCopy;

// One operation's messages from one rank to the other, with their source and destination buffers
// and the bytes the destination must hold afterwards.
struct Messages {
  std::vector<char> src, dst, want;
  std::vector<int64_t> srcRows, dstRows, fanRows;
  std::vector<uint32_t> fanStart;
  std::vector<DevCopyTask> sends, recvs;

  // Three messages: flat into listed rows, listed rows into flat, one row fanned out, of rowBytes
  // (larger than a slot when rowBytes is).
  Messages(uint64_t rowBytes, uint32_t rows, std::mt19937_64& rng) {
    src.resize(3 * rows * rowBytes);
    for (char& c : src) c = static_cast<char>(rng());
    dst.assign(3 * rows * rowBytes + 2 * rows * rowBytes, kPoison);
    want = dst;
    for (uint32_t i = 0; i < rows; ++i) {
      srcRows.push_back(rows - 1 - i);    // message 1 gathers rows backwards
      dstRows.push_back((i * 7) % rows);  // message 0 lands in a permutation
    }
    fanStart = {0, 3};
    fanRows = {0, 2, 4};
    DevCopyTask flat = flatCopyTask(src.data(), nullptr, rows * rowBytes);
    DevCopyTask gather{src.data() + rows * rowBytes,
                       srcRows.data(),
                       nullptr,
                       nullptr,
                       nullptr,
                       nullptr,
                       rowBytes,
                       rows,
                       rows * rowBytes};
    DevCopyTask one{src.data() + 2 * rows * rowBytes,
                    nullptr,
                    nullptr,
                    nullptr,
                    nullptr,
                    nullptr,
                    rowBytes,
                    1,
                    rowBytes};
    sends = {flat, gather, one};
    char* d0 = dst.data();
    char* d1 = d0 + rows * rowBytes;
    char* d2 = d1 + rows * rowBytes;
    recvs = {DevCopyTask{nullptr, nullptr, d0, dstRows.data(), nullptr, nullptr, rowBytes, rows,
                         rows * rowBytes},
             flatCopyTask(nullptr, d1, rows * rowBytes),
             DevCopyTask{nullptr, nullptr, d2, nullptr, fanStart.data(), fanRows.data(), rowBytes,
                         1, rowBytes}};
    for (uint32_t i = 0; i < rows; ++i)
      std::memcpy(want.data() + dstRows[i] * rowBytes, src.data() + i * rowBytes, rowBytes);
    for (uint32_t i = 0; i < rows; ++i)
      std::memcpy(want.data() + (rows + i) * rowBytes, src.data() + (rows + srcRows[i]) * rowBytes,
                  rowBytes);
    for (int64_t f : fanRows)
      std::memcpy(want.data() + 2 * rows * rowBytes + f * rowBytes,
                  src.data() + 2 * rows * rowBytes, rowBytes);
  }
};

// Steps both ranks' roles until both finish (or maxRounds pass); true when both did.
bool runPair(std::vector<chan::Role>& a, std::vector<chan::Role>& b, op::OpWords* wa,
             op::OpWords* wb, int maxRounds = 100000) {
  chan::RolesState sa, sb;
  bool doneA = false, doneB = false;
  for (int i = 0; i < maxRounds && !(doneA && doneB); ++i) {
    if (!doneA) {
      const op::WaitStatus r =
          chan::stepRoles(a.data(), static_cast<uint32_t>(a.size()), sa, wa, 0, 1000000, kCopy);
      if (r != op::kPending && r != op::kReady) return false;
      doneA = r == op::kReady;
    }
    if (!doneB) {
      const op::WaitStatus r =
          chan::stepRoles(b.data(), static_cast<uint32_t>(b.size()), sb, wb, 0, 1000000, kCopy);
      if (r != op::kPending && r != op::kReady) return false;
      doneB = r == op::kReady;
    }
  }
  return doneA && doneB;
}

// Rank 0 and rank 1 exchange three messages each way, `ops` operations in a row on the same
// rings (positions carry on), with dims d and rows of rowBytes.
void exchange(chan::RingDims d, uint64_t rowBytes, uint32_t rows, int ops, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Direction ab(d), ba(d);
  op::OpWords wa{}, wb{};
  for (int k = 0; k < ops; ++k) {
    Messages toB(rowBytes, rows, rng), toA(rowBytes, rows, rng);
    std::vector<chan::Role> a = {ab.role(true, 1, toB.sends), ba.role(false, 1, toA.recvs)};
    std::vector<chan::Role> b = {ba.role(true, 0, toA.sends), ab.role(false, 0, toB.recvs)};
    ASSERT_TRUE(runPair(a, b, &wa, &wb)) << "operation " << k;
    EXPECT_EQ(toB.dst, toB.want) << "rank 1's receive, operation " << k;
    EXPECT_EQ(toA.dst, toA.want) << "rank 0's receive, operation " << k;
    EXPECT_EQ(ab.prodEpoch, static_cast<uint64_t>(k + 1));
    EXPECT_EQ(ab.consEpoch, static_cast<uint64_t>(k + 1));
  }
  for (uint32_t s = 0; s < d.split; ++s) EXPECT_EQ(ab.tails[s], ab.heads[s]) << "sub-ring " << s;
}

TEST(ChanRoles, EveryDepthAndSplitIsExact) {
  for (uint32_t split = 1; split <= 4; ++split)
    for (uint32_t slots = 1; slots <= 4; ++slots) {
      SCOPED_TRACE("split " + std::to_string(split) + ", slots " + std::to_string(slots));
      exchange({split, slots, 256}, 48, 9, 1, split * 10 + slots);
    }
}

TEST(ChanRoles, RowsLargerThanASlotArriveWhole) { exchange({2, 2, 64}, 200, 5, 1, 7); }

TEST(ChanRoles, PositionsCarryAcrossOperationsAndTheRingsWrap) {
  exchange({3, 2, 128}, 40, 11, 5, 11);
}

// Roles with no message finish at once and move nothing.
TEST(ChanRoles, EmptyRolesFinishAtOnce) {
  Direction ab({2, 2, 128});
  std::vector<DevCopyTask> none;
  std::vector<chan::Role> a = {ab.role(true, 1, none)};
  chan::RolesState st;
  op::OpWords w{};
  EXPECT_EQ(chan::stepRoles(a.data(), 1, st, &w, 0, 1000, kCopy), op::kReady);
  EXPECT_EQ(ab.tails[0] + ab.tails[1], 0u);
}

// A producer whose consumer never comes fills its sub-ring and then waits; the abort word ends
// it, and the time without a moving slot ends it with its peer and phase.
TEST(ChanRoles, ARoleThatCannotMoveEndsOnAbortOrTimeout) {
  std::mt19937_64 rng(3);
  for (bool abort : {true, false}) {
    Direction ab({1, 2, 64});
    Messages toB(100, 6, rng);
    std::vector<chan::Role> a = {ab.role(true, 5, toB.sends)};
    chan::RolesState st;
    op::OpWords w{};
    op::WaitStatus r = op::kPending;
    for (int i = 0; i < 100 && r == op::kPending; ++i)
      r = chan::stepRoles(a.data(), 1, st, &w, 10, 1000, kCopy);
    EXPECT_EQ(r, op::kPending);
    EXPECT_EQ(ab.tails[0], 2u) << "the producer filled its two slots";
    if (abort) w.abort = 1;
    for (int i = 0; i < 1000 && r == op::kPending; ++i)
      r = chan::stepRoles(a.data(), 1, st, &w, abort ? 10 : 5000, 1000, kCopy);
    EXPECT_EQ(r, abort ? op::kAborted : op::kTimedOut);
    EXPECT_EQ(ab.tails[0], 2u) << "nothing moved after it gave up";
    if (!abort) {
      EXPECT_EQ(w.timedOut, 6u);
      EXPECT_EQ(w.phase, static_cast<uint32_t>(op::kPhaseHead));
    }
  }
}

}  // namespace
