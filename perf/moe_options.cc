// moe_perf's command line: the names of contenders, dedup and balance modes and data types, the
// fusco variants a --dedup / --balance list makes, and the options parser with its usage text.
// The routing flags (--pattern and its skew knobs) are the shared generator's (moe_routing.h).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "moe_perf.h"

namespace fusco {
namespace perf {

const char* const kContenderNames[kNumContenders] = {"fusco", "unfused", "mpi", "limit"};
const char* const kDedupNames[4] = {"auto", "none", "rank", "node"};
const char* const kBalanceNames[4] = {"auto", "none", "static", "greedy"};

std::string g_noMpiReason = "built without MPI";

const char* dtypeName(fuscoDataType_t dt) {
  return dt == fuscoFloat32 ? "fp32" : dt == fuscoFloat16 ? "fp16" : "bf16";
}

fuscoMoeConfig_t moeConfig(const MoeOptions& o, const MoeVariant& v) {
  fuscoMoeConfig_t cfg = FUSCO_MOE_CONFIG_INITIALIZER;
  cfg.numExperts = o.experts;
  cfg.dedup = v.dedup;
  cfg.balance = v.balance;
  cfg.expertAlignment = 0;  // so recvX has exactly the unfused pipeline's sorted layout
  return cfg;
}

std::vector<MoeVariant> moeVariants(const std::vector<int>& dedups,
                                    const std::vector<int>& balances) {
  std::vector<MoeVariant> out;
  auto add = [&out](int d, int b, bool applies) {
    for (const MoeVariant& v : out)
      if (v.dedup == d && (v.balance == b || !applies)) return;
    MoeVariant v;
    v.dedup = d, v.balance = b, v.balanceApplies = applies;
    out.push_back(v);
  };
  for (int d : dedups) {
    if (d == FUSCO_DEDUP_NONE || d == FUSCO_DEDUP_RANK)
      add(d, balances.front(), false);
    else
      for (int b : balances) add(d, b, true);
  }
  return out;
}

std::string variantName(const MoeVariant& v, bool single) {
  if (single) return "fusco";
  std::string n = std::string("fusco[") + kDedupNames[v.dedup];
  if (v.balanceApplies) n += std::string("/") + kBalanceNames[v.balance];
  return n + "]";
}

double dtypeEps(fuscoDataType_t dt) {
  return dt == fuscoFloat32 ? 1.0 / (1 << 20) : dt == fuscoFloat16 ? 1.0 / 2048 : 1.0 / 256;
}

namespace {

void usage(const char* prog) {
  printf(
      "usage: %s [options]   (MoE dispatch + combine: fusco vs unfused vs MPI vs memcpy)\n"
      "  --hidden N          elements per token row (7168)\n"
      "  --dtype T           bf16 | fp16 | fp32 (bf16)\n"
      "  --tokens N          tokens per rank (4096)\n"
      "  --topk K            experts per token (8)\n"
      "  --experts E         experts in all, contiguous blocks of E/nranks per rank (256)\n"
      "  --seed S            routing, weights and rows seed (1)\n"
      "  -n N / -w N         timed / warmup iterations (5 / 1)\n"
      "  -c 0|1              check every contender's dispatch bytes and combine (1)\n"
      "  --dedup D[,D...]    auto | none | rank | node (auto); a list runs one fusco contender\n"
      "                      per (dedup, balance) pair, interleaved, named fusco[node/greedy],\n"
      "                      and prints the ratios between them (none / rank ignore --balance)\n"
      "  --balance B[,B...]  auto | none | static | greedy (auto)\n"
      "  --fuse on|off       off: the fusco contender runs the unfused pipeline (on)\n"
      "  --replan on|off     plan every iteration, as routing changes every step (on); off:\n"
      "                      plan once, reuse the handle and the pipelines' permutation\n"
      "  --contenders LIST   comma list of fusco,unfused,mpi,limit (all available)\n"
      "  --ll on|off         on: time fuscoLowLatencyDispatch (bf16, fp8) and\n"
      "                      fuscoLowLatencyCombine, and their receive-hook form, against\n"
      "                      fuscoMoeDispatch / fuscoMoeCombine of one plan, us per call (off);\n"
      "                      its defaults: --tokens 128 --experts 64 -n 100 -w 10 -np 8\n"
      "  -a 0|1|2            buffers from fuscoMemAlloc (1) or malloc (0) (1); with --mem cuda:\n"
      "                      fuscoMemAlloc (1), cudaMalloc (0), cudaMalloc + fuscoCommRegister\n"
      "                      (2)\n"
      "  --mem M             host | cuda | auto: where x, recvX, out, ... live (host); cuda:\n"
      "                      device buffers, stream-ordered calls, CUDA-kernel pipeline,\n"
      "                      device-copy limit; auto: cuda when a CUDA device is present\n"
      "  --mps M             auto | on | off: with -np N ranks on CUDA memory, a private MPS\n"
      "                      daemon for the run (auto: when ranks outnumber the devices and\n"
      "                      nvidia-cuda-mps-control is on PATH, unless one already serves;\n"
      "                      on: the same, and no daemon is an error; off: time-sliced) (auto)\n"
      "                      test hook: FUSCO_PERF_FAKE_DEVICES=N decides as if N devices and\n"
      "                      CUDA memory (the ranks keep --mem)\n"
      "  --sms N             with --mem cuda: the SM budget of fusco's kernels on each rank\n"
      "                      (fuscoConfig_t.maxSms; 0: all, or the rank's part of a shared GPU)\n"
      "                      (0); the copy limit is not capped; not with --ll\n"
      "  --mpi-launch M      auto | off: with -np N re-launch under mpirun for the mpi contender\n"
      "  -np N               fork N local ranks (else mpirun / srun / torchrun, else 1 rank)\n"
      "  -J FILE             append one JSON line per contender to FILE (rank 0)\n"
      "  -h                  this help\n"
      "routing (uniform by default; the same generator and flags as tools/fusco_sim):\n",
      prog);
  fputs(routingFlagsHelp(), stdout);
}

bool parseContenders(const char* v, bool* out) {
  for (int c = 0; c < kNumContenders; ++c) out[c] = false;
  std::string list = v;
  size_t b = 0;
  while (b <= list.size()) {
    size_t e = list.find(',', b);
    if (e == std::string::npos) e = list.size();
    std::string name = list.substr(b, e - b);
    int found = -1;
    for (int c = 0; c < kNumContenders; ++c)
      if (name == kContenderNames[c]) found = c;
    if (found < 0) return false;
    out[found] = true;
    b = e + 1;
  }
  return true;
}

// A comma list of names (at least one, none empty).
bool parseNameList(const char* v, const char* const* names, int n, std::vector<int>* out) {
  out->clear();
  std::string list = v;
  size_t b = 0;
  while (b <= list.size()) {
    size_t e = list.find(',', b);
    if (e == std::string::npos) e = list.size();
    int i = 0;
    if (!parseName(list.substr(b, e - b).c_str(), names, n, &i)) return false;
    out->push_back(i);
    b = e + 1;
  }
  return !out->empty();
}

// One option with its value; false on a bad value or an unknown option (*known = false).
bool parseOption(const std::string& a, const char* v, MoeOptions* o, bool* known) {
  *known = true;
  int i = 0;
  if (a == "--hidden") return parseSize(v, &o->hidden) && o->hidden > 0;
  if (a == "--tokens") return parseSize(v, &o->tokens);
  if (a == "--topk") return parseInt(v, &o->topk) && o->topk >= 1;
  if (a == "--experts") return parseInt(v, &o->experts) && o->experts >= 1;
  if (a == "--seed") return parseInt(v, &i) && (o->seed = static_cast<uint64_t>(i), true);
  if (a == "-n") return parseInt(v, &o->iters) && o->iters >= 1;
  if (a == "-w") return parseInt(v, &o->warmup) && o->warmup >= 0;
  if (a == "-c") return parseInt(v, &o->check) && (o->check == 0 || o->check == 1);
  if (a == "-a") return parseInt(v, &o->arena) && o->arena >= 0 && o->arena <= 2;
  if (a == "--mem") return parseMemMode(v, &o->mem);
  if (a == "--mps") return parseMpsMode(v, &o->mps);
  if (a == "--sms") return parseInt(v, &o->sms) && o->sms >= 0;
  if (a == "-np") return parseInt(v, &o->launch.np) && o->launch.np >= 1;
  if (a == "-J") return (o->jsonPath = v), true;
  if (parseRoutingFlag(a, v, &o->routing, known)) return true;
  if (*known) return false;
  *known = true;
  if (a == "--dedup") return parseNameList(v, kDedupNames, 4, &o->dedups);
  if (a == "--balance") return parseNameList(v, kBalanceNames, 4, &o->balances);
  if (a == "--contenders") return parseContenders(v, o->contenders);
  static const char* const kOffOn[] = {"off", "on"};
  static const char* const kOffAuto[] = {"off", "auto"};
  if (a == "--fuse") return parseName(v, kOffOn, 2, &i) && ((o->fuse = i != 0), true);
  if (a == "--replan") return parseName(v, kOffOn, 2, &i) && ((o->replan = i != 0), true);
  if (a == "--ll") return parseName(v, kOffOn, 2, &i) && ((o->ll = i != 0), true);
  if (a == "--mpi-launch") return parseName(v, kOffAuto, 2, &i) && ((o->mpiLaunch = i != 0), true);
  if (a == "--dtype") {
    const char* const names[] = {"bf16", "fp16", "fp32"};
    const fuscoDataType_t types[] = {fuscoBfloat16, fuscoFloat16, fuscoFloat32};
    return parseName(v, names, 3, &i) && (o->dtype = types[i], true);
  }
  *known = false;
  return false;
}

// --ll on: the figure (128 tokens per rank, hidden 7168, top-8, 64 experts, 8 ranks,
// medians of 100 iterations) where the command line leaves a value open; false (message printed)
// on an option the mode does not take.
bool lowLatencyOptions(const char* prog, MoeOptions* o) {
  auto unset = [o](const char* flag) { return o->given.count(flag) == 0; };
  if (unset("--tokens")) o->tokens = 128;
  if (unset("--experts")) o->experts = 64;
  if (unset("-n")) o->iters = 100;
  if (unset("-w")) o->warmup = 10;
  if (unset("-np") && launcherInEnvironment() == nullptr) o->launch.np = 8;
  const char* why = o->dtype != fuscoBfloat16 ? "--dtype: the low-latency path moves bf16"
                    : !o->fuse                ? "--fuse off: the normal row is fused"
                    : !unset("--contenders")  ? "--contenders: its rows are fixed"
                    : !unset("--sms")         ? "--sms: the SM budget is timed on the normal path"
                    : moeVariants(o->dedups, o->balances).size() > 1
                        ? "a --dedup / --balance list: it times one normal row"
                        : nullptr;
  if (why != nullptr) fprintf(stderr, "%s: --ll on does not take %s\n", prog, why);
  return why == nullptr;
}

}  // namespace

// Returns 0 to run, 1 after -h, 2 on a bad command line (message printed).
int parseMoeArgs(int argc, char** argv, MoeOptions* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") return usage(argv[0]), 1;
    if (a == "--mpi-probe") {
      o->mpiProbe = true;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "%s: unknown option or missing value: %s (see -h)\n", argv[0], a.c_str());
      return 2;
    }
    const char* v = argv[++i];
    o->given.insert(a);
    bool known = true;
    if (!parseOption(a, v, o, &known)) {
      fprintf(stderr, "%s: %s %s (see -h)\n", argv[0], known ? "bad value for" : "unknown option",
              known ? (a + " " + v).c_str() : a.c_str());
      return 2;
    }
  }
  if (o->ll && !lowLatencyOptions(argv[0], o)) return 2;
  o->routing.numExperts = o->experts, o->routing.topk = o->topk;
  o->routing.tokens = o->tokens, o->routing.seed = o->seed;
  std::string err;
  if (!checkRoutingSpec(o->routing, &err)) {
    fprintf(stderr, "%s: %s\n", argv[0], err.c_str());
    return 2;
  }
  o->variants = moeVariants(o->dedups, o->balances);
  if (o->variants.size() > 1 && !o->fuse) {
    fprintf(stderr,
            "%s: --fuse off runs the unfused pipeline as the fusco contender: give one "
            "--dedup and one --balance value\n",
            argv[0]);
    return 2;
  }
  return 0;
}

}  // namespace perf
}  // namespace fusco
