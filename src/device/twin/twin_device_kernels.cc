// The copy, sum and padding kernels of device_ops.h on the twin CUDA runtime (a build with
// FUSCO_TWIN_CUDA): each launch is one item on its stream that runs the kernels' host twin
// (hostCopyTask; reduce.h's sums, with the same bits) when the stream reaches it. Every range a
// kernel touches is checked by the twin: the ones known at launch with the launch, the ones read
// from memory the host fills later (deferred tasks, combine's bases) when the item runs.
#include <twin_cuda.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/datatype.h"
#include "core/result.h"
#include "device/device_ops.h"
#include "device/kernel_grid.cuh"
#include "device/op_program.h"
#include "device/reduce.h"

namespace fusco {

namespace {

constexpr size_t kBatch = kCopyBatchTasks;  // tasks per deferred batch
struct alignas(16) TwinBatch {
  uint64_t n;
  DevCopyTask t[kBatch];
};

// Kernel identities: the addresses the twin knows each kernel by.
const char kCopy = 0, kFinalSum = 0, kZeroRanges = 0, kOp = 0;

// Checks a range when the item runs (twincuda::checkAccess), naming the kernel.
CopyRangeCheck checkerFor(const char* kernel) {
  return [kernel](const void* p, uint64_t n, bool write) {
    return twincuda::checkAccess(p, n, write, kernel);
  };
}

fuscoResult_t launched(cudaError_t e, const char* what) {
  return e == cudaSuccess ? fuscoSuccess : FUSCO_CUDA_FAIL(e, kEngine, what);
}

void runTasks(const std::vector<DevCopyTask>& tasks) {
  const CopyRangeCheck check = checkerFor("copyKernel");
  for (const DevCopyTask& t : tasks)
    if (!hostCopyTask(t, nullptr, &check)) return;
}

void runDeferred(const TwinBatch* b, size_t slots) {
  const CopyRangeCheck check = checkerFor("opKernel");
  if (!twincuda::checkAccess(b, slots * sizeof(TwinBatch), false, "opKernel")) return;
  for (size_t i = 0; i < slots; ++i)
    for (uint64_t k = 0; k < b[i].n && k < kBatch; ++k)
      if (!hostCopyTask(b[i].t[k], nullptr, &check)) return;
}

// An operation's launch (op_program.h) as one block: its waits spin on this kernel's thread,
// yielding between polls, as the kernel's thread 0 spins on the GPU.
void runOp(char* block, uint32_t first, uint32_t count) {
  if (!twincuda::checkAccess(block, sizeof(op::Header) + (first + count) * sizeof(op::Step), false,
                             "opKernel"))
    return;
  op::RunState st;
  st.pc = first;
  const auto copy = [](const op::Step& s) {
    runDeferred(reinterpret_cast<const TwinBatch*>(s.addr), s.value);
  };
  // A ring role's bytes: the caller's rows are checked as a kernel's accesses are (the ring
  // slots lie in the channel areas mapped at init).
  const auto ringCopy = [](char* to, const char* from, uint64_t n, bool toUser) {
    const bool ok = toUser ? twincuda::checkAccess(to, n, true, "opKernel")
                           : twincuda::checkAccess(from, n, false, "opKernel");
    if (ok && to != nullptr && from != nullptr) std::memcpy(to, from, n);
    return ok;
  };
  while (!op::runSteps(block, first + count, st, static_cast<uint64_t>(nowNs()), copy, ringCopy))
    std::this_thread::yield();
}

// One token of the combine sum (device_ops.h, DevFinalSum): each rank's group of terms summed and
// rounded, then the groups summed in order, as weightedSumRows and sumRows do it.
bool sumToken(fuscoDataType_t dt, size_t hidden, const DevFinalSum& f, uint64_t t,
              const std::vector<const char*>& bases) {
  const size_t rowBytes = hidden * dataTypeSize(dt);
  std::vector<const void*> rows, groups;
  std::vector<float> weights;
  std::vector<std::vector<char>> partial;
  for (uint32_t k = f.termStart[t]; k < f.termStart[t + 1]; ++k) {
    const char* row = bases[f.termRank[k]] + static_cast<uint64_t>(f.termRow[k]) * rowBytes;
    if (!twincuda::checkAccess(row, rowBytes, false, "finalSumKernel")) return false;
    rows.push_back(row);
    const bool plain = f.termWeight[k] < 0 || f.weights == nullptr;
    weights.push_back(plain ? 1.0f : f.weights[f.termWeight[k]]);
    if (f.termLast[k] == 0) continue;
    partial.emplace_back(rowBytes);
    weightedSumRows(dt, hidden, rows.data(), weights.data(), rows.size(), partial.back().data());
    rows.clear();
    weights.clear();
  }
  for (const auto& p : partial) groups.push_back(p.data());
  char* out = f.out + t * rowBytes;
  if (!twincuda::checkAccess(out, rowBytes, true, "finalSumKernel")) return false;
  sumRows(dt, hidden, groups.data(), groups.size(), out);
  return true;
}

void runFinalSum(fuscoDataType_t dt, size_t hidden, const DevFinalSum& f, uint32_t nranks) {
  // The bases' word: 0, the operation never resolved (nothing runs).
  if (!twincuda::checkAccess(f.basesAligned, 4, false, "finalSumKernel")) return;
  if (*reinterpret_cast<const volatile uint32_t*>(f.basesAligned) == 0) return;
  if (!twincuda::checkAccess(f.bases, nranks * sizeof(char*), false, "finalSumKernel")) return;
  std::vector<const char*> bases(f.bases, f.bases + nranks);
  for (uint64_t t = 0; t < f.ntokens; ++t)
    if (!sumToken(dt, hidden, f, t, bases)) return;
}

// The ranks a sum's terms name (its bases array's length).
uint32_t ranksOf(const DevFinalSum& f) {
  uint32_t n = 0;
  for (uint32_t k = 0; k < f.termStart[f.ntokens]; ++k) n = std::max(n, f.termRank[k] + 1);
  return n;
}

}  // namespace

fuscoResult_t deviceCopy(const std::vector<DevCopyTask>& tasks, void* stream) {
  twincuda::Launch l;
  l.kernel = &kCopy;
  l.stream = static_cast<cudaStream_t>(stream);
  auto copy = std::make_shared<std::vector<DevCopyTask>>(tasks);
  l.body = [copy] { runTasks(*copy); };
  return launched(twincuda::launch(std::move(l)), "launching the row copy kernel");
}

size_t deviceCopyBatchBytes() { return sizeof(TwinBatch); }

size_t deviceCopyBatchSlots(size_t ntasks) { return (ntasks + kBatch - 1) / kBatch; }

fuscoResult_t deviceFillCopyBatches(const std::vector<DevCopyTask>& tasks, void* block,
                                    size_t slots) {
  auto* b = static_cast<TwinBatch*>(block);
  size_t at = 0;
  for (size_t i = 0; i < slots; ++i) {
    b[i].n = 0;
    for (; at < tasks.size() && b[i].n < kBatch; ++at)
      if (copyTaskMoves(tasks[at])) b[i].t[b[i].n++] = tasks[at];
  }
  return copyBatchesTookAll(tasks, at, slots);
}

fuscoResult_t deviceLaunchOp(char* block, uint32_t first, uint32_t count, void* stream) {
  if (count == 0) return fuscoSuccess;
  twincuda::Launch l;
  l.kernel = &kOp;
  l.stream = static_cast<cudaStream_t>(stream);
  l.body = [block, first, count] { runOp(block, first, count); };
  return launched(twincuda::launch(std::move(l)), "launching an operation's kernel");
}

fuscoResult_t deviceFinalSum(fuscoDataType_t dt, size_t hidden, const DevFinalSum& f,
                             void* stream) {
  if (f.ntokens == 0) return fuscoSuccess;
  if (!isReduceType(dt))
    return FUSCO_FAIL(fuscoInternalError, kEngine, "final sums of datatype %d",
                      static_cast<int>(dt));
  twincuda::Launch l;
  l.kernel = &kFinalSum;
  l.stream = static_cast<cudaStream_t>(stream);
  l.body = [dt, hidden, f] { runFinalSum(dt, hidden, f, ranksOf(f)); };
  return launched(twincuda::launch(std::move(l)), "launching the combine sum kernel");
}

fuscoResult_t deviceZeroRowRanges(void* base, size_t rowBytes, const int64_t* ranges, size_t n,
                                  int64_t longest, void* stream) {
  if (n == 0 || longest <= 0) return fuscoSuccess;
  twincuda::Launch l;
  l.kernel = &kZeroRanges;
  l.stream = static_cast<cudaStream_t>(stream);
  l.reads.push_back({ranges, n * 2 * sizeof(int64_t)});
  char* b = static_cast<char*>(base);
  l.body = [b, rowBytes, ranges, n] {
    for (size_t i = 0; i < n; ++i) {
      char* at = b + static_cast<uint64_t>(ranges[2 * i]) * rowBytes;
      const uint64_t bytes = static_cast<uint64_t>(ranges[2 * i + 1]) * rowBytes;
      if (!twincuda::checkAccess(at, bytes, true, "zeroRangesKernel")) return;
      std::memset(at, 0, bytes);
    }
  };
  return launched(twincuda::launch(std::move(l)), "launching the padding kernel");
}

// Registered when the library loads, as the code nvcc generates registers a fatbinary's kernels;
// loading them is the device init's part (loadCopyKernels).
[[maybe_unused]] const bool kCopyKernelsRegistered = [] {
  twincuda::registerKernel(&kCopy, "copyKernel");
  twincuda::registerKernel(&kFinalSum, "finalSumKernel");
  twincuda::registerKernel(&kZeroRanges, "zeroRangesKernel");
  twincuda::registerKernel(&kOp, "opKernel");
  return true;
}();

fuscoResult_t loadCopyKernels(KernelLoader& l) {
  FUSCO_CHECK(l.load(&kCopy, 256, nullptr));
  FUSCO_CHECK(l.load(&kFinalSum, 128, nullptr));
  return l.load(&kZeroRanges, 128, nullptr);
}

fuscoResult_t loadOpKernel(KernelLoader& l) { return l.load(&kOp, 256, nullptr); }

}  // namespace fusco
