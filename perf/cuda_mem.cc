#include "cuda_mem.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "number_args.h"

#ifdef FUSCO_PERF_CUDA
#include <cuda_runtime_api.h>
#endif

namespace fusco {
namespace perf {

bool parseMemMode(const char* v, MemMode* out) {
  const char* const names[] = {"host", "cuda", "auto"};
  const MemMode modes[] = {MemMode::Host, MemMode::Cuda, MemMode::Auto};
  int i = 0;
  return parseName(v, names, 3, &i) && ((*out = modes[i]), true);
}

const char* memModeName(MemMode m) {
  return m == MemMode::Host ? "host" : m == MemMode::Cuda ? "cuda" : "auto";
}

const char* bufferKindText(BufferKind k) {
  switch (k) {
    case BufferKind::Plain:
      return "cudaMalloc (staged by the library)";
    case BufferKind::Arena:
      return "fuscoMemAlloc device memory (local peers write it directly)";
    default:
      return "cudaMalloc + fuscoCommRegister (local peers write it directly)";
  }
}

#ifdef FUSCO_PERF_CUDA

namespace {

std::string cudaText(cudaError_t e, const char* what) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

bool cudaOk(cudaError_t e, const char* what, std::string* err) {
  if (e == cudaSuccess) return true;
  *err = cudaText(e, what);
  return false;
}

// Runs cudaGetDeviceCount in a child process (this one must stay free of CUDA if it forks ranks
// later). Returns the count, or -1 with *why.
int probeDeviceCount(std::string* why) {
  int fds[2];
  if (pipe(fds) != 0) {
    *why = std::string("pipe: ") + strerror(errno);
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    char msg[512];
    int len = snprintf(msg, sizeof(msg), "%d %s", e == cudaSuccess ? n : -1,
                       e == cudaSuccess ? "" : cudaText(e, "cudaGetDeviceCount").c_str());
    ssize_t w = write(fds[1], msg, static_cast<size_t>(len));
    (void)w;
    _exit(0);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    *why = std::string("fork: ") + strerror(errno);
    return -1;
  }
  std::string reply;
  char buf[256];
  for (;;) {
    ssize_t k = read(fds[0], buf, sizeof(buf));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    reply.append(buf, static_cast<size_t>(k));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  int n = -1;
  if (reply.empty() || sscanf(reply.c_str(), "%d", &n) != 1) {
    *why = "the CUDA probe process died before it answered";
    return -1;
  }
  if (n < 0) *why = reply.substr(reply.find(' ') + 1);
  return n;
}

}  // namespace

int visibleDeviceCount(std::string* why) {
  static int known = -1;  // the count once a probe gave one (each probe forks a child)
  if (known < 0) known = probeDeviceCount(why);
  return known;
}

int resolveMemMode(const char* prog, MemMode* mode) {
  if (*mode == MemMode::Host) return 0;
  std::string why;
  const int n = visibleDeviceCount(&why);
  if (n > 0) {
    *mode = MemMode::Cuda;
    return 0;
  }
  if (*mode == MemMode::Auto) {
    *mode = MemMode::Host;
    return 0;
  }
  fprintf(stderr, "%s: --mem cuda: no usable CUDA device (%s)\n", prog,
          n == 0 ? "cudaGetDeviceCount found none" : why.c_str());
  return 2;
}

CudaRank::~CudaRank() {
  if (comm != nullptr) fuscoCommDestroy(comm);
  if (stream != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

namespace {

// This rank's device, name and stream; "" or what failed.
std::string pickDevice(fuscoComm_t control, CudaRank* out) {
  int node = 0, numNodes = 1, localRank = 0, localSize = 1;
  fuscoResult_t r = fuscoCommNodeInfo(control, &node, &numNodes, &localRank, &localSize);
  if (r != fuscoSuccess) return std::string("fuscoCommNodeInfo: ") + fuscoGetLastError(control);
  std::string err;
  if (!cudaOk(cudaGetDeviceCount(&out->deviceCount), "cudaGetDeviceCount", &err)) return err;
  if (out->deviceCount <= 0) return "no CUDA device";
  out->device = localRank % out->deviceCount;
  cudaDeviceProp prop;
  cudaStream_t s = nullptr;
  if (!cudaOk(cudaSetDevice(out->device), "cudaSetDevice", &err) ||
      !cudaOk(cudaGetDeviceProperties(&prop, out->device), "cudaGetDeviceProperties", &err) ||
      !cudaOk(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate", &err))
    return err;
  out->gpuName = prop.name;
  out->stream = s;
  return "";
}

struct IdMessage {  // what each rank tells the others before the data comm is made
  int64_t failed;
  fuscoUniqueId id;  // rank 0's, for the data comm
};

}  // namespace

bool cudaRankInit(fuscoComm_t control, int rank, int nranks, CudaRank* out, std::string* err) {
  std::string local = pickDevice(control, out);
  IdMessage mine;
  memset(&mine, 0, sizeof(mine));
  if (local.empty() && rank == 0 && fuscoGetUniqueId(&mine.id) != fuscoSuccess)
    local = std::string("fuscoGetUniqueId: ") + fuscoGetLastError(nullptr);
  mine.failed = local.empty() ? 0 : 1;
  std::vector<IdMessage> send(nranks, mine), recv(nranks);
  if (fuscoAllToAll(send.data(), recv.data(), sizeof(IdMessage), fuscoUint8, control, nullptr) !=
      fuscoSuccess) {
    *err = std::string("fuscoAllToAll (control comm): ") + fuscoGetLastError(control);
    return false;
  }
  for (int p = 0; p < nranks; ++p) {
    if (recv[p].failed == 0) continue;
    *err =
        !local.empty() ? "CUDA setup: " + local : "CUDA setup failed on rank " + std::to_string(p);
    return false;
  }
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.memType = fuscoMemCuda;
  cfg.cudaDevice = out->device;
  cfg.maxSms = out->maxSms;
  fuscoResult_t r = fuscoCommInitRankConfig(&out->comm, nranks, recv[0].id, rank, &cfg);
  if (r != fuscoSuccess) {
    out->comm = nullptr;
    *err = std::string("fuscoCommInitRankConfig (memType fuscoMemCuda, device ") +
           std::to_string(out->device) + "): " + fuscoGetErrorString(r) + ": " +
           fuscoGetLastError(nullptr);
    return false;
  }
  return true;
}

DeviceBuffers::~DeviceBuffers() {
  for (auto it = bufs_.rbegin(); it != bufs_.rend(); ++it) {
    if (kind_ == BufferKind::Arena) {
      fuscoMemFree(comm_, it->ptr);
      continue;
    }
    if (it->handle != nullptr) fuscoCommDeregister(comm_, it->handle);
    cudaFree(it->ptr);
  }
}

void* DeviceBuffers::alloc(size_t bytes, std::string* err) {
  bytes = bytes < 64 ? 64 : bytes;
  Buffer b{nullptr, nullptr};
  if (kind_ == BufferKind::Arena) {
    fuscoResult_t r = fuscoMemAlloc(comm_, &b.ptr, bytes);
    if (r != fuscoSuccess) {
      *err = "fuscoMemAlloc(" + std::to_string(bytes) + "): " + fuscoGetLastError(comm_);
      return nullptr;
    }
  } else {
    if (!cudaOk(cudaMalloc(&b.ptr, bytes), "cudaMalloc", err)) return nullptr;
    if (kind_ == BufferKind::Registered) {
      fuscoResult_t r = fuscoCommRegister(comm_, b.ptr, bytes, &b.handle);
      if (r != fuscoSuccess) {
        *err = std::string("fuscoCommRegister: ") + fuscoGetLastError(comm_);
        cudaFree(b.ptr);
        return nullptr;
      }
    }
  }
  bufs_.push_back(b);
  return b.ptr;
}

bool cudaSyncStream(void* stream, const char* what, std::string* err) {
  cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  if (e == cudaSuccess) return true;
  *err = cudaText(e, (std::string("cudaStreamSynchronize after ") + what).c_str());
  return false;
}

bool cudaCopySync(void* dst, const void* src, size_t bytes, void* stream, std::string* err) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return cudaOk(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync", err) &&
         cudaSyncStream(stream, "cudaMemcpyAsync", err);
}

bool cudaFillSync(void* dst, int byte, size_t bytes, void* stream, std::string* err) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return cudaOk(cudaMemsetAsync(dst, byte, bytes, s), "cudaMemsetAsync", err) &&
         cudaSyncStream(stream, "cudaMemsetAsync", err);
}

#else  // no CUDA in this build: only host memory

int resolveMemMode(const char* prog, MemMode* mode) {
  if (*mode == MemMode::Auto) *mode = MemMode::Host;
  if (*mode == MemMode::Host) return 0;
  fprintf(stderr,
          "%s: --mem cuda: this build has no CUDA support (configure with the CUDA toolkit, e.g. "
          "-DFUSCO_CUDA=ON with nvcc at /usr/local/cuda/bin or CMAKE_CUDA_COMPILER set)\n",
          prog);
  return 2;
}

int visibleDeviceCount(std::string*) { return 0; }

CudaRank::~CudaRank() {
  if (comm != nullptr) fuscoCommDestroy(comm);
}

bool cudaRankInit(fuscoComm_t, int, int, CudaRank*, std::string* err) {
  *err = "built without CUDA";
  return false;
}

DeviceBuffers::~DeviceBuffers() {}

void* DeviceBuffers::alloc(size_t, std::string* err) {
  *err = "built without CUDA";
  return nullptr;
}

bool cudaSyncStream(void*, const char*, std::string* err) {
  *err = "built without CUDA";
  return false;
}

bool cudaCopySync(void*, const void*, size_t, void*, std::string* err) {
  *err = "built without CUDA";
  return false;
}

bool cudaFillSync(void*, int, size_t, void*, std::string* err) {
  *err = "built without CUDA";
  return false;
}

#endif

}  // namespace perf
}  // namespace fusco
