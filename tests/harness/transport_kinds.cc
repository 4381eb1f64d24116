// The transports under test (see transport_kinds.h).
#include "harness/transport_kinds.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#ifdef FUSCO_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "core/clock.h"

namespace fusco {
extern const TransportOps kShmTransport;
#ifdef FUSCO_HAVE_UCX
extern const TransportOps kUcxTransport;
#endif
#ifdef FUSCO_HAVE_CUDA
extern const TransportOps kCudaIpcTransport;
#endif
}  // namespace fusco

namespace fusco::test::transport {

const TransportKind& shmKind() {
  static const TransportKind k = [] {
    TransportKind t;
    t.name = "Shm";
    t.ops = &kShmTransport;
    return t;
  }();
  return k;
}

#ifdef FUSCO_HAVE_UCX
namespace {
// TCP on loopback: every machine has it, and UCX then takes its rendezvous path for 64 KiB slots.
void prepareUcx() {
  setenv("UCX_TLS", "tcp,self", 1);
  setenv("UCX_NET_DEVICES", "lo", 1);
  setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
}
}  // namespace

const TransportKind& ucxKind() {
  static const TransportKind k = [] {
    TransportKind t;
    t.name = "Ucx";
    t.ops = &kUcxTransport;
    t.ranksPerNode = 1;
    t.prepareChild = prepareUcx;
    return t;
  }();
  return k;
}
#endif

#ifdef FUSCO_HAVE_CUDA
namespace {

// Asks a forked child whether a CUDA device is present: "" if so, else the reason.
std::string probeCuda() {
  int fds[2];
  if (pipe(fds) != 0) return std::string("no CUDA device (pipe: ") + strerror(errno) + ")";
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    std::string why;
    if (e != cudaSuccess)
      why = std::string("no CUDA device (cudaGetDeviceCount: ") + cudaGetErrorName(e) + ": " +
            cudaGetErrorString(e) + ")";
    else if (n == 0)
      why = "no CUDA device (cudaGetDeviceCount found none)";
    ssize_t w = write(fds[1], why.data(), why.size());
    _exit(w == static_cast<ssize_t>(why.size()) ? 0 : 1);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return "no CUDA device (fork failed)";
  }
  std::string why;
  Deadline d(30000);
  for (;;) {
    pollfd pf{fds[0], POLLIN, 0};
    int r = poll(&pf, 1, static_cast<int>(d.remainingMs()));
    if (r < 0 && errno == EINTR) continue;
    char buf[512];
    ssize_t got = r > 0 ? read(fds[0], buf, sizeof(buf)) : -1;
    if (got > 0) {
      why.append(buf, static_cast<size_t>(got));
      continue;
    }
    if (r <= 0) kill(pid, SIGKILL);  // timed out
    break;
  }
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    return "no CUDA device (the probe in a forked child did not finish: status " +
           std::to_string(st) + ")";
  return why;
}

std::string cudaSkipReason() {
  static const std::string why = probeCuda();
  return why;
}

// Creates this process's CUDA context, and whatever the driver opens on the first host
// registration, before the tests count its file descriptors (a close must give back what the
// transport opened, not what the driver keeps for the process).
void prepareCuda() {
  cudaSetDevice(0);
  cudaFree(nullptr);
  static char page[4096] __attribute__((aligned(4096)));
  if (cudaHostRegister(page, sizeof(page), cudaHostRegisterMapped | cudaHostRegisterPortable) ==
      cudaSuccess)
    cudaHostUnregister(page);
  cudaGetLastError();
}

}  // namespace

const TransportKind& cudaIpcKind() {
  static const TransportKind k = [] {
    TransportKind t;
    t.name = "CudaIpc";
    t.ops = &kCudaIpcTransport;
    t.memType = fuscoMemCuda;
    t.prepareChild = prepareCuda;
    t.skipReason = cudaSkipReason;
    t.needsGpu = true;
    return t;
  }();
  return k;
}
#endif

std::string kindSkipReason(const TransportKind& kind, bool* requireFailure) {
  *requireFailure = false;
  std::string why = kind.skipReason != nullptr ? kind.skipReason() : std::string();
  if (!why.empty() && kind.needsGpu) {
    const char* v = getenv("FUSCO_TEST_REQUIRE_GPU");
    *requireFailure = v != nullptr && strcmp(v, "1") == 0;
  }
  return why;
}

}  // namespace fusco::test::transport
