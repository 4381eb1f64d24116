// Calls on a fuscoMemCuda communicator only enqueue (docs/DESIGN.md, "Stream-ordered CUDA
// calls"). The caller's thread enqueues, on its stream and without waiting for anything:
//   wait GO(k) -> "ready" to every involved peer -> wait their "ready" -> deferred copy kernel ->
//   "done" to every involved peer -> wait their "done" -> deferred scatter of staged messages ->
//   "consumed"(k),
// (a pull operation swaps the two flags and runs its reading kernel in between), then hands the
// operation to the comm's progress thread (progress.h). That thread exchanges the headers and
// verdicts with the peers' progress threads, finds where each message lands, writes the copy
// batches (and a pull operation's peer bases) into the operation's parameters in pinned memory
// the kernels read, and sets GO(k). A call whose arguments disagree with a peer's moves no byte:
// its parameters stay empty, every stream still completes, and fuscoCommGetAsyncError reports it
// on the involved ranks while the comm stays usable. Anything else that fails breaks the comm and
// releases every wait of its streams.
//
// Every involved pair posts and waits for both flags in every operation, whatever its byte
// counts, so the pair's counters stay equal on both sides even when one side's call was invalid.
//
// CUDA graphs: a call made while its stream is captured is enqueued the same way and resolved
// once, while the peers capture theirs; its parameters and staging are its own, kept until the
// comm goes, so every replay moves the same rows of the same buffers (new contents, same bytes as
// an eager call). Replays repeat fixed values, so a captured operation's ready/done flags are the
// binary semaphores of DeviceFlags kinds 2 and 3 (post 1; the waiter resets its word to 0), and GO,
// which only grows, stays passed after the first resolution. A dead peer during a replay is seen
// by the idle progress thread's periodic check, which releases the graph waits.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "core/ring_spans.h"
#include "engine/engine.h"
#include "engine/stream_ops.h"

namespace fusco {

// FUSCO_CUDA_PARAM_BYTES: the pinned ring that holds enqueued operations' parameters.
int64_t paramCudaParamBytes();

// One operation's parameters: written by the host (host), copied by its stream into device
// memory (mirror) once GO passed, where its kernels read them. The first 64 bytes are a header:
// its first word is set by the stream (through `mapped`, the device address of `host`) once the
// operation is done with them.
struct ParamBlock {
  char* host = nullptr;
  char* mapped = nullptr;
  char* mirror = nullptr;
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
  fuscoResult_t init(size_t ringBytes, StreamOps* ops);

  uint64_t nextIndex() { return ++index_; }
  // Parameters for operation `index`, zeroed (an operation never resolved moves nothing). Waits
  // for the streams to finish older operations when the ring is full, up to timeoutMs, and gives
  // up at once when stop() says so.
  fuscoResult_t reserve(size_t bytes, uint64_t index, int64_t timeoutMs,
                        const std::function<bool()>& stop, ParamBlock* out);
  volatile uint32_t* goHost() const { return word(0); }
  void* goDev() const { return static_cast<char*>(pageDev_) + 0; }
  // Parameters of a captured operation: its own, zeroed, kept until the queue goes.
  fuscoResult_t graphParams(size_t bytes, ParamBlock* out);
  // The progress thread lets operation `index` run.
  void go(uint64_t index);

 private:
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
  void* ringMirror_ = nullptr;
  RingSpans spans_;
  uint64_t index_ = 0;
  std::vector<void*> graphParams_;
  std::vector<void*> graphMirrors_;
};

// Enqueues op on op.stream and hands it to the progress thread (op is moved from). Returns
// op.argStatus (this rank's own argument check, with its message) at once; every later outcome is
// asynchronous. *agreedFailure: the failure ends the call alike on every rank (the comm stays
// usable); any other failure leaves the peers waiting and must break the comm.
fuscoResult_t enqueueDeviceOp(Communicator& c, Op& op, bool* agreedFailure);

}  // namespace fusco
