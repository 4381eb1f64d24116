// moe_perf --ll on: the header, the table (one row per form, us per call), the ratio lines and the
// -J lines, printed by rank 0 (moe_perf_ll.h).
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "moe_perf_ll.h"

namespace fusco {
namespace perf {

namespace {

// "3.12x", or "-" where either time is missing.
std::string ratio(double base, double t) {
  if (base <= 0 || t <= 0) return "-";
  char b[32];
  snprintf(b, sizeof(b), "%.2fx", base / t);
  return b;
}

std::string us(double v, bool have) {
  if (!have) return "-";
  char b[32];
  snprintf(b, sizeof(b), "%.1f", v);
  return b;
}

}  // namespace

void LlBench::printHeader(const std::vector<int64_t>& rows) const {
  int version = 0;
  fuscoGetVersion(&version);
  printf("# fusco %d.%d.%d moe_perf --ll on: %d ranks (%s, %s), MPS %s\n", version / 10000,
         (version / 100) % 100, version % 100, l_.nranks, l_.mode.c_str(), l_.launcher.c_str(),
         mpsHeaderText(o_.mpsKind).c_str());
  const CudaRank* c = space_->cuda();
  if (c != nullptr)
    printf(
        "# memory: cuda (device buffers, stream-ordered calls; each call timed by CUDA events on "
        "the rank's stream); GPU: %s (rank 0: device %d of %d; a rank uses local rank %% device "
        "count); buffers: %s\n",
        c->gpuName.c_str(), c->device, c->deviceCount,
        bufferKindText(static_cast<BufferKind>(o_.arena)));
  else
    printf(
        "# memory: host (a call returns once done, the low-latency path on the calling thread; "
        "each call timed by the wall clock); buffers: %s\n",
        o_.arena ? "fuscoMemAlloc" : "malloc");
  printf(
      "# shape: tokens/rank %zu hidden %zu dtype bf16 (row %zu B) topk %d experts %d (%d per "
      "rank) pattern %s seed %llu\n",
      o_.tokens, o_.hidden, rowBytes_, o_.topk, o_.experts, localExperts_,
      patternName(o_.routing.pattern), static_cast<unsigned long long>(o_.seed));
  printf(
      "# low-latency buffer: maxTokensPerRank %zu hidden %zu numExperts %d maxTopk %d; fp8: %s\n",
      o_.tokens, o_.hidden, o_.experts, o_.topk,
      active_[kLlFp8] ? "FUSCO_LL_FP8 row" : "not run (hidden % 128 != 0)");
  printf(
      "# normal: dedup %s balance %s expertAlignment 0, planned once before the loop; plan us = "
      "%s\n",
      kDedupNames[o_.variants.front().dedup], kBalanceNames[o_.variants.front().balance],
      o_.replan ? "fuscoMoeReplan of that handle, same routing, timed as its own phase"
                : "not timed (--replan off)");
  printRowRange(rows, l_.nranks);
  printf(
      "# ll-hook = each call with FUSCO_LL_RECV_HOOK, then fuscoLowLatencyRecvHook at once (both "
      "in its time)\n"
      "# %d warmup + %d timed iterations; each iteration runs normal, ll-bf16, ll-fp8, ll-hook, "
      "a barrier before every call; time = slowest rank, median over iterations, us\n",
      o_.warmup, o_.iters);
  fflush(stdout);
}

void LlBench::printTable(const std::vector<LlResult>& res) const {
  const LlResult& normal = res[kLlNormal];
  printf("#%-9s %9s %11s %10s %12s %20s %11s %11s %13s\n", "contender", "plan us", "dispatch us",
         "combine us", "plan+disp us", "disp+comb us (min)", "d vs normal", "c vs normal",
         "d+c vs normal");
  for (int row = 0; row < kLlRows; ++row) {
    const LlResult& r = res[row];
    if (!r.ran) continue;
    const bool plan = row == kLlNormal && o_.replan;
    char tot[40];
    snprintf(tot, sizeof(tot), "%.1f (%.1f)", r.total, r.totalMin);
    printf(" %-9s %9s %11.1f %10.1f %12s %20s %11s %11s %13s\n", kLlRowNames[row],
           us(r.plan, plan).c_str(), r.dispatch, r.combine, us(r.planDispatch, plan).c_str(), tot,
           ratio(normal.dispatch, r.dispatch).c_str(), ratio(normal.combine, r.combine).c_str(),
           ratio(normal.total, r.total).c_str());
    if (json_ != nullptr) fputs(jsonLine(row, r, normal).c_str(), json_);
  }
  printRatios(res);
  fflush(stdout);
}

// normal / low-latency for each form; the plan-included ratio where the plan was timed.
void LlBench::printRatios(const std::vector<LlResult>& res) const {
  const LlResult& n = res[kLlNormal];
  printf("# ratios: normal time / low-latency time (docs/PERF.md target: >= 3x; < 100 us each)\n");
  for (int row = kLlBf16; row < kLlRows; ++row) {
    const LlResult& r = res[row];
    if (!r.ran) continue;
    printf("# normal / %s: dispatch %s, combine %s, dispatch + combine %s", kLlRowNames[row],
           ratio(n.dispatch, r.dispatch).c_str(), ratio(n.combine, r.combine).c_str(),
           ratio(n.total, r.total).c_str());
    if (o_.replan)
      printf("; normal plan + dispatch / %s dispatch %s", kLlRowNames[row],
             ratio(n.planDispatch, r.dispatch).c_str());
    printf("\n");
  }
}

// One -J line (rank 0): the run's shape, the row's medians in us and its ratios to the normal row.
std::string LlBench::jsonLine(int row, const LlResult& r, const LlResult& n) const {
  const CudaRank* c = space_->cuda();
  const bool plan = row == kLlNormal && o_.replan;
  auto num = [](double base, double t) { return base > 0 && t > 0 ? base / t : 0.0; };
  auto planned = [plan](double v) {  // null where the row has no plan phase
    char b[32];
    snprintf(b, sizeof(b), "%.3f", v);
    return std::string(plan ? b : "null");
  };
  char buf[2048];
  snprintf(buf, sizeof(buf),
           "{\"bench\":\"moe_perf\",\"ll\":1,\"time\":%lld,\"nranks\":%d,\"launch\":\"%s\","
           "\"mps\":\"%s\","
           "\"mem\":\"%s\",\"gpu\":\"%s\",\"tokens\":%zu,\"hidden\":%zu,\"dtype\":\"bf16\","
           "\"topk\":%d,\"experts\":%d,\"pattern\":\"%s\",\"dedup\":\"%s\",\"balance\":\"%s\","
           "\"replan\":%d,\"arena\":%d,\"iters\":%d,\"warmup\":%d,\"contender\":\"%s\","
           "\"plan_us\":%s,\"dispatch_us\":%.3f,\"combine_us\":%.3f,\"plan_dispatch_us\":%s,"
           "\"total_us\":%.3f,\"total_min_us\":%.3f,\"dispatch_ratio\":%.4f,"
           "\"combine_ratio\":%.4f,\"total_ratio\":%.4f,\"checked\":%d,\"wrong\":0}\n",
           static_cast<long long>(time(nullptr)), l_.nranks, l_.mode.c_str(), o_.mpsKind,
           c != nullptr ? "cuda" : "host", c != nullptr ? c->gpuName.c_str() : "", o_.tokens,
           o_.hidden, o_.topk, o_.experts, patternName(o_.routing.pattern),
           kDedupNames[o_.variants.front().dedup], kBalanceNames[o_.variants.front().balance],
           o_.replan, o_.arena, o_.iters, o_.warmup, kLlRowNames[row], planned(r.plan).c_str(),
           r.dispatch, r.combine, planned(r.planDispatch).c_str(), r.total, r.totalMin,
           num(n.dispatch, r.dispatch), num(n.combine, r.combine), num(n.total, r.total), o_.check);
  return buf;
}

}  // namespace perf
}  // namespace fusco
