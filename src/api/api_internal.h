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

// Live communicators, MoE handles and layouts are kept in core/live_registry.h.
inline bool commIsLive(fuscoComm_t comm) { return isLive(LiveKind::Comm, comm); }
// Removes comm from the registry (no new call can pin it), then waits for pinned calls to leave.
void unregisterComm(fuscoComm_t comm);
// Pins a live comm for the duration of a call so fuscoCommAbort from another thread cannot free it
// underneath; false if comm is not live.
bool pinComm(fuscoComm_t comm);
void unpinComm(fuscoComm_t comm);

// fuscoInvalidArgument naming fn unless obj is a live MoE handle or layout (kind says which).
fuscoResult_t checkObject(LiveKind kind, const void* obj, const char* fn);

// The comm of a live handle or layout `obj` while that comm is still the one it was made on (its
// serial matches obj->commSerial); nullptr otherwise. Reads obj only when it is live.
template <typename Obj>
fuscoComm_t liveCommOf(LiveKind kind, const Obj* obj) {
  if (!isLive(kind, obj)) return nullptr;
  return liveSerial(LiveKind::Comm, obj->comm) == obj->commSerial ? obj->comm : nullptr;
}

// fuscoInvalidArgument naming fn when the comm a live handle or layout was made on is gone.
inline fuscoResult_t checkOwnerComm(fuscoComm_t comm, const void* obj, const char* fn) {
  if (comm != nullptr) return fuscoSuccess;
  return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                    "%s: the communicator that %p was made on has been destroyed; only its "
                    "destroy call is still valid",
                    fn, obj);
}

// fuscoInvalidArgument unless comm is a live communicator.
fuscoResult_t checkComm(fuscoComm_t comm, const char* fn);
// Records the thread's last error on the communicator after a failed call.
void noteResult(fuscoComm_t comm, fuscoResult_t r);

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
  struct Pin {
    fuscoComm_t c;
    explicit Pin(fuscoComm_t comm) : c(comm != nullptr && pinComm(comm) ? comm : nullptr) {}
    ~Pin() {
      if (c) unpinComm(c);
    }
  } pin(comm);
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
  noteResult(comm, r);
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
inline bool isCudaComm(fuscoComm_t comm) { return comm->impl->memType() == fuscoMemCuda; }

}  // namespace fusco
