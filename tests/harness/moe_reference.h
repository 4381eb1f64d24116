// An independent, sequential reference for MoE dispatch and combine (docs/API.md, "MoE dispatch and
// combine"). It sees every rank's inputs at once and computes what every rank must end up with,
// straight from the definitions: no planner, no device code, its own bf16/fp16 conversions. Slow
// on purpose (obvious loops), fine for test sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fusco.h"

namespace fusco::test {

// The communicator shape and routing of every rank.
struct MoeRefProblem {
  int nranks = 0;
  int numExperts = 0;
  std::vector<int> placement;  // [numExperts] expert -> rank; empty: contiguous blocks
  int expertAlignment = 1;     // 0 or 1: no padding
  std::vector<int> nodeOf;     // [nranks] node of each rank
  int topk = 0;
  std::vector<size_t> numTokens;              // [nranks]
  std::vector<std::vector<int64_t>> topkIdx;  // [nranks][numTokens * topk], -1 = unused slot

  int rankOfExpert(int e) const;
};

// What every rank must receive in dispatch.
struct MoeRefDispatch {
  std::vector<std::vector<uint8_t>> recvX;                 // [rank] numRecvRows * rowBytes
  std::vector<size_t> numRecvRows;                         // [rank]
  std::vector<std::vector<int64_t>> tokensPerLocalExpert;  // [rank][local expert]
  // slotRow[s][t * topk + k]: the row of expertOut at rank of the slot's expert that holds
  // (s, t, k), or -1 for an unused slot.
  std::vector<std::vector<int64_t>> slotRow;
};

// x[s]: numTokens[s] rows of rowBytes. Padding rows are zero.
MoeRefDispatch moeRefDispatch(const MoeRefProblem& p, const std::vector<std::vector<uint8_t>>& x,
                              size_t rowBytes);

// Every rank's `out` (numTokens[s] * hidden elements of dt) from every rank's expertOut (the
// dispatch layout, hidden elements of dt per row) and topkWeights (empty vector: weights 1),
// following docs/API.md's fixed tree: per (token, rank) k ascending, then per node rank ascending,
// then nodes ascending; each level sums in fp32 from +0 (multiply and add rounded separately) and
// rounds to dt. Tokens with no valid slot get zeros.
std::vector<std::vector<uint8_t>> moeRefCombine(const MoeRefProblem& p, const MoeRefDispatch& d,
                                                const std::vector<std::vector<uint8_t>>& expertOut,
                                                fuscoDataType_t dt, size_t hidden,
                                                const std::vector<std::vector<float>>& weights);

// Rows rank `rank` puts on each path in dispatch (rows it keeps for itself are not counted).
struct MoeRefSendStats {
  size_t rankIntra = 0, rankInter = 0;  // RANK dedup: one per (token, distinct remote rank)
  size_t noneIntra = 0, noneInter = 0;  // NONE: one per (token, expert) on a remote rank
  size_t nodeInter = 0;                 // NODE: one per (token, distinct remote node)
};
MoeRefSendStats moeRefSendStats(const MoeRefProblem& p, int rank);

// The reference's own conversions (round to nearest even; NaN quiet; fp16 subnormals and inf).
float refToFloat(fuscoDataType_t dt, const uint8_t* elem);
void refFromFloat(fuscoDataType_t dt, float v, uint8_t* elem);
uint16_t refFloatToBf16(float v);
uint16_t refFloatToHalf(float v);
float refHalfToFloat(uint16_t h);

}  // namespace fusco::test
