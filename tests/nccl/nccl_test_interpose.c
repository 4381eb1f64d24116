/* Interposer mode: the shim in front of another NCCL (FUSCO_NCCL_LIBRARY). `real LIB`: the
 * toolkit's libnccl.so.2, where ncclGetVersion and a forwarded call must give what the library
 * itself gives (on a machine without a GPU, its own error). `self`: FUSCO_NCCL_LIBRARY names the
 * shim, which refuses. `fake N`: tests/nccl/fake_nccl.c behind the shim on N forked ranks in host
 * mode: fusco serves ncclAlltoAll and all-to-all-shaped groups bit-exact, partial and mixed
 * groups are replayed on the fake in order, and the fake's own calls never reach the shim. */
#include <dlfcn.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nccl_test.h"

typedef ncclResult_t (*VersionFn)(int*);
typedef ncclResult_t (*IdFn)(ncclUniqueId*);
typedef ncclResult_t (*InitFn)(ncclComm_t*, int, ncclUniqueId, int);

static int realCase(const char* lib) {
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  CHECK(h != NULL, "dlopen %s: %s", lib, dlerror());
  int mine = 0, theirs = 0;
  NCCLOK(ncclGetVersion(&mine));
  CHECK(((VersionFn)dlsym(h, "ncclGetVersion"))(&theirs) == ncclSuccess, "real version");
  CHECK(mine == theirs, "version through the shim %d, the library's %d", mine, theirs);
  /* One rank's communicator: what the library answers here (without a GPU, an error). */
  ncclUniqueId id;
  ncclComm_t comm = NULL, direct = NULL;
  ncclResult_t viaShim = ncclGetUniqueId(&id);
  if (viaShim == ncclSuccess) viaShim = ncclCommInitRank(&comm, 1, id, 0);
  ncclUniqueId id2;
  ncclResult_t real = ((IdFn)dlsym(h, "ncclGetUniqueId"))(&id2);
  if (real == ncclSuccess) real = ((InitFn)dlsym(h, "ncclCommInitRank"))(&direct, 1, id2, 0);
  printf("real NCCL %d: ncclCommInitRank -> %d (%s) through the shim, %d directly: %s\n", theirs,
         viaShim, ncclGetErrorString(viaShim), real, ncclGetLastError(NULL));
  CHECK(viaShim == real, "through the shim %d, directly %d", viaShim, real);
  if (viaShim == ncclSuccess) {
    void* b = NULL; /* with a GPU: a forwarded collective on a NULL buffer is the real error */
    ncclResult_t ar = ncclAllReduce(b, b, 1, ncclFloat32, ncclSum, comm, NULL);
    CHECK(ar != ncclSuccess && ar != ncclInvalidUsage, "forwarded allreduce %d", ar);
    ncclCommDestroy(comm);
  }
  return 0;
}

static int selfCase(void) {
  int v = 0;
  ncclResult_t r = ncclGetVersion(&v);
  CHECK(r == ncclInvalidUsage, "FUSCO_NCCL_LIBRARY naming the shim: %d", r);
  CHECK(strstr(ncclGetLastError(NULL), "refusing to forward to itself"), "%s",
        ncclGetLastError(NULL));
  CHECK(ncclAlltoAll(NULL, NULL, 0, ncclInt8, NULL, NULL) == ncclInvalidUsage, "alltoall");
  return 0;
}

static void expectLog(ncclComm_t comm, const char* want) {
  const char* log = ncclGetLastError(comm);
  CHECK(strstr(log, want) != NULL, "the fake's log lacks \"%s\": %s", want, log);
}

static void exchangeCheck(ncclComm_t comm, int rank, int n, int grouped, int salt) {
  const size_t c = 37;
  uint8_t* s = malloc(c * n);
  uint8_t* r = malloc(c * n);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < c; ++i) s[p * c + i] = pattern(rank, p, i, salt);
  memset(r, 0xA5, c * n);
  if (!grouped) {
    NCCLOK(ncclAlltoAll(s, r, c, ncclUint8, comm, NULL));
  } else {
    NCCLOK(ncclGroupStart());
    for (int p = 0; p < n; ++p) {
      NCCLOK(ncclSend(s + p * c, c, ncclUint8, p, comm, NULL));
      NCCLOK(ncclRecv(r + p * c, c, ncclUint8, p, comm, NULL));
    }
    NCCLOK(ncclGroupEnd());
  }
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < c; ++i)
      CHECK(r[p * c + i] == pattern(p, rank, i, salt), "byte %zu from %d", i, p);
  free(s);
  free(r);
}

static void fakeBody(const ncclUniqueId* id, int rank, int n) {
  ncclComm_t comm = NULL;
  NCCLOK(ncclCommInitRank(&comm, n, *id, rank));
  int v = 0;
  NCCLOK(ncclGetVersion(&v));
  CHECK(v == 29999, "version %d is not the fake's", v);
  /* Forwarded, and the fake's call to its own ncclGroupStart stays inside it. */
  CHECK(ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, comm, NULL) == ncclInvalidUsage,
        "allreduce: %s", ncclGetLastError(comm));
  expectLog(comm, "GroupStart GroupEnd AllReduce ");
  exchangeCheck(comm, rank, n, 0, 1); /* fusco, on a lazily made communicator */
  expectLog(comm, "Broadcast");
  exchangeCheck(comm, rank, n, 1, 2); /* a group reaching every peer: fusco */
  uint8_t b[8] = {0};
  NCCLOK(ncclGroupStart()); /* partial: to the next rank only, replayed on the fake */
  NCCLOK(ncclSend(b, 1, ncclUint8, (rank + 1) % n, comm, NULL));
  NCCLOK(ncclRecv(b + 1, 1, ncclUint8, (rank + n - 1) % n, comm, NULL));
  NCCLOK(ncclGroupEnd());
  expectLog(comm, "GroupStart Send Recv GroupEnd ");
  NCCLOK(ncclGroupStart()); /* mixed: an all-to-all with another collective, replayed */
  NCCLOK(ncclAlltoAll(b, b, 0, ncclUint8, comm, NULL));
  NCCLOK(ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, comm, NULL)); /* held */
  CHECK(ncclGroupEnd() == ncclInvalidUsage, "the replayed allreduce's own result");
  expectLog(comm, "GroupStart AlltoAll GroupStart GroupEnd AllReduce GroupEnd ");
  CHECK(strstr(ncclGetLastError(comm), "reached-the-shim") == NULL, "%s", ncclGetLastError(comm));
  NCCLOK(ncclCommDestroy(comm));
}

int main(int argc, char** argv) {
  if (argc >= 3 && strcmp(argv[1], "real") == 0) return realCase(argv[2]);
  if (argc >= 2 && strcmp(argv[1], "self") == 0) return selfCase();
  if (argc >= 3 && strcmp(argv[1], "fake") == 0) {
    int bad = runRawRanks(atoi(argv[2]), fakeBody);
    printf("interposer over the fake NCCL on %s ranks: %s\n", argv[2], bad ? "FAILED" : "passed");
    return bad;
  }
  fprintf(stderr, "usage: %s real LIB | self | fake NRANKS\n", argv[0]);
  return 2;
}
