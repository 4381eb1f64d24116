/*
 * Package test program: built against an installed fusco (find_package or pkg-config), it forks
 * NRANKS ranks that each make a communicator and run fuscoAllToAllv with seeded random counts and
 * displacements with gaps, over several datatypes and both plain and fuscoMemAlloc buffers. Every
 * received element and every gap byte is checked bit for bit. Exit status 0 means all passed.
 */
#define _POSIX_C_SOURCE 200809L

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fusco.h"

#define NRANKS 4
#define ROUNDS 6
#define MAX_COUNT 300
#define POISON 0xA5

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* Every rank derives the same counts matrix and gaps from the round's seed. */
static size_t countOf(uint64_t seed, int src, int dst) {
  uint64_t h = mix64(seed ^ ((uint64_t)src << 8) ^ (uint64_t)dst);
  return (h % 5 == 0) ? 0 : (size_t)((h >> 8) % MAX_COUNT) + 1;
}
static size_t gapOf(uint64_t seed, int rank, int peer, int recvSide) {
  return (size_t)(mix64(seed ^ 0xabcdefULL ^ ((uint64_t)rank << 16) ^ ((uint64_t)peer << 4) ^
                        (uint64_t)recvSide) %
                  4);
}
static uint64_t valueOf(uint64_t seed, int src, int dst, size_t i) {
  return mix64(seed ^ ((uint64_t)src << 48) ^ ((uint64_t)dst << 32) ^ (uint64_t)i);
}

typedef struct {
  fuscoDataType_t type;
  size_t bytes;
  const char* name;
} Type;
static const Type kTypes[] = {{fuscoUint64, 8, "uint64"},
                              {fuscoInt32, 4, "int32"},
                              {fuscoBfloat16, 2, "bfloat16"},
                              {fuscoUint8, 1, "uint8"}};

static int fail(int rank, const char* what, fuscoResult_t r, fuscoComm_t comm) {
  fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, what, fuscoGetErrorString(r),
          fuscoGetLastError(comm));
  return 1;
}

/* One fuscoAllToAllv round. Send blocks in peer order, receive blocks in reverse peer order, each
 * after a small gap; returns the number of wrong elements and touched gap bytes, or -1. */
static long runRound(fuscoComm_t comm, int rank, int round) {
  const uint64_t seed = 0xf05c0ULL + (uint64_t)round * 7919;
  const Type* t = &kTypes[round % 4];
  const int useArena = round % 2;
  size_t scount[NRANKS], sdispl[NRANKS], rcount[NRANKS], rdispl[NRANKS];
  size_t stotal = 0, rtotal = 0, i;
  int p;
  long wrong = 0;
  unsigned char *sbuf = NULL, *rbuf = NULL;
  fuscoResult_t r;

  for (p = 0; p < NRANKS; ++p) {
    stotal += gapOf(seed, rank, p, 0);
    sdispl[p] = stotal;
    scount[p] = countOf(seed, rank, p);
    stotal += scount[p];
  }
  for (p = NRANKS - 1; p >= 0; --p) {
    rtotal += gapOf(seed, rank, p, 1);
    rdispl[p] = rtotal;
    rcount[p] = countOf(seed, p, rank);
    rtotal += rcount[p];
  }
  if (useArena) {
    void *s = NULL, *q = NULL;
    if ((r = fuscoMemAlloc(comm, &s, stotal * t->bytes + 1)) != fuscoSuccess)
      return -fail(rank, "fuscoMemAlloc", r, comm);
    if ((r = fuscoMemAlloc(comm, &q, rtotal * t->bytes + 1)) != fuscoSuccess)
      return -fail(rank, "fuscoMemAlloc", r, comm);
    sbuf = s;
    rbuf = q;
  } else {
    sbuf = malloc(stotal * t->bytes + 1);
    rbuf = malloc(rtotal * t->bytes + 1);
    if (sbuf == NULL || rbuf == NULL) return -1;
  }
  memset(sbuf, POISON, stotal * t->bytes);
  memset(rbuf, POISON, rtotal * t->bytes);
  for (p = 0; p < NRANKS; ++p) {
    for (i = 0; i < scount[p]; ++i) {
      uint64_t v = valueOf(seed, rank, p, i);
      memcpy(sbuf + (sdispl[p] + i) * t->bytes, &v, t->bytes); /* little endian: low bytes */
    }
  }

  r = fuscoAllToAllv(sbuf, scount, sdispl, rbuf, rcount, rdispl, t->type, comm, NULL);
  if (r != fuscoSuccess) {
    wrong = -fail(rank, "fuscoAllToAllv", r, comm);
  } else {
    size_t pos = 0;
    for (p = NRANKS - 1; p >= 0; --p) { /* the gap before block p, then block p */
      for (; pos < rdispl[p] * t->bytes; ++pos) wrong += rbuf[pos] != POISON;
      for (i = 0; i < rcount[p]; ++i) {
        uint64_t v = valueOf(seed, p, rank, i);
        if (memcmp(rbuf + (rdispl[p] + i) * t->bytes, &v, t->bytes) != 0 && wrong++ < 3)
          fprintf(stderr, "rank %d round %d (%s): element %zu from rank %d is wrong\n", rank, round,
                  t->name, i, p);
      }
      pos = (rdispl[p] + rcount[p]) * t->bytes;
    }
  }
  if (useArena) {
    fuscoMemFree(comm, sbuf);
    fuscoMemFree(comm, rbuf);
  } else {
    free(sbuf);
    free(rbuf);
  }
  return wrong;
}

