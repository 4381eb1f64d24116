#include "moe_routing.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>

#include "perf_rng.h"

namespace fusco {
namespace perf {

namespace {

const struct {
  const char* name;
  Pattern p;
  double zipfS;
} kPatterns[] = {{"uniform", Pattern::Uniform, 0.0},        {"zipf", Pattern::Zipf, 1.0},
                 {"single-node", Pattern::SingleNode, 0.0}, {"real-world", Pattern::RealWorld, 0.1},
                 {"imbalanced", Pattern::Imbalanced, 0.7},  {"hot-ranks", Pattern::HotRanks, 0.0}};

// The splitmix64 stream: fast, and plenty for routing draws.
double uniform(uint64_t* s) { return static_cast<double>(splitmixNext(s) >> 11) * 0x1.0p-53; }

// Index of the first cumulative weight above u * total (a draw weighted by the cdf's steps).
size_t pick(const std::vector<double>& cdf, double u) {
  const size_t i = std::upper_bound(cdf.begin(), cdf.end(), u * cdf.back()) - cdf.begin();
  return std::min(i, cdf.size() - 1);
}

bool parseDouble(const char* v, double* out) {
  char* end = nullptr;
  const double d = std::strtod(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(d)) return false;
  *out = d;
  return true;
}

bool parseCount(const char* v, int* out) {
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || n < -1000000 || n > 1000000) return false;
  *out = static_cast<int>(n);
  return true;
}

}  // namespace

bool parsePattern(const char* name, Pattern* out) {
  for (const auto& p : kPatterns) {
    if (strcmp(p.name, name) == 0) {
      *out = p.p;
      return true;
    }
  }
  return false;
}

const char* patternName(Pattern p) {
  for (const auto& e : kPatterns)
    if (e.p == p) return e.name;
  return "?";
}

const char* patternNameList() {
  return "uniform | zipf | single-node | real-world | imbalanced | hot-ranks";
}

double defaultZipfS(Pattern p) {
  for (const auto& e : kPatterns)
    if (e.p == p) return e.zipfS;
  return 0.0;
}

bool parseRoutingFlag(const std::string& flag, const char* value, RoutingSpec* spec, bool* known) {
  *known = true;
  if (flag == "--pattern") return parsePattern(value, &spec->pattern);
  if (flag == "--zipf-s") return parseDouble(value, &spec->zipfS);
  if (flag == "--imb-ratio") return parseDouble(value, &spec->imbRatio);
  if (flag == "--max-nodes") return parseCount(value, &spec->maxNodes);
  if (flag == "--imb-max-nodes") return parseCount(value, &spec->imbMaxNodes);
  *known = false;
  return false;
}

const char* routingFlagsHelp() {
  return "  --pattern P         uniform | zipf | single-node | real-world | imbalanced |\n"
         "                      hot-ranks (perf/moe_routing.h)\n"
         "  --zipf-s S          expert popularity exponent (default per pattern: real-world 0.1,\n"
         "                      imbalanced 0.7, zipf 1.0, others 0)\n"
         "  --imb-ratio R       imbalanced: heavy / light cross-node data; hot-ranks: hot / cold\n"
         "                      expert weight (3)\n"
         "  --max-nodes M       real-world: nodes a token's experts may span (4)\n"
         "  --imb-max-nodes M   imbalanced: remote nodes a remote token may span (0: all)\n";
}

bool checkRoutingSpec(const RoutingSpec& s, std::string* err) {
  if (s.maxNodes < 1 || s.imbMaxNodes < 0 || !(s.imbRatio >= 1)) {
    *err = "need --max-nodes >= 1, --imb-max-nodes >= 0, --imb-ratio >= 1";
    return false;
  }
  if (s.topk < 1 || s.topk > s.numExperts) {
    *err = "need 1 <= topk <= experts (topk " + std::to_string(s.topk) + ", experts " +
           std::to_string(s.numExperts) + ")";
    return false;
  }
  return true;
}

std::vector<int> contiguousNodes(int nodes, int ranksPerNode) {
  std::vector<int> n(static_cast<size_t>(nodes) * ranksPerNode);
  for (size_t r = 0; r < n.size(); ++r) n[r] = static_cast<int>(r) / ranksPerNode;
  return n;
}

Router::Router(const RoutingSpec& spec, std::vector<int> nodeOfRank)
    : spec_(spec), nodeOfRank_(std::move(nodeOfRank)) {
  const int nranks = std::max<int>(1, static_cast<int>(nodeOfRank_.size()));
  if (nodeOfRank_.empty()) nodeOfRank_.assign(1, 0);
  for (int n : nodeOfRank_) numNodes_ = std::max(numNodes_, n + 1);
  const int perRank = std::max(1, spec.numExperts / nranks);
  auto rankOf = [&](int e) { return std::min(e / perRank, nranks - 1); };  // guards a bad spec
  const double s = spec.zipfS >= 0 ? spec.zipfS : defaultZipfS(spec.pattern);
  std::vector<int> order(spec.numExperts);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 perm(mix64(spec.seed ^ 0x21bfULL));  // the same popularity on every rank
  std::shuffle(order.begin(), order.end(), perm);
  weight_.assign(spec.numExperts, 1.0);
  for (int i = 0; i < spec.numExperts; ++i) weight_[order[i]] = 1.0 / std::pow(i + 1.0, s);
  if (spec.pattern == Pattern::HotRanks) {
    const int hotRanks = (nranks + 1) / 2;
    for (int e = 0; e < spec.numExperts; ++e)
      if (rankOf(e) < hotRanks) weight_[e] *= spec.imbRatio;
  }
  nodeExperts_.assign(numNodes_, {});
  for (int e = 0; e < spec.numExperts; ++e) nodeExperts_[nodeOfRank_[rankOf(e)]].push_back(e);
  cdf_.assign(numNodes_, {});
  double nodeAcc = 0;
  for (int n = 0; n < numNodes_; ++n) {
    double acc = 0;
    for (int e : nodeExperts_[n]) cdf_[n].push_back(acc += weight_[e]);
    nodeCdf_.push_back(nodeAcc += acc);
  }
  double acc = 0;
  for (double w : weight_) globalCdf_.push_back(acc += w);
}

void Router::chooseNodes(uint64_t* rng, int myNode, bool heavy, std::vector<int>* chosen) const {
  const RoutingSpec& s = spec_;
  const int nodes = numNodes_;
  chosen->clear();
  if (s.pattern == Pattern::SingleNode) {
    chosen->push_back(static_cast<int>(splitmixNext(rng) % static_cast<uint64_t>(nodes)));
    return;
  }
  if (s.pattern != Pattern::RealWorld && s.pattern != Pattern::Imbalanced) return;  // every expert
  const bool imbalanced = s.pattern == Pattern::Imbalanced;
  bool remoteOnly = false;
  if (imbalanced && nodes > 1) {
    remoteOnly = heavy || uniform(rng) * s.imbRatio < 1.0;
    if (!remoteOnly) {
      chosen->push_back(myNode);
      return;
    }
  }
  const int avail = nodes - (remoteOnly ? 1 : 0);
  const int limit = imbalanced ? (s.imbMaxNodes > 0 ? s.imbMaxNodes : avail) : s.maxNodes;
  const int want = std::min(limit, avail);
  if (want >= nodes) return;  // every node: every expert
  if (want == avail) {        // every remote node: no draw needed
    for (int n = 0; n < nodes; ++n)
      if (n != myNode) chosen->push_back(n);
  }
  while (static_cast<int>(chosen->size()) < want) {
    const int n = static_cast<int>(pick(nodeCdf_, uniform(rng)));
    if (remoteOnly && n == myNode) continue;
    if (std::find(chosen->begin(), chosen->end(), n) == chosen->end()) chosen->push_back(n);
  }
}

void Router::route(int rank, std::vector<int64_t>* topkIdx) const {
  const RoutingSpec& s = spec_;
  const int myNode = nodeOfRank_[rank];
  int localIndex = 0, localSize = 0;  // imbalanced: the first half by local index is heavy
  for (int r = 0; r < static_cast<int>(nodeOfRank_.size()); ++r) {
    if (nodeOfRank_[r] != myNode) continue;
    localIndex += r < rank;
    ++localSize;
  }
  const bool heavy = localIndex < (localSize + 1) / 2;
  uint64_t rng = mix64(s.seed * 0x100000001b3ULL + static_cast<uint64_t>(rank) * 0x9e37ULL +
                       static_cast<uint64_t>(s.pattern));
  topkIdx->assign(s.tokens * s.topk, -1);
  std::vector<int> chosen;        // the nodes a token may use (empty: every expert)
  std::vector<double> chosenCdf;  // their cumulative weight
  for (size_t t = 0; t < s.tokens; ++t) {
    chooseNodes(&rng, myNode, heavy, &chosen);
    size_t reachable = 0;
    for (int n : chosen) reachable += nodeExperts_[n].size();
    const bool global = reachable < static_cast<size_t>(s.topk);  // empty included
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
          e = nodeExperts_[n][pick(cdf_[n], uniform(&rng))];
        }
      } while (std::find(row, row + k, e) != row + k);  // distinct experts per token
      row[k] = e;
    }
  }
}

}  // namespace perf
}  // namespace fusco
