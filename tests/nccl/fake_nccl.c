/* A stand-in for the real NCCL behind the shim in interposer tests on machines without a GPU. It
 * logs every call (ncclGetLastError returns the log), moves no data except ncclBroadcast (host
 * memory, through files in a directory named by the unique id), and calls its own exported
 * ncclGroupStart from ncclAllReduce: loaded RTLD_DEEPBIND, that call must reach itself, not the
 * shim. */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct ncclComm {
  int rank, n, seq;
  char dir[NCCL_UNIQUE_ID_BYTES];
};

static char gLog[4096];
static int gDepth;

static void logCall(const char* what) {
  size_t len = strlen(gLog);
  if (len + strlen(what) + 2 < sizeof(gLog)) snprintf(gLog + len, sizeof(gLog) - len, "%s ", what);
}

ncclResult_t ncclGetVersion(int* v) {
  *v = 29999;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t r) { return "fake error string"; }
const char* ncclGetLastError(ncclComm_t comm) { return gLog; }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  memset(id, 0, sizeof(*id));
  snprintf(id->internal, sizeof(id->internal), "/tmp/fake_nccl_XXXXXX");
  return mkdtemp(id->internal) ? ncclSuccess : ncclSystemError;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int n, ncclUniqueId id, int rank) {
  struct ncclComm* c = calloc(1, sizeof(*c));
  c->rank = rank, c->n = n;
  snprintf(c->dir, sizeof(c->dir), "%s", id.internal);
  *comm = c;
  logCall("CommInitRank");
  return ncclSuccess;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int n, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  return ncclCommInitRank(comm, n, id, rank);
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  free(comm);
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* n) {
  *n = comm->n;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* r) {
  *r = comm->rank;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* d) {
  *d = -1;
  return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void* s, void* r, size_t count, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  char path[160], tmp[170];
  snprintf(path, sizeof(path), "%s/bcast%d", comm->dir, comm->seq++);
  logCall("Broadcast");
  if (comm->rank == root) {
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    if (!f || fwrite(s, 1, count, f) != count || fclose(f) != 0) return ncclSystemError;
    return rename(tmp, path) == 0 ? ncclSuccess : ncclSystemError;
  }
  for (int i = 0; i < 20000; ++i) {
    FILE* f = fopen(path, "rb");
    if (f) {
      size_t got = fread(r, 1, count, f);
      fclose(f);
      return got == count ? ncclSuccess : ncclSystemError;
    }
    usleep(1000);
  }
  return ncclRemoteError;
}

ncclResult_t ncclGroupStart(void) {
  gDepth++;
  logCall("GroupStart");
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
  gDepth--;
  logCall("GroupEnd");
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void* s, void* r, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  int before = gDepth;
  ncclGroupStart(); /* must be this library's own */
  int mine = gDepth == before + 1;
  ncclGroupEnd();
  logCall(mine ? "AllReduce" : "AllReduce-reached-the-shim");
  return mine ? ncclInvalidUsage : ncclInternalError;
}
ncclResult_t ncclAlltoAll(const void* s, void* r, size_t count, ncclDataType_t t, ncclComm_t comm,
                          cudaStream_t stream) {
  logCall("AlltoAll");
  return ncclSuccess;
}
ncclResult_t ncclSend(const void* s, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  logCall("Send");
  return ncclSuccess;
}
ncclResult_t ncclRecv(void* r, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  logCall("Recv");
  return ncclSuccess;
}
