// An operation's program (src/device/op_program.h) on one executor, as the host twin of the stream
// and the kernel's twin run it: waits end only when their word reaches its value, posts follow
// their barrier, a wait that gives up (abort word, timeout) skips every later copy and post but
// the consumed word, clears the pull's bases word and marks the operation failed for its next
// launch, and a timeout names its peer and phase.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "device/op_program.h"

namespace {

using namespace fusco::op;

// A block with room for a header and 32 steps, the words a program waits on and posts to, and the
// operation words.
struct Program {
  alignas(64) char block[sizeof(Header) + 32 * sizeof(Step)] = {};
  uint32_t go = 0, peerReady = 0, peerDone = 0;  // words this rank waits on
  uint32_t myReady = 0, myDone = 0;              // words this rank posts to the peer
  uint32_t bases = 2;                            // a pull's bases word
  OpWords words{};
  std::vector<int> copies;  // the copy steps run, by their value

  Program() {
    Header* h = headerOf(block);
    h->words = reinterpret_cast<uint64_t>(&words);
    h->timeoutNs = 1000;
    h->failWord = reinterpret_cast<uint64_t>(&bases);
  }
  void add(const Step& s) { stepsOf(block)[headerOf(block)->steps++] = s; }
  // The push program of docs/DESIGN.md, "One kernel per operation", with one peer (rank 3).
  void push(uint32_t index, uint32_t seq) {
    add({kStepWait, index, 7, kPhaseGo, addr(&go), 0, 0});
    add({kStepBarrier, 0, 0, 0, 0, 0, 0});
    add({kStepPost, seq, 0, 0, addr(&myReady), 0, 0});
    add({kStepWait, seq, 3, kPhaseReady, addr(&peerReady), 0, 0});
    add({kStepCopy, 1, 0, 0, 0, 0, 0});
    add({kStepBarrier, 0, 1, 0, 0, 0, 0});
    add({kStepPost, seq, 0, 0, addr(&myDone), 0, 0});
    add({kStepWait, seq, 3, kPhaseDone, addr(&peerDone), 0, 0});
    add({kStepCopy, 2, 0, 0, 0, 0, 0});
    add({kStepBarrier, 0, 2, 0, 0, 0, 0});
    add({kStepPost, 1, 0, 0, addr(block), 0, 1});  // the consumed word
  }
  // Runs until done or maxPolls polls, the clock at nowNs; true when the launch finished.
  bool run(RunState& st, uint64_t nowNs, int maxPolls = 1000) {
    auto copy = [this](const Step& s) { copies.push_back(static_cast<int>(s.value)); };
    auto ringCopy = [](char*, const char*, uint64_t, bool) { return true; };
    for (int i = 0; i < maxPolls; ++i)
      if (runSteps(block, headerOf(block)->steps, st, nowNs, copy, ringCopy)) return true;
    return false;
  }
  uint32_t consumed() const { return reinterpret_cast<const Header*>(block)->consumed; }
  uint32_t failed() const { return reinterpret_cast<const Header*>(block)->failed; }
  static uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }
};

TEST(OpProgram, WaitsEndOnlyWhenTheirWordsArrive) {
  Program p;
  p.push(5, 9);
  RunState st;
  EXPECT_FALSE(p.run(st, 0));
  EXPECT_EQ(p.myReady, 0u) << "nothing is posted before GO";
  p.go = 5;
  EXPECT_FALSE(p.run(st, 0));
  EXPECT_EQ(p.myReady, 9u);
  EXPECT_TRUE(p.copies.empty()) << "copies A wait for the peer's ready";
  p.peerReady = 9;
  EXPECT_FALSE(p.run(st, 0));
  EXPECT_EQ(p.copies, std::vector<int>{1});
  EXPECT_EQ(p.myDone, 9u);
  EXPECT_EQ(p.consumed(), 0u);
  p.peerDone = 10;  // past the value counts as reached
  EXPECT_TRUE(p.run(st, 0));
  EXPECT_EQ(p.copies, (std::vector<int>{1, 2}));
  EXPECT_EQ(p.consumed(), 1u);
  EXPECT_EQ(p.failed(), 0u);
  EXPECT_EQ(p.bases, 2u);
}

// The counters wrap: a value of 2 reaches a wait for 0xfffffffe.
TEST(OpProgram, CountersThatWrapStillReachTheirValue) {
  Program p;
  p.push(1, 0xfffffffeu);
  p.go = 1;
  p.peerReady = 2;
  p.peerDone = 0xffffffffu;
  RunState st;
  EXPECT_TRUE(p.run(st, 0));
  EXPECT_EQ(p.copies, (std::vector<int>{1, 2}));
}

