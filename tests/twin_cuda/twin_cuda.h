// The twin CUDA runtime's own C++ API (tests/twin_cuda/README.md): what the host twin of a kernel
// uses to put itself on a stream, and what a test harness reads back.
//
// libfusco_twin_cudart implements the CUDA runtime's C ABI on CPU threads. A program compiled
// against the toolkit's headers links it instead of cudart; its kernels are host functions
// registered here, launched either through cudaLaunchKernelExC (a registered ExLauncher) or
// directly through twincuda::launch with the byte ranges they touch, so every access is checked
// against the memory this process may touch (T3).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace twincuda {

// A byte range a kernel reads or writes.
struct Range {
  const void* ptr = nullptr;
  size_t bytes = 0;
};

// Launches a registered kernel from cudaLaunchKernelExC's arguments (the kernel's parameters, as
// the CUDA runtime passes them): the launcher copies what it needs and calls twincuda::launch.
using ExLauncher = cudaError_t (*)(const cudaLaunchConfig_t* config, void** args);

// Registers a kernel of the twin. [in] fn: its identity (the address cudaFuncGetAttributes,
// cudaOccupancyMaxActiveBlocksPerMultiprocessor and cudaLaunchKernelExC take); [in] name: named in
// messages; [in] ex: optional, for cudaLaunchKernelExC. Registering twice keeps the first name.
void registerKernel(const void* fn, const char* name, ExLauncher ex = nullptr);

// One kernel launch: the body runs on a CPU thread when the stream reaches it, after its ranges
// are checked (a miss is an illegal address: the body does not run).
struct Launch {
  const void* kernel = nullptr;  // registered identity
  cudaStream_t stream = nullptr;
  std::vector<Range> reads;
  std::vector<Range> writes;
  std::function<void()> body;
  std::string what;  // shown in messages after the kernel's name (optional)
  // The grid, for the multiprocessors it occupies (T7). 0 blocks / 0 threads: those of the
  // cudaLaunchKernelExC or cudaLaunchCooperativeKernel call this launch is made from, else one
  // block, and one block per multiprocessor. A cooperative launch (also one made from a call with
  // cudaLaunchAttributeCooperative) is resident whole before its body starts; one larger than the
  // device is refused with cudaErrorCooperativeLaunchTooLarge.
  uint64_t blocks = 0;
  unsigned threads = 0;
  bool cooperative = false;
};

// Enqueues a launch; returns once it is enqueued (or recorded, under stream capture), as a kernel
// launch does. Refuses (cudaErrorInvalidDeviceFunction, with a message naming it) a kernel that
// is not registered, or not loaded under FUSCO_TWIN_LAZY_LOADING=1 (the default).
cudaError_t launch(Launch l);

// Inside a launch's body: an access the kernel decides on only when it runs (addresses read from
// memory the host fills after the launch: a deferred copy's tasks, a sum's bases). It is checked
// as a range given at launch would be (a miss is printed, counted and sticky); the body must stop
// touching memory once it returns false.
bool checkAccess(const void* ptr, size_t bytes, bool write, const char* what);

// Counters a harness fails a test on.
uint64_t illegalAddressCount();  // T3 misses (each also printed)
uint64_t syncLimitCount();       // setup calls that waited past FUSCO_TWIN_SYNC_LIMIT_MS (T4)
uint64_t refusedLaunchCount();   // launches of kernels never loaded (T4)
uint64_t revokedMappingCount();  // IPC mappings taken away because their owner exited (T5)

// The device's multiprocessors (T7): a pool of FUSCO_TWIN_SMS (default 132) shared by every
// process of this user on this machine (or of the pool named by FUSCO_TWIN_SM_POOL).
uint32_t smsHeldByProcess();  // held now by this process's running kernels
uint32_t smsHeldOnDevice();   // held now by every live process sharing the pool
uint64_t smWaitCount();       // kernels of this process that waited at a queue's head for them
// The file holding the pool (in TMPDIR, else /tmp), for a harness to remove the pool it named.
std::string smPoolPath();

}  // namespace twincuda
