// The twin's multiprocessors (T7, twin_sms.cc) against the CUDA documentation, as
// test_twin_cuda.cc does for the rest: one test per behaviour, each naming the section of the
// CUDA programming guide (PG) or the runtime API reference it checks.
//
// The device's multiprocessors are read at context creation and shared by every process on the
// machine, so each test runs its body in a fresh process (a threadsafe death test) with a pool of
// its own (FUSCO_TWIN_SM_POOL), removed at its end. The peer process sharing the device is this
// binary started again with TWIN_CUDA_TEST_ROLE=sm-peer.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "twin_cuda.h"
#include "twin_test.h"

namespace {

using twintest::Clock;
using twintest::msSince;

int64_t nowNs() {  // CLOCK_MONOTONIC: one clock for every process of the machine
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000LL + t.tv_nsec;
}

// What two grids (role 0 and 1, perhaps of two processes) tell each other.
struct Words {
  uint32_t started[2];
  uint32_t sawPartner[2];
  uint32_t held[2];  // the multiprocessors held on the device when it started
  uint32_t abort;
  int64_t startNs[2];
  int64_t endNs[2];
};

template <typename T>
T get(const T* p) {
  return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}
template <typename T>
void put(T* p, T v) {
  __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}

// A grid that waits for another grid: it marks its start, then spins until the partner grid has
// started (or the test aborts it; bounded, so a failing test ends).
void coopSpin(Words* w, int role) {
  put(&w->held[role], twincuda::smsHeldOnDevice());
  put(&w->startNs[role], nowNs());
  put(&w->started[role], 1u);
  const auto t0 = Clock::now();
  while (get(&w->started[1 - role]) == 0 && get(&w->abort) == 0 && msSince(t0) < 4000)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  put(&w->sawPartner[role], get(&w->started[1 - role]));
  put(&w->endNs[role], nowNs());
}

cudaError_t coopSpinLauncher(const cudaLaunchConfig_t* cfg, void** args) {
  Words* w = *static_cast<Words**>(args[0]);
  const int role = *static_cast<int*>(args[1]);
  twincuda::Launch l;  // its grid: the configuration of the call it is launched from
  l.kernel = reinterpret_cast<const void*>(&coopSpin);
  l.stream = cfg->stream;
  l.writes = {{w, sizeof *w}};
  l.body = [w, role] { coopSpin(w, role); };
  return twincuda::launch(std::move(l));
}

const void* const kCoop = reinterpret_cast<const void*>(&coopSpin);

cudaError_t loadCoop() {
  twincuda::registerKernel(kCoop, "coopSpin", coopSpinLauncher);
  cudaFuncAttributes a;
  return cudaFuncGetAttributes(&a, kCoop);
}

// Waits (at most 3 s) until the grid of `role` runs.
bool started(Words* w, int role) {
  const auto t0 = Clock::now();
  while (get(&w->started[role]) == 0 && msSince(t0) < 3000)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return get(&w->started[role]) == 1;
}

// A cooperative grid of 1024-thread blocks (two per multiprocessor) that occupies `sms`.
cudaError_t launchCoop(cudaStream_t s, Words* w, int role, unsigned sms) {
  void* args[] = {&w, &role};
  return cudaLaunchCooperativeKernel(coopSpin, dim3(2 * sms), dim3(1024), args, 0, s);
}

cudaStream_t newStream() {
  cudaStream_t s = nullptr;
  return cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess ? s : nullptr;
}

// A pool of the calling process's own (set before the context exists), removed at scope exit.
struct PrivatePool {
  explicit PrivatePool(const char* sms) {
    setenv("FUSCO_TWIN_SM_POOL", ("test-" + std::to_string(getpid())).c_str(), 1);
    if (sms != nullptr) setenv("FUSCO_TWIN_SMS", sms, 1);
  }
  ~PrivatePool() { unlink(twincuda::smPoolPath().c_str()); }
};

// ------------------------------------------------------------------ the peer process
// Launches a cooperative grid of TWIN_SM_PEER_SMS multiprocessors as role 1 on the words mapped
// from fd 3, and waits for it. Started with exec (PG "Initialization": no CUDA after fork()).
int smPeerMain() {
  void* m = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, 3, 0);
  if (m == MAP_FAILED) return 2;
  Words* w = static_cast<Words*>(m);
  if (loadCoop() != cudaSuccess) return 3;
  if (cudaHostRegister(w, 4096, cudaHostRegisterDefault) != cudaSuccess) return 4;
  cudaStream_t s = newStream();
  const char* sms = std::getenv("TWIN_SM_PEER_SMS");
  if (s == nullptr || sms == nullptr) return 5;
  if (launchCoop(s, w, 1, static_cast<unsigned>(std::atoi(sms))) != cudaSuccess) return 6;
  return cudaStreamSynchronize(s) == cudaSuccess ? 0 : 7;
}

