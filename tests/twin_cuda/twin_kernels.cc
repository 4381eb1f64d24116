// Kernels of the twin: a registry, loading, and launches (T3, T4).
//
// CUDA programming guide, "Lazy Loading": with lazy loading (the default since CUDA 12.2) a
// kernel's module is loaded at its first use (first launch, or first cudaFuncGetAttributes,
// cudaFuncSetAttribute or occupancy query), and loading "may require context synchronization",
// i.e. waits for the device ("Potential Hazards"). The twin makes the first query of a kernel wait
// for every stream (T4), and under FUSCO_TWIN_LAZY_LOADING=1 (the default) refuses to launch a
// kernel nobody loaded, since a first launch that loads can deadlock behind a stream wait.
// With FUSCO_TWIN_LAZY_LOADING=0 a first launch loads, waiting for the device, as CUDA does.
// A launch's grid occupies the device's multiprocessors while it runs (T7, twin_sms.cc).
#include <cstring>
#include <unordered_map>

#include "twin_internal.h"

namespace twincuda {
namespace detail {
namespace {

struct Kernel {
  std::string name;
  ExLauncher ex = nullptr;
  bool loaded = false;
};

// The configuration of the cudaLaunchKernelExC call a launcher runs in (its grid, T7).
thread_local const cudaLaunchConfig_t* tExConfig = nullptr;

std::mutex gKernelsMu;
std::unordered_map<const void*, Kernel>& kernels() {
  static auto* m = new std::unordered_map<const void*, Kernel>;
  return *m;
}

bool lookup(const void* fn, Kernel* out) {
  std::lock_guard<std::mutex> g(gKernelsMu);
  auto it = kernels().find(fn);
  if (it == kernels().end()) return false;
  *out = it->second;
  return true;
}

// Whether fn may be launched now: registered, and loaded (or loadable here).
cudaError_t admit(const void* fn, Kernel* k) {
  if (!lookup(fn, k)) {
    report("launch of %s: not a kernel registered with the twin", fmtPtr(fn).c_str());
    return fail(cudaErrorInvalidDeviceFunction);
  }
  if (k->loaded) return cudaSuccess;
  if (knob("FUSCO_TWIN_LAZY_LOADING", 1) != 0) {
    noteRefusedLaunch();
    report(
        "kernel %s launched before it was loaded (no cudaFuncGetAttributes on it first): "
        "refused, since under lazy loading its first launch may wait for the device "
        "(FUSCO_TWIN_LAZY_LOADING=1)",
        k->name.c_str());
    return fail(cudaErrorInvalidDeviceFunction);
  }
  return loadKernel(fn, ("the first launch of kernel " + k->name).c_str());
}

}  // namespace

cudaError_t loadKernel(const void* fn, const char* call) {
  Kernel k;
  if (!lookup(fn, &k)) return fail(cudaErrorInvalidDeviceFunction);
  if (k.loaded) return cudaSuccess;
  const cudaError_t e = waitIdle(call);
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> g(gKernelsMu);
  kernels()[fn].loaded = true;
  return cudaSuccess;
}

}  // namespace detail

void registerKernel(const void* fn, const char* name, ExLauncher ex) {
  std::lock_guard<std::mutex> g(detail::gKernelsMu);
  auto& k = detail::kernels()[fn];
  if (k.name.empty()) {
    k.name = name ? name : detail::fmtPtr(fn);
    k.ex = ex;
  }
}

cudaError_t launch(Launch l) {
  TWIN_ENTER();
  detail::Kernel k;
  const cudaError_t a = detail::admit(l.kernel, &k);
  if (a != cudaSuccess) return a;
  detail::Stream* s = detail::findStream(l.stream);
  if (s == nullptr) return detail::fail(cudaErrorInvalidResourceHandle);
  auto it = std::make_shared<detail::Item>();
  const cudaError_t grid =
      detail::residency(l, detail::tExConfig, "kernel " + k.name, &it->sms, &it->cooperative);
  if (grid != cudaSuccess) return grid;
  it->desc = "kernel " + k.name + (l.what.empty() ? "" : " (" + l.what + ")");
  it->work = true;
  for (const Range& r : l.reads)
    it->accesses.push_back(detail::Access{r.ptr, r.bytes, false, true});
  for (const Range& r : l.writes)
    it->accesses.push_back(detail::Access{r.ptr, r.bytes, true, true});
  it->run = std::move(l.body);
  return detail::fail(detail::submit(s, std::move(it)));
}

}  // namespace twincuda

