// The workload the fault tests run in every rank (init, then rounds of plan, dispatch, combine and
// all-to-all), and the report each rank writes as it goes into memory shared with the test
// process, so the parent can compare every rank's outcome of every step after runRanks (even for
// a rank that was killed or hung: its last step stays "in progress").
#pragma once

#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "fusco.h"
#include "harness/mp_harness.h"

namespace fusco::hardening {

using fusco::test::namesRank;

enum Step : int { kInit = 0, kPlan, kDispatch, kCombine, kAllToAll };
constexpr int kMaxSteps = 32;
constexpr int kInProgress = -1;  // result of a step whose call never returned

inline const char* stepName(int s) {
  static const char* const names[] = {"bootstrap", "plan", "dispatch", "combine", "alltoall"};
  return s >= 0 && s <= kAllToAll ? names[s] : "?";
}

// What a survivor's message must mention for a failure in step s: the operation or phase.
inline const char* stepToken(int s) {
  static const char* const tokens[] = {"bootstrap", "fuscoMoePlan", "fuscoMoeDispatch",
                                       "fuscoMoeCombine", "fuscoAllToAll"};
  return s >= 0 && s <= kAllToAll ? tokens[s] : "?";
}

// The step sequence of a run with `rounds` rounds: init, then plan/dispatch/combine/alltoall.
inline std::vector<int> stepSequence(int rounds) {
  std::vector<int> seq{kInit};
  for (int r = 0; r < rounds; ++r)
    for (int s : {kPlan, kDispatch, kCombine, kAllToAll}) seq.push_back(s);
  return seq;
}

// Index in stepSequence(rounds) of the after-th step of kind s, or -1 (never reached).
inline int faultStepIndex(int rounds, int s, int after) {
  std::vector<int> seq = stepSequence(rounds);
  for (size_t i = 0; i < seq.size(); ++i)
    if (seq[i] == s && --after == 0) return static_cast<int>(i);
  return -1;
}

struct RankReport {
  int nsteps;             // steps started
  int result[kMaxSteps];  // fuscoResult_t, or kInProgress
  double sec[kMaxSteps];  // how long the call took
  int dataBad;            // an all-to-all that succeeded delivered wrong bytes
  int destroyed;          // fuscoCommDestroy returned success (after the run)
  double destroySec;
  char msg[768];  // last error of the first failed step
};

// Reports of n ranks in anonymous shared memory (inherited by the forked ranks).
class SharedReports {
 public:
  explicit SharedReports(int n) : n_(n) {
    bytes_ = sizeof(RankReport) * static_cast<size_t>(n);
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    rep_ = p == MAP_FAILED ? nullptr : static_cast<RankReport*>(p);
    if (rep_ != nullptr) memset(rep_, 0, bytes_);
  }
  ~SharedReports() {
    if (rep_ != nullptr) munmap(rep_, bytes_);
  }
  SharedReports(const SharedReports&) = delete;
  SharedReports& operator=(const SharedReports&) = delete;
  bool ok() const { return rep_ != nullptr; }
  RankReport& operator[](int r) { return rep_[r]; }

 private:
  int n_;
  size_t bytes_ = 0;
  RankReport* rep_ = nullptr;
};

// "rank 2", "peer 2", "rank(s) 1,2": the message names rank r.
inline bool isFaultError(int r) { return r == fuscoRemoteError || r == fuscoTimeout; }

// Child processes of this process that still exist (a fault test must leave none behind).
inline int livingChildren() {
  int n = 0;
  const pid_t me = getpid();
  DIR* d = opendir("/proc");
  if (d == nullptr) return 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string path = std::string("/proc/") + e->d_name + "/stat";
    FILE* f = fopen(path.c_str(), "r");
    if (f == nullptr) continue;
    char buf[512] = {0};
    size_t len = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[len] = '\0';
    const char* close = strrchr(buf, ')');  // the command name may hold spaces
    int ppid = 0;
    char state = 0;
    if (close != nullptr && sscanf(close + 1, " %c %d", &state, &ppid) == 2 && ppid == me) ++n;
  }
  closedir(d);
  return n;
}

