/*
 * fusco: MoE-aware collective communication (NCCL-style C API).
 *
 * Every function returns fuscoResult_t, never throws, never calls exit()/abort(), and never writes
 * an out-parameter on failure. A pointer argument may be NULL exactly when nothing is read or
 * written through it. fuscoGetLastError() returns a message describing the last failure.
 * A count times its element or row size (and a sum of counts) that does not fit in size_t is
 * fuscoInvalidArgument, never a wrapped size. A layout or MoE handle that was destroyed or never
 * created is fuscoInvalidArgument in every call that takes it (destroying one twice included); one
 * whose communicator was destroyed fails every call but its own destroy, which still frees it.
 *
 * Thread safety: distinct communicators may be used concurrently from different threads. One
 * communicator must not be used by two threads at the same time (calls on it are serialized by
 * the caller), except fuscoCommAbort, which may be called from any thread to wake a blocked call.
 * A layout or MoE handle counts as its communicator (its calls are serialized with the comm's).
 * Communicators may be created and destroyed concurrently from different threads, each from its
 * own unique id. Group state (fuscoGroupStart/End) is per thread.
 */
#ifndef FUSCO_H_
#define FUSCO_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility; only what this header declares is exported. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#define FUSCO_MAJOR 0
#define FUSCO_MINOR 1
#define FUSCO_PATCH 0
#define FUSCO_VERSION_CODE (FUSCO_MAJOR * 10000 + FUSCO_MINOR * 100 + FUSCO_PATCH)

/* ---------------------------------------------------------------- basics */
typedef enum {
  fuscoSuccess = 0,
  fuscoUnhandledCudaError = 1,
  fuscoSystemError = 2,
  fuscoInternalError = 3,
  fuscoInvalidArgument = 4,
  fuscoInvalidUsage = 5,
  fuscoRemoteError = 6,
  fuscoInProgress = 7,
  fuscoTimeout = 8,
  fuscoNumResults = 9
} fuscoResult_t;

typedef enum {
  fuscoInt8 = 0,
  fuscoUint8 = 1,
  fuscoInt32 = 2,
  fuscoUint32 = 3,
  fuscoInt64 = 4,
  fuscoUint64 = 5,
  fuscoFloat16 = 6,
  fuscoFloat32 = 7,
  fuscoFloat64 = 8,
  fuscoBfloat16 = 9,
  fuscoFloat8e4m3 = 10,
  fuscoFloat8e5m2 = 11,
  fuscoNumTypes = 12
} fuscoDataType_t;

typedef enum { fuscoMemHost = 0, fuscoMemCuda = 1 } fuscoMemType_t;

#define FUSCO_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[FUSCO_UNIQUE_ID_BYTES];
} fuscoUniqueId;

typedef struct fuscoComm* fuscoComm_t;

/* [out] version: major*10000 + minor*100 + patch. */
fuscoResult_t fuscoGetVersion(int* version);
/* Returns a static string naming the result code (never NULL). */
const char* fuscoGetErrorString(fuscoResult_t result);
/* Returns the message of the last failed call on comm; comm may be NULL: the last error of the
 * calling thread. Never NULL ("" when there was none). The text belongs to the calling thread and
 * stays valid until its next fusco call, also when another thread aborts or destroys comm. */
const char* fuscoGetLastError(fuscoComm_t comm);

/* ---------------------------------------------------------------- communicators */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;   /* set by FUSCO_CONFIG_INITIALIZER */
  fuscoMemType_t memType; /* default fuscoMemHost */
  int cudaDevice;         /* -1: the calling thread's current device */
  int timeoutMs;          /* bootstrap and every operation; 0: FUSCO_TIMEOUT_MS or 300000 */
  int localSize;          /* ranks per node: > 0 wins; 0: FUSCO_LOCAL_SIZE if set, else detect
                             from host identity. With a size L, node = rank / L (the last node
                             may be smaller). */
  const char* netDevices; /* inter-node devices/rails, comma separated; NULL: auto */
  size_t chunkBytes;      /* pipeline slice size; 0: auto */
  int pipelineDepth;      /* slices in flight per peer; 0: auto */
  int maxSms;             /* CUDA comms: multiprocessors fusco's kernels may take on the device (an
                             SM budget, so that compute overlaps); 0: FUSCO_CUDA_SMS, else all.
                             Ranks sharing one GPU each take at most their part of it. (version 2) */
} fuscoConfig_t;

