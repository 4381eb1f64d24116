#include "exec/device_queue.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/clock.h"
#include "core/log.h"
#include "core/params.h"
#include "core/result.h"
#include "device/op_steps.h"

namespace fusco {

FUSCO_PARAM_INT(CudaParamBytes, "FUSCO_CUDA_PARAM_BYTES", 4 << 20, 64 << 10, INT32_MAX,
                "pinned memory for the parameters of a CUDA comm's enqueued operations (bytes)");
FUSCO_PARAM_INT(CudaGraphParamBytes, "FUSCO_CUDA_GRAPH_PARAM_BYTES", 4 << 20, 64 << 10, INT32_MAX,
                "pinned memory for the parameters of a CUDA comm's captured operations, "
                "allocated at init (bytes)");

DeviceQueue::~DeviceQueue() {
  if (ops_ == nullptr) return;
  ops_->freeMapped(graphHost_);
  ops_->freeMapped(ringHost_);
  ops_->freeMapped(pageHost_);
}

fuscoResult_t DeviceQueue::init(size_t ringBytes, size_t graphBytes, StreamOps* ops) {
  ops_ = ops;
  FUSCO_CHECK(ops_->allocMapped(graphBytes, &graphHost_, &graphDev_));
  graphBytes_ = graphBytes;
  FUSCO_CHECK(ops_->allocMapped(4096, &pageHost_, &pageDev_));
  std::memset(pageHost_, 0, 4096);
  FUSCO_CHECK(ops_->allocMapped(ringBytes, &ringHost_, &ringDev_));
  spans_ = RingSpans(ringBytes);
  return fuscoSuccess;
}

// Frees the oldest blocks whose operations are done (their header word set by the stream).
void DeviceQueue::retireConsumed() {
  size_t at = 0;
  while (spans_.front(&at) &&
         *reinterpret_cast<volatile uint32_t*>(static_cast<char*>(ringHost_) + at) != 0)
    spans_.popFront();
}

fuscoResult_t DeviceQueue::reserve(size_t bytes, uint64_t index, int64_t timeoutMs,
                                   const std::function<bool()>& stop, ParamBlock* out) {
  std::unique_lock<std::mutex> lk(mu_);
  if (bytes > spans_.capacity())
    return FUSCO_FAIL(fuscoInvalidUsage, kEngine,
                      "an operation needs %zu bytes of parameters, more than "
                      "FUSCO_CUDA_PARAM_BYTES (%zu)",
                      bytes, spans_.capacity());
  const int64_t start = nowNs();
  size_t at = 0;
  for (;;) {
    retireConsumed();
    if (spans_.reserve(bytes, index, &at)) break;
    if (stop())
      return FUSCO_FAIL(fuscoRemoteError, kEngine,
                        "the communicator failed while a call waited for parameter space");
    if (nowNs() - start >= timeoutMs * 1000000LL)
      return FUSCO_FAIL(fuscoTimeout, kEngine,
                        "no parameter space within the timeout (%lld ms): the streams did not "
                        "finish older operations (raise FUSCO_CUDA_PARAM_BYTES?)",
                        static_cast<long long>(timeoutMs));
    lk.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    lk.lock();
  }
  out->host = static_cast<char*>(ringHost_) + at;
  out->mapped = static_cast<char*>(ringDev_) + at;
  std::memset(out->host, 0, bytes);
  return fuscoSuccess;
}

fuscoResult_t DeviceQueue::graphParams(size_t bytes, ParamBlock* out) {
  std::lock_guard<std::mutex> g(mu_);
  const size_t at = (graphUsed_ + 63) / 64 * 64;  // blocks start on a header's alignment
  if (at > graphBytes_ || bytes > graphBytes_ - at)
    return FUSCO_FAIL(fuscoInvalidUsage, kEngine,
                      "the captured operations of this communicator need more than "
                      "FUSCO_CUDA_GRAPH_PARAM_BYTES (%zu bytes) of parameters: this one needs %zu "
                      "more (raise FUSCO_CUDA_GRAPH_PARAM_BYTES)",
                      graphBytes_, bytes);
  graphUsed_ = at + bytes;
  out->host = static_cast<char*>(graphHost_) + at;
  out->mapped = static_cast<char*>(graphDev_) + at;
  std::memset(out->host, 0, bytes);
  return fuscoSuccess;
}

void DeviceQueue::go(uint64_t index) {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // parameters before the flag
  *goHost() = static_cast<uint32_t>(index);
}

void DeviceQueue::abort() {
  if (pageHost_ == nullptr) return;
  auto* w = reinterpret_cast<op::OpWords*>(static_cast<char*>(pageHost_) + kWordsAt);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  reinterpret_cast<volatile uint32_t*>(&w->abort)[0] = 1;
}

bool DeviceQueue::timedOut(uint32_t* peer, uint32_t* phase) const {
  if (pageHost_ == nullptr) return false;
  const auto* w = reinterpret_cast<const op::OpWords*>(static_cast<char*>(pageHost_) + kWordsAt);
  const uint32_t p = reinterpret_cast<const volatile uint32_t*>(&w->timedOut)[0];
  if (p == 0) return false;
  std::atomic_thread_fence(std::memory_order_acquire);  // the phase was written before the peer
  *peer = p - 1;
  *phase = reinterpret_cast<const volatile uint32_t*>(&w->phase)[0];
  return true;
}

}  // namespace fusco
