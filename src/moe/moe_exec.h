// The algorithms behind moeDispatch and moeCombine, one file each (the moe layer's internals).
#pragma once

#include <vector>

#include "core/arg_check.h"
#include "engine/engine.h"
#include "moe/moe_handle.h"
#include "moe/moe_op.h"

namespace fusco {

// Host dispatch (dispatch_rank.cc: NONE and RANK; dispatch_node.cc: NODE). *work: the operation
// this rank ran (its sends are the traffic it put on each path).
fuscoResult_t hostDispatch(MoeHandle& h, const void* x, size_t rowBytes, void* recvX,
                           const ArgCheck& a, MoeWork* work);
fuscoResult_t hostDispatchNode(MoeHandle& h, const void* x, size_t rowBytes, void* recvX,
                               ArgCheck a, MoeWork* work);
// The direct (RANK) message of dispatch between this rank and p.
void addRankDispatch(const MoeHandle& h, int p, const void* x, size_t rowBytes, void* recvX,
                     MoeWork* work);
// Zeroes the padding rows of recvX (expert alignment) on the host.
void zeroPaddingRows(const MoeHandle& h, size_t rowBytes, void* recvX);

// Host combine (combine_rank.cc: NONE and RANK; combine_node.cc: NODE). *work: the partial
// rows' operation (what this rank sent back).
fuscoResult_t hostCombine(MoeHandle& h, const void* expertOut, fuscoDataType_t dt, size_t hidden,
                          const float* topkWeights, void* out, ArgCheck a, MoeWork* work);
fuscoResult_t hostCombineNode(MoeHandle& h, const void* expertOut, fuscoDataType_t dt,
                              size_t hidden, const float* topkWeights, void* out, ArgCheck a,
                              MoeWork* work);

// Combine's first operation under RANK and NODE dedup: the routing weights of every fan-out
// entry to the expert side (into h.recvWeights).
fuscoResult_t shipWeights(MoeHandle& h, const float* topkWeights, const ArgCheck& a);

// Source side of combine (combine_sum.cc): out[t] = the fixed tree's sum over nodes (ascending)
// of the sums over each node's ranks (ascending) of the token's partials. landing[r]: the rows
// rank r sent back; nodeLanding (NODE dedup): one made sum per token for every other node.
struct SumInputs {
  fuscoDataType_t dt;
  size_t rowOut, hidden;
  const float* weights;
  const std::vector<char*>* landing;
  const std::vector<char*>* nodeLanding;
};
void finalSum(const MoeHandle& h, const SumInputs& in, void* out);

// Device paths (device_exec.cc): the same operations with kernels moving the rows.
fuscoResult_t deviceDispatch(MoeHandle& h, const void* x, size_t rowBytes, void* recvX, ArgCheck a,
                             void* stream, std::vector<PeerWork>* work);
fuscoResult_t deviceCombine(MoeHandle& h, const void* expertOut, fuscoDataType_t dt, size_t hidden,
                            const float* topkWeights, void* out, ArgCheck a, void* stream,
                            std::vector<PeerWork>* work);
// Combine's messages on a CUDA comm, one pull message per peer p: this rank offers its expert
// output (`extent` bytes) for the h.sizes.slotsFrom[p] rows p reads there, or, where push[p] (p
// cannot map it), pushes those rows in p's slot order; and it gets h.sizes.slotsTo[p] rows of
// p's. Unsized (a capacity plan before it resolved): zero-byte placeholders, one per pair.
void deviceCombineStreams(const MoeHandle& h, bool sized, const char* expertOut, size_t rowOut,
                          size_t extent, const std::vector<bool>& push,
                          std::vector<PeerWork>* work);
// A capacity plan's combine, sized on the progress thread (Op::late) once the plan resolved: the
// streams above from the plan's sizes and the call's traffic, or the call's failure on every rank
// when the plan failed.
LateSizes deviceCombineLate(MoeHandle& h, const char* expertOut, size_t rowOut, size_t extent,
                            const std::vector<bool>& push);
// This rank's traffic in the operation it ran (fuscoMoeGetStats), under h.statsMu: a capacity
// plan's dispatch and combine note it on the progress thread, once sized.
void noteDispatchStats(MoeHandle& h, const std::vector<PeerWork>& work, size_t rowBytes);
// Combine's traffic includes the routing weights where they travel (the host path with dedup).
void noteCombineStats(MoeHandle& h, const std::vector<PeerWork>& work, size_t rowBytes);
// Copies the plan's index lists to the device (device_plan.cc), on `stream`.
fuscoResult_t uploadMoePlan(MoeHandle& h, void* stream);

// Plan-time steps (plan_node.cc): NODE dedup's counts, balancer, forward metadata and the
// forwarders' blocks, from the RANK send plan in h.send. Leaves in *metaFrom the RANK-format
// metadata every source would have sent this rank, for planRecv. A malformed peer message sets
// *b instead of failing, so this rank still takes part in the remaining exchanges.
fuscoResult_t planNodeDedup(MoeHandle& h, const ArgCheck& a,
                            std::vector<std::vector<int32_t>>* metaFrom, ArgCheck* b);
// The balancer mode of a config's FUSCO_BALANCE_* value (AUTO: the best available, GREEDY).
Balance balanceMode(int requested);
// What every rank must pass alike (call_agreement.cc), carried by the call's first operation
// (Communicator::agreeInCall). The plan's resolved config: dedup, numExperts, a digest of the
// placement and expertAlignment (balance matters under NODE dedup only, where the node counts
// exchange agrees on it with FUSCO_BALANCE_SLACK). Combine's datatype and hidden size.
std::vector<AgreeValue> planAgreement(const MoeHandle& h);
std::vector<AgreeValue> combineAgreement(fuscoDataType_t dt, size_t hidden);
// Dispatch: the row size (a sender's rows land in the receiver's rows of the same size).
std::vector<AgreeValue> dispatchAgreement(size_t rowBytes);

// NODE dedup's fan-row exchange between the ranks of a node: the RANK fan rows, then those of
// every forwarded segment, so sources and forwarders can write final rows directly.
fuscoResult_t exchangeNodeFanRows(MoeHandle& h, const ArgCheck& a);

}  // namespace fusco