#define FUSCO_CONFIG_MAGIC 0xf05c0c0fu
#define FUSCO_CONFIG_VERSION 2u /* version 1 (without maxSms) is still accepted */
#define FUSCO_CONFIG_INITIALIZER                                                                   \
  {                                                                                                \
    sizeof(fuscoConfig_t), FUSCO_CONFIG_MAGIC, FUSCO_CONFIG_VERSION, fuscoMemHost, -1, 0, 0, NULL, \
        0, 0, 0                                                                                    \
  }

/* [out] id: magic + root address + random secret. The root (rank 0) must run in the calling
 * process or in a process forked from it after this call. Each id serves one communicator. */
fuscoResult_t fuscoGetUniqueId(fuscoUniqueId* id);
/* Collective over nranks processes. [out] comm. Returns fuscoTimeout when a rank does not arrive
 * within the timeout, fuscoInvalidUsage when ranks disagree (nranks, duplicate rank). */
fuscoResult_t fuscoCommInitRank(fuscoComm_t* comm, int nranks, fuscoUniqueId id, int rank);
fuscoResult_t fuscoCommInitRankConfig(fuscoComm_t* comm, int nranks, fuscoUniqueId id, int rank,
                                      const fuscoConfig_t* config);
/* Collective-free: safe after a peer died. */
fuscoResult_t fuscoCommDestroy(fuscoComm_t comm);
/* Wakes every blocked call of this comm with an error, then frees the comm like Destroy (the
 * handle is invalid afterwards). */
fuscoResult_t fuscoCommAbort(fuscoComm_t comm);
fuscoResult_t fuscoCommCount(const fuscoComm_t comm, int* count);
fuscoResult_t fuscoCommUserRank(const fuscoComm_t comm, int* rank);
fuscoResult_t fuscoCommNodeInfo(const fuscoComm_t comm, int* node, int* numNodes, int* localRank,
                                int* localSize);
/* [out] asyncError: fuscoSuccess, or the error that broke the communicator. On fuscoMemCuda comms
 * also, once, fuscoInvalidArgument for an enqueued call whose arguments disagreed between ranks
 * (nothing of the disagreeing pairs moved, the comm stays usable); fuscoGetLastError(comm) then
 * names both ranks. */
fuscoResult_t fuscoCommGetAsyncError(fuscoComm_t comm, fuscoResult_t* asyncError);
/* Collective, blocking: every rank gives `bytes` bytes of host memory from sendbuf, and recvbuf
 * (nranks * bytes of host memory) receives rank r's at offset r * bytes. It runs over the comm's
 * bootstrap on the calling thread, on every kind of comm, with no device memory, stream or CUDA
 * call: for setup data (split colours, unique ids). bytes <= 1 MiB, the same on every rank. A rank
 * whose arguments are refused still joins, so every rank fails at once with fuscoInvalidArgument
 * naming it; a rank in another collective of the comm's setup breaks the comm
 * (fuscoInvalidUsage). */
fuscoResult_t fuscoCommHostAllGather(fuscoComm_t comm, const void* sendbuf, void* recvbuf,
                                     size_t bytes);

/* Memory that peers on the same node can write directly (one-copy path). */
fuscoResult_t fuscoMemAlloc(fuscoComm_t comm, void** ptr, size_t bytes);
fuscoResult_t fuscoMemFree(fuscoComm_t comm, void* ptr);
/* [in] buff: any buffer of the comm's memory space; [out] handle for fuscoCommDeregister.
 * A buffer inside memory from fuscoMemAlloc is written directly by local peers. */
