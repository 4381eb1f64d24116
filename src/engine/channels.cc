#include "engine/channels.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/cuda_guard.h"
#include "core/log.h"
#include "core/params.h"
#include "core/result.h"
#include "device/cuda_rt.h"
#include "engine/communicator.h"

namespace fusco {

FUSCO_PARAM_INT(CudaRingBytes, "FUSCO_CUDA_RING_BYTES", 2 << 20, 4096, int64_t{1} << 32,
                "the slots of each ordered pair of ranks on one node (its channel), mapped at init "
                "(bytes)");
FUSCO_PARAM_INT(CudaRingSplit, "FUSCO_CUDA_RING_SPLIT", 4, 1, chan::kMaxSplit,
                "sub-rings per channel");
FUSCO_PARAM_INT(CudaRingSlots, "FUSCO_CUDA_RING_SLOTS", 4, 1, chan::kMaxSlots,
                "slots per sub-ring of a channel (its depth)");

namespace {

size_t up64(size_t b) { return (b + 63) / 64 * 64; }

// The tokens that name an area to each rank (0 for ranks it is not offered to), as one blob.
std::string tokenBlob(const std::vector<uint64_t>& tokens) {
  return std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 8);
}

uint64_t tokenFor(const std::string& blob, int rank) {
  uint64_t t = 0;
  if (blob.size() >= (static_cast<size_t>(rank) + 1) * 8)
    std::memcpy(&t, blob.data() + rank * 8, 8);
  return t;
}

}  // namespace

void Channels::layOut(int localPeers) {
  const int64_t split = paramCudaRingSplit(), slots = paramCudaRingSlots();
  dims_.split = static_cast<uint32_t>(split);
  dims_.slots = static_cast<uint32_t>(slots);
  dims_.slotBytes = static_cast<uint64_t>(paramCudaRingBytes()) / (split * slots) / 16 * 16;
  stateBytes_ = up64(sizeof(ChannelPairState));
  wordsBytes_ = up64(chan::kMaxSplit * sizeof(uint64_t));
  slotsBase_ = stateBytes_ * localPeers;
  tailsBase_ = slotsBase_ + chan::pairBytes(dims_) * localPeers;
  headsBase_ = tailsBase_ + wordsBytes_ * localPeers;
  total_ = headsBase_ + wordsBytes_ * localPeers;
}

int Channels::indexOf(int owner, int x) const {
  const auto at = std::lower_bound(nodeRanks_.begin(), nodeRanks_.end(), x) - nodeRanks_.begin();
  return static_cast<int>(at) - (x > owner ? 1 : 0);
}

// This rank's part of each step of map: "" when it went well, else why not (the message of the
// failed call); every rank then learns the outcome, so a failure on one rank fails init on all of
// them at once instead of leaving them in the next exchange.
namespace {

std::string failureOf(fuscoResult_t r) { return r == fuscoSuccess ? "" : threadLastError(); }

fuscoResult_t agreed(Communicator& c, fuscoResult_t mine, const char* step) {
  int failed = -1;
  std::string why;
  FUSCO_CHECK(c.agreeOnOutcome(failureOf(mine), &failed, &why));
  if (failed < 0) return fuscoSuccess;
  return FUSCO_FAIL(failed == c.rank() ? fuscoSystemError : fuscoRemoteError, kInit,
                    "rank %d could not %s: %s", failed, step, why.c_str());
}

}  // namespace

// Allocates and zeroes this rank's area, and names it to each local peer (*tokens[q]).
fuscoResult_t Channels::exportArea(Communicator& c, std::vector<uint64_t>* tokens) {
  {
    CudaSetupWindow w;
    FUSCO_CHECK(c.setupWindow(&w, "allocating the channels"));
    void* p = nullptr;
    FUSCO_CHECK(c.memAlloc(total_, &p));
    area_ = static_cast<char*>(p);
    if (c.memType() == fuscoMemCuda)
      FUSCO_CHECK(cudaZeroSync(area_, total_));
    else
      std::memset(area_, 0, total_);
  }
  for (int q : nodeRanks_)
    if (q != me_ && !c.regionToken(q, area_, total_, &(*tokens)[q]))
      return FUSCO_FAIL(fuscoSystemError, kInit, "the channel area cannot be offered to rank %d",
                        q);
  return fuscoSuccess;
}

