// The objects the library has handed out and not destroyed yet, by kind, so that every entry
// point can refuse a handle it did not make or has freed (docs/API.md, "Conventions"). A handle is
// a number, never the object's address and never reused: an object made later at the same address
// gets another handle, so a destroyed handle stays dead (as the NCCL shim's communicators do).
// Handles are opaque to callers and never dereferenced. Thread-safe.
#pragma once

#include <cstdint>

namespace fusco {

// Registration: a comm's registration handles (fuscoCommRegister), which the comm maps to their
// ranges itself; they take numbers from here (mintHandle) so that they are never reused either.
enum class LiveKind { Comm, MoeHandle, Layout, LowLatency, Registration };

// Registers obj as live under kind; returns the handle to give out for it (never NULL).
void* registerLive(LiveKind kind, void* obj);
// A new handle of kind that names no object here: for objects kept elsewhere (registrations).
void* mintHandle(LiveKind kind);
// Removes handle; returns its object, or nullptr when it was not live (destroyed already, or
// never made).
void* unregisterLive(LiveKind kind, const void* handle);
// The object behind a live handle of kind, or nullptr (a layout passed where a MoE handle is
// expected is not live as one).
void* liveObject(LiveKind kind, const void* handle);
inline bool isLive(LiveKind kind, const void* handle) {
  return liveObject(kind, handle) != nullptr;
}
// Calls fn(obj, arg) under the registry's lock when handle is live, so its object cannot be
// unregistered (and freed) before fn returns; false, without calling fn, otherwise.
bool whileLive(LiveKind kind, const void* handle, void (*fn)(void* obj, void* arg), void* arg);

}  // namespace fusco
