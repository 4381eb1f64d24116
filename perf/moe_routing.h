// Traffic patterns for moe_perf: seeded router outputs (topk_idx), routing weights and token rows.
//
// Experts are placed in contiguous blocks (fuscoMoeConfig_t.expertToRank = NULL): expert e lives on
// rank e / (numExperts / nranks). Every pattern draws `topk` distinct experts per token; the draw
// order is the k order (as a router's top-k would be, unsorted by expert id).
//   uniform      every expert equally likely.
//   single-node  each token first draws a node uniformly, then its experts uniformly among that
//                node's experts (all of a token's experts on one node). With one node this makes
//                exactly the same draws as uniform. A node with fewer than topk experts falls back
//                to all experts for its tokens.
//   imbalanced   bimodal load: the experts of the first half of the ranks (ranks < ceil(n/2), "hot")
//                are 3x as likely to be drawn as those of the other ranks, so a hot rank receives
//                about 3x the rows of a cold one (with several nodes the first nodes are hot).
//   zipf         expert popularity ~ Zipf(s = 1.0): the i-th most popular expert has weight
//                1/(i+1); the popularity order is a seeded random permutation of the experts, the
//                same on every rank.
//   imbalanced-rails  (several nodes) on every node the first half of the ranks by local index (the
//                same local indices on every node, so the same rails) send 3x the cross-node rows
//                of the other half: each token of a heavy rank takes all its experts on one other
//                node; a light rank's token does so with probability 1/3, else stays on its node.
// Everything is deterministic in (seed, rank), so every contender sees the same routing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fusco.h"

namespace fusco {
namespace perf {

enum class Pattern { Uniform, SingleNode, Imbalanced, Zipf, ImbalancedRails };

// Returns false on an unknown name.
bool parsePattern(const char* name, Pattern* out);
const char* patternName(Pattern p);

struct RoutingShape {
  int nranks = 1;
  int numExperts = 1;
  int topk = 1;
  size_t tokens = 0;  // per rank
  uint64_t seed = 1;
  Pattern pattern = Pattern::Uniform;
  std::vector<int> nodeOfRank;  // [nranks]
};

// [out] topkIdx: tokens x topk global expert ids for `rank`. Requires topk <= numExperts and
// numExperts % nranks == 0 (checked by the caller).
void makeRouting(const RoutingShape& s, int rank, std::vector<int64_t>* topkIdx);

// [out] w: n routing weights in [0.05, 1), seeded by (seed, rank).
void makeWeights(uint64_t seed, int rank, size_t n, std::vector<float>* w);

// Fills tokens rows of `hidden` elements of dt at x with seeded values in [-1, 1).
void fillRows(fuscoDataType_t dt, size_t hidden, size_t tokens, uint64_t seed, int rank, void* x);

// Reads element j of a row of dt as float (bf16 / fp16 / fp32).
float loadElement(fuscoDataType_t dt, const void* row, size_t j);

}  // namespace perf
}  // namespace fusco
