// The CUDA path's kernels, seen from host C++ (no CUDA headers here): row copies between device
// buffers (gather, scatter, fan-out to several rows, all in one pass), combine's weighted sum at
// the source over every rank's expert output, and zero-filling of padding rows. Every launch is
// stream-ordered on `stream` (a cudaStream_t) and returns once enqueued.
//
// Host twins: the copies are row_copy.h's gatherBytes/scatterBytes/streamCopy; the sum is
// reduce.h's weightedSumRows (each rank's group) then sumRows (over ranks), with the same bits
// (reduce_math.h is shared).
// Without the CUDA toolkit in the build, every launcher returns fuscoInvalidUsage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "fusco.h"

namespace fusco {

// One copy: nrows rows of rowBytes from src to dst. A side with rows == nullptr is contiguous
// (row i at base + i * rowBytes); a destination with fanStart writes row i to every row
// fanRows[fanStart[i] .. fanStart[i+1]). totalBytes clips the last row (contiguous pieces of a
// flat message); otherwise it is nrows * rowBytes. All pointers are device pointers.
struct DevCopyTask {
  const char* src = nullptr;
  const int64_t* srcRows = nullptr;
  char* dst = nullptr;
  const int64_t* dstRows = nullptr;
  const uint32_t* fanStart = nullptr;
  const int64_t* fanRows = nullptr;
  uint64_t rowBytes = 0;
  uint64_t nrows = 0;
  uint64_t totalBytes = 0;
};
fuscoResult_t deviceCopy(const std::vector<DevCopyTask>& tasks, void* stream);

// The copy kernel's host twin: one task, row by row as the kernel does it. beat (may be null) is
// raised after every MiB copied, so a large row keeps showing progress. check, when given, sees
// each source (write false) and destination (write true) range before it is touched; a false
// stops the task there, and the result is false.
using CopyRangeCheck = std::function<bool(const void* ptr, uint64_t bytes, bool write)>;
bool hostCopyTask(const DevCopyTask& t, volatile uint32_t* beat,
                  const CopyRangeCheck* check = nullptr);

// Deferred copies: a block of batches in memory the device reads (pinned and mapped), filled by
// the host later (deviceFillCopyBatches) and read by an operation's kernel (op_program.h, its
// copy steps) once its GO passed. deviceCopyBatchSlots: batches for up to ntasks tasks, of
// deviceCopyBatchBytes each (16-byte aligned).
size_t deviceCopyBatchBytes();
size_t deviceCopyBatchSlots(size_t ntasks);
// Tasks per batch, in the kernels and their twin alike.
constexpr int kCopyBatchTasks = 32;
// A task that moves bytes (a fill skips the others).
inline bool copyTaskMoves(const DevCopyTask& t) { return t.totalBytes != 0 && t.nrows != 0; }
// After a fill took tasks[0, at) into `slots` batches: an internal error if a task that moves
// bytes is left over (the block was reserved for fewer).
fuscoResult_t copyBatchesTookAll(const std::vector<DevCopyTask>& tasks, size_t at, size_t slots);
fuscoResult_t deviceFillCopyBatches(const std::vector<DevCopyTask>& tasks, void* block,
                                    size_t slots);
// One launch of an operation's program (op_program.h): steps [first, first + count) of the
// pinned block whose device address is `block`, on `stream`; the waits are the kernel's own.
fuscoResult_t deviceLaunchOp(char* block, uint32_t first, uint32_t count, void* stream);
// One launch of an operation's program (op_program.h): steps [first, first + count) of the
// pinned block at `block` (its device address), on `stream`. The waits are the kernel's own.
fuscoResult_t deviceLaunchOp(char* block, uint32_t first, uint32_t count, void* stream);

// A copy of `bytes` contiguous bytes, in 64 KiB pieces (one warp each) with a clipped last piece.
inline DevCopyTask flatCopyTask(const void* src, void* dst, uint64_t bytes) {
  constexpr uint64_t kPiece = 64 << 10;
  DevCopyTask t;
  t.src = static_cast<const char*>(src);
  t.dst = static_cast<char*>(dst);
  t.rowBytes = kPiece;
  t.nrows = (bytes + kPiece - 1) / kPiece;
  t.totalBytes = bytes;
  return t;
}

// The combine sum at the source, read straight from every rank's expert output: token t's terms
// are [termStart[t], termStart[t+1]), one group per rank that holds rows of it (rank ascending),
// termLast[k] != 0 closing a group:
//   out[t] = round_dt(sum_groups widen(round_dt(sum_terms w * row)))
// fp32 accumulation from +0 in term order, multiply and add rounded separately, where row = row
// termRow[k] of bases[termRank[k]] (a device array of the ranks' mapped expert outputs) and
// w = weights[termWeight[k]], or the row itself when termWeight < 0 or weights is null. A token
// without terms gets zeros. The bases are filled after the launch (engine_async.h), with
// basesAligned, a device-visible word the kernels read: 1 when every base is 16-byte aligned, 2
// when not, 0 when the operation never resolved (the kernels read nothing).
struct DevFinalSum {
  const char* const* bases = nullptr;
  const uint32_t* basesAligned = nullptr;
  const uint32_t* termStart = nullptr;
  const uint32_t* termRank = nullptr;
  const int64_t* termRow = nullptr;
  const int64_t* termWeight = nullptr;
  const uint8_t* termLast = nullptr;
  const float* weights = nullptr;
  char* out = nullptr;
  uint64_t ntokens = 0;
};
fuscoResult_t deviceFinalSum(fuscoDataType_t dt, size_t hidden, const DevFinalSum& f, void* stream);

// FUSCO_CUDA_SMS: multiprocessors the kernels may use where no comm's config sets an SM budget
// (0: all). Declared in
// cuda_rt.cc, which every build compiles, so `fusco_info` lists it in builds without CUDA too.
int64_t paramCudaSms();

// Zero-fills n ranges of rows of base (rows of rowBytes): ranges holds (first row, row count)
// pairs in device memory; longest is the largest count (it sizes the grid).
fuscoResult_t deviceZeroRowRanges(void* base, size_t rowBytes, const int64_t* ranges, size_t n,
                                  int64_t longest, void* stream);

}  // namespace fusco
