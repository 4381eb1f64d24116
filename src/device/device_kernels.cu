// The CUDA path's kernels (device_ops.h). Memory-bound copies and sums: 16-byte accesses
// wherever the rows allow them, several loads in flight per thread before the first store, one
// warp per copied row (one block per summed row), and a persistent grid of the blocks that are
// resident at once, capped at FUSCO_CUDA_SMS multiprocessors so communication leaves the rest of
// the GPU to compute.
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "core/cuda_check.h"
#include "core/log.h"
#include "core/result.h"
#include "device/copy_rows.cuh"
#include "device/device_ops.h"
#include "device/kernel_grid.cuh"
#include "device/reduce_math.h"

namespace fusco {

namespace {

constexpr int kSumThreads = 128;  // one summed token per block

__global__ void __launch_bounds__(kCopyThreads) copyKernel(const __grid_constant__ CopyBatch b) {
  copyRows(b);
}

// Element access by datatype: V elements per access (16 bytes when aligned, else 1).
template <int kDt>
struct Elem;
template <>
struct Elem<fuscoFloat32> {
  static __device__ __forceinline__ float load(const char* row, uint64_t j) {
    return reinterpret_cast<const float*>(row)[j];
  }
  static __device__ __forceinline__ void store(char* row, uint64_t j, float v) {
    reinterpret_cast<float*>(row)[j] = v;
  }
  static constexpr int kSize = 4;
};
template <>
struct Elem<fuscoBfloat16> {
  static __device__ __forceinline__ float load(const char* row, uint64_t j) {
    return asFloat(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[j]) << 16);
  }
  static __device__ __forceinline__ void store(char* row, uint64_t j, float v) {
    reinterpret_cast<uint16_t*>(row)[j] = floatToBf16Inline(v);
  }
  static constexpr int kSize = 2;
};
template <>
struct Elem<fuscoFloat16> {
  static __device__ __forceinline__ float load(const char* row, uint64_t j) {
    return halfToFloatInline(reinterpret_cast<const uint16_t*>(row)[j]);
  }
  static __device__ __forceinline__ void store(char* row, uint64_t j, float v) {
    reinterpret_cast<uint16_t*>(row)[j] = floatToHalfInline(v);
  }
  static constexpr int kSize = 2;
};

// Stores V consecutive elements at element index j (j a multiple of V when V > 1: one 16-byte
// access; loads go through Lane below).
template <int kDt, int V>
__device__ __forceinline__ void storeVec(char* row, uint64_t j, const float* in) {
  using E = Elem<kDt>;
  if constexpr (V == 1) {
    E::store(row, j, in[0]);
  } else {
    uint4 raw;
    char* p = reinterpret_cast<char*>(&raw);
#pragma unroll
    for (int v = 0; v < V; ++v) E::store(p, v, in[v]);
    *reinterpret_cast<uint4*>(row + j * E::kSize) = raw;
  }
}

// Round to the datatype and back: what a level of the tree hands to the next one.
template <int kDt>
__device__ __forceinline__ float roundTrip(float x) {
  if constexpr (kDt == fuscoFloat32)
    return x;
  else if constexpr (kDt == fuscoBfloat16)
    return asFloat(static_cast<uint32_t>(floatToBf16Inline(x)) << 16);
  else
    return halfToFloatInline(floatToHalfInline(x));
}

// The combine sum: one block per token. The block first stages its terms' row addresses and
// weights in shared memory (one round of index loads instead of a dependent chain per term), then
// each thread loads U vectors of C terms before the first add, so many loads are in flight. Terms
// are added in their fixed order, so the bits do not depend on U or C.
constexpr int kSumU = 2, kSumC = 4;
constexpr int kTermsShared =
    64;  // terms staged in shared memory (later ones read their index directly)

// One vector of a row: 16 bytes (V elements) when aligned, else one element, kept raw until used.
template <int kDt, int V>
struct Lane {
  using Raw = typename std::conditional<(V > 1), uint4, float>::type;
  static __device__ __forceinline__ Raw load(const char* row, uint64_t j) {
    if constexpr (V > 1)
      return reinterpret_cast<const uint4*>(row)[j];
    else
      return Elem<kDt>::load(row, j);
  }
  static __device__ __forceinline__ float get(const Raw& r, int v) {
    if constexpr (V > 1)
      return Elem<kDt>::load(reinterpret_cast<const char*>(&r), v);
    else
      return r;
  }
};

// A term of a sum: its row, its weight (unweighted when `plain`), whether it closes its group.
struct Term {
  const char* row;
  float w;
  bool plain;
  bool last;
};

// Vectors j0 + u * blockDim.x (u < U) of one token: every group's terms summed in fp32 in order
// and rounded to the datatype when the group closes, the groups summed in order into acc.
template <int kDt, int V, typename TermOf>
__device__ __forceinline__ void sumTerms(int nt, uint64_t j0, uint64_t nvec, TermOf term,
                                         float (&acc)[kSumU][V]) {
  using L = Lane<kDt, V>;
  float grp[kSumU][V];
#pragma unroll
  for (int u = 0; u < kSumU; ++u)
#pragma unroll
    for (int v = 0; v < V; ++v) acc[u][v] = grp[u][v] = 0.0f;
  for (int k0 = 0; k0 < nt; k0 += kSumC) {
    typename L::Raw x[kSumC][kSumU];
    Term tc[kSumC];
#pragma unroll
    for (int c = 0; c < kSumC; ++c) {
      if (k0 + c >= nt) continue;
      tc[c] = term(k0 + c);
#pragma unroll
      for (int u = 0; u < kSumU; ++u) {
        const uint64_t j = j0 + static_cast<uint64_t>(u) * blockDim.x;
        if (j < nvec) x[c][u] = L::load(tc[c].row, j);
      }
    }
#pragma unroll
    for (int c = 0; c < kSumC; ++c) {
      if (k0 + c >= nt) continue;
#pragma unroll
      for (int u = 0; u < kSumU; ++u)
#pragma unroll
        for (int v = 0; v < V; ++v) {
          const float xv = L::get(x[c][u], v);
          grp[u][v] = __fadd_rn(grp[u][v], tc[c].plain ? xv : __fmul_rn(tc[c].w, xv));
        }
      if (tc[c].last) {
#pragma unroll
        for (int u = 0; u < kSumU; ++u)
#pragma unroll
          for (int v = 0; v < V; ++v) {
            acc[u][v] = __fadd_rn(acc[u][v], roundTrip<kDt>(grp[u][v]));
            grp[u][v] = 0.0f;
          }
      }
    }
  }
}

template <int kDt, int V>
__global__ void __launch_bounds__(kSumThreads)
    finalSumKernel(const __grid_constant__ DevFinalSum f, uint64_t hidden, uint32_t gateWant) {
  __shared__ Term staged[kTermsShared];
  // The bases' word (DevFinalSum): 0, never resolved (nothing runs); 1, every base 16-byte
  // aligned; 2, not. gateWant: the word this variant needs (0: 1 or 2).
  const uint32_t w = __ldcv(f.basesAligned);
  if (w == 0 || (gateWant != 0 && w != gateWant)) return;
  const uint64_t rowBytes = hidden * Elem<kDt>::kSize;
  const uint64_t nvec = hidden / V;
  for (uint64_t t = blockIdx.x; t < f.ntokens; t += gridDim.x) {
    const uint32_t k0 = f.termStart[t];
    const int nt = static_cast<int>(f.termStart[t + 1] - k0);
    auto load = [&](int k) {
      const int64_t wi = f.termWeight[k0 + k];
      const bool plain = wi < 0 || f.weights == nullptr;
      const char* base = reinterpret_cast<const char*>(
          __ldcv(reinterpret_cast<const unsigned long long*>(f.bases) + f.termRank[k0 + k]));
      return Term{base + static_cast<uint64_t>(f.termRow[k0 + k]) * rowBytes,
                  plain ? 1.0f : f.weights[wi], plain, f.termLast[k0 + k] != 0};
    };
    __syncthreads();  // the previous token's staged terms are no longer read
    for (int k = threadIdx.x; k < nt && k < kTermsShared; k += blockDim.x) staged[k] = load(k);
    __syncthreads();
    auto term = [&](int k) { return k < kTermsShared ? staged[k] : load(k); };
    char* out = f.out + t * rowBytes;
    for (uint64_t j0 = threadIdx.x; j0 < nvec; j0 += static_cast<uint64_t>(blockDim.x) * kSumU) {
      float acc[kSumU][V];
      sumTerms<kDt, V>(nt, j0, nvec, term, acc);
#pragma unroll
      for (int u = 0; u < kSumU; ++u) {
        const uint64_t j = j0 + static_cast<uint64_t>(u) * blockDim.x;
        if (j < nvec) storeVec<kDt, V>(out, j * V, acc[u]);
      }
    }
  }
}

// Padding: range i is (first row, row count) at ranges[2i]; blockIdx.y walks the ranges and the
// x blocks share each range's bytes, so the work is spread whatever the number of ranges.
__global__ void zeroRangesKernel(char* base, uint64_t rowBytes, const int64_t* ranges, uint64_t n) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.y; i < n; i += gridDim.y) {
    char* r = base + static_cast<uint64_t>(ranges[2 * i]) * rowBytes;
    const uint64_t bytes = static_cast<uint64_t>(ranges[2 * i + 1]) * rowBytes;
    for (uint64_t j = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; j < bytes;
         j += stride)
      r[j] = 0;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Geometry of each kernel, cached by the device init (kernel_load.h).
KernelGeometry gCopy{"copyKernel"}, gZero{"zeroRangesKernel"};
template <int kDt>
struct SumGeometry {
  static KernelGeometry vec, one;
};
template <int kDt>
KernelGeometry SumGeometry<kDt>::vec{"finalSumKernel (vector)"};
template <int kDt>
KernelGeometry SumGeometry<kDt>::one{"finalSumKernel"};

template <int kDt>
constexpr int sumVec() {
  return 16 / Elem<kDt>::kSize;
}

template <int kDt>
fuscoResult_t loadSum(KernelLoader& l) {
  FUSCO_CHECK(l.load(finalSumKernel<kDt, sumVec<kDt>()>, kSumThreads, &SumGeometry<kDt>::vec));
  return l.load(finalSumKernel<kDt, 1>, kSumThreads, &SumGeometry<kDt>::one);
}

template <int kDt>
fuscoResult_t finalTyped(size_t hidden, const DevFinalSum& f, cudaStream_t s) {
  const bool shape = (hidden * Elem<kDt>::kSize) % 16 == 0 && aligned16(f.out);
  constexpr int V = sumVec<kDt>();
  const KernelGeometry &gv = SumGeometry<kDt>::vec, &g1 = SumGeometry<kDt>::one;
  FUSCO_CHECK(checkLoaded(gv));
  FUSCO_CHECK(checkLoaded(g1));
  // The bases' alignment is known on the device only: both variants are launched, one runs.
  if (shape)
    finalSumKernel<kDt, V><<<gridFor(f.ntokens, gv.perSm), kSumThreads, 0, s>>>(f, hidden, 1);
  finalSumKernel<kDt, 1>
      <<<gridFor(f.ntokens, g1.perSm), kSumThreads, 0, s>>>(f, hidden, shape ? 2 : 0);
  return launchResult("launching the combine sum kernel");
}

}  // namespace