using namespace twincuda::detail;

extern "C" {

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* func) {
  TWIN_ENTER();
  if (attr == nullptr) return fail(cudaErrorInvalidValue);
  Kernel k;
  if (!lookup(func, &k)) return fail(cudaErrorInvalidDeviceFunction);
  const cudaError_t e = loadKernel(func, ("cudaFuncGetAttributes(" + k.name + ")").c_str());
  if (e != cudaSuccess) return e;
  std::memset(attr, 0, sizeof *attr);
  attr->maxThreadsPerBlock = 1024;
  attr->numRegs = 32;
  attr->binaryVersion = 90;
  attr->ptxVersion = 90;
  attr->maxDynamicSharedSizeBytes = 48 << 10;
  return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* numBlocks, const void* func,
                                                          int blockSize, size_t dynamicSMemSize) {
  TWIN_ENTER();
  if (numBlocks == nullptr || blockSize <= 0 || blockSize > 1024)
    return fail(cudaErrorInvalidValue);
  Kernel k;
  if (!lookup(func, &k)) return fail(cudaErrorInvalidDeviceFunction);
  const cudaError_t e =
      loadKernel(func, ("cudaOccupancyMaxActiveBlocksPerMultiprocessor(" + k.name + ")").c_str());
  if (e != cudaSuccess) return e;
  *numBlocks = static_cast<int>(blocksPerMultiprocessor(static_cast<uint64_t>(blockSize)));
  return cudaSuccess;
}

// What cuda_runtime.h's template of the call above reaches (flags: cudaOccupancyDefault or
// cudaOccupancyDisableCachingOverride, neither of which changes the twin's answer).
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* numBlocks, const void* func,
                                                                   int blockSize,
                                                                   size_t dynamicSMemSize,
                                                                   unsigned int flags) {
  if ((flags & ~static_cast<unsigned>(cudaOccupancyDisableCachingOverride)) != 0)
    return fail(cudaErrorInvalidValue);
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(numBlocks, func, blockSize, dynamicSMemSize);
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args) {
  TWIN_ENTER();
  if (config == nullptr) return fail(cudaErrorInvalidValue);
  Kernel k;
  const cudaError_t a = admit(func, &k);
  if (a != cudaSuccess) return a;
  if (k.ex == nullptr) {
    report("cudaLaunchKernelExC: kernel %s has no launcher registered with the twin",
           k.name.c_str());
    return fail(cudaErrorInvalidDeviceFunction);
  }
  const cudaLaunchConfig_t* outer = std::exchange(tExConfig, config);
  const cudaError_t e = k.ex(config, args);
  tExConfig = outer;
  return e;
}

// Runtime API cudaLaunchCooperativeKernel: cudaLaunchKernelExC with
// cudaLaunchAttributeCooperative (the grid is resident whole, or refused with
// cudaErrorCooperativeLaunchTooLarge: T7).
cudaError_t cudaLaunchCooperativeKernel(const void* func, dim3 gridDim, dim3 blockDim, void** args,
                                        size_t sharedMem, cudaStream_t stream) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = gridDim;
  cfg.blockDim = blockDim;
  cfg.dynamicSmemBytes = sharedMem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelExC(&cfg, func, args);
}

}  // extern "C"
