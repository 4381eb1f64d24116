// The stream's part of an enqueued operation (engine_async.h): its program (device/op_program.h)
// written into its parameter block, and its launch. A push operation is one launch:
//   wait GO -> post "ready" to every involved peer -> wait for theirs -> copy batches A ->
//   ring step (the messages through the channels, channels.h) -> post "done" -> wait for theirs
//   -> copy batches B (a remote peer's rows) -> consumed,
// a pull operation two, around its reading kernel (handshakes swapped: "ready" is flag kind 1).
// Eager operations count each pair's handshakes (sendSeq, recvSeq); captured ones use the binary
// semaphores of flag kinds 2 and 3 (post 1, and the waiter clears its word once every block
// passed), since a replay repeats fixed values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_device.h"
#include "exec/device_queue.h"
#include "transport/transport.h"

namespace fusco {

// Where one operation's parameters lie in its block.
struct ParamLayout {
  size_t steps = 0;                 // room for this many program steps, after the header
  size_t slotsA = 0, slotsB = 0;    // copy batches before and after "done"
  size_t roles = 0, ringTasks = 0;  // room for ring roles and their messages (chan_roles.h)
  size_t offA = 0, offB = 0, offBases = 0, offAligned = 0, offRings = 0, bytes = 0;
  // A pull operation's reduce role (chan_reduce.h): its ReduceArgs, then per rank seqBase,
  // FeedState and feedOf.
  size_t offReduce = 0, offSeqBase = 0, offFeeds = 0, offFeedOf = 0;
};
ParamLayout layoutFor(StreamOps& ops, const Op& op, int n, int involvedPeers, size_t tasksA,
                      size_t tasksB);

// The flags of every involved pair and this operation's counter for each, both directions.
struct PairFlags {
  std::vector<DeviceFlags> flags;
  std::vector<uint32_t> sendSeq, recvSeq;
  std::vector<bool> involved;
  bool graph = false;  // a captured operation (kinds 2 and 3, binary semaphores)
  bool pull = false;   // a pull operation: "ready" is kind 1, its first handshake

  fuscoResult_t init(Communicator& c, const std::vector<bool>& inv, const Op& op);
  // The flag word of `kind`. A graph's semaphores go by handshake position (kind 2 for an
  // operation's first handshake, 3 for its second), so that any sequence of push and pull
  // operations alternates them and no post can be reset by the waiter of the previous one.
  int word(int kind) const;
};

// The progress thread: the operation's ring roles (t.ringSend, t.ringRecv) into its block, where
// its ring step reads them; a pull operation's messages from its peers as feeds, and its reduce
// role when any (t.reduce).
fuscoResult_t writeRoles(Communicator& c, const Op& op, const ParamLayout& l, const ParamBlock& b,
                         const DeviceTasks& t);

// Writes op's program into its block and launches it on op.stream; every eager wait is handed to
// the progress thread to watch first (which counts it for the guard, core/cuda_guard.h).
fuscoResult_t enqueueStream(Communicator& c, Op& op, const PairFlags& f, uint64_t index,
                            const ParamLayout& l, const ParamBlock& b);

}  // namespace fusco
