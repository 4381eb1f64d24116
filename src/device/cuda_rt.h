// The CUDA runtime as the CUDA path uses it, behind plain C++ (no CUDA headers here): device
// selection, pointer checks, stream-ordered flag writes and waits, copies and device buffers.
// Stream arguments are cudaStream_t values passed as void*. In a build without the CUDA toolkit
// every call fails with fuscoInvalidUsage and says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fusco.h"

namespace fusco {

// True when this build has the CUDA path.
bool cudaBuilt();
// Selects `requested` (or the calling thread's current device when < 0) for this thread and
// returns it. fuscoUnhandledCudaError with the runtime's message when no driver or device is there.
fuscoResult_t cudaUseDevice(int requested, int* device);
// Makes `device` current for this thread (every CUDA call of a comm runs on its device).
fuscoResult_t cudaSetCurrent(int device);
// Whether p is device memory or managed memory (false for host memory and unknown pointers).
bool cudaIsDevicePointer(const void* p);

// Stream-ordered 32-bit flag operations on memory the device can reach (DeviceFlags), in order
// and in one driver call: write `value` after all prior work of the stream, or wait until
// (int32)(*flag - value) >= 0.
struct StreamFlagOp {
  void* devAddr;
  uint32_t value;
  bool wait;
};
fuscoResult_t cudaStreamFlags(void* stream, const std::vector<StreamFlagOp>& ops);

// The CUDA allocation holding p: its base and size (fuscoInvalidArgument if p is not in one).
fuscoResult_t cudaAllocationRange(const void* p, void** base, size_t* bytes);
// Plain device memory (cudaMalloc / cudaFree).
fuscoResult_t cudaAllocDevice(size_t bytes, void** ptr);
fuscoResult_t cudaFreeDevice(void* ptr);
// Copies bytes from device memory to host memory on `stream` and waits for it.
fuscoResult_t cudaCopyToHostSync(void* dst, const void* src, size_t bytes, void* stream);
// Copies bytes between any two buffers the device reaches (pinned host or device memory), on
// `stream` (stream-ordered, no host wait).
fuscoResult_t cudaCopyAsync(void* dst, const void* src, size_t bytes, void* stream);
// Copies between any two buffers and returns when done (setup only).
fuscoResult_t cudaCopySync(void* dst, const void* src, size_t bytes);
// Zeroes device memory and waits for it (setup only).
fuscoResult_t cudaZeroSync(void* ptr, size_t bytes);
// Pinned host memory the device reads and writes directly (mapped): *host for this process,
// *dev for kernels and stream memory operations. Safe to call while a stream of the process is
// being captured into a CUDA graph.
fuscoResult_t cudaAllocMapped(size_t bytes, void** host, void** dev);
void cudaFreeMapped(void* host);
// Whether `stream` is being captured into a CUDA graph now.
fuscoResult_t cudaStreamCapturing(void* stream, bool* capturing);
// Lets the calling thread allocate and free while another thread captures a stream (the CUDA
// path's progress thread; cudaThreadExchangeStreamCaptureMode, relaxed).
void cudaRelaxCaptureOnThisThread();
// The same for one scope (the previous mode comes back at its end): allocations a call makes for a
// graph while its own stream is being captured.
class CudaRelaxedCapture {
 public:
  CudaRelaxedCapture();
  ~CudaRelaxedCapture();
  CudaRelaxedCapture(const CudaRelaxedCapture&) = delete;
  CudaRelaxedCapture& operator=(const CudaRelaxedCapture&) = delete;

 private:
  int mode_;
};
// Waits for all work of the current device (teardown only).
void cudaDeviceSyncQuiet();

// A point in a stream the host can ask about without waiting (cudaEventDisableTiming).
class StreamEvent {
 public:
  StreamEvent() = default;
  ~StreamEvent();
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  fuscoResult_t record(void* stream);
  // *done: everything before the last record() has run (true when never recorded).
  fuscoResult_t query(bool* done) const;
  // Waits on the host until the last record() ran (at once when never recorded), polling: past
  // timeoutMs it is fuscoTimeout naming `what`; `alive` (may be empty), called every aliveEveryMs,
  // ends the wait with its error (a broken comm, a dead peer).
  fuscoResult_t waitWithin(int64_t timeoutMs, const char* what,
                           const std::function<fuscoResult_t()>& alive = nullptr,
                           int64_t aliveEveryMs = 0) const;
  // `stream` waits for the last record() (nothing when never recorded).
  fuscoResult_t waitOn(void* stream) const;

 private:
  void* event_ = nullptr;
  bool recorded_ = false;
};

// Device memory owned by one object, grown on demand (contents not kept), with a pinned host
// mirror for stream-ordered uploads: fill host(), then upload() enqueues the copy and records an
// event that later streams wait on (waitUploaded). The contents may be uploaded again while work
// that reads the device side is still enqueued: markUsed(stream) after each such use records it
// (an event per stream), the next upload waits for every recorded use on its own stream first,
// and reserve() waits on the host, up to timeoutMs, for the previous upload's copy (before the
// host side is written again) and, when it grows, for every recorded use (before the old device
// memory is freed).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // Makes room for `bytes` on both sides; the host side is safe to write on success.
  fuscoResult_t reserve(size_t bytes, int64_t timeoutMs);
  char* host() const { return host_; }
  char* device() const { return dev_; }
  size_t capacity() const { return cap_; }
  fuscoResult_t upload(size_t bytes, void* stream);
  fuscoResult_t waitUploaded(void* stream);
  // Work enqueued on `stream` so far may read the device side. Nothing is recorded while the
  // stream is captured into a CUDA graph: a graph's replays are ordered by whoever launches them.
  fuscoResult_t markUsed(void* stream);

 private:
  fuscoResult_t waitUsesOn(void* stream);
  char* host_ = nullptr;
  char* dev_ = nullptr;
  size_t cap_ = 0;
  void* event_ = nullptr;
  // The recorded uses since the last upload: uses_ streams and their events (kept for reuse).
  std::vector<void*> useStreams_, useEvents_;
  size_t uses_ = 0;
};

}  // namespace fusco
