// The channels' producer and consumer steps (src/device/chan_steps.h) on the host: one pair's
// sub-rings driven by two threads (with the bounded waits of src/device/op_steps.h) and by one
// thread stepping the roles in a seeded random order. Every operation's destinations are poisoned
// first and compared with the items it sent; positions carry on from one operation to the next.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "device/chan_steps.h"
#include "device/op_steps.h"

namespace {

namespace op = fusco::op;
using namespace fusco::chan;

constexpr char kPoison = static_cast<char>(0xA5);
constexpr uint64_t kGuard = 16;  // poisoned bytes after each destination, never written
constexpr uint64_t kRealTimeoutNs = 10ull * 1000 * 1000 * 1000;

// One operation's items of a pair: random sources, poisoned destinations.
struct Items {
  std::vector<std::vector<char>> src, dst;
  std::vector<const char*> srcPtrs;
  std::vector<char*> dstPtrs;
  std::vector<uint64_t> bytes;
  ItemSource source() const { return {srcPtrs.data(), bytes.data()}; }
  ItemSink sink() const { return {dstPtrs.data(), bytes.data()}; }
  void poison() {
    for (auto& d : dst) std::fill(d.begin(), d.end(), kPoison);
  }
};

Items makeItems(std::mt19937& rng, uint64_t n, uint64_t minBytes, uint64_t maxBytes) {
  Items it;
  std::uniform_int_distribution<uint64_t> size(minBytes, maxBytes);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t b = size(rng);
    it.bytes.push_back(b);
    it.src.emplace_back(b);
    for (auto& c : it.src.back()) c = static_cast<char>(rng());
    it.dst.emplace_back(b + kGuard);
  }
  for (uint64_t i = 0; i < n; ++i) {
    it.srcPtrs.push_back(it.src[i].data());
    it.dstPtrs.push_back(it.dst[i].data());
  }
  it.poison();
  return it;
}

void expectExact(const Items& it) {
  for (size_t i = 0; i < it.bytes.size(); ++i) {
    const uint64_t b = it.bytes[i];
    EXPECT_TRUE(std::equal(it.src[i].begin(), it.src[i].end(), it.dst[i].begin())) << "item " << i;
    for (uint64_t g = b; g < b + kGuard; ++g)
      ASSERT_EQ(it.dst[i][g], kPoison) << "item " << i << " written past its end";
  }
}

// One ordered pair's channel: its slots, positions and both sides' cursors.
struct Channel {
  RingDims d;
  std::vector<uint64_t> slotMem;  // 8-byte aligned slots
  uint64_t tail[kMaxSplit] = {}, head[kMaxSplit] = {}, begin[kMaxSplit] = {}, end[kMaxSplit] = {};
  ProducerCursor prod[kMaxSplit] = {};
  ConsumerCursor cons[kMaxSplit] = {};
  explicit Channel(RingDims dims) : d(dims), slotMem(pairBytes(dims) / 8) {
    EXPECT_EQ(dimsProblem(d), nullptr);
  }
  Ring ring(uint32_t s) {
    return {subRingSlots(reinterpret_cast<char*>(slotMem.data()), d, s), &tail[s], &head[s], d};
  }
  void start(uint64_t items) {
    for (uint32_t s = 0; s < d.split; ++s) {
      splitRange(items, d.split, s, &begin[s], &end[s]);
      startItems(prod[s], begin[s]);
      startItems(cons[s], begin[s]);
    }
  }
  StepStatus produce(uint32_t s, const Items& it, uint64_t epoch) {
    return produceStep(ring(s), prod[s], it.source(), end[s], epoch);
  }
  StepStatus consume(uint32_t s, const Items& it, uint64_t epoch) {
    return consumeStep(ring(s), cons[s], it.sink(), end[s], epoch);
  }
};

// The slots sub-ring s needs for its range of it.
uint64_t piecesOf(const Channel& ch, const Items& it, uint32_t s) {
  uint64_t n = 0;
  for (uint64_t i = ch.begin[s]; i < ch.end[s]; ++i)
    n += (it.bytes[i] + payloadBytes(ch.d) - 1) / payloadBytes(ch.d);
  return n;
}

uint64_t steadyNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}
uint64_t yieldingNs() {
  std::this_thread::yield();
  return steadyNs();
}

