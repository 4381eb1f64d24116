// Planner time per MoE layer: planSend on one rank and planRecv at one destination, for the
// FUSCO paper's shape (top-8, 256 experts) over tokens per rank and ranks; and the NIC/forwarder
// balancer (plan/balance.h) over ranks (8 per node) and traffic patterns.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "plan/balance.h"
#include "plan/moe_plan.h"

namespace {

std::vector<int64_t> uniformTopk(size_t tokens, int topk, int experts, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> idx(tokens * topk);
  std::vector<int> perm(experts);
  for (int e = 0; e < experts; ++e) perm[e] = e;
  for (size_t t = 0; t < tokens; ++t) {
    for (int k = 0; k < topk; ++k) {  // partial Fisher-Yates: topk distinct experts
      std::uniform_int_distribution<int> d(k, experts - 1);
      std::swap(perm[k], perm[d(rng)]);
      idx[t * topk + k] = perm[k];
    }
  }
  return idx;
}

void BM_PlanSend(benchmark::State& state) {
  const int nranks = static_cast<int>(state.range(1));
  const size_t tokens = static_cast<size_t>(state.range(0));
  const int topk = 8, experts = 256;
  fusco::MoeShape shape;
  fusco::buildMoeShape(nranks, experts, nullptr, 1, &shape);
  auto idx = uniformTopk(tokens, topk, experts, 42);
  fusco::MoeSendPlan plan;
  for (auto _ : state) {
    fusco::planSendInto(shape, 0, idx.data(), tokens, topk, fusco::Dedup::Rank, &plan);
    benchmark::DoNotOptimize(plan.rows.data());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_PlanSend)->ArgsProduct({{4096, 16384}, {8, 64, 256}})->Unit(benchmark::kMicrosecond);

void BM_PlanRecv(benchmark::State& state) {
  const int nranks = static_cast<int>(state.range(1));
  const size_t tokens = static_cast<size_t>(state.range(0));
  const int topk = 8, experts = 256;
  fusco::MoeShape shape;
  fusco::buildMoeShape(nranks, experts, nullptr, 1, &shape);
  // Metadata every source would send to rank 0.
  std::vector<std::vector<int32_t>> metaFrom(nranks);
  for (int s = 0; s < nranks; ++s) {
    auto idx = uniformTopk(tokens, topk, experts, 1000 + s);
    metaFrom[s] = fusco::planSend(shape, s, idx.data(), tokens, topk, fusco::Dedup::Rank).meta[0];
  }
  fusco::MoeRecvPlan plan;
  for (auto _ : state) {
    fusco::planRecv(shape, 0, metaFrom, &plan);
    benchmark::DoNotOptimize(plan.fanRows.data());
  }
}
BENCHMARK(BM_PlanRecv)->ArgsProduct({{4096, 16384}, {8, 64, 256}})->Unit(benchmark::kMicrosecond);

// Rows per (source rank, node) for the balancer: 0 uniform; 1 imbalanced (local ranks 0-3 of every
// node send 3x); 2 skewed (one flow in 8 is 10-100x larger, seeded).
std::vector<uint64_t> balanceRows(const fusco::NodeMap& nodes, int pattern) {
  std::mt19937_64 rng(7);
  std::vector<uint64_t> rows(static_cast<size_t>(nodes.nranks) * nodes.numNodes);
  for (int s = 0; s < nodes.nranks; ++s)
    for (int n = 0; n < nodes.numNodes; ++n) {
      uint64_t& r = rows[static_cast<size_t>(s) * nodes.numNodes + n];
      if (pattern == 0) r = 1000;
      if (pattern == 1) r = nodes.localRankOf[s] < 4 ? 3000 : 1000;
      if (pattern == 2) r = rng() % 8 == 0 ? 10000 + rng() % 90000 : rng() % 1000;
    }
  return rows;
}

// Args: ranks, pattern, mode (FUSCO_BALANCE_*); relays allowed.
void BM_Balance(benchmark::State& state) {
  const int nranks = static_cast<int>(state.range(0));
  const auto mode = static_cast<fusco::Balance>(state.range(2));
  const fusco::NodeMap nodes = fusco::buildNodeMap(std::vector<std::string>(nranks, "host"), 8);
  const std::vector<uint64_t> rows = balanceRows(nodes, static_cast<int>(state.range(1)));
  fusco::BalancePlan plan;
  for (auto _ : state) {
    fusco::planBalance(mode, nodes, rows, true, &plan);
    benchmark::DoNotOptimize(plan.routes.data());
  }
  state.counters["maxLoad/lb"] =
      plan.lowerBound == 0 ? 1.0 : static_cast<double>(plan.maxLoad) / plan.lowerBound;
}
BENCHMARK(BM_Balance)
    ->ArgNames({"ranks", "pattern", "mode"})
    ->ArgsProduct({{64, 256, 1024}, {0, 1, 2}, {FUSCO_BALANCE_STATIC, FUSCO_BALANCE_GREEDY}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