namespace {

// Fills b from tasks[*at ...] (at most kBatch non-empty tasks); advances *at.
void fillBatch(const std::vector<DevCopyTask>& tasks, size_t* at, CopyBatch* b) {
  *b = CopyBatch{};
  for (; *at < tasks.size() && b->n < kBatch; ++*at) {
    DevCopyTask t = tasks[*at];
    if (!copyTaskMoves(t)) continue;
    // Row addresses are base + index * rowBytes: 16-byte accesses need aligned bases and rows
    // (or a single row at the base itself).
    const bool single = t.nrows == 1 && !t.srcRows && !t.dstRows && !t.fanStart;
    const bool v = aligned16(t.src) && aligned16(t.dst) && (t.rowBytes % 16 == 0 || single);
    b->vec |= static_cast<uint32_t>(v) << b->n;
    b->t[b->n] = t;
    b->rowStart[b->n + 1] = b->rowStart[b->n] + t.nrows;
    ++b->n;
  }
}

}  // namespace

fuscoResult_t deviceCopy(const std::vector<DevCopyTask>& tasks, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  size_t at = 0;
  while (at < tasks.size()) {
    CopyBatch b;
    fillBatch(tasks, &at, &b);
    if (b.n == 0) continue;
    FUSCO_CHECK(checkLoaded(gCopy));
    copyKernel<<<gridFor((b.rowStart[b.n] + 7) / 8, gCopy.perSm), kCopyThreads, 0, s>>>(b);
    FUSCO_CHECK(launchResult("launching the row copy kernel"));
  }
  return fuscoSuccess;
}