const int kSmRoleRan = [] {
  const char* role = std::getenv("TWIN_CUDA_TEST_ROLE");
  if (role != nullptr && std::strcmp(role, "sm-peer") == 0) _exit(smPeerMain());
  return 0;
}();

// Words shared with a peer (a memfd it maps as fd 3), and the peer.
struct Peer {
  pid_t pid = -1;
  int fd = -1;
  Words* w = nullptr;

  bool map() {
    const int m = memfd_create("twin-sm-words", MFD_CLOEXEC);
    fd = m < 0 ? -1 : fcntl(m, F_DUPFD_CLOEXEC, 10);  // not 3: the peer's dup2 must clear CLOEXEC
    if (m >= 0) close(m);
    if (fd < 0 || ftruncate(fd, 4096) != 0) return false;
    void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    w = p == MAP_FAILED ? nullptr : static_cast<Words*>(p);
    return w != nullptr && cudaHostRegister(w, 4096, cudaHostRegisterDefault) == cudaSuccess;
  }
  bool start(unsigned sms) {
    if (!map()) return false;
    pid = twintest::spawnSelf("sm-peer", {"TWIN_SM_PEER_SMS=" + std::to_string(sms)}, {{fd, 3}});
    return pid > 0;
  }
  bool waitStarted() { return started(w, 1); }  // until the peer's grid runs
  int finish() {                                // the peer's exit status, 128 + signal when killed
    int st = 0;
    if (pid > 0 && waitpid(pid, &st, 0) != pid) return -1;
    pid = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  ~Peer() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      finish();
    }
  }
};

// Both grids of a pair that fits the device: the peer's of `sms`, then this process's.
int pairFits(unsigned sms) {
  CHILD_CHECK(loadCoop() == cudaSuccess);
  Peer peer;
  CHILD_CHECK(peer.start(sms));
  CHILD_CHECK(peer.waitStarted());
  cudaStream_t s = newStream();
  CHILD_CHECK(launchCoop(s, peer.w, 0, sms) == cudaSuccess);
  CHILD_CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHILD_CHECK(peer.finish() == 0);
  CHILD_CHECK(get(&peer.w->sawPartner[0]) == 1 && get(&peer.w->sawPartner[1]) == 1);
  CHILD_CHECK(twincuda::smWaitCount() == 0);
  fprintf(stderr, "grids of %u and %u multiprocessors ran together, %u held at once\n", sms, sms,
          get(&peer.w->held[0]));
  return 0;
}

class TwinSms : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

}  // namespace

