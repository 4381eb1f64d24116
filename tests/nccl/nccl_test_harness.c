/* Forked ranks and buffers for the NCCL ABI tests. */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nccl_test.h"

int gRank = -1;
int gDevice = 0;
cudaStream_t gStream = NULL;

#ifdef FUSCO_NCCL_TEST_CUDA
static void deviceSetup(void) {
  CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice");
  CHECK(cudaStreamCreate(&gStream) == cudaSuccess, "cudaStreamCreate");
}
#endif

static int waitAll(pid_t* pids, int n) {
  int bad = 0;
  for (int r = 0; r < n; ++r) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d: exited with status 0x%x\n", r, st);
      bad = 1;
    }
  }
  return bad;
}

int runRawRanks(int n, RawBody body) {
  ncclUniqueId id;
  NCCLOK(ncclGetUniqueId(&id));
  pid_t pids[64];
  fflush(NULL);
  for (int r = 0; r < n; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      gRank = r;
#ifdef FUSCO_NCCL_TEST_CUDA
      if (gDevice) deviceSetup();
#endif
      body(&id, r, n);
      _exit(0);
    }
  }
  return waitAll(pids, n);
}

static RankBody gBody;
static void withComm(const ncclUniqueId* id, int rank, int n) {
  ncclComm_t comm = NULL;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  NCCLOK(ncclCommInitRankConfig(&comm, n, *id, rank, &cfg));
  gBody(comm, rank, n);
  NCCLOK(ncclCommFinalize(comm));
  NCCLOK(ncclCommDestroy(comm));
}

int runRanks(int n, RankBody body) {
  gBody = body;
  return runRawRanks(n, withComm);
}

size_t typeSize(ncclDataType_t t) {
  static const size_t kSize[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return (int)t >= 0 && t < ncclNumTypes ? kSize[t] : 0;
}

uint8_t pattern(int src, int dst, size_t i, int salt) {
  uint64_t x = ((uint64_t)src * 1000003u) ^ ((uint64_t)dst * 7919u) ^ (i * 2654435761u) ^
               ((uint64_t)salt << 40);
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  return (uint8_t)x;
}

void* bufAlloc(size_t bytes) {
  void* p = NULL;
  if (bytes == 0) bytes = 1;
#ifdef FUSCO_NCCL_TEST_CUDA
  if (gDevice) {
    CHECK(cudaMalloc(&p, bytes) == cudaSuccess, "cudaMalloc %zu", bytes);
    return p;
  }
#endif
  p = malloc(bytes);
  CHECK(p != NULL, "malloc %zu", bytes);
  return p;
}

void bufFree(void* p) {
#ifdef FUSCO_NCCL_TEST_CUDA
  if (gDevice) {
    cudaFree(p);
    return;
  }
#endif
  free(p);
}

void toBuf(void* dst, const void* src, size_t bytes) {
#ifdef FUSCO_NCCL_TEST_CUDA
  if (gDevice) {
    CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess, "H2D");
    return;
  }
#endif
  memcpy(dst, src, bytes);
}

void fromBuf(void* dst, const void* src, size_t bytes) {
#ifdef FUSCO_NCCL_TEST_CUDA
  if (gDevice) {
    CHECK(cudaStreamSynchronize(gStream) == cudaSuccess, "sync");
    CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess, "D2H");
    return;
  }
#endif
  memcpy(dst, src, bytes);
}

void syncStream(void) {
#ifdef FUSCO_NCCL_TEST_CUDA
  if (gDevice) CHECK(cudaStreamSynchronize(gStream) == cudaSuccess, "sync");
#endif
}
