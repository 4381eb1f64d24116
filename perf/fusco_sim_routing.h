// Routing for perf/fusco_sim: seeded, deterministic router outputs (topk_idx) for every rank of a
// simulated cluster of N nodes x G GPUs, experts in contiguous blocks per rank (expert e lives on
// rank e / (numExperts / nranks)). Every pattern draws `topk` distinct experts per token; each
// draw is weighted by expert popularity, a Zipf(s) law over a seeded permutation of the experts
// (the same on every rank; s = 0 is uniform).
//   real-world   DeepSeek-style group-limited routing: each token first picks at most maxNodes
//                distinct nodes (weighted by their experts' total popularity), then its experts
//                among those nodes' experts only. Popularity Zipf(s = 0.1): mild skew.
//   single-node  each token picks one node uniformly, then all its experts on that node.
//   imbalanced   on every node the first half of the ranks by local index ("heavy"; the same
//                local indices, so the same rails, on every node) send ~imbRatio x the cross-node
//                data of the other half: a heavy rank's token takes its experts on remote nodes
//                only (at most imbMaxNodes of them; 0: no limit, the default); a light rank's
//                token does so with probability 1/imbRatio and otherwise stays on its own node.
//                Hot experts: popularity Zipf(s = 0.7). No group limit: the pattern is defined
//                by who sends and which experts are hot, not by DeepSeek's node cap.
//   zipf         no node limit, popularity Zipf(s = 1.0).
// A pattern's skew can be overridden (zipfS >= 0). Deterministic in (seed, pattern, rank).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fusco {
namespace sim {

enum class SimPattern { RealWorld, SingleNode, Imbalanced, Zipf };

// Returns false on an unknown name.
bool parseSimPattern(const char* name, SimPattern* out);
const char* simPatternName(SimPattern p);
// The pattern's default popularity exponent (0.1, 0, 0.7, 1.0).
double defaultZipfS(SimPattern p);

struct SimRoutingSpec {
  int nodes = 8;
  int gpus = 8;          // ranks per node
  int numExperts = 256;  // a multiple of nodes * gpus
  int topk = 8;
  size_t tokens = 4096;  // per rank
  uint64_t seed = 1;
  SimPattern pattern = SimPattern::RealWorld;
  int maxNodes = 4;       // real-world: nodes a token's experts may span
  int imbMaxNodes = 0;    // imbalanced: remote nodes a remote token may span (0: every one)
  double imbRatio = 3.0;  // imbalanced: heavy / light cross-node data
  double zipfS = -1;      // < 0: the pattern's default
};

// Precomputed samplers for one spec (built once, then used for every rank).
class SimRouter {
 public:
  explicit SimRouter(const SimRoutingSpec& spec);
  // [out] topkIdx: tokens x topk global expert ids of `rank`, in draw (k) order.
  void route(int rank, std::vector<int64_t>* topkIdx) const;
  const SimRoutingSpec& spec() const { return spec_; }

 private:
  int drawNode(uint64_t* rng, const std::vector<double>& cdf) const;
  int drawExpertOf(uint64_t* rng, int node) const;

  SimRoutingSpec spec_;
  int perNode_ = 0;                       // experts per node
  std::vector<double> weight_;            // [numExperts] popularity
  std::vector<std::vector<double>> cdf_;  // [nodes] cumulative expert weight within the node
  std::vector<double> nodeCdf_;           // cumulative node weight
  std::vector<double> globalCdf_;         // cumulative expert weight (zipf)
};

}  // namespace sim
}  // namespace fusco
