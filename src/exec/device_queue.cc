#include "exec/device_queue.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/clock.h"
#include "core/log.h"
#include "core/params.h"
#include "core/result.h"

namespace fusco {

FUSCO_PARAM_INT(CudaParamBytes, "FUSCO_CUDA_PARAM_BYTES", 4 << 20, 64 << 10, INT32_MAX,
                "pinned memory for the parameters of a CUDA comm's enqueued operations (bytes)");

DeviceQueue::~DeviceQueue() {
  if (ops_ == nullptr) return;
  for (void* p : graphParams_) ops_->freeMapped(p);
  for (void* p : graphMirrors_) ops_->freeDevice(p);
  ops_->freeDevice(ringMirror_);
  ops_->freeMapped(ringHost_);
  ops_->freeMapped(pageHost_);
}

fuscoResult_t DeviceQueue::init(size_t ringBytes, StreamOps* ops) {
  ops_ = ops;
  FUSCO_CHECK(ops_->allocMapped(4096, &pageHost_, &pageDev_));
  std::memset(pageHost_, 0, 4096);
  FUSCO_CHECK(ops_->allocMapped(ringBytes, &ringHost_, &ringDev_));
  FUSCO_CHECK(ops_->allocDevice(ringBytes, &ringMirror_));
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
  out->mirror = static_cast<char*>(ringMirror_) + at;
  std::memset(out->host, 0, bytes);
  return fuscoSuccess;
}

fuscoResult_t DeviceQueue::graphParams(size_t bytes, ParamBlock* out) {
  std::lock_guard<std::mutex> g(mu_);
  void *h = nullptr, *d = nullptr, *m = nullptr;
  FUSCO_CHECK(ops_->allocMapped(bytes, &h, &d));
  graphParams_.push_back(h);
  FUSCO_CHECK(ops_->allocDevice(bytes, &m));
  graphMirrors_.push_back(m);
  std::memset(h, 0, bytes);
  out->host = static_cast<char*>(h);
  out->mapped = static_cast<char*>(d);
  out->mirror = static_cast<char*>(m);
  return fuscoSuccess;
}

void DeviceQueue::go(uint64_t index) {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // parameters before the flag
  *goHost() = static_cast<uint32_t>(index);
}

}  // namespace fusco
