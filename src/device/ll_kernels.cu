// The low-latency kernels (ll_ops.h): one cooperative kernel per call runs the phases it is given
// (a dispatch's send and receive halves, or one of them with a receive hook), grid-stride over
// their units: an expert per block to send, a local expert per block to receive and pack, a local
// expert per block to send combine rows back, a token per block to sum. The steps and the order
// of every row are ll_twin.cc's; the positions come from block scans in token order, so the
// bytes never depend on timing. Waits spin on words peers write, bounded by the timeout and by
// the host's release word.
#include <cuda_runtime.h>

#include <algorithm>
#include <cub/block/block_scan.cuh>

#include "core/cuda_check.h"
#include "core/result.h"
#include "device/kernel_grid.cuh"
#include "device/ll_ops.h"

namespace fusco {
namespace ll {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr uint32_t kMaxRanks = 1024;
using Scan = cub::BlockScan<uint32_t, kThreads>;

struct Shared {
  typename Scan::TempStorage scan;
  uint32_t list[kThreads];
  uint32_t cnt[kMaxRanks], off[kMaxRanks];
  uint32_t total, last, post;
  uint8_t order[kMaxTopk], closes[kMaxTopk];
  const uint16_t* rows[kMaxTopk];
  float w[kMaxTopk];
};

__device__ __forceinline__ uint64_t globalNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Spins until *w >= want; false when the host released the waits or the timeout passed.
__device__ bool waitWord(const Args& a, Phase ph, const uint64_t* w, uint64_t want, uint32_t peer) {
  const uint64_t start = globalNs();
  for (uint32_t spins = 0; loadAcquire(w) < want; ++spins) {
    if ((spins & 255) != 255) continue;
    if (*reinterpret_cast<volatile uint32_t*>(&a.host->release) != 0) return false;
    if (globalNs() - start > a.timeoutNs) {
      // The phase before the peer (the host reads them in the other order), then every other
      // wait of this rank gives up at once.
      *reinterpret_cast<volatile uint32_t*>(&a.host->phase) = ph;
      __threadfence_system();
      *reinterpret_cast<volatile uint32_t*>(&a.host->timedOut) = peer + 1;
      *reinterpret_cast<volatile uint32_t*>(&a.host->release) = 1;
      return false;
    }
  }
  return true;
}

// A wait of phase p gave up in this block: the phase tells no peer it is done.
__device__ void noteFailed(const Args& a, Phase p) {
  if (threadIdx.x == 0) atomicOr(&stateOf(a)->failed[p][a.half], 1u);
}

__device__ uint64_t* wordAt(char* half, uint64_t region, uint64_t index) {
  return reinterpret_cast<uint64_t*>(half + region) + index;
}

// Every thread waits for some ranks' word[r] >= want; true on every thread when all arrived.
__device__ bool waitAllRanks(const Args& a, Phase ph, uint64_t region, uint64_t want) {
  int ok = 1;
  for (uint32_t r = threadIdx.x; r < a.d.ranks; r += kThreads)
    ok &= waitWord(a, ph, wordAt(ownHalf(a), region, r), want, r) ? 1 : 0;
  if (__syncthreads_and(ok) != 0) return true;
  noteFailed(a, ph);
  return false;
}

// One warp copies bytes (16 at a time when both ends and the length allow).
__device__ void warpCopy(char* dst, const char* src, uint64_t bytes) {
  const uint32_t lane = threadIdx.x & 31;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | bytes) & 15) == 0) {
    for (uint64_t v = lane; v < bytes / 16; v += 32)
      reinterpret_cast<uint4*>(dst)[v] = reinterpret_cast<const uint4*>(src)[v];
    return;
  }
  for (uint64_t b = lane; b < bytes; b += 32) dst[b] = src[b];
}

// One warp quantizes token row src into e4m3 bytes and scales (four channels per lane).
__device__ void warpQuantize(const Args& a, const uint16_t* src, char* row, float* scales) {
  const uint32_t lane = threadIdx.x & 31;
  for (uint64_t g = 0; g < a.l.groups; ++g) {
    float v[4], amax = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      v[c] = bf16Value(src[g * kGroup + lane * 4 + c]);
      amax = amaxWith(amax, v[c]);
    }
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, s));
    const float scale = groupScale(amax);
    uint32_t q = 0;
