/* An outside program (tests/gpu/CMakeLists.txt, twin builds): written against the CUDA runtime API
 * and fusco's C API only, with no kernels of its own, compiled with the toolkit's headers and
 * linked to libfusco.so and a CUDA runtime; on the twin CUDA runtime it runs on CPUs unchanged.
 * Four forked ranks, an all-to-all of device buffers on a stream, every element checked. */
#include <cuda_runtime_api.h>
#include <fusco.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int rankMain(int rank, int n, fuscoUniqueId id) {
  int dev = 0;
  if (cudaGetDeviceCount(&dev) != cudaSuccess || dev < 1 || cudaSetDevice(0) != cudaSuccess)
    return 2;
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.memType = fuscoMemCuda;
  cfg.cudaDevice = 0;
  fuscoComm_t comm;
  if (fuscoCommInitRankConfig(&comm, n, id, rank, &cfg) != fuscoSuccess) {
    fprintf(stderr, "rank %d: init: %s\n", rank, fuscoGetLastError(NULL));
    return 3;
  }
  const size_t count = 1024, bytes = count * 4 * n;
  int *hs = malloc(bytes), *hr = malloc(bytes);
  for (size_t i = 0; i < count * n; ++i) hs[i] = rank * 1000000 + (int)i;
  void *ds, *dr;
  cudaStream_t s;
  if (cudaMalloc(&ds, bytes) || cudaMalloc(&dr, bytes) || cudaStreamCreate(&s)) return 4;
  cudaMemcpy(ds, hs, bytes, cudaMemcpyHostToDevice);
  if (fuscoAllToAll(ds, dr, count, fuscoInt32, comm, s) != fuscoSuccess) return 5;
  if (cudaStreamSynchronize(s) != cudaSuccess) return 6;
  cudaMemcpy(hr, dr, bytes, cudaMemcpyDeviceToHost);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < count; ++i)
      if (hr[p * count + i] != p * 1000000 + (int)(rank * count + i)) {
        fprintf(stderr, "rank %d: wrong element %zu from %d\n", rank, i, p);
        return 7;
      }
  fuscoCommDestroy(comm);
  cudaFree(ds);
  cudaFree(dr);
  return 0;
}

int main(void) {
  const int n = 4;
  fuscoUniqueId id;
  if (fuscoGetUniqueId(&id) != fuscoSuccess) return 1;
  for (int r = 0; r < n; ++r)
    if (fork() == 0) _exit(rankMain(r, n, id));
  int bad = 0, st;
  while (wait(&st) > 0) bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  printf("outside program, %d ranks: %s\n", n, bad ? "FAILED" : "passed");
  return bad;
}
