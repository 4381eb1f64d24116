#include "gpu/gpu_harness.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>

#include "harness/data_gen.h"
#include "harness/stack_dump.h"

namespace fusco::test::gpu {

namespace {

constexpr double kProbeSec = 60.0;  // first CUDA init on a cold machine can take a while

// In the forked child: one line "count major minor name" or "0 0 0 error text", then _exit.
[[noreturn]] void probeChild(int wfd) {
  std::ostringstream os;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    os << "0 0 0 cudaGetDeviceCount: " << cudaGetErrorName(e) << ": " << cudaGetErrorString(e);
  } else if (n <= 0) {
    os << "0 0 0 cudaGetDeviceCount found no device";
  } else {
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, 0);
    if (e != cudaSuccess)
      os << "0 0 0 cudaGetDeviceProperties(0): " << cudaGetErrorName(e) << ": "
         << cudaGetErrorString(e);
    else
      os << n << " " << prop.major << " " << prop.minor << " " << prop.name;
  }
  const std::string s = os.str();
  ssize_t w = write(wfd, s.data(), s.size());
  (void)w;
  close(wfd);
  _exit(0);
}

GpuProbe runProbe() {
  GpuProbe p;
  int fds[2];
  if (pipe(fds) != 0) {
    p.why = std::string("cannot probe for a CUDA device: pipe: ") + strerror(errno);
    return p;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    probeChild(fds[1]);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    p.why = std::string("cannot probe for a CUDA device: fork: ") + strerror(errno);
    return p;
  }
  std::string out;
  const double deadline = nowSec() + kProbeSec;
  bool eof = false;
  while (!eof && nowSec() < deadline) {
    pollfd pf{fds[0], POLLIN, 0};
    if (poll(&pf, 1, 100) <= 0) continue;
    char buf[512];
    ssize_t r = read(fds[0], buf, sizeof buf);
    if (r > 0)
      out.append(buf, static_cast<size_t>(r));
    else if (r == 0 || errno != EINTR)
      eof = true;
  }
  close(fds[0]);
  int status = 0;
  if (!eof) {
    printThreadStacks({pid}, {"the CUDA device probe, not finished within " +
                              std::to_string(static_cast<int>(kProbeSec)) + " s"});
    kill(pid, SIGKILL);
  }
  waitpid(pid, &status, 0);
  if (!eof) {
    p.why = "the CUDA device probe (cudaGetDeviceCount in a forked child) did not finish within " +
            std::to_string(static_cast<int>(kProbeSec)) + " s";
    return p;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    p.why = "the CUDA device probe (cudaGetDeviceCount in a forked child) crashed";
    return p;
  }
  std::istringstream is(out);
  is >> p.count >> p.ccMajor >> p.ccMinor;
  std::getline(is >> std::ws, p.name);
  if (p.count <= 0) {
    p.count = 0;
    p.why =
        "no CUDA device (" + (p.name.empty() ? std::string("probe said nothing") : p.name) + ")";
    p.name.clear();
  } else if (p.ccMajor < 9) {
    // The library and these tests are built for sm_90 (CMAKE_CUDA_ARCHITECTURES 90-real
    // 90-virtual).
    p.why = "CUDA device 0 (" + p.name + ") has compute capability " + std::to_string(p.ccMajor) +
            "." + std::to_string(p.ccMinor) + "; this build targets sm_90 and newer";
  }
  return p;
}

}  // namespace

const GpuProbe& gpuProbe() {
  static const GpuProbe p = runProbe();
  return p;
}

std::string gpuSkipReason() { return gpuProbe().why; }

