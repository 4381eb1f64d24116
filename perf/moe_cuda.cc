#include "moe_cuda.h"

#ifdef FUSCO_PERF_CUDA

#include <cuda_runtime_api.h>

#include <chrono>
#include <vector>

#include "moe_kernels.h"

namespace fusco {
namespace perf {

namespace {

double nowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Microseconds since t0 (the host time of one enqueueing call).
double usSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

bool cudaOk(cudaError_t e, const char* what, std::string* err) {
  if (e == cudaSuccess) return true;
  *err = std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  return false;
}

// cudaMalloc for a typed pointer (cuda_runtime_api.h has the void** form only).
template <typename T>
bool typedMalloc(T** p, size_t bytes, std::string* err) {
  void* v = nullptr;
  if (!cudaOk(cudaMalloc(&v, bytes), "cudaMalloc", err)) return false;
  *p = static_cast<T*>(v);
  return true;
}

bool fuscoOk(fuscoResult_t r, const char* what, fuscoComm_t comm, std::string* err) {
  if (r == fuscoSuccess) return true;
  *err = std::string(what) + " failed: " + fuscoGetErrorString(r) + ": " + fuscoGetLastError(comm);
  return false;
}

// The unfused pipeline's exchange on the data comm. Counts travel through device memory and come
// back to the host (a host sync, as Megatron's tokens_per_expert all-to-all + .cpu() has); rows are
// stream-ordered fuscoAllToAllv calls between device buffers.
class DeviceExchange : public RowExchange {
 public:
  DeviceExchange(fuscoComm_t comm, cudaStream_t s, int nranks)
      : comm_(comm), s_(s), nranks_(nranks), sc_(nranks), sd_(nranks), rc_(nranks), rd_(nranks) {}
  ~DeviceExchange() override { cudaFree(dev_); }

  // Local: room for perPeer counts per rank each way (the plan's counts exchange must not fail
  // on one rank only).
  bool reserve(size_t perPeer) {
    cap_ = perPeer * nranks_;
    return cudaOk(cudaMalloc(&dev_, 2 * cap_ * sizeof(int64_t)), "cudaMalloc (counts)", &error);
  }

  bool counts(const int64_t* send, int64_t* recv, size_t perPeer) override {
    const size_t n = perPeer * nranks_, bytes = n * sizeof(int64_t);
    if (n > cap_) {
      error = "counts exchange: more counts than reserved";
      return false;
    }
    int64_t* ds = static_cast<int64_t*>(dev_);
    int64_t* dr = ds + cap_;
    return cudaOk(cudaMemcpyAsync(ds, send, bytes, cudaMemcpyHostToDevice, s_), "counts H2D",
                  &error) &&
           fuscoOk(fuscoAllToAll(ds, dr, perPeer, fuscoInt64, comm_, s_), "fuscoAllToAll (counts)",
                   comm_, &error) &&
           cudaOk(cudaMemcpyAsync(recv, dr, bytes, cudaMemcpyDeviceToHost, s_), "counts D2H",
                  &error) &&
           cudaSyncStream(s_, "the counts exchange", &error);
  }

  bool rows(const void* send, const size_t* sendRows, void* recv, const size_t* recvRows,
            size_t rowBytes) override {
    size_t so = 0, ro = 0;
    for (int p = 0; p < nranks_; ++p) {  // byte counts, as the host pipeline's exchange
      sc_[p] = sendRows[p] * rowBytes, sd_[p] = so, so += sc_[p];
      rc_[p] = recvRows[p] * rowBytes, rd_[p] = ro, ro += rc_[p];
    }
    return fuscoOk(fuscoAllToAllv(send, sc_.data(), sd_.data(), recv, rc_.data(), rd_.data(),
                                  fuscoUint8, comm_, s_),
                   "fuscoAllToAllv", comm_, &error);
  }

 private:
  fuscoComm_t comm_;
  cudaStream_t s_;
  int nranks_;
  void* dev_ = nullptr;
  size_t cap_ = 0;
  std::vector<size_t> sc_, sd_, rc_, rd_;
};

class CudaMoeImpl : public CudaMoe {
 public:
  explicit CudaMoeImpl(const CudaMoeShape& s) : s_(s) {}
  ~CudaMoeImpl() override;