#pragma unroll
    for (int c = 0; c < 4; ++c)
      q |= static_cast<uint32_t>(floatToE4m3(divRn(v[c], scale))) << (8 * c);
    reinterpret_cast<uint32_t*>(row + g * kGroup)[lane] = q;
    if (lane == 0) scales[g] = scale;
  }
}

// Slot i = t * topk + k of this rank's routing into slot `at` of a destination half.
__device__ void sendRow(const Args& a, char* half, uint64_t at, uint32_t i) {
  const uint32_t t = i / a.topk, k = i % a.topk;
  const uint16_t* src = a.x + static_cast<uint64_t>(t) * a.d.hidden;
  char* row = half + a.l.dispRows + at * a.l.rowStride;
  if (a.fp8)
    warpQuantize(a, src, row, reinterpret_cast<float*>(half + a.l.dispScales) + at * a.l.groups);
  else
    warpCopy(row, reinterpret_cast<const char*>(src), static_cast<uint64_t>(a.d.hidden) * 2);
  if ((threadIdx.x & 31) == 0)
    reinterpret_cast<int32_t*>(half + a.l.dispSlot)[at] = static_cast<int32_t>(t * a.d.maxTopk + k);
}

// Expert e: this rank's slots that chose it, in slot order, into its rank's receive slots.
__device__ void dispatchSendUnit(const Args& a, Shared& sh, uint32_t e, uint64_t epoch) {
  const uint32_t dst = e / a.d.local, le = e % a.d.local;
  const uint32_t n = a.numTokens * a.topk, warp = threadIdx.x / 32;
  if (e == 0)
    for (uint32_t i = threadIdx.x; i < n; i += kThreads)
      if (badSlot(a.topkIdx + (i - i % a.topk), i % a.topk, a.numExperts))
        atomicMin(&stateOf(a)->badCode, (i / a.topk) << 8 | (i % a.topk));
  const int ok = threadIdx.x != 0 ||
                 waitWord(a, kDispatchSend, wordAt(ownHalf(a), a.l.dispFreed, dst), epoch, dst);
  if (!__syncthreads_and(ok)) {
    noteFailed(a, kDispatchSend);
    return;
  }
  char* half = halfOf(a, a.peers[dst]);
  uint32_t pos = 0;
  for (uint32_t base = 0; base < n; base += kThreads) {
    const uint32_t i = base + threadIdx.x;
    const int64_t* ids = a.topkIdx + (i - i % a.topk);
    const bool in = i < n && ids[i % a.topk] == static_cast<int64_t>(e) &&
                    movesSlot(ids, i % a.topk, a.numExperts);
    uint32_t m = in ? 1u : 0u, off = 0, total = 0;
    Scan(sh.scan).ExclusiveSum(m, off, total);
    if (m) sh.list[off] = i;
    __syncthreads();
    for (uint32_t j = warp; j < total; j += kWarps)
      sendRow(a, half, dispIndex(a.d, le, a.rank, pos + j), sh.list[j]);
    pos += total;
    __syncthreads();
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0)
    storeRelease(wordAt(half, a.l.dispCount, static_cast<uint64_t>(le) * a.d.ranks + a.rank),
                 (epoch + 1) << 32 | pos);
}

// Packed row g of local expert le: its source (binary search over the offsets) and its copy.
__device__ void packRow(const Args& a, const Shared& sh, char* half, uint32_t le, uint32_t g) {
  uint32_t lo = 0, hi = a.d.ranks;
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    (sh.off[mid] <= g ? lo : hi) = mid;
  }
  const uint64_t from = dispIndex(a.d, le, lo, g - sh.off[lo]);
  const uint64_t to = le * packRows(a.d) + g, rowBytes = packedRowBytes(a);
  warpCopy(half + a.l.packX + to * rowBytes, half + a.l.dispRows + from * a.l.rowStride, rowBytes);
  const uint32_t lane = threadIdx.x & 31;
  if (a.fp8)
    for (uint64_t s = lane; s < a.l.groups; s += 32)
      reinterpret_cast<float*>(half + a.l.packScales)[to * a.l.groups + s] =
          reinterpret_cast<const float*>(half + a.l.dispScales)[from * a.l.groups + s];
  if (lane != 0) return;
  const int32_t slot = reinterpret_cast<const int32_t*>(half + a.l.dispSlot)[from];
  reinterpret_cast<int32_t*>(half + a.l.packSlot)[to] = slot;
  reinterpret_cast<int32_t*>(half + a.l.packRank)[to] = static_cast<int32_t>(lo);
  reinterpret_cast<int32_t*>(half + a.l.packToken)[to] = slot / static_cast<int32_t>(a.d.maxTopk);
}

