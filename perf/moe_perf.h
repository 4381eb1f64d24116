// moe_perf's options, its contenders and the Bench that runs them in one rank. The command line
// is parsed in moe_options.cc; Bench lives in moe_perf.cc, its report in moe_perf_report.cc and its
// --mem cuda half (device setup, checks on host mirrors) in moe_perf_cuda.cc, which drives the
// device side in moe_cuda.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cuda_mem.h"
#include "fusco.h"
#include "launcher.h"
#include "moe_baselines.h"
#include "moe_cuda.h"
#include "moe_routing.h"
#include "moe_rows.h"
#include "mps_daemon.h"

namespace fusco {
namespace perf {

enum { kFusco = 0, kUnfused = 1, kMpi = 2, kLimit = 3, kNumContenders = 4 };
extern std::string g_noMpiReason;  // why the mpi contender cannot run (for the report)
extern const char* const kContenderNames[kNumContenders];
extern const char* const kDedupNames[4];    // FUSCO_DEDUP_* order
extern const char* const kBalanceNames[4];  // FUSCO_BALANCE_* order

// One fusco contender: a (dedup, balance) pair. --dedup / --balance take comma lists and every
// distinct pair runs as its own contender with its own handle (dedup none / rank ignore the
// balance, so they run once each: balanceApplies false).
struct MoeVariant {
  int dedup = FUSCO_DEDUP_AUTO;
  int balance = FUSCO_BALANCE_AUTO;
  bool balanceApplies = true;
};

struct MoeOptions {
  size_t hidden = 7168;
  fuscoDataType_t dtype = fuscoBfloat16;
  size_t tokens = 4096;
  int topk = 8;
  int experts = 256;
  RoutingSpec routing;  // --pattern and its skew knobs; experts, topk, tokens, seed copied in
  uint64_t seed = 1;
  int iters = 5;
  int warmup = 1;
  int check = 1;
  std::vector<int> dedups = {FUSCO_DEDUP_AUTO};      // --dedup list, as given
  std::vector<int> balances = {FUSCO_BALANCE_AUTO};  // --balance list, as given
  std::vector<MoeVariant> variants;  // distinct (dedup, balance) pairs, dedup-major (parseArgs);
                                     // the CUDA path runs the first
  bool fuse = true;
  bool replan = true;  // off: plan once and reuse the handle / permutation (steady state)
  bool ll = false;  // --ll on: time the low-latency calls against the normal path (moe_perf_ll.h)
  int arena = 1;    // host: 1 fuscoMemAlloc, 0 malloc; cuda: BufferKind (0, 1, 2)
  MemMode mem = MemMode::Host;
  MpsMode mps = MpsMode::Auto;  // --mps: a private MPS daemon for -np ranks sharing a GPU
  int sms = 0;                  // --sms: the CUDA data comm's SM budget (fuscoConfig_t.maxSms)
  const char* mpsKind = "off";  // what the run got (MpsRun::kind), for the header and JSON
  bool contenders[kNumContenders] = {true, true, true, true};
  bool mpiLaunch = true;  // --mpi-launch auto: re-launch -np N under mpirun for the mpi contender
  bool mpiProbe = false;  // internal: check that mpirun can start this binary with MPI
  const char* jsonPath = nullptr;
  LaunchOptions launch;
  std::set<std::string> given;  // the options on the command line (--ll on picks other defaults)
};

// Parses argv into *o. Returns 0 to run, 1 after -h, 2 on a bad command line (message printed).
int parseMoeArgs(int argc, char** argv, MoeOptions* o);

const char* dtypeName(fuscoDataType_t dt);
fuscoMoeConfig_t moeConfig(const MoeOptions& o, const MoeVariant& v);
// The distinct variants of dedups x balances (none / rank once each, with balances[0]).
std::vector<MoeVariant> moeVariants(const std::vector<int>& dedups,
                                    const std::vector<int>& balances);
// "fusco" for a single variant, else "fusco[node/greedy]" ("fusco[none]" where balance is moot).
std::string variantName(const MoeVariant& v, bool single);
// Relative size of one rounding to dt.
double dtypeEps(fuscoDataType_t dt);
// The median of v (0 when empty).
double median(std::vector<double> v);
// The header line of rows sent and received per rank (rows: [2 * nranks], sent then received).
void printRowRange(const std::vector<int64_t>& rows, int nranks);
// Every rank sends the same count elements of dt (mine) to every rank: all[r * count ...] gets
// rank r's. A host all-to-all on comm.
fuscoResult_t allGather(fuscoComm_t comm, int nranks, const void* mine, void* all, size_t count,
                        fuscoDataType_t dt);

struct Result {  // rank 0's summary of one contender (one row of the table)
  bool ran = false;
  int kind = kFusco, variant = -1;  // variant: index into MoeOptions::variants (fusco rows)
  std::string name;
  double plan = 0, dispatch = 0, combine = 0, total = 0, totalMin = 0;
  double maxDiff = 0;  // --mem cuda: max |out - fusco's out| over ranks (checked pipelines)
  double dispatchHostUs = 0, combineHostUs = 0;  // kDispatchHostUs, kCombineHostUs; same median
  int64_t intra = 0, inter = 0, wrong = 0;
  int64_t interMax = 0;  // the largest one rank's inter-node bytes sent (fusco rows: its stats)
};

class Bench {
 public:
  Bench(const MoeOptions& o, const Launch& l) : o_(o), l_(l) {}
  ~Bench();
  int run();

