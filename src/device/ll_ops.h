// The low-latency path's executors (ll_steps.h): the buffer's layout, the host twin of its
// kernels, and the kernels. No CUDA headers here; without the CUDA toolkit in the build the
// kernel launcher returns fuscoInvalidUsage and the twin still works.
#pragma once

#include <atomic>
#include <cstdint>

#include "device/ll_steps.h"
#include "fusco.h"

namespace fusco {
namespace ll {

// The name of a phase, for messages.
inline const char* phaseName(uint32_t p) {
  static constexpr const char* kNames[kPhases] = {"dispatch send", "dispatch receive",
                                                  "combine send", "combine receive"};
  return p < kPhases ? kNames[p] : "phase";
}

// The layout of one rank's buffer for dims d (offsets 256-byte aligned).
Layout layoutFor(const Dims& d);

// Phases of one run, as a mask of 1u << Phase; a run does its send phase before its receive one.
constexpr uint32_t bit(Phase p) { return 1u << p; }

// How the twin waits for a peer's word: check(ctx, peer) is fuscoSuccess while the peer lives
// (looked at every livenessMs); past timeoutMs without the word the run fails with fuscoTimeout.
struct HostWait {
  fuscoResult_t (*check)(void* ctx, int peer) = nullptr;
  void* ctx = nullptr;
  int64_t timeoutMs = 0;
  int64_t livenessMs = 0;
  const std::atomic<bool>* abort = nullptr;  // fuscoCommAbort's flag: a raised flag ends the wait
};

// Host twin: the phases of `phases` over host memory on the calling thread, the kernels' steps in
// order. A failed wait returns its error (naming the peer); a.host->bad reports an invalid id.
fuscoResult_t hostRun(const Args& a, uint32_t phases, const HostWait& w);

// The kernels on `stream` (a cudaStream_t): one cooperative kernel for the phases of the mask.
// a.peers is a device array; a.host is the device address of mapped pinned memory.
fuscoResult_t deviceRun(const Args& a, uint32_t phases, void* stream);

}  // namespace ll
}  // namespace fusco
