// What every entry point shares: the opaque communicator, checks of live comms and objects, and
// the guard that turns every C++ exception into a result code plus a last-error message.
#pragma once

#include <memory>
#include <new>
#include <string>

#include "core/arg_check.h"
#include "core/datatype.h"
#include "core/fault.h"
#include "core/live_registry.h"
#include "core/result.h"
#include "engine/communicator.h"
#include "fusco.h"

struct fuscoComm {
  std::unique_ptr<fusco::Communicator> impl;
};

namespace fusco {

// Live communicators, MoE handles, layouts and low-latency buffers are kept in
// core/live_registry.h: a handle is a number the registry maps to its object.
inline bool commIsLive(fuscoComm_t comm) { return isLive(LiveKind::Comm, comm); }
// The communicator behind a live comm handle (the caller checked it and holds a pin); throws,
// which the entry point's guard reports as an internal error, when it is not live.
Communicator& implOf(fuscoComm_t comm);
// The communicator behind a live comm handle, or nullptr.
Communicator* commImpl(fuscoComm_t comm);
// Removes comm from the registry (no new call can pin it), then waits for pinned calls to leave;
// returns its object, for the caller to delete (nullptr when it was not live).
fuscoComm* unregisterComm(fuscoComm_t comm);
// Pins a live comm for the duration of a call so fuscoCommAbort from another thread cannot free it
// underneath: returns its object, or nullptr if comm is not live.
fuscoComm* pinComm(fuscoComm_t comm);
void unpinComm(fuscoComm* pinned);
// The pin of the calling thread's call (guarded): while it lives, implOf, commImpl and checkComm
// on that handle use the pinned object without looking the handle up again, so a call that races
// fuscoCommAbort on another thread runs on to a clean error instead of finding its comm gone.
class CallPin {
 public:
  explicit CallPin(fuscoComm_t comm);
  ~CallPin();
  CallPin(const CallPin&) = delete;
  CallPin& operator=(const CallPin&) = delete;
  fuscoComm* c;

 private:
  fuscoComm_t handle_, prevHandle_;
  fuscoComm* prev_;
};

// fuscoInvalidArgument naming fn unless handle is a live MoE handle, layout or low-latency buffer
// (kind says which).
fuscoResult_t checkObject(LiveKind kind, const void* handle, const char* fn);

// The object behind a live handle of kind, or nullptr.
template <typename Obj>
Obj* objectOf(LiveKind kind, const void* handle) {
  return static_cast<Obj*>(liveObject(kind, handle));
}

// The comm a live handle or layout was made on while that comm is still live (comm handles are
// never reused, so a comm made later at the same address is not it); nullptr otherwise.
template <typename Obj>
fuscoComm_t liveCommOf(LiveKind kind, const void* handle) {
  const Obj* obj = objectOf<Obj>(kind, handle);
  if (obj == nullptr || !commIsLive(obj->comm)) return nullptr;
  return obj->comm;
}

// fuscoInvalidArgument naming fn when the comm a live handle or layout was made on is gone.
inline fuscoResult_t checkOwnerComm(fuscoComm_t comm, const void* obj, const char* fn) {
  if (comm != nullptr) return fuscoSuccess;
  return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                    "%s: the communicator that %p was made on has been destroyed; only its "
                    "destroy call is still valid",
                    fn, obj);
}

// fuscoInvalidArgument unless comm is a live communicator (or the one this thread's call pinned);
// fuscoInvalidUsage when an abort of it has begun.
fuscoResult_t checkComm(fuscoComm_t comm, const char* fn);
// After a failed call: records the thread's last error on the pinned communicator (nullptr:
// none) and which comm handle the thread's failure concerns (fuscoGetLastError).
void noteResult(fuscoComm_t comm, fuscoComm* pinned, fuscoResult_t r);

// Group: point-to-point calls (fuscoGroupEnd), which only some ranks may make.
enum class CallKind { None, Collective, Group };

// Runs body, catching everything. Usage: return guarded(comm, "fuscoX", [&] { ... });
// A call that communicates names its kind: on a live comm it is one call of the communicator
// (Communicator::beginCall / endCall), so a failure that leaves its peers a call apart breaks the
// comm, whether it is an error code or an exception.
template <typename Body>
fuscoResult_t guarded(fuscoComm_t comm, const char* fn, CallKind kind, Body body) {
  fuscoResult_t r;
  clearThreadLastError();
  CallPin pin(comm);
  const bool call = kind != CallKind::None && pin.c != nullptr;
  if (call) pin.c->impl->beginCall(kind == CallKind::Collective);
  try {
    r = body();
  } catch (const std::bad_alloc&) {
    r = FUSCO_FAIL(fuscoSystemError, kApi, "%s: out of memory", fn);
  } catch (const std::exception& e) {
    r = FUSCO_FAIL(fuscoInternalError, kApi, "%s: unexpected exception: %s", fn, e.what());
  } catch (...) {
    r = FUSCO_FAIL(fuscoInternalError, kApi, "%s: unexpected exception", fn);
  }
  if (call) pin.c->impl->endCall(r, threadLastError());
  noteResult(comm, pin.c, r);
  return r;
}

template <typename Body>
fuscoResult_t guarded(fuscoComm_t comm, const char* fn, Body body) {
  return guarded(comm, fn, CallKind::None, body);
}

// fuscoMemCuda comms take device buffers: a non-NULL pointer the GPU cannot use (host memory)
// fails the check with a message naming the argument. Host comms: nothing to check.
void checkDevicePtr(fuscoComm_t comm, const void* p, const char* fn, const char* what, ArgCheck* a);
// A host comm takes stream = NULL: anything else fails the check with a message naming fn.
void checkStream(fuscoComm_t comm, void* stream, const char* fn, ArgCheck* a);
inline bool isCudaComm(fuscoComm_t comm) { return implOf(comm).memType() == fuscoMemCuda; }

}  // namespace fusco
