// Calls on a fuscoMemCuda communicator only enqueue (docs/DESIGN.md, "Stream-ordered CUDA
// calls"). The caller's thread launches, on its stream and without waiting for anything, the
// operation's one kernel (op_launch.h), whose waits are its own:
//   wait GO(k) -> "ready" to every involved peer -> wait their "ready" -> copy batches A and the
//   ring step ->
//   "done" to every involved peer -> wait their "done" -> scatter of a remote peer's rows ->
//   "consumed"(k),
// (a pull operation swaps the two flags and runs its reading kernel between two launches), then
// hands the operation to the comm's progress thread (exec/progress.h). That thread exchanges the
// headers and verdicts with the peers' progress threads, finds where each message lands, writes the
// copy batches (and a pull operation's peer bases) into the operation's parameters in pinned memory
// the kernels read, and sets GO(k). A call whose arguments disagree with a peer's moves no byte:
// its parameters stay empty, every stream still completes, and fuscoCommGetAsyncError reports it
// on the involved ranks while the comm stays usable. Anything else that fails breaks the comm and
// sets the abort word every wait of its kernels reads.
//
// Every involved pair posts and waits for both flags in every operation, whatever its byte
// counts, so the pair's counters stay equal on both sides even when one side's call was invalid.
//
// CUDA graphs: a call made while its stream is captured is enqueued the same way and resolved
// once, while the peers capture theirs; its parameters are its own, kept until the comm goes, and
// its messages go through the channels, so every replay moves the same rows of the same buffers
// (new contents, same bytes as an eager call). Replays repeat fixed values, so a captured
// operation's ready/done flags are the binary semaphores of DeviceFlags kinds 2 and 3 (post 1; the
// waiter resets its word to 0), and GO, which only grows, stays passed after the first resolution.
// A dead peer during a replay is seen by the idle progress thread's periodic check, which sets the
// abort word.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "engine/engine.h"
#include "exec/device_queue.h"
#include "exec/stream_ops.h"

namespace fusco {

// Enqueues op on op.stream and hands it to the progress thread (op is moved from). Returns
// op.argStatus (this rank's own argument check, with its message) at once; every later outcome is
// asynchronous. *agreedFailure: the failure ends the call alike on every rank (the comm stays
// usable); any other failure leaves the peers waiting and must break the comm.
fuscoResult_t enqueueDeviceOp(Communicator& c, Op& op, bool* agreedFailure);

}  // namespace fusco
