/* Careless use of the NCCL ABI in standalone mode (forked ranks, host memory): communicators used
 * after ncclCommDestroy or ncclCommAbort, groups that outlive their communicator, a failed call
 * inside a group, a split one rank refuses, a peer that dies while this rank is idle, and an
 * abort from another thread racing ncclGetLastError, ncclCommGetAsyncError or a blocked split. Each
 * case checks the result code, the message, and every byte of every buffer against the sequential
 * reference (pattern()) or its poison. Run under ASan in CI (.ci/run): no invalid read or write. */
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl_test.h"

#define POISON 0xA5

static double nowSec(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Checks that a message names what it must. */
#define CHECK_MSG(msg, word) \
  CHECK(strstr((msg), (word)) != NULL, "message lacks \"%s\": %s", word, msg)

/* An all-to-all of `count` int32 per peer on comm: seeded inputs, poisoned output, every received
 * byte checked against what its sender wrote. */
static void checkedAllToAll(ncclComm_t comm, int rank, int n, size_t count, int salt) {
  const size_t block = count * 4;
  uint8_t* s = calloc(block * n + 1, 1);
  uint8_t* r = malloc(block * n + 1);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < block; ++i) s[p * block + i] = pattern(rank, p, i, salt);
  memset(r, POISON, block * n + 1);
  NCCLOK(ncclAlltoAll(s, r, count, ncclInt32, comm, NULL));
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < block; ++i)
      CHECK(r[p * block + i] == pattern(p, rank, i, salt),
            "salt %d: byte %zu from rank %d is 0x%02x, expected 0x%02x", salt, i, p,
            r[p * block + i], pattern(p, rank, i, salt));
  CHECK(r[block * n] == POISON, "a byte past the receive buffer was written");
  free(s);
  free(r);
}

static void checkPoisoned(const uint8_t* buf, size_t bytes, const char* what) {
  for (size_t i = 0; i < bytes; ++i)
    CHECK(buf[i] == POISON, "%s: byte %zu is 0x%02x, the buffer must be untouched", what, i,
          buf[i]);
}

/* Every call on a handle that is no longer live: refused with ncclInvalidArgument and a message,
 * nothing written. */
static void expectDead(ncclComm_t dead, int n, const char* how) {
  uint8_t s[4 * 64], r[4 * 64 + 1];
  memset(s, 1, sizeof(s));
  memset(r, POISON, sizeof(r));
  CHECK(ncclAlltoAll(s, r, 1, ncclInt32, dead, NULL) == ncclInvalidArgument, "%s: alltoall", how);
  CHECK_MSG(ncclGetLastError(NULL), "ncclAlltoAll");
  CHECK_MSG(ncclGetLastError(NULL), "not a live communicator");
  checkPoisoned(r, 4 * n + 1, "ncclAlltoAll on a dead comm");
  ncclResult_t async = ncclInProgress;
  CHECK(ncclCommGetAsyncError(dead, &async) == ncclInvalidArgument, "%s: async", how);
  CHECK(async == ncclInProgress, "%s: asyncError written (%d)", how, async);
  CHECK_MSG(ncclGetLastError(NULL), "ncclCommGetAsyncError");
  int cnt = -7;
  CHECK(ncclCommCount(dead, &cnt) == ncclInvalidArgument && cnt == -7, "%s: count", how);
  CHECK(ncclCommDestroy(dead) == ncclInvalidArgument, "%s: a second destroy", how);
  CHECK_MSG(ncclGetLastError(NULL), "ncclCommDestroy");
  CHECK(ncclCommAbort(dead) == ncclInvalidArgument, "%s: abort", how);
  /* The dead comm has no message of its own: the thread's last one. */
  const char* msg = ncclGetLastError(dead);
  CHECK_MSG(msg, "ncclCommAbort");
  CHECK_MSG(msg, "not a live communicator");
}

/* Item 8: a destroyed or aborted communicator is refused without being read, also when a new
 * communicator was made after it; the live ones keep working. */