 private:
  bool ok(fuscoResult_t r, const char* what);
  bool pipeOk(bool good, const char* what, const UnfusedPipeline& p);
  bool setup();
  bool allocate();
  bool agree(bool mineOk);
  // --mem cuda (moe_cuda.h does the device work; these keep the checks on host mirrors).
  bool gpuOk(bool good, const char* what);
  bool setupCuda();
  bool allocateCuda();
  bool runCuda(int c, double* t, int64_t* wrong);
  bool hostTimed(const Result& r) const;  // --mem cuda, fused fusco row: host us measured
  bool cudaReference();
  bool checkCudaFusco(int64_t* wrong);
  bool checkCudaPipeline(int c, int64_t* wrong);
  int64_t diffCombine(const char* ref, double* maxDiff) const;
  std::string cudaJson(const Result& r, bool withDiff) const;
  std::string hostColumns(const Result& r) const;
  void* alloc(size_t bytes);
  bool barrier();
  bool allToAllSame(const void* mine, void* all, size_t count, fuscoDataType_t dt);
  bool runContender(int row, double* t, int64_t* wrong);
  bool runFusco(int v, double* t, int64_t* wrong);
  bool runPipeline(UnfusedPipeline& p, double* t, int64_t* wrong);
  bool runLimit(double* t);
  // ref: the dispatch output compared with (nullptr: recvX_).
  int64_t compareDispatch(const char* got, size_t rows, const char* ref = nullptr) const;
  int64_t checkCombine() const;
  bool trafficOf(int row, int64_t* intra, int64_t* inter);
  bool summarize(const std::vector<double>& mine, const std::vector<int64_t>& wrong,
                 std::vector<Result>* res);
  double zipfS() const;
  void printHeader(const std::vector<int64_t>& rowsPerRank) const;
  void printTable(const std::vector<Result>& res) const;
  void printRow(const Result& r, int w, const Result* const base[2], bool diffs) const;
  void printVariantRatios(const std::vector<Result>& res) const;
  std::string jsonLine(const Result& r, double gbs, bool diffs) const;

  struct Row {  // one contender of the table: a fusco variant, or unfused / mpi / limit
    int kind;
    int variant;  // fusco: index into o_.variants; else -1
    std::string name;
  };

  const MoeOptions& o_;
  const Launch& l_;
  fuscoComm_t comm_ = nullptr;
  std::vector<fuscoMoeHandle_t> handles_;  // one per variant (CUDA path: one variant)
  std::vector<Row> rows_;                  // fusco variants, then unfused, mpi, limit
  std::vector<char> checkRef_;             // -c 1 with variants: the first variant's recvX
  int node_ = 0, numNodes_ = 1;
  std::vector<int> nodeOfRank_;
  std::vector<int64_t> topkIdx_;
  std::vector<float> weights_;
  size_t elem_ = 2, rowBytes_ = 0, recvRows_ = 0, bufRows_ = 0;
  char *x_ = nullptr, *recvX_ = nullptr, *p_ = nullptr, *q_ = nullptr, *out_ = nullptr;
  std::vector<void*> owned_;
  std::unique_ptr<RowExchange> fuscoEx_, mpiEx_;
  std::unique_ptr<UnfusedPipeline> unfused_, mpi_;
  bool active_[kNumContenders] = {};
  FILE* json_ = nullptr;
  // --mem cuda: the device side, host mirrors (x, recvX, expert-major rows, out, fusco's out) and
  // each pipeline's max |out - fusco's out|.
  std::unique_ptr<CudaMoe> gpu_;
  std::unique_ptr<char[]> mirror_[5];
  double maxDiff_[kNumContenders] = {};
};

}  // namespace perf
}  // namespace fusco
