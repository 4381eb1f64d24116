// moe_perf --ll on (moe_perf_ll.h): setup, the measured calls, the interleaved timed loop and the
// summary every rank agrees on. The first calls and the checks are in moe_perf_ll_check.cc, the
// report in moe_perf_ll_report.cc, the host and CUDA spaces in moe_perf_ll_space.cc.
#include "moe_perf_ll.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cstring>

namespace fusco {
namespace perf {

namespace {

// At most INT_MAX, so an out-of-range option reaches the library as out of range, not wrapped.
int clampInt(size_t v) { return static_cast<int>(std::min<size_t>(v, INT_MAX)); }

const char* const kPhaseNames[kLlPhases] = {"plan", "dispatch", "combine"};

}  // namespace

const char* const kLlRowNames[kLlRows] = {"normal", "ll-bf16", "ll-fp8", "ll-hook"};

LlBench::~LlBench() {
  if (handle_ != nullptr) fuscoMoeHandleDestroy(handle_);
  space_.reset();  // its buffers and its data comm go before the control comm
  if (comm_ != nullptr) fuscoCommDestroy(comm_);
  if (json_ != nullptr) fclose(json_);
}

// r of a call on comm (nullptr: the data comm, or the control comm before the space exists).
bool LlBench::ok(fuscoResult_t r, const char* what, fuscoComm_t comm) {
  if (r == fuscoSuccess) return true;
  fuscoComm_t c = comm != nullptr ? comm : space_ ? space_->comm() : comm_;
  fprintf(stderr, "# rank %d: %s failed: %s: %s\n", l_.rank, what, fuscoGetErrorString(r),
          fuscoGetLastError(c));
  return false;
}

bool LlBench::spaceOk(bool good, const char* what) {
  if (!good) fprintf(stderr, "# rank %d: %s: %s\n", l_.rank, what, space_->error().c_str());
  return good;
}

// Every rank learns whether every rank succeeded, so a local failure stops all ranks together.
bool LlBench::agree(bool mineOk) {
  int64_t failed = mineOk ? 0 : 1, all = 0;
  std::vector<int64_t> v(l_.nranks);
  if (allGather(comm_, l_.nranks, &failed, v.data(), 1, fuscoInt64) != fuscoSuccess) {
    fprintf(stderr, "# rank %d: fuscoAllToAll (control comm): %s\n", l_.rank,
            fuscoGetLastError(comm_));
    return false;
  }
  for (int64_t f : v) all += f;
  return all == 0;
}

bool LlBench::barrier() { return agree(true); }

// The control comm, the routing (moe_perf's generator and weights), x, the space, then the
// buffers, the low-latency buffer and the normal plan.
bool LlBench::setup() {
  if (!ok(fuscoCommInitRank(&comm_, l_.nranks, l_.id, l_.rank), "fuscoCommInitRank")) return false;
  int node = 0, numNodes = 1, localRank = 0, localSize = 1;
  if (!ok(fuscoCommNodeInfo(comm_, &node, &numNodes, &localRank, &localSize), "NodeInfo"))
    return false;
  std::vector<int> nodeOfRank(l_.nranks);
  if (!ok(allGather(comm_, l_.nranks, &node, nodeOfRank.data(), 1, fuscoInt32), "fuscoAllToAll",
          comm_))
    return false;
  if (o_.experts % l_.nranks != 0) {  // the same on every rank: all stop here
    fprintf(stderr, "# rank %d: --experts %d is not a multiple of the %d ranks\n", l_.rank,
            o_.experts, l_.nranks);
    return false;
  }
  localExperts_ = o_.experts / l_.nranks;
  cap_ = o_.tokens * l_.nranks;
  rowBytes_ = o_.hidden * 2;  // bf16
  Router(o_.routing, nodeOfRank).route(l_.rank, &topkIdx_);
  makeWeights(o_.seed, l_.rank, o_.tokens * o_.topk, &weights_);
  x_.resize(o_.tokens * rowBytes_ + 1);
  fillRows(fuscoBfloat16, o_.hidden, o_.tokens, o_.seed, l_.rank, x_.data());
  if (o_.mem == MemMode::Cuda) {
    std::string err;
    space_ = makeCudaSpace(comm_, l_.rank, l_.nranks, static_cast<BufferKind>(o_.arena), &err);
    if (!space_) {
      fprintf(stderr, "# rank %d: --mem cuda: %s\n", l_.rank, err.c_str());
      return false;
    }
  } else {
    space_ = makeHostSpace(comm_, o_.arena != 0);
  }
  active_[kLlNormal] = active_[kLlBf16] = active_[kLlHook] = true;
  active_[kLlFp8] = o_.hidden % 128 == 0;
  return allocate();
}

// The routing and x in the space, the low-latency buffer (collective), the plan, and the output
// buffers of both paths: the normal recvX / expertOut (recvRows_ rows), the low-latency expertOut
// in recvX's layout (localExperts_ x cap_ rows, zeros where no row lands) and both outs.
bool LlBench::allocate() {
  const size_t slots = o_.tokens * o_.topk, xBytes = o_.tokens * rowBytes_;
  LlSpace& s = *space_;
  const bool inputs = (dTopk_ = static_cast<int64_t*>(s.alloc(slots * sizeof(int64_t)))) &&
                      (dWeights_ = static_cast<float*>(s.alloc(slots * sizeof(float)))) &&
                      (dX_ = static_cast<char*>(s.alloc(xBytes))) &&
                      s.copy(dTopk_, topkIdx_.data(), slots * sizeof(int64_t)) &&
                      s.copy(dWeights_, weights_.data(), slots * sizeof(float)) &&
                      s.copy(dX_, x_.data(), xBytes);
  if (!agree(spaceOk(inputs, "inputs"))) return false;
  fuscoLowLatencyConfig_t cfg = FUSCO_LOW_LATENCY_CONFIG_INITIALIZER;
  cfg.maxTokensPerRank = clampInt(o_.tokens);
  cfg.hidden = clampInt(o_.hidden);
  cfg.numExperts = o_.experts;
  cfg.maxTopk = o_.topk;
  bool counted = false;
  if (!ok(fuscoLowLatencyCreate(&ll_, s.comm(), &cfg), "fuscoLowLatencyCreate") ||
      !planNormal(&counted))
    return false;
  const size_t llBytes = localExperts_ * cap_ * rowBytes_;
  const bool outputs = (dRecvX_ = static_cast<char*>(s.alloc(recvRows_ * rowBytes_))) &&
                       (dExpertOut_ = static_cast<char*>(s.alloc(recvRows_ * rowBytes_))) &&
                       (dOut_ = static_cast<char*>(s.alloc(xBytes))) &&
                       (dLlExpertOut_ = static_cast<char*>(s.alloc(llBytes))) &&
                       (dLlOut_ = static_cast<char*>(s.alloc(xBytes))) &&
                       s.fill(dLlExpertOut_, 0, llBytes);
  return agree(spaceOk(outputs, "output buffers") && counted);
}

// The normal path's one plan (collective: it fails on every rank or none); its receive rows size
// recvX. *counted: the rows per local expert add up to them (no padding).
bool LlBench::planNormal(bool* counted) {
  fuscoMoeConfig_t cfg = moeConfig(o_, o_.variants.front());
  perExpert_.assign(localExperts_, 0);
  if (!ok(fuscoMoePlan(&handle_, space_->comm(), &cfg, dTopk_, o_.tokens, o_.topk,
                       space_->stream()),
          "fuscoMoePlan") ||
      !spaceOk(space_->sync("fuscoMoePlan"), "fuscoMoePlan") ||
      !ok(fuscoMoeGetRecvCounts(handle_, &recvRows_, perExpert_.data()), "fuscoMoeGetRecvCounts"))
    return false;
  int64_t sum = 0;
  for (int64_t c : perExpert_) sum += c;
  *counted = sum == static_cast<int64_t>(recvRows_);
  if (!*counted)
    fprintf(stderr, "# rank %d: fuscoMoeGetRecvCounts: %zu rows, %" PRId64 " over the experts\n",
            l_.rank, recvRows_, sum);
  return true;
}

// A low-latency dispatch of row's form (the hook form completes its receive at once).
bool LlBench::llDispatch(int row) {
  const int format = row == kLlFp8 ? FUSCO_LL_FP8 : FUSCO_LL_BF16;
  const unsigned int flags = row == kLlHook ? FUSCO_LL_RECV_HOOK : 0u;
  fuscoLowLatencyDispatch_t& d = dispatched_[row];
  void* s = space_->stream();
  return ok(fuscoLowLatencyDispatch(ll_, dX_, dTopk_, clampInt(o_.tokens), o_.topk, format, flags,
                                    &d, s),
            "fuscoLowLatencyDispatch") &&
         (flags == 0 || ok(fuscoLowLatencyRecvHook(ll_, d.hook, s), "fuscoLowLatencyRecvHook"));
}

// The combine of row's last dispatch, from the low-latency expertOut into out.
bool LlBench::llCombine(int row, void* out) {
  const unsigned int flags = row == kLlHook ? FUSCO_LL_RECV_HOOK : 0u;
  unsigned long long hook = 0;
  void* s = space_->stream();
  return ok(fuscoLowLatencyCombine(ll_, &dispatched_[row], dLlExpertOut_, dTopk_, dWeights_,
                                   clampInt(o_.tokens), o_.topk, out, flags, &hook, s),
            "fuscoLowLatencyCombine") &&
         (flags == 0 || ok(fuscoLowLatencyRecvHook(ll_, hook, s), "fuscoLowLatencyRecvHook"));
}

// One phase of one row: a barrier, then the call timed alone (*us). Rows without a plan, and the
// normal plan under --replan off, have no plan phase (0, no barrier: the same on every rank).
bool LlBench::runPhase(int row, int phase, double* us) {
  *us = 0;
  if (phase == kLlPlan && (row != kLlNormal || !o_.replan)) return true;
  void* s = space_->stream();
  std::function<bool()> call;
  if (row == kLlNormal && phase == kLlPlan) {
    call = [&] {
      return ok(fuscoMoeReplan(handle_, dTopk_, o_.tokens, o_.topk, s), "fuscoMoeReplan");
    };
  } else if (row == kLlNormal && phase == kLlDispatch) {
    call = [&] {
      return ok(fuscoMoeDispatch(handle_, dX_, rowBytes_, dRecvX_, s), "fuscoMoeDispatch");
    };
  } else if (row == kLlNormal) {
    call = [&] {
      return ok(
          fuscoMoeCombine(handle_, dExpertOut_, fuscoBfloat16, o_.hidden, dWeights_, dOut_, s),
          "fuscoMoeCombine");
    };
  } else if (phase == kLlDispatch) {
    call = [&] { return llDispatch(row); };
  } else {
    call = [&] { return llCombine(row, dLlOut_); };
  }
  if (!barrier()) return false;
  return spaceOk(space_->time(call, us), kPhaseNames[phase]);
}

// Warmup, then the timed iterations; in each, every active row's phases in turn (normal, ll-bf16,
// ll-fp8, ll-hook), so the machine's noise hits every row alike. times: this rank's us,
// [row][iteration][phase].
bool LlBench::timeAll(std::vector<double>* times) {
  times->assign(static_cast<size_t>(kLlRows) * o_.iters * kLlPhases, 0.0);
  for (int it = 0; it < o_.warmup + o_.iters; ++it) {
    for (int row = 0; row < kLlRows; ++row) {
      if (!active_[row]) continue;
      for (int ph = 0; ph < kLlPhases; ++ph) {
        double us = 0;
        if (!runPhase(row, ph, &us)) return false;
        if (it >= o_.warmup) (*times)[(row * o_.iters + it - o_.warmup) * kLlPhases + ph] = us;
      }
    }
  }
  return true;
}

// Every rank learns every rank's times; a phase's time in an iteration is the slowest rank's, a
// row's figure the median over iterations (plan + dispatch and dispatch + combine: the median of
// the per-iteration sums, and the latter's minimum).
bool LlBench::summarize(const std::vector<double>& mine, std::vector<LlResult>* res) {
  const int n = l_.nranks;
  std::vector<double> all(mine.size() * n);
  if (!ok(allGather(comm_, n, mine.data(), all.data(), mine.size(), fuscoFloat64),
          "fuscoAllToAll (times)", comm_))
    return false;
  res->assign(kLlRows, LlResult());
  for (int row = 0; row < kLlRows; ++row) {
    LlResult& r = (*res)[row];
    r.ran = active_[row];
    std::vector<double> ph[kLlPhases], planDispatch, total;
    for (int it = 0; it < o_.iters; ++it) {
      for (int p = 0; p < kLlPhases; ++p) {
        double m = 0;
        for (int k = 0; k < n; ++k)
          m = std::max(m, all[k * mine.size() + (row * o_.iters + it) * kLlPhases + p]);
        ph[p].push_back(m);
      }
      planDispatch.push_back(ph[kLlPlan].back() + ph[kLlDispatch].back());
      total.push_back(ph[kLlDispatch].back() + ph[kLlCombine].back());
    }
    r.plan = median(ph[kLlPlan]), r.dispatch = median(ph[kLlDispatch]);
    r.combine = median(ph[kLlCombine]), r.planDispatch = median(planDispatch);
    r.total = median(total), r.totalMin = *std::min_element(total.begin(), total.end());
  }
  return true;
}

int LlBench::run() {
  if (!setup()) return 1;
  int64_t jsonFailed = 0;
  if (l_.rank == 0 && o_.jsonPath != nullptr && (json_ = fopen(o_.jsonPath, "a")) == nullptr) {
    fprintf(stderr, "# rank 0: cannot open %s: %s\n", o_.jsonPath, strerror(errno));
    jsonFailed = 1;
  }
  const int64_t mine[2] = {static_cast<int64_t>(std::count_if(topkIdx_.begin(), topkIdx_.end(),
                                                              [](int64_t e) { return e >= 0; })),
                           static_cast<int64_t>(recvRows_)};
  std::vector<int64_t> rows(2 * l_.nranks);
  if (!agree(jsonFailed == 0) ||
      !ok(allGather(comm_, l_.nranks, mine, rows.data(), 2, fuscoInt64), "fuscoAllToAll", comm_))
    return 1;
  if (l_.rank == 0) printHeader(rows);
  int64_t wrong = 0;
  if (!prepare(&wrong)) return 1;
  std::vector<int64_t> allWrong(l_.nranks);
  if (!ok(allGather(comm_, l_.nranks, &wrong, allWrong.data(), 1, fuscoInt64), "fuscoAllToAll",
          comm_))
    return 1;
  int64_t bad = 0;
  for (int64_t w : allWrong) bad += w;
  if (l_.rank == 0)
    printf("# check: %s\n", !o_.check ? "off (-c 0)"
                            : bad == 0
                                ? "OK (low-latency rows per expert equal fuscoMoeDispatch's; "
                                  "every low-latency out equals fuscoMoeCombine's bit for bit)"
                                : "FAILED (nothing timed)");
  fflush(stdout);
  if (bad != 0) return 1;
  std::vector<double> times;
  std::vector<LlResult> res;
  if (!timeAll(&times) || !summarize(times, &res)) return 1;
  if (l_.rank == 0) printTable(res);
  fuscoResult_t async = fuscoSuccess;
  if (!ok(fuscoCommGetAsyncError(space_->comm(), &async), "fuscoCommGetAsyncError") ||
      !ok(async, "a low-latency or normal call (asynchronous error)") ||
      !ok(fuscoLowLatencyDestroy(ll_), "fuscoLowLatencyDestroy"))
    return 1;
  ll_ = nullptr;
  return 0;
}

int runLowLatency(const MoeOptions& o, const Launch& l) {
  LlBench b(o, l);
  return b.run();
}

}  // namespace perf
}  // namespace fusco