static void destroyedBody(const ncclUniqueId* id, int rank, int n) {
  ncclComm_t parent = NULL, a = NULL, b = NULL, c = NULL;
  NCCLOK(ncclCommInitRank(&parent, n, *id, rank));
  NCCLOK(ncclCommSplit(parent, 0, rank, &a, NULL));
  checkedAllToAll(a, rank, n, 3, 1);
  NCCLOK(ncclCommDestroy(a));
  NCCLOK(ncclCommSplit(parent, 0, rank, &b, NULL)); /* may be made where a was */
  expectDead(a, n, "destroyed");
  checkedAllToAll(b, rank, n, 5, 2); /* a's second destroy did not take b */
  NCCLOK(ncclCommSplit(parent, 0, n - rank, &c, NULL));
  NCCLOK(ncclCommAbort(c));
  expectDead(c, n, "aborted");
  checkedAllToAll(b, rank, n, 7, 3);
  checkedAllToAll(parent, rank, n, 2, 4);
  NCCLOK(ncclCommDestroy(b));
  NCCLOK(ncclCommDestroy(parent));
  expectDead(parent, n, "destroyed parent");
}

/* A registration handle taken back stays dead: deregistering it again is ncclInvalidArgument and
 * leaves the registration made after it in place, which its own handle still removes. */
static void staleRegistrationBody(const ncclUniqueId* id, int rank, int n) {
  ncclComm_t comm = NULL;
  NCCLOK(ncclCommInitRank(&comm, n, *id, rank));
  uint8_t* a = malloc(4096);
  uint8_t* b = malloc(4096);
  for (int round = 0; round < 4; ++round) {
    void* ha = NULL;
    void* hb = NULL;
    NCCLOK(ncclCommRegister(comm, a, 4096, &ha));
    NCCLOK(ncclCommDeregister(comm, ha));
    NCCLOK(ncclCommRegister(comm, b, 4096, &hb));
    CHECK(ha != hb, "round %d: a registration handle was given out twice", round);
    CHECK(ncclCommDeregister(comm, ha) == ncclInvalidArgument,
          "round %d: a stale registration handle was taken", round);
    CHECK_MSG(ncclGetLastError(comm), "not a registration of this comm");
    NCCLOK(ncclCommDeregister(comm, hb));
  }
  checkedAllToAll(comm, rank, n, 3, 5);
  free(a);
  free(b);
  NCCLOK(ncclCommDestroy(comm));
}

/* Item 1: ncclGroupStart, a send and a receive with every peer (or an ncclAlltoAll), the group's
 * communicator destroyed or aborted, ncclGroupEnd: ncclInvalidArgument naming the call, no byte
 * moved, and the process goes on with its other communicators. */
static int gAbort; /* 1: ncclCommAbort instead of ncclCommDestroy */
static void groupOutlivesCommBody(const ncclUniqueId* id, int rank, int n) {
  ncclComm_t parent = NULL, c = NULL;
  NCCLOK(ncclCommInitRank(&parent, n, *id, rank));
  const size_t block = 8;
  uint8_t* s = malloc(block * n);
  uint8_t* r = malloc(block * n);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < block; ++i) s[p * block + i] = pattern(rank, p, i, 9);
  for (int alltoall = 0; alltoall < 2; ++alltoall) {
    NCCLOK(ncclCommSplit(parent, 0, rank, &c, NULL));
    memset(r, POISON, block * n);
    NCCLOK(ncclGroupStart());
    if (alltoall) {
      NCCLOK(ncclAlltoAll(s, r, block / 4, ncclInt32, c, NULL));
    } else {
      for (int p = 0; p < n; ++p) {
        NCCLOK(ncclSend(s + p * block, block / 4, ncclInt32, p, c, NULL));
        NCCLOK(ncclRecv(r + p * block, block / 4, ncclInt32, p, c, NULL));
      }
    }
    NCCLOK(gAbort ? ncclCommAbort(c) : ncclCommDestroy(c));
    ncclResult_t res = ncclGroupEnd();
    CHECK(res == ncclInvalidArgument, "ncclGroupEnd after the comm went: %d (%s)", res,
          ncclGetLastError(NULL));
    const char* msg = ncclGetLastError(NULL);
    CHECK_MSG(msg, "ncclGroupEnd");
    CHECK_MSG(msg, alltoall ? "ncclAlltoAll" : "ncclSend");
    CHECK_MSG(msg, "destroyed or aborted before ncclGroupEnd");
    checkPoisoned(r, block * n, "the receive buffer of a group whose comm went");
    CHECK_MSG(ncclGetLastError(c), "destroyed or aborted before ncclGroupEnd"); /* the thread's */
    CHECK(ncclGroupEnd() == ncclInvalidUsage, "the group is over");
  }
  free(s);
  free(r);
  checkedAllToAll(parent, rank, n, 6, 10); /* the process goes on */
  NCCLOK(ncclCommDestroy(parent));
}

