// The state behind a fuscoMoeHandle_t: the plans of its last fuscoMoePlan or fuscoMoeReplan call
// and the buffers that dispatch, combine and the next replan reuse across calls.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/sparse_bytes.h"
#include "device/cuda_rt.h"
#include "device/device_plan_ops.h"
#include "engine/communicator.h"
#include "fusco.h"
#include "plan/balance.h"
#include "plan/moe_plan.h"
#include "plan/node_plan.h"

namespace fusco {

// Where one list of a plan keeps its elements, and how many bytes it holds there (its capacity).
struct ListStorage {
  std::string name;
  const void* data = nullptr;
  size_t bytes = 0;
  bool operator==(const ListStorage& o) const {
    return name == o.name && data == o.data && bytes == o.bytes;
  }
};

// The engine operations of one planning call, named after it in messages.
struct PlanNames {
  const char* call;
  const char* nodeCounts;
  const char* metadata;
  const char* forwarded;
  const char* fanRows;
  // By the GPU planner's steps (plan_layer.cc).
  const char* checks;
  const char* counts;
  const char* bases;
  const char* routing;
  const char* fanLists;
};

// One plan by the steps, where its lists lie: the layer plan where the steps ran, its tables and
// summary on the host, and its receive lists. A capacity plan resolves on the progress thread
// from a copy of its own (plan_layer.cc), so a replan may carve the next one meanwhile.
struct PlanView {
  LayerPlan plan, staged;
  uint32_t* fanStart = nullptr;
  int64_t* fanRows = nullptr;
};

struct MoeHandle {
  Communicator* comm = nullptr;
  // The config of the fuscoMoePlan that made the handle, for its replans: the placement and the
  // alignment are in `shape`, the resolved dedup mode in `dedup`, the balancer mode in
  // node.balance.
  MoeShape shape;
  Dedup dedup = Dedup::Rank;
  // False from the start of a replan until it succeeds: dispatch, combine and the receive counts
  // refuse the handle meanwhile (a failed replan failed on every rank, docs/API.md).
  bool planned = false;
  const PlanNames* names = nullptr;  // of the call that planned it last
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

  // The plan exchanges' working lists ([nranks] each), kept so that a replan reuses their storage.
  struct PlanScratch {
    std::vector<std::vector<int32_t>> metaFrom;  // RANK-format metadata from each source
    std::vector<std::vector<int32_t>> wordsOut, blocksOut, blocksIn;  // NODE dedup's steps 2, 3
    std::vector<std::vector<int64_t>> fanOut, fanIn;                  // NODE dedup's fan rows
  } scratch;

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
    const uint32_t* termSeq = nullptr;  // each term's packed slot (rows a peer pushes back)
    // Their host side (plan/moe_plan.h's planSumTerms), kept for the next upload.
    MoeSumTerms terms;
  } dev;
  // Two host halves: a capacity replan writes its tables into the half its predecessor is not
  // reading back into (DeviceBuffer).
  DeviceBuffer devBuffer{2};

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
  // What the last plan by the steps cost the host (api/moe_inspect.h): exchanges of host data
  // with the peers (Communicator::hostRounds) and read-backs that wait for the stream.
  struct PlanRounds {
    uint64_t hostRounds = 0, readBacks = 0;
  };
  struct Steps {
    PlanRounds rounds;
    LayerPlan plan, staged;
    std::vector<char> hostMem;
    // A host comm's receive lists; a capacity plan sizes them for recvCapacity rows.
    SparseBytes hostFan;
    DeviceBuffer fanBuffer;
    uint32_t* fanStart = nullptr;
    int64_t* fanRows = nullptr;
    std::vector<uint32_t> rowOffFrom, entryOff;
    StreamEvent summaryReady[2];  // a capacity plan's summary, per half of devBuffer's host side
    // The receive counts where the device reads them (fuscoMoeGetRecvCountsDevice): a small
    // allocation of its own, made once, so the pointers stay valid across replans.
    DeviceBuffer countsBuffer;
    std::vector<int64_t> hostCounts;
    int64_t* counts = nullptr;
  } steps;

  // Every list the plan holds and the device buffer's two sides: the same before and after a
  // replan that fits in what the handle holds (tests/mp/test_moe_replan.cc checks that a replan
  // allocates none of them again; the capacity shows a list allocated anew at a smaller size even
  // where the allocator hands the same address back).
  std::vector<ListStorage> storage() const;

  size_t rowsToSend() const {
    size_t n = 0;
    for (size_t r : sizes.rowsTo) n += r;
    return n;
  }
  // Rows recvX and expertOut must hold: a capacity plan's capacity, else the plan's receive rows.
  size_t recvRowsBound() const { return capacity != 0 ? capacity : recv.numRecvRows; }
  // Rows dispatch may read from x: a capacity plan's sizes are the progress thread's, so its
  // tokens bound them; else the rows the plan sends.
  size_t sendRowsBound() const { return capacity != 0 ? numTokens : rowsToSend(); }
  // The plan the caller's thread made last (the progress thread resolves from its own copy).
  PlanView stepsView() const {
    return PlanView{steps.plan, steps.staged, steps.fanStart, steps.fanRows};
  }
};

}  // namespace fusco
