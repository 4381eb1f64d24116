#include <chrono>
#include <stdexcept>
#include <thread>

#include "api/api_internal.h"
#include "device/cuda_rt.h"

namespace fusco {

namespace {
// The comm the calling thread's current call pinned (CallPin), and its handle.
thread_local fuscoComm_t tPinnedHandle = nullptr;
thread_local fuscoComm* tPinned = nullptr;

fuscoComm* pinnedByThisThread(fuscoComm_t comm) {
  return comm != nullptr && comm == tPinnedHandle ? tPinned : nullptr;
}
}  // namespace

CallPin::CallPin(fuscoComm_t comm)
    : c(comm != nullptr ? pinComm(comm) : nullptr),
      handle_(comm),
      prevHandle_(tPinnedHandle),
      prev_(tPinned) {
  if (c == nullptr) return;
  tPinnedHandle = handle_;
  tPinned = c;
}

CallPin::~CallPin() {
  if (c == nullptr) return;
  tPinnedHandle = prevHandle_;
  tPinned = prev_;
  unpinComm(c);
}

Communicator* commImpl(fuscoComm_t comm) {
  if (fuscoComm* p = pinnedByThisThread(comm)) return p->impl.get();
  fuscoComm* c = objectOf<fuscoComm>(LiveKind::Comm, comm);
  return c != nullptr ? c->impl.get() : nullptr;
}

Communicator& implOf(fuscoComm_t comm) {
  Communicator* c = commImpl(comm);
  if (c == nullptr) throw std::logic_error("a communicator in use is not live");
  return *c;
}

fuscoComm* unregisterComm(fuscoComm_t comm) {
  auto* c = static_cast<fuscoComm*>(unregisterLive(LiveKind::Comm, comm));
  // Calls still inside this comm (another thread, woken by an abort) leave within one poll; the
  // wait sleeps, so a slow one does not cost a core.
  if (c != nullptr)
    while (c->impl->activeCalls.load() > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  return c;
}

fuscoResult_t checkObject(LiveKind kind, const void* handle, const char* fn) {
  const char* what = kind == LiveKind::Layout       ? "layout"
                     : kind == LiveKind::LowLatency ? "low-latency buffer"
                                                    : "MoE handle";
  if (handle == nullptr) return FUSCO_FAIL(fuscoInvalidArgument, kApi, "%s: %s is NULL", fn, what);
  if (!isLive(kind, handle))
    return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                      "%s: %p is not a live %s (destroyed or never created)", fn, handle, what);
  return fuscoSuccess;
}

// The count is raised under the registry's lock, so unregisterComm cannot miss it.
fuscoComm* pinComm(fuscoComm_t comm) {
  fuscoComm* pinned = nullptr;
  auto pin = [](void* obj, void* out) {
    static_cast<fuscoComm*>(obj)->impl->activeCalls++;
    *static_cast<fuscoComm**>(out) = static_cast<fuscoComm*>(obj);
  };
  whileLive(LiveKind::Comm, comm, pin, &pinned);
  return pinned;
}

void unpinComm(fuscoComm* pinned) { pinned->impl->activeCalls--; }

fuscoResult_t checkComm(fuscoComm_t comm, const char* fn) {
  if (comm == nullptr) return FUSCO_FAIL(fuscoInvalidArgument, kApi, "%s: comm is NULL", fn);
  const fuscoComm* pinned = pinnedByThisThread(comm);
  if (pinned == nullptr && !commIsLive(comm))
    return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                      "%s: comm %p is not a live communicator (destroyed, aborted or never "
                      "created)",
                      fn, static_cast<void*>(comm));
  if (pinned != nullptr && pinned->impl->abortRequested())
    return FUSCO_FAIL(fuscoInvalidUsage, kApi, "%s: comm %p is being aborted (fuscoCommAbort)", fn,
                      static_cast<void*>(comm));
  return fuscoSuccess;
}

namespace {
// The comm handle the calling thread's last failed call was made on (NULL: none, or a call on a
// handle whose comm is gone), so fuscoGetLastError(comm) can tell whose failure the thread holds.
thread_local fuscoComm_t tLastFailedComm = nullptr;
}  // namespace

void noteResult(fuscoComm_t comm, fuscoComm* pinned, fuscoResult_t r) {
  if (r == fuscoSuccess) return;
  tLastFailedComm = pinned != nullptr ? comm : nullptr;
  if (pinned != nullptr) pinned->impl->setLastError(threadLastError());
}

void checkStream(fuscoComm_t comm, void* stream, const char* fn, ArgCheck* a) {
  if (implOf(comm).memType() == fuscoMemHost && stream != nullptr)
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

// The thread's own last failure when it concerned comm, or a call that found no live comm (a
// destroyed handle); otherwise comm's last recorded error (another thread's, or an asynchronous
// error fuscoCommGetAsyncError reported). The text returned is this thread's copy, valid until
// its next call: an abort on another thread may free the comm meanwhile.
const char* fuscoGetLastError(fuscoComm_t comm) {
  const std::string& mine = threadLastError();
  if (!mine.empty() && (tLastFailedComm == nullptr || tLastFailedComm == comm)) return mine.c_str();
  fuscoComm* pinned = comm != nullptr ? pinComm(comm) : nullptr;
  if (pinned == nullptr) return mine.c_str();
  thread_local std::string tCommError;
  tCommError = pinned->impl->lastError();
  unpinComm(pinned);
  return tCommError.c_str();
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
