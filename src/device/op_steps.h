// The waits of one operation kernel, written once (FUSCO_HD) for the kernel and its host twin. An
// operation waits for its peers inside itself: each wait polls a word that only grows until it
// reaches a value, never blocks (a poll returns kPending), and is bounded by two things
// (docs/DESIGN.md, "The CUDA rules"):
//   - the abort word, set by the host (a dead peer, fuscoCommAbort, a broken comm) or by another
//     wait of the same rank that timed out, read every kAbortEvery polls;
//   - the comm's timeout counted without progress: the clock restarts whenever the awaited word
//     moves, so a long transfer that keeps moving is not a hang. A wait that passes it reports its
//     peer and phase in the operation's words, then sets the abort word so every other wait of the
//     rank gives up at once.
// Time is passed in: the kernel reads %globaltimer (globalTimerNs), the twin a steady clock, and
// the unit tests a fake one.
#pragma once

#include <cstdint>

#ifndef FUSCO_HD
#if defined(__CUDACC__)
#define FUSCO_HD __host__ __device__
#else
#define FUSCO_HD
#endif
#endif

namespace fusco {
namespace op {

// Polls between two reads of the abort word (the first pending poll reads it too).
constexpr uint32_t kAbortEvery = 256;

// Words in pinned mapped memory that the host reads without synchronizing the stream.
struct OpWords {
  uint32_t abort;     // nonzero: every wait gives up; set by the host or by a timed-out wait
  uint32_t timedOut;  // peer + 1 of the first wait that passed the timeout; 0: none
  uint32_t phase;     // that wait's phase; valid once timedOut is nonzero
  uint32_t claim;     // taken by the first timed-out wait, so its peer and phase stay together
};

// What a wait waits for.
enum Phase : uint32_t {
  kPhaseGo,     // the host's go for the operation
  kPhaseReady,  // a peer's ready epoch
  kPhaseDone,   // a peer's done epoch
  kPhaseTail,   // a ring's data (the producer's tail)
  kPhaseHead,   // a ring's credit (the consumer's head)
  kPhaseSlot,   // not a wait: a ring slot of another operation (a protocol error)
  kPhases
};

enum WaitStatus : uint32_t { kReady, kPending, kAborted, kTimedOut };

// The state of one wait; zero it ({}) before the wait's first poll.
struct Wait {
  uint64_t seen;     // the word's value at the last progress
  uint64_t sinceNs;  // when the word last moved (or the first pending poll)
  uint32_t spins;    // pending polls so far
  bool started;      // a pending poll has happened
};

// The phase's name for messages (host use).
FUSCO_HD inline const char* phaseName(uint32_t phase) {
  switch (phase) {
    case kPhaseGo:
      return "go";
    case kPhaseReady:
      return "ready";
    case kPhaseDone:
      return "done";
    case kPhaseTail:
      return "ring data";
    case kPhaseHead:
      return "ring credit";
    case kPhaseSlot:
      return "a ring slot of another operation";
    default:
      return "unknown phase";
  }
}

// Release / acquire on words other ranks read and write (system scope: peers are processes).
FUSCO_HD inline uint64_t loadAcquire(const uint64_t* p) {
#if defined(__CUDA_ARCH__)
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}
FUSCO_HD inline void storeRelease(uint64_t* p, uint64_t v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}
// Orders this thread's earlier writes before its later ones for every observer (peers, host).
FUSCO_HD inline void fenceSystem() {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

// The words of OpWords: read without ordering, written visibly (callers fence where it matters).
FUSCO_HD inline uint32_t loadWord(const uint32_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const volatile uint32_t*>(p);
#else
  return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}
FUSCO_HD inline void storeWord(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<volatile uint32_t*>(p) = v;
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}
// Sets *p from 0 to 1; true for the one caller that did.
FUSCO_HD inline bool claimWord(uint32_t* p) {
#if defined(__CUDA_ARCH__)
  return atomicCAS(reinterpret_cast<unsigned int*>(p), 0u, 1u) == 0u;
#else
  uint32_t expected = 0;
  return __atomic_compare_exchange_n(p, &expected, 1u, false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
#endif
}

#if defined(__CUDACC__)
__device__ inline uint64_t globalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif

// A wait that passed the timeout: the first one names its peer and phase (the phase before the
// peer, as the host reads them in the other order), then every wait of the rank gives up.
FUSCO_HD inline void reportTimeout(OpWords* words, uint32_t peer, uint32_t phase) {
  if (claimWord(&words->claim)) {
    storeWord(&words->phase, phase);
    fenceSystem();
    storeWord(&words->timedOut, peer + 1);
  }
  fenceSystem();
  storeWord(&words->abort, 1);
}

// The rules of a wait whose word has not reached its value (v: the word's value now): the abort
// word every kAbortEvery polls, the clock restarted whenever v moves, the timeout reported.
FUSCO_HD inline WaitStatus pollPending(Wait& w, uint64_t v, OpWords* words, uint64_t nowNs,
                                       uint64_t timeoutNs, uint32_t peer, uint32_t phase) {
  if (w.spins++ % kAbortEvery == 0 && loadWord(&words->abort) != 0) return kAborted;
  if (!w.started || v != w.seen) {
    w.started = true;
    w.seen = v;
    w.sinceNs = nowNs;
    return kPending;
  }
  if (nowNs <= w.sinceNs || nowNs - w.sinceNs <= timeoutNs) return kPending;
  reportTimeout(words, peer, phase);
  return kTimedOut;
}

// One poll of a wait for *word >= want (another rank, or the host, advances the word).
//   [in,out] w: the wait's state, zeroed before its first poll
//   [in,out] words: the operation's words (never null): the abort word is read, a timeout written
//   [in] nowNs: the caller's clock; timeoutNs: the bound without progress
//   [in] peer, phase: what a timeout reports
// Returns kReady once the word reached want, kAborted when the abort word is set, kTimedOut when
// the word did not move for more than timeoutNs (reported in words), else kPending.
FUSCO_HD inline WaitStatus pollWait(Wait& w, const uint64_t* word, uint64_t want, OpWords* words,
                                    uint64_t nowNs, uint64_t timeoutNs, uint32_t peer,
                                    uint32_t phase) {
  const uint64_t v = loadAcquire(word);
  if (v >= want) return kReady;
  return pollPending(w, v, words, nowNs, timeoutNs, peer, phase);
}

// Polls until the wait ends (anything but kPending). now() is the caller's clock in ns: a kernel's
// globalTimerNs, or a host clock that may yield the thread (the pragma lets CUDA files pass one).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Clock>
FUSCO_HD inline WaitStatus waitFor(const uint64_t* word, uint64_t want, OpWords* words, Clock&& now,
                                   uint64_t timeoutNs, uint32_t peer, uint32_t phase) {
  Wait w{};
  for (;;) {
    const WaitStatus s = pollWait(w, word, want, words, now(), timeoutNs, peer, phase);
    if (s != kPending) return s;
  }
}

}  // namespace op
}  // namespace fusco
