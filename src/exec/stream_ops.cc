#include "exec/stream_ops.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "core/clock.h"
#include "core/cuda_guard.h"
#include "core/log.h"
#include "core/params.h"
#include "core/result.h"
#include "device/cuda_rt.h"
#include "device/op_program.h"
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
  fuscoResult_t capturing(void* stream, bool* yes) override {
    return cudaStreamCapturing(stream, yes);
  }
  size_t batchBytes() override { return deviceCopyBatchBytes(); }
  size_t batchSlots(size_t ntasks) override { return deviceCopyBatchSlots(ntasks); }
  fuscoResult_t fillBatches(const std::vector<DevCopyTask>& tasks, void* block,
                            size_t slots) override {
    return deviceFillCopyBatches(tasks, block, slots);
  }
  fuscoResult_t launchOp(void* stream, char* block, uint32_t first, uint32_t count) override {
    return deviceLaunchOp(block, first, count, stream);
  }
};

// The host twin's batch: a count and its tasks.
constexpr size_t kTwinBatch = 32;
struct TwinBatch {
  uint64_t n;
  DevCopyTask t[kTwinBatch];
};

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
  fuscoResult_t capturing(void*, bool* yes) override {
    *yes = false;
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
  fuscoResult_t launchOp(void*, char* block, uint32_t first, uint32_t count) override {
    auto st = std::make_shared<op::RunState>();
    st->pc = first;
    volatile uint32_t* beat = beat_;
    push([block, first, count, st, beat] {
      const auto copy = [beat](const op::Step& s) {
        const TwinBatch* b = reinterpret_cast<const TwinBatch*>(s.addr);
        for (size_t i = 0; i < s.value; ++i)
          for (uint64_t k = 0; k < b[i].n && k < kTwinBatch; ++k) {
            hostCopyTask(b[i].t[k], beat);
            if (beat != nullptr) *beat = *beat + 1;
          }
      };
      const auto ringCopy = [beat](char* to, const char* from, uint64_t n, bool) {
        if (to == nullptr || from == nullptr) return true;  // an access check only
        std::memcpy(to, from, n);
        if (beat != nullptr) *beat = *beat + 1;
        return true;
      };
      return op::runSteps(block, first + count, *st, static_cast<uint64_t>(nowNs()), copy,
                          ringCopy);
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

// Bounded: every wait of the stream ends by itself (its word, the abort word the progress thread
// sets once nothing moved for the comm's timeout, or its own bound); nothing moving for twice the
// timeout is a bug, reported instead of waiting on.
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