// Steps one side's sub-rings in turn until all finished, polling the wait of a sub-ring that
// cannot move. Returns kReady, or the wait that ended the role (kAborted also on a corrupt slot).
template <class Step, class Poll>
op::WaitStatus drive(uint32_t split, Step step, Poll poll, bool* corrupt) {
  op::Wait w[kMaxSplit] = {};
  bool done[kMaxSplit] = {};
  for (uint32_t left = split; left > 0;) {
    for (uint32_t s = 0; s < split; ++s) {
      if (done[s]) continue;
      const StepStatus st = step(s);
      if (st == kCorrupt) {
        *corrupt = true;
        return op::kAborted;
      }
      if (st == kFinished) {
        done[s] = true;
        --left;
      }
      if (st == kProgress) w[s] = {};
      if (st != kNoCredit && st != kNoData) continue;
      const op::WaitStatus ws = poll(s, w[s]);
      if (ws == op::kAborted || ws == op::kTimedOut) return ws;
    }
  }
  return op::kReady;
}

// The producer on a thread of its own, the consumer on this one, both with real waits; a side
// that fails aborts the other's waits.
void runThreads(Channel& ch, const Items& it, uint64_t epoch) {
  op::OpWords words{};
  bool pc = false, cc = false;
  auto stopOthers = [&](op::WaitStatus s) {
    if (s != op::kReady) __atomic_store_n(&words.abort, 1u, __ATOMIC_RELEASE);
    return s;
  };
  op::WaitStatus ps = op::kReady;
  std::thread producer([&] {
    ps = stopOthers(drive(
        ch.d.split, [&](uint32_t s) { return ch.produce(s, it, epoch); },
        [&](uint32_t s, op::Wait& w) {
          return pollCredit(ch.ring(s), ch.prod[s], w, &words, yieldingNs(), kRealTimeoutNs, 1);
        },
        &pc));
  });
  const op::WaitStatus cs = stopOthers(drive(
      ch.d.split, [&](uint32_t s) { return ch.consume(s, it, epoch); },
      [&](uint32_t s, op::Wait& w) {
        return pollData(ch.ring(s), ch.cons[s], w, &words, yieldingNs(), kRealTimeoutNs, 0);
      },
      &cc));
  producer.join();
  EXPECT_EQ(ps, op::kReady);
  EXPECT_EQ(cs, op::kReady);
  EXPECT_FALSE(pc || cc);
  EXPECT_EQ(words.timedOut, 0u);
}

// Both sides on this thread, a seeded random role stepped each time.
void runInterleaved(Channel& ch, const Items& it, uint64_t epoch, std::mt19937& rng) {
  uint32_t finished = 0;  // roles that reported kFinished: producers, then consumers
  std::vector<bool> done(2 * ch.d.split, false);
  for (uint64_t steps = 0; finished < 2 * ch.d.split; ++steps) {
    ASSERT_LT(steps, 100000000u) << "no progress";
    const uint32_t role = rng() % (2 * ch.d.split), s = role % ch.d.split;
    if (done[role]) continue;
    const StepStatus st = role < ch.d.split ? ch.produce(s, it, epoch) : ch.consume(s, it, epoch);
    ASSERT_NE(st, kCorrupt) << "sub-ring " << s;
    if (st != kFinished) continue;
    done[role] = true;
    ++finished;
  }
}

enum class Mode { kThreads, kInterleaved };

// One operation: destinations poisoned, every byte checked, and each sub-ring's positions moved
// on by exactly the slots its range needed.
void runOp(Channel& ch, Items& it, uint64_t epoch, Mode mode, std::mt19937& rng) {
  it.poison();
  ch.start(it.bytes.size());
  uint64_t want[kMaxSplit];
  for (uint32_t s = 0; s < ch.d.split; ++s) want[s] = ch.tail[s] + piecesOf(ch, it, s);
  if (mode == Mode::kThreads) runThreads(ch, it, epoch);
  if (mode == Mode::kInterleaved) runInterleaved(ch, it, epoch, rng);
  expectExact(it);
  for (uint32_t s = 0; s < ch.d.split; ++s) {
    EXPECT_EQ(ch.tail[s], want[s]) << "sub-ring " << s;
    EXPECT_EQ(ch.head[s], want[s]) << "sub-ring " << s;
    EXPECT_EQ(ch.prod[s].tail, want[s]);
    EXPECT_EQ(ch.cons[s].head, want[s]);
  }
}

