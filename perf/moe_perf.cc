// moe_perf: MoE dispatch + combine (docs/PERF.md) in the FUSCO paper's shape, fusco against its
// baselines in one run:
//   fusco    fuscoMoePlan + fuscoMoeDispatch + fuscoMoeCombine (expert compute is the identity and
//            not timed: expertOut = recvX). With --fuse off it runs the unfused pipeline instead.
//   unfused  Megatron/NCCL style permute -> fuscoAllToAllv -> sort chunks, and the mirror
//            (moe_baselines.h): same library, same transports.
//   mpi      the same pipeline over MPI_Alltoallv (builds with MPI, ranks started by mpirun; with
//            -np N the binary re-launches itself under mpirun when it can).
//   limit    a plain memcpy of the bytes each rank must move (its dispatch rows, then its combine
//            rows), in the same run.
// --mem cuda runs the same contenders on device buffers, stream-ordered, with CUDA kernels for the
// unfused pipeline and a device-to-device copy as the limit (moe_cuda.h); mpi is host-only there.
// Contenders run interleaved each iteration, with a barrier (a tiny fuscoAllToAll) before every
// phase. A phase's time is the slowest rank's; the table shows the median over iterations.
// --ll on times the low-latency calls against the normal path instead (moe_perf_ll.h).
#include "moe_perf.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "moe_perf_ll.h"

