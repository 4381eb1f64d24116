/* A program written against NCCL's nccl.h, linked to libnccl.so.2 from the shim directory, run as
 * forked ranks in standalone mode: every datatype through ncclAlltoAll and grouped send/recv
 * all-to-all(v), bit-exact against the sequential reference (pattern()), zero counts, bad
 * arguments, an unserved collective, a killed rank and ncclCommSplit. */
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl_test.h"

static const size_t kCounts[] = {0, 1, 7, 1000};

/* Fills send block by block, runs the exchange, checks every received byte against what its
 * sender wrote. rc[s][d] = elements from s to d. */
typedef size_t (*CountFn)(int src, int dst, size_t base);
static size_t evenCount(int src, int dst, size_t base) { return base; }
static size_t unevenCount(int src, int dst, size_t base) {
  return ((size_t)(src * 7 + dst * 3) % 5) * base / 2; /* zeros included */
}

static void exchange(ncclComm_t comm, int rank, int n, ncclDataType_t t, size_t base, CountFn cnt,
                     int grouped, int skipZero, int salt) {
  const size_t es = typeSize(t);
  size_t sOff[64], rOff[64], sTot = 0, rTot = 0;
  for (int p = 0; p < n; ++p) {
    sOff[p] = sTot, sTot += cnt(rank, p, base) * es;
    rOff[p] = rTot, rTot += cnt(p, rank, base) * es;
  }
  uint8_t* hs = malloc(sTot + 1);
  uint8_t* hr = malloc(rTot + 1);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < cnt(rank, p, base) * es; ++i)
      hs[sOff[p] + i] = pattern(rank, p, i, salt);
  memset(hr, 0xA5, rTot + 1);
  void* ds = bufAlloc(sTot);
  void* dr = bufAlloc(rTot);
  toBuf(ds, hs, sTot);
  toBuf(dr, hr, rTot);
  if (!grouped) {
    NCCLOK(ncclAlltoAll(ds, dr, base, t, comm, gStream));
  } else {
    NCCLOK(ncclGroupStart());
    for (int p = 0; p < n; ++p) {
      size_t sc = cnt(rank, p, base), rc = cnt(p, rank, base);
      if (!(skipZero && sc == 0)) NCCLOK(ncclSend((char*)ds + sOff[p], sc, t, p, comm, gStream));
      if (!(skipZero && rc == 0)) NCCLOK(ncclRecv((char*)dr + rOff[p], rc, t, p, comm, gStream));
    }
    NCCLOK(ncclGroupEnd());
  }
  fromBuf(hr, dr, rTot);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < cnt(p, rank, base) * es; ++i)
      CHECK(hr[rOff[p] + i] == pattern(p, rank, i, salt),
            "type %d base %zu grouped %d: byte %zu from rank %d is 0x%02x, expected 0x%02x", t,
            base, grouped, i, p, hr[rOff[p] + i], pattern(p, rank, i, salt));
  bufFree(ds);
  bufFree(dr);
  free(hs);
  free(hr);
}

static void allToAllBody(ncclComm_t comm, int rank, int n) {
  for (int t = 0; t < ncclNumTypes; ++t)
    for (size_t c = 0; c < sizeof(kCounts) / sizeof(kCounts[0]); ++c)
      exchange(comm, rank, n, (ncclDataType_t)t, kCounts[c], evenCount, 0, 0, t * 10 + (int)c);
}

static void sendRecvBody(ncclComm_t comm, int rank, int n) {
  for (int t = 0; t < ncclNumTypes; ++t)
    for (size_t c = 0; c < sizeof(kCounts) / sizeof(kCounts[0]); ++c) {
      int salt = 100 + t * 10 + (int)c;
      exchange(comm, rank, n, (ncclDataType_t)t, kCounts[c], evenCount, 1, 0, salt);
      exchange(comm, rank, n, (ncclDataType_t)t, kCounts[c], unevenCount, 1, 0, salt + 1);
      /* PyTorch's all_to_all_single skips the peers of zero count. */
      exchange(comm, rank, n, (ncclDataType_t)t, kCounts[c], unevenCount, 1, 1, salt + 2);
    }
}

/* Bad arguments on one rank: it gets ncclInvalidArgument, no rank succeeds, the comm stays usable.
 */