fuscoResult_t fuscoCommRegister(fuscoComm_t comm, void* buff, size_t bytes, void** handle);
fuscoResult_t fuscoCommDeregister(fuscoComm_t comm, void* handle);

/* ---------------------------------------------------------------- streams and completion
 * For fuscoMemCuda comms `stream` is a cudaStream_t and calls are stream-ordered. For fuscoMemHost
 * comms `stream` must be NULL and the call returns when the data is in place on this rank. */

/* ---------------------------------------------------------------- NCCL-compatible all-to-all */
/* count elements to and from every rank; block j of sendbuff goes to rank j. In place when
 * sendbuff == recvbuff (like MPI_IN_PLACE; the send side is copied first: a host allocation, or
 * the comm's scratch on the stream for a CUDA comm); buffers that overlap otherwise are
 * fuscoInvalidArgument. */
fuscoResult_t fuscoAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                            fuscoDataType_t datatype, fuscoComm_t comm, void* stream);
/* MPI_Alltoallv semantics; counts and displacements in elements, host arrays of nranks entries;
 * sendcounts[j] on rank i must equal recvcounts[i] on rank j, else fuscoInvalidUsage on both.
 * A send range that overlaps a receive range of the same call is fuscoInvalidArgument. */
fuscoResult_t fuscoAllToAllv(const void* sendbuff, const size_t sendcounts[],
                             const size_t sdispls[], void* recvbuff, const size_t recvcounts[],
                             const size_t rdispls[], fuscoDataType_t datatype, fuscoComm_t comm,
                             void* stream);
/* Inside a group every call is collected and executed together at fuscoGroupEnd (sends to peer
 * p match receives from p in call order). Outside a group each call runs on its own. Within one
 * group on one comm a send range that overlaps a receive range is fuscoInvalidArgument at
 * fuscoGroupEnd (row lists are compared row by row on host comms; a CUDA comm's row lists live on
 * the device and are not read for this). */
fuscoResult_t fuscoGroupStart(void);
fuscoResult_t fuscoGroupEnd(void);
fuscoResult_t fuscoSend(const void* sendbuff, size_t count, fuscoDataType_t datatype, int peer,
                        fuscoComm_t comm, void* stream);
fuscoResult_t fuscoRecv(void* recvbuff, size_t count, fuscoDataType_t datatype, int peer,
                        fuscoComm_t comm, void* stream);
/* Rows named by an int64 index list (in the comm's memory space). */
fuscoResult_t fuscoGatherSend(const void* sendbuff, const int64_t* rowIdx, size_t nrows,
                              size_t rowBytes, int peer, fuscoComm_t comm, void* stream);
fuscoResult_t fuscoScatterRecv(void* recvbuff, const int64_t* rowIdx, size_t nrows, size_t rowBytes,
                               int peer, fuscoComm_t comm, void* stream);

/* ---------------------------------------------------------------- layout descriptors */
typedef struct fuscoLayout* fuscoLayout_t;
/* sendRows: for peer 0, then peer 1, ...: sendCounts[p] row indices into sendbuff (duplicates
 * allowed). recvRows likewise: recvCounts[p] row indices into recvbuff, the i-th row received from
 * p goes to recvRows[...+i]; a receive row may appear only once. Host arrays; collective over
 * the comm (counts are checked pairwise). */
fuscoResult_t fuscoLayoutCreate(fuscoLayout_t* layout, fuscoComm_t comm, size_t rowBytes,
                                const size_t sendCounts[], const int64_t* sendRows,
                                const size_t recvCounts[], const int64_t* recvRows);
fuscoResult_t fuscoShuffle(const void* sendbuff, void* recvbuff, fuscoLayout_t layout,
                           void* stream);
fuscoResult_t fuscoLayoutDestroy(fuscoLayout_t layout);

