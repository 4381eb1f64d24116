// Helpers for the [gpu] suites: CUDA communicators (fuscoMemCuda) whose rank processes, forked by
// harness/mp_harness.h, share one GPU. Host-only header (no nvcc needed).
//
// Fork safety: the test process itself never touches CUDA. Whether a device is present is asked in
// a short-lived forked child (gpuProbe), so the rank processes forked later start with a clean,
// uninitialised CUDA runtime and each makes its own context on device 0.
//
// Buffers: every data call of a CUDA comm takes device pointers; a DevBuf is one of the three kinds
// the API accepts (plain cudaMalloc, fuscoMemAlloc from the comm, cudaMalloc registered with
// fuscoCommRegister). Results are copied back with cudaMemcpy after cudaStreamSynchronize and
// compared on the host with the same checkers the [mp] suites use.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fusco.h"
#include "harness/data_gen.h"
#include "harness/mp_harness.h"

namespace fusco::test::gpu {

// What a forked child found (cached in the test process after the first call).
struct GpuProbe {
  int count = 0;    // visible CUDA devices
  int ccMajor = 0;  // compute capability of device 0
  int ccMinor = 0;
  std::string name;  // device 0
  std::string why;   // why there is no usable device (empty when count > 0 and cc >= 9.0)
};
const GpuProbe& gpuProbe();

// Empty when the [gpu] suites can run here, else the reason to skip.
std::string gpuSkipReason();

// First statement of every [gpu] test: skips (GTEST_SKIP with the reason) where no usable CUDA
// device is present. With FUSCO_TEST_REQUIRE_GPU=1 in the environment a missing device is a
// failure instead, so a GPU machine cannot pass by skipping everything.
#define FUSCO_GPU_REQUIRE()                                                 \
  do {                                                                      \
    const std::string fusco_gpu_why_ = ::fusco::test::gpu::gpuSkipReason(); \
    if (!fusco_gpu_why_.empty()) {                                          \
      if (::fusco::test::gpu::gpuRequired())                                \
        FAIL() << "FUSCO_TEST_REQUIRE_GPU=1 but " << fusco_gpu_why_;        \
      GTEST_SKIP() << fusco_gpu_why_;                                       \
    }                                                                       \
  } while (0)
bool gpuRequired();

#define CUDA_EXPECT_OK(call)                                                                  \
  do {                                                                                        \
    cudaError_t fusco_gpu_e_ = (call);                                                        \
    EXPECT_EQ(fusco_gpu_e_, cudaSuccess) << #call << " -> " << cudaGetErrorName(fusco_gpu_e_) \
                                         << ": " << cudaGetErrorString(fusco_gpu_e_);         \
  } while (0)
#define CUDA_ASSERT_OK(call)                                                                  \
  do {                                                                                        \
    cudaError_t fusco_gpu_e_ = (call);                                                        \
    ASSERT_EQ(fusco_gpu_e_, cudaSuccess) << #call << " -> " << cudaGetErrorName(fusco_gpu_e_) \
                                         << ": " << cudaGetErrorString(fusco_gpu_e_);         \
  } while (0)

// A CUDA comm on device 0 spanning one node (localSize = nranks, so FUSCO_LOCAL_SIZE in the
// environment cannot split it).
fuscoConfig_t gpuConfig(int nranks, int timeoutMs = 30000);

// Selects device 0 in this rank process and inits a CUDA comm (gpuConfig unless config is given).
// On failure records a fatal failure with the result and last error and ends the rank's body
// (as harness initComm does).
fuscoComm_t initGpuComm(const RankCtx& ctx, const fuscoConfig_t* config = nullptr);

// MpOptions for [gpu] tests: a longer rank timeout (8 contexts on one GPU take a while to make).
MpOptions gpuOptions(int timeoutSec = 120);

// gtest parameter names for rank counts: "2ranks", "4ranks", ...
using fusco::test::ranksName;

// Poisoned bytes past the end of every checked output buffer; they must stay poison.
constexpr size_t kTailBytes = 64;

enum class Mem { Cuda, Arena, Registered };
const char* memName(Mem m);
inline const std::vector<Mem> kAllMems = {Mem::Cuda, Mem::Arena, Mem::Registered};

// Device memory of one kind; freed (and deregistered) in the destructor, which must run before the
// comm is destroyed. bytes 0 allocates 1 byte so get() is never NULL.
class DevBuf {
 public:
  DevBuf() = default;
  DevBuf(fuscoComm_t comm, size_t bytes, Mem kind = Mem::Cuda);
  ~DevBuf();
  DevBuf(DevBuf&& o) noexcept;
  DevBuf& operator=(DevBuf&& o) noexcept;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;

