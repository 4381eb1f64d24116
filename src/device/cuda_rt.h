// The CUDA runtime as the CUDA path uses it, behind plain C++ (no CUDA headers here). This header
// is the setup face (docs/DESIGN.md, "The CUDA rules"): calls that may wait for the device
// (device selection, allocation and free, synchronous copies, synchronization, device buffers),
// legal only where nothing of the process can wait (init, registration, planning, destroy, a
// caller's thread before its operation's first wait, each checked by the guard); it includes the
// enqueue face (device/cuda_enqueue.h). Stream arguments are cudaStream_t values passed as void*.
// In a build without the CUDA toolkit every call fails with fuscoInvalidUsage and says so.
#pragma once

#ifdef FUSCO_ENQUEUE_FACE
#error "the setup face of the CUDA runtime after a first wait: include cuda_enqueue.h only"
#endif

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "device/cuda_enqueue.h"
#include "fusco.h"

namespace fusco {

// Selects `requested` (or the calling thread's current device when < 0) for this thread and
// returns it. fuscoUnhandledCudaError with the runtime's message when no driver or device is there.
fuscoResult_t cudaUseDevice(int requested, int* device);
// The device's UUID as 32 hex digits: equal on two ranks exactly when they share one GPU.
fuscoResult_t cudaDeviceIdentity(int device, std::string* uuid);
// Plain device memory (cudaMalloc / cudaFree).
fuscoResult_t cudaAllocDevice(size_t bytes, void** ptr);
fuscoResult_t cudaFreeDevice(void* ptr);
// Copies bytes from device memory to host memory on `stream` and waits for it.
fuscoResult_t cudaCopyToHostSync(void* dst, const void* src, size_t bytes, void* stream);
// Copies between any two buffers and returns when done (setup only).
fuscoResult_t cudaCopySync(void* dst, const void* src, size_t bytes);
// Zeroes device memory and waits for it (setup only).
fuscoResult_t cudaZeroSync(void* ptr, size_t bytes);
// Pinned host memory the device reads and writes directly (mapped): *host for this process,
// *dev for kernels and stream memory operations. Safe to call while a stream of the process is
// being captured into a CUDA graph.
fuscoResult_t cudaAllocMapped(size_t bytes, void** host, void** dev);
void cudaFreeMapped(void* host);
// Waits for all work of the current device (teardown only).
void cudaDeviceSyncQuiet();

// Device memory owned by one object, grown on demand (contents not kept), with a pinned host
// mirror for stream-ordered uploads: fill host(), then upload() enqueues the copy and records an
// event that later streams wait on (waitUploaded). The contents may be uploaded again while work
// that reads the device side is still enqueued: markUsed(stream) after each such use records it
// (an event per stream), the next upload waits for every recorded use on its own stream first,
// and reserve() waits on the host, up to timeoutMs, for the last upload from the host side it
// hands out (before that side is written again) and, when it grows, for every recorded use
// (before the old device memory is freed).
//
// With two host halves, each reserve() hands out the other half, so it waits only for the upload
// before last: a plan can be written while the previous one's upload (and the summary it reads
// back into its half) is still behind busy stream work (docs/DESIGN.md, "Capacity mode").
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int hostHalves = 1) : halves_(hostHalves == 2 ? 2 : 1) {}
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // Makes room for `bytes` on both sides; the host side is safe to write on success.
  fuscoResult_t reserve(size_t bytes, int64_t timeoutMs);
  char* host() const { return host_ == nullptr ? nullptr : host_ + half_ * cap_; }
  // Which host half host() is (0 with one half), and where the host halves begin.
  int half() const { return half_; }
  char* hostBase() const { return host_; }
  char* device() const { return dev_; }
  size_t capacity() const { return cap_; }
  fuscoResult_t upload(size_t bytes, void* stream);
  fuscoResult_t waitUploaded(void* stream);
  // Work enqueued on `stream` so far may read the device side. Nothing is recorded while the
  // stream is captured into a CUDA graph: a graph's replays are ordered by whoever launches them.
  fuscoResult_t markUsed(void* stream);

 private:
  fuscoResult_t grow(size_t bytes, int64_t timeoutMs);
  fuscoResult_t waitUsesOn(void* stream);
  int halves_ = 1, half_ = 0;
  char* host_ = nullptr;
  char* dev_ = nullptr;
  size_t cap_ = 0;
  void* events_[2] = {nullptr, nullptr};  // each host half's last upload
  // The recorded uses since the last upload: uses_ streams and their events (kept for reuse).
  std::vector<void*> useStreams_, useEvents_;
  size_t uses_ = 0;
};

}  // namespace fusco
