/* Shared pieces of the NCCL ABI tests: forked ranks, checks, buffers in host or device memory. */
#ifndef FUSCO_NCCL_TEST_H_
#define FUSCO_NCCL_TEST_H_

#include <nccl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* A failed check prints where and why, and the rank exits 1. */
#define CHECK(cond, ...)                                                                       \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", gRank, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                            \
      fprintf(stderr, "\n");                                                                   \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)
#define NCCLOK(call)                                                                      \
  do {                                                                                    \
    ncclResult_t r_ = (call);                                                             \
    CHECK(r_ == ncclSuccess, "%s -> %d (%s): %s", #call, (int)r_, ncclGetErrorString(r_), \
          ncclGetLastError(NULL));                                                        \
  } while (0)

extern int gRank;
extern int gDevice; /* 1: device buffers and a stream (the [gpu] variant) */
extern cudaStream_t gStream;

/* Forks n ranks sharing one unique id and runs body in each; returns 0 when every rank exits 0. */
typedef void (*RankBody)(ncclComm_t comm, int rank, int n);
int runRanks(int n, RankBody body);
/* Forks n ranks with the id but no communicator (the body makes its own). */
typedef void (*RawBody)(const ncclUniqueId* id, int rank, int n);
int runRawRanks(int n, RawBody body);

size_t typeSize(ncclDataType_t t);
/* The byte a sender writes at index i of the block from src to dst (seeded per case). */
uint8_t pattern(int src, int dst, size_t i, int salt);
/* Buffers in the test's memory space, and copies to and from the host. */
void* bufAlloc(size_t bytes);
void bufFree(void* p);
void toBuf(void* dst, const void* src, size_t bytes);
void fromBuf(void* dst, const void* src, size_t bytes);
void syncStream(void);

#endif