  bool init(fuscoComm_t control) override;
  const CudaRank& cuda() const override { return cuda_; }
  RowExchange* exchange() override { return ex_.get(); }
  bool upload(const int64_t* topkIdx, const float* weights, const void* x) override;
  bool planOnce(UnfusedPipeline* routing, fuscoMoeHandle_t* handle) override;
  bool allocate(size_t recvRows, size_t expertRows, size_t bufRows) override;
  bool runFusco(fuscoMoeHandle_t* handle, bool plan, bool poison, const Barrier& barrier,
                double* t) override;
  bool runUnfused(bool plan, bool poison, const Barrier& barrier, double* t) override;
  bool runLimit(size_t dispatchBytes, size_t combineBytes, const Barrier& barrier,
                double* t) override;
  bool download(Buffer which, void* host, size_t bytes) override;
  const std::string& error() const override { return err_; }

 private:
  cudaStream_t stream() const { return static_cast<cudaStream_t>(cuda_.stream); }
  bool fok(fuscoResult_t r, const char* what) { return fuscoOk(r, what, cuda_.comm, &err_); }
  bool kernelOk(int e, const char* what) {
    return cudaOk(static_cast<cudaError_t>(e), what, &err_);
  }
  template <typename T>
  bool deviceAlloc(T** p, size_t bytes) {
    *p = static_cast<T*>(bufs_->alloc(bytes, &err_));
    return *p != nullptr;
  }
  // barrier, host clock, enqueue(), cudaStreamSynchronize, host clock -> *ms.
  bool timed(const Barrier& barrier, double* ms, const std::function<bool()>& enqueue,
             const char* what);
  bool pipePlan();
  bool pipeDispatch();
  bool pipeCombine();

