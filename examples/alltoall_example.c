/*
 * alltoall_example: the smallest complete fusco program.
 *
 * The parent makes a unique id and forks NRANKS rank processes on this host. Each rank makes a
 * communicator, sends COUNT ints to every rank with fuscoAllToAll, checks what it received and
 * destroys the communicator. On a cluster the id would travel to the ranks through MPI_Bcast or a
 * file instead of fork (see perf/launcher.cc).
 *
 *   build/examples/alltoall_example        prints "OK" and exits 0 on success
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fusco.h"

#define NRANKS 4
#define COUNT 1000 /* ints to and from every rank */

#define CHECK(call)                                                                         \
  do {                                                                                      \
    fuscoResult_t r_ = (call);                                                              \
    if (r_ != fuscoSuccess) {                                                               \
      fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, #call, fuscoGetErrorString(r_), \
              fuscoGetLastError(comm));                                                     \
      return 1;                                                                             \
    }                                                                                       \
  } while (0)

/* What rank src puts in element i of its block for rank dst. */
static int32_t value(int src, int dst, int i) { return src * 1000000 + dst * 10000 + i; }

static int runRank(fuscoUniqueId id, int rank) {
  fuscoComm_t comm = NULL;
  int32_t* sendbuf = malloc(sizeof(int32_t) * COUNT * NRANKS);
  int32_t* recvbuf = malloc(sizeof(int32_t) * COUNT * NRANKS);
  int dst, src, i, wrong = 0;
  if (sendbuf == NULL || recvbuf == NULL) return 1;

  CHECK(fuscoCommInitRank(&comm, NRANKS, id, rank));
  /* Block dst of sendbuf goes to rank dst; block src of recvbuf comes from rank src. */
  for (dst = 0; dst < NRANKS; ++dst)
    for (i = 0; i < COUNT; ++i) sendbuf[dst * COUNT + i] = value(rank, dst, i);
  CHECK(fuscoAllToAll(sendbuf, recvbuf, COUNT, fuscoInt32, comm, NULL));
  for (src = 0; src < NRANKS; ++src)
    for (i = 0; i < COUNT; ++i) wrong += recvbuf[src * COUNT + i] != value(src, rank, i);
  CHECK(fuscoCommDestroy(comm));

  free(sendbuf);
  free(recvbuf);
  if (wrong != 0) fprintf(stderr, "rank %d: %d wrong elements\n", rank, wrong);
  return wrong != 0;
}

int main(void) {
  fuscoUniqueId id;
  pid_t pids[NRANKS];
  int rank, failed = 0;
  fuscoResult_t r;

  /* Before fork: the id's listening socket must exist in the process rank 0 is forked from. */
  if ((r = fuscoGetUniqueId(&id)) != fuscoSuccess) {
    fprintf(stderr, "fuscoGetUniqueId failed: %s: %s\n", fuscoGetErrorString(r),
            fuscoGetLastError(NULL));
    return 1;
  }
  fflush(stdout);
  for (rank = 0; rank < NRANKS; ++rank) {
    pids[rank] = fork();
    if (pids[rank] == 0) _exit(runRank(id, rank));
    if (pids[rank] < 0) {
      perror("fork");
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
  if (failed) return 1;
  printf("OK\n");
  return 0;
}