/* ---------------------------------------------------------------- MoE dispatch and combine */
enum { FUSCO_DEDUP_AUTO = 0, FUSCO_DEDUP_NONE = 1, FUSCO_DEDUP_RANK = 2, FUSCO_DEDUP_NODE = 3 };
enum {
  FUSCO_BALANCE_AUTO = 0,
  FUSCO_BALANCE_NONE = 1,
  FUSCO_BALANCE_STATIC = 2,
  FUSCO_BALANCE_GREEDY = 3
};
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;    /* FUSCO_MOE_CONFIG_INITIALIZER */
  int numExperts;          /* [1, 1048576] */
  const int* expertToRank; /* [numExperts] placement, host array, same on every rank; NULL:
                              contiguous blocks of numExperts/nranks */
  int dedup;               /* AUTO: NODE when numNodes > 1, else RANK */
  int balance;             /* AUTO: the best available */
  int expertAlignment;     /* pad each local expert's block to a multiple of this many rows;
                              [0, 65536], 0 or 1: no padding */
} fuscoMoeConfig_t;

#define FUSCO_MOE_CONFIG_MAGIC 0xf05c0e0fu
#define FUSCO_MOE_CONFIG_VERSION 1u
#define FUSCO_MOE_CONFIG_INITIALIZER                                                     \
  {                                                                                      \
    sizeof(fuscoMoeConfig_t), FUSCO_MOE_CONFIG_MAGIC, FUSCO_MOE_CONFIG_VERSION, 0, NULL, \
        FUSCO_DEDUP_AUTO, FUSCO_BALANCE_AUTO, 0                                          \
  }

typedef struct fuscoMoeHandle* fuscoMoeHandle_t;
typedef struct { /* what THIS rank sent in the last dispatch / combine of a handle */
  size_t size;   /* caller sets sizeof(fuscoMoeStats_t) */
  size_t dispatchRowsIntraNode, dispatchRowsInterNode;
  size_t dispatchBytesIntraNode, dispatchBytesInterNode;
  size_t combineBytesIntraNode, combineBytesInterNode;
} fuscoMoeStats_t;

fuscoResult_t fuscoMoePlan(fuscoMoeHandle_t* handle, fuscoComm_t comm,
                           const fuscoMoeConfig_t* config, const int64_t* topkIdx, size_t numTokens,
                           int topk, void* stream);
fuscoResult_t fuscoMoeGetRecvCounts(fuscoMoeHandle_t handle, size_t* numRecvRows,
                                    int64_t* tokensPerLocalExpert);
fuscoResult_t fuscoMoeDispatch(fuscoMoeHandle_t handle, const void* x, size_t rowBytes, void* recvX,
                               void* stream);
fuscoResult_t fuscoMoeCombine(fuscoMoeHandle_t handle, const void* expertOut,
                              fuscoDataType_t datatype, size_t hidden, const float* topkWeights,
                              void* out, void* stream);
fuscoResult_t fuscoMoeGetStats(fuscoMoeHandle_t handle, fuscoMoeStats_t* stats);
fuscoResult_t fuscoMoeHandleDestroy(fuscoMoeHandle_t handle);

/* Capacity mode (DeepEP's num_worst_tokens): fuscoMoePlan with every rank's receive side sized
 * for recvCapacity rows (padding included; [1, 2^32 - 1]), planned by the GPU planner's steps
 * (dedup NONE or RANK; NODE dedup across nodes is fuscoInvalidUsage). On a CUDA communicator the
 * plan and the handle's dispatch and combine never wait for the stream: the plan has one host
 * round with the peers (every rank's arguments), the sizes are resolved by the communicator's
 * progress thread, the receive counts stay on the device (fuscoMoeGetRecvCountsDevice). recvX and
 * expertOut hold recvCapacity rows (dispatch leaves rows past the real count as they are; combine
 * does not read them). A routing that needs more rows than a rank's capacity, or an invalid id,
 * moves no row and writes nothing out of bounds (padding rows inside the capacity may be zeroed):
 * fuscoCommGetAsyncError reports fuscoInvalidArgument on every rank (the rows needed and the
 * capacity, or the token and slot), and the handle's dispatch and combine fail alike on every
 * rank (asynchronously) until it is planned again. On a host communicator the call itself returns
 * those errors. */