static int runRank(fuscoUniqueId id, int rank) {
  fuscoComm_t comm = NULL;
  fuscoConfig_t config = FUSCO_CONFIG_INITIALIZER;
  fuscoResult_t r;
  long wrong = 0, w;
  int round;
  config.timeoutMs = 60000;
  if ((r = fuscoCommInitRankConfig(&comm, NRANKS, id, rank, &config)) != fuscoSuccess)
    return fail(rank, "fuscoCommInitRankConfig", r, NULL);
  for (round = 0; round < ROUNDS; ++round) {
    w = runRound(comm, rank, round);
    if (w < 0) {
      fuscoCommDestroy(comm);
      return 1;
    }
    wrong += w;
  }
  if ((r = fuscoCommDestroy(comm)) != fuscoSuccess) return fail(rank, "fuscoCommDestroy", r, NULL);
  if (wrong != 0) fprintf(stderr, "rank %d: %ld wrong elements or gap bytes\n", rank, wrong);
  return wrong != 0;
}

int main(void) {
  fuscoUniqueId id;
  pid_t pids[NRANKS];
  int rank, failed = 0, version = 0;
  fuscoResult_t r;

  if ((r = fuscoGetVersion(&version)) != fuscoSuccess || version != FUSCO_VERSION_CODE) {
    fprintf(stderr, "library version %d, header version %d\n", version, FUSCO_VERSION_CODE);
    return 1;
  }
  if ((r = fuscoGetUniqueId(&id)) != fuscoSuccess) return fail(-1, "fuscoGetUniqueId", r, NULL);
  fflush(stdout);
  for (rank = 0; rank < NRANKS; ++rank) {
    pids[rank] = fork();
    if (pids[rank] == 0) _exit(runRank(id, rank));
    if (pids[rank] < 0) {
      perror("fork");
      while (--rank >= 0) kill(pids[rank], SIGKILL);
      return 1;
    }
  }
  for (rank = 0; rank < NRANKS; ++rank) {
    int status = 0;
    if (waitpid(pids[rank], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "rank %d failed\n", rank);
      failed = 1;
    }
  }
  if (!failed) printf("fuscoAllToAllv: %d ranks, %d rounds: OK\n", NRANKS, ROUNDS);
  return failed;
}
