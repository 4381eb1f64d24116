// One direction of a pair's channel in host memory, for the ring-role unit tests
// (test_chan_roles.cc, test_chan_reduce.cc): its ring (the consumer's slots and tails, the
// producer's heads) and both sides' cursors and epochs, as a channel area holds them.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "device/chan_roles.h"

namespace fusco::test {

struct ChanDirection {
  chan::RingDims d;
  std::vector<char> slots;
  uint64_t tails[chan::kMaxSplit] = {}, heads[chan::kMaxSplit] = {};
  chan::ProducerCursor prod[chan::kMaxSplit] = {};
  chan::ConsumerCursor cons[chan::kMaxSplit] = {};
  uint64_t prodEpoch = 0, consEpoch = 0;
  explicit ChanDirection(chan::RingDims dims) : d(dims), slots(chan::pairBytes(dims)) {}

  // A role of `kind` on this direction with `peer`, for ntasks messages at tasks.
  chan::Role role(chan::RoleKind kind, uint32_t peer, const DevCopyTask* tasks, uint32_t ntasks) {
    chan::Role r{};
    r.kind = kind;
    r.peer = peer;
    r.ntasks = ntasks;
    r.split = d.split;
    r.depth = d.slots;
    r.slotBytes = d.slotBytes;
    r.tasks = reinterpret_cast<uint64_t>(tasks);
    r.slots = reinterpret_cast<uint64_t>(slots.data());
    r.tails = reinterpret_cast<uint64_t>(tails);
    r.heads = reinterpret_cast<uint64_t>(heads);
    const bool send = kind == chan::kProduce;
    r.cursors = send ? reinterpret_cast<uint64_t>(prod) : reinterpret_cast<uint64_t>(cons);
    r.epoch = reinterpret_cast<uint64_t>(send ? &prodEpoch : &consEpoch);
    return r;
  }
};

// The roles' copy (chan_roles.h): a plain copy, every access allowed.
inline bool chanCopy(char* to, const char* from, uint64_t n, bool) {
  if (to != nullptr && from != nullptr) std::memcpy(to, from, n);
  return true;
}

}  // namespace fusco::test
