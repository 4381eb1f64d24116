// moe_perf's report: the header, the table (one row per contender and fusco variant), the ratio
// lines and the JSON lines, printed by rank 0 from the summarized results.
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "moe_perf.h"

namespace fusco {
namespace perf {

// The popularity exponent the routing used (the pattern's default unless --zipf-s was given).
double Bench::zipfS() const {
  return o_.routing.zipfS >= 0 ? o_.routing.zipfS : defaultZipfS(o_.routing.pattern);
}

void printRowRange(const std::vector<int64_t>& rows, int nranks) {
  int64_t smin = INT64_MAX, smax = 0, rmin = INT64_MAX, rmax = 0;
  for (int r = 0; r < nranks; ++r) {
    smin = std::min(smin, rows[2 * r]), smax = std::max(smax, rows[2 * r]);
    rmin = std::min(rmin, rows[2 * r + 1]), rmax = std::max(rmax, rows[2 * r + 1]);
  }
  printf("# rows per rank (token, expert) sent %" PRId64 "..%" PRId64 ", received %" PRId64
         "..%" PRId64 "\n",
         smin, smax, rmin, rmax);
}

void Bench::printHeader(const std::vector<int64_t>& rows) const {
  int version = 0;
  fuscoGetVersion(&version);
  printf("# fusco %d.%d.%d moe_perf: %d ranks (%s, %s), %d node(s), MPS %s\n", version / 10000,
         (version / 100) % 100, version % 100, l_.nranks, l_.mode.c_str(), l_.launcher.c_str(),
         numNodes_, mpsHeaderText(o_.mpsKind).c_str());
  if (gpu_)
    printf(
        "# memory: cuda (device buffers, stream-ordered calls; each phase timed from a barrier "
        "to cudaStreamSynchronize); GPU: %s (rank 0: device %d of %d; a rank uses local rank "
        "%% device count); SM budget %s\n",
        gpu_->cuda().gpuName.c_str(), gpu_->cuda().device, gpu_->cuda().deviceCount,
        o_.sms > 0 ? (std::to_string(o_.sms) + " per rank (--sms)").c_str() : "none (--sms 0)");
  printf(
      "# shape: tokens/rank %zu hidden %zu dtype %s (row %zu B) topk %d experts %d (%d per rank) "
      "pattern %s (zipf s %.2f, imb-ratio %.1f) seed %llu\n",
      o_.tokens, o_.hidden, dtypeName(o_.dtype), rowBytes_, o_.topk, o_.experts,
      o_.experts / l_.nranks, patternName(o_.routing.pattern), zipfS(), o_.routing.imbRatio,
      static_cast<unsigned long long>(o_.seed));
  std::string dedups, balances;
  for (int d : o_.dedups) dedups += (dedups.empty() ? "" : ",") + std::string(kDedupNames[d]);
  for (int b : o_.balances)
    balances += (balances.empty() ? "" : ",") + std::string(kBalanceNames[b]);
  printf(
      "# fusco: dedup %s balance %s fuse %s replan %s expertAlignment 0; buffers (x, recvX, "
      "pipeline "
      "buffers, out): %s\n",
      dedups.c_str(), balances.c_str(), o_.fuse ? "on" : "off (runs the unfused pipeline)",
      o_.replan ? "every iteration (fuscoMoeReplan of the kept handle)" : "off (plan once, reuse)",
      gpu_       ? bufferKindText(static_cast<BufferKind>(o_.arena))
      : o_.arena ? "fuscoMemAlloc (arena: local peers write them directly)"
                 : "malloc (staged)");
  if (o_.variants.size() > 1) {
    printf("# fusco variants (each its own handle, interleaved with the other contenders):");
    for (const Row& r : rows_)
      if (r.kind == kFusco) printf(" %s", r.name.c_str());
    printf("\n");
  }
  printRowRange(rows, l_.nranks);
  if (o_.contenders[kMpi] && !active_[kMpi])
    printf("# mpi contender not run: %s\n", g_noMpiReason.c_str());
  printf(
      "# %d warmup + %d timed iterations, contenders interleaved; phase time = slowest rank, "
      "median over iterations; total = plan + dispatch + combine (min in brackets)\n",
      o_.warmup, o_.iters);
  if (gpu_)
    printf(
        "# limit = device-to-device cudaMemcpyAsync of the rows each rank sends in dispatch, "
        "then in combine; unfused = permute / sort-chunks / un-permute CUDA kernels around "
        "fuscoAllToAllv\n"
        "# dispatch / combine host us = host wall time of the fuscoMoeDispatch / fuscoMoeCombine "
        "call alone (it returns once enqueued; the stream sync is not in it), slowest rank, "
        "median over iterations (fusco row only)\n");
  else
    printf("# limit = memcpy of the rows each rank sends in dispatch, then in combine\n");
  fflush(stdout);
}

void Bench::printTable(const std::vector<Result>& res) const {
  const bool diffs = gpu_ && o_.check;  // --mem cuda: each pipeline's out vs fusco's out
  int w = 9;  // the contender column: 9 wide, wider for fusco[node/greedy]
  for (const Result& r : res)
    if (r.ran) w = std::max(w, static_cast<int>(r.name.size()));
  printf("#%-*s %9s %11s %10s %19s %9s %10s %10s %8s %8s %7s%s\n", w, "contender", "plan ms",
         "dispatch ms", "combine ms", "total ms (min)", "log GB/s", "intra MB", "inter MB",
         "vs unf", "vs mpi", "#wrong", gpu_ ? " dispatch host us combine host us" : "");
  const Result* base[2] = {nullptr, nullptr};  // unfused, mpi
  for (const Result& r : res)
    if (r.kind == kUnfused || r.kind == kMpi) base[r.kind == kUnfused ? 0 : 1] = &r;
  for (const Result& r : res)
    if (r.ran) printRow(r, w, base, diffs);
  const Result* limit = nullptr;
  for (const Result& r : res)
    if (r.kind == kLimit && r.ran) limit = &r;
  const bool single = o_.variants.size() == 1;
  for (const Result& f : res) {
    if (f.kind != kFusco || !f.ran) continue;
    for (int b : {1, 0}) {  // mpi, unfused
      if (base[b] == nullptr || !base[b]->ran || f.total <= 0) continue;
      printf("# %s vs %s: %.2fx (plan + dispatch + combine; dispatch + combine alone: %.2fx)\n",
             f.name.c_str(), base[b]->name.c_str(), base[b]->total / f.total,
             (base[b]->dispatch + base[b]->combine) / (f.dispatch + f.combine));
    }
    if (limit != nullptr && f.dispatch > 0 && !gpu_)
      printf("# %s vs memcpy limit: %.2f (combine: %.2f)\n",
             single ? "fused dispatch" : (f.name + " dispatch").c_str(),
             limit->dispatch / f.dispatch, limit->combine / f.combine);
    if (limit != nullptr && f.dispatch > 0 && gpu_)
      printf(
          "# fused dispatch vs device copy of the same bytes: %.2f of copy bandwidth (copy ms / "
          "dispatch ms; target >= 0.8); combine: %.2f\n",
          limit->dispatch / f.dispatch, limit->combine / f.combine);
  }
  for (const Result& r : res) {
    const int c = r.kind;
    if (!diffs || !r.ran || c == kLimit || (c == kFusco && o_.fuse)) continue;
    const char* who = c == kFusco ? "fusco (--fuse off: the unfused pipeline)" : kContenderNames[c];
    printf(
        "# %s out vs fusco's fused out: max abs diff %.3g (allowed: 8 %s roundings of the "
        "value)\n",
        who, r.maxDiff, dtypeName(o_.dtype));
  }
  if (o_.fuse && !gpu_) printVariantRatios(res);
  if (o_.check) {
    int64_t bad = 0;
    for (const Result& r : res) bad += r.wrong;
    printf("# check: %s\n",
           bad == 0 ? "OK (dispatch bytes identical, combine within tolerance)" : "FAILED");
  }
  fflush(stdout);
}

// One contender's row of the table (w: the contender column's width; base: unfused, mpi) and its
// -J line.
void Bench::printRow(const Result& r, int w, const Result* const base[2], bool diffs) const {
  const double logical = 2.0 * o_.tokens * o_.topk * rowBytes_;  // per rank, both directions
  char vs[2][16];
  for (int b = 0; b < 2; ++b) {
    if (base[b] != nullptr && base[b]->ran && r.total > 0)
      snprintf(vs[b], sizeof(vs[b]), "%.2fx", base[b]->total / r.total);
    else
      snprintf(vs[b], sizeof(vs[b]), "-");
  }
  char tot[32];
  snprintf(tot, sizeof(tot), "%.1f (%.1f)", r.total, r.totalMin);
  const double gbs = r.total > 0 ? logical / r.total / 1e6 : 0;
  printf(" %-*s %9.2f %11.2f %10.2f %19s %9.2f %10.1f %10.1f %8s %8s %7s%s\n", w, r.name.c_str(),
         r.plan, r.dispatch, r.combine, tot, gbs, r.intra / 1e6, r.inter / 1e6, vs[0], vs[1],
         o_.check && r.kind != kLimit ? std::to_string(r.wrong).c_str() : "N/A",
         hostColumns(r).c_str());
  if (json_ != nullptr) fputs(jsonLine(r, gbs, diffs).c_str(), json_);
}

// The ablation ratios of docs/PERF.md, between fusco variants of this run (printed only when the
// variants are there): NODE vs NONE dedup (time ratio against inter-node bytes ratio), GREEDY vs
// STATIC balance, and per variant the busiest rank's inter-node send bytes against the ideal
// (total / nranks; each rank is one rail here).
void Bench::printVariantRatios(const std::vector<Result>& res) const {
  if (o_.variants.size() < 2) return;
  const Result *none = nullptr, *node = nullptr, *stat = nullptr, *greedy = nullptr;
  auto dc = [](const Result* r) { return r->dispatch + r->combine; };
  for (const Result& r : res) {
    if (r.kind != kFusco || !r.ran) continue;
    const MoeVariant& v = o_.variants[r.variant];
    if (v.dedup == FUSCO_DEDUP_NONE && none == nullptr) none = &r;
    if (v.dedup != FUSCO_DEDUP_NODE) continue;
    if (v.balance == FUSCO_BALANCE_STATIC) stat = &r;
    if (v.balance == FUSCO_BALANCE_GREEDY) greedy = &r;
    if (node == nullptr || dc(&r) < dc(node)) node = &r;  // the fastest balance...
  }
  if (greedy != nullptr) node = greedy;  // ...unless greedy ran
  if (none != nullptr && node != nullptr && dc(node) > 0) {
    const double tr = dc(none) / dc(node);
    if (node->inter > 0 && none->inter > 0) {
      const double br = static_cast<double>(none->inter) / node->inter;
      printf(
          "# NODE vs NONE: time ratio %.2f (NONE ms / NODE ms, dispatch+combine), inter-node "
          "bytes ratio %.2f (NONE / NODE); time ratio / bytes ratio = %.2f (target >= 0.8) "
          "[%s vs %s]\n",
          tr, br, tr / br, none->name.c_str(), node->name.c_str());
    } else {
      printf(
          "# NODE vs NONE: time ratio %.2f (NONE ms / NODE ms, dispatch+combine), inter-node "
          "bytes ratio n/a (no inter-node bytes: one node) [%s vs %s]\n",
          tr, none->name.c_str(), node->name.c_str());
    }
  }
  if (stat != nullptr && greedy != nullptr && dc(greedy) > 0)
    printf(
        "# GREEDY vs STATIC: dispatch+combine time ratio %.2f (STATIC ms / GREEDY ms: %.2f / "
        "%.2f)\n",
        dc(stat) / dc(greedy), dc(stat), dc(greedy));
  for (const Result& r : res) {
    if (r.kind != kFusco || !r.ran) continue;
    const double ideal = static_cast<double>(r.inter) / l_.nranks;
    if (ideal > 0)
      printf(
          "# %s: max rail send bytes / ideal = %.2f (busiest rank %.1f MB, ideal %.1f MB = "
          "inter-node total / %d ranks)\n",
          r.name.c_str(), r.interMax / ideal, r.interMax / 1e6, ideal / 1e6, l_.nranks);
    else
      printf("# %s: max rail send bytes / ideal = n/a (no inter-node bytes)\n", r.name.c_str());
  }
}

// One -J line (rank 0). Fusco rows carry their variant's dedup and balance ("n/a" where the dedup
// mode has no balancer: none, rank); the other rows the lists as given.
std::string Bench::jsonLine(const Result& r, double gbs, bool diffs) const {
  std::string dedup, balance;
  if (r.kind == kFusco && r.variant >= 0) {
    dedup = kDedupNames[o_.variants[r.variant].dedup];
    const MoeVariant& v = o_.variants[r.variant];
    balance = v.balanceApplies ? kBalanceNames[v.balance] : "n/a";  // dedup none / rank
  } else {
    for (int d : o_.dedups) dedup += (dedup.empty() ? "" : ",") + std::string(kDedupNames[d]);
    for (int b : o_.balances)
      balance += (balance.empty() ? "" : ",") + std::string(kBalanceNames[b]);
  }
  const int c = r.kind;
  char buf[2048];
  snprintf(buf, sizeof(buf),
           "{\"bench\":\"moe_perf\",\"time\":%lld,\"nranks\":%d,\"launch\":\"%s\","
           "\"mps\":\"%s\",\"sms\":%d,"
           "\"tokens\":%zu,\"hidden\":%zu,\"dtype\":\"%s\",\"topk\":%d,\"experts\":%d,"
           "\"pattern\":\"%s\",\"zipf_s\":%.3f,\"dedup\":\"%s\",\"balance\":\"%s\",\"fuse\":%d,"
           "\"replan\":%d,"
           "\"arena\":%d,\"iters\":%d,\"contender\":\"%s\",\"plan_ms\":%.3f,\"dispatch_ms\":%.3f,"
           "\"combine_ms\":%.3f,\"total_ms\":%.3f,\"total_min_ms\":%.3f,\"logical_gbs\":%.4f,"
           "\"intra_bytes\":%lld,\"inter_bytes\":%lld,\"inter_bytes_max_rank\":%lld,\"checked\":%d,"
           "\"wrong\":%lld%s}\n",
           static_cast<long long>(time(nullptr)), l_.nranks, l_.mode.c_str(), o_.mpsKind, o_.sms,
           o_.tokens, o_.hidden, dtypeName(o_.dtype), o_.topk, o_.experts,
           patternName(o_.routing.pattern), zipfS(), dedup.c_str(), balance.c_str(), o_.fuse,
           o_.replan, o_.arena, o_.iters, r.name.c_str(), r.plan, r.dispatch, r.combine, r.total,
           r.totalMin, gbs, static_cast<long long>(r.intra), static_cast<long long>(r.inter),
           static_cast<long long>(r.interMax), o_.check, static_cast<long long>(r.wrong),
           cudaJson(r, diffs && c != kLimit && (c != kFusco || !o_.fuse)).c_str());
  return buf;
}
}  // namespace perf
}  // namespace fusco