// Local expert le: wait for every source's count, then pack its rows by source.
__device__ void dispatchRecvUnit(const Args& a, Shared& sh, uint32_t le, uint64_t epoch) {
  char* half = ownHalf(a);
  int ok = 1;
  for (uint32_t r = threadIdx.x; r < a.d.ranks; r += kThreads) {
    const uint64_t* c = wordAt(half, a.l.dispCount, static_cast<uint64_t>(le) * a.d.ranks + r);
    ok &= waitWord(a, kDispatchRecv, c, (epoch + 1) << 32, r) ? 1 : 0;
    sh.cnt[r] = min(static_cast<uint32_t>(loadAcquire(c) & 0xffffffffu), a.d.maxTokens);
  }
  if (!__syncthreads_and(ok)) {
    noteFailed(a, kDispatchRecv);
    return;
  }
  if (threadIdx.x == 0) {
    uint32_t sum = 0;
    for (uint32_t r = 0; r < a.d.ranks; ++r) {
      sh.off[r] = sum;
      sum += sh.cnt[r];
    }
    sh.total = sum;
    reinterpret_cast<int32_t*>(half + a.l.recvCount)[le] = static_cast<int32_t>(sum);
  }
  __syncthreads();
  for (uint32_t r = threadIdx.x; r < a.d.ranks; r += kThreads)
    reinterpret_cast<int64_t*>(half + a.l.recvLayout)[le * a.d.ranks + r] =
        static_cast<int64_t>(static_cast<uint64_t>(sh.off[r]) << 32 | sh.cnt[r]);
  for (uint32_t g = threadIdx.x / 32; g < sh.total; g += kWarps) packRow(a, sh, half, le, g);
  __syncthreads();
}

// Local expert le: each of its rows back to the (token, slot) of its source.
__device__ void combineSendUnit(const Args& a, uint32_t le, uint64_t epoch) {
  if (!waitAllRanks(a, kCombineSend, a.l.combFreed, epoch)) return;
  const char* half = ownHalf(a);
  const int32_t n = reinterpret_cast<const int32_t*>(half + a.l.recvCount)[le];
  const uint64_t rowBytes = static_cast<uint64_t>(a.d.hidden) * 2;
  for (int32_t g = threadIdx.x / 32; g < n; g += kWarps) {
    const uint64_t at = le * packRows(a.d) + static_cast<uint64_t>(g);
    const int32_t r = reinterpret_cast<const int32_t*>(half + a.l.packRank)[at];
    const int32_t slot = reinterpret_cast<const int32_t*>(half + a.l.packSlot)[at];
    char* dst = halfOf(a, a.peers[r]) + a.l.combRows + static_cast<uint64_t>(slot) * a.l.rowStride;
    warpCopy(dst, reinterpret_cast<const char*>(a.expertOut + at * a.d.hidden), rowBytes);
  }
}

// Token t: its rows summed in the fixed tree's order.
__device__ void combineRecvUnit(const Args& a, Shared& sh, uint32_t t, uint64_t epoch) {
  if (!waitAllRanks(a, kCombineRecv, a.l.combFlag, epoch + 1)) return;
  const int64_t* ids = a.topkIdx + static_cast<uint64_t>(t) * a.topk;
  if (threadIdx.x == 0) {
    sh.total = termOrder(ids, a.topk, a.numExperts, a.d.local, sh.order, sh.closes);
    for (uint32_t i = 0; i < sh.total; ++i) {
      const uint64_t slot = static_cast<uint64_t>(t) * a.d.maxTopk + sh.order[i];
      sh.rows[i] =
          reinterpret_cast<const uint16_t*>(ownHalf(a) + a.l.combRows + slot * a.l.rowStride);
      if (a.weights != nullptr)
        sh.w[i] = a.weights[static_cast<uint64_t>(t) * a.topk + sh.order[i]];
    }
  }
  __syncthreads();
  uint16_t* out = a.out + static_cast<uint64_t>(t) * a.d.hidden;
  for (uint64_t j = threadIdx.x; j < a.d.hidden; j += kThreads)
    out[j] = combineElement(sh.rows, a.weights != nullptr ? sh.w : nullptr, sh.closes, sh.total, j);
  __syncthreads();
}

