// The MoE routing generator shared by moe_perf and tools/fusco_sim: seeded, deterministic router
// outputs (topk_idx) for any rank of a cluster described by its node layout (node of every rank),
// experts in contiguous blocks per rank (expert e lives on rank e / (numExperts / nranks), as
// fuscoMoeConfig_t.expertToRank = NULL places them). Every pattern draws `topk` distinct experts
// per token, in draw (k) order, each draw weighted by expert popularity: a Zipf(s) law over a
// seeded permutation of the experts (the same on every rank; s = 0 is uniform).
//   uniform      every expert equally likely (s = 0), no node limit.
//   zipf         no node limit, popularity Zipf(s = 1.0).
//   single-node  each token picks one node uniformly, then all its experts on that node (s = 0).
//   real-world   DeepSeek-style group-limited routing: each token first picks at most maxNodes
//                distinct nodes (weighted by their experts' total popularity), then its experts
//                among those nodes' experts only. Popularity Zipf(s = 0.1): mild skew.
//   imbalanced   bimodal per-rank load on the rails: on every node the first half of the ranks by
//                local index ("heavy"; the same local indices, so the same rails, on every node)
//                send ~imbRatio x the cross-node data of the other half. A heavy rank's token takes
//                its experts on remote nodes only (at most imbMaxNodes of them; 0: no limit, the
//                default); a light rank's token does so with probability 1/imbRatio and otherwise
//                stays on its own node. Hot experts: popularity Zipf(s = 0.7). No group limit.
//   hot-ranks    bimodal receive load: the experts of the first half of the ranks
//                (ranks < ceil(n/2)) are imbRatio x as likely to be drawn (s = 0 otherwise), so a
//                hot rank receives about imbRatio x the rows of a cold one; no node limit.
// A node whose experts (or a token's chosen nodes' experts) number fewer than topk falls back to
// drawing among all experts. A pattern's skew can be overridden (zipfS >= 0). Deterministic in
// (seed, pattern, rank) for a given spec and layout. Pure host C++: no fusco header needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fusco {
namespace perf {

// The values are part of each rank's seed (kept stable so recorded figures stay reproducible).
enum class Pattern : int {
  RealWorld = 0,
  SingleNode = 1,
  Imbalanced = 2,
  Zipf = 3,
  Uniform = 4,
  HotRanks = 5
};

// Returns false on an unknown name.
bool parsePattern(const char* name, Pattern* out);
const char* patternName(Pattern p);
// "uniform | zipf | single-node | real-world | imbalanced | hot-ranks", for usage texts.
const char* patternNameList();
// The pattern's default popularity exponent (real-world 0.1, imbalanced 0.7, zipf 1.0, else 0).
double defaultZipfS(Pattern p);

struct RoutingSpec {
  int numExperts = 256;  // a multiple of nranks
  int topk = 8;
  size_t tokens = 4096;  // per rank
  uint64_t seed = 1;
  Pattern pattern = Pattern::Uniform;
  int maxNodes = 4;       // real-world: nodes a token's experts may span
  int imbMaxNodes = 0;    // imbalanced: remote nodes a remote token may span (0: every one)
  double imbRatio = 3.0;  // imbalanced: heavy / light cross-node data; hot-ranks: hot / cold
  double zipfS = -1;      // < 0: the pattern's default
};

// The routing knobs both tools take, with the same names and meanings:
//   --pattern P, --zipf-s S, --imb-ratio R, --max-nodes M, --imb-max-nodes M.
// Returns false (and sets *known = false) for a flag that is not one of them; false with *known
// true for a bad value.
bool parseRoutingFlag(const std::string& flag, const char* value, RoutingSpec* spec, bool* known);
// One line per flag above, for usage texts.
const char* routingFlagsHelp();
// Checks the knobs (maxNodes >= 1, imbMaxNodes >= 0, imbRatio >= 1, 1 <= topk <= numExperts);
// false with *err on a bad spec.
bool checkRoutingSpec(const RoutingSpec& spec, std::string* err);

// The node of every rank of `nodes` x `ranksPerNode` ranks, ranks numbered node-major.
std::vector<int> contiguousNodes(int nodes, int ranksPerNode);

// Precomputed popularity and samplers for one spec and layout (built once, then used for every
// rank). Requires numExperts % nodeOfRank.size() == 0 and topk <= numExperts.
class Router {
 public:
  Router(const RoutingSpec& spec, std::vector<int> nodeOfRank);
  // [out] topkIdx: tokens x topk global expert ids of `rank`, in draw (k) order.
  void route(int rank, std::vector<int64_t>* topkIdx) const;
  const RoutingSpec& spec() const { return spec_; }

 private:
  // The nodes a token of this rank may draw from (empty: every expert).
  void chooseNodes(uint64_t* rng, int myNode, bool heavy, std::vector<int>* chosen) const;

  RoutingSpec spec_;
  std::vector<int> nodeOfRank_;
  int numNodes_ = 1;
  std::vector<double> weight_;                 // [numExperts] popularity
  std::vector<std::vector<int>> nodeExperts_;  // [nodes] the node's experts, ascending
  std::vector<std::vector<double>> cdf_;       // [nodes] cumulative expert weight within the node
  std::vector<double> nodeCdf_;                // cumulative node weight
  std::vector<double> globalCdf_;              // cumulative expert weight over every expert
};

}  // namespace perf
}  // namespace fusco