  void* get() const { return ptr_; }
  uint8_t* bytes() const { return static_cast<uint8_t*>(ptr_); }
  size_t size() const { return bytes_; }
  bool ok() const { return ptr_ != nullptr; }

  // Synchronous copies (cudaMemcpy); record failures.
  void upload(const void* host, size_t n, size_t offset = 0);
  void upload(const std::vector<uint8_t>& host) { upload(host.data(), host.size()); }
  std::vector<uint8_t> download(size_t n, size_t offset = 0) const;
  std::vector<uint8_t> download() const { return download(bytes_); }
  // Every byte := kPoison (0xA5), cudaMemset; on `stream` (async) when given.
  void poison(cudaStream_t stream = nullptr, bool async = false);

 private:
  void release();
  fuscoComm_t comm_ = nullptr;
  Mem kind_ = Mem::Cuda;
  void* ptr_ = nullptr;
  void* handle_ = nullptr;
  size_t bytes_ = 0;
};

// A device copy of a host vector (plain cudaMalloc); NULL for an empty vector.
template <class T>
DevBuf toDevice(fuscoComm_t comm, const std::vector<T>& v) {
  if (v.empty()) return DevBuf();
  DevBuf b(comm, v.size() * sizeof(T));
  b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

// A non-blocking stream; destroyed in the destructor.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void* api() const { return static_cast<void*>(s_); }

 private:
  cudaStream_t s_ = nullptr;
};

// What a [gpu] test runs in each rank process: the rank's CUDA comm and, for
// runGpuRanksOnStream, a non-blocking stream of its own.
using GpuRankBody = std::function<void(const RankCtx& ctx, fuscoComm_t comm)>;
using GpuStreamRankBody =
    std::function<void(const RankCtx& ctx, fuscoComm_t comm, const Stream& stream)>;

// runRanks(n, ..., gpuOptions()) where each rank inits a CUDA comm (initGpuComm: gpuConfig(n)
// unless config is given), runs body, then destroys the comm (checked). A fatal failure
// (ASSERT_*) in body ends the rank without destroying the comm, as a return from a plain runRanks
// body does: the destroy could wait up to timeoutMs for streams still waiting on peers.
void runGpuRanks(int n, const GpuRankBody& body, const fuscoConfig_t* config = nullptr);

// runGpuRanks with a Stream made after the comm and destroyed after body (so after body's
// buffers) and before the comm.
void runGpuRanksOnStream(int n, const GpuStreamRankBody& body,
                         const fuscoConfig_t* config = nullptr);

// A device buffer of `bytes` with every byte kPoison: an output a test checks.
DevBuf poisonedBuf(fuscoComm_t comm, size_t bytes, Mem kind = Mem::Cuda);

// The send buffer of layout l on the device: fillSend(l, seed), l.sendElems * l.esize bytes.
DevBuf sendBufFor(fuscoComm_t comm, const A2avLayout& l, uint64_t seed, Mem kind = Mem::Cuda);

// Waits for `stream` by polling cudaStreamQuery until it completes or `seconds` pass (so a test
// never blocks forever on a stream a dead peer stalled). Returns cudaSuccess, the stream's error,
// or cudaErrorNotReady on the deadline.
cudaError_t syncWithin(cudaStream_t stream, double seconds);

// A failed cudaStreamSynchronize after `what`, for messages: names the error and says that a
// kernel fault leaves the rank's CUDA context unusable (later failures in the rank follow from it).
std::string streamSyncFailure(cudaError_t e, const std::string& what);

// cudaPointerGetAttributes says `p` is device (or managed) memory of device 0.
bool isDevicePointer(const void* p);

// One fuscoAllToAll (uniform; l contiguous with equal counts) or fuscoAllToAllv with layout l
// (harness/data_gen.h) on device buffers of the given kinds: send filled, recv poisoned plus a
// poisoned tail; after cudaStreamSynchronize every block bit-exact, every gap and the tail poison.
::testing::AssertionResult gpuAllToAllChecked(fuscoComm_t comm, const A2avLayout& l,
                                              fuscoDataType_t dt, uint64_t seed, Mem sendKind,
                                              Mem recvKind, bool uniform, cudaStream_t stream);

using fusco::test::namesRank;

}  // namespace fusco::test::gpu
