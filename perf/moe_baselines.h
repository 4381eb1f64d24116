// The unfused (Megatron / NCCL style) MoE token shuffle that moe_perf compares fusco against:
//
//   dispatch: permute (one row per (token, expert), sorted by expert id, tokens ascending: each
//             destination rank's chunk is expert-major) -> all-to-all of per-expert counts ->
//             all_to_all_single (an all-to-all-v of rows) -> sort_chunks_by_idxs (received chunks
//             [source][local expert] regrouped into [local expert][source]).
//   combine:  the mirror: un-sort ([expert][source] -> [source][expert]) -> all-to-all-v back ->
//             un-permute with the weighted sum per token (k order, fp32 accumulation, the same
//             weightedSumRows, row_reduce.h: the arithmetic of fusco's combine).
//
// With contiguous expert placement and no padding, the sorted dispatch output has exactly fusco's
// expert-major layout (docs/API.md), so the two can be compared byte for byte.
// The exchange itself is pluggable: fuscoAllToAllv (same library, same transports) or
// MPI_Alltoallv on MPI_COMM_WORLD.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusco.h"

namespace fusco {
namespace perf {

class RowExchange {
 public:
  virtual ~RowExchange() = default;
  // All-to-all of perPeer int64 values per peer (block p goes to rank p).
  virtual bool counts(const int64_t* send, int64_t* recv, size_t perPeer) = 0;
  // All-to-all-v of rows: sendRows[p] rows (peer-major, contiguous) to rank p, recvRows[p] rows
  // from rank p into recv (source-major, contiguous).
  virtual bool rows(const void* send, const size_t* sendRows, void* recv, const size_t* recvRows,
                    size_t rowBytes) = 0;
  std::string error;  // the last failure, for the caller to print
};

std::unique_ptr<RowExchange> makeFuscoExchange(fuscoComm_t comm, int nranks);
#ifdef FUSCO_HAVE_MPI
std::unique_ptr<RowExchange> makeMpiExchange(int nranks);

// Replaces this process with `mpirun --oversubscribe --bind-to none -np N <self> <argv without
// -np N>` (OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1 set when unset), after a first run of
// `... <self> --mpi-probe` showed that mpirun starts and MPI initialises (within 60 s).
// Returns only when that cannot be done, with the reason in *why.
void relaunchUnderMpirun(int argc, char** argv, int np, std::string* why);
#endif

class UnfusedPipeline {
 public:
  UnfusedPipeline(RowExchange* ex, int rank, int nranks, int numExperts, int topk, size_t tokens)
      : ex_(ex),
        rank_(rank),
        nranks_(nranks),
        numExperts_(numExperts),
        topk_(topk),
        tokens_(tokens) {}

  // Megatron's preprocessing: tokens per expert, the permutation, the counts all-to-all.
  bool plan(const int64_t* topkIdx);
  // x: tokens rows -> permBuf (sendRows() rows) -> recvBuf (recvRows() rows) -> out (expert-major).
  bool dispatch(const void* x, size_t rowBytes, void* permBuf, void* recvBuf, void* out);
  // expertOut: recvRows() rows, expert-major -> unsortBuf -> backBuf (sendRows() rows) -> out
  // (tokens rows of hidden elements of dt, weighted sum over k).
  bool combine(const void* expertOut, fuscoDataType_t dt, size_t hidden, const float* weights,
               void* unsortBuf, void* backBuf, void* out);

  size_t sendRows() const { return permIdx_.size(); }
  size_t recvRows() const { return recvTotal_; }
  const std::vector<size_t>& sendRowsTo() const { return sendTo_; }
  const std::vector<size_t>& recvRowsFrom() const { return recvFrom_; }
  const std::string& error() const { return ex_->error; }
  // The last plan's metadata, for the device copy of this pipeline (moe_cuda.cc): permuted row ->
  // token, token * topk + k -> permuted row (-1: unused slot), rows per [source][local expert].
  const std::vector<int64_t>& permutation() const { return permIdx_; }
  const std::vector<int64_t>& slotPositions() const { return slotPos_; }
  const std::vector<int64_t>& chunkRows() const { return recvCounts_; }

 private:
  // Chunk copies between [source][local expert] and [local expert][source] order.
  void sortChunks(const char* src, char* dst, size_t rowBytes, bool unsort) const;

  RowExchange* ex_;
  int rank_, nranks_, numExperts_, topk_;
  size_t tokens_;
  std::vector<int64_t> permIdx_;  // permuted row -> token
  std::vector<int64_t> slotPos_;  // token * topk + k -> permuted row (-1: unused slot)
  std::vector<size_t> sendTo_, recvFrom_;
  std::vector<int64_t> recvCounts_;  // [source][local expert] rows
  size_t recvTotal_ = 0;
};

}  // namespace perf
}  // namespace fusco