static void badArgsBody(ncclComm_t comm, int rank, int n) {
  void* s = bufAlloc(64 * n);
  void* r = bufAlloc(64 * n);
  ncclDataType_t t = rank == 0 ? (ncclDataType_t)ncclNumTypes : ncclInt32;
  ncclResult_t res = ncclAlltoAll(s, r, 4, t, comm, gStream);
  if (rank == 0) {
    CHECK(res == ncclInvalidArgument, "bad datatype -> %d", res);
  } else if (gDevice) {
    /* Calls on a CUDA comm only enqueue: the peer's failure arrives asynchronously. */
    ncclResult_t async = ncclSuccess;
    CHECK(res == ncclSuccess, "an enqueueing call -> %d", res);
    syncStream();
    NCCLOK(ncclCommGetAsyncError(comm, &async));
    CHECK(async != ncclSuccess, "a peer's bad datatype must be reported here too");
  } else {
    CHECK(res != ncclSuccess, "a peer's bad datatype must fail here too");
  }
  CHECK(strlen(ncclGetLastError(comm)) > 0, "a message");
  CHECK(ncclAlltoAll(s, r, 4, ncclInt32, NULL, gStream) == ncclInvalidArgument, "NULL comm");
  /* A send to a peer outside the communicator inside an all-to-all group. */
  NCCLOK(ncclGroupStart());
  for (int p = 0; p < n; ++p) {
    ncclResult_t sr =
        ncclSend((char*)s + 4 * p, 1, ncclInt32, rank == 0 && p == 1 ? n : p, comm, gStream);
    CHECK(sr == ((rank == 0 && p == 1) ? ncclInvalidArgument : ncclSuccess), "send -> %d", sr);
    NCCLOK(ncclRecv((char*)r + 4 * p, 1, ncclInt32, p, comm, gStream));
  }
  if (gDevice && rank != 0) {
    ncclResult_t async = ncclSuccess;
    CHECK(ncclGroupEnd() == ncclSuccess, "an enqueueing group");
    syncStream();
    NCCLOK(ncclCommGetAsyncError(comm, &async));
    CHECK(async != ncclSuccess, "the group with a bad peer must be reported on every rank");
  } else {
    CHECK(ncclGroupEnd() != ncclSuccess, "the group with a bad peer must fail on every rank");
  }
  CHECK(ncclGroupEnd() == ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  bufFree(s);
  bufFree(r);
  for (int t2 = 0; t2 < 3; ++t2) exchange(comm, rank, n, ncclFloat32, 5, evenCount, t2 & 1, 0, 7);
}

static void unservedBody(ncclComm_t comm, int rank, int n) {
  void* b = bufAlloc(64);
  ncclResult_t r = ncclAllReduce(b, b, 4, ncclFloat32, ncclSum, comm, gStream);
  CHECK(r == ncclInvalidUsage, "ncclAllReduce -> %d", r);
  const char* msg = ncclGetLastError(comm);
  CHECK(strstr(msg, "ncclAllReduce is not served by fusco") && strstr(msg, "FUSCO_NCCL_LIBRARY"),
        "message: %s", msg);
  CHECK(ncclBroadcast(b, b, 4, ncclFloat32, 0, comm, gStream) == ncclInvalidUsage, "bcast");
  CHECK(strstr(ncclGetLastError(comm), "ncclBroadcast"), "%s", ncclGetLastError(comm));
  CHECK(ncclCommInitAll(NULL, 1, NULL) == ncclInvalidUsage, "ncclCommInitAll");
  bufFree(b);
  exchange(comm, rank, n, ncclUint8, 9, evenCount, 0, 0, 3);
}

/* The last rank dies after a first exchange; the others get ncclRemoteError, promptly. */
static void killBody(ncclComm_t comm, int rank, int n) {
  exchange(comm, rank, n, ncclInt64, 3, evenCount, 0, 0, 5);
  if (rank == n - 1) _exit(0);
  void* s = bufAlloc(8 * n);
  void* r = bufAlloc(8 * n);
  time_t start = time(NULL);
  ncclResult_t res = ncclSuccess, async = ncclSuccess;
  /* As NCCL's callers do: a call on a device comm only enqueues, so the peer's death may come
   * back from ncclCommGetAsyncError instead of the call; poll it between calls and after. */
  for (int i = 0; i < 100 && res == ncclSuccess && async == ncclSuccess; ++i) {
    res = ncclAlltoAll(s, r, 1, ncclInt64, comm, gStream);
    NCCLOK(ncclCommGetAsyncError(comm, &async));
  }
  while (res == ncclSuccess && async == ncclSuccess && time(NULL) - start < 30) {
    usleep(10 * 1000);
    NCCLOK(ncclCommGetAsyncError(comm, &async));
  }
  CHECK(res == ncclRemoteError || (res == ncclSuccess && async == ncclRemoteError),
        "after a peer died: call %d, async %d (%s)", res, async, ncclGetLastError(comm));
  CHECK(time(NULL) - start < 30, "took %ld s", (long)(time(NULL) - start));
  NCCLOK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclRemoteError, "async error %d", async);
  NCCLOK(ncclCommAbort(comm));
  _exit(0); /* the comm is gone: skip the harness's finalize and destroy */
}

