// One enqueued operation as a short program its kernel runs (docs/DESIGN.md, "Stream-ordered CUDA
// calls"), written once (FUSCO_HD) for the CUDA kernel (op_kernel.cu), the kernel's twin on the
// twin CUDA runtime and the host twin of the stream. The program lies in the operation's pinned
// parameter block, after its header:
//   wait GO -> post "ready" to every involved peer -> wait for theirs -> copy batches A ->
//   ring step (chan_roles.h) -> post "done" -> wait for theirs -> copy batches B -> consumed,
// (a pull operation runs its reading kernel between two launches of its program). A wait polls a
// word in mapped memory inside the kernel (op_steps.h): no stream holds a wait the host must
// release, so a late peer holds up no other stream's work (the kernel runs; nothing of it heads a
// hardware queue). Every wait gives up when the abort word is set (a dead peer, an abort, a
// broken comm) or when its word did not move for the timeout; from then on the operation touches
// no peer's memory and posts nothing, and only its consumed word is still written.
#pragma once

#include <cstdint>

#include "device/chan_roles.h"
#include "device/op_steps.h"

namespace fusco {
namespace op {

enum StepKind : uint32_t {
  kStepWait = 1,     // until (int32)(*word - value) >= 0
  kStepBarrier = 2,  // every block arrives; the last one runs the posts that follow
  kStepPost = 3,     // *word = value (by the last block past the barrier before it)
  kStepCopy = 4,     // value batches of copy tasks at addr (device_ops.h)
  kStepRings = 5,    // the ring roles at addr (chan_roles.h), all stepped until every one finished
};

// One step (32 bytes).
struct Step {
  uint32_t kind;
  uint32_t value;  // wait: the value awaited; post: the value written; copy: the batches
  uint32_t peer;   // wait: the rank that advances the word (a timeout names it); barrier: its
                   // counter (Header::arrived)
  uint32_t phase;  // wait: its Phase
  uint64_t addr;   // wait, post: the 32-bit word; copy: the batches
  uint32_t pad;
  uint32_t always;  // post: written even after a wait gave up (the consumed word)
};
static_assert(sizeof(Step) == 32, "a step is 32 bytes");

constexpr uint32_t kBarriers = 6;  // barriers per program at most

// The operation's header: the first 64 bytes of its block (kParamHeader).
struct Header {
  uint32_t consumed;   // set by the consumed step; the parameter ring reclaims the block
  uint32_t steps;      // steps after the header
  uint32_t failed;     // a wait of this operation gave up
  uint64_t words;      // the queue's OpWords (abort, timeout report), mapped
  uint64_t timeoutNs;  // a wait's bound without progress
  uint64_t failWord;   // a 32-bit word cleared when a wait gives up (a pull's bases word), or 0
  uint32_t arrived[kBarriers];  // per barrier: blocks that reached it (the last one resets it)
};
static_assert(sizeof(Header) == 64, "the header is the block's first 64 bytes");

FUSCO_HD inline Header* headerOf(char* block) { return reinterpret_cast<Header*>(block); }
FUSCO_HD inline Step* stepsOf(char* block) {
  return reinterpret_cast<Step*>(block + sizeof(Header));
}

FUSCO_HD inline bool seqReached32(uint32_t v, uint32_t want) {
  return static_cast<int32_t>(v - want) >= 0;
}

// One poll of a wait step: pollWait (op_steps.h) on a 32-bit word that counts with wrap-around.
FUSCO_HD inline WaitStatus pollStep(Wait& w, const Step& s, OpWords* words, uint64_t nowNs,
                                    uint64_t timeoutNs) {
  const uint32_t* word = reinterpret_cast<const uint32_t*>(s.addr);
  const uint32_t v = loadWord(word);
  if (seqReached32(v, s.value)) {
    fenceSystem();  // what the peer wrote before its post is read after it
    return kReady;
  }
  return pollPending(w, v, words, nowNs, timeoutNs, s.peer, s.phase);
}

// A wait gave up: every later launch of the operation skips its steps, and a pull's reading
// kernel finds its bases word cleared.
FUSCO_HD inline void markFailed(Header* h) {
  storeWord(&h->failed, 1);
  const uint64_t failWord = *reinterpret_cast<volatile uint64_t*>(&h->failWord);
  if (failWord != 0) storeWord(reinterpret_cast<uint32_t*>(failWord), 0);
  fenceSystem();
}

// A post step (by the one thread that runs the posts after a barrier): skipped once a wait gave
// up, unless it is the consumed word.
FUSCO_HD inline void postStep(Header* h, const Step& s) {
  if (s.always == 0 && loadWord(&h->failed) != 0) return;
  fenceSystem();  // the copies before it are visible first
  storeWord(reinterpret_cast<uint32_t*>(s.addr), s.value);
}

// Where one executor (the kernel's twin, the host twin's stream) stands in a launch.
struct RunState {
  uint32_t pc = 0;  // the next step
  Wait w{};         // the pending wait's state
  chan::RolesState roles;
  bool gaveUp = false;
};

// A ring step on one executor: false while a role waits (st keeps its place).
template <class RingCopy>
FUSCO_HD inline bool ringStep(Header* h, const Step& s, RunState& st, uint64_t nowNs,
                              const RingCopy& ringCopy) {
  char* table = reinterpret_cast<char*>(s.addr);
  const uint32_t n = reinterpret_cast<chan::RoleTable*>(table)->count;
  auto* words = reinterpret_cast<OpWords*>(h->words);
  const WaitStatus r =
      chan::stepRoles(chan::rolesOf(table), n, st.roles, words, nowNs, h->timeoutNs, ringCopy);
  if (r == kPending) return false;
  st.roles = chan::RolesState{};
  if (r != kReady) {
    markFailed(h);
    st.gaveUp = true;
  }
  return true;
}

// Runs a launch's steps from st.pc up to `end` on one executor: false while a wait is pending
// (call again), true once the range is done. copy(step) runs a copy step; ringCopy(to, from, n,
// userSide) moves a ring role's bytes.
template <class Copy, class RingCopy>
inline bool runSteps(char* block, uint32_t end, RunState& st, uint64_t nowNs, Copy&& copy,
                     const RingCopy& ringCopy) {
  Header* h = headerOf(block);
  if (loadWord(&h->failed) != 0) st.gaveUp = true;
  for (; st.pc < end; ++st.pc) {
    const Step& s = stepsOf(block)[st.pc];
    if (s.kind == kStepPost) {
      postStep(h, s);  // one executor: it is every barrier's last block
    } else if (s.kind == kStepWait && !st.gaveUp) {
      auto* words = reinterpret_cast<OpWords*>(h->words);
      const WaitStatus r = pollStep(st.w, s, words, nowNs, h->timeoutNs);
      if (r == kPending) return false;
      st.w = Wait{};
      if (r != kReady) {
        markFailed(h);
        st.gaveUp = true;
      }
    } else if (s.kind == kStepCopy && !st.gaveUp) {
      copy(s);
    } else if (s.kind == kStepRings && !st.gaveUp) {
      if (!ringStep(h, s, st, nowNs, ringCopy)) return false;
    }
  }
  return true;
}

}  // namespace op
}  // namespace fusco
