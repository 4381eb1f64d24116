// The engine's data phase on the GPU (fuscoMemCuda comms). After the header (and verdict) rounds,
// every message is a one-sided write by its sender's kernel: straight into the receiver's final
// rows when the receiver offered a buffer its peers can map (fuscoMemAlloc, registered, or the
// comm's own scratch), else into a staging area the receiver offered, which it then scatters into
// its final rows. Ordering between the ranks' streams uses the DeviceFlags of each pair:
//   receiver: "ready"(seq) -> sender: wait ready, copy kernel, "done"(seq) -> receiver: wait done,
//   scatter staged messages.
// A pull operation (Op::pullRun) turns this around: each sender offers its own buffer, says
// "ready", each receiver's kernel reads every peer's buffer in one pass and says "done reading".
// Nothing waits on the host; the DeviceWatch keeps every stream wait bounded.
#pragma once

#include <vector>

#include "engine/engine.h"
#include "engine/engine_wire.h"

namespace fusco {

// Where this rank receives each message of a device operation.
struct DeviceOffers {
  std::vector<std::vector<int64_t>> stagedAt;  // [peer][message] offset in `staging`, or -1
  char* staging = nullptr;
};

// For every message this rank receives that was not offered in place (mine[p].recvTokens, filled
// like on a host comm), reserves staging in the comm's scratch and offers that instead.
fuscoResult_t deviceOffers(Communicator& c, const Op& op, const std::vector<bool>& involved,
                           std::vector<PairHeader>* mine, DeviceOffers* offers);

// Enqueues the operation on op.stream. moves[p]: the pair with p moves data.
fuscoResult_t deviceDataPhase(Communicator& c, const Op& op, const std::vector<PairHeader>& mine,
                              const std::vector<PairHeader>& theirs, const std::vector<bool>& moves,
                              const DeviceOffers& offers);

}  // namespace fusco
