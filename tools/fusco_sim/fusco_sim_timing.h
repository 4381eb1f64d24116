// fusco_sim's planner timing: the host planning one rank does per MoE layer under NODE dedup, with
// the real src/plan code and the metadata every other rank of a simulated cluster would send it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "fusco_sim_routing.h"

namespace fusco {
namespace sim {

struct PlanTimingSpec {
  SimRoutingSpec routing;  // nodes x gpus, experts, topk, tokens per rank, seed
  uint32_t slack = 64;     // GREEDY slack in 1/1024
  int reps = 5;
};

// Median milliseconds per step for rank 0, in the order fuscoMoePlan runs them.
struct PlanTiming {
  double validate = 0;  // validateTopk
  double send = 0;      // planSendInto (RANK rows and metadata)
  double balance = 0;   // planBalance GREEDY with relays + nodeSegmentsInto
  double nodeSend = 0;  // nodeTokensOf + planNodeSend (forward metadata)
  double forward = 0;   // planNodeForward + nodeBlocksFor for every rank of the node
  double receive = 0;   // planNodeReceive + planRecv
  double paper = 0;     // the FUSCO paper's balancer (paperBalance), for comparison
  double total() const { return validate + send + balance + nodeSend + forward + receive; }
  std::string balanceLine;   // describeBalance of the GREEDY plan
  size_t forwardedRows = 0;  // rows rank 0 forwards
  size_t receivedRows = 0;   // rows rank 0 receives (all sources)
};

// Builds every rank's routing, the balancer's counts and what every rank sends rank 0 and the
// other forwarders of its node (untimed), then times rank 0's steps `reps` times.
PlanTiming timePlanLayer(const PlanTimingSpec& spec);

}  // namespace sim
}  // namespace fusco
