/* nccl_alltoall_perf: ncclAlltoAll bandwidth, nccl-tests style, written against nccl.h only. Run
 * it through libfusco_nccl (LD_LIBRARY_PATH=<build>/plugins/nccl/shim FUSCO_NCCL_MEM=host) to
 * compare with alltoall_perf calling fusco directly: same sizes (bytes each rank sends in total),
 * same columns, algbw = size / time, busbw = algbw * (n-1)/n, time the slowest rank's average.
 * Ranks are forked (-np N) after rank 0's ncclGetUniqueId. Buffers are malloc'd (host mode, NULL
 * stream) or, with -g 1 in a CUDA build, cudaMalloc'd on a stream. */
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  size_t minBytes, maxBytes;
  int factor, iters, warmup, check, np, gpu;
} Options;

static size_t parseSize(const char* s) {
  char* end = NULL;
  double v = strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1024;
  if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
  if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
  return (size_t)v;
}

static int parseArgs(int argc, char** argv, Options* o) {
  *o = (Options){1024, 64 << 20, 2, 20, 5, 1, 1, 0};
  for (int i = 1; i + 1 < argc; i += 2) {
    const char* a = argv[i];
    const char* v = argv[i + 1];
    if (!strcmp(a, "-b"))
      o->minBytes = parseSize(v);
    else if (!strcmp(a, "-e"))
      o->maxBytes = parseSize(v);
    else if (!strcmp(a, "-f"))
      o->factor = atoi(v);
    else if (!strcmp(a, "-n"))
      o->iters = atoi(v);
    else if (!strcmp(a, "-w"))
      o->warmup = atoi(v);
    else if (!strcmp(a, "-c"))
      o->check = atoi(v);
    else if (!strcmp(a, "-np"))
      o->np = atoi(v);
    else if (!strcmp(a, "-g"))
      o->gpu = atoi(v);
    else
      return 0;
  }
  return (argc % 2) == 1 && o->factor >= 2 && o->iters >= 1 && o->np >= 1 &&
         o->minBytes <= o->maxBytes;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

#define OK(call)                                                              \
  do {                                                                        \
    ncclResult_t r_ = (call);                                                 \
    if (r_ != ncclSuccess) {                                                  \
      fprintf(stderr, "# %s failed: %s: %s\n", #call, ncclGetErrorString(r_), \
              ncclGetLastError(NULL));                                        \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

#ifdef NCCL_PERF_CUDA
#include <cuda_runtime.h>
#endif
static cudaStream_t gStream = NULL;

static void* alloc(const Options* o, size_t bytes) {
  void* p = NULL;
#ifdef NCCL_PERF_CUDA
  if (o->gpu) return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
#endif
  return posix_memalign(&p, 4096, bytes) == 0 ? p : NULL;
}

static void release(const Options* o, void* p) {
#ifdef NCCL_PERF_CUDA
  if (o->gpu) {
    cudaFree(p);
    return;
  }
#endif
  free(p);
}

static void copyTo(const Options* o, void* dst, const void* src, size_t bytes, int toDevice) {
#ifdef NCCL_PERF_CUDA
  if (o->gpu) {
    cudaMemcpy(dst, src, bytes, toDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
    return;
  }
#endif
  memcpy(dst, src, bytes);
}

static void syncStream(const Options* o) {
#ifdef NCCL_PERF_CUDA
  if (o->gpu) cudaStreamSynchronize(gStream);
#endif
}

/* The slowest rank's value and the sum over ranks, through ncclAlltoAll of doubles. */
static double reduceMax(const Options* o, ncclComm_t comm, int n, double mine, double* sum) {
  double s[64], r[64];
  for (int p = 0; p < n; ++p) s[p] = mine;
  void* ds = alloc(o, sizeof(s));
  void* dr = alloc(o, sizeof(r));
  copyTo(o, ds, s, sizeof(s), 1);
  OK(ncclAlltoAll(ds, dr, 1, ncclFloat64, comm, gStream));
  syncStream(o);
  copyTo(o, r, dr, sizeof(r), 0);
  double mx = mine;
  *sum = 0;
  for (int p = 0; p < n; ++p) mx = r[p] > mx ? r[p] : mx, *sum += r[p];
  release(o, ds);
  release(o, dr);
  return mx;
}

static uint32_t value(int src, int dst, size_t i) {
  return (uint32_t)(src * 2654435761u) ^ (uint32_t)(dst * 40503u) ^ (uint32_t)(i * 97u);
}

/* One size: warmup, timed iterations, then (with -c 1) one checked call. Returns #wrong. */
static long runSize(const Options* o, ncclComm_t comm, int rank, int n, size_t count, uint32_t* hs,
                    uint32_t* hr, void* ds, void* dr, double* us) {
  size_t total = count * n;
  for (size_t p = 0; p < (size_t)n; ++p)
    for (size_t i = 0; i < count; ++i) hs[p * count + i] = value(rank, (int)p, i);
  copyTo(o, ds, hs, total * 4, 1);
  for (int i = 0; i < o->warmup; ++i) OK(ncclAlltoAll(ds, dr, count, ncclFloat32, comm, gStream));
  syncStream(o);
  double dummy;
  reduceMax(o, comm, n, 0, &dummy); /* barrier */
  double t0 = now();
  for (int i = 0; i < o->iters; ++i) OK(ncclAlltoAll(ds, dr, count, ncclFloat32, comm, gStream));
  syncStream(o);
  *us = (now() - t0) * 1e6 / o->iters;
  long wrong = 0;
  if (o->check) {
    memset(hr, 0xA5, total * 4);
    copyTo(o, dr, hr, total * 4, 1);
    OK(ncclAlltoAll(ds, dr, count, ncclFloat32, comm, gStream));
    syncStream(o);
    copyTo(o, hr, dr, total * 4, 0);
    for (size_t p = 0; p < (size_t)n; ++p)
      for (size_t i = 0; i < count; ++i) wrong += hr[p * count + i] != value((int)p, rank, i);
  }
  return wrong;
}

static int runRank(const Options* o, const ncclUniqueId* id, int rank, int n) {
#ifdef NCCL_PERF_CUDA
  if (o->gpu && (cudaSetDevice(0) != cudaSuccess || cudaStreamCreate(&gStream) != cudaSuccess))
    return 1;
#endif
  ncclComm_t comm;
  OK(ncclCommInitRank(&comm, n, *id, rank));
  size_t maxTotal = o->maxBytes / 4 / n * n * 4 + 4 * n;
  uint32_t* hs = malloc(maxTotal);
  uint32_t* hr = malloc(maxTotal);
  void* ds = alloc(o, maxTotal);
  void* dr = alloc(o, maxTotal);
  if (!hs || !hr || !ds || !dr) return 1;
  if (rank == 0) {
    int v = 0;
    OK(ncclGetVersion(&v));
    printf("# nccl_alltoall_perf: %d ranks, NCCL version %d, %s buffers\n", n, v,
           o->gpu ? "device" : "host");
    printf("#%11s %12s %9s %11s %11s %11s %8s\n", "size", "count", "type", "time", "algbw", "busbw",
           "#wrong");
    printf("#%11s %12s %9s %11s %11s %11s %8s\n", "(B)", "(elements)", "", "(us)", "(GB/s)",
           "(GB/s)", "");
  }
  long allWrong = 0;
  for (size_t bytes = o->minBytes; bytes <= o->maxBytes; bytes *= o->factor) {
    size_t count = bytes / 4 / n;
    double us = 0, wrongSum = 0, scratch = 0;
    long wrong = runSize(o, comm, rank, n, count, hs, hr, ds, dr, &us);
    us = reduceMax(o, comm, n, us, &scratch);
    reduceMax(o, comm, n, (double)wrong, &wrongSum);
    double size = (double)count * 4 * n;
    double algbw = size / us / 1e3, busbw = algbw * (n - 1) / n;
    allWrong += (long)wrongSum;
    if (rank == 0)
      printf("%12.0f %12zu %9s %11.2f %11.3f %11.3f %8ld\n", size, count, "float", us, algbw, busbw,
             (long)wrongSum);
    if (bytes * o->factor / o->factor != bytes) break;
  }
  if (rank == 0) printf("# Out of bounds values : %ld %s\n", allWrong, allWrong ? "FAILED" : "OK");
  release(o, ds);
  release(o, dr);
  free(hs);
  free(hr);
  OK(ncclCommDestroy(comm));
  return allWrong != 0;
}

int main(int argc, char** argv) {
  Options o;
  if (!parseArgs(argc, argv, &o)) {
    fprintf(stderr,
            "usage: %s [-b BYTES] [-e BYTES] [-f N] [-n ITERS] [-w WARMUP] [-c 0|1] [-np N] "
            "[-g 0|1]\n  sizes are the bytes each rank sends in total (K/M/G); float elements\n",
            argv[0]);
    return 2;
  }
  ncclUniqueId id;
  OK(ncclGetUniqueId(&id));
  fflush(NULL);
  pid_t pids[64];
  for (int r = 0; r < o.np; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      int rc = runRank(&o, &id, r, o.np);
      fflush(NULL);
      _exit(rc);
    }
  }
  int bad = 0;
  for (int r = 0; r < o.np; ++r) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  return bad;
}
