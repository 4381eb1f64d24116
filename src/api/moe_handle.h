// The state behind a fuscoMoeHandle_t: the plans of one fuscoMoePlan call and the buffers that
// dispatch and combine reuse across calls.
#pragma once

#include <functional>
#include <vector>

#include "api/api_internal.h"
#include "device/cuda_rt.h"
#include "engine/engine.h"
#include "plan/balance.h"
#include "plan/moe_plan.h"
#include "plan/node_plan.h"

struct fuscoMoeHandle {
  fuscoComm_t comm = nullptr;
  fusco::MoeShape shape;
  fusco::Dedup dedup = fusco::Dedup::Rank;
  fusco::MoeSendPlan send;
  fusco::MoeRecvPlan recv;
  size_t numTokens = 0;
  int topk = 0;
  std::vector<int64_t> topkIdx;                     // [numTokens * topk] host copy
  std::vector<std::vector<int64_t>> weightIdx;      // [nranks] t*topk+k per fan-out entry sent
  std::vector<std::vector<float>> recvWeights;      // [nranks] weights per fan-out entry received
  // [nranks] where the rows this rank sends to r land in r's recvX (r's fan rows for them, in
  // the CSR shape send.kStart[r]), so dispatch can write final rows straight into r's buffer.
  std::vector<std::vector<int64_t>> remoteFanRows;
  fuscoMoeStats_t stats{sizeof(fuscoMoeStats_t), 0, 0, 0, 0, 0, 0};

  // NODE dedup across nodes (dedup == Node): `send` above is then the RANK plan, used for the
  // ranks of this node and for the routing weights; rows for other nodes go through forwarders.
  struct NodeState {
    fusco::Balance balance = fusco::Balance::Greedy;
    fusco::BalancePlan plan;
    std::vector<fusco::NodeSegment> segs;
    fusco::NodeSendPlan send;
    std::vector<fusco::NodeFwdSeg> fwd;                  // segments this rank forwards
    std::vector<std::vector<fusco::NodeInSeg>> inFrom;   // [nranks] segments forwarded to this rank
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
    std::vector<const uint32_t*> sendKStart, recvFanStart;                         // [nranks]
    const int64_t* paddingRows = nullptr;
    // Combine's sum at the source (DevFinalSum): per token, expert-output rows grouped by rank.
    const uint32_t* termStart = nullptr;
    const uint32_t* termRank = nullptr;
    const int64_t* termRow = nullptr;
    const int64_t* termWeight = nullptr;
    const uint8_t* termLast = nullptr;
  } dev;
  fusco::DeviceBuffer devBuffer;
};

namespace fusco {

// One collective engine operation of a MoE call: work[p] is what this rank sends to and receives
// from rank p. A rank whose own arguments failed (`a`) still takes part so nobody waits for it.
// agreed: every rank already validated this call in an earlier operation (no verdict round).
// onDevice: the buffers are device memory of a fuscoMemCuda comm and move on `stream`; otherwise
// they are host memory (also on a CUDA comm: the planner's own exchanges). pullRun: a pull
// operation on the device (engine.h's Op::pullRun).
fuscoResult_t runMoeOp(fuscoComm_t comm, const char* name, const ArgCheck& a,
                       const std::vector<PeerWork>& work, bool agreed = false, void* stream = nullptr,
                       bool onDevice = false,
                       std::function<fuscoResult_t(const std::vector<const char*>&, void*)> pullRun = nullptr);

// A local step that failed before a collective operation (scratch, device set-up): recorded as
// this rank's error in *a, so the rank still joins the operation and its peers fail at once with
// its message instead of waiting for the timeout.
void joinFailure(fuscoResult_t r, ArgCheck* a);
// The comm's scratch slot for one step, or nullptr (bytes 0, *a already failed, or the failure
// recorded in *a as above).
char* joinScratch(Communicator& c, int slot, size_t bytes, ArgCheck* a);

// Above any list size or row count a plan reaches: a peer announcing more is malformed.
constexpr uint64_t kMaxPlanWords = uint64_t{1} << 34;

// An exchange of int32 word lists over the comm (sizes, then words): out[p] to rank p, in[p] from
// it. fuscoRemoteError if a peer announces more than kMaxPlanWords.
fuscoResult_t exchangeWords(fuscoComm_t comm, const char* name, const ArgCheck& a,
                            const std::vector<std::vector<int32_t>>& out,
                            std::vector<std::vector<int32_t>>* in);

// NODE dedup's plan-time steps (moe_node.cc): counts, the balancer, forward metadata and the
// forwarders' blocks, from the RANK send plan in h.send. Leaves in *metaFrom the RANK-format metadata every source would have sent
// this rank, for planRecv. A malformed peer message sets *b instead of failing, so this rank
// still takes part in the remaining exchanges.
fuscoResult_t planNodeDedup(fuscoComm_t comm, fuscoMoeHandle& h, const ArgCheck& a, int balance,
                            std::vector<std::vector<int32_t>>* metaFrom, ArgCheck* b);

// NODE dedup's fan-row exchange between the ranks of a node: the RANK fan rows, then those of
// every forwarded segment, so sources and forwarders can write final rows directly.
fuscoResult_t exchangeNodeFanRows(fuscoComm_t comm, fuscoMoeHandle& h, const ArgCheck& a);

// Copies the plan's index lists to the device (fuscoMemCuda comms), on `stream`.
fuscoResult_t uploadMoePlan(fuscoMoeHandle& h, void* stream);

}  // namespace fusco