/* Item 2: rank 0's ncclGroupEnd waits for peers that do not take part; another thread of rank 0
 * aborts the communicator. The group ends with an error saying so, well before the timeout, and
 * nothing is written into the freed communicator or the receive buffers. The peers then meet
 * rank 0 on the parent, whose all-to-all is exact. */
typedef struct {
  ncclComm_t comm;
  ncclResult_t result;
} AbortArg;
static void* abortLater(void* p) {
  AbortArg* a = (AbortArg*)p;
  usleep(300 * 1000);
  a->result = ncclCommAbort(a->comm);
  return NULL;
}
static void abortDuringGroupBody(const ncclUniqueId* id, int rank, int n) {
  ncclComm_t parent = NULL, c = NULL;
  NCCLOK(ncclCommInitRank(&parent, n, *id, rank));
  NCCLOK(ncclCommSplit(parent, 0, rank, &c, NULL));
  if (rank == 0) {
    const size_t block = 16;
    uint8_t* s = malloc(block * n);
    uint8_t* r = malloc(block * n);
    memset(s, 3, block * n);
    memset(r, POISON, block * n);
    AbortArg arg = {c, ncclInProgress};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, abortLater, &arg) == 0, "pthread_create");
    const double start = nowSec();
    NCCLOK(ncclGroupStart());
    for (int p = 0; p < n; ++p) {
      NCCLOK(ncclSend(s + p * block, block, ncclUint8, p, c, NULL));
      NCCLOK(ncclRecv(r + p * block, block, ncclUint8, p, c, NULL));
    }
    ncclResult_t res = ncclGroupEnd();
    const double took = nowSec() - start;
    pthread_join(t, NULL);
    CHECK(arg.result == ncclSuccess, "ncclCommAbort from another thread: %d", arg.result);
    CHECK(res != ncclSuccess && res != ncclInProgress, "an aborted group: %d", res);
    CHECK_MSG(ncclGetLastError(NULL), "abort");
    CHECK(took < 4.0, "the aborted group took %.2f s (timeout 5 s)", took);
    checkPoisoned(r + block, block * (n - 1), "blocks from peers that sent nothing");
    CHECK(ncclCommDestroy(c) == ncclInvalidArgument, "the aborted comm is gone");
    free(s);
    free(r);
  }
  checkedAllToAll(parent, rank, n, 4, 12); /* rank 0 is back */
  if (rank != 0) NCCLOK(ncclCommDestroy(c));
  NCCLOK(ncclCommDestroy(parent));
}

/* A group of a send and a receive with every peer, plus `bad` (a call that fails) on every rank
 * where bad is not NULL and depth nested groups around it. Returns ncclGroupEnd's result; every
 * received byte is checked: the good calls of the group still move their data. */
typedef ncclResult_t (*BadCall)(ncclComm_t comm);
static ncclResult_t groupWith(ncclComm_t comm, int rank, int n, BadCall bad, ncclResult_t want,
                              int nested, int salt) {
  const size_t block = 12;
  uint8_t* s = malloc(block * n);
  uint8_t* r = malloc(block * n + 1);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < block; ++i) s[p * block + i] = pattern(rank, p, i, salt);
  memset(r, POISON, block * n + 1);
  NCCLOK(ncclGroupStart());
  for (int p = 0; p < n; ++p) NCCLOK(ncclSend(s + p * block, block / 4, ncclInt32, p, comm, NULL));
  if (nested) NCCLOK(ncclGroupStart());
  if (bad != NULL) CHECK(bad(comm) == want, "the bad call inside the group");
  if (nested) NCCLOK(ncclGroupEnd()); /* an inner end: the outer one reports the group */
  for (int p = 0; p < n; ++p) NCCLOK(ncclRecv(r + p * block, block / 4, ncclInt32, p, comm, NULL));
  ncclResult_t res = ncclGroupEnd();
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < block; ++i)
      CHECK(r[p * block + i] == pattern(p, rank, i, salt), "byte %zu from rank %d is 0x%02x", i, p,
            r[p * block + i]);
  CHECK(r[block * n] == POISON, "a byte past the receive buffer was written");
  free(s);
  free(r);
  return res;
}
static ncclResult_t allReduce(ncclComm_t comm) {
  static float v[4];
  return ncclAllReduce(v, v, 4, ncclFloat32, ncclSum, comm, NULL);
}
static ncclResult_t nullAllToAll(ncclComm_t comm) {
  static int32_t v[64];
  return ncclAlltoAll(v, v, 1, ncclInt32, NULL, NULL);
}
static ncclResult_t initInGroup(ncclComm_t comm) {
  ncclUniqueId id;
  ncclComm_t c = NULL;
  memset(&id, 0, sizeof(id));
  return ncclCommInitRank(&c, 2, id, 0);
}