namespace {

double nowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

namespace fusco {
namespace perf {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

fuscoResult_t allGather(fuscoComm_t comm, int nranks, const void* mine, void* all, size_t count,
                        fuscoDataType_t dt) {
  size_t tb = 0;
  fuscoDataTypeSize(dt, &tb);
  std::vector<char> s(count * tb * nranks);
  for (int p = 0; p < nranks; ++p) memcpy(&s[p * count * tb], mine, count * tb);
  return fuscoAllToAll(s.data(), all, count, dt, comm, nullptr);
}

Bench::~Bench() {
  for (fuscoMoeHandle_t h : handles_)
    if (h != nullptr) fuscoMoeHandleDestroy(h);
  for (void* p : owned_) {
    if (o_.arena)
      fuscoMemFree(comm_, p);
    else
      free(p);
  }
  if (comm_ != nullptr) fuscoCommDestroy(comm_);
  if (json_ != nullptr) fclose(json_);
}

bool Bench::ok(fuscoResult_t r, const char* what) {
  if (r == fuscoSuccess) return true;
  fprintf(stderr, "# rank %d: %s failed: %s: %s\n", l_.rank, what, fuscoGetErrorString(r),
          fuscoGetLastError(comm_));
  return false;
}

bool Bench::pipeOk(bool good, const char* what, const UnfusedPipeline& p) {
  if (!good) fprintf(stderr, "# rank %d: %s: %s\n", l_.rank, what, p.error().c_str());
  return good;
}

void* Bench::alloc(size_t bytes) {
  void* p = nullptr;
  bytes = std::max<size_t>(bytes, 64);
  if (o_.arena) {
    if (!ok(fuscoMemAlloc(comm_, &p, bytes), "fuscoMemAlloc")) return nullptr;
  } else if (posix_memalign(&p, 4096, bytes) != 0) {
    fprintf(stderr, "# rank %d: cannot allocate %zu bytes\n", l_.rank, bytes);
    return nullptr;
  }
  owned_.push_back(p);
  return p;
}

bool Bench::allToAllSame(const void* mine, void* all, size_t count, fuscoDataType_t dt) {
  return ok(allGather(comm_, l_.nranks, mine, all, count, dt), "fuscoAllToAll");
}

bool Bench::barrier() {
  int64_t one = 1;
  std::vector<int64_t> all(l_.nranks);
  return allToAllSame(&one, all.data(), 1, fuscoInt64);
}

// Comm, node map, routing, weights, token rows, the pipelines; then the buffers.
bool Bench::setup() {
  handles_.assign(o_.variants.size(), nullptr);
  if (!ok(fuscoCommInitRank(&comm_, l_.nranks, l_.id, l_.rank), "fuscoCommInitRank")) return false;
  int localRank = 0, localSize = 1;
  if (!ok(fuscoCommNodeInfo(comm_, &node_, &numNodes_, &localRank, &localSize), "NodeInfo"))
    return false;
  nodeOfRank_.resize(l_.nranks);
  if (!allToAllSame(&node_, nodeOfRank_.data(), 1, fuscoInt32)) return false;
  if (o_.experts % l_.nranks != 0) {  // contiguous blocks of experts per rank
    fprintf(stderr, "# rank %d: --experts %d is not a multiple of the %d ranks\n", l_.rank,
            o_.experts, l_.nranks);
    return false;
  }
  Router(o_.routing, nodeOfRank_).route(l_.rank, &topkIdx_);
  makeWeights(o_.seed, l_.rank, o_.tokens * o_.topk, &weights_);
  fuscoDataTypeSize(o_.dtype, &elem_);
  rowBytes_ = o_.hidden * elem_;
  if (o_.mem == MemMode::Cuda && !setupCuda()) return false;
  fuscoEx_ = makeFuscoExchange(comm_, l_.nranks);
  unfused_.reset(new UnfusedPipeline(gpu_ ? gpu_->exchange() : fuscoEx_.get(), l_.rank, l_.nranks,
                                     o_.experts, o_.topk, o_.tokens));
#ifdef FUSCO_HAVE_MPI
  if (l_.mpi && !gpu_) {  // host-only contender
    mpiEx_ = makeMpiExchange(l_.nranks);
    mpi_.reset(
        new UnfusedPipeline(mpiEx_.get(), l_.rank, l_.nranks, o_.experts, o_.topk, o_.tokens));
  }
#endif
  for (int c = 0; c < kNumContenders; ++c) active_[c] = o_.contenders[c];
  if (active_[kMpi] && !mpi_) active_[kMpi] = false;
  const bool single = o_.variants.size() == 1;
  for (size_t v = 0; v < o_.variants.size(); ++v)
    rows_.push_back(Row{kFusco, static_cast<int>(v), variantName(o_.variants[v], single)});
  for (int c = kUnfused; c < kNumContenders; ++c) rows_.push_back(Row{c, -1, kContenderNames[c]});
  return allocate();
}

// One untimed plan of each kind sizes the buffers: x (tokens rows), recvX (fusco's receive rows),
// P and Q (max of the pipeline's send and receive rows, reused by every pipeline and the limit),
// out (tokens rows). Every contender reuses them.
bool Bench::allocate() {
  if (gpu_) return allocateCuda();
  // One handle per variant, each kept for --replan off; every variant must receive the same rows.
  for (size_t v = 0; v < o_.variants.size(); ++v) {
    fuscoMoeConfig_t cfg = moeConfig(o_, o_.variants[v]);
    size_t rows = 0;
    if (!ok(fuscoMoePlan(&handles_[v], comm_, &cfg, topkIdx_.data(), o_.tokens, o_.topk, nullptr),
            "fuscoMoePlan") ||
        !ok(fuscoMoeGetRecvCounts(handles_[v], &rows, nullptr), "fuscoMoeGetRecvCounts"))
      return false;
    if (v == 0) recvRows_ = rows;
    if (rows != recvRows_) {
      fprintf(stderr, "# rank %d: %s receives %zu rows, %s %zu\n", l_.rank, rows_[v].name.c_str(),
              rows, rows_[0].name.c_str(), recvRows_);
      return false;
    }
  }
  if (!pipeOk(unfused_->plan(topkIdx_.data()), "unfused plan", *unfused_) ||
      (mpi_ && !pipeOk(mpi_->plan(topkIdx_.data()), "mpi plan", *mpi_)))
    return false;
  bufRows_ = std::max(unfused_->sendRows(), unfused_->recvRows());
  x_ = static_cast<char*>(alloc(o_.tokens * rowBytes_));
  recvX_ = static_cast<char*>(alloc(recvRows_ * rowBytes_));
  p_ = static_cast<char*>(alloc(bufRows_ * rowBytes_));
  q_ = static_cast<char*>(alloc(bufRows_ * rowBytes_));
  out_ = static_cast<char*>(alloc(o_.tokens * rowBytes_));
  int64_t failed = (x_ && recvX_ && p_ && q_ && out_) ? 0 : 1, all = 0;
  std::vector<int64_t> v(l_.nranks);
  if (!allToAllSame(&failed, v.data(), 1, fuscoInt64)) return false;
  for (int64_t f : v) all += f;
  if (all != 0) return false;  // every rank stops together
  fillRows(o_.dtype, o_.hidden, o_.tokens, o_.seed, l_.rank, x_);
  return true;
}

bool Bench::runContender(int row, double* t, int64_t* wrong) {
  const Row& r = rows_[row];
  if (gpu_) return runCuda(r.kind, t, wrong);
  switch (r.kind) {
    case kFusco:
      return o_.fuse ? runFusco(r.variant, t, wrong) : runPipeline(*unfused_, t, wrong);
    case kUnfused:
      return runPipeline(*unfused_, t, wrong);
    case kMpi:
      return runPipeline(*mpi_, t, wrong);
    default:
      return runLimit(t);
  }
}

// Each phase starts right after a barrier and is timed on its own (the barrier is not in it).
// Variant v's own handle; every variant writes recvX. A checked run of a variant after the first
// compares its recvX with the first variant's (checkRef_) byte for byte.
bool Bench::runFusco(int v, double* t, int64_t* wrong) {
  const bool plan = o_.replan || wrong != nullptr;
  fuscoMoeHandle_t& handle = handles_[v];
  fuscoMoeConfig_t cfg = moeConfig(o_, o_.variants[v]);
  if (wrong != nullptr) memset(recvX_, 0xA5, recvRows_ * rowBytes_);
  if (!barrier()) return false;
  double t0 = nowMs();
  // A kept handle is planned again in place, as a model does layer after layer.
  if (plan && handle != nullptr &&
      !ok(fuscoMoeReplan(handle, topkIdx_.data(), o_.tokens, o_.topk, nullptr), "fuscoMoeReplan"))
    return false;
  if (plan && handle == nullptr &&
      !ok(fuscoMoePlan(&handle, comm_, &cfg, topkIdx_.data(), o_.tokens, o_.topk, nullptr),
          "fuscoMoePlan"))
    return false;
  t[0] = nowMs() - t0;
  if (!barrier()) return false;
  t0 = nowMs();
  if (!ok(fuscoMoeDispatch(handle, x_, rowBytes_, recvX_, nullptr), "fuscoMoeDispatch"))
    return false;
  t[1] = nowMs() - t0;
  if (!barrier()) return false;
  t0 = nowMs();
  if (!ok(fuscoMoeCombine(handle, recvX_, o_.dtype, o_.hidden, weights_.data(), out_, nullptr),
          "fuscoMoeCombine"))
    return false;
  t[2] = nowMs() - t0;
  if (wrong == nullptr) return true;
  int64_t bad = 0;
  if (o_.variants.size() > 1 && v == 0)
    checkRef_.assign(recvX_, recvX_ + recvRows_ * rowBytes_);
  else if (v > 0)
    bad = compareDispatch(recvX_, recvRows_, checkRef_.data());
  *wrong = bad + checkCombine();
  return true;
}

// The unfused pipeline (fusco or MPI exchange). Its dispatch output lands in P, combine reads it
// from there (through Q) and writes P again as the receive side of the way back.
bool Bench::runPipeline(UnfusedPipeline& p, double* t, int64_t* wrong) {
  if (!barrier()) return false;
  double t0 = nowMs();
  if ((o_.replan || wrong != nullptr) && !pipeOk(p.plan(topkIdx_.data()), "pipeline plan", p))
    return false;
  t[0] = nowMs() - t0;
  if (!barrier()) return false;
  t0 = nowMs();
  if (!pipeOk(p.dispatch(x_, rowBytes_, p_, q_, p_), "pipeline dispatch", p)) return false;
  t[1] = nowMs() - t0;
  // untimed; with fusco variants, against the first variant's output
  int64_t bad = wrong != nullptr ? compareDispatch(p_, p.recvRows(),
                                                   checkRef_.empty() ? nullptr : checkRef_.data())
                                 : 0;
  if (!barrier()) return false;
  t0 = nowMs();
  if (!pipeOk(p.combine(p_, o_.dtype, o_.hidden, weights_.data(), q_, p_, out_), "pipeline combine",
              p))
    return false;
  t[2] = nowMs() - t0;
  if (wrong != nullptr) *wrong = bad + checkCombine();
  return true;
}

bool Bench::runLimit(double* t) {
  const size_t s = unfused_->sendRows() * rowBytes_, r = unfused_->recvRows() * rowBytes_;
  t[0] = 0;
  if (!barrier()) return false;
  double t0 = nowMs();
  memcpy(q_, p_, s);
  t[1] = nowMs() - t0;
  if (!barrier()) return false;
  t0 = nowMs();
  memcpy(p_, q_, r);
  t[2] = nowMs() - t0;
  return true;
}
// Rows of got that differ from fusco's recvX (same expert-major layout); a count mismatch makes
// every row wrong.
int64_t Bench::compareDispatch(const char* got, size_t rows, const char* ref) const {
  if (ref == nullptr) ref = recvX_;
  if (rows != recvRows_) {
    fprintf(stderr, "# rank %d: pipeline receives %zu rows, fusco %zu\n", l_.rank, rows, recvRows_);
    return static_cast<int64_t>(std::max(rows, recvRows_));
  }
  int64_t wrong = 0;
  for (size_t i = 0; i < rows; ++i) {
    if (memcmp(got + i * rowBytes_, ref + i * rowBytes_, rowBytes_) == 0) continue;
    if (wrong++ < 3) fprintf(stderr, "# rank %d: dispatch row %zu differs\n", l_.rank, i);
  }
  return wrong;
}

// Expert compute is the identity, so out[t] should be (sum over valid k of w[t][k]) * x[t],
// within the rounding of the combine tree (three roundings to dtype at most).
int64_t Bench::checkCombine() const {
  const double eps = dtypeEps(o_.dtype);
  int64_t wrong = 0;
  for (size_t t = 0; t < o_.tokens; ++t) {
    double sw = 0;
    for (int k = 0; k < o_.topk; ++k)
      if (topkIdx_[t * o_.topk + k] >= 0) sw += weights_[t * o_.topk + k];
    const char* xr = x_ + t * rowBytes_;
    const char* orow = out_ + t * rowBytes_;
    for (size_t j = 0; j < o_.hidden; ++j) {
      double want = sw * loadElement(o_.dtype, xr, j);
      double got = loadElement(o_.dtype, orow, j);
      if (std::fabs(got - want) <= 4 * eps * std::fabs(want) + 1e-6) continue;
      if (wrong++ < 3)
        fprintf(stderr, "# rank %d: combine token %zu element %zu: got %g want %g\n", l_.rank, t, j,
                got, want);
    }
  }
  return wrong;
}

// Payload bytes this rank put on intra- and inter-node paths (both directions, self excluded).
// Fusco rows: what this rank sent (fuscoMoeGetStats of the variant's handle).
bool Bench::trafficOf(int row, int64_t* intra, int64_t* inter) {
  *intra = *inter = 0;
  const int c = rows_[row].kind;
  if (c == kLimit) return true;
  if (c == kFusco && o_.fuse) {
    fuscoMoeStats_t st;
    memset(&st, 0, sizeof(st));
    st.size = sizeof(st);
    if (!ok(fuscoMoeGetStats(handles_[std::max(rows_[row].variant, 0)], &st), "fuscoMoeGetStats"))
      return false;
    *intra = st.dispatchBytesIntraNode + st.combineBytesIntraNode;
    *inter = st.dispatchBytesInterNode + st.combineBytesInterNode;
    return true;
  }
  const UnfusedPipeline& p = *unfused_;  // same routing: same counts for every pipeline
  for (int r = 0; r < l_.nranks; ++r) {
    if (r == l_.rank) continue;
    int64_t b = static_cast<int64_t>((p.sendRowsTo()[r] + p.recvRowsFrom()[r]) * rowBytes_);
    (nodeOfRank_[r] == node_ ? *intra : *inter) += b;
  }
  return true;
}

int Bench::run() {
  if (!setup()) return 1;
  int64_t jsonFailed = 0, mine[2] = {static_cast<int64_t>(unfused_->sendRows()),
                                     static_cast<int64_t>(unfused_->recvRows())};
  if (l_.rank == 0 && o_.jsonPath != nullptr && (json_ = fopen(o_.jsonPath, "a")) == nullptr) {
    fprintf(stderr, "# rank 0: cannot open %s: %s\n", o_.jsonPath, strerror(errno));
    jsonFailed = 1;
  }
  std::vector<int64_t> rows(2 * l_.nranks), jf(l_.nranks);
  if (!allToAllSame(mine, rows.data(), 2, fuscoInt64) ||
      !allToAllSame(&jsonFailed, jf.data(), 1, fuscoInt64) || jf[0] != 0)
    return 1;
  if (l_.rank == 0) printHeader(rows);
  // Interleaved: fusco (each variant), unfused, mpi, limit, fusco, ... so machine noise hits all
  // alike.
  const int R = static_cast<int>(rows_.size());
  std::vector<double> times(R * o_.iters * kRunTimes, 0.0);
  for (int it = 0; it < o_.warmup + o_.iters; ++it) {
    for (int c = 0; c < R; ++c) {
      double t[kRunTimes] = {};
      if (active_[rows_[c].kind] && !runContender(c, t, nullptr)) return 1;
      if (it >= o_.warmup)
        for (int ph = 0; ph < kRunTimes; ++ph)
          times[(c * o_.iters + it - o_.warmup) * kRunTimes + ph] = t[ph];
    }
  }
  std::vector<int64_t> wrong(R, 0);
  if (o_.check) {
    // recvX must hold the fused dispatch output that the pipelines are compared with: the checked
    // run of the first fusco variant writes it, else (--fuse off, or fusco not a contender) one
    // untimed dispatch of the first variant's handle.
    if (gpu_ ? !cudaReference()
             : (!o_.fuse || !active_[kFusco]) &&
                   !ok(fuscoMoeDispatch(handles_[0], x_, rowBytes_, recvX_, nullptr), "dispatch"))
      return 1;
    for (int c = 0; c < R; ++c) {  // fusco variants first: the first one's recvX is the reference
      double t[kRunTimes] = {};
      if (rows_[c].kind != kLimit && active_[rows_[c].kind] && !runContender(c, t, &wrong[c]))
        return 1;
    }
  }
  std::vector<Result> res;
  if (!summarize(times, wrong, &res)) return 1;
  if (l_.rank == 0) printTable(res);
  int64_t bad = 0;
  for (const Result& r : res) bad += r.wrong;
  return bad == 0 ? 0 : 1;
}

// Every rank learns every rank's times, traffic and wrong counts; the phase time of an iteration
// is the slowest rank's, the figure the median over iterations (host us of the enqueueing calls
// alike).
bool Bench::summarize(const std::vector<double>& mine, const std::vector<int64_t>& wrong,
                      std::vector<Result>* res) {
  const int n = l_.nranks, C = static_cast<int>(rows_.size());
  std::vector<double> all(mine.size() * n);
  if (!allToAllSame(mine.data(), all.data(), mine.size(), fuscoFloat64)) return false;
  std::vector<int64_t> counts(3 * C), allCounts(3 * C * n);
  for (int c = 0; c < C; ++c) {
    if (!trafficOf(c, &counts[3 * c], &counts[3 * c + 1])) return false;
    counts[3 * c + 2] = wrong[c];
  }
  if (!allToAllSame(counts.data(), allCounts.data(), counts.size(), fuscoInt64)) return false;
  res->assign(C, Result());
  for (int c = 0; c < C; ++c) {
    Result& r = (*res)[c];
    r.ran = active_[rows_[c].kind];
    r.kind = rows_[c].kind, r.variant = rows_[c].variant, r.name = rows_[c].name;
    std::vector<double> ph[kRunTimes], total;
    for (int it = 0; it < o_.iters; ++it) {
      double sum = 0;
      for (int p = 0; p < kRunTimes; ++p) {
        double m = 0;
        for (int k = 0; k < n; ++k)
          m = std::max(m, all[k * mine.size() + (c * o_.iters + it) * kRunTimes + p]);
        ph[p].push_back(m);
        if (p <= kCombineMs) sum += m;
      }
      total.push_back(sum);
    }
    r.plan = median(ph[kPlanMs]), r.dispatch = median(ph[kDispatchMs]);
    r.combine = median(ph[kCombineMs]), r.total = median(total);
    r.dispatchHostUs = median(ph[kDispatchHostUs]), r.combineHostUs = median(ph[kCombineHostUs]);
    r.totalMin = *std::min_element(total.begin(), total.end());
    for (int k = 0; k < n; ++k) {
      r.intra += allCounts[k * 3 * C + 3 * c];
      r.inter += allCounts[k * 3 * C + 3 * c + 1];
      r.interMax = std::max(r.interMax, allCounts[k * 3 * C + 3 * c + 1]);
      r.wrong += allCounts[k * 3 * C + 3 * c + 2];
    }
  }
  if (!gpu_) return true;
  const int K = kNumContenders;  // maxDiff_ is per contender kind
  std::vector<double> diffs(K * n);
  if (!allToAllSame(maxDiff_, diffs.data(), K, fuscoFloat64)) return false;
  for (int c = 0; c < C; ++c)
    for (int k = 0; k < n; ++k)
      (*res)[c].maxDiff = std::max((*res)[c].maxDiff, diffs[k * K + rows_[c].kind]);
  return true;
}

namespace {

// launchRanks under --mps (mps_daemon.h): a private daemon starts before the ranks are forked, so
// they inherit its environment, and stops once they are done, a failed rank included.
int launchWithMps(const char* prog, MoeOptions& o, const RankBody& body) {
  MpsRequest req;
  req.mode = o.mps, req.np = o.launch.np, req.cudaMem = o.mem == MemMode::Cuda;
  MpsRun mps;
  const int rc = startMps(prog, req, &mps);
  if (rc != 0) return rc;
  o.mpsKind = mps.kind;  // the ranks' copy: forked after this
  const int status = launchRanks(o.launch, body);
  return stopMps(prog, &mps, status);  // nothing in a forked rank (it returns from launchRanks too)
}

}  // namespace

}  // namespace perf
}  // namespace fusco

int main(int argc, char** argv) {
  using namespace fusco::perf;
  MoeOptions o;
  int rc = parseMoeArgs(argc, argv, &o);
  if (rc != 0) return rc == 1 ? 0 : rc;
  if (o.mpiProbe) return launchRanks(o.launch, [](const Launch& l) { return l.mpi ? 0 : 3; });
  if ((rc = resolveMemMode(argv[0], &o.mem)) != 0) return rc;
  if (o.arena == 2 && o.mem != MemMode::Cuda) {
    fprintf(stderr, "%s: -a 2 (cudaMalloc + fuscoCommRegister) needs --mem cuda\n", argv[0]);
    return 2;
  }
  if (o.mem == MemMode::Cuda && o.variants.size() > 1) {
    fprintf(stderr,
            "%s: --mem cuda runs one fusco variant: give one --dedup and one --balance "
            "value (the --dedup/--balance lists, %zu variants here, run on host memory)\n",
            argv[0], o.variants.size());
    return 2;
  }
  if (o.ll)  // the low-latency calls against the normal path (moe_perf_ll.h); no mpi row
    return launchWithMps(argv[0], o, [&o](const Launch& l) { return runLowLatency(o, l); });
  if (o.mem == MemMode::Cuda) g_noMpiReason = "host-only contender, skipped with --mem cuda";
#ifdef FUSCO_HAVE_MPI
  const char* env = launcherInEnvironment();
  if (o.mem == MemMode::Cuda) {
    // no mpirun re-launch: the mpi pipeline does not run on device buffers
  } else if (env == nullptr && o.launch.np > 0 && o.contenders[kMpi] && o.mpiLaunch) {
    relaunchUnderMpirun(argc, argv, o.launch.np, &g_noMpiReason);  // returns only on failure
    fprintf(stderr, "# moe_perf: %s; forking %d ranks without the mpi contender\n",
            g_noMpiReason.c_str(), o.launch.np);
  } else if (env == nullptr) {
    g_noMpiReason = o.mpiLaunch ? "not launched by mpirun" : "--mpi-launch off";
  } else {
    g_noMpiReason = std::string("ranks started by ") + env + ", not mpirun";
  }
#endif
  return launchWithMps(argv[0], o, [&o](const Launch& l) {
    Bench b(o, l);
    return b.run();
  });
}
