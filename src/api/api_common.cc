#include <sched.h>

#include <map>
#include <mutex>
#include <set>

#include "api/api_internal.h"
#include "device/cuda_rt.h"

namespace fusco {

namespace {
std::mutex gCommsMu;
// Each live comm with its serial number: a handle remembers its comm's serial, so a comm created
// later at the same address is not taken for the one the handle was made on.
std::map<fuscoComm_t, uint64_t>& liveComms() {
  static std::map<fuscoComm_t, uint64_t>* s = new std::map<fuscoComm_t, uint64_t>();
  return *s;
}
uint64_t gNextSerial = 1;

// Live MoE handles and layouts, one set per kind (a layout passed as a handle is not live).
std::mutex gObjectsMu;
std::set<const void*>& liveObjects(ObjectKind kind) {
  static std::set<const void*>* s = new std::set<const void*>[2];
  return s[kind == ObjectKind::Layout ? 1 : 0];
}
}  // namespace

void registerComm(fuscoComm_t comm) {
  std::lock_guard<std::mutex> g(gCommsMu);
  liveComms()[comm] = gNextSerial++;
}

void unregisterComm(fuscoComm_t comm) {
  {
    std::lock_guard<std::mutex> g(gCommsMu);
    liveComms().erase(comm);
  }
  // Calls still inside this comm (another thread, woken by an abort) leave within one poll.
  while (comm->impl->activeCalls.load() > 0) sched_yield();
}

uint64_t commSerial(fuscoComm_t comm) {
  std::lock_guard<std::mutex> g(gCommsMu);
  auto it = liveComms().find(comm);
  return it == liveComms().end() ? 0 : it->second;
}

void registerObject(ObjectKind kind, const void* obj) {
  std::lock_guard<std::mutex> g(gObjectsMu);
  liveObjects(kind).insert(obj);
}

bool unregisterObject(ObjectKind kind, const void* obj) {
  std::lock_guard<std::mutex> g(gObjectsMu);
  return liveObjects(kind).erase(obj) != 0;
}

bool objectIsLive(ObjectKind kind, const void* obj) {
  std::lock_guard<std::mutex> g(gObjectsMu);
  return obj != nullptr && liveObjects(kind).count(obj) != 0;
}

fuscoResult_t checkObject(ObjectKind kind, const void* obj, const char* fn) {
  const char* what = kind == ObjectKind::Layout ? "layout" : "MoE handle";
  if (obj == nullptr) return FUSCO_FAIL(fuscoInvalidArgument, kApi, "%s: %s is NULL", fn, what);
  if (!objectIsLive(kind, obj))
    return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                      "%s: %p is not a live %s (destroyed or never created)", fn, obj, what);
  return fuscoSuccess;
}

bool pinComm(fuscoComm_t comm) {
  std::lock_guard<std::mutex> g(gCommsMu);
  if (liveComms().count(comm) == 0) return false;
  comm->impl->activeCalls++;
  return true;
}

void unpinComm(fuscoComm_t comm) { comm->impl->activeCalls--; }

bool commIsLive(fuscoComm_t comm) {
  std::lock_guard<std::mutex> g(gCommsMu);
  return comm != nullptr && liveComms().count(comm) != 0;
}

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

fuscoResult_t injectFault(fuscoComm_t comm, FaultPhase phase) {
  Communicator& c = *comm->impl;
  return faultPoint(phase, c.rank(), [&](const char* w) { c.markBroken(fuscoRemoteError, w); });
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
