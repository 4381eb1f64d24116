// Every kernel the library launches is loaded when a process first makes a CUDA communicator
// (docs/DESIGN.md, "The CUDA rules"). Under CUDA's lazy module loading (the default since 12.2)
// the first launch of a kernel, or the first attribute or occupancy query on it, loads its module,
// and a load waits for the context's work. Once an operation has enqueued a wait that only a host
// thread releases, such a load deadlocks the process. So, as NCCL's device init does, every kernel
// is loaded here (cudaFuncGetAttributes on each), its launch geometry is computed and cached, and
// the stack limit is raised to the largest need; no launch site queries the runtime afterwards.
// No CUDA headers here.
#pragma once

#include "fusco.h"

namespace fusco {

// Loads every kernel of the library on `device` (made current for the calling thread) and caches
// each kernel's resident blocks per multiprocessor and the device's multiprocessors. Setup face:
// it may wait for the device, so it runs at communicator init, before any operation is enqueued.
// Idempotent per device; thread-safe.
fuscoResult_t deviceLoadKernels(int device);
// Whether deviceLoadKernels ran on the calling thread's current device.
bool deviceKernelsLoaded();
// deviceLoadKernels on the calling thread's current device unless it ran there: what a kernel
// used without a communicator (the GPU planner's steps alone) calls before its first launch.
fuscoResult_t deviceLoadKernelsHere();
// `ranks` ranks (processes) share `device`, as the device UUIDs exchanged at a communicator's init
// tell: every kernel grid of this process on it is capped at 1/ranks of its multiprocessors (and
// FUSCO_CUDA_SMS), so the co-located ranks' spinning grids fit on the GPU together. The largest
// share a communicator of the process reported holds. Thread-safe.
void deviceSetShare(int device, int ranks);
// A communicator's SM budget (fuscoConfig_t.maxSms > 0) on `device`: every kernel grid of this
// process on it takes at most `sms` multiprocessors; the smallest budget set holds. A budget
// replaces FUSCO_CUDA_SMS, and never lifts the share of a GPU that several ranks use. Thread-safe.
void deviceSetBudget(int device, int sms);

}  // namespace fusco
