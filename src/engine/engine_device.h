// Where the rows of a device operation go (fuscoMemCuda comms), decided by the progress thread
// once the header (and verdict) rounds are done (engine_async.h runs the operation). A message
// moves straight into the receiver's final rows, written by its sender's kernel, when the receiver
// offered a buffer its peers have mapped (fuscoMemAlloc, registered); else through the pair's
// channel (channels.h): the sender's kernel produces it into the ring, the receiver's consumes it
// into its final rows. A pull operation (Op::pullRun) turns this around: each sender offers its own
// buffer and each receiver's kernel reads every peer's buffer in one pass; a sender that cannot
// offer its buffer pushes its rows through the pair's channel instead, and the receiver's ring
// step then computes the sum itself (device/chan_reduce.h).
#pragma once

#include <vector>

#include "device/device_ops.h"
#include "engine/engine.h"
#include "engine/engine_wire.h"

namespace fusco {

// Where this rank receives each message of a device operation.
struct DeviceOffers {
  std::vector<std::vector<bool>> ring;  // [peer][message]: through the pair's channel
};

// Grows the network bridge's areas for every remote peer of the operation, on the caller's thread
// in a setup window (net_bridge.h), before its first wait.
fuscoResult_t reserveBridgeAreas(Communicator& c, const Op& op, const std::vector<bool>& involved);

// For every message this rank receives from a peer of its node that was not offered in place
// (mine[p].recvTokens, filled like on a host comm), offers the pair's channel instead.
fuscoResult_t deviceOffers(Communicator& c, const Op& op, const std::vector<bool>& involved,
                           std::vector<PairHeader>* mine, DeviceOffers* offers);

// The kernels' work for one operation: `a` runs once every receiver's buffers are free (source
// rows into final rows), `b` once every sender's data is in place (a remote peer's rows from the
// bridge's area); ringSend[p] / ringRecv[p] are the messages to and from p through their channel,
// in message order (a send's sources, a receive's destinations); a pull operation has `bases`
// instead (one per peer, this rank's own for itself, nullptr: no message or pushed), its pushes
// in ringSend and the messages pushed to it in ringRecv (each read in place by the reduce role,
// which runs when `reduce`). ready: the tasks were
// built (pairs that disagree have none). Peers on other nodes (net_bridge.h): `a` gathers this
// rank's rows for such a peer into the bridge's send area and `b` scatters the peer's rows from its
// receive area; shipped[p] and landed[p] are the bytes each holds for this operation (host
// addresses), which the bridge ships after the stream's done post and expects before the peer's.
struct DeviceTasks {
  std::vector<DevCopyTask> a, b;
  std::vector<std::vector<DevCopyTask>> ringSend, ringRecv;  // [peer]
  std::vector<const char*> bases;
  bool reduce = false;
  struct Bridged {
    const char* send = nullptr;
    size_t sendBytes = 0;
    char* recv = nullptr;
    size_t recvBytes = 0;
  };
  std::vector<Bridged> bridged;  // [peer], empty without a bridge
  bool ready = false;
};

// moves[p]: the pair with p moves data.
fuscoResult_t deviceTasks(Communicator& c, const Op& op, const std::vector<PairHeader>& theirs,
                          const std::vector<bool>& moves, const DeviceOffers& offers,
                          DeviceTasks* out);

}  // namespace fusco
