// DeviceBuffer (src/device/cuda_rt.h), the pinned host side and device side of a MoE plan's lists:
// with two host halves, reserve() hands out the half the last upload did not read, so it returns
// while that upload is still behind busy stream work, and what is written there meanwhile never
// reaches the earlier upload; the half after that waits for its own last upload. With one half,
// reserve() waits for the last upload.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "device/cuda_rt.h"
#include "gpu/gpu_harness.h"
#include "gpu/gpu_kernels.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::nowSec;
using namespace fusco::test::gpu;

constexpr size_t kBytes = 4096;
constexpr int64_t kTimeoutMs = 10000;

// Fills the host side with `value`, uploads it on `st` and copies the device side into `check`
// behind it, so that `check` holds what that upload carried.
void uploadAndKeep(fusco::DeviceBuffer& b, int value, cudaStream_t st, void* check) {
  std::memset(b.host(), value, kBytes);
  ASSERT_EQ(b.upload(kBytes, st), fuscoSuccess);
  CUDA_ASSERT_OK(cudaMemcpyAsync(check, b.device(), kBytes, cudaMemcpyDeviceToDevice, st));
}

std::vector<uint8_t> download(const void* dev) {
  std::vector<uint8_t> v(kBytes);
  EXPECT_EQ(cudaMemcpy(v.data(), dev, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

TEST(GpuDeviceBuffer, TwoHalvesDoNotWaitForTheLastUpload) {
  FUSCO_GPU_REQUIRE();
  CUDA_ASSERT_OK(cudaSetDevice(0));
  Stream stream;
  const cudaStream_t st = stream.get();
  void* check[2] = {nullptr, nullptr};
  for (void*& c : check) CUDA_ASSERT_OK(cudaMalloc(&c, kBytes));
  {
    fusco::DeviceBuffer b(2);
    ASSERT_EQ(b.reserve(kBytes, kTimeoutMs), fuscoSuccess);
    char* const first = b.host();
    ASSERT_EQ(b.half(), 0);
    CUDA_ASSERT_OK(spinAsync(st, 1.0));
    ASSERT_NO_FATAL_FAILURE(uploadAndKeep(b, 0x11, st, check[0]));  // behind the spin
    const double t0 = nowSec();
    ASSERT_EQ(b.reserve(kBytes, kTimeoutMs), fuscoSuccess);
    EXPECT_LT(nowSec() - t0, 0.5) << "the other half waited for the last upload";
    EXPECT_EQ(b.half(), 1);
    EXPECT_EQ(b.host(), first + b.capacity()) << "the other half";
    EXPECT_EQ(b.hostBase(), first);
    ASSERT_NO_FATAL_FAILURE(uploadAndKeep(b, 0x22, st, check[1]));  // the first still pending
    ASSERT_EQ(b.reserve(kBytes, kTimeoutMs), fuscoSuccess);
    EXPECT_EQ(b.host(), first) << "the first half again";
    std::memset(b.host(), 0x55, kBytes);  // its upload has run: this reaches no check
    CUDA_ASSERT_OK(cudaStreamSynchronize(st));
    EXPECT_EQ(download(check[0]), std::vector<uint8_t>(kBytes, 0x11)) << "the first upload";
    EXPECT_EQ(download(check[1]), std::vector<uint8_t>(kBytes, 0x22)) << "the second upload";
  }
  for (void* c : check) CUDA_EXPECT_OK(cudaFree(c));
}

TEST(GpuDeviceBuffer, OneHalfWaitsForTheLastUpload) {
  FUSCO_GPU_REQUIRE();
  CUDA_ASSERT_OK(cudaSetDevice(0));
  Stream stream;
  const cudaStream_t st = stream.get();
  void* check = nullptr;
  CUDA_ASSERT_OK(cudaMalloc(&check, kBytes));
  {
    fusco::DeviceBuffer b;
    ASSERT_EQ(b.reserve(kBytes, kTimeoutMs), fuscoSuccess);
    char* const first = b.host();
    CUDA_ASSERT_OK(spinAsync(st, 0.3));
    ASSERT_NO_FATAL_FAILURE(uploadAndKeep(b, 0x33, st, check));
    ASSERT_EQ(b.reserve(kBytes, kTimeoutMs), fuscoSuccess);
    EXPECT_EQ(b.host(), first);
    std::memset(b.host(), 0x44, kBytes);  // the upload has run: this reaches no check
    CUDA_ASSERT_OK(cudaStreamSynchronize(st));
    EXPECT_EQ(download(check), std::vector<uint8_t>(kBytes, 0x33));
  }
  CUDA_EXPECT_OK(cudaFree(check));
}

}  // namespace
