#include "moe_routing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "device/reduce.h"
#include "perf_rng.h"

namespace fusco {
namespace perf {

namespace {

// A discrete distribution over a candidate list (cumulative weights, binary search per draw).
struct Sampler {
  std::vector<int> experts;
  std::vector<double> cdf;
  void build(const std::vector<int>& cand, const std::vector<double>& weightOfExpert) {
    experts = cand;
    cdf.resize(cand.size());
    double acc = 0;
    for (size_t i = 0; i < cand.size(); ++i) cdf[i] = acc += weightOfExpert[cand[i]];
  }
  int draw(std::mt19937_64& rng) const {
    double u = std::uniform_real_distribution<double>(0.0, cdf.back())(rng);
    size_t i = std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin();
    return experts[std::min(i, experts.size() - 1)];
  }
};

std::vector<double> expertWeights(const RoutingShape& s) {
  std::vector<double> w(s.numExperts, 1.0);
  if (s.pattern == Pattern::Imbalanced) {
    const int perRank = s.numExperts / s.nranks;
    const int hotRanks = (s.nranks + 1) / 2;
    for (int e = 0; e < s.numExperts; ++e) w[e] = e / perRank < hotRanks ? 3.0 : 1.0;
  } else if (s.pattern == Pattern::Zipf) {
    std::vector<int> order(s.numExperts);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 rng(mix64(s.seed ^ 0x21bfULL));  // same permutation on every rank
    std::shuffle(order.begin(), order.end(), rng);
    for (int i = 0; i < s.numExperts; ++i) w[order[i]] = 1.0 / (i + 1.0);
  }
  return w;
}

}  // namespace

bool parsePattern(const char* name, Pattern* out) {
  static const struct {
    const char* name;
    Pattern p;
  } kNames[] = {{"uniform", Pattern::Uniform},
                {"single-node", Pattern::SingleNode},
                {"imbalanced", Pattern::Imbalanced},
                {"zipf", Pattern::Zipf},
                {"imbalanced-rails", Pattern::ImbalancedRails}};
  for (const auto& n : kNames) {
    if (strcmp(n.name, name) == 0) {
      *out = n.p;
      return true;
    }
  }
  return false;
}

const char* patternName(Pattern p) {
  switch (p) {
    case Pattern::Uniform: return "uniform";
    case Pattern::SingleNode: return "single-node";
    case Pattern::Imbalanced: return "imbalanced";
    case Pattern::Zipf: return "zipf";
    case Pattern::ImbalancedRails: return "imbalanced-rails";
  }
  return "?";
}

void makeRouting(const RoutingShape& s, int rank, std::vector<int64_t>* topkIdx) {
  const std::vector<double> weight = expertWeights(s);
  std::vector<int> all(s.numExperts);
  std::iota(all.begin(), all.end(), 0);
  Sampler global;
  global.build(all, weight);
  // single-node: one sampler per node (nodes with too few experts use the global one).
  int numNodes = 1;
  for (int n : s.nodeOfRank) numNodes = std::max(numNodes, n + 1);
  const bool rails = s.pattern == Pattern::ImbalancedRails && numNodes > 1;
  const bool byNode = (s.pattern == Pattern::SingleNode || rails) && numNodes > 1;
  std::vector<Sampler> perNode(byNode ? numNodes : 0);
  const int perRank = s.numExperts / s.nranks;
  for (int node = 0; node < static_cast<int>(perNode.size()); ++node) {
    std::vector<int> cand;
    for (int e = 0; e < s.numExperts; ++e)
      if (s.nodeOfRank[e / perRank] == node) cand.push_back(e);
    perNode[node].build(static_cast<int>(cand.size()) >= s.topk ? cand : all, weight);
  }
  // imbalanced-rails: this rank's local index and its node's size decide heavy or light.
  const int myNode = s.nodeOfRank.empty() ? 0 : s.nodeOfRank[rank];
  int localIndex = 0, localSize = 0;
  for (int r = 0; r < s.nranks && rails; ++r) {
    if (s.nodeOfRank[r] != myNode) continue;
    localIndex += r < rank;
    ++localSize;
  }
  const bool heavy = localIndex < (localSize + 1) / 2;
  std::mt19937_64 rng(mix64(s.seed * 0x100000001b3ULL + static_cast<uint64_t>(rank)));
  topkIdx->assign(s.tokens * s.topk, -1);
  for (size_t t = 0; t < s.tokens; ++t) {
    const Sampler* sm = &global;
    if (rails) {
      const bool away = heavy || std::uniform_int_distribution<int>(0, 2)(rng) == 0;
      int node = myNode;
      if (away) node = (myNode + 1 + std::uniform_int_distribution<int>(0, numNodes - 2)(rng)) % numNodes;
      sm = &perNode[node];
    } else if (byNode) {
      sm = &perNode[std::uniform_int_distribution<int>(0, numNodes - 1)(rng)];
    }
    int64_t* row = topkIdx->data() + t * s.topk;
    for (int k = 0; k < s.topk; ++k) {
      int e;
      do {
        e = sm->draw(rng);
      } while (std::find(row, row + k, e) != row + k);  // distinct experts per token
      row[k] = e;
    }
  }
}

void makeWeights(uint64_t seed, int rank, size_t n, std::vector<float>* w) {
  std::mt19937_64 rng(mix64(seed ^ 0x5eedULL ^ (static_cast<uint64_t>(rank) << 40)));
  std::uniform_real_distribution<float> d(0.05f, 1.0f);
  w->resize(n);
  for (float& v : *w) v = d(rng);
}

void fillRows(fuscoDataType_t dt, size_t hidden, size_t tokens, uint64_t seed, int rank, void* x) {
  const uint64_t base = mix64(seed ^ (static_cast<uint64_t>(rank) << 48) ^ 0xa11ULL);
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t j = 0; j < hidden; ++j) {
      // 24 random bits -> [-1, 1): exact in fp32, rounded in bf16 / fp16.
      uint64_t h = mix64(base + t * hidden + j);
      float f = static_cast<float>(static_cast<int32_t>(h >> 40) - (1 << 23)) / (1 << 23);
      size_t i = t * hidden + j;
      if (dt == fuscoFloat32) {
        static_cast<float*>(x)[i] = f;
      } else if (dt == fuscoBfloat16) {
        static_cast<uint16_t*>(x)[i] = floatToBf16(f);
      } else {
        static_cast<uint16_t*>(x)[i] = floatToHalf(f);
      }
    }
  }
}

float loadElement(fuscoDataType_t dt, const void* row, size_t j) {
  if (dt == fuscoFloat32) return static_cast<const float*>(row)[j];
  uint16_t h = static_cast<const uint16_t*>(row)[j];
  return dt == fuscoBfloat16 ? bf16ToFloat(h) : halfToFloat(h);
}

}  // namespace perf
}  // namespace fusco
