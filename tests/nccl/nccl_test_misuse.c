/* Careless use of the NCCL ABI in standalone mode (forked ranks, host memory): communicators used
 * after ncclCommDestroy or ncclCommAbort, groups that outlive their communicator, a failed call
 * inside a group, a split one rank refuses, a peer that dies while this rank is idle. Each case
 * checks the result code, the message, and every byte of every buffer against the sequential
 * reference (pattern()) or its poison. Run under ASan in CI (.ci/run): no invalid read or write. */
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl_test.h"

#define POISON 0xA5

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

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s destroyed|group-destroy|group-abort NRANKS\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[2]);
  const char* names[] = {"destroyed", "group-destroy", "group-abort"};
  RawBody bodies[] = {destroyedBody, groupOutlivesCommBody, groupOutlivesCommBody};
  gAbort = strcmp(argv[1], "group-abort") == 0;
  RawBody body = NULL;
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); ++i)
    if (strcmp(argv[1], names[i]) == 0) body = bodies[i];
  if (body == NULL || n < 1 || n > 64) return 2;
  int bad = runRawRanks(n, body);
  printf("%s on %d ranks: %s\n", argv[1], n, bad ? "FAILED" : "passed");
  return bad;
}
