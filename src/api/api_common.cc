#include <sched.h>

#include "api/api_internal.h"
#include "device/cuda_rt.h"

namespace fusco {

void unregisterComm(fuscoComm_t comm) {
  unregisterLive(LiveKind::Comm, comm);
  // Calls still inside this comm (another thread, woken by an abort) leave within one poll.
  while (comm->impl->activeCalls.load() > 0) sched_yield();
}

fuscoResult_t checkObject(LiveKind kind, const void* obj, const char* fn) {
  const char* what = kind == LiveKind::Layout       ? "layout"
                     : kind == LiveKind::LowLatency ? "low-latency buffer"
                                                    : "MoE handle";
  if (obj == nullptr) return FUSCO_FAIL(fuscoInvalidArgument, kApi, "%s: %s is NULL", fn, what);
  if (!isLive(kind, obj))
    return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                      "%s: %p is not a live %s (destroyed or never created)", fn, obj, what);
  return fuscoSuccess;
}

// The count is raised under the registry's lock, so unregisterComm cannot miss it.
bool pinComm(fuscoComm_t comm) {
  auto pin = [](void* c) { static_cast<fuscoComm_t>(c)->impl->activeCalls++; };
  return whileLive(LiveKind::Comm, comm, pin, comm);
}

void unpinComm(fuscoComm_t comm) { comm->impl->activeCalls--; }

fuscoResult_t checkComm(fuscoComm_t comm, const char* fn) {
  if (comm == nullptr) return FUSCO_FAIL(fuscoInvalidArgument, kApi, "%s: comm is NULL", fn);
  if (!commIsLive(comm))
    return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                      "%s: comm %p is not a live communicator (destroyed or never created)", fn,
                      static_cast<void*>(comm));
  return fuscoSuccess;
}

void noteResult(fuscoComm_t comm, fuscoResult_t r) {
  if (r == fuscoSuccess || !commIsLive(comm)) return;  // the caller's pin keeps it alive
  comm->impl->lastError = threadLastError();
}

void checkStream(fuscoComm_t comm, void* stream, const char* fn, ArgCheck* a) {
  if (comm->impl->memType() == fuscoMemHost && stream != nullptr)
    a->fail("%s: stream must be NULL for a host-memory communicator", fn);
}

void checkDevicePtr(fuscoComm_t comm, const void* p, const char* fn, const char* what,
                    ArgCheck* a) {
  if (p == nullptr || a->status != fuscoSuccess || !isCudaComm(comm)) return;
  if (!cudaIsDevicePointer(p))
    a->fail(
        "%s: %s (%p) is not CUDA device memory; a fuscoMemCuda communicator takes device buffers",
        fn, what, p);
}

}  // namespace fusco

using namespace fusco;

extern "C" {

fuscoResult_t fuscoGetVersion(int* version) {
  if (version == nullptr)
    return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoGetVersion: version is NULL");
  *version = FUSCO_VERSION_CODE;
  return fuscoSuccess;
}

const char* fuscoGetErrorString(fuscoResult_t result) { return resultName(result); }

const char* fuscoGetLastError(fuscoComm_t comm) {
  if (comm != nullptr && commIsLive(comm)) return comm->impl->lastError.c_str();
  return threadLastError().c_str();
}

fuscoResult_t fuscoDataTypeSize(fuscoDataType_t datatype, size_t* bytes) {
  if (bytes == nullptr)
    return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoDataTypeSize: bytes is NULL");
  size_t s = dataTypeSize(datatype);
  if (s == 0)
    return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoDataTypeSize: invalid datatype %d",
                      rawEnum(datatype));
  *bytes = s;
  return fuscoSuccess;
}

}  // extern "C"
