// The state behind a fuscoMoeHandle_t: the plans of one fuscoMoePlan call and the buffers that
// dispatch and combine reuse across calls.
#pragma once

#include <atomic>
#include <mutex>
#include <vector>

#include "device/cuda_rt.h"
#include "device/device_plan_ops.h"
#include "engine/communicator.h"
#include "fusco.h"
#include "plan/balance.h"
#include "plan/moe_plan.h"
#include "plan/node_plan.h"

namespace fusco {

struct MoeHandle {
  Communicator* comm = nullptr;
  MoeShape shape;
  Dedup dedup = Dedup::Rank;
  MoeSendPlan send;
  MoeRecvPlan recv;
  size_t numTokens = 0;
  int topk = 0;
  std::vector<int64_t> topkIdx;                 // [numTokens * topk] host copy
  std::vector<std::vector<int64_t>> weightIdx;  // [nranks] t*topk+k per fan-out entry sent
  std::vector<std::vector<float>> recvWeights;  // [nranks] weights per fan-out entry received
  // [nranks] where the rows this rank sends to r land in r's recvX (r's fan rows for them, in
  // the CSR shape send.kStart[r]), so dispatch can write final rows straight into r's buffer.
  std::vector<std::vector<int64_t>> remoteFanRows;
  fuscoMoeStats_t stats{sizeof(fuscoMoeStats_t), 0, 0, 0, 0, 0, 0};
  std::mutex statsMu;  // stats may be written by the progress thread (capacity plans)

  // NODE dedup across nodes (dedup == Node): `send` above is then the RANK plan, used for the
  // ranks of this node and for the routing weights; rows for other nodes go through forwarders.
  struct NodeState {
    Balance balance = Balance::Greedy;
    BalancePlan plan;
    std::vector<NodeSegment> segs;
    NodeSendPlan send;
    std::vector<NodeFwdSeg> fwd;                 // segments this rank forwards
    std::vector<std::vector<NodeInSeg>> inFrom;  // [nranks] segments forwarded to this rank
    std::vector<size_t> relayed;  // segments this rank relays for a peer of its node, global order
    // [k * localSize + lr]: where the rows of forwarded segment k land in local rank lr's recvX
    // (its fan rows, CSR), so the forwarder writes them there directly when it can map it.
    std::vector<std::vector<uint32_t>> fwdFanStart;
    std::vector<std::vector<int64_t>> fwdFanRows;
  } node;

  // fuscoMemCuda comms: the plan's index lists on the device (one upload per plan, stream-ordered;
  // dispatch and combine streams wait for it), as pointers into `devBuffer`.
  struct DevicePlan {
    std::vector<const int64_t*> sendRows, remoteFanRows, recvFanRows;  // [nranks]
    std::vector<const uint32_t*> sendKStart, recvFanStart;             // [nranks]
    const int64_t* paddingRanges = nullptr;  // (start, count) pairs of recv.padding
    int64_t paddingLongest = 0;              // rows in the longest range
    // Combine's sum at the source (DevFinalSum): per token, expert-output rows grouped by rank.
    const uint32_t* termStart = nullptr;
    const uint32_t* termRank = nullptr;
    const int64_t* termRow = nullptr;
    const int64_t* termWeight = nullptr;
    const uint8_t* termLast = nullptr;
  } dev;
  DeviceBuffer devBuffer;

  // The sizes of the plan's lists, per peer: what the device paths read on the host (both
  // planners fill them).
  struct Sizes {
    std::vector<size_t> rowsTo, slotsTo, rowsFrom, slotsFrom;
  } sizes;

  // A plan made by the planner's steps (plan_layer.h): the layer plan (in devBuffer on a CUDA
  // comm, in hostMem otherwise), its tables and summary on the host, and the receive lists the
  // sources sent (fanStart, fanRows, packed by source at rowOffFrom / entryOff).
  bool bySteps = false;
  // Capacity mode (fuscoMoePlanCapacity): receive rows per rank, 0 for a plan with sizes. Such a
  // plan's outcome is known on the progress thread only (planState, written there; dispatch and
  // combine read it there too), and its summary is on the host once summaryReady has passed.
  size_t capacity = 0;
  enum : int { kPlanPending = 0, kPlanReady = 1, kPlanFailed = 2 };
  std::atomic<int> planState{kPlanPending};
  struct Steps {
    LayerPlan plan, staged;
    std::vector<char> hostMem, hostFan;
    DeviceBuffer fanBuffer;
    uint32_t* fanStart = nullptr;
    int64_t* fanRows = nullptr;
    std::vector<uint32_t> rowOffFrom, entryOff;
    StreamEvent summaryReady;
  } steps;

  size_t rowsToSend() const {
    size_t n = 0;
    for (size_t r : sizes.rowsTo) n += r;
    return n;
  }
};

}  // namespace fusco