size_t deviceCopyBatchBytes() { return sizeof(CopyBatch); }

size_t deviceCopyBatchSlots(size_t ntasks) { return (ntasks + kBatch - 1) / kBatch; }

fuscoResult_t deviceFillCopyBatches(const std::vector<DevCopyTask>& tasks, void* block,
                                    size_t slots) {
  CopyBatch* out = static_cast<CopyBatch*>(block);
  size_t at = 0;
  for (size_t i = 0; i < slots; ++i) fillBatch(tasks, &at, &out[i]);
  return copyBatchesTookAll(tasks, at, slots);
}

fuscoResult_t deviceFinalSum(fuscoDataType_t dt, size_t hidden, const DevFinalSum& f,
                             void* stream) {
  if (f.ntokens == 0) return fuscoSuccess;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dt) {
    case fuscoFloat32:
      return finalTyped<fuscoFloat32>(hidden, f, s);
    case fuscoBfloat16:
      return finalTyped<fuscoBfloat16>(hidden, f, s);
    case fuscoFloat16:
      return finalTyped<fuscoFloat16>(hidden, f, s);
    default:
      return FUSCO_FAIL(fuscoInternalError, kEngine, "final sums of datatype %d",
                        static_cast<int>(dt));
  }
}

fuscoResult_t deviceZeroRowRanges(void* base, size_t rowBytes, const int64_t* ranges, size_t n,
                                  int64_t longest, void* stream) {
  if (n == 0 || longest <= 0) return fuscoSuccess;
  constexpr unsigned kThreads = 128;
  const uint64_t chunks = (static_cast<uint64_t>(longest) * rowBytes + kThreads - 1) / kThreads;
  FUSCO_CHECK(checkLoaded(gZero));
  const dim3 grid(gridFor(chunks, 4), static_cast<unsigned>(std::min<size_t>(n, 65535)));
  zeroRangesKernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<char*>(base), rowBytes, ranges, n);
  return launchResult("launching the padding kernel");
}

fuscoResult_t loadCopyKernels(KernelLoader& l) {
  FUSCO_CHECK(l.load(copyKernel, kCopyThreads, &gCopy));
  FUSCO_CHECK(l.load(zeroRangesKernel, 128, &gZero));
  FUSCO_CHECK(loadSum<fuscoFloat32>(l));
  FUSCO_CHECK(loadSum<fuscoBfloat16>(l));
  return loadSum<fuscoFloat16>(l);
}

}  // namespace fusco