/* Item 7: ncclGroupEnd returns the group's first error (a call inside it that failed), with its
 * message, nested or not; the next group is clean again. */
static void groupErrorBody(ncclComm_t comm, int rank, int n) {
  for (int nested = 0; nested < 2; ++nested) {
    ncclResult_t res = groupWith(comm, rank, n, allReduce, ncclInvalidUsage, nested, 20 + nested);
    CHECK(res == ncclInvalidUsage, "nested %d: a group with an unserved ncclAllReduce: %d", nested,
          res);
    CHECK_MSG(ncclGetLastError(NULL), "ncclAllReduce is not served by fusco");
    CHECK(groupWith(comm, rank, n, NULL, ncclSuccess, nested, 22) == ncclSuccess, "a clean group");
  }
  ncclResult_t res = groupWith(comm, rank, n, nullAllToAll, ncclInvalidArgument, 0, 23);
  CHECK(res == ncclInvalidArgument, "a group with an ncclAlltoAll on a NULL comm: %d", res);
  CHECK_MSG(ncclGetLastError(NULL), "ncclAlltoAll: comm is NULL");
  res = groupWith(comm, rank, n, initInGroup, ncclInvalidUsage, 0, 24);
  CHECK(res == ncclInvalidUsage, "a group with ncclCommInitRank: %d", res);
  CHECK_MSG(ncclGetLastError(NULL), "inside ncclGroupStart/ncclGroupEnd");
  CHECK(groupWith(comm, rank, n, NULL, ncclSuccess, 0, 25) == ncclSuccess, "a clean group");
  checkedAllToAll(comm, rank, n, 3, 26);
}

static void groupErrorRaw(const ncclUniqueId* id, int rank, int n) {
  ncclComm_t comm = NULL;
  NCCLOK(ncclCommInitRank(&comm, n, *id, rank));
  groupErrorBody(comm, rank, n);
  NCCLOK(ncclCommDestroy(comm));
}

/* Item 3: rank 1 passes ncclCommSplit a config whose magic is wrong. It gets ncclInvalidArgument
 * but still takes part in the split's exchanges on the parent, so the others get their new
 * communicator (without rank 1) and the next all-to-all on the parent is exact on every rank. */
static void splitBadConfigBody(const ncclUniqueId* id, int rank, int n) {
  ncclComm_t parent = NULL, sub = NULL;
  NCCLOK(ncclCommInitRank(&parent, n, *id, rank));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  if (rank == 1) cfg.magic = 0x12345678u;
  ncclResult_t res = ncclCommSplit(parent, 0, rank, &sub, &cfg);
  if (rank == 1) {
    CHECK(res == ncclInvalidArgument, "a split with a bad config: %d", res);
    CHECK(sub == NULL, "no new communicator");
    CHECK_MSG(ncclGetLastError(NULL), "NCCL_CONFIG_INITIALIZER (magic 0x12345678)");
    CHECK_MSG(ncclGetLastError(parent), "ncclCommSplit");
  } else {
    CHECK(res == ncclSuccess, "the split of the others: %d (%s)", res, ncclGetLastError(NULL));
    int cnt = -1, me = -1;
    NCCLOK(ncclCommCount(sub, &cnt));
    NCCLOK(ncclCommUserRank(sub, &me));
    CHECK(cnt == n - 1 && me == rank - (rank > 1), "count %d rank %d", cnt, me);
    checkedAllToAll(sub, me, cnt, 5, 30);
    NCCLOK(ncclCommDestroy(sub));
  }
  checkedAllToAll(parent, rank, n, 2, 31);  /* the 8 bytes per peer, as the split's */
  checkedAllToAll(parent, rank, n, 32, 32); /* and the 128 of its second (a unique id) */
  NCCLOK(ncclCommDestroy(parent));
}

