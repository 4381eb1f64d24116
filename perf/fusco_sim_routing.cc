#include "fusco_sim_routing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "perf_rng.h"

namespace fusco {
namespace sim {

namespace {

using perf::mix64;

// splitmix64 stream: fast, and plenty for routing draws.
uint64_t next(uint64_t* s) { return perf::splitmixNext(s); }

double uniform(uint64_t* s) { return static_cast<double>(next(s) >> 11) * 0x1.0p-53; }

size_t pick(const std::vector<double>& cdf, double u) {
  const size_t i = std::upper_bound(cdf.begin(), cdf.end(), u * cdf.back()) - cdf.begin();
  return std::min(i, cdf.size() - 1);
}

}  // namespace

bool parseSimPattern(const char* name, SimPattern* out) {
  static const struct {
    const char* name;
    SimPattern p;
  } kNames[] = {{"real-world", SimPattern::RealWorld},
                {"single-node", SimPattern::SingleNode},
                {"imbalanced", SimPattern::Imbalanced},
                {"zipf", SimPattern::Zipf}};
  for (const auto& n : kNames) {
    if (strcmp(n.name, name) == 0) {
      *out = n.p;
      return true;
    }
  }
  return false;
}

const char* simPatternName(SimPattern p) {
  switch (p) {
    case SimPattern::RealWorld:
      return "real-world";
    case SimPattern::SingleNode:
      return "single-node";
    case SimPattern::Imbalanced:
      return "imbalanced";
    case SimPattern::Zipf:
      return "zipf";
  }
  return "?";
}

double defaultZipfS(SimPattern p) {
  switch (p) {
    case SimPattern::RealWorld:
      return 0.1;
    case SimPattern::SingleNode:
      return 0.0;
    case SimPattern::Imbalanced:
      return 0.7;
    case SimPattern::Zipf:
      return 1.0;
  }
  return 0.0;
}

SimRouter::SimRouter(const SimRoutingSpec& spec) : spec_(spec) {
  perNode_ = spec.numExperts / spec.nodes;
  const double s = spec.zipfS >= 0 ? spec.zipfS : defaultZipfS(spec.pattern);
  std::vector<int> order(spec.numExperts);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 perm(mix64(spec.seed ^ 0x21bfULL));  // the same popularity on every rank
  std::shuffle(order.begin(), order.end(), perm);
  weight_.assign(spec.numExperts, 1.0);
  for (int i = 0; i < spec.numExperts; ++i) weight_[order[i]] = 1.0 / std::pow(i + 1.0, s);
  cdf_.assign(spec.nodes, {});
  nodeCdf_.clear();
  double nodeAcc = 0;
  for (int n = 0; n < spec.nodes; ++n) {
    double acc = 0;
    for (int j = 0; j < perNode_; ++j) cdf_[n].push_back(acc += weight_[n * perNode_ + j]);
    nodeCdf_.push_back(nodeAcc += acc);
  }
  double acc = 0;
  for (double w : weight_) globalCdf_.push_back(acc += w);
}

int SimRouter::drawNode(uint64_t* rng, const std::vector<double>& cdf) const {
  return static_cast<int>(pick(cdf, uniform(rng)));
}

int SimRouter::drawExpertOf(uint64_t* rng, int node) const {
  return node * perNode_ + static_cast<int>(pick(cdf_[node], uniform(rng)));
}

void SimRouter::route(int rank, std::vector<int64_t>* topkIdx) const {
  const SimRoutingSpec& s = spec_;
  const int myNode = rank / s.gpus;
  const bool heavy = rank % s.gpus < (s.gpus + 1) / 2;
  uint64_t rng = mix64(s.seed * 0x100000001b3ULL + static_cast<uint64_t>(rank) * 0x9e37ULL +
                       static_cast<uint64_t>(s.pattern));
  topkIdx->assign(s.tokens * s.topk, -1);
  std::vector<int> chosen;        // the nodes a token may use
  std::vector<double> chosenCdf;  // their cumulative weight
  for (size_t t = 0; t < s.tokens; ++t) {
    chosen.clear();
    bool global = false;
    switch (s.pattern) {
      case SimPattern::Zipf:
        global = true;
        break;
      case SimPattern::SingleNode:
        chosen.push_back(static_cast<int>(next(&rng) % static_cast<uint64_t>(s.nodes)));
        break;
      case SimPattern::RealWorld:
      case SimPattern::Imbalanced: {
        bool remoteOnly = false;
        if (s.pattern == SimPattern::Imbalanced && s.nodes > 1) {
          remoteOnly = heavy || uniform(&rng) * s.imbRatio < 1.0;
          if (!remoteOnly) chosen.push_back(myNode);
        }
        if (chosen.empty()) {
          const int avail = s.nodes - (remoteOnly ? 1 : 0);
          const int limit = s.pattern == SimPattern::Imbalanced
                                ? (s.imbMaxNodes > 0 ? s.imbMaxNodes : avail)
                                : s.maxNodes;
          const int want = std::min(limit, avail);
          if (want >= s.nodes) {
            global = true;
            break;
          }
          if (want == avail) {  // every remote node: no draw needed
            for (int n = 0; n < s.nodes; ++n)
              if (n != myNode) chosen.push_back(n);
          }
          while (static_cast<int>(chosen.size()) < want) {
            const int n = drawNode(&rng, nodeCdf_);
            if (remoteOnly && n == myNode) continue;
            if (std::find(chosen.begin(), chosen.end(), n) == chosen.end()) chosen.push_back(n);
          }
        }
        break;
      }
    }
    if (!global && static_cast<int>(chosen.size()) * perNode_ < s.topk) global = true;
    chosenCdf.clear();
    double acc = 0;
    for (int n : chosen) chosenCdf.push_back(acc += cdf_[n].back());
    int64_t* row = topkIdx->data() + t * s.topk;
    for (int k = 0; k < s.topk; ++k) {
      int e;
      do {
        if (global) {
          e = static_cast<int>(pick(globalCdf_, uniform(&rng)));
        } else {
          const int n = chosen.size() == 1 ? chosen[0] : chosen[pick(chosenCdf, uniform(&rng))];
          e = drawExpertOf(&rng, n);
        }
      } while (std::find(row, row + k, e) != row + k);  // distinct experts per token
      row[k] = e;
    }
  }
}

}  // namespace sim
}  // namespace fusco
