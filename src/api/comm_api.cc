// Communicator entry points: ids, init/destroy/abort, queries, memory and registration.
#include <cstdint>

#include "api/api_internal.h"
#include "core/bootstrap.h"
#include "core/log.h"
#include "core/params.h"
#include "device/cuda_rt.h"

using namespace fusco;

namespace {

fuscoResult_t initRank(fuscoComm_t* comm, int nranks, const fuscoUniqueId& id, int rank,
                       const fuscoConfig_t* config) {
  paramsReload();
  logConfigure();
  if (comm == nullptr)
    return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoCommInitRank: comm is NULL");
  if (nranks <= 0)
    return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoCommInitRank: nranks %d must be > 0",
                      nranks);
  CommOptions opts;
  FUSCO_CHECK(commOptionsFromConfig(config, &opts));
  FUSCO_CHECK(bootstrapCheckId(id));
  if (opts.memType == fuscoMemCuda && !cudaBuilt())
    return FUSCO_FAIL(
        fuscoInvalidUsage, kApi,
        "fuscoCommInitRank: fuscoMemCuda communicators need the CUDA path, which this "
        "build does not have");
  logSetRank(rank);
  std::unique_ptr<Communicator> impl;
  FUSCO_CHECK(Communicator::create(id, nranks, rank, opts, &impl));
  std::unique_ptr<fuscoComm> c(new fuscoComm());
  c->impl = std::move(impl);
  *comm = static_cast<fuscoComm_t>(registerLive(LiveKind::Comm, c.release()));
  return fuscoSuccess;
}

// Takes comm out of the registry and frees it once no call is inside it. Two destroys of one
// comm on two threads: the one that finds it gone says so, as a destroyed handle is refused.
fuscoResult_t freeComm(fuscoComm_t comm, const char* fn) {
  fuscoComm* c = unregisterComm(comm);
  if (c == nullptr)
    return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                      "%s: comm %p was destroyed by another call meanwhile", fn,
                      static_cast<void*>(comm));
  delete c;
  return fuscoSuccess;
}

}  // namespace