/* Item 9: the last rank exits while the others are idle. After more than FUSCO_TIMEOUT_MS they ask
 * ncclCommGetAsyncError, which reports ncclRemoteError naming the dead rank (README: a dead peer
 * makes calls and ncclCommGetAsyncError return ncclRemoteError within FUSCO_TIMEOUT_MS); the next
 * all-to-all fails at once and writes nothing. */
static void idlePeerDeathBody(const ncclUniqueId* id, int rank, int n) {
  ncclComm_t comm = NULL;
  NCCLOK(ncclCommInitRank(&comm, n, *id, rank));
  checkedAllToAll(comm, rank, n, 3, 40);
  if (rank == n - 1) _exit(0); /* dies without a word */
  const char* t = getenv("FUSCO_TIMEOUT_MS");
  const long timeoutMs = t != NULL ? atol(t) : 30000;
  CHECK(timeoutMs <= 5000, "run with a short FUSCO_TIMEOUT_MS (%ld)", timeoutMs);
  usleep((useconds_t)(timeoutMs + 300) * 1000);
  ncclResult_t async = ncclInProgress;
  NCCLOK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclRemoteError, "an idle rank whose peer died: async %d", async);
  char dead[32];
  snprintf(dead, sizeof(dead), "rank %d", n - 1);
  CHECK_MSG(ncclGetLastError(comm), dead);
  CHECK_MSG(ncclGetLastError(comm), "died");
  uint8_t s[4 * 64], r[4 * 64];
  memset(s, 1, sizeof(s));
  memset(r, POISON, sizeof(r));
  const double start = nowSec();
  ncclResult_t res = ncclAlltoAll(s, r, 1, ncclInt32, comm, NULL);
  CHECK(res == ncclRemoteError, "an all-to-all after the death: %d (%s)", res,
        ncclGetLastError(comm));
  CHECK(nowSec() - start < 1.0, "it took %.2f s", nowSec() - start);
  checkPoisoned(r, 4 * n, "the receive buffer of an all-to-all on a broken comm");
  NCCLOK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclRemoteError, "the comm stays broken: %d", async);
  NCCLOK(ncclCommAbort(comm));
}

/* A communicator of this process alone, from a fresh unique id. */
static ncclComm_t soloComm(void) {
  ncclUniqueId id;
  ncclComm_t c = NULL;
  NCCLOK(ncclGetUniqueId(&id));
  NCCLOK(ncclCommInitRank(&c, 1, id, 0));
  return c;
}

typedef struct {
  ncclComm_t comm;
  volatile int done;
  ncclResult_t result;
  int sleepUs;
} Aborter;
static void* abortNow(void* p) {
  Aborter* a = (Aborter*)p;
  usleep((useconds_t)a->sleepUs);
  a->result = ncclCommAbort(a->comm);
  a->done = 1;
  return NULL;
}
static void* failCount(void* p) {
  CHECK(ncclCommCount((ncclComm_t)p, NULL) == ncclInvalidArgument, "ncclCommCount(comm, NULL)");
  return NULL;
}

/* The text ncclGetLastError(comm) returned before another thread aborted comm stays the reader's
 * afterwards, also once the heap has handed the comm's memory out again (ASan in CI sees a read of
 * freed memory at once). */
static void abortLastErrorBody(const ncclUniqueId* id, int rank, int n) {
  (void)id;
  (void)n;
  if (rank != 0) return;
  for (int i = 0; i < 30; ++i) {
    ncclComm_t c = soloComm();
    pthread_t t;
    CHECK(pthread_create(&t, NULL, failCount, c) == 0, "pthread_create");
    pthread_join(t, NULL);
    const char* text = ncclGetLastError(c);
    char want[256];
    snprintf(want, sizeof(want), "%s", text);
    CHECK_MSG(want, "ncclCommCount");
    Aborter a = {c, 0, ncclInProgress, (i % 5) * 100};
    CHECK(pthread_create(&t, NULL, abortNow, &a) == 0, "pthread_create");
    pthread_join(t, NULL);
    CHECK(a.result == ncclSuccess, "ncclCommAbort: %d", a.result);
    char* churn[128];
    for (int k = 0; k < 128; ++k) {
      churn[k] = malloc(strlen(want) + 1);
      memset(churn[k], 'x', strlen(want));
      churn[k][strlen(want)] = '\0';
    }
    CHECK(strcmp(text, want) == 0, "the text changed after the abort: '%s'", text);
    for (int k = 0; k < 128; ++k) free(churn[k]);
  }
}

