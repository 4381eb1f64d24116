// Kernels of moe_perf's unfused CUDA pipeline (moe_kernels.h): the baseline, not the library.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "moe_kernels.h"

namespace fusco {
namespace perf {

namespace {

constexpr int kWarpsPerBlock = 8;      // row copies: one warp per row, 8 rows per block
constexpr size_t kMaxGrid = 1u << 20;  // grid-stride beyond this many blocks

unsigned gridFor(size_t items, size_t perBlock) {
  size_t g = (items + perBlock - 1) / perBlock;
  return static_cast<unsigned>(g < 1 ? 1 : g > kMaxGrid ? kMaxGrid : g);
}

// The widest unit (16, 4 or 1 bytes) that divides the row size and both base addresses.
int unitFor(const void* a, const void* b, size_t rowBytes) {
  const uintptr_t m = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) | rowBytes;
  return m % 16 == 0 ? 16 : m % 4 == 0 ? 4 : 1;
}

// One warp copies one row of `units` V's; four loads in flight per lane before their stores.
template <typename V>
__device__ __forceinline__ void copyRowWarp(const char* __restrict__ src, char* __restrict__ dst,
                                            size_t units, unsigned lane) {
  const V* s = reinterpret_cast<const V*>(src);
  V* d = reinterpret_cast<V*>(dst);
  size_t i = lane;
  for (; i + 96 < units; i += 128) {
    const V a = s[i], b = s[i + 32], c = s[i + 64], e = s[i + 96];
    d[i] = a;
    d[i + 32] = b;
    d[i + 64] = c;
    d[i + 96] = e;
  }
  for (; i < units; i += 32) d[i] = s[i];
}

template <typename V>
__global__ void gatherRowsKernel(const char* __restrict__ src, char* __restrict__ dst,
                                 const int64_t* __restrict__ srcRow, size_t nrows,
                                 size_t rowBytes) {
  const size_t units = rowBytes / sizeof(V);
  const size_t stride = static_cast<size_t>(gridDim.x) * kWarpsPerBlock;
  for (size_t r = static_cast<size_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; r < nrows;
       r += stride)
    copyRowWarp<V>(src + static_cast<size_t>(srcRow[r]) * rowBytes, dst + r * rowBytes, units,
                   threadIdx.x % 32);
}

// The chunk c holding expert-major row r: the last c with emStart[c] <= r (empty chunks share
// their start with the next one, so the last of them is the one that holds rows).
__device__ __forceinline__ int chunkOf(const int64_t* __restrict__ emStart, int nchunks,
                                       int64_t r) {
  int lo = 0, hi = nchunks;  // emStart[lo] <= r < emStart[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (emStart[mid] <= r)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

template <typename V>
__global__ void sortChunksKernel(const char* __restrict__ src, char* __restrict__ dst,
                                 const int64_t* __restrict__ emStart,
                                 const int64_t* __restrict__ smStart, int nchunks, size_t nrows,
                                 size_t rowBytes, bool unsort) {
  const size_t units = rowBytes / sizeof(V);
  const size_t stride = static_cast<size_t>(gridDim.x) * kWarpsPerBlock;
  for (size_t r = static_cast<size_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; r < nrows;
       r += stride) {
    const int c = chunkOf(emStart, nchunks, static_cast<int64_t>(r));
    const size_t sm = static_cast<size_t>(smStart[c] + (static_cast<int64_t>(r) - emStart[c]));
    const size_t from = unsort ? r : sm, to = unsort ? sm : r;
    copyRowWarp<V>(src + from * rowBytes, dst + to * rowBytes, units, threadIdx.x % 32);
  }
}

template <typename T>
__device__ __forceinline__ float toFloat(T v);
template <>
__device__ __forceinline__ float toFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float toFloat<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float toFloat<__half>(__half v) {
  return __half2float(v);
}

template <typename T>
__device__ __forceinline__ T fromFloat(float f);
template <>
__device__ __forceinline__ float fromFloat<float>(float f) {
  return f;
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float f) {
  return __float2bfloat16_rn(f);
}
template <>
__device__ __forceinline__ __half fromFloat<__half>(float f) {
  return __float2half_rn(f);
}

// N elements of T moved as one load / store (16 bytes in the vector case).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// One block per token: its slots and weights go to shared memory, then each thread sums whole
// packs over the token's valid slots in k order.
template <typename T, int N>
__global__ void unpermuteSumKernel(const char* __restrict__ rows,
                                   const int64_t* __restrict__ slotPos,
                                   const float* __restrict__ weights, size_t tokens, int topk,
                                   size_t rowBytes, size_t packs, char* __restrict__ out) {
  extern __shared__ int64_t smem[];  // [topk] slots (-1: unused), then [topk] weights
  int64_t* pos = smem;
  float* w = reinterpret_cast<float*>(smem + topk);
  using P = Pack<T, N>;
  for (size_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    __syncthreads();  // every thread is done with the previous token's slots
    for (int k = threadIdx.x; k < topk; k += blockDim.x) {
      pos[k] = slotPos[t * topk + k];
      w[k] = weights != nullptr ? weights[t * topk + k] : 1.0f;
    }
    __syncthreads();
    P* o = reinterpret_cast<P*>(out + t * rowBytes);
    for (size_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float acc[N];
#pragma unroll
      for (int i = 0; i < N; ++i) acc[i] = 0.0f;
      for (int k = 0; k < topk; ++k) {
        if (pos[k] < 0) continue;
        const P x = reinterpret_cast<const P*>(rows + static_cast<size_t>(pos[k]) * rowBytes)[p];
#pragma unroll
        for (int i = 0; i < N; ++i) acc[i] = __fadd_rn(acc[i], __fmul_rn(w[k], toFloat(x.v[i])));
      }
      P y;
#pragma unroll
      for (int i = 0; i < N; ++i) y.v[i] = fromFloat<T>(acc[i]);
      o[p] = y;
    }
  }
}

template <typename T>
cudaError_t unpermuteAs(const void* rows, const int64_t* slotPos, const float* weights,
                        size_t tokens, int topk, size_t hidden, void* out, cudaStream_t s) {
  const size_t rowBytes = hidden * sizeof(T);
  const bool vec = unitFor(rows, out, rowBytes) == 16;
  constexpr int kVec = 16 / sizeof(T);
  const size_t packs = vec ? rowBytes / 16 : hidden;
  const unsigned threads = static_cast<unsigned>(packs >= 256 ? 256 : (packs + 31) / 32 * 32);
  const size_t shm = static_cast<size_t>(topk) * (sizeof(int64_t) + sizeof(float));
  const unsigned grid = gridFor(tokens, 1);
  const char* r = static_cast<const char*>(rows);
  char* o = static_cast<char*>(out);
  if (vec)
    unpermuteSumKernel<T, kVec>
        <<<grid, threads, shm, s>>>(r, slotPos, weights, tokens, topk, rowBytes, packs, o);
  else
    unpermuteSumKernel<T, 1>
        <<<grid, threads, shm, s>>>(r, slotPos, weights, tokens, topk, rowBytes, packs, o);
  return cudaGetLastError();
}

}  // namespace

int launchGatherRows(const void* src, void* dst, const int64_t* srcRow, size_t nrows,
                     size_t rowBytes, void* stream) {
  if (nrows == 0 || rowBytes == 0) return cudaSuccess;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned grid = gridFor(nrows, kWarpsPerBlock);
  const char* a = static_cast<const char*>(src);
  char* b = static_cast<char*>(dst);
  switch (unitFor(src, dst, rowBytes)) {
    case 16:
      gatherRowsKernel<uint4><<<grid, kWarpsPerBlock * 32, 0, s>>>(a, b, srcRow, nrows, rowBytes);
      break;
    case 4:
      gatherRowsKernel<uint32_t>
          <<<grid, kWarpsPerBlock * 32, 0, s>>>(a, b, srcRow, nrows, rowBytes);
      break;
    default:
      gatherRowsKernel<uint8_t><<<grid, kWarpsPerBlock * 32, 0, s>>>(a, b, srcRow, nrows, rowBytes);
  }
  return cudaGetLastError();
}

int launchSortChunks(const void* src, void* dst, const int64_t* emStart, const int64_t* smStart,
                     int nchunks, size_t nrows, size_t rowBytes, bool unsort, void* stream) {
  if (nrows == 0 || rowBytes == 0) return cudaSuccess;
  if (nchunks < 1) return cudaErrorInvalidValue;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned grid = gridFor(nrows, kWarpsPerBlock);
  const char* a = static_cast<const char*>(src);
  char* b = static_cast<char*>(dst);
  switch (unitFor(src, dst, rowBytes)) {
    case 16:
      sortChunksKernel<uint4><<<grid, kWarpsPerBlock * 32, 0, s>>>(a, b, emStart, smStart, nchunks,
                                                                   nrows, rowBytes, unsort);
      break;
    case 4:
      sortChunksKernel<uint32_t><<<grid, kWarpsPerBlock * 32, 0, s>>>(
          a, b, emStart, smStart, nchunks, nrows, rowBytes, unsort);
      break;
    default:
      sortChunksKernel<uint8_t><<<grid, kWarpsPerBlock * 32, 0, s>>>(
          a, b, emStart, smStart, nchunks, nrows, rowBytes, unsort);
  }
  return cudaGetLastError();
}

int launchUnpermuteSum(const void* rows, const int64_t* slotPos, const float* weights,
                       size_t tokens, int topk, fuscoDataType_t dt, size_t hidden, void* out,
                       void* stream) {
  if (tokens == 0 || hidden == 0) return cudaSuccess;
  if (topk < 1) return cudaErrorInvalidValue;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dt) {
    case fuscoBfloat16:
      return unpermuteAs<__nv_bfloat16>(rows, slotPos, weights, tokens, topk, hidden, out, s);
    case fuscoFloat16:
      return unpermuteAs<__half>(rows, slotPos, weights, tokens, topk, hidden, out, s);
    case fuscoFloat32:
      return unpermuteAs<float>(rows, slotPos, weights, tokens, topk, hidden, out, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace perf
}  // namespace fusco