fuscoResult_t fuscoMoePlanCapacity(fuscoMoeHandle_t* handle, fuscoComm_t comm,
                                   const fuscoMoeConfig_t* config, const int64_t* topkIdx,
                                   size_t numTokens, int topk, size_t recvCapacity, void* stream);
/* Where the plan's stream writes this rank's receive rows (one int64, padding included) and its
 * tokens per local expert (int64 [numLocalExperts]; NULL: not wanted): device memory on a CUDA
 * communicator, host memory on a host one. The pointers stay valid until the handle is destroyed;
 * each plan of the handle rewrites the values in stream order (zeros after a capacity overflow).
 * A handle planned on the host (FUSCO_PLAN=host, NODE dedup across nodes) is fuscoInvalidUsage.
 * fuscoMoeGetRecvCounts on a capacity plan waits for the plan to resolve (it synchronizes with
 * the plan's stream). */
fuscoResult_t fuscoMoeGetRecvCountsDevice(fuscoMoeHandle_t handle, const int64_t** numRecvRows,
                                          const int64_t** tokensPerLocalExpert);

/* ---------------------------------------------------------------- additions */
/* [out] bytes: size of one element of datatype. */
fuscoResult_t fuscoDataTypeSize(fuscoDataType_t datatype, size_t* bytes);

/* Re-plans handle in place for a new routing (the next layer): the same config as the
 * fuscoMoePlan that made it; numTokens and topk may change. Collective like fuscoMoePlan (every
 * rank replans its handle of that plan), same errors; no allocation when the new plan fits in
 * what the handle already holds. Afterwards the handle is exactly what fuscoMoeHandleDestroy and
 * fuscoMoePlan with the same config and the new routing would give (receive counts, dispatch and
 * combine results; stats start from zero). A failed replan fails on every rank and leaves the
 * handle unplanned: fuscoMoeDispatch, fuscoMoeCombine and fuscoMoeGetRecvCounts return
 * fuscoInvalidUsage on it until a replan succeeds; fuscoMoeHandleDestroy always works.
 * fuscoMemCuda comms: the new lists reach the device on `stream` once every dispatch and combine
 * enqueued earlier on the handle (on any stream) is done with the old ones; graphs that captured
 * the handle's dispatch or combine must not be replayed after it. Cannot be captured itself. */
fuscoResult_t fuscoMoeReplan(fuscoMoeHandle_t handle, const int64_t* topkIdx, size_t numTokens,
                             int topk, void* stream);

/* ---------------------------------------------------------------- low-latency mode */
/* Inference decode (docs/API.md, "Low-latency dispatch and combine"): a buffer sized once for at
 * most maxTokensPerRank tokens per rank; dispatch writes each token's row straight into the
 * per-expert receive slots of its destination ranks (no plan, no count exchange, no host round)
 * and combine writes expert outputs back to their source, which sums them with the routing
 * weights in combine's fixed tree. All ranks must reach each other through mapped memory (one
 * node). Experts are placed in contiguous blocks of numExperts / nranks per rank. */
typedef struct fuscoLowLatency* fuscoLowLatency_t;
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version; /* FUSCO_LOW_LATENCY_CONFIG_INITIALIZER */
  int maxTokensPerRank; /* tokens one rank passes to one call: [1, 65536] */
  int hidden;           /* bf16 elements per token row: [1, 65536]; FP8 needs a multiple of 128 */
  int numExperts;       /* global experts, a multiple of nranks: [1, 65536] */
  int maxTopk;          /* largest topk of a call: [1, 64] */
} fuscoLowLatencyConfig_t;

#define FUSCO_LOW_LATENCY_CONFIG_MAGIC 0xf05c011fu
#define FUSCO_LOW_LATENCY_CONFIG_VERSION 1u
#define FUSCO_LOW_LATENCY_CONFIG_INITIALIZER                         \
  {                                                                  \
    sizeof(fuscoLowLatencyConfig_t), FUSCO_LOW_LATENCY_CONFIG_MAGIC, \
        FUSCO_LOW_LATENCY_CONFIG_VERSION, 0, 0, 0, 0                 \
  }

