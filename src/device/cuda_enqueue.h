// The enqueue face of the CUDA runtime as the CUDA path uses it (docs/DESIGN.md, "The CUDA
// rules"): calls that never wait for the device (kernel launches, asynchronous copies,
// events, queries), the only ones the code after an operation's first wait may make: the rest of
// an enqueue, the progress thread and the network bridge see this header alone, and a file
// compiled with FUSCO_ENQUEUE_FACE (CMakeLists.txt) fails to compile if it includes the setup face
// (device/cuda_rt.h). No CUDA headers here; stream arguments are cudaStream_t values as void*.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "fusco.h"

namespace fusco {

// True when this build has the CUDA path.
bool cudaBuilt();

// Makes `device` current for this thread (every CUDA call of a comm runs on its device).
fuscoResult_t cudaSetCurrent(int device);

// Whether p is device memory or managed memory (false for host memory and unknown pointers).
bool cudaIsDevicePointer(const void* p);

// The CUDA allocation holding p: its base and size (fuscoInvalidArgument if p is not in one).
fuscoResult_t cudaAllocationRange(const void* p, void** base, size_t* bytes);

// Copies bytes between any two buffers the device reaches (pinned host or device memory), on
// `stream` (stream-ordered, no host wait).
fuscoResult_t cudaCopyAsync(void* dst, const void* src, size_t bytes, void* stream);

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

}  // namespace fusco