// Maps every local peer's area from the tokens they offered this rank.
fuscoResult_t Channels::mapPeers(Communicator& c, const std::vector<std::string>& all) {
  FUSCO_CHECK(c.mapPeerRegions());
  for (int q : nodeRanks_) {
    if (q == me_) continue;
    const PeerConn& pc = c.conn(q);
    void* base = pc.ops == nullptr || pc.ops->peerPointer == nullptr
                     ? nullptr
                     : pc.ops->peerPointer(pc.tc, q, tokenFor(all[q], me_), total_);
    if (base == nullptr)
      return FUSCO_FAIL(fuscoSystemError, kInit, "cannot map the channel area of rank %d", q);
    peerArea_[q] = static_cast<char*>(base);
  }
  return fuscoSuccess;
}

fuscoResult_t Channels::map(Communicator& c) {
  me_ = c.rank();
  const NodeMap& nodes = c.nodes();
  nodeRanks_ = nodes.ranksOfNode[nodes.nodeOf[me_]];
  peerArea_.assign(c.nranks(), nullptr);
  const int local = static_cast<int>(nodeRanks_.size()) - 1;
  layOut(local);
  if (const char* why = chan::dimsProblem(dims_))  // the same knobs on every rank
    return FUSCO_FAIL(fuscoInvalidArgument, kInit,
                      "FUSCO_CUDA_RING_BYTES / _SPLIT / _SLOTS: %s (%llu-byte slots)", why,
                      static_cast<unsigned long long>(dims_.slotBytes));
  // Every step is collective: a rank alone on its node takes part with nothing to offer.
  std::vector<uint64_t> tokens(c.nranks(), 0);
  FUSCO_CHECK(agreed(c, local > 0 ? exportArea(c, &tokens) : fuscoSuccess, "export its channels"));
  std::vector<std::string> all;
  FUSCO_CHECK(c.bootstrap().allGather(tokenBlob(tokens), &all));
  FUSCO_CHECK(agreed(c, local > 0 ? mapPeers(c, all) : fuscoSuccess, "map its peers' channels"));
  if (local > 0)
    FUSCO_INFO(kInit,
               "channels: %d local peers, %u x %u slots of %llu bytes each way per pair, %zu "
               "bytes per rank",
               local, dims_.split, dims_.slots, static_cast<unsigned long long>(dims_.slotBytes),
               total_);
  return fuscoSuccess;
}

void Channels::release(Communicator& c) {
  if (area_ != nullptr) c.memFree(area_);
  area_ = nullptr;
}

chan::Role Channels::role(int peer, bool send, const DevCopyTask* tasks, uint32_t ntasks) const {
  const int mine = indexOf(me_, peer), theirs = indexOf(peer, me_);
  char* other = peerArea_[peer];
  auto* state = reinterpret_cast<ChannelPairState*>(area_ + stateAt(mine));
  chan::Role r{};
  r.kind = send ? chan::kProduce : chan::kConsume;
  r.peer = static_cast<uint32_t>(peer);
  r.ntasks = ntasks;
  r.split = dims_.split;
  r.depth = dims_.slots;
  r.slotBytes = dims_.slotBytes;
  r.tasks = reinterpret_cast<uint64_t>(tasks);
  // The consumer's area holds the slots and tails, the producer's the heads.
  char* consumer = send ? other : area_;
  char* producer = send ? area_ : other;
  const int atConsumer = send ? theirs : mine, atProducer = send ? mine : theirs;
  r.slots = reinterpret_cast<uint64_t>(consumer + slotsAt(atConsumer));
  r.tails = reinterpret_cast<uint64_t>(consumer + tailsAt(atConsumer));
  r.heads = reinterpret_cast<uint64_t>(producer + headsAt(atProducer));
  r.cursors =
      send ? reinterpret_cast<uint64_t>(state->send) : reinterpret_cast<uint64_t>(state->recv);
  r.epoch = reinterpret_cast<uint64_t>(send ? &state->sendEpoch : &state->recvEpoch);
  return r;
}

}  // namespace fusco
