// Which memory a perf binary moves data in (--mem host | cuda | auto), and for CUDA: each rank's
// device, its stream, its fuscoMemCuda communicator and its device buffers.
//
// A CUDA rank keeps the host communicator made from the launcher's id as its "control" comm
// (barriers, the header, the results: host buffers, no stream) and adds a "data" comm with
// config.memType = fuscoMemCuda, whose id rank 0 makes and sends over the control comm. Only the
// measured calls use the data comm, so no barrier ever sits in the stream being timed.
//
// CUDA is never initialised in a process that forks ranks afterwards (a child cannot use its
// parent's CUDA state): resolveMemMode asks a short-lived child process how many devices there are,
// and each rank picks its own device after the fork.
//
// No CUDA header is needed here (a stream travels as void*). In a build without CUDA
// (FUSCO_PERF_CUDA undefined) this still compiles: resolveMemMode refuses --mem cuda with a clear
// message and the CUDA functions fail with "built without CUDA".
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "fusco.h"

namespace fusco {
namespace perf {

enum class MemMode { Host, Cuda, Auto };

// "host", "cuda" or "auto"; false (and *out untouched) on anything else.
bool parseMemMode(const char* v, MemMode* out);
const char* memModeName(MemMode m);

// Turns Auto into Cuda (a device is present in a CUDA build) or Host, and checks Cuda. Returns 0
// with *mode resolved, or prints why `prog --mem cuda` cannot run (no CUDA in this build, no
// device, a driver error) to stderr and returns 2. Safe before forking: CUDA is initialised only
// in a child process that exits at once.
int resolveMemMode(const char* prog, MemMode* mode);

// How many CUDA devices this process sees, asked of a short-lived child process as
// resolveMemMode does (so it is safe before forking; the answer is kept for later calls). 0 in a
// build without CUDA; -1 with *why when the probe failed.
int visibleDeviceCount(std::string* why);

// Device buffers (-a): 0 cudaMalloc (the library stages them), 1 fuscoMemAlloc (peers write them
// directly), 2 cudaMalloc + fuscoCommRegister (the same one-copy path for a caller's buffer).
enum class BufferKind { Plain = 0, Arena = 1, Registered = 2 };
const char* bufferKindText(BufferKind k);

// One rank's CUDA side. Destroys its comm and stream; buffers made on the comm must go first.
struct CudaRank {
  int device = -1;  // cudaSetDevice'd by cudaRankInit
  int deviceCount = 0;
  std::string gpuName;         // cudaGetDeviceProperties(device).name
  void* stream = nullptr;      // cudaStream_t, non-blocking
  fuscoComm_t comm = nullptr;  // the fuscoMemCuda data comm
  int maxSms = 0;              // set before cudaRankInit: the data comm's SM budget (0: all)
  CudaRank() = default;
  CudaRank(const CudaRank&) = delete;
  CudaRank& operator=(const CudaRank&) = delete;
  ~CudaRank();
};

// Collective over control (every rank calls it): device localRank % deviceCount (= rank % count
// for forked ranks), a non-blocking stream, then the data comm. When any rank fails before the
// comm init every rank returns false; *err names what failed (and which rank).
bool cudaRankInit(fuscoComm_t control, int rank, int nranks, CudaRank* out, std::string* err);

// Device allocations of one kind on one data comm, freed (and deregistered) by the destructor.
class DeviceBuffers {
 public:
  DeviceBuffers(fuscoComm_t comm, BufferKind kind) : comm_(comm), kind_(kind) {}
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  ~DeviceBuffers();
  // At least 64 bytes; nullptr with *err on failure.
  void* alloc(size_t bytes, std::string* err);

 private:
  struct Buffer {
    void* ptr;
    void* handle;  // fuscoCommRegister's, Registered only
  };
  fuscoComm_t comm_;
  BufferKind kind_;
  std::vector<Buffer> bufs_;
};

// Stream-ordered copy (cudaMemcpyDefault: any direction) or byte fill, then a wait for the
// stream; false with *err.
bool cudaCopySync(void* dst, const void* src, size_t bytes, void* stream, std::string* err);
bool cudaFillSync(void* dst, int byte, size_t bytes, void* stream, std::string* err);
// cudaStreamSynchronize; false with *err (naming what) on an error.
bool cudaSyncStream(void* stream, const char* what, std::string* err);

}  // namespace perf
}  // namespace fusco