// The abort word ends every wait of the program, whichever it is stuck at; from then on nothing is
// copied or posted but the consumed word, and the pull's bases word is cleared.
TEST(OpProgram, AbortIsHonouredAtEveryWait) {
  for (int stuck = 0; stuck < 3; ++stuck) {
    Program p;
    p.push(1, 1);
    p.go = stuck >= 1 ? 1 : 0;         // 0: stuck at GO
    p.peerReady = stuck >= 2 ? 1 : 0;  // 1: stuck at ready; 2: stuck at done
    RunState st;
    EXPECT_FALSE(p.run(st, 0));
    const size_t copiesBefore = p.copies.size();
    const uint32_t doneBefore = p.myDone;
    p.words.abort = 1;
    EXPECT_TRUE(p.run(st, 0, static_cast<int>(kAbortEvery) + 1)) << "stuck at wait " << stuck;
    EXPECT_EQ(p.copies.size(), copiesBefore) << "a copy ran after the abort, wait " << stuck;
    EXPECT_EQ(p.myDone, doneBefore) << "a post after the abort, wait " << stuck;
    EXPECT_EQ(p.consumed(), 1u) << "the consumed word is always written";
    EXPECT_EQ(p.failed(), 1u);
    EXPECT_EQ(p.bases, 0u) << "the pull's reading kernel must skip";
    EXPECT_EQ(p.words.timedOut, 0u) << "an abort reports no timeout";
  }
}

// A wait whose word does not move for the timeout names its peer and phase, and the operation's
// next launch (a pull's second) skips everything but its consumed word.
TEST(OpProgram, ATimeoutNamesItsPeerAndPhaseAndEndsTheNextLaunch) {
  Program p;
  p.push(1, 4);
  p.go = 1;
  p.peerReady = 4;
  RunState st;
  EXPECT_FALSE(p.run(st, 100));
  p.peerDone = 2;  // moves, below its value: the clock restarts
  EXPECT_FALSE(p.run(st, 900));
  EXPECT_FALSE(p.run(st, 1800)) << "the word moved at 900: no timeout yet";
  EXPECT_TRUE(p.run(st, 2000));
  EXPECT_EQ(p.words.timedOut, 4u) << "peer 3, plus one";
  EXPECT_EQ(p.words.phase, static_cast<uint32_t>(kPhaseDone));
  EXPECT_EQ(p.words.abort, 1u);
  EXPECT_EQ(p.copies, std::vector<int>{1});
  RunState again;  // a later launch of the same block
  again.pc = 0;
  p.peerDone = 4;
  EXPECT_TRUE(p.run(again, 2000));
  EXPECT_EQ(p.copies, std::vector<int>{1}) << "a failed operation copies nothing more";
}

// A replay runs the same block again: its waits, posts and copies repeat, and a captured
// operation's semaphores are cleared by the posts after their barrier.
TEST(OpProgram, AReplayRunsTheSameProgramAgain) {
  Program p;
  p.add({kStepWait, 1, 7, kPhaseGo, Program::addr(&p.go), 0, 0});
  p.add({kStepBarrier, 0, 0, 0, 0, 0, 0});
  p.add({kStepPost, 1, 0, 0, Program::addr(&p.myReady), 0, 0});
  p.add({kStepWait, 1, 3, kPhaseReady, Program::addr(&p.peerReady), 0, 0});
  p.add({kStepBarrier, 0, 1, 0, 0, 0, 0});
  p.add({kStepPost, 0, 0, 0, Program::addr(&p.peerReady), 0, 0});  // the semaphore cleared
  p.add({kStepCopy, 3, 0, 0, 0, 0, 0});
  p.go = 1;
  for (int replay = 0; replay < 3; ++replay) {
    RunState st;
    EXPECT_FALSE(p.run(st, 0));
    EXPECT_EQ(p.myReady, 1u);
    p.myReady = 0;    // the peer consumed its semaphore
    p.peerReady = 1;  // and posted its own
    EXPECT_TRUE(p.run(st, 0));
    EXPECT_EQ(p.peerReady, 0u) << "replay " << replay;
    EXPECT_EQ(p.copies.size(), static_cast<size_t>(replay + 1));
  }
}

}  // namespace
