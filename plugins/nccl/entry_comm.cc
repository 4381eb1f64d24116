// NCCL's communicator, memory and error entry points. Standalone: fusco communicators. Interposer:
// the real NCCL's, with the side record of the fusco communicator dropped on destroy and abort.
#include <stdlib.h>
#include <string.h>

#include <set>

#include "shim.h"

using namespace fnccl;

namespace {

const char* errorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with FUSCO_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with FUSCO_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error (run with FUSCO_DEBUG=INFO for details)";
    case ncclInvalidArgument:
      return "invalid argument (see ncclGetLastError)";
    case ncclInvalidUsage:
      return "invalid usage (see ncclGetLastError)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

ncclResult_t checkConfig(const ncclConfig_t* config, const char* call) {
  if (config != nullptr && config->magic != 0xcafebeefu)
    return fail(nullptr, ncclInvalidArgument,
                "%s: config is not initialized with NCCL_CONFIG_INITIALIZER (magic 0x%x)", call,
                config->magic);
  return ncclSuccess;
}

// ncclCommDestroy and ncclCommAbort: the handle stops being live first, so a second call, or any
// call made after, is refused without reading it. The record itself goes with the last reference
// (a call still running on another thread, a group not ended yet).
ncclResult_t endComm(ncclComm_t comm, bool abort, const char* call) {
  if (comm == nullptr) return fail(nullptr, ncclInvalidArgument, "%s: comm is NULL", call);
  CommRef c = unregisterComm(comm);
  if (c == nullptr)
    return fail(nullptr, ncclInvalidArgument,
                "%s: comm %p is not a live communicator (destroyed or aborted already, or never "
                "made)",
                call, static_cast<void*>(comm));
  return fromFusco(nullptr, abort ? fuscoCommAbort(c->fc) : fuscoCommDestroy(c->fc), call);
}

// Host allocations of ncclMemAlloc (host mode), told apart from device ones in ncclMemFree.
std::mutex gHostAllocMu;
std::set<void*> gHostAllocs;

// ncclGetLastError's text: the calling thread's copy of a comm's message, valid until the thread's
// next call, since an abort on another thread may free the comm's record meanwhile.
thread_local std::string tCommError;

bool copyLastError(Comm* c) {
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->lastError.empty()) return false;
  tCommError = c->lastError;
  return true;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  FNCCL_FORWARD(GetVersion, version);
  if (version == nullptr)
    return fail(nullptr, ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  const Global& g = global();
  if (g.mode == Mode::Interposer && g.real.GetErrorString != nullptr) {
    RealScope scope;
    return g.real.GetErrorString(result);
  }
  return errorString(result);
}

const char* ncclGetLastError(ncclComm_t comm) {
  const Global& g = global();
  if (g.mode == Mode::Interposer) {
    Comm* c = comm != nullptr ? sideRecord(comm, false) : nullptr;
    if (c != nullptr && copyLastError(c)) return tCommError.c_str();
    if (comm == nullptr && *threadLastError() != '\0') return threadLastError();
    if (g.real.GetLastError == nullptr) return threadLastError();
    RealScope scope;
    return g.real.GetLastError(comm);
  }
  CommRef c = comm != nullptr ? liveComm(comm) : nullptr;
  if (c != nullptr && copyLastError(c.get())) return tCommError.c_str();
  return threadLastError();
}

void ncclResetDebugInit() {
  const Global& g = global();
  if (g.mode == Mode::Interposer && g.real.ResetDebugInit != nullptr) {
    RealScope scope;
    g.real.ResetDebugInit();
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  FNCCL_FORWARD(GetUniqueId, uniqueId);
  if (uniqueId == nullptr)
    return fail(nullptr, ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  static_assert(sizeof(ncclUniqueId) == sizeof(fuscoUniqueId), "unique ids of one size");
  fuscoUniqueId id;
  ncclResult_t r = fromFusco(nullptr, fuscoGetUniqueId(&id), "ncclGetUniqueId");
  if (r == ncclSuccess) memcpy(uniqueId, &id, sizeof(id));
  return r;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  openRealGroup();
  FNCCL_FORWARD(CommInitRankConfig, comm, nranks, commId, rank, config);
  ncclResult_t r = checkConfig(config, "ncclCommInitRankConfig");
  if (r != ncclSuccess) return r;
  return standaloneInit(comm, nranks, commId, rank, config, "ncclCommInitRankConfig");
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  openRealGroup();
  FNCCL_FORWARD(CommInitRank, comm, nranks, commId, rank);
  return standaloneInit(comm, nranks, commId, rank, nullptr, "ncclCommInitRank");
}

// Only one id is needed: the first is rank 0's, which is where fusco's root runs.
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config) {
  openRealGroup();
  FNCCL_FORWARD(CommInitRankScalable, newcomm, nranks, myrank, nId, commIds, config);
  if (nId < 1 || commIds == nullptr)
    return fail(nullptr, ncclInvalidArgument, "ncclCommInitRankScalable: nId %d, commIds %p", nId,
                static_cast<void*>(commIds));
  ncclResult_t r = checkConfig(config, "ncclCommInitRankScalable");
  if (r != ncclSuccess) return r;
  return standaloneInit(newcomm, nranks, commIds[0], myrank, config, "ncclCommInitRankScalable");
}

ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  openRealGroup();
  FNCCL_FORWARD(CommInitAll, comm, ndev, devlist);
  return fail(nullptr, ncclInvalidUsage,
              "ncclCommInitAll is not served by fusco (one process per rank): make each rank's "
              "communicator with ncclCommInitRank, or interpose a real NCCL (FUSCO_NCCL_LIBRARY)");
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  FNCCL_FORWARD(CommFinalize, comm);
  CommRef c;
  return checkComm(comm, "ncclCommFinalize", &c);  // fusco calls leave nothing in flight
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (global().mode == Mode::Interposer && comm != nullptr && !inReal()) dropSideRecord(comm);
  FNCCL_FORWARD(CommDestroy, comm);
  return endComm(comm, false, "ncclCommDestroy");
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (global().mode == Mode::Interposer && comm != nullptr && !inReal()) dropSideRecord(comm);
  FNCCL_FORWARD(CommAbort, comm);
  return endComm(comm, true, "ncclCommAbort");
}

ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  FNCCL_FORWARD(CommRevoke, comm, revokeFlags);
  CommRef c;
  ncclResult_t r = checkComm(comm, "ncclCommRevoke", &c);
  if (r != ncclSuccess) return r;
  return fail(c.get(), ncclInvalidUsage,
              "ncclCommRevoke is not served by fusco: use ncclCommAbort, or interpose a real NCCL "
              "(FUSCO_NCCL_LIBRARY)");
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  FNCCL_PASSTHROUGH(CommSplit, comm, color, key, newcomm, config);
  if (global().mode == Mode::Interposer) return interposeSplit(comm, color, key, newcomm, config);
  CommRef c;
  ncclResult_t r = checkComm(comm, "ncclCommSplit", &c);
  if (r != ncclSuccess) return r;
  // A refused config still takes part in the split's exchanges on the parent (standaloneSplit).
  return standaloneSplit(c.get(), color, key, newcomm, checkConfig(config, "ncclCommSplit"));
}

ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  FNCCL_FORWARD(CommShrink, comm, excludeRanksList, excludeRanksCount, newcomm, config,
                shrinkFlags);
  CommRef c;
  ncclResult_t r = checkComm(comm, "ncclCommShrink", &c);
  if (r != ncclSuccess) return r;
  return fail(c.get(), ncclInvalidUsage,
              "ncclCommShrink is not served by fusco: make a new communicator, or interpose a "
              "real NCCL (FUSCO_NCCL_LIBRARY)");
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  FNCCL_FORWARD(CommGetAsyncError, comm, asyncError);
  CommRef c;
  ncclResult_t r = checkComm(comm, "ncclCommGetAsyncError", &c);
  if (r != ncclSuccess) return r;
  if (asyncError == nullptr)
    return fail(c.get(), ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  fuscoResult_t fe = fuscoSuccess;
  r = fromFusco(c.get(), fuscoCommGetAsyncError(c->fc, &fe), "ncclCommGetAsyncError");
  if (r != ncclSuccess) return r;
  const ncclResult_t mapped = fromFusco(c.get(), fe, "the communicator");
  *asyncError = c->asyncError != ncclSuccess ? c->asyncError : mapped;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  FNCCL_FORWARD(CommCount, comm, count);
  CommRef c;
  ncclResult_t r = checkComm(comm, "ncclCommCount", &c);
  if (r != ncclSuccess) return r;
  return fromFusco(c.get(), fuscoCommCount(c->fc, count), "ncclCommCount");
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  FNCCL_FORWARD(CommUserRank, comm, rank);
  CommRef c;
  ncclResult_t r = checkComm(comm, "ncclCommUserRank", &c);
  if (r != ncclSuccess) return r;
  return fromFusco(c.get(), fuscoCommUserRank(c->fc, rank), "ncclCommUserRank");
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  FNCCL_FORWARD(CommCuDevice, comm, device);
  CommRef c;
  ncclResult_t r = checkComm(comm, "ncclCommCuDevice", &c);
  if (r != ncclSuccess) return r;
  if (device == nullptr)
    return fail(c.get(), ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
  *device = c->cudaDevice;  // -1 for a host-memory communicator
  return ncclSuccess;
}

ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  FNCCL_FORWARD(MemAlloc, ptr, size);
  if (ptr == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  void* p = nullptr;
  if (commMemType() == fuscoMemHost) {
    if (posix_memalign(&p, 4096, size == 0 ? 1 : size) != 0)
      return fail(nullptr, ncclSystemError, "ncclMemAlloc: cannot allocate %zu bytes", size);
    std::lock_guard<std::mutex> lock(gHostAllocMu);
    gHostAllocs.insert(p);
  } else {
    const CudaRt* rt = cudaRt();
    if (rt == nullptr)
      return fail(nullptr, ncclSystemError, "ncclMemAlloc: no CUDA runtime could be loaded");
    if (rt->malloc(&p, size) != 0)
      return fail(nullptr, ncclUnhandledCudaError, "ncclMemAlloc: cudaMalloc(%zu) failed", size);
  }
  *ptr = p;
  return ncclSuccess;
}

ncclResult_t ncclMemFree(void* ptr) {
  FNCCL_FORWARD(MemFree, ptr);
  if (ptr == nullptr) return ncclSuccess;
  {
    std::lock_guard<std::mutex> lock(gHostAllocMu);
    if (gHostAllocs.erase(ptr) > 0) {
      free(ptr);
      return ncclSuccess;
    }
  }
  const CudaRt* rt = cudaRt();
  if (rt == nullptr || rt->free(ptr) != 0)
    return fail(nullptr, ncclInvalidArgument, "ncclMemFree: %p is not from ncclMemAlloc", ptr);
  return ncclSuccess;
}

ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  FNCCL_FORWARD(CommRegister, comm, buff, size, handle);
  CommRef c;
  ncclResult_t r = checkComm(comm, "ncclCommRegister", &c);
  if (r != ncclSuccess) return r;
  return fromFusco(c.get(), fuscoCommRegister(c->fc, buff, size, handle), "ncclCommRegister");
}

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  FNCCL_FORWARD(CommDeregister, comm, handle);
  CommRef c;
  ncclResult_t r = checkComm(comm, "ncclCommDeregister", &c);
  if (r != ncclSuccess) return r;
  return fromFusco(c.get(), fuscoCommDeregister(c->fc, handle), "ncclCommDeregister");
}

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags) {
  FNCCL_FORWARD(CommWindowRegister, comm, buff, size, win, winFlags);
  CommRef c;
  ncclResult_t r = checkComm(comm, "ncclCommWindowRegister", &c);
  if (r != ncclSuccess) return r;
  return fail(c.get(), ncclInvalidUsage,
              "ncclCommWindowRegister is not served by fusco: use ncclCommRegister, or interpose "
              "a real NCCL (FUSCO_NCCL_LIBRARY)");
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  FNCCL_FORWARD(CommWindowDeregister, comm, win);
  CommRef c;
  ncclResult_t r = checkComm(comm, "ncclCommWindowDeregister", &c);
  if (r != ncclSuccess) return r;
  return fail(c.get(), ncclInvalidUsage, "ncclCommWindowDeregister is not served by fusco");
}

}  // extern "C"
