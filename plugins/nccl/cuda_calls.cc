// The few CUDA calls the shim makes itself (the device, ncclMemAlloc's memory and the interposer's
// unique-id broadcast), found at run time: the CUDA runtime where the program exports one or a
// shared one loads, else the driver, which every machine with a GPU has as libcuda.so.1 (a program
// linked with the static runtime exports none, and the runtime's shared library may not be on the
// library path). Both act on the thread's current context, the one the program's runtime made.
#include <dlfcn.h>

#include <mutex>

#include "shim.h"

namespace fnccl {

namespace {

// The driver's entry points (CUresult is an int, CUdeviceptr a 64-bit integer).
struct Driver {
  int (*ctxGetDevice)(int*) = nullptr;
  int (*memAlloc)(unsigned long long*, size_t) = nullptr;
  int (*memFree)(unsigned long long) = nullptr;
  int (*htoD)(unsigned long long, const void*, size_t) = nullptr;
  int (*dtoH)(void*, unsigned long long, size_t) = nullptr;
  int (*ctxSynchronize)() = nullptr;
};
Driver gDrv;

int drvGetDevice(int* d) { return gDrv.ctxGetDevice(d); }
int drvMalloc(void** p, size_t bytes) {
  unsigned long long d = 0;
  const int r = gDrv.memAlloc(&d, bytes);
  *p = reinterpret_cast<void*>(d);
  return r;
}
int drvFree(void* p) { return gDrv.memFree(reinterpret_cast<unsigned long long>(p)); }
// kind: 1 host to device, 2 device to host (cudaMemcpyKind); synchronous like cudaMemcpy.
int drvMemcpy(void* dst, const void* src, size_t bytes, int kind) {
  if (kind == 1) return gDrv.htoD(reinterpret_cast<unsigned long long>(dst), src, bytes);
  if (kind == 2) return gDrv.dtoH(dst, reinterpret_cast<unsigned long long>(src), bytes);
  return 1;  // CUDA_ERROR_INVALID_VALUE
}
int drvStreamSynchronize(cudaStream_t) { return gDrv.ctxSynchronize(); }

template <typename Fn>
void find(void* h, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(h, name));
}

bool loadRuntime(CudaRt* rt) {
  void* h = RTLD_DEFAULT;
  if (dlsym(h, "cudaGetDevice") == nullptr) {
    h = nullptr;
    for (const char* n : {"libcudart.so", "libcudart.so.13", "libcudart.so.12"})
      if (h == nullptr) h = dlopen(n, RTLD_NOW | RTLD_LOCAL);
  }
  if (h == nullptr) return false;
  find(h, "cudaGetDevice", &rt->getDevice);
  find(h, "cudaMalloc", &rt->malloc);
  find(h, "cudaFree", &rt->free);
  find(h, "cudaMemcpy", &rt->memcpy);
  find(h, "cudaStreamSynchronize", &rt->streamSynchronize);
  return rt->getDevice && rt->malloc && rt->free && rt->memcpy && rt->streamSynchronize;
}

bool loadDriver(CudaRt* rt) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return false;
  find(h, "cuCtxGetDevice", &gDrv.ctxGetDevice);
  find(h, "cuMemAlloc_v2", &gDrv.memAlloc);
  find(h, "cuMemFree_v2", &gDrv.memFree);
  find(h, "cuMemcpyHtoD_v2", &gDrv.htoD);
  find(h, "cuMemcpyDtoH_v2", &gDrv.dtoH);
  find(h, "cuCtxSynchronize", &gDrv.ctxSynchronize);
  if (!(gDrv.ctxGetDevice && gDrv.memAlloc && gDrv.memFree && gDrv.htoD && gDrv.dtoH &&
        gDrv.ctxSynchronize))
    return false;
  rt->getDevice = drvGetDevice;
  rt->malloc = drvMalloc;
  rt->free = drvFree;
  rt->memcpy = drvMemcpy;
  rt->streamSynchronize = drvStreamSynchronize;
  return true;
}

}  // namespace

const CudaRt* cudaRt() {
  static CudaRt rt;
  static bool ok = false;
  static std::once_flag once;
  std::call_once(once, [] {
    ok = loadRuntime(&rt);
    if (!ok) {
      rt = CudaRt{};
      ok = loadDriver(&rt);
    }
    if (!ok) FNCCL_WARN("no CUDA runtime or driver could be loaded: device comms cannot split");
  });
  return ok ? &rt : nullptr;
}

int currentDevice() {
  const CudaRt* rt = cudaRt();
  int d = -1;
  if (rt == nullptr || rt->getDevice(&d) != 0) return -1;
  return d;
}

}  // namespace fnccl
