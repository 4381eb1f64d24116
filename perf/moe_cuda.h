// moe_perf's CUDA memory mode (--mem cuda): one rank's device buffers and the stream-ordered
// phases of each contender. moe_perf.cc's Bench drives it and keeps the rest (the routing, the host
// mirrors its checks read, the barrier on the control comm, the table).
//
//   fusco    fuscoMoePlan (device topkIdx) + fuscoMoeDispatch (x -> recvX) + fuscoMoeCombine
//            (expertOut -> out). The expert is the identity and untimed: expertOut = recvX, copied.
//   unfused  permute kernel (x -> P, rows in destination-rank-major order), fuscoAllToAllv (P -> Q,
//            device buffers), sort-chunks kernel (Q -> expertOut, expert-major); combine: unsort
//            (expertOut -> P), fuscoAllToAllv back (P -> Q), un-permute kernel with the weighted
//            sum in fp32 over k (Q -> out). Kernels: moe_kernels.h. Its plan: topkIdx to the
//            host, UnfusedPipeline::plan (whose counts all-to-all runs on the data comm through
//            device memory, as Megatron's tokens_per_expert exchange does), index lists back.
//   limit    cudaMemcpyAsync device to device of the bytes this rank sends in dispatch (P -> Q),
//            then of those it sends in combine (Q -> P).
// Every phase: barrier (control comm), host clock, enqueue on the rank's stream,
// cudaStreamSynchronize, host clock. fusco's dispatch and combine calls are also clocked alone
// (their host time: they return once enqueued).
//
// No CUDA header needed. makeCudaMoe returns nullptr in a build without CUDA (moe_perf refuses
// --mem cuda there before it gets this far).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "cuda_mem.h"
#include "fusco.h"
#include "moe_baselines.h"

namespace fusco {
namespace perf {

struct CudaMoeShape {
  int rank = 0, nranks = 1, topk = 1;
  size_t tokens = 0, hidden = 0, rowBytes = 0;
  fuscoDataType_t dtype = fuscoBfloat16;
  BufferKind buffers = BufferKind::Arena;
  fuscoMoeConfig_t moe = FUSCO_MOE_CONFIG_INITIALIZER;  // numExperts in contiguous blocks
  int maxSms = 0;  // the data comm's SM budget (fuscoConfig_t.maxSms; 0: all)
};

// What one run of a contender records (moe_perf's t[kRunTimes]): plan, dispatch and combine ms,
// then the host wall time in us of the fuscoMoeDispatch and fuscoMoeCombine calls alone, which
// return once enqueued (runFusco only; 0 in every other run, host mode included).
enum { kPlanMs, kDispatchMs, kCombineMs, kDispatchHostUs, kCombineHostUs, kRunTimes };

class CudaMoe {
 public:
  using Barrier = std::function<bool()>;
  enum Buffer { kRecvX, kExpertOut, kOut };

  virtual ~CudaMoe() = default;
  // Device, stream and the fuscoMemCuda data comm (cudaRankInit: collective over control).
  virtual bool init(fuscoComm_t control) = 0;
  virtual const CudaRank& cuda() const = 0;
  // The unfused pipeline's exchange: counts through device memory, rows between device buffers.
  virtual RowExchange* exchange() = 0;
  // Local: device copies of topkIdx [tokens x topk], weights [tokens x topk] and x [tokens rows].
  virtual bool upload(const int64_t* topkIdx, const float* weights, const void* x) = 0;
  // Collective: the first fusco plan (into *handle) and pipeline plan; routing must be built on
  // exchange() and outlive this object's runs.
  virtual bool planOnce(UnfusedPipeline* routing, fuscoMoeHandle_t* handle) = 0;
  // Local: recvX (recvRows), expertOut (expertRows), P and Q (bufRows rows each), out.
  virtual bool allocate(size_t recvRows, size_t expertRows, size_t bufRows) = 0;
  // One iteration of a contender: t[0..2] = plan, dispatch, combine ms; runFusco also sets
  // t[kDispatchHostUs] and t[kCombineHostUs] (steady_clock around the call, not the sync). plan
  // false: reuse the last plan (t[0] ~ 0). poison: fill the outputs with 0xA5 first (a checked
  // run).
  virtual bool runFusco(fuscoMoeHandle_t* handle, bool plan, bool poison, const Barrier& barrier,
                        double* t) = 0;
  virtual bool runUnfused(bool plan, bool poison, const Barrier& barrier, double* t) = 0;
  virtual bool runLimit(size_t dispatchBytes, size_t combineBytes, const Barrier& barrier,
                        double* t) = 0;
  // Synchronous copy of the first bytes of a device buffer to host (fusco's recvX, expertOut as
  // the last dispatch left it, out).
  virtual bool download(Buffer which, void* host, size_t bytes) = 0;
  // What failed last.
  virtual const std::string& error() const = 0;
};

std::unique_ptr<CudaMoe> makeCudaMoe(const CudaMoeShape& shape);

}  // namespace perf
}  // namespace fusco