TEST(ChanSteps, DimsOutsideTheirRangeAreNamed) {
  EXPECT_EQ(dimsProblem({4, 4, 128 * 1024}), nullptr);
  EXPECT_NE(dimsProblem({0, 4, 64}), nullptr);
  EXPECT_NE(dimsProblem({17, 4, 64}), nullptr);
  EXPECT_NE(dimsProblem({4, 0, 64}), nullptr);
  EXPECT_NE(dimsProblem({4, 17, 64}), nullptr);
  EXPECT_NE(dimsProblem({4, 4, 16}), nullptr);
  EXPECT_NE(dimsProblem({4, 4, 72}), nullptr);
  EXPECT_EQ(pairBytes({4, 4, 128 * 1024}), 2ull * 1024 * 1024);
}

TEST(ChanSteps, SplitRangesAreContiguousAndBalanced) {
  for (uint64_t items : {0, 1, 5, 16, 17, 1000})
    for (uint32_t split = 1; split <= kMaxSplit; ++split) {
      uint64_t next = 0;
      for (uint32_t s = 0; s < split; ++s) {
        uint64_t b, e;
        splitRange(items, split, s, &b, &e);
        EXPECT_EQ(b, next);
        EXPECT_LE(e - b, items / split + 1);
        EXPECT_GE(e - b, items / split);
        next = e;
      }
      EXPECT_EQ(next, items);
    }
}

TEST(ChanSteps, DepthsOneToFourAreExact) {
  std::mt19937 rng(7);
  for (uint32_t slots = 1; slots <= 4; ++slots)
    for (uint32_t split = 1; split <= 4; ++split) {
      SCOPED_TRACE(testing::Message() << "slots " << slots << " split " << split);
      Channel ch({split, slots, 64});
      Items a = makeItems(rng, 37, 0, 150), b = makeItems(rng, 23, 1, 300);
      runOp(ch, a, 1, Mode::kThreads, rng);
      runOp(ch, b, 2, Mode::kInterleaved, rng);
    }
}

TEST(ChanSteps, WrapAroundKeepsOrder) {
  std::mt19937 rng(11);
  Channel ch({2, 2, 48});
  uint64_t epoch = 0;
  for (int i = 0; i < 60; ++i) {
    Items it = makeItems(rng, 20, 1, 100);
    runOp(ch, it, ++epoch, i % 2 ? Mode::kThreads : Mode::kInterleaved, rng);
  }
  for (uint32_t s = 0; s < 2; ++s) EXPECT_GT(ch.tail[s], 60u * 10);
}

TEST(ChanSteps, ItemsLargerThanASlotArriveWhole) {
  std::mt19937 rng(13);
  Channel ch({3, 2, 32});
  Items a = makeItems(rng, 7, 1000, 5000), b = makeItems(rng, 5, 16, 17);
  runOp(ch, a, 1, Mode::kThreads, rng);
  runOp(ch, a, 2, Mode::kInterleaved, rng);
  runOp(ch, b, 3, Mode::kInterleaved, rng);
}

TEST(ChanSteps, EmptyPairsMoveNothing) {
  std::mt19937 rng(17);
  Channel ch({3, 2, 64});
  Items some = makeItems(rng, 9, 1, 200), none, zeros = makeItems(rng, 5, 0, 0);
  runOp(ch, some, 1, Mode::kInterleaved, rng);
  const std::vector<uint64_t> tails(ch.tail, ch.tail + 3), heads(ch.head, ch.head + 3);
  uint64_t epoch = 1;
  for (const Items* it : {&none, &zeros}) {
    ch.start(it->bytes.size());
    ++epoch;
    for (uint32_t s = 0; s < 3; ++s) {
      EXPECT_EQ(ch.produce(s, *it, epoch), kFinished);
      EXPECT_EQ(ch.consume(s, *it, epoch), kFinished);
    }
    EXPECT_EQ(std::vector<uint64_t>(ch.tail, ch.tail + 3), tails);
    EXPECT_EQ(std::vector<uint64_t>(ch.head, ch.head + 3), heads);
  }
}

