// What every entry point shares: the opaque communicator, the registry of live communicators,
// and the guard that turns every C++ exception into a result code plus a last-error message.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <memory>
#include <new>
#include <string>

#include "core/result.h"
#include "engine/communicator.h"
#include "fusco.h"

struct fuscoComm {
  std::unique_ptr<fusco::Communicator> impl;
};

namespace fusco {

void registerComm(fuscoComm_t comm);
void unregisterComm(fuscoComm_t comm);
bool commIsLive(fuscoComm_t comm);
// fuscoInvalidArgument unless comm is a live communicator.
fuscoResult_t checkComm(fuscoComm_t comm, const char* fn);
// Records the thread's last error on the communicator after a failed call.
void noteResult(fuscoComm_t comm, fuscoResult_t r);

// Runs body, catching everything. Usage: return guarded(comm, "fuscoX", [&] { ... });
template <typename Body>
fuscoResult_t guarded(fuscoComm_t comm, const char* fn, Body body) {
  fuscoResult_t r;
  clearThreadLastError();
  try {
    r = body();
  } catch (const std::bad_alloc&) {
    r = FUSCO_FAIL(fuscoSystemError, kApi, "%s: out of memory", fn);
  } catch (const std::exception& e) {
    r = FUSCO_FAIL(fuscoInternalError, kApi, "%s: unexpected exception: %s", fn, e.what());
  } catch (...) {
    r = FUSCO_FAIL(fuscoInternalError, kApi, "%s: unexpected exception", fn);
  }
  noteResult(comm, r);
  return r;
}

// Counts a call as in flight so fuscoCommAbort can wait for it to leave before freeing.
struct InFlight {
  explicit InFlight(fuscoComm_t c) : comm(c) { comm->impl->activeCalls++; }
  ~InFlight() { comm->impl->activeCalls--; }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  fuscoComm_t comm;
};

// An argument problem found on this rank. It is recorded in the engine Op and reported after
// the call's first exchange, so peers learn about it instead of waiting.
struct ArgCheck {
  fuscoResult_t status = fuscoSuccess;
  std::string message;
  void fail(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    if (status != fuscoSuccess) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    status = fuscoInvalidArgument;
    message = buf;
  }
};

// Element size of a datatype, or 0 if it is not one.
size_t dataTypeSize(fuscoDataType_t t);

}  // namespace fusco
