// Is a process on this host still alive? A zombie (exited, not yet reaped) counts as dead, and a
// recorded start time guards against a recycled pid.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace fusco {

// Start time of pid in clock ticks since boot (0 if unknown).
uint64_t processStartTime(pid_t pid);
bool processAlive(pid_t pid, uint64_t startTime);

}  // namespace fusco