bool gpuRequired() {
  const char* v = getenv("FUSCO_TEST_REQUIRE_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

fuscoConfig_t gpuConfig(int nranks, int timeoutMs) {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.memType = fuscoMemCuda;
  cfg.cudaDevice = 0;
  cfg.timeoutMs = timeoutMs;
  cfg.localSize = nranks;
  return cfg;
}

fuscoComm_t initGpuComm(const RankCtx& ctx, const fuscoConfig_t* config) {
  cudaError_t e = cudaSetDevice(0);
  if (e != cudaSuccess) {
    // initComm below would fail too; this names the CUDA side first.
    ADD_FAILURE() << "rank " << ctx.rank << ": cudaSetDevice(0) -> " << cudaGetErrorName(e) << ": "
                  << cudaGetErrorString(e);
  }
  fuscoConfig_t cfg = config != nullptr ? *config : gpuConfig(ctx.nranks);
  return initComm(ctx, &cfg);
}

MpOptions gpuOptions(int timeoutSec) {
  MpOptions o;
  o.timeoutSec = timeoutSec;
  return o;
}

void runGpuRanks(int n, const GpuRankBody& body, const fuscoConfig_t* config) {
  runRanks(
      n,
      [&](const RankCtx& ctx) {
        fuscoComm_t comm = initGpuComm(ctx, config);
        // An ASSERT_* in body ends the rank here without destroying its comm (a destroy could
        // wait for peers that the failure left behind); the harness ends the process.
        ASSERT_NO_FATAL_FAILURE(body(ctx, comm));
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      gpuOptions());
}

void runGpuRanksOnStream(int n, const GpuStreamRankBody& body, const fuscoConfig_t* config) {
  runGpuRanks(
      n,
      [&](const RankCtx& ctx, fuscoComm_t comm) {
        Stream stream;
        body(ctx, comm, stream);
      },
      config);
}

const char* memName(Mem m) {
  return m == Mem::Cuda ? "cudaMalloc" : m == Mem::Arena ? "fuscoMemAlloc" : "registered";
}

DevBuf::DevBuf(fuscoComm_t comm, size_t bytes, Mem kind) : comm_(comm), kind_(kind), bytes_(bytes) {
  const size_t alloc = bytes > 0 ? bytes : 1;
  if (kind == Mem::Arena) {
    fuscoResult_t r = fuscoMemAlloc(comm, &ptr_, alloc);
    EXPECT_EQ(r, fuscoSuccess) << "fuscoMemAlloc(" << alloc << ") on a CUDA comm -> "
                               << fuscoGetErrorString(r) << ": " << fuscoGetLastError(comm);
    if (r != fuscoSuccess) {
      ptr_ = nullptr;
      return;
    }
    EXPECT_TRUE(isDevicePointer(ptr_))
        << "fuscoMemAlloc on a CUDA comm returned " << ptr_ << ", which is not device memory";
    return;
  }
  cudaError_t e = cudaMalloc(&ptr_, alloc);
  EXPECT_EQ(e, cudaSuccess) << "cudaMalloc(" << alloc << "): " << cudaGetErrorString(e);
  if (e != cudaSuccess) {
    ptr_ = nullptr;
    return;
  }
  if (kind == Mem::Registered) {
    fuscoResult_t r = fuscoCommRegister(comm, ptr_, alloc, &handle_);
    EXPECT_EQ(r, fuscoSuccess) << "fuscoCommRegister(cudaMalloc'd " << alloc << " bytes) -> "
                               << fuscoGetErrorString(r) << ": " << fuscoGetLastError(comm);
    if (r != fuscoSuccess) handle_ = nullptr;
  }
}

DevBuf::~DevBuf() { release(); }

DevBuf::DevBuf(DevBuf&& o) noexcept { *this = std::move(o); }

DevBuf& DevBuf::operator=(DevBuf&& o) noexcept {
  if (this != &o) {
    release();
    comm_ = o.comm_;
    kind_ = o.kind_;
    ptr_ = std::exchange(o.ptr_, nullptr);
    handle_ = std::exchange(o.handle_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DevBuf::release() {
  if (ptr_ == nullptr) return;
  if (kind_ == Mem::Arena) {
    fuscoResult_t r = fuscoMemFree(comm_, ptr_);
    EXPECT_EQ(r, fuscoSuccess) << "fuscoMemFree: " << fuscoGetLastError(comm_);
  } else {
    if (handle_ != nullptr) {
      fuscoResult_t r = fuscoCommDeregister(comm_, handle_);
      EXPECT_EQ(r, fuscoSuccess) << "fuscoCommDeregister: " << fuscoGetLastError(comm_);
    }
    CUDA_EXPECT_OK(cudaFree(ptr_));
  }
  ptr_ = nullptr;
  handle_ = nullptr;
}

void DevBuf::upload(const void* host, size_t n, size_t offset) {
  if (n == 0) return;
  ASSERT_TRUE(ptr_ != nullptr && offset + n <= bytes_) << "upload past the buffer";
  CUDA_EXPECT_OK(cudaMemcpy(bytes() + offset, host, n, cudaMemcpyHostToDevice));
  // A pageable-memory cudaMemcpy may return before the DMA lands, and the library's streams need
  // not be ordered after the legacy stream: wait for it.
  CUDA_EXPECT_OK(cudaDeviceSynchronize());
}

std::vector<uint8_t> DevBuf::download(size_t n, size_t offset) const {
  std::vector<uint8_t> out(n);
  if (n == 0) return out;
  if (ptr_ == nullptr || offset + n > bytes_) {
    ADD_FAILURE() << "download past the buffer";
    return out;
  }
  CUDA_EXPECT_OK(cudaMemcpy(out.data(), bytes() + offset, n, cudaMemcpyDeviceToHost));
  return out;
}

void DevBuf::poison(cudaStream_t stream, bool async) {
  if (ptr_ == nullptr || bytes_ == 0) return;
  if (async) {
    CUDA_EXPECT_OK(cudaMemsetAsync(ptr_, kPoison, bytes_, stream));
  } else {
    CUDA_EXPECT_OK(cudaMemset(ptr_, kPoison, bytes_));
    CUDA_EXPECT_OK(cudaDeviceSynchronize());
  }
}

DevBuf poisonedBuf(fuscoComm_t comm, size_t bytes, Mem kind) {
  DevBuf b(comm, bytes, kind);
  b.poison();
  return b;
}

DevBuf sendBufFor(fuscoComm_t comm, const A2avLayout& l, uint64_t seed, Mem kind) {
  const size_t bytes = l.sendElems * l.esize;
  std::vector<uint8_t> host(std::max<size_t>(1, bytes));
  fusco::test::fillSend(l, host.data(), seed);
  DevBuf b(comm, bytes, kind);
  b.upload(host.data(), bytes);
  return b;
}

Stream::Stream() { CUDA_EXPECT_OK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }

Stream::~Stream() {
  if (s_ != nullptr) CUDA_EXPECT_OK(cudaStreamDestroy(s_));
}

cudaError_t syncWithin(cudaStream_t stream, double seconds) {
  const double deadline = nowSec() + seconds;
  for (;;) {
    cudaError_t e = cudaStreamQuery(stream);
    if (e != cudaErrorNotReady) return e;
    if (nowSec() > deadline) return cudaErrorNotReady;
    usleep(1000);
  }
}

std::string streamSyncFailure(cudaError_t e, const std::string& what) {
  std::string m = "cudaStreamSynchronize after " + what + ": " + cudaGetErrorName(e) + ": " +
                  cudaGetErrorString(e);
  if (cudaPeekAtLastError() != cudaSuccess || cudaStreamQuery(nullptr) == e)
    m += " (sticky: this rank's CUDA context is unusable from here on, later failures follow)";
  return m;
}

bool isDevicePointer(const void* p) {
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // not sticky, but do not leave it for the next check
    return false;
  }
  return (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) && a.device == 0;
}

::testing::AssertionResult gpuAllToAllChecked(fuscoComm_t comm, const A2avLayout& l,
                                              fuscoDataType_t dt, uint64_t seed, Mem sendKind,
                                              Mem recvKind, bool uniform, cudaStream_t stream) {
  const size_t sendBytes = l.sendElems * l.esize, recvBytes = l.recvElems * l.esize;
  std::vector<uint8_t> hs(std::max<size_t>(1, sendBytes));
  fusco::test::fillSend(l, hs.data(), seed);
  DevBuf send(comm, sendBytes, sendKind);
  DevBuf recv(comm, recvBytes + kTailBytes, recvKind);
  if (!send.ok() || !recv.ok()) return ::testing::AssertionFailure() << "allocation failed";
  send.upload(hs.data(), sendBytes);
  recv.poison();
  const std::string what = std::string(uniform ? "fuscoAllToAll" : "fuscoAllToAllv") + " (" +
                           fusco::test::dtypeName(dt) + ", send " + memName(sendKind) + ", recv " +
                           memName(recvKind) +
                           (stream == nullptr ? ", legacy stream)" : ", stream)");
  fuscoResult_t r =
      uniform ? fuscoAllToAll(send.get(), recv.get(), l.sendcounts[0], dt, comm, stream)
              : fuscoAllToAllv(send.get(), l.sendcounts.data(), l.sdispls.data(), recv.get(),
                               l.recvcounts.data(), l.rdispls.data(), dt, comm, stream);
  if (r != fuscoSuccess)
    return ::testing::AssertionFailure()
           << "rank " << l.rank << ": " << what << " -> " << fuscoGetErrorString(r) << ": "
           << fuscoGetLastError(comm);
  cudaError_t e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return ::testing::AssertionFailure() << streamSyncFailure(e, what);
  std::vector<uint8_t> got = recv.download();
  auto ok = fusco::test::checkRecv(l, got.data(), seed);
  if (!ok) return ok << " [" << what << "]";
  if (fusco::test::findNotPoison(got.data() + recvBytes, kTailBytes) != SIZE_MAX)
    return ::testing::AssertionFailure() << what << " wrote past the receive buffer";
  return ok;
}

}  // namespace fusco::test::gpu