__device__ uint32_t unitsOf(const Args& a, uint32_t p) {
  return p == kDispatchSend ? a.numExperts : p == kCombineRecv ? a.numTokens : a.d.local;
}

// The last block of a phase: this rank's state for the next use of the half first, then what
// the phase tells every rank (nothing when one of its waits gave up).
__device__ void lastOfPhase(const Args& a, Shared& sh, uint32_t p, uint64_t epoch) {
  State* st = stateOf(a);
  if (threadIdx.x == 0) {
    sh.post = atomicExch(&st->failed[p][a.half], 0u) == 0 ? 1u : 0u;
    const uint32_t bad = p == kDispatchSend ? atomicExch(&st->badCode, kNoBad) : kNoBad;
    if (bad != kNoBad) *reinterpret_cast<volatile uint32_t*>(&a.host->bad) = bad + 1;
    st->done[p][a.half] = 0;
    st->epoch[p][a.half] = epoch + 1;
    __threadfence();
  }
  __syncthreads();
  const uint64_t region = p == kDispatchRecv  ? a.l.dispFreed
                          : p == kCombineSend ? a.l.combFlag
                                              : a.l.combFreed;
  if (p != kDispatchSend && sh.post)
    for (uint32_t r = threadIdx.x; r < a.d.ranks; r += kThreads)
      storeRelease(wordAt(halfOf(a, a.peers[r]), region, a.rank), epoch + 1);
}

__device__ void finishPhase(const Args& a, Shared& sh, uint32_t p, uint64_t epoch) {
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0)
    sh.last = atomicAdd(&stateOf(a)->done[p][a.half], 1u) == gridDim.x - 1 ? 1u : 0u;
  __syncthreads();
  if (sh.last) {
    __threadfence();
    lastOfPhase(a, sh, p, epoch);
  }
}

__global__ void __launch_bounds__(kThreads)
    llKernel(const __grid_constant__ Args a, uint32_t phases) {
  __shared__ Shared sh;
  for (uint32_t p = 0; p < kPhases; ++p) {
    if (!(phases & (1u << p))) continue;
    const uint64_t epoch = *reinterpret_cast<volatile uint64_t*>(&stateOf(a)->epoch[p][a.half]);
    for (uint32_t u = blockIdx.x; u < unitsOf(a, p); u += gridDim.x) {
      if (p == kDispatchSend) dispatchSendUnit(a, sh, u, epoch);
      if (p == kDispatchRecv) dispatchRecvUnit(a, sh, u, epoch);
      if (p == kCombineSend) combineSendUnit(a, u, epoch);
      if (p == kCombineRecv) combineRecvUnit(a, sh, u, epoch);
    }
    finishPhase(a, sh, p, epoch);
  }
}

KernelGeometry gLl{"llKernel"};

uint64_t unitsFor(const Args& a, uint32_t phases) {
  uint64_t units = 1;
  for (uint32_t p = 0; p < kPhases; ++p)
    if (phases & (1u << p))
      units = std::max<uint64_t>(units, p == kDispatchSend  ? a.numExperts
                                        : p == kCombineRecv ? a.numTokens
                                                            : a.d.local);
  return units;
}

}  // namespace

fuscoResult_t deviceRun(const Args& a, uint32_t phases, void* stream) {
  if (a.d.ranks > kMaxRanks)
    return FUSCO_FAIL(fuscoInvalidUsage, kEngine, "low-latency kernels support %u ranks, not %u",
                      kMaxRanks, a.d.ranks);
  FUSCO_CHECK(checkLoaded(gLl));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(gridFor(unitsFor(a, phases), gLl.perSm));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = static_cast<cudaStream_t>(stream);
  // A send and a receive phase in one kernel: receiving blocks wait for sending ones, so all must
  // be resident at once (the launch fails rather than hangs when they cannot be).
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = (phases & (phases - 1)) != 0 ? 1 : 0;
  FUSCO_CUDACHECK(cudaLaunchKernelEx(&cfg, llKernel, a, phases), kEngine);
  return fuscoSuccess;
}

}  // namespace ll

fuscoResult_t loadLlKernels(KernelLoader& l) {
  return l.load(ll::llKernel, ll::kThreads, &ll::gLl);
}

}  // namespace fusco