/* color = rank % 2 (the last rank of 5+ out), key reverses the order. */
static void splitBody(ncclComm_t comm, int rank, int n) {
  int color = (n >= 5 && rank == n - 1) ? NCCL_SPLIT_NOCOLOR : rank % 2;
  ncclComm_t sub = (ncclComm_t)0x1;
  NCCLOK(ncclCommSplit(comm, color, -rank, &sub, NULL));
  if (color == NCCL_SPLIT_NOCOLOR) {
    CHECK(sub == NULL, "NOCOLOR gets NULL");
  } else {
    int members = 0, before = 0;
    for (int p = 0; p < n; ++p) {
      int pc = (n >= 5 && p == n - 1) ? -1 : p % 2;
      if (pc == color) members++, before += p > rank;
    }
    int cnt = -1, me = -1;
    NCCLOK(ncclCommCount(sub, &cnt));
    NCCLOK(ncclCommUserRank(sub, &me));
    CHECK(cnt == members && me == before, "count %d rank %d, expected %d %d", cnt, me, members,
          before);
    for (int t = 0; t < ncclNumTypes; t += 5)
      exchange(sub, me, cnt, (ncclDataType_t)t, 33, evenCount, t & 1, 0, t);
    NCCLOK(ncclCommDestroy(sub));
  }
  exchange(comm, rank, n, ncclFloat64, 4, evenCount, 1, 0, 11); /* the parent still works */
}

static void miscBody(ncclComm_t comm, int rank, int n) {
  int v = 0, cnt = 0, me = -1;
  NCCLOK(ncclGetVersion(&v));
  CHECK(v == NCCL_VERSION_CODE, "version %d", v);
  NCCLOK(pncclGetVersion(&v));
  NCCLOK(ncclCommCount(comm, &cnt));
  NCCLOK(pncclCommUserRank(comm, &me));
  CHECK(cnt == n && me == rank, "count %d rank %d", cnt, me);
  CHECK(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0, "error string");
  ncclResult_t async = ncclInProgress;
  NCCLOK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclSuccess, "async %d", async);
  void* s = NULL;
  void* r = NULL;
  void* hs = NULL;
  void* hr = NULL;
  if (!gDevice) {
    NCCLOK(ncclMemAlloc(&s, 256 * n));
    NCCLOK(ncclMemAlloc(&r, 256 * n));
    NCCLOK(ncclCommRegister(comm, s, 256 * n, &hs));
    NCCLOK(ncclCommRegister(comm, r, 256 * n, &hr));
    memset(s, rank, 256 * n);
    NCCLOK(ncclAlltoAll(s, r, 256, ncclUint8, comm, NULL));
    for (int p = 0; p < n; ++p) CHECK(((uint8_t*)r)[256 * p + 17] == p, "registered buffers");
    NCCLOK(ncclCommDeregister(comm, hs));
    NCCLOK(ncclCommDeregister(comm, hr));
    NCCLOK(ncclMemFree(s));
    NCCLOK(ncclMemFree(r));
  }
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr,
            "usage: %s alltoall|sendrecv|badargs|unserved|kill|split|misc NRANKS [--device]\n",
            argv[0]);
    return 2;
  }
  int n = atoi(argv[2]);
  if (argc > 3 && strcmp(argv[3], "--device") == 0) {
#ifdef FUSCO_NCCL_TEST_CUDA
    /* Probed in a child: CUDA must not be initialized in the process that forks the ranks. */
    pid_t probe = fork();
    if (probe == 0) {
      int count = 0;
      _exit(cudaGetDeviceCount(&count) == cudaSuccess && count > 0 ? 0 : 1);
    }
    int st = 0;
    waitpid(probe, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      printf("SKIP: no usable CUDA device\n");
      return 77;
    }
    gDevice = 1;
#else
    printf("SKIP: built without the CUDA runtime\n");
    return 77;
#endif
  }
  RankBody body = NULL;
  const char* names[] = {"alltoall", "sendrecv", "badargs", "unserved", "kill", "split", "misc"};
  RankBody bodies[] = {allToAllBody, sendRecvBody, badArgsBody, unservedBody,
                       killBody,     splitBody,    miscBody};
  for (int i = 0; i < 7; ++i)
    if (strcmp(argv[1], names[i]) == 0) body = bodies[i];
  if (body == NULL || n < 1 || n > 64) return 2;
  int bad = runRanks(n, body);
  printf("%s on %d ranks: %s\n", argv[1], n, bad ? "FAILED" : "passed");
  return bad;
}