  CudaMoeShape s_;
  CudaRank cuda_;  // declared first: the comm outlives the buffers made on it
  std::unique_ptr<DeviceBuffers> bufs_;
  std::unique_ptr<DeviceExchange> ex_;
  UnfusedPipeline* routing_ = nullptr;
  int64_t* topk_ = nullptr;
  float* weights_ = nullptr;
  char *x_ = nullptr, *recvX_ = nullptr, *expertOut_ = nullptr, *p_ = nullptr, *q_ = nullptr,
       *out_ = nullptr;
  size_t recvRows_ = 0, expertRows_ = 0;
  // The pipeline's index lists on the device (cudaMalloc), and their host sources.
  int64_t *perm_ = nullptr, *slot_ = nullptr, *emStart_ = nullptr, *smStart_ = nullptr;
  int nchunks_ = 0;
  std::vector<int64_t> hostTopk_, hostEm_, hostSm_;
  std::string err_;
};

CudaMoeImpl::~CudaMoeImpl() {
  for (int64_t* p : {perm_, slot_, emStart_, smStart_}) cudaFree(p);
  ex_.reset();
  bufs_.reset();  // before cuda_ destroys the comm
}

bool CudaMoeImpl::init(fuscoComm_t control) {
  cuda_.maxSms = s_.maxSms;
  if (!cudaRankInit(control, s_.rank, s_.nranks, &cuda_, &err_)) return false;
  bufs_.reset(new DeviceBuffers(cuda_.comm, s_.buffers));
  ex_.reset(new DeviceExchange(cuda_.comm, stream(), s_.nranks));
  nchunks_ = s_.moe.numExperts;  // [source rank][local expert] = nranks x numExperts / nranks
  return true;
}

bool CudaMoeImpl::upload(const int64_t* topkIdx, const float* weights, const void* x) {
  const size_t slots = s_.tokens * s_.topk;
  const size_t idxBytes = slots * sizeof(int64_t);
  return ex_->reserve(s_.moe.numExperts / s_.nranks) && typedMalloc(&perm_, idxBytes + 8, &err_) &&
         typedMalloc(&slot_, idxBytes + 8, &err_) &&
         typedMalloc(&emStart_, (nchunks_ + 1) * sizeof(int64_t), &err_) &&
         typedMalloc(&smStart_, (nchunks_ + 1) * sizeof(int64_t), &err_) &&
         deviceAlloc(&topk_, idxBytes) && deviceAlloc(&weights_, slots * sizeof(float)) &&
         deviceAlloc(&x_, s_.tokens * s_.rowBytes) &&
         cudaCopySync(topk_, topkIdx, idxBytes, stream(), &err_) &&
         cudaCopySync(weights_, weights, slots * sizeof(float), stream(), &err_) &&
         cudaCopySync(x_, x, s_.tokens * s_.rowBytes, stream(), &err_);
}

bool CudaMoeImpl::planOnce(UnfusedPipeline* routing, fuscoMoeHandle_t* handle) {
  routing_ = routing;
  fuscoMoeConfig_t cfg = s_.moe;
  return fok(fuscoMoePlan(handle, cuda_.comm, &cfg, topk_, s_.tokens, s_.topk, stream()),
             "fuscoMoePlan") &&
         cudaSyncStream(stream(), "fuscoMoePlan", &err_) && pipePlan() &&
         cudaSyncStream(stream(), "the pipeline plan", &err_);
}

bool CudaMoeImpl::allocate(size_t recvRows, size_t expertRows, size_t bufRows) {
  recvRows_ = recvRows;
  expertRows_ = expertRows;
  const size_t rb = s_.rowBytes;
  return deviceAlloc(&recvX_, recvRows * rb) && deviceAlloc(&expertOut_, expertRows * rb) &&
         deviceAlloc(&p_, bufRows * rb) && deviceAlloc(&q_, bufRows * rb) &&
         deviceAlloc(&out_, s_.tokens * rb);
}

bool CudaMoeImpl::timed(const Barrier& barrier, double* ms, const std::function<bool()>& enqueue,
                        const char* what) {
  if (!barrier()) {
    err_ = "barrier (control comm) failed";
    return false;
  }
  const double t0 = nowMs();
  if (!enqueue() || !cudaSyncStream(cuda_.stream, what, &err_)) return false;
  *ms = nowMs() - t0;
  return true;
}

bool CudaMoeImpl::runFusco(fuscoMoeHandle_t* h, bool plan, bool poison, const Barrier& barrier,
                           double* t) {
  const size_t rb = s_.rowBytes;
  if (poison && !(cudaFillSync(recvX_, 0xA5, recvRows_ * rb, stream(), &err_) &&
                  cudaFillSync(out_, 0xA5, s_.tokens * rb, stream(), &err_)))
    return false;
  fuscoMoeConfig_t cfg = s_.moe;
  // A kept handle is planned again in place, as a model does layer after layer.
  auto doPlan = [&] {
    if (!plan) return true;
    if (*h != nullptr)
      return fok(fuscoMoeReplan(*h, topk_, s_.tokens, s_.topk, stream()), "fuscoMoeReplan");
    return fok(fuscoMoePlan(h, cuda_.comm, &cfg, topk_, s_.tokens, s_.topk, stream()),
               "fuscoMoePlan");
  };
  auto doDispatch = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const fuscoResult_t r = fuscoMoeDispatch(*h, x_, rb, recvX_, stream());
    t[kDispatchHostUs] = usSince(t0);
    return fok(r, "fuscoMoeDispatch");
  };
  auto doCombine = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const fuscoResult_t r =
        fuscoMoeCombine(*h, expertOut_, s_.dtype, s_.hidden, weights_, out_, stream());
    t[kCombineHostUs] = usSince(t0);
    return fok(r, "fuscoMoeCombine");
  };
  // Between dispatch and combine: the expert (the identity, untimed).
  return timed(barrier, &t[0], doPlan, "fuscoMoePlan") &&
         timed(barrier, &t[1], doDispatch, "fuscoMoeDispatch") &&
         cudaCopySync(expertOut_, recvX_, recvRows_ * rb, stream(), &err_) &&
         timed(barrier, &t[2], doCombine, "fuscoMoeCombine");
}

bool CudaMoeImpl::runUnfused(bool plan, bool poison, const Barrier& barrier, double* t) {
  const size_t rb = s_.rowBytes;
  if (poison && !(cudaFillSync(expertOut_, 0xA5, expertRows_ * rb, stream(), &err_) &&
                  cudaFillSync(out_, 0xA5, s_.tokens * rb, stream(), &err_)))
    return false;
  return timed(
             barrier, &t[0], [&] { return !plan || pipePlan(); }, "the pipeline plan") &&
         timed(
             barrier, &t[1], [&] { return pipeDispatch(); }, "the pipeline dispatch") &&
         timed(
             barrier, &t[2], [&] { return pipeCombine(); }, "the pipeline combine");
}

bool CudaMoeImpl::runLimit(size_t dispatchBytes, size_t combineBytes, const Barrier& barrier,
                           double* t) {
  t[0] = 0;
  auto copy = [&](void* dst, const void* src, size_t bytes) {
    return [=] {
      return cudaOk(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()),
                    "cudaMemcpyAsync (limit)", &err_);
    };
  };
  return timed(barrier, &t[1], copy(q_, p_, dispatchBytes), "the dispatch copy") &&
         timed(barrier, &t[2], copy(p_, q_, combineBytes), "the combine copy");
}