TEST(ChanSteps, AbortMidStreamStopsTheProducer) {
  std::mt19937 rng(19);
  Channel ch({1, 2, 64});
  Items it = makeItems(rng, 10, 100, 100);  // 3 slots an item
  ch.start(10);
  op::OpWords words{};
  EXPECT_EQ(ch.produce(0, it, 1), kProgress);
  EXPECT_EQ(ch.consume(0, it, 1), kProgress);  // then the consumer stops
  uint64_t now = 0, polls = 0;
  bool corrupt = false;
  const op::WaitStatus s = drive(
      1, [&](uint32_t) { return ch.produce(0, it, 1); },
      [&](uint32_t, op::Wait& w) {
        if (++polls == 5) words.abort = 1;
        return pollCredit(ch.ring(0), ch.prod[0], w, &words, ++now, 1000000, 1);
      },
      &corrupt);
  EXPECT_EQ(s, op::kAborted);
  EXPECT_LE(polls, 5 + op::kAbortEvery);
  EXPECT_EQ(ch.tail[0], 3u);
  EXPECT_EQ(ch.produce(0, it, 1), kNoCredit);
  EXPECT_EQ(ch.tail[0], 3u);
  EXPECT_EQ(words.timedOut, 0u);
  // The stopped consumer's own wait gives up too once it has drained what was published.
  op::Wait w{};
  EXPECT_EQ(ch.consume(0, it, 1), kProgress);
  EXPECT_EQ(ch.consume(0, it, 1), kProgress);
  EXPECT_EQ(ch.consume(0, it, 1), kNoData);
  EXPECT_EQ(pollData(ch.ring(0), ch.cons[0], w, &words, now, 1000000, 0), op::kAborted);
}

TEST(ChanSteps, AStalledConsumerTimesTheProducerOut) {
  std::mt19937 rng(23);
  Channel ch({2, 1, 64});
  Items it = makeItems(rng, 4, 60, 60);
  ch.start(4);
  op::OpWords words{};
  uint64_t now = 0;
  bool corrupt = false;
  const op::WaitStatus s = drive(
      2, [&](uint32_t sub) { return ch.produce(sub, it, 1); },
      [&](uint32_t sub, op::Wait& w) {
        return pollCredit(ch.ring(sub), ch.prod[sub], w, &words, now += 10, 1000, 5);
      },
      &corrupt);
  EXPECT_EQ(s, op::kTimedOut);
  EXPECT_EQ(words.timedOut, 6u);
  EXPECT_EQ(words.phase, static_cast<uint32_t>(op::kPhaseHead));
  EXPECT_EQ(words.abort, 1u);
  EXPECT_EQ(ch.tail[0], 1u);
  EXPECT_EQ(ch.tail[1], 1u);
}

TEST(ChanSteps, PositionsCarryAcrossEagerCallsAndReplays) {
  std::mt19937 rng(29);
  Channel ch({2, 3, 64});
  Items a = makeItems(rng, 15, 1, 200), b = makeItems(rng, 11, 1, 90);
  runOp(ch, a, 1, Mode::kThreads, rng);
  const uint64_t afterA = ch.tail[0];
  runOp(ch, a, 2, Mode::kInterleaved, rng);  // a replay: the same items, the next epoch
  EXPECT_EQ(ch.tail[0], 2 * afterA);
  runOp(ch, b, 3, Mode::kThreads, rng);
  EXPECT_GT(ch.tail[0], 2 * afterA);
  // A tail that moved past a slot nobody wrote: the slot still holds operation 3's header, even
  // with the size operation 4 expects, and is refused without being read or returned.
  Items c = makeItems(rng, 4, 20, 20);
  ch.start(4);
  SlotHeader* stale = reinterpret_cast<SlotHeader*>(slotAt(ch.ring(0), ch.head[0]));
  ASSERT_EQ(stale->epoch, 3u);
  stale->bytes = 20;
  const uint64_t head = ch.head[0];
  ++ch.tail[0];
  EXPECT_EQ(ch.consume(0, c, 4), kCorrupt);
  EXPECT_EQ(ch.head[0], head);
  EXPECT_EQ(ch.cons[0].head, head);
  EXPECT_EQ(c.dst[0][0], kPoison);
}

TEST(ChanSteps, HeaderEpochMismatchIsCorrupt) {
  std::mt19937 rng(31);
  Channel ch({1, 2, 64});
  Items it = makeItems(rng, 2, 30, 30);
  ch.start(2);
  EXPECT_EQ(ch.produce(0, it, 5), kProgress);
  EXPECT_EQ(ch.consume(0, it, 4), kCorrupt);
  EXPECT_EQ(ch.consume(0, it, 6), kCorrupt);
  EXPECT_EQ(ch.head[0], 0u);
  EXPECT_EQ(it.dst[0][0], kPoison);
  // The right epoch with another size is refused too.
  SlotHeader* h = reinterpret_cast<SlotHeader*>(slotAt(ch.ring(0), 0));
  h->bytes = 29;
  EXPECT_EQ(ch.consume(0, it, 5), kCorrupt);
  h->bytes = 30;
  EXPECT_EQ(ch.consume(0, it, 5), kProgress);
  EXPECT_EQ(ch.head[0], 1u);
  EXPECT_EQ(std::memcmp(it.dst[0].data(), it.src[0].data(), 30), 0);
}

}  // namespace
