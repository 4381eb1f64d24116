// moe_perf --ll on: the spaces its buffers live in and its calls are timed in (moe_perf_ll.h). On a
// host communicator a call returns once done, so the wall clock around it is its time. On a CUDA
// one a call returns once enqueued: events recorded on the rank's stream before and after it,
// waited for, give its time on the stream, host work inside the call included (the stream is idle
// when the first event is recorded, so the GPU waits for the call's launches).
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "moe_perf_ll.h"

#ifdef FUSCO_PERF_CUDA
#include <cuda_runtime_api.h>
#endif

namespace fusco {
namespace perf {

namespace {

class HostSpace : public LlSpace {
 public:
  HostSpace(fuscoComm_t comm, bool arena) : comm_(comm), arena_(arena) {}
  ~HostSpace() override {
    for (void* p : owned_) arena_ ? (void)fuscoMemFree(comm_, p) : free(p);
  }
  fuscoComm_t comm() const override { return comm_; }
  void* stream() const override { return nullptr; }
  const CudaRank* cuda() const override { return nullptr; }
  void* alloc(size_t bytes) override {
    void* p = nullptr;
    bytes = bytes < 64 ? 64 : bytes;
    if (arena_ && fuscoMemAlloc(comm_, &p, bytes) != fuscoSuccess) {
      err_ = "fuscoMemAlloc(" + std::to_string(bytes) + "): " + fuscoGetLastError(comm_);
      return nullptr;
    }
    if (!arena_ && posix_memalign(&p, 4096, bytes) != 0) {
      err_ = "cannot allocate " + std::to_string(bytes) + " bytes";
      return nullptr;
    }
    owned_.push_back(p);
    return p;
  }
  bool copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) memcpy(dst, src, bytes);
    return true;
  }
  bool fill(void* dst, int byte, size_t bytes) override {
    memset(dst, byte, bytes);
    return true;
  }
  bool sync(const char*) override { return true; }
  bool time(const std::function<bool()>& call, double* us) override {
    const auto t0 = std::chrono::steady_clock::now();
    if (!call()) return (err_ = "the timed call failed"), false;
    *us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    return true;
  }
  const std::string& error() const override { return err_; }

 private:
  fuscoComm_t comm_;
  bool arena_;
  std::vector<void*> owned_;
  std::string err_;
};

}  // namespace

std::unique_ptr<LlSpace> makeHostSpace(fuscoComm_t comm, bool arena) {
  return std::unique_ptr<LlSpace>(new HostSpace(comm, arena));
}

#ifdef FUSCO_PERF_CUDA

namespace {

class CudaSpace : public LlSpace {
 public:
  explicit CudaSpace(BufferKind kind) : kind_(kind) {}
  ~CudaSpace() override {
    bufs_.reset();  // before cuda_ destroys the comm
    if (start_ != nullptr) cudaEventDestroy(start_);
    if (stop_ != nullptr) cudaEventDestroy(stop_);
  }
  bool init(fuscoComm_t control, int rank, int nranks) {
    if (!cudaRankInit(control, rank, nranks, &cuda_, &err_)) return false;
    bufs_.reset(new DeviceBuffers(cuda_.comm, kind_));
    return cudaOk(cudaEventCreate(&start_), "cudaEventCreate") &&
           cudaOk(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  fuscoComm_t comm() const override { return cuda_.comm; }
  void* stream() const override { return cuda_.stream; }
  const CudaRank* cuda() const override { return &cuda_; }
  void* alloc(size_t bytes) override { return bufs_->alloc(bytes, &err_); }
  bool copy(void* dst, const void* src, size_t bytes) override {
    return cudaCopySync(dst, src, bytes, cuda_.stream, &err_);
  }
  bool fill(void* dst, int byte, size_t bytes) override {
    return cudaFillSync(dst, byte, bytes, cuda_.stream, &err_);
  }
  bool sync(const char* what) override { return cudaSyncStream(cuda_.stream, what, &err_); }
  bool time(const std::function<bool()>& call, double* us) override {
    cudaStream_t s = static_cast<cudaStream_t>(cuda_.stream);
    float ms = 0;
    if (!cudaOk(cudaEventRecord(start_, s), "cudaEventRecord")) return false;
    if (!call()) return (err_ = "the timed call failed"), false;
    if (!cudaOk(cudaEventRecord(stop_, s), "cudaEventRecord") ||
        !cudaOk(cudaEventSynchronize(stop_), "cudaEventSynchronize (after the timed call)") ||
        !cudaOk(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime"))
      return false;
    *us = 1000.0 * ms;
    return true;
  }
  const std::string& error() const override { return err_; }

 private:
  bool cudaOk(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return true;
    err_ = std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
    return false;
  }

  BufferKind kind_;
  CudaRank cuda_;  // declared before the buffers: the comm outlives them
  std::unique_ptr<DeviceBuffers> bufs_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  std::string err_;
};

}  // namespace

std::unique_ptr<LlSpace> makeCudaSpace(fuscoComm_t control, int rank, int nranks, BufferKind kind,
                                       std::string* err) {
  std::unique_ptr<CudaSpace> s(new CudaSpace(kind));
  if (!s->init(control, rank, nranks)) {
    *err = s->error();
    return nullptr;
  }
  return std::unique_ptr<LlSpace>(s.release());
}

#else  // no CUDA in this build (moe_perf refuses --mem cuda before it gets here)

std::unique_ptr<LlSpace> makeCudaSpace(fuscoComm_t, int, int, BufferKind, std::string* err) {
  *err = "built without CUDA";
  return nullptr;
}

#endif

}  // namespace perf
}  // namespace fusco
