// The values every rank must pass alike in a MoE call (Communicator::agreeInCall): the first
// operation of the call carries them to every peer, so a rank that differs fails the call on every
// rank at once, with a message naming the value and both ranks, instead of misrouting rows or
// failing later on byte counts that do not pair up.
#include <cstdio>
#include <string>

#include "moe/moe_exec.h"

namespace fusco {

namespace {

std::string showDedup(uint64_t v) { return dedupName(static_cast<Dedup>(v)); }

std::string showPlanner(uint64_t v) {
  return v ? "the GPU planner's steps (FUSCO_PLAN)" : "the host planner (FUSCO_PLAN)";
}

std::string showDigest(uint64_t v) {
  char buf[32];
  snprintf(buf, sizeof(buf), "digest %016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string showDataType(uint64_t v) {
  switch (static_cast<int>(v)) {
    case fuscoFloat32:
      return "fuscoFloat32";
    case fuscoBfloat16:
      return "fuscoBfloat16";
    case fuscoFloat16:
      return "fuscoFloat16";
  }
  return std::to_string(v);
}

// FNV-1a over the placement: equal placements give equal digests on every rank.
uint64_t placementDigest(const std::vector<int>& expertToRank) {
  uint64_t d = 0xcbf29ce484222325ull;
  for (int r : expertToRank) {
    d ^= static_cast<uint32_t>(r);
    d *= 0x100000001b3ull;
  }
  return d;
}

}  // namespace

std::vector<AgreeValue> planAgreement(const MoeHandle& h) {
  return {
      {"config.dedup", static_cast<uint64_t>(h.dedup), showDedup},
      {"config.numExperts", static_cast<uint64_t>(h.shape.numExperts)},
      {"config.expertToRank", placementDigest(h.shape.expertToRank), showDigest},
      {"config.expertAlignment", static_cast<uint64_t>(h.shape.expertAlignment)},
      {"planner", h.bySteps ? 1u : 0u, showPlanner},
      {"capacity mode (fuscoMoePlanCapacity)", h.capacity != 0 ? 1u : 0u},
  };
}

std::vector<AgreeValue> dispatchAgreement(size_t rowBytes) { return {{"rowBytes", rowBytes}}; }

std::vector<AgreeValue> combineAgreement(fuscoDataType_t dt, size_t hidden) {
  return {{"datatype", static_cast<uint64_t>(dt), showDataType}, {"hidden", hidden}};
}

}  // namespace fusco