namespace detail {

struct Moe {
  static constexpr size_t kTokens = 24, kHidden = 16, kRowBytes = kHidden * sizeof(float);
  static constexpr int kTopk = 2;
  std::vector<int64_t> topk;
  std::vector<float> x, recv, out;
  fuscoMoeHandle_t h = nullptr;
};

inline void recordStart(RankReport* rep) {
  rep->result[rep->nsteps] = kInProgress;
  rep->sec[rep->nsteps] = 0;
  ++rep->nsteps;
}

// Records the end of the current step; false (and the message) when it failed.
inline bool recordEnd(RankReport* rep, fuscoResult_t r, double t0, const char* lastError) {
  rep->result[rep->nsteps - 1] = r;
  rep->sec[rep->nsteps - 1] = test::nowSec() - t0;
  if (r == fuscoSuccess) return true;
  snprintf(rep->msg, sizeof(rep->msg), "%s", lastError ? lastError : "");
  return false;
}

inline fuscoResult_t allToAllChecked(fuscoComm_t comm, int rank, int n, int round, int* bad) {
  const size_t count = 64;
  std::vector<int32_t> send(n * count), recv(n * count, -1);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < count; ++i)
      send[p * count + i] = (round * 1000 + rank * 100 + p) * 64 + i;
  fuscoResult_t r = fuscoAllToAll(send.data(), recv.data(), count, fuscoInt32, comm, nullptr);
  if (r != fuscoSuccess) return r;
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < count; ++i)
      if (recv[p * count + i] != static_cast<int32_t>((round * 1000 + p * 100 + rank) * 64 + i))
        *bad = 1;
  return r;
}

// One MoE step (plan, dispatch or combine) on m.
inline fuscoResult_t moeStep(fuscoComm_t comm, int step, int rank, int n, int round, Moe& m) {
  if (step == kPlan) {
    std::mt19937_64 rng(static_cast<uint64_t>(round) * 131 + rank);
    const int experts = 2 * n;
    m.topk.resize(Moe::kTokens * Moe::kTopk);
    for (size_t t = 0; t < Moe::kTokens; ++t) {
      int e0 = static_cast<int>(rng() % experts), e1 = static_cast<int>(rng() % (experts - 1));
      m.topk[t * 2] = e0;
      m.topk[t * 2 + 1] = e1 >= e0 ? e1 + 1 : e1;  // two distinct experts
    }
    fuscoMoeConfig_t cfg = FUSCO_MOE_CONFIG_INITIALIZER;
    cfg.numExperts = experts;
    return fuscoMoePlan(&m.h, comm, &cfg, m.topk.data(), Moe::kTokens, Moe::kTopk, nullptr);
  }
  if (step == kDispatch) {
    size_t rows = 0;
    fuscoMoeGetRecvCounts(m.h, &rows, nullptr);
    m.x.assign(Moe::kTokens * Moe::kHidden, 1.0f + rank);
    m.recv.assign((rows ? rows : 1) * Moe::kHidden, 0.0f);
    return fuscoMoeDispatch(m.h, m.x.data(), Moe::kRowBytes, m.recv.data(), nullptr);
  }
  m.out.assign(Moe::kTokens * Moe::kHidden, 0.0f);
  return fuscoMoeCombine(m.h, m.recv.data(), fuscoFloat32, Moe::kHidden, nullptr, m.out.data(),
                         nullptr);
}

}  // namespace detail

// Runs init and `rounds` rounds in this rank, recording every step in *rep; stops at the first
// failure, then destroys the communicator (which must succeed promptly even after a peer died).
inline void runWorkload(const test::RankCtx& ctx, int timeoutMs, int rounds, RankReport* rep) {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = timeoutMs;
  fuscoComm_t comm = nullptr;
  detail::recordStart(rep);
  double t0 = test::nowSec();
  fuscoResult_t r = fuscoCommInitRankConfig(&comm, ctx.nranks, ctx.id, ctx.rank, &cfg);
  if (!detail::recordEnd(rep, r, t0, fuscoGetLastError(nullptr))) {
    rep->destroyed = comm == nullptr;  // a failed init must leave nothing to destroy
    return;
  }
  detail::Moe m;
  bool ok = true;
  for (int round = 0; round < rounds && ok; ++round) {
    for (int step : {kPlan, kDispatch, kCombine, kAllToAll}) {
      detail::recordStart(rep);
      t0 = test::nowSec();
      r = step == kAllToAll
              ? detail::allToAllChecked(comm, ctx.rank, ctx.nranks, round, &rep->dataBad)
              : detail::moeStep(comm, step, ctx.rank, ctx.nranks, round, m);
      if (!(ok = detail::recordEnd(rep, r, t0, fuscoGetLastError(comm)))) break;
    }
    if (m.h != nullptr) fuscoMoeHandleDestroy(m.h);
    m.h = nullptr;
  }
  t0 = test::nowSec();
  rep->destroyed = fuscoCommDestroy(comm) == fuscoSuccess;
  rep->destroySec = test::nowSec() - t0;
}

}  // namespace fusco::hardening