// Runtime API cudaLaunchCooperativeKernel / cudaErrorCooperativeLaunchTooLarge: a cooperative grid
// holds at most cudaOccupancyMaxActiveBlocksPerMultiprocessor times cudaDevAttrMultiProcessorCount
// blocks (the device reports FUSCO_TWIN_SMS multiprocessors), also through
// cudaLaunchAttributeCooperative; PG "Hardware Implementation": a larger ordinary grid runs in
// waves on the multiprocessors it gets.
TEST_F(TwinSms, ACooperativeGridLargerThanTheDeviceIsRefused) {
  auto body = [] {
    PrivatePool pool("16");
    CHILD_CHECK(loadCoop() == cudaSuccess);
    int sms = 0, perSm = 0;
    CHILD_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess);
    CHILD_CHECK(sms == 16);
    CHILD_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, kCoop, 256, 0) ==
                cudaSuccess);
    CHILD_CHECK(perSm == 8);
    Words* w = nullptr;
    CHILD_CHECK(cudaMallocHost(reinterpret_cast<void**>(&w), sizeof *w) == cudaSuccess);
    std::memset(w, 0, sizeof *w);
    w->abort = 1;
    int role = 0;
    void* args[] = {&w, &role};
    cudaStream_t s = newStream();
    CHILD_CHECK(cudaLaunchCooperativeKernel(kCoop, dim3(16 * 8 + 1), dim3(256), args, 0, s) ==
                cudaErrorCooperativeLaunchTooLarge);
    CHILD_CHECK(cudaGetLastError() == cudaErrorCooperativeLaunchTooLarge);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(16 * 8 + 1);
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CHILD_CHECK(cudaLaunchKernelEx(&cfg, coopSpin, w, role) == cudaErrorCooperativeLaunchTooLarge);
    cudaGetLastError();
    CHILD_CHECK(cudaLaunchCooperativeKernel(kCoop, dim3(16 * 8), dim3(256), args, 0, s) ==
                cudaSuccess);
    CHILD_CHECK(cudaStreamSynchronize(s) == cudaSuccess && w->held[0] == 16);
    w->held[0] = 0;
    cfg.gridDim = dim3(10000);
    cfg.numAttrs = 0;  // an ordinary launch: waves
    CHILD_CHECK(cudaLaunchKernelEx(&cfg, coopSpin, w, role) == cudaSuccess);
    CHILD_CHECK(cudaStreamSynchronize(s) == cudaSuccess && w->held[0] == 16);
    CHILD_CHECK(twincuda::smsHeldByProcess() == 0 && twincuda::smsHeldOnDevice() == 0);
    return 0;
  };
  EXPECT_ISOLATED(body,
                  "cooperative launch of kernel coopSpin refused: 129 blocks of 256 threads, 8 per "
                  "multiprocessor, need 17 multiprocessors and the device has 16");
}

