#include "exec/stream_ops.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "core/clock.h"
#include "core/cuda_guard.h"
#include "core/log.h"
#include "core/params.h"
#include "core/result.h"
#include "core/seq_compare.h"
#include "device/cuda_rt.h"
#include "device/row_copy.h"

namespace fusco {

FUSCO_PARAM_INT(AsyncHost, "FUSCO_ASYNC_HOST", 0, 0, 1,
                "1: host comms run calls through the CUDA path's enqueue-only engine on a host "
                "twin of the stream (testing the protocol without a GPU)");

namespace {

class CudaOps : public StreamOps {
 public:
  fuscoResult_t allocMapped(size_t bytes, void** host, void** mapped) override {
    return cudaAllocMapped(bytes, host, mapped);
  }
  void freeMapped(void* host) override { cudaFreeMapped(host); }
  fuscoResult_t allocDevice(size_t bytes, void** ptr) override {
    CudaRelaxedCapture relaxed;  // the caller's stream may be capturing
    return cudaAllocDevice(bytes, ptr);
  }
  void freeDevice(void* ptr) override {
    if (ptr != nullptr) cudaFreeDevice(ptr);
  }
  fuscoResult_t capturing(void* stream, bool* yes) override {
    return cudaStreamCapturing(stream, yes);
  }
  fuscoResult_t flags(void* stream, const std::vector<StreamFlagOp>& ops) override {
    return ops.empty() ? fuscoSuccess : cudaStreamFlags(stream, ops);
  }
  fuscoResult_t copy(void* stream, void* dst, const void* src, size_t bytes) override {
    return cudaCopyAsync(dst, src, bytes, stream);
  }
  size_t batchBytes() override { return deviceCopyBatchBytes(); }
  size_t batchSlots(size_t ntasks) override { return deviceCopyBatchSlots(ntasks); }
  fuscoResult_t fillBatches(const std::vector<DevCopyTask>& tasks, void* block,
                            size_t slots) override {
    return deviceFillCopyBatches(tasks, block, slots);
  }
  fuscoResult_t copyDeferred(void* stream, const void* block, size_t slots) override {
    return deviceCopyDeferred(block, slots, stream);
  }
};

// The host twin's batch: a count and its tasks.
constexpr size_t kTwinBatch = 32;
struct TwinBatch {
  uint64_t n;
  DevCopyTask t[kTwinBatch];
};

bool reached(const void* addr, uint32_t value) {
  return seqReached(*static_cast<const volatile uint32_t*>(addr), value);
}

// The stream: a thread running its items in order; an item returns false while it must wait.
class HostOps : public StreamOps {
 public:
  HostOps(int64_t timeoutMs, volatile uint32_t* beat)
      : timeoutMs_(timeoutMs), beat_(beat), thread_([this] { run(); }) {}
  ~HostOps() override {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // The twin's allocations stand for cudaHostAlloc and cudaMalloc: the guard checks them alike.
  fuscoResult_t allocMapped(size_t bytes, void** host, void** mapped) override {
    FUSCO_CHECK(cudaGuardSetup("allocating stream-mapped memory (host twin of cudaHostAlloc)"));
    *host = *mapped = std::calloc(1, bytes);
    return *host != nullptr ? fuscoSuccess
                            : FUSCO_FAIL(fuscoSystemError, kEngine, "out of memory (%zu B)", bytes);
  }
  void freeMapped(void* host) override {
    if (host != nullptr) cudaGuardSetup("freeing stream-mapped memory (host twin of cudaFreeHost)");
    std::free(host);
  }
  fuscoResult_t allocDevice(size_t bytes, void** ptr) override {
    void* m = nullptr;
    return allocMapped(bytes, ptr, &m);
  }
  void freeDevice(void* ptr) override { freeMapped(ptr); }
  fuscoResult_t capturing(void*, bool* yes) override {
    *yes = false;
    return fuscoSuccess;
  }
  fuscoResult_t flags(void*, const std::vector<StreamFlagOp>& ops) override {
    for (const StreamFlagOp& o : ops) {
      if (o.wait)
        push([o] { return reached(o.devAddr, o.value); });
      else
        push([o] {
          std::atomic_thread_fence(std::memory_order_seq_cst);
          *static_cast<volatile uint32_t*>(o.devAddr) = o.value;
          return true;
        });
    }
    return fuscoSuccess;
  }
  fuscoResult_t copy(void*, void* dst, const void* src, size_t bytes) override {
    push([dst, src, bytes] {
      std::atomic_thread_fence(std::memory_order_seq_cst);
      std::memcpy(dst, src, bytes);
      return true;
    });
    return fuscoSuccess;
  }
  size_t batchBytes() override { return sizeof(TwinBatch); }
  size_t batchSlots(size_t ntasks) override { return (ntasks + kTwinBatch - 1) / kTwinBatch; }
  fuscoResult_t fillBatches(const std::vector<DevCopyTask>& tasks, void* block,
                            size_t slots) override {
    TwinBatch* b = static_cast<TwinBatch*>(block);
    size_t at = 0;
    for (size_t i = 0; i < slots; ++i) {
      b[i].n = 0;
      for (; at < tasks.size() && b[i].n < kTwinBatch; ++at) b[i].t[b[i].n++] = tasks[at];
    }
    if (at < tasks.size())
      return FUSCO_FAIL(fuscoInternalError, kEngine, "%zu copy tasks do not fit %zu batches",
                        tasks.size(), slots);
    return fuscoSuccess;
  }
  fuscoResult_t copyDeferred(void*, const void* block, size_t slots) override {
    const TwinBatch* b = static_cast<const TwinBatch*>(block);
    volatile uint32_t* beat = beat_;
    push([b, slots, beat] {
      std::atomic_thread_fence(std::memory_order_seq_cst);
      for (size_t i = 0; i < slots; ++i)
        for (uint64_t k = 0; k < b[i].n && k < kTwinBatch; ++k) {
          hostCopyTask(b[i].t[k], beat);
          if (beat != nullptr) *beat = *beat + 1;
        }
      return true;
    });
    return fuscoSuccess;
  }
  fuscoResult_t drain() override;
  void setMotion(std::function<uint64_t()> motion) override { motion_ = std::move(motion); }

 private:
  void push(std::function<bool()> item) {
    {
      std::lock_guard<std::mutex> g(mu_);
      items_.push_back(std::move(item));
    }
    cv_.notify_all();
  }
  void run();

  const int64_t timeoutMs_;
  volatile uint32_t* const beat_;
  std::function<uint64_t()> motion_;
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<std::function<bool()>> items_;
  bool stop_ = false, busy_ = false;
  std::thread thread_;
};

void HostOps::run() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !items_.empty(); });
    if (items_.empty()) return;  // stopping
    std::function<bool()> item = items_.front();
    busy_ = true;
    lk.unlock();
    const bool done = item();
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(20));
    if (done && beat_ != nullptr) *beat_ = *beat_ + 1;
    lk.lock();
    busy_ = false;
    if (done) items_.pop_front();
    if (items_.empty()) idle_.notify_all();
  }
}

// Bounded: every wait of the stream is watched and released by the progress thread once nothing
// moved for the comm's timeout; nothing moving for twice that is a bug, reported instead of
// waiting on.
fuscoResult_t HostOps::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  const auto limit = std::chrono::milliseconds(2 * timeoutMs_ + 1000);
  const auto done = [&] { return items_.empty() && !busy_; };
  uint64_t seen = motion_ ? motion_() : 0;
  while (!idle_.wait_for(lk, limit, done)) {
    const uint64_t now = motion_ ? motion_() : 0;
    if (now == seen)
      return FUSCO_FAIL(fuscoInternalError, kEngine,
                        "the host twin's stream did not move for twice the timeout");
    seen = now;
  }
  return fuscoSuccess;
}

}  // namespace

std::unique_ptr<StreamOps> cudaStreamOps() { return std::make_unique<CudaOps>(); }
std::unique_ptr<StreamOps> hostStreamOps(int64_t timeoutMs, volatile uint32_t* beat) {
  return std::make_unique<HostOps>(timeoutMs, beat);
}

}  // namespace fusco
