// moe_perf's --mem cuda half of Bench (moe_perf.h): the device side's setup (moe_cuda.h), one
// iteration of each contender on it, and the checks, which compare host copies of the device
// results: the pipeline's expert-major rows with fusco's recvX byte for byte, every out with the
// exact sum, and the pipeline's out with fusco's (max abs diff reported).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "moe_perf.h"

namespace fusco {
namespace perf {

// Every rank learns whether every rank succeeded, so a local failure stops all ranks together.
bool Bench::agree(bool mineOk) {
  int64_t failed = mineOk ? 0 : 1, all = 0;
  std::vector<int64_t> v(l_.nranks);
  if (!allToAllSame(&failed, v.data(), 1, fuscoInt64)) return false;
  for (int64_t f : v) all += f;
  return all == 0;
}

bool Bench::gpuOk(bool good, const char* what) {
  if (!good) fprintf(stderr, "# rank %d: %s: %s\n", l_.rank, what, gpu_->error().c_str());
  return good;
}

// --mem cuda: this rank's device, stream and fuscoMemCuda comm (collective over comm_, which stays
// the control comm: barriers and results).
bool Bench::setupCuda() {
  CudaMoeShape s;
  s.rank = l_.rank, s.nranks = l_.nranks, s.topk = o_.topk;
  s.tokens = o_.tokens, s.hidden = o_.hidden, s.rowBytes = rowBytes_, s.dtype = o_.dtype;
  s.buffers = static_cast<BufferKind>(o_.arena);
  s.moe = moeConfig(o_, o_.variants.front());
  s.maxSms = o_.sms;
  gpu_ = makeCudaMoe(s);
  if (!gpu_) {
    fprintf(stderr, "# rank %d: --mem cuda: this build has no CUDA support\n", l_.rank);
    return false;
  }
  return gpuOk(gpu_->init(comm_), "--mem cuda setup");
}

// --mem cuda: x is made on the host and uploaded with the routing and weights; one plan of each
// kind sizes the device buffers (moe_cuda.h); recvX, the pipeline's expert-major rows and out get
// host mirrors for the checks.
bool Bench::allocateCuda() {
  mirror_[0].reset(new char[o_.tokens * rowBytes_ + 1]);
  x_ = mirror_[0].get();
  fillRows(o_.dtype, o_.hidden, o_.tokens, o_.seed, l_.rank, x_);
  if (!agree(gpuOk(gpu_->upload(topkIdx_.data(), weights_.data(), x_), "device upload")))
    return false;
  if (!gpuOk(gpu_->planOnce(unfused_.get(), &handles_[0]), "first plans") ||
      !ok(fuscoMoeGetRecvCounts(handles_[0], &recvRows_, nullptr), "fuscoMoeGetRecvCounts"))
    return false;
  bufRows_ = std::max(unfused_->sendRows(), unfused_->recvRows());
  const size_t expertRows = std::max(recvRows_, unfused_->recvRows());
  mirror_[1].reset(new char[recvRows_ * rowBytes_ + 1]);
  mirror_[2].reset(new char[expertRows * rowBytes_ + 1]);
  mirror_[3].reset(new char[o_.tokens * rowBytes_ + 1]);
  mirror_[4].reset(new char[o_.tokens * rowBytes_ + 1]);
  recvX_ = mirror_[1].get(), p_ = mirror_[2].get(), out_ = mirror_[3].get();
  return agree(gpuOk(gpu_->allocate(recvRows_, expertRows, bufRows_), "device buffers"));
}

// --mem cuda: one iteration of contender c; a checked run (wrong != nullptr) then compares host
// copies of its results.
bool Bench::runCuda(int c, double* t, int64_t* wrong) {
  const bool check = wrong != nullptr, plan = o_.replan || check;
  const CudaMoe::Barrier b = [this] { return barrier(); };
  if (c == kLimit) {
    const size_t s = unfused_->sendRows() * rowBytes_, r = unfused_->recvRows() * rowBytes_;
    return gpuOk(gpu_->runLimit(s, r, b, t), "limit (device copy)");
  }
  if (c == kFusco && o_.fuse)
    return gpuOk(gpu_->runFusco(&handles_[0], plan, check, b, t), "fusco") &&
           (!check || checkCudaFusco(wrong));
  return gpuOk(gpu_->runUnfused(plan, check, b, t), "unfused pipeline") &&
         (!check || checkCudaPipeline(c, wrong));
}

// --mem cuda: fusco's recvX and out, which the pipelines are compared with, when the checked fusco
// run does not make them (fusco not a contender, or --fuse off).
bool Bench::cudaReference() {
  if (active_[kFusco] && o_.fuse) return true;
  double t[kRunTimes] = {};
  int64_t wrong = 0;
  const CudaMoe::Barrier b = [this] { return barrier(); };
  return gpuOk(gpu_->runFusco(&handles_[0], true, true, b, t), "fusco (reference)") &&
         checkCudaFusco(&wrong);
}

bool Bench::checkCudaFusco(int64_t* wrong) {
  if (!gpuOk(gpu_->download(CudaMoe::kRecvX, recvX_, recvRows_ * rowBytes_), "recvX to host") ||
      !gpuOk(gpu_->download(CudaMoe::kOut, out_, o_.tokens * rowBytes_), "out to host"))
    return false;
  *wrong = checkCombine();
  memcpy(mirror_[4].get(), out_, o_.tokens * rowBytes_);
  return true;
}

// The pipeline's expert-major rows must equal fusco's recvX byte for byte, its out the exact sum
// (checkCombine) and fusco's out within both combines' roundings.
bool Bench::checkCudaPipeline(int c, int64_t* wrong) {
  const size_t rows = unfused_->recvRows();
  if (!gpuOk(gpu_->download(CudaMoe::kExpertOut, p_, rows * rowBytes_), "expertOut to host") ||
      !gpuOk(gpu_->download(CudaMoe::kOut, out_, o_.tokens * rowBytes_), "out to host"))
    return false;
  const int64_t bad = compareDispatch(p_, rows);
  if (bad != 0)
    fprintf(stderr,
            "# rank %d: %s: DISPATCH MISMATCH: %lld of %zu rows differ from fusco's recvX\n",
            l_.rank, kContenderNames[c], static_cast<long long>(bad), rows);
  *wrong = bad + checkCombine() + diffCombine(mirror_[4].get(), &maxDiff_[c]);
  return true;
}

// Elements of out_ farther from ref (fusco's out) than the two combines' roundings allow (each is
// within 4 roundings of the exact sum, checkCombine); *maxDiff: the largest |difference|.
int64_t Bench::diffCombine(const char* ref, double* maxDiff) const {
  const double eps = dtypeEps(o_.dtype);
  int64_t wrong = 0;
  double worst = 0;
  for (size_t t = 0; t < o_.tokens; ++t) {
    for (size_t j = 0; j < o_.hidden; ++j) {
      const double a = loadElement(o_.dtype, out_ + t * rowBytes_, j);
      const double b = loadElement(o_.dtype, ref + t * rowBytes_, j);
      const double d = std::fabs(a - b);
      worst = std::max(worst, d);
      if (d <= 8 * eps * std::max(std::fabs(a), std::fabs(b)) + 1e-6) continue;
      if (wrong++ < 3)
        fprintf(stderr, "# rank %d: out token %zu element %zu: %g, fusco's %g\n", l_.rank, t, j, a,
                b);
    }
  }
  *maxDiff = worst;
  return wrong;
}

// --mem cuda: whether r's row made fuscoMoeDispatch / fuscoMoeCombine calls whose host time was
// taken (the fused fusco row; --fuse off runs the pipeline there).
bool Bench::hostTimed(const Result& r) const { return gpu_ && r.kind == kFusco && o_.fuse; }

// --mem cuda: what each JSON line adds (nothing in host mode).
std::string Bench::cudaJson(const Result& r, bool withDiff) const {
  if (!gpu_) return "";
  std::string s = ",\"mem\":\"cuda\",\"gpu\":\"" + gpu_->cuda().gpuName + "\"";
  char buf[96];
  if (withDiff) {
    snprintf(buf, sizeof(buf), ",\"max_abs_diff_vs_fusco\":%.6g", r.maxDiff);
    s += buf;
  }
  if (hostTimed(r)) {
    snprintf(buf, sizeof(buf), ",\"dispatch_host_us\":%.2f,\"combine_host_us\":%.2f",
             r.dispatchHostUs, r.combineHostUs);
    s += buf;
  }
  return s;
}

// --mem cuda: the table's host-time columns for r ("-" where no enqueueing call was clocked);
// nothing in host mode, whose table stays as it was.
std::string Bench::hostColumns(const Result& r) const {
  if (!gpu_) return "";
  char buf[64];
  if (hostTimed(r))
    snprintf(buf, sizeof(buf), " %16.1f %15.1f", r.dispatchHostUs, r.combineHostUs);
  else
    snprintf(buf, sizeof(buf), " %16s %15s", "-", "-");
  return buf;
}
}  // namespace perf
}  // namespace fusco
