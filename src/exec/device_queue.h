// The queue of a CUDA communicator's enqueued operations (docs/DESIGN.md, "Stream-ordered CUDA
// calls"): their numbers, the GO word the streams wait on, and the pinned ring of their
// parameters. The engine fills a block per operation; the progress thread lets it run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "core/ring_spans.h"
#include "exec/stream_ops.h"
#include "fusco.h"

namespace fusco {

// FUSCO_CUDA_PARAM_BYTES: the pinned ring that holds enqueued operations' parameters.
int64_t paramCudaParamBytes();
// FUSCO_CUDA_GRAPH_PARAM_BYTES: the pinned pool that holds captured operations' parameters.
int64_t paramCudaGraphParamBytes();

// One operation's parameters: its program (device/op_program.h) and copy batches, written by the
// host (host) and read by its kernel where they lie (mapped, the stream's address of host). The
// first 64 bytes are the program's header: its first word is set by the kernel once the operation
// is done with them.
struct ParamBlock {
  char* host = nullptr;
  char* mapped = nullptr;
};
constexpr size_t kParamHeader = 64;

// The deferred operations of one CUDA communicator: their numbers, the GO word, and the
// parameter ring (reclaimed oldest first, as operations mark their blocks done, so calls on
// several streams never reuse a block still in use).
class DeviceQueue {
 public:
  DeviceQueue() = default;
  ~DeviceQueue();
  DeviceQueue(const DeviceQueue&) = delete;
  DeviceQueue& operator=(const DeviceQueue&) = delete;
  // ops: the stream's implementation (stream_ops.h), kept by the comm for the queue's lifetime.
  // graphBytes: the pool captured operations' parameters are carved from.
  fuscoResult_t init(size_t ringBytes, size_t graphBytes, StreamOps* ops);

  uint64_t nextIndex() { return ++index_; }
  // Parameters for operation `index`, zeroed (an operation never resolved moves nothing). Waits
  // for the streams to finish older operations when the ring is full, up to timeoutMs, and gives
  // up at once when stop() says so.
  fuscoResult_t reserve(size_t bytes, uint64_t index, int64_t timeoutMs,
                        const std::function<bool()>& stop, ParamBlock* out);
  volatile uint32_t* goHost() const { return word(0); }
  void* goDev() const { return static_cast<char*>(pageDev_) + 0; }
  // The operations' abort and timeout words (device/op_steps.h OpWords), for their kernels.
  void* wordsDev() const { return static_cast<char*>(pageDev_) + kWordsAt; }
  // Every wait of every operation gives up from now on (the comm broke); sticky.
  void abort();
  // A wait of an operation's kernel passed the timeout: *peer and *phase say which (false: none).
  bool timedOut(uint32_t* peer, uint32_t* phase) const;
  // Parameters of a captured operation: its own, zeroed, kept until the queue goes, carved from
  // the pool allocated at init (a capture allocates nothing); fuscoInvalidUsage naming
  // FUSCO_CUDA_GRAPH_PARAM_BYTES once the pool is used up.
  fuscoResult_t graphParams(size_t bytes, ParamBlock* out);
  // The progress thread lets operation `index` run.
  void go(uint64_t index);

 private:
  static constexpr size_t kWordsAt = 64;  // the OpWords in the page, after GO
  volatile uint32_t* word(size_t at) const {
    return reinterpret_cast<volatile uint32_t*>(static_cast<char*>(pageHost_) + at);
  }
  void retireConsumed();

  std::mutex mu_;
  StreamOps* ops_ = nullptr;
  void* pageHost_ = nullptr;
  void* pageDev_ = nullptr;
  void* ringHost_ = nullptr;
  void* ringDev_ = nullptr;
  RingSpans spans_;
  uint64_t index_ = 0;
  void* graphHost_ = nullptr;
  void* graphDev_ = nullptr;
  size_t graphBytes_ = 0, graphUsed_ = 0;
};

}  // namespace fusco