/* NCCL's watchdog pattern: one thread asks ncclCommGetAsyncError in a loop while another aborts
 * the comm. Every answer is a result or a clean refusal of a dead comm, never ncclInternalError. */
static void abortAsyncErrorBody(const ncclUniqueId* id, int rank, int n) {
  (void)id;
  (void)n;
  if (rank != 0) return;
  int refused = 0;
  for (int i = 0; i < 300; ++i) {
    ncclComm_t c = soloComm();
    Aborter a = {c, 0, ncclInProgress, (i % 8) * 100};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, abortNow, &a) == 0, "pthread_create");
    for (int k = 0; k < 1000000; ++k) {
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(c, &async);
      if (r == ncclSuccess) continue;
      CHECK(r == ncclInvalidArgument || r == ncclInvalidUsage, "call %d beside an abort: %d (%s)",
            k, r, ncclGetLastError(NULL));
      ++refused;
      break;
    }
    pthread_join(t, NULL);
    CHECK(a.result == ncclSuccess, "ncclCommAbort: %d", a.result);
  }
  CHECK(refused > 0, "no call ever met the abort");
}

/* Rank 0's ncclCommSplit waits for rank 1, which comes 2.5 s late; another thread of rank 0
 * aborts the parent after 300 ms. The split returns an error within half a second of the abort
 * (the timeout is a minute), and rank 1's late split fails instead of waiting. */
static void abortSplitBody(const ncclUniqueId* id, int rank, int n) {
  ncclComm_t parent = NULL, sub = NULL;
  NCCLOK(ncclCommInitRank(&parent, n, *id, rank));
  if (rank != 0) {
    usleep(2500 * 1000);
    CHECK(ncclCommSplit(parent, 0, rank, &sub, NULL) != ncclSuccess, "a split after rank 0 left");
    ncclCommAbort(parent);
    return;
  }
  Aborter a = {parent, 0, ncclInProgress, 300 * 1000};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, abortNow, &a) == 0, "pthread_create");
  const double start = nowSec();
  ncclResult_t r = ncclCommSplit(parent, 0, rank, &sub, NULL);
  const double took = nowSec() - start;
  pthread_join(t, NULL);
  CHECK(a.result == ncclSuccess, "ncclCommAbort: %d", a.result);
  CHECK(r != ncclSuccess && sub == NULL, "an aborted split: %d", r);
  CHECK_MSG(ncclGetLastError(NULL), "abort");
  CHECK(took < 0.8, "the split woke %.2f s after the abort", took - 0.3);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(
        stderr,
        "usage: %s destroyed|group-destroy|group-abort|abort-during-group|group-error|split-config|"
        "idle-peer-death|stale-registration|abort-last-error|abort-async-error|abort-split "
        "NRANKS\n",
        argv[0]);
    return 2;
  }
  int n = atoi(argv[2]);
  const char* names[] = {"destroyed",          "group-destroy",      "group-abort",
                         "abort-during-group", "group-error",        "split-config",
                         "idle-peer-death",    "stale-registration", "abort-last-error",
                         "abort-async-error",  "abort-split"};
  RawBody bodies[] = {destroyedBody,        groupOutlivesCommBody, groupOutlivesCommBody,
                      abortDuringGroupBody, groupErrorRaw,         splitBadConfigBody,
                      idlePeerDeathBody,    staleRegistrationBody, abortLastErrorBody,
                      abortAsyncErrorBody,  abortSplitBody};
  gAbort = strcmp(argv[1], "group-abort") == 0;
  RawBody body = NULL;
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); ++i)
    if (strcmp(argv[1], names[i]) == 0) body = bodies[i];
  if (body == NULL || n < 1 || n > 64) return 2;
  int bad = runRawRanks(n, body);
  printf("%s on %d ranks: %s\n", argv[1], n, bad ? "FAILED" : "passed");
  return bad;
}