/* Dispatch formats: rows as given (bf16), or e4m3 with one fp32 scale per 128 channels. */
enum { FUSCO_LL_BF16 = 0, FUSCO_LL_FP8 = 1 };
/* Call flag: enqueue only the sending half; fuscoLowLatencyRecvHook(hook) completes the call. */
#define FUSCO_LL_RECV_HOOK 1u

/* Where a dispatch's rows landed on this rank: memory of the low-latency buffer (device memory
 * on a CUDA communicator), valid until the dispatch two calls later (the two buffers alternate). */
typedef struct {
  int buffer;              /* the buffer this dispatch used: 0 or 1 */
  int format;              /* FUSCO_LL_BF16 or FUSCO_LL_FP8 */
  unsigned long long hook; /* FUSCO_LL_RECV_HOOK: the hook that completes the receive; else 0 */
  void* recvX;             /* [numLocalExperts][maxTokensPerRank * nranks] rows: hidden bf16,
                              or hidden e4m3 bytes; expert e's rows first, by source rank
                              ascending, then token, then slot ascending */
  float* recvScales;       /* FP8: [numLocalExperts][maxTokensPerRank * nranks][hidden / 128];
                              NULL for bf16 */
  int* recvCount;          /* [numLocalExperts] rows received per local expert */
  int64_t* recvLayout;     /* [numLocalExperts][nranks]: (first row << 32) | rows, per source */
  int* recvSrcToken;       /* [numLocalExperts][maxTokensPerRank * nranks]: the row's token index
                              on its source rank */
} fuscoLowLatencyDispatch_t;

/* Collective over comm: allocates this rank's buffer (two halves) and maps every peer's. */
fuscoResult_t fuscoLowLatencyCreate(fuscoLowLatency_t* ll, fuscoComm_t comm,
                                    const fuscoLowLatencyConfig_t* config);
/* Collective. x: [numTokens][hidden] bf16; topkIdx: [numTokens][topk] global expert ids, -1: none.
 * numTokens in [0, maxTokensPerRank], topk in [1, maxTopk], the same topk on every rank. An id
 * outside [-1, numExperts) moves nothing and is reported by fuscoCommGetAsyncError
 * (fuscoInvalidArgument naming the token and slot). Ordered on stream; captureable. */
fuscoResult_t fuscoLowLatencyDispatch(fuscoLowLatency_t ll, const void* x, const int64_t* topkIdx,
                                      int numTokens, int topk, int format, unsigned int flags,
                                      fuscoLowLatencyDispatch_t* out, void* stream);
/* Collective. expertOut: recvX's layout in bf16 (hidden elements per row); topkIdx, numTokens and
 * topk those of the dispatch; topkWeights [numTokens][topk] fp32 (NULL: 1). out:
 * [numTokens][hidden] bf16, summed in combine's fixed tree (bitwise what fuscoMoeCombine computes).
 * With FUSCO_LL_RECV_HOOK, *hook gets the hook that completes the call. */
fuscoResult_t fuscoLowLatencyCombine(fuscoLowLatency_t ll,
                                     const fuscoLowLatencyDispatch_t* dispatched,
                                     const void* expertOut, const int64_t* topkIdx,
                                     const float* topkWeights, int numTokens, int topk, void* out,
                                     unsigned int flags, unsigned long long* hook, void* stream);
/* Completes the receive of the call that returned hook, ordered on stream (any stream); once. */
fuscoResult_t fuscoLowLatencyRecvHook(fuscoLowLatency_t ll, unsigned long long hook, void* stream);
/* Collective. Frees the buffer once every call on it is done. */
fuscoResult_t fuscoLowLatencyDestroy(fuscoLowLatency_t ll);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* FUSCO_H_ */
