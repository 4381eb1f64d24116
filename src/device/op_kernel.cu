// The kernel of an enqueued operation (op_program.h): one launch runs the operation's steps, its
// waits inside it. Every block runs every step: thread 0 polls a wait's word (acquire, the abort
// word every kAbortEvery polls, %globaltimer against the timeout), the copies are shared by the
// grid as the deferred copy kernel shares them, and the last block to reach a barrier writes the
// posts after it.
#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "core/log.h"
#include "core/result.h"
#include "device/copy_rows.cuh"
#include "device/device_ops.h"
#include "device/kernel_grid.cuh"
#include "device/op_program.h"

namespace fusco {

namespace {

// A step, read past the caches: the block is pinned memory the host rewrites for every operation
// that reuses it.
__device__ op::Step loadStep(const char* block, uint32_t i) {
  const uint4* at = reinterpret_cast<const uint4*>(op::stepsOf(const_cast<char*>(block)) + i);
  const uint4 lo = __ldcv(at), hi = __ldcv(at + 1);
  op::Step s;
  memcpy(&s, &lo, sizeof(lo));
  memcpy(reinterpret_cast<char*>(&s) + sizeof(lo), &hi, sizeof(hi));
  return s;
}

// A wait step: thread 0 polls; a wait that gives up marks the operation failed.
__device__ void waitStep(op::Header* h, const op::Step& s, int* gaveUp) {
  if (threadIdx.x == 0) {
    auto* words = reinterpret_cast<op::OpWords*>(__ldcv(&h->words));
    const uint64_t timeoutNs = __ldcv(&h->timeoutNs);
    op::Wait w{};
    op::WaitStatus r;
    do {
      r = op::pollStep(w, s, words, op::globalTimerNs(), timeoutNs);
    } while (r == op::kPending);
    if (r != op::kReady) {
      op::markFailed(h);
      *gaveUp = 1;
    }
  }
  __syncthreads();
}

// A barrier: once every block reached it (its earlier copies done), the last one runs the posts
// that follow; it resets the counter for the next launch of the block (a replay).
__device__ void barrierStep(op::Header* h, const op::Step& s, int* last) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    unsigned int* arrived = reinterpret_cast<unsigned int*>(&h->arrived[s.peer]);
    *last = atomicAdd(arrived, 1u) == gridDim.x - 1;
    if (*last) *reinterpret_cast<volatile unsigned int*>(arrived) = 0;
  }
  __syncthreads();
}

// A ring step (chan_roles.h): block 0's thread 0 steps every role until all finished, copying
// each slot's bytes itself; the grid's other threads go on.
__device__ void ringsStep(op::Header* h, const op::Step& s, int* gaveUp) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    char* table = reinterpret_cast<char*>(s.addr);
    const uint32_t n = reinterpret_cast<volatile chan::RoleTable*>(table)->count;
    auto* words = reinterpret_cast<op::OpWords*>(__ldcv(&h->words));
    const uint64_t timeoutNs = __ldcv(&h->timeoutNs);
    const auto copy = [](char* to, const char* from, uint64_t bytes, bool) {
      if (to != nullptr && from != nullptr) chan::copyBytes(to, from, bytes);
      return true;
    };
    chan::RolesState st;
    op::WaitStatus r;
    do {
      r = chan::stepRoles(chan::rolesOf(table), n, st, words, op::globalTimerNs(), timeoutNs, copy);
    } while (r == op::kPending);
    if (r != op::kReady) {
      op::markFailed(h);
      *gaveUp = 1;
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kCopyThreads)
    opKernel(char* block, uint32_t first, uint32_t count) {
  __shared__ uint4 raw[sizeof(CopyBatch) / sizeof(uint4)];
  __shared__ int gaveUp, last;
  op::Header* h = op::headerOf(block);
  if (threadIdx.x == 0) gaveUp = op::loadWord(&h->failed) != 0;
  __syncthreads();
  for (uint32_t i = first; i < first + count; ++i) {
    const op::Step s = loadStep(block, i);
    if (s.kind == op::kStepBarrier)
      barrierStep(h, s, &last);
    else if (s.kind == op::kStepPost && threadIdx.x == 0 && last != 0)
      op::postStep(h, s);
    else if (s.kind == op::kStepWait && gaveUp == 0)
      waitStep(h, s, &gaveUp);
    else if (s.kind == op::kStepCopy && gaveUp == 0)
      copyBatches(reinterpret_cast<const CopyBatch*>(s.addr), s.value, raw);
    else if (s.kind == op::kStepRings && gaveUp == 0)
      ringsStep(h, s, &gaveUp);
  }
}

KernelGeometry gOp{"opKernel"};

}  // namespace

fuscoResult_t deviceLaunchOp(char* block, uint32_t first, uint32_t count, void* stream) {
  if (count == 0) return fuscoSuccess;
  FUSCO_CHECK(checkLoaded(gOp));
  opKernel<<<gridFor(UINT32_MAX, gOp.perSm), kCopyThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      block, first, count);
  return launchResult("launching an operation's kernel");
}

fuscoResult_t loadOpKernel(KernelLoader& l) { return l.load(opKernel, kCopyThreads, &gOp); }

}  // namespace fusco
