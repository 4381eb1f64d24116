// moe_perf --ll on: the low-latency calls (docs/API.md, "Low-latency dispatch and combine") timed
// against the normal path on the same routing and bytes, in one run, interleaved per iteration:
//
//   normal    fuscoMoeDispatch / fuscoMoeCombine of a handle planned once before the loop; its
//             plan column is fuscoMoeReplan of that handle with the same routing, timed as a phase
//             of its own, so dispatch and combine never include it (--replan off: not timed).
//   ll-bf16   fuscoLowLatencyDispatch (FUSCO_LL_BF16) and fuscoLowLatencyCombine.
//   ll-fp8    the same with FUSCO_LL_FP8 (only where hidden % 128 == 0).
//   ll-hook   bf16, each call with FUSCO_LL_RECV_HOOK followed at once by
//             fuscoLowLatencyRecvHook: the time of both.
//
// Each call is one phase: a barrier on the control comm, then the call timed alone (a CUDA
// communicator: CUDA events on the rank's stream around it, waited for; a host one: the wall clock,
// the call returning once done). An iteration's time of a phase is the slowest rank's; the table
// shows the median over the timed iterations.
//
// Before timing, one untimed call of each form builds the expert outputs (the same function of
// each recvX row and its global expert, for both paths) and, with -c 1, checks that the
// low-latency rows per expert equal fuscoMoeDispatch's, that every low-latency combine's out
// equals fuscoMoeCombine's bit for bit, and that the normal out is within the combine's roundings
// of the exact sum. A mismatch fails the run before anything is timed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda_mem.h"
#include "fusco.h"
#include "launcher.h"
#include "moe_perf.h"

namespace fusco {
namespace perf {

// Where the low-latency bench's buffers live and how it times one call: host memory and the wall
// clock on a host communicator; device memory and CUDA events on the rank's stream on a CUDA one.
class LlSpace {
 public:
  virtual ~LlSpace() = default;
  virtual fuscoComm_t comm() const = 0;      // the comm the measured calls use
  virtual void* stream() const = 0;          // nullptr on a host comm
  virtual const CudaRank* cuda() const = 0;  // nullptr on a host comm
  // At least 64 bytes in this space; nullptr with error() on failure.
  virtual void* alloc(size_t bytes) = 0;
  // Synchronous copy (any direction between host and this space) and byte fill.
  virtual bool copy(void* dst, const void* src, size_t bytes) = 0;
  virtual bool fill(void* dst, int byte, size_t bytes) = 0;
  // Waits for the stream (nothing to do on a host comm).
  virtual bool sync(const char* what) = 0;
  // *us: how long call() took on this rank (events around it on the stream, or the wall clock).
  virtual bool time(const std::function<bool()>& call, double* us) = 0;
  virtual const std::string& error() const = 0;
};

// arena: every buffer from fuscoMemAlloc on comm (else posix_memalign).
std::unique_ptr<LlSpace> makeHostSpace(fuscoComm_t comm, bool arena);
// Collective over control: the rank's device, stream and fuscoMemCuda comm (cuda_mem.h); nullptr
// with *err on failure (every rank fails together) or in a build without CUDA.
std::unique_ptr<LlSpace> makeCudaSpace(fuscoComm_t control, int rank, int nranks, BufferKind kind,
                                       std::string* err);

// The table's rows and their phases (t[kLlPhases] of one iteration, in us).
enum { kLlNormal, kLlBf16, kLlFp8, kLlHook, kLlRows };
enum { kLlPlan, kLlDispatch, kLlCombine, kLlPhases };
extern const char* const kLlRowNames[kLlRows];  // "normal", "ll-bf16", "ll-fp8", "ll-hook"

struct LlResult {  // one row of the table, from rank 0's summary
  bool ran = false;
  double plan = 0, dispatch = 0, combine = 0;        // medians, us
  double planDispatch = 0, total = 0, totalMin = 0;  // per-iteration sums: median (min)
};

class LlBench {
 public:
  LlBench(const MoeOptions& o, const Launch& l) : o_(o), l_(l) {}
  ~LlBench();
  int run();

 private:
  // moe_perf_ll.cc: setup, the calls, the timed loop, the summary.
  bool ok(fuscoResult_t r, const char* what, fuscoComm_t comm = nullptr);
  bool spaceOk(bool good, const char* what);
  bool agree(bool mineOk);
  bool barrier();
  bool setup();
  bool allocate();
  bool planNormal(bool* counted);
  bool runPhase(int row, int phase, double* us);
  bool llDispatch(int row);
  bool llCombine(int row, void* out);
  bool timeAll(std::vector<double>* times);
  bool summarize(const std::vector<double>& mine, std::vector<LlResult>* res);
  // moe_perf_ll_check.cc: the untimed first calls, the expert outputs and the checks.
  bool prepare(int64_t* wrong);
  bool prepareNormal(int64_t* wrong);
  bool prepareLl(int row, int64_t* wrong);
  bool llRows(int row, int64_t* bad);
  int64_t compareOut(int row) const;
  int64_t checkNormalOut() const;
  void expertRow(int localExpert, const char* in, char* out) const;
  // moe_perf_ll_report.cc
  void printHeader(const std::vector<int64_t>& rowsPerRank) const;
  void printTable(const std::vector<LlResult>& res) const;
  void printRatios(const std::vector<LlResult>& res) const;
  std::string jsonLine(int row, const LlResult& r, const LlResult& normal) const;

  const MoeOptions& o_;
  const Launch& l_;
  fuscoComm_t comm_ = nullptr;  // control comm (barriers, results); the calls on space_->comm()
  std::unique_ptr<LlSpace> space_;
  fuscoLowLatency_t ll_ = nullptr;
  fuscoMoeHandle_t handle_ = nullptr;
  bool active_[kLlRows] = {};
  int localExperts_ = 0;
  size_t rowBytes_ = 0, recvRows_ = 0, cap_ = 0;  // cap_: low-latency rows per local expert
  std::vector<int64_t> topkIdx_, perExpert_;      // perExpert_: the plan's rows per local expert
  std::vector<float> weights_;
  // In the space: the routing, the rows, the normal path's recvX / expertOut / out, the
  // low-latency expertOut (recvX's layout) and out.
  int64_t* dTopk_ = nullptr;
  float* dWeights_ = nullptr;
  char *dX_ = nullptr, *dRecvX_ = nullptr, *dExpertOut_ = nullptr, *dOut_ = nullptr;
  char *dLlExpertOut_ = nullptr, *dLlOut_ = nullptr;
  fuscoLowLatencyDispatch_t dispatched_[kLlRows] = {};  // each form's last dispatch
  // Host copies for the checks: x, the normal recvX and out, the last low-latency out.
  std::vector<char> x_, recvX_, out_, llOut_;
  FILE* json_ = nullptr;
};

// The rank body of moe_perf --ll on.
int runLowLatency(const MoeOptions& o, const Launch& l);

}  // namespace perf
}  // namespace fusco
