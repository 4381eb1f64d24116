// The objects the library has handed out and not destroyed yet, by kind, so that every entry
// point can refuse a pointer it did not make or has freed (docs/API.md, "Conventions"). Each
// registration gets a serial number that is never reused: an object made later at the same
// address is not taken for the one an older handle remembers. Thread-safe.
#pragma once

#include <cstdint>

namespace fusco {

enum class LiveKind { Comm, MoeHandle, Layout, LowLatency };

// Registers obj as live under kind; returns its serial number (never 0, never reused).
uint64_t registerLive(LiveKind kind, const void* obj);
// Removes obj; false when it was not live (destroyed already, or never made).
bool unregisterLive(LiveKind kind, const void* obj);
// Whether obj is live under kind (a layout passed where a MoE handle is expected is not).
bool isLive(LiveKind kind, const void* obj);
// The serial number obj was registered with, or 0 when it is not live.
uint64_t liveSerial(LiveKind kind, const void* obj);
// Calls fn(arg) under the registry's lock when obj is live, so obj cannot be unregistered (and
// freed) before fn returns; false, without calling fn, otherwise.
bool whileLive(LiveKind kind, const void* obj, void (*fn)(void* arg), void* arg);

}  // namespace fusco
