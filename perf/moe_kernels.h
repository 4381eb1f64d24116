// CUDA kernels of moe_perf's unfused pipeline (--mem cuda): the Megatron-style baseline that fusco
// is measured against, not the library. Each moves whole rows with 16-byte loads and stores when
// the row size and the pointers allow it (else 4- or 1-byte ones), one warp per row (the
// un-permute: one block per token), grids sized to the work.
//
// Host-callable launchers; no CUDA header needed (a stream is a cudaStream_t passed as void*).
// Each returns the cudaError_t of the launch as an int (0: enqueued).
#pragma once

#include <cstddef>
#include <cstdint>

#include "fusco.h"

namespace fusco {
namespace perf {

// The permute: dst row i = src row srcRow[i], for i < nrows. srcRow is a device array.
int launchGatherRows(const void* src, void* dst, const int64_t* srcRow, size_t nrows,
                     size_t rowBytes, void* stream);

// sort_chunks_by_idxs between source-major chunks ([source rank][local expert]) and expert-major
// ones ([local expert][source rank]). Chunk c, numbered in expert-major order, starts at row
// emStart[c] of the expert-major buffer and at row smStart[c] of the source-major one; emStart has
// nchunks + 1 entries, the last one = nrows. unsort false: src is source-major, dst expert-major
// (dispatch); true: the reverse (combine). Device arrays.
int launchSortChunks(const void* src, void* dst, const int64_t* emStart, const int64_t* smStart,
                     int nchunks, size_t nrows, size_t rowBytes, bool unsort, void* stream);

// The un-permute with the weighted sum: for each token t,
//   out[t] = round_dt(((0 + w[t][k0] * rows[slotPos[t][k0]]) + w[t][k1] * ...) ...)
// over the k with slotPos[t * topk + k] >= 0, in k order, fp32 accumulation, the multiply and the
// add rounded separately (the arithmetic of weightedSumRows, row_reduce.h); a token with no
// valid slot gets zeros. weights NULL: every weight is 1. dt: fuscoBfloat16, fuscoFloat16 or
// fuscoFloat32 (else cudaErrorInvalidValue). Device arrays.
int launchUnpermuteSum(const void* rows, const int64_t* slotPos, const float* weights,
                       size_t tokens, int topk, fuscoDataType_t dt, size_t hidden, void* out,
                       void* stream);

}  // namespace perf
}  // namespace fusco
