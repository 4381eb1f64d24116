// The channels of an enqueue-only communicator (docs/DESIGN.md, "Channels"): every ordered pair of
// ranks on one node has a ring of `split` sub-rings of `depth` slots, mapped at init, through which
// every message that is not written in place moves, at any size (chan_roles.h). One area per
// rank, allocated where its peers can map it (fuscoMemAlloc's memory: CUDA IPC, or the shm arena
// of a host comm), holds, for each local peer j:
//   state[j]   this rank's own cursors and epochs for both directions of the pair;
//   slots[j]   the sub-rings j writes to this rank;
//   tails[j]   their tails (j writes them);
//   heads[j]   the heads of this rank's rings at j (j writes them as their consumer).
// Each side polls only its own area. FUSCO_CUDA_RING_BYTES sets each pair's slots, cut into
// FUSCO_CUDA_RING_SPLIT sub-rings of FUSCO_CUDA_RING_SLOTS slots.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "device/chan_roles.h"
#include "fusco.h"

namespace fusco {

class Communicator;

class Channels {
 public:
  // Allocates, zeroes and exports this rank's area and maps every local peer's (collective over
  // the comm's bootstrap, at init; a failure on any rank fails it on every rank, naming that
  // rank). A comm with no local peer has no channels.
  fuscoResult_t map(Communicator& c);
  // The pair with `peer` has a channel.
  bool has(int peer) const {
    return peer >= 0 && static_cast<size_t>(peer) < peerArea_.size() && peerArea_[peer] != nullptr;
  }
  // A role of this rank with `peer`: send (this rank produces) or receive; its addresses, sizes
  // and state, for `ntasks` messages at `tasks`.
  chan::Role role(int peer, bool send, const DevCopyTask* tasks, uint32_t ntasks) const;
  // Frees this rank's area (the comm's teardown, once no stream uses it).
  void release(Communicator& c);
  size_t areaBytes() const { return total_; }
  const chan::RingDims& dims() const { return dims_; }

 private:
  size_t stateAt(int j) const { return j * stateBytes_; }
  size_t slotsAt(int j) const { return slotsBase_ + j * chan::pairBytes(dims_); }
  size_t tailsAt(int j) const { return tailsBase_ + j * wordsBytes_; }
  size_t headsAt(int j) const { return headsBase_ + j * wordsBytes_; }
  // Where x sits among owner's local peers (ranks of their node but owner, ascending).
  int indexOf(int owner, int x) const;
  void layOut(int localPeers);
  fuscoResult_t exportArea(Communicator& c, std::vector<uint64_t>* tokens);
  fuscoResult_t mapPeers(Communicator& c, const std::vector<std::string>& all);

  chan::RingDims dims_{};
  size_t stateBytes_ = 0, wordsBytes_ = 0;
  size_t slotsBase_ = 0, tailsBase_ = 0, headsBase_ = 0, total_ = 0;
  int me_ = -1;
  std::vector<int> nodeRanks_;   // this node's ranks, ascending
  char* area_ = nullptr;         // this rank's area (the kernels' address)
  std::vector<char*> peerArea_;  // [rank]: a local peer's area, mapped here; nullptr otherwise
};

// This rank's state for one pair: the cursors and epochs of both directions.
struct ChannelPairState {
  chan::ProducerCursor send[chan::kMaxSplit];
  chan::ConsumerCursor recv[chan::kMaxSplit];
  uint64_t sendEpoch;
  uint64_t recvEpoch;
};

}  // namespace fusco
