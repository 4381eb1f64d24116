#include "core/fault.h"

#include <signal.h>
#include <time.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/log.h"
#include "core/params.h"
#include "core/result.h"

namespace fusco {

namespace detail {
std::atomic<bool> gFaultArmed{false};
}  // namespace detail

namespace {

const char* const kPhaseNames[] = {"bootstrap", "plan", "dispatch", "combine", "alltoall"};
const char* const kActionNames[] = {"kill", "stall", "drop-connection", "corrupt-header", "oom"};
constexpr int kNumActions = sizeof(kActionNames) / sizeof(kActionNames[0]);
constexpr int kNumPhases = static_cast<int>(FaultPhase::Count);

struct Armed {
  FaultSpec spec;
  bool fired = false;
};

struct FaultState {
  std::mutex mu;
  std::vector<Armed> specs;
  int64_t arrivals[kNumPhases] = {};
};

FaultState& state() {
  static FaultState* s = new FaultState();  // never destroyed: fault points may run at exit
  return *s;
}

// Set by a corrupt-header fault for the rest of the API call on this thread; every fault point
// (the start of the next call) clears it.
thread_local bool tCorruptHeaders = false;
// Set by an oom fault for the rest of the API call on this thread: the engine operations the call
// runs before it runs out of memory (-1: none armed).
thread_local int64_t tOomAfterOps = -1;

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  for (;;) {
    size_t at = s.find(sep, pos);
    out.push_back(trim(s.substr(pos, at == std::string::npos ? std::string::npos : at - pos)));
    if (at == std::string::npos) return out;
    pos = at + 1;
  }
}

bool parseNumber(const std::string& s, int64_t min, int64_t* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long x = strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end == s.c_str() || *end != '\0' || x < min) return false;
  *v = x;
  return true;
}

template <size_t N>
int lookup(const char* const (&names)[N], const std::string& s) {
  for (size_t i = 0; i < N; ++i)
    if (s == names[i]) return static_cast<int>(i);
  return -1;
}

bool fail(std::string* why, const std::string& msg) {
  *why = msg;
  return false;
}

// One spec "action:phase:rank=R[:after=N][:ms=M]"; *why says what is wrong when it returns false.
bool parseSpec(const std::string& text, FaultSpec* spec, std::string* why) {
  std::vector<std::string> f = split(text, ':');
  if (f.size() < 3) return fail(why, "expected action:phase:rank=R");
  int a = lookup(kActionNames, f[0]);
  if (a < 0)
    return fail(
        why, "unknown action '" + f[0] + "' (kill, stall, drop-connection, corrupt-header, oom)");
  int p = lookup(kPhaseNames, f[1]);
  if (p < 0)
    return fail(why, "unknown phase '" + f[1] + "' (bootstrap, plan, dispatch, combine, alltoall)");
  spec->action = static_cast<FaultAction>(a);
  spec->phase = static_cast<FaultPhase>(p);
  bool haveRank = false;
  for (size_t i = 2; i < f.size(); ++i) {
    size_t eq = f[i].find('=');
    std::string key = eq == std::string::npos ? f[i] : f[i].substr(0, eq);
    std::string val = eq == std::string::npos ? std::string() : f[i].substr(eq + 1);
    int64_t v = 0;
    if (key == "rank" && parseNumber(val, 0, &v) && v <= INT32_MAX) {
      spec->rank = static_cast<int>(v);
      haveRank = true;
    } else if (key == "after" && parseNumber(val, 1, &v)) {
      spec->after = v;
    } else if (key == "ms" && parseNumber(val, 0, &v)) {
      spec->ms = v;
    } else if (key == "ops" && parseNumber(val, 0, &v)) {
      spec->ops = v;
    } else {
      return fail(why, "bad field '" + f[i] + "' (rank=R, after=N >= 1, ms=M >= 0, ops=K >= 0)");
    }
  }
  if (!haveRank) return fail(why, "missing rank=R");
  if ((spec->action == FaultAction::CorruptHeader || spec->action == FaultAction::Oom) &&
      spec->phase == FaultPhase::Bootstrap)
    return fail(why, f[0] + " applies to engine phases only, not bootstrap");
  return true;
}

