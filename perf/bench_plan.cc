// Planner time per MoE layer: planSend on one rank and planRecv at one destination, for the
// FUSCO paper's shape (top-8, 256 experts) over tokens per rank and ranks.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

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
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsIterationInvariantRate);
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

}  // namespace

BENCHMARK_MAIN();