bool CudaMoeImpl::download(Buffer which, void* host, size_t bytes) {
  const void* src = which == kRecvX ? recvX_ : which == kExpertOut ? expertOut_ : out_;
  return cudaCopySync(host, src, bytes, stream(), &err_);
}

// topkIdx to the host, the routing metadata and the counts exchange (UnfusedPipeline::plan), then
// the permutation, the slot positions and the chunk table back to the device.
bool CudaMoeImpl::pipePlan() {
  const size_t slots = s_.tokens * s_.topk;
  hostTopk_.resize(slots);
  if (!cudaCopySync(hostTopk_.data(), topk_, slots * sizeof(int64_t), stream(), &err_))
    return false;
  if (!routing_->plan(hostTopk_.data())) {
    err_ = "pipeline plan: " + routing_->error();
    return false;
  }
  const std::vector<int64_t>& cnt = routing_->chunkRows();  // [source][local expert]
  const int perRank = s_.moe.numExperts / s_.nranks;
  std::vector<int64_t> smOff(cnt.size());
  int64_t off = 0;
  for (size_t i = 0; i < cnt.size(); ++i) smOff[i] = off, off += cnt[i];
  hostEm_.assign(nchunks_ + 1, 0);
  hostSm_.assign(nchunks_ + 1, 0);
  int64_t em = 0;
  int c = 0;
  for (int e = 0; e < perRank; ++e) {
    for (int s = 0; s < s_.nranks; ++s, ++c) {
      hostEm_[c] = em;
      hostSm_[c] = smOff[static_cast<size_t>(s) * perRank + e];
      em += cnt[static_cast<size_t>(s) * perRank + e];
    }
  }
  hostEm_[nchunks_] = em;
  const std::vector<int64_t>& perm = routing_->permutation();
  const std::vector<int64_t>& slot = routing_->slotPositions();
  const cudaMemcpyKind h2d = cudaMemcpyHostToDevice;
  return cudaOk(cudaMemcpyAsync(perm_, perm.data(), perm.size() * 8, h2d, stream()), "H2D",
                &err_) &&
         cudaOk(cudaMemcpyAsync(slot_, slot.data(), slot.size() * 8, h2d, stream()), "H2D",
                &err_) &&
         cudaOk(cudaMemcpyAsync(emStart_, hostEm_.data(), hostEm_.size() * 8, h2d, stream()), "H2D",
                &err_) &&
         cudaOk(cudaMemcpyAsync(smStart_, hostSm_.data(), hostSm_.size() * 8, h2d, stream()), "H2D",
                &err_);
}

bool CudaMoeImpl::pipeDispatch() {
  const UnfusedPipeline& r = *routing_;
  const size_t rb = s_.rowBytes;
  if (!kernelOk(launchGatherRows(x_, p_, perm_, r.sendRows(), rb, cuda_.stream), "permute kernel"))
    return false;
  if (!ex_->rows(p_, r.sendRowsTo().data(), q_, r.recvRowsFrom().data(), rb)) {
    err_ = ex_->error;
    return false;
  }
  return kernelOk(launchSortChunks(q_, expertOut_, emStart_, smStart_, nchunks_, r.recvRows(), rb,
                                   false, cuda_.stream),
                  "sort-chunks kernel");
}

bool CudaMoeImpl::pipeCombine() {
  const UnfusedPipeline& r = *routing_;
  const size_t rb = s_.rowBytes;
  if (!kernelOk(launchSortChunks(expertOut_, p_, emStart_, smStart_, nchunks_, r.recvRows(), rb,
                                 true, cuda_.stream),
                "unsort-chunks kernel"))
    return false;
  if (!ex_->rows(p_, r.recvRowsFrom().data(), q_, r.sendRowsTo().data(), rb)) {
    err_ = ex_->error;
    return false;
  }
  return kernelOk(launchUnpermuteSum(q_, slot_, weights_, s_.tokens, s_.topk, s_.dtype, s_.hidden,
                                     out_, cuda_.stream),
                  "un-permute kernel");
}

}  // namespace

std::unique_ptr<CudaMoe> makeCudaMoe(const CudaMoeShape& shape) {
  return std::unique_ptr<CudaMoe>(new CudaMoeImpl(shape));
}

}  // namespace perf
}  // namespace fusco

#else  // no CUDA in this build

namespace fusco {
namespace perf {

std::unique_ptr<CudaMoe> makeCudaMoe(const CudaMoeShape&) { return nullptr; }

}  // namespace perf
}  // namespace fusco

#endif
