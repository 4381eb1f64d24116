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

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s destroyed NRANKS\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[2]);
  const char* names[] = {"destroyed"};
  RawBody bodies[] = {destroyedBody};
  RawBody body = NULL;
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); ++i)
    if (strcmp(argv[1], names[i]) == 0) body = bodies[i];
  if (body == NULL || n < 1 || n > 64) return 2;
  int bad = runRawRanks(n, body);
  printf("%s on %d ranks: %s\n", argv[1], n, bad ? "FAILED" : "passed");
  return bad;
}