// PG "Hardware Implementation": a grid's blocks go to multiprocessors with free capacity, so an
// ordinary kernel starts on the ones left free; PG "Cooperative Groups", "Grid Synchronization":
// a cooperative grid is resident whole, so it starts only once all of its multiprocessors are.
TEST_F(TwinSms, KernelsOfOneProcessShareTheMultiprocessors) {
  auto body = [] {
    PrivatePool pool("16");
    CHILD_CHECK(loadCoop() == cudaSuccess);
    Words* w = nullptr;  // a: holds 12 until aborted; b, c: return at once
    CHILD_CHECK(cudaMallocHost(reinterpret_cast<void**>(&w), 3 * sizeof *w) == cudaSuccess);
    std::memset(w, 0, 3 * sizeof *w);
    w[1].abort = w[2].abort = 1;
    cudaStream_t a = newStream(), b = newStream(), c = newStream();
    CHILD_CHECK(launchCoop(a, &w[0], 0, 12) == cudaSuccess);
    CHILD_CHECK(started(&w[0], 0));
    int role = 0;
    Words* wb = &w[1];
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(1000);  // 500 multiprocessors' worth: takes the 4 left
    cfg.blockDim = dim3(1024);
    cfg.stream = b;
    CHILD_CHECK(cudaLaunchKernelEx(&cfg, coopSpin, wb, role) == cudaSuccess);
    CHILD_CHECK(cudaStreamSynchronize(b) == cudaSuccess && w[1].held[0] == 16);
    CHILD_CHECK(launchCoop(c, &w[2], 0, 8) == cudaSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    CHILD_CHECK(get(&w[2].started[0]) == 0 && twincuda::smWaitCount() == 1);
    put(&w[0].abort, 1u);
    CHILD_CHECK(cudaStreamSynchronize(c) == cudaSuccess && w[2].held[0] == 8);
    CHILD_CHECK(w[2].startNs[0] >= w[0].endNs[0]);
    CHILD_CHECK(twincuda::smsHeldByProcess() == 0);
    fprintf(stderr, "the cooperative grid waited for the one ahead of it\n");
    return 0;
  };
  EXPECT_ISOLATED(body, "the cooperative grid waited");
}

// PG "Cooperative Groups", "Grid Synchronization" (a grid must be resident whole) with
// multiprocessors shared by the processes on one GPU: two grids of 100 multiprocessors of 132,
// each waiting for the other to start, deadlock on a GPU. The second waits for the first to end;
// a stream synchronization behind it fails past FUSCO_TWIN_SYNC_LIMIT_MS naming the holder.
TEST_F(TwinSms, CooperativeGridsOfTwoProcessesThatDoNotFitRunOneAfterTheOther) {
  auto body = [] {
    PrivatePool pool(nullptr);  // 132
    CHILD_CHECK(loadCoop() == cudaSuccess);
    Peer peer;
    CHILD_CHECK(peer.start(100));
    CHILD_CHECK(peer.waitStarted());
    CHILD_CHECK(twincuda::smsHeldOnDevice() == 100);
    cudaStream_t s = newStream();
    CHILD_CHECK(launchCoop(s, peer.w, 0, 100) == cudaSuccess);
    setenv("FUSCO_TWIN_SYNC_LIMIT_MS", "300", 1);
    testing::internal::CaptureStderr();
    CHILD_CHECK(cudaStreamSynchronize(s) == cudaErrorTimeout);
    const std::string err = testing::internal::GetCapturedStderr();
    fputs(err.c_str(), stderr);
    const std::string holder = "100 by kernel coopSpin of process " + std::to_string(peer.pid);
    CHILD_CHECK(err.find("waiting for all 100 multiprocessors") != std::string::npos);
    CHILD_CHECK(err.find(holder) != std::string::npos);
    CHILD_CHECK(get(&peer.w->started[0]) == 0 && twincuda::syncLimitCount() == 1);
    CHILD_CHECK(twincuda::smWaitCount() == 1);
    cudaGetLastError();
    put(&peer.w->abort, 1u);  // the peer's grid gives up waiting: it ends, ours starts
    CHILD_CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHILD_CHECK(peer.finish() == 0);
    CHILD_CHECK(get(&peer.w->sawPartner[1]) == 0 && get(&peer.w->sawPartner[0]) == 1);
    CHILD_CHECK(peer.w->startNs[0] >= peer.w->endNs[1]);
    return 0;
  };
  EXPECT_ISOLATED(
      body,
      "cudaStreamSynchronize waited for the stream .* held by kernel coopSpin on stream "
      ".*, waiting for all 100 multiprocessors \\(a cooperative grid is resident "
      "whole\\): 100 of 132 \\(FUSCO_TWIN_SMS\\) held, 100 by kernel coopSpin of process");
}

// The same pair with grids that fit together: of 60 multiprocessors each on 132.
TEST_F(TwinSms, CooperativeGridsOfTwoProcessesThatFitRunTogether) {
  auto body = [] {
    PrivatePool pool(nullptr);
    return pairFits(60);
  };
  EXPECT_ISOLATED(body, "grids of 60 and 60 multiprocessors ran together, 120 held at once");
}

// ... and grids of 100 each on a device of FUSCO_TWIN_SMS=200.
TEST_F(TwinSms, TwoGridsOfOneHundredFitTwoHundredMultiprocessors) {
  auto body = [] {
    PrivatePool pool("200");
    return pairFits(100);
  };
  EXPECT_ISOLATED(body, "grids of 100 and 100 multiprocessors ran together, 200 held at once");
}

// A GPU's context, and what its kernels hold, ends with its process (runtime API, "Device
// Management": resources are released at process exit). A peer killed while its grid holds the
// whole device leaves the multiprocessors to the next grid, even before it is reaped.
TEST_F(TwinSms, AProcessKilledHoldingMultiprocessorsLeavesThemFree) {
  auto body = [] {
    PrivatePool pool(nullptr);
    CHILD_CHECK(loadCoop() == cudaSuccess);
    Peer peer;
    CHILD_CHECK(peer.start(132));
    CHILD_CHECK(peer.waitStarted());
    CHILD_CHECK(twincuda::smsHeldOnDevice() == 132);
    CHILD_CHECK(kill(peer.pid, SIGKILL) == 0);  // not reaped yet: a zombie holds nothing
    setenv("FUSCO_TWIN_SYNC_LIMIT_MS", "2000", 1);
    cudaStream_t s = newStream();
    CHILD_CHECK(launchCoop(s, peer.w, 0, 132) == cudaSuccess);
    CHILD_CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHILD_CHECK(get(&peer.w->held[0]) == 132 && twincuda::smsHeldOnDevice() == 0);
    CHILD_CHECK(peer.finish() == 128 + SIGKILL);
    fprintf(stderr, "the killed peer's multiprocessors were free\n");
    return 0;
  };
  EXPECT_ISOLATED(body, "the killed peer's multiprocessors were free");
}
