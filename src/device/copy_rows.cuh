// The row copies of the CUDA path's kernels (device_kernels.cu, op_kernel.cu): a batch of copy
// tasks (device_ops.h), one warp per copied row with 16-byte accesses wherever the rows allow
// them and several loads in flight per lane, shared by every warp of the grid; deferred batches
// are staged in shared memory from the pinned block the progress thread filled.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "device/device_ops.h"

namespace fusco {
namespace {

constexpr int kBatch = kCopyBatchTasks;  // copy tasks per launch (kernel parameters, by value)
constexpr int kCopyThreads = 256;        // 8 warps, one row each at a time
constexpr int kUnroll = 4;               // 16-byte loads in flight per lane

struct alignas(16) CopyBatch {
  DevCopyTask t[kBatch];
  uint64_t rowStart[kBatch + 1];
  uint32_t vec;  // bit i: task i may use 16-byte accesses
  int n;
};
static_assert(kBatch <= 32, "CopyBatch::vec holds one bit per task");

// Copies len bytes from s to each of the ndst destinations, with one warp.
template <bool kVec>
__device__ __forceinline__ void warpCopy(const char* s, char* const* dsts, int ndst, uint64_t len,
                                         int lane) {
  uint64_t done = 0;
  if (kVec) {
    const uint64_t nv = len / 16;
    const uint4* sv = reinterpret_cast<const uint4*>(s);
    for (uint64_t base = 0; base < nv; base += 32 * kUnroll) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        uint64_t j = base + u * 32 + lane;
        if (j < nv) v[u] = sv[j];
      }
      for (int d = 0; d < ndst; ++d) {
        uint4* dv = reinterpret_cast<uint4*>(dsts[d]);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          uint64_t j = base + u * 32 + lane;
          if (j < nv) dv[j] = v[u];
        }
      }
    }
    done = nv * 16;
  }
  for (uint64_t j = done + lane; j < len; j += 32) {
    char c = s[j];
    for (int d = 0; d < ndst; ++d) dsts[d][j] = c;
  }
}

constexpr int kMaxFan = 8;  // destinations per pass over a row (more: the row is read again per 8)

__device__ __forceinline__ void copyRows(const CopyBatch& b) {
  const int lane = threadIdx.x & 31;
  const uint64_t nwarps = (static_cast<uint64_t>(gridDim.x) * blockDim.x) >> 5;
  const uint64_t total = b.rowStart[b.n];
  for (uint64_t g = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; g < total;
       g += nwarps) {
    int lo = 0, hi = b.n - 1;
    while (lo < hi) {
      int mid = (lo + hi + 1) >> 1;
      if (b.rowStart[mid] <= g)
        lo = mid;
      else
        hi = mid - 1;
    }
    const DevCopyTask& t = b.t[lo];
    const uint64_t i = g - b.rowStart[lo];
    const uint64_t off = i * t.rowBytes;
    const uint64_t len = t.totalBytes - off < t.rowBytes ? t.totalBytes - off : t.rowBytes;
    const char* s = t.src + (t.srcRows ? static_cast<uint64_t>(t.srcRows[i]) * t.rowBytes : off);
    char* dsts[kMaxFan];
    const bool vec = (b.vec >> lo) & 1u;
    if (t.fanStart == nullptr) {
      dsts[0] = t.dst + (t.dstRows ? static_cast<uint64_t>(t.dstRows[i]) * t.rowBytes : off);
      if (vec)
        warpCopy<true>(s, dsts, 1, len, lane);
      else
        warpCopy<false>(s, dsts, 1, len, lane);
      continue;
    }
    for (uint32_t f0 = t.fanStart[i], f1 = t.fanStart[i + 1]; f0 < f1; f0 += kMaxFan) {
      const int nd = static_cast<int>(min(f1 - f0, static_cast<uint32_t>(kMaxFan)));
      for (int d = 0; d < nd; ++d)
        dsts[d] = t.dst + static_cast<uint64_t>(t.fanRows[f0 + d]) * t.rowBytes;
      if (vec)
        warpCopy<true>(s, dsts, nd, len, lane);
      else
        warpCopy<false>(s, dsts, nd, len, lane);
    }
  }
}

// Copies `slots` deferred batches: each block stages a batch in shared memory (`raw`, one
// CopyBatch) with loads that bypass the caches, then copies its share of the batch's rows.
__device__ __forceinline__ void copyBatches(const CopyBatch* batches, uint32_t slots, uint4* raw) {
  CopyBatch& b = *reinterpret_cast<CopyBatch*>(raw);
  constexpr int kWords = sizeof(CopyBatch) / sizeof(uint4);
  static_assert(sizeof(CopyBatch) % sizeof(uint4) == 0, "a batch is loaded in 16-byte words");
  for (uint32_t i = 0; i < slots; ++i) {
    const uint4* src = reinterpret_cast<const uint4*>(batches + i);
    for (int w = threadIdx.x; w < kWords; w += blockDim.x) raw[w] = __ldcv(src + w);
    __syncthreads();
    if (b.n > 0) copyRows(b);
    __syncthreads();  // every warp is done with this batch before the next is staged
  }
}

}  // namespace
}  // namespace fusco
