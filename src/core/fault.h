// Fault injection (debug only): FUSCO_FAULT makes one rank crash, stall, drop its connections, send
// a corrupt call header or run out of memory in the middle of a call at a named phase, so tests can
// check that every other rank fails promptly with a message naming that rank and the operation.
//
// Grammar (several specs separated by ';'; fields after the phase in any order):
//   FUSCO_FAULT = spec (';' spec)*
//   spec        = action ':' phase ':' 'rank=' R [':after=' N] [':ms=' M] [':ops=' K]
//   action      = kill | stall | drop-connection | corrupt-header | oom
//   phase       = bootstrap | plan | dispatch | combine | alltoall
// A spec fires on communicator rank R the N-th time (default 1) that rank reaches the phase since
// its communicator was created, once. kill raises SIGKILL (a crash). stall sleeps M ms (default
// 600000: the process stays alive and silent, so its peers must time out), then goes on.
// drop-connection aborts every transport connection of the rank (peers see "aborted: fault
// injected ...") and fails the rank's own call; at bootstrap it fails init, which closes the
// bootstrap sockets. corrupt-header garbles every call header the rank sends in that API call
// (engine phases only). oom makes the rank's call run out of host memory (std::bad_alloc) once it
// has run K engine operations (default 1; 0: before the first), as a real shortage between the
// rounds of a multi-operation call would (engine phases only). A malformed spec (unknown
// action/phase, missing rank, bad number, corrupt-header or oom at bootstrap) is logged at WARN and
// ignored; the other specs still apply.
//
// With FUSCO_FAULT unset a fault point costs one relaxed atomic load.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fusco.h"

namespace fusco {

enum class FaultPhase : int { Bootstrap = 0, Plan, Dispatch, Combine, AllToAll, Count };
enum class FaultAction : int { Kill = 0, Stall, DropConnection, CorruptHeader, Oom };

struct FaultSpec {
  FaultAction action = FaultAction::Kill;
  FaultPhase phase = FaultPhase::Bootstrap;
  int rank = -1;
  int64_t after = 1;    // fire at the after-th arrival at the phase
  int64_t ms = 600000;  // stall length
  int64_t ops = 1;      // oom: engine operations the call runs first
};

// "bootstrap", "plan", ... / "kill", "stall", ...
const char* faultPhaseName(FaultPhase p);
const char* faultActionName(FaultAction a);

// Parses a whole FUSCO_FAULT value. Good specs go to *out; each malformed one adds a line to
// *errors (and is left out). Returns true when every spec was well formed.
bool faultParse(const std::string& value, std::vector<FaultSpec>* out, std::string* errors);

// Reads FUSCO_FAULT (from the params registry), logs malformed specs at WARN, arms the specs
// and resets the per-phase counters. Called once per communicator init.
void faultConfigure();

// What a fault point can do to its caller: drop this rank's connections (may be empty: then a
// drop-connection fault only fails the call, and the caller's cleanup closes the connections).
struct FaultCtx {
  std::function<void(const char* reason)> dropConnections;
};

namespace detail {
extern std::atomic<bool> gFaultArmed;
fuscoResult_t faultFire(FaultPhase phase, int rank, const FaultCtx* ctx);
}  // namespace detail

// Called by the library at each phase entry. Returns fuscoSuccess unless an injected fault made
// this rank's call fail (drop-connection); kill does not return.
inline fuscoResult_t faultPoint(FaultPhase phase, int rank) {
  if (!detail::gFaultArmed.load(std::memory_order_relaxed)) return fuscoSuccess;
  return detail::faultFire(phase, rank, nullptr);
}

// Same, with the drop action given as a callable (only built when faults are armed).
template <typename Drop>
inline fuscoResult_t faultPoint(FaultPhase phase, int rank, Drop&& drop) {
  if (!detail::gFaultArmed.load(std::memory_order_relaxed)) return fuscoSuccess;
  FaultCtx ctx{std::function<void(const char*)>(std::forward<Drop>(drop))};
  return detail::faultFire(phase, rank, &ctx);
}

namespace detail {
bool corruptHeadersNow();
bool oomNow(int64_t opsDone);
}  // namespace detail

// Engine hook: true while the current API call on this thread must send corrupt call headers.
inline bool faultCorruptHeaders() {
  return detail::gFaultArmed.load(std::memory_order_relaxed) && detail::corruptHeadersNow();
}
// Engine hook, at the start of each operation of an API call (opsDone: operations the call ran so
// far): true once, when an oom fault of this call is due; the caller then throws std::bad_alloc.
inline bool faultOomNow(size_t opsDone) {
  return detail::gFaultArmed.load(std::memory_order_relaxed) &&
         detail::oomNow(static_cast<int64_t>(opsDone));
}
// Overwrites an encoded call header (len bytes at buf) with garbage that fails decoding.
void faultCorruptBytes(void* buf, size_t len);

}  // namespace fusco
