// What the enqueue-only engine (engine_async.h) needs from a stream, behind one interface:
//  - the CUDA runtime, for fuscoMemCuda comms (the caller's cudaStream_t);
//  - a host twin, for host comms with FUSCO_ASYNC_HOST=1: one thread per comm plays the stream,
//    running the same operation programs (device/op_program.h: waits, posts, copy tasks) in
//    order on host memory, so the protocol of the CUDA path runs, and is tested, on machines
//    without a GPU. A twin call waits for its stream at its end (host comms return when the data
//    is in place).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "device/cuda_enqueue.h"
#include "device/device_ops.h"
#include "fusco.h"

namespace fusco {

class StreamOps {
 public:
  virtual ~StreamOps() = default;
  // Memory the host writes and the stream reads (*mapped: its address for the stream).
  virtual fuscoResult_t allocMapped(size_t bytes, void** host, void** mapped) = 0;
  virtual void freeMapped(void* host) = 0;
  virtual fuscoResult_t capturing(void* stream, bool* yes) = 0;
  // The copy batches of the operations' copy steps (device_ops.h).
  virtual size_t batchBytes() = 0;
  virtual size_t batchSlots(size_t ntasks) = 0;
  virtual fuscoResult_t fillBatches(const std::vector<DevCopyTask>& tasks, void* block,
                                    size_t slots) = 0;
  // Stream-ordered: one launch of an operation's program (device/op_program.h), steps
  // [first, first + count) of the block whose stream address is `block`. Its waits are its own.
  virtual fuscoResult_t launchOp(void* stream, char* block, uint32_t first, uint32_t count) = 0;
  // The host twin: waits until its stream ran everything enqueued (CUDA: nothing to do).
  virtual fuscoResult_t drain() { return fuscoSuccess; }
  // The host twin: drain's bound restarts whenever motion() changes (the ranks' streams move).
  virtual void setMotion(std::function<uint64_t()> motion) { (void)motion; }
};

std::unique_ptr<StreamOps> cudaStreamOps();
// timeoutMs bounds drain(); the stream's waits end by themselves (their words, the abort word, the
// timeout). beat (may be NULL): a word the stream raises after each item and each copy task it
// finishes.
std::unique_ptr<StreamOps> hostStreamOps(int64_t timeoutMs, volatile uint32_t* beat = nullptr);

// FUSCO_ASYNC_HOST: 1 runs host comms' calls through the enqueue-only engine on a host twin.
int64_t paramAsyncHost();

}  // namespace fusco