extern "C" {

fuscoResult_t fuscoGetUniqueId(fuscoUniqueId* id) {
  return guarded(nullptr, "fuscoGetUniqueId", [&]() -> fuscoResult_t {
    paramsReload();
    if (id == nullptr)
      return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoGetUniqueId: id is NULL");
    return bootstrapCreateId(id);
  });
}

fuscoResult_t fuscoCommInitRank(fuscoComm_t* comm, int nranks, fuscoUniqueId id, int rank) {
  return guarded(nullptr, "fuscoCommInitRank",
                 [&] { return initRank(comm, nranks, id, rank, nullptr); });
}

fuscoResult_t fuscoCommInitRankConfig(fuscoComm_t* comm, int nranks, fuscoUniqueId id, int rank,
                                      const fuscoConfig_t* config) {
  return guarded(nullptr, "fuscoCommInitRankConfig", [&] {
    if (config == nullptr)
      return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoCommInitRankConfig: config is NULL");
    return initRank(comm, nranks, id, rank, config);
  });
}

fuscoResult_t fuscoCommDestroy(fuscoComm_t comm) {
  return guarded(nullptr, "fuscoCommDestroy", [&] {
    FUSCO_CHECK(checkComm(comm, "fuscoCommDestroy"));
    return freeComm(comm, "fuscoCommDestroy");
  });
}

fuscoResult_t fuscoCommAbort(fuscoComm_t comm) {
  return guarded(nullptr, "fuscoCommAbort", [&] {
    FUSCO_CHECK(checkComm(comm, "fuscoCommAbort"));
    // Pinned while the abort is raised, so a destroy on another thread cannot free it meanwhile.
    fuscoComm* pinned = pinComm(comm);
    if (pinned == nullptr) return freeComm(comm, "fuscoCommAbort");
    pinned->impl->requestAbort();
    pinned->impl->markBroken(fuscoInvalidUsage, "the communicator was aborted (fuscoCommAbort)");
    unpinComm(pinned);
    return freeComm(comm, "fuscoCommAbort");  // waits for blocked calls, which notice the abort
  });
}

fuscoResult_t fuscoCommCount(const fuscoComm_t comm, int* count) {
  return guarded(comm, "fuscoCommCount", [&] {
    FUSCO_CHECK(checkComm(comm, "fuscoCommCount"));
    if (count == nullptr)
      return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoCommCount: count is NULL");
    *count = implOf(comm).nranks();
    return fuscoSuccess;
  });
}

fuscoResult_t fuscoCommUserRank(const fuscoComm_t comm, int* rank) {
  return guarded(comm, "fuscoCommUserRank", [&] {
    FUSCO_CHECK(checkComm(comm, "fuscoCommUserRank"));
    if (rank == nullptr)
      return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoCommUserRank: rank is NULL");
    *rank = implOf(comm).rank();
    return fuscoSuccess;
  });
}

fuscoResult_t fuscoCommNodeInfo(const fuscoComm_t comm, int* node, int* numNodes, int* localRank,
                                int* localSize) {
  return guarded(comm, "fuscoCommNodeInfo", [&] {
    FUSCO_CHECK(checkComm(comm, "fuscoCommNodeInfo"));
    if (!node || !numNodes || !localRank || !localSize)
      return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoCommNodeInfo: an output pointer is NULL");
    const NodeMap& m = implOf(comm).nodes();
    int r = implOf(comm).rank();
    *node = m.nodeOf[r];
    *numNodes = m.numNodes;
    *localRank = m.localRankOf[r];
    *localSize = m.localSize(m.nodeOf[r]);
    return fuscoSuccess;
  });
}

fuscoResult_t fuscoCommGetAsyncError(fuscoComm_t comm, fuscoResult_t* asyncError) {
  return guarded(comm, "fuscoCommGetAsyncError", [&] {
    FUSCO_CHECK(checkComm(comm, "fuscoCommGetAsyncError"));
    if (asyncError == nullptr)
      return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoCommGetAsyncError: asyncError is NULL");
    std::string why;
    implOf(comm).checkIdlePeers();
    *asyncError = implOf(comm).takeAsyncError(&why);
    // fuscoGetLastError(comm) says what the reported error was.
    if (*asyncError != fuscoSuccess) implOf(comm).setLastError(why);
    return fuscoSuccess;
  });
}

fuscoResult_t fuscoMemAlloc(fuscoComm_t comm, void** ptr, size_t bytes) {
  return guarded(comm, "fuscoMemAlloc", [&] {
    FUSCO_CHECK(checkComm(comm, "fuscoMemAlloc"));
    if (ptr == nullptr) return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoMemAlloc: ptr is NULL");
    if (bytes == 0) return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoMemAlloc: bytes is 0");
    return implOf(comm).memAlloc(bytes, ptr);
  });
}

fuscoResult_t fuscoMemFree(fuscoComm_t comm, void* ptr) {
  return guarded(comm, "fuscoMemFree", [&] {
    FUSCO_CHECK(checkComm(comm, "fuscoMemFree"));
    if (ptr == nullptr) return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoMemFree: ptr is NULL");
    return implOf(comm).memFree(ptr);
  });
}

fuscoResult_t fuscoCommRegister(fuscoComm_t comm, void* buff, size_t bytes, void** handle) {
  return guarded(comm, "fuscoCommRegister", [&] {
    FUSCO_CHECK(checkComm(comm, "fuscoCommRegister"));
    if (buff == nullptr || handle == nullptr || bytes == 0)
      return FUSCO_FAIL(
          fuscoInvalidArgument, kApi,
          "fuscoCommRegister: buff (%p) and handle must be non-NULL and bytes (%zu) > 0", buff,
          bytes);
    if (reinterpret_cast<uintptr_t>(buff) > UINTPTR_MAX - bytes)
      return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                        "fuscoCommRegister: %zu bytes from %p run past the end of the address "
                        "space",
                        bytes, buff);
    FUSCO_CHECK(implOf(comm).memRegister(buff, bytes));
    *handle = implOf(comm).addRegistration(buff, bytes);
    return fuscoSuccess;
  });
}

fuscoResult_t fuscoCommDeregister(fuscoComm_t comm, void* handle) {
  return guarded(comm, "fuscoCommDeregister", [&] {
    FUSCO_CHECK(checkComm(comm, "fuscoCommDeregister"));
    void* buff = nullptr;
    if (!implOf(comm).takeRegistration(handle, &buff))
      return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                        "fuscoCommDeregister: %p is not a registration of this comm", handle);
    return implOf(comm).memDeregister(buff);
  });
}

}  // extern "C"