// Sleeps ms milliseconds, resuming after signals.
void stallFor(int64_t ms) {
  timespec ts{static_cast<time_t>(ms / 1000), static_cast<long>((ms % 1000) * 1000000)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

fuscoResult_t apply(const FaultSpec& s, int rank, const FaultCtx* ctx) {
  const char* phase = faultPhaseName(s.phase);
  switch (s.action) {
    case FaultAction::Kill:
      FUSCO_WARN(kInit, "fault injected: kill on rank %d at phase %s", rank, phase);
      raise(SIGKILL);  // the one deliberate way out of the library: a simulated crash
      return fuscoSuccess;
    case FaultAction::Stall:
      FUSCO_WARN(kInit, "fault injected: stall of %lld ms on rank %d at phase %s",
                 static_cast<long long>(s.ms), rank, phase);
      stallFor(s.ms);
      return fuscoSuccess;
    case FaultAction::CorruptHeader:
      FUSCO_WARN(kInit, "fault injected: corrupt-header on rank %d at phase %s", rank, phase);
      tCorruptHeaders = true;
      return fuscoSuccess;
    case FaultAction::Oom:
      FUSCO_WARN(kInit, "fault injected: oom after %lld operations on rank %d at phase %s",
                 static_cast<long long>(s.ops), rank, phase);
      tOomAfterOps = s.ops;
      return fuscoSuccess;
    case FaultAction::DropConnection: {
      std::string reason =
          "fault injected: drop-connection on rank " + std::to_string(rank) + " at phase " + phase;
      if (ctx != nullptr && ctx->dropConnections) ctx->dropConnections(reason.c_str());
      return FUSCO_FAIL(fuscoSystemError, kInit, "phase %s: %s", phase, reason.c_str());
    }
  }
  return fuscoSuccess;
}

}  // namespace

FUSCO_PARAM_STRING(
    Fault, "FUSCO_FAULT", "",
    "debug: inject faults, e.g. kill:dispatch:rank=2[:after=N][:ms=M]; ';' separates "
    "specs (core/fault.h)");

const char* faultPhaseName(FaultPhase p) {
  int i = static_cast<int>(p);
  return i >= 0 && i < kNumPhases ? kPhaseNames[i] : "?";
}

const char* faultActionName(FaultAction a) {
  int i = static_cast<int>(a);
  return i >= 0 && i < kNumActions ? kActionNames[i] : "?";
}

bool faultParse(const std::string& value, std::vector<FaultSpec>* out, std::string* errors) {
  bool ok = true;
  for (const std::string& text : split(value, ';')) {
    if (text.empty()) continue;
    FaultSpec spec;
    std::string why;
    if (parseSpec(text, &spec, &why)) {
      out->push_back(spec);
    } else {
      ok = false;
      *errors += (errors->empty() ? "" : "; ") + std::string("'") + text + "': " + why;
    }
  }
  return ok;
}

void faultConfigure() {
  const std::string value = paramFault();
  FaultState& st = state();
  std::lock_guard<std::mutex> g(st.mu);
  st.specs.clear();
  for (auto& a : st.arrivals) a = 0;
  std::vector<FaultSpec> specs;
  std::string errors;
  if (!value.empty() && !faultParse(value, &specs, &errors))
    FUSCO_WARN(kInit, "FUSCO_FAULT: ignoring malformed spec(s): %s", errors.c_str());
  for (const auto& s : specs) {
    st.specs.push_back(Armed{s, false});
    FUSCO_INFO(kInit, "FUSCO_FAULT armed: %s at phase %s on rank %d (arrival %lld)",
               faultActionName(s.action), faultPhaseName(s.phase), s.rank,
               static_cast<long long>(s.after));
  }
  detail::gFaultArmed.store(!st.specs.empty(), std::memory_order_relaxed);
}

namespace detail {

fuscoResult_t faultFire(FaultPhase phase, int rank, const FaultCtx* ctx) {
  tCorruptHeaders = false;
  tOomAfterOps = -1;
  const int p = static_cast<int>(phase);
  if (p < 0 || p >= kNumPhases) return fuscoSuccess;
  std::vector<FaultSpec> due;
  {
    FaultState& st = state();
    std::lock_guard<std::mutex> g(st.mu);
    const int64_t n = ++st.arrivals[p];
    for (auto& a : st.specs) {
      if (a.fired || a.spec.phase != phase || a.spec.rank != rank || a.spec.after != n) continue;
      a.fired = true;
      due.push_back(a.spec);
    }
  }
  for (const auto& s : due) FUSCO_CHECK(apply(s, rank, ctx));
  return fuscoSuccess;
}

bool corruptHeadersNow() { return tCorruptHeaders; }

bool oomNow(int64_t opsDone) {
  if (tOomAfterOps != opsDone) return false;
  tOomAfterOps = -1;
  return true;
}

}  // namespace detail

void faultCorruptBytes(void* buf, size_t len) {
  // A wrong magic first (so decoding fails at once), then a fixed garbage pattern.
  unsigned char* b = static_cast<unsigned char*>(buf);
  for (size_t i = 0; i < len; ++i) b[i] = static_cast<unsigned char>(0xA5 ^ (i * 31));
}

}  // namespace fusco
