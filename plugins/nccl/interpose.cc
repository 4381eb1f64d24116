// Interposer mode: the real NCCL runs everything except the all-to-all-shaped work, which fusco
// serves on a communicator made lazily on the first such call (its unique id broadcast over the
// real communicator). A group is fusco's when all its calls are ncclSend/ncclRecv/ncclAlltoAll on
// one communicator and its sends and receives reach every peer; any other group is replayed on
// the real NCCL, unchanged and in call order. The choice is each rank's own: a program whose
// ranks issue an all-to-all-shaped group on some ranks and a partial one on others (a peer
// skipped for a zero count) makes them disagree, and fusco's side fails with ncclRemoteError
// after FUSCO_TIMEOUT_MS rather than hanging.
#include <string.h>

#include "shim.h"

namespace fnccl {
namespace {

// Rank 0's id to every rank with the real ncclBroadcast: through device memory, or (host mode,
// for an NCCL that takes host memory) straight from the id.
ncclResult_t broadcastId(Comm* c, ncclComm_t comm, cudaStream_t stream, fuscoUniqueId* id) {
  const RealNccl& real = global().real;
  if (commMemType() == fuscoMemHost)
    return callReal(real.Broadcast, "ncclBroadcast", static_cast<const void*>(id),
                    static_cast<void*>(id), sizeof(*id), ncclUint8, 0, comm, stream);
  const CudaRt* rt = cudaRt();
  if (rt == nullptr) return fail(c, ncclSystemError, "libfusco_nccl: no CUDA runtime");
  void* d = nullptr;
  if (rt->malloc(&d, sizeof(*id)) != 0) return ncclUnhandledCudaError;
  ncclResult_t r = rt->memcpy(d, id, sizeof(*id), 1) == 0 ? ncclSuccess : ncclUnhandledCudaError;
  if (r == ncclSuccess)
    r = callReal(real.Broadcast, "ncclBroadcast", static_cast<const void*>(d), d, sizeof(*id),
                 ncclUint8, 0, comm, stream);
  if (r == ncclSuccess &&
      (rt->streamSynchronize(stream) != 0 || rt->memcpy(id, d, sizeof(*id), 2) != 0))
    r = ncclUnhandledCudaError;
  rt->free(d);
  return r;
}

// The fusco communicator of a real one, made on first use: rank 0's id goes out with a real
// ncclBroadcast on the caller's stream (device memory, so through the CUDA runtime).
ncclResult_t ensureFusco(ncclComm_t comm, cudaStream_t stream, Comm** out) {
  const RealNccl& real = global().real;
  Comm* c = sideRecord(comm, true);
  *out = c;
  if (c->fc != nullptr) return ncclSuccess;
  ncclResult_t r = callReal(real.CommCount, "ncclCommCount", comm, &c->nranks);
  if (r == ncclSuccess) r = callReal(real.CommUserRank, "ncclCommUserRank", comm, &c->rank);
  if (r == ncclSuccess) r = callReal(real.CommCuDevice, "ncclCommCuDevice", comm, &c->cudaDevice);
  if (r != ncclSuccess) return r;
  fuscoUniqueId id;
  memset(&id, 0, sizeof(id));
  if (c->rank == 0 && (r = fromFusco(c, fuscoGetUniqueId(&id), "fuscoGetUniqueId")) != ncclSuccess)
    return r;
  r = broadcastId(c, comm, stream, &id);
  if (r != ncclSuccess) return fail(c, r, "libfusco_nccl: broadcasting fusco's id failed");
  c->memType = commMemType();
  fuscoConfig_t cfg = fuscoConfigFor(c->memType, c->memType == fuscoMemCuda ? c->cudaDevice : -1);
  r = fromFusco(c, fuscoCommInitRankConfig(&c->fc, c->nranks, id, c->rank, &cfg),
                "libfusco_nccl: fusco communicator");
  if (r == ncclSuccess) logServed(c);
  return r;
}

// Whether fusco takes the whole group: one communicator, only send/recv/all-to-all, and the
// sends and receives (if any) reach every peer.
bool servedByFusco(const std::vector<GroupOp>& ops, ncclComm_t* comm) {
  if (ops.empty()) return false;
  *comm = ops[0].comm;
  int n = 0;
  {
    RealScope scope;
    const RealNccl& real = global().real;
    if (real.CommCount == nullptr || real.CommCount(*comm, &n) != ncclSuccess || n <= 0)
      return false;
  }
  std::vector<char> sendTo(n, 0), recvFrom(n, 0);
  bool p2p = false;
  for (const GroupOp& op : ops) {
    if (op.comm != *comm || op.kind == GroupOp::Other) return false;
    if (op.kind == GroupOp::AllToAll) continue;
    if (op.peer < 0 || op.peer >= n) return false;  // the real NCCL reports it
    p2p = true;
    (op.kind == GroupOp::Send ? sendTo : recvFrom)[op.peer] = 1;
  }
  if (!p2p) return true;
  for (int p = 0; p < n; ++p)
    if (!sendTo[p] || !recvFrom[p]) return false;
  return true;
}

ncclResult_t serveGroup(ncclComm_t comm, const std::vector<GroupOp>& ops) {
  Comm* c = nullptr;
  ncclResult_t r = ensureFusco(comm, ops[0].stream, &c);
  if (r != ncclSuccess) return r;
  fuscoGroupStart();
  ncclResult_t first = ncclSuccess;
  for (const GroupOp& op : ops) {
    if (op.kind == GroupOp::AllToAll) continue;
    fuscoResult_t fr =
        op.kind == GroupOp::Send
            ? fuscoSend(op.sbuf, op.count, toFusco(op.type), op.peer, c->fc, op.stream)
            : fuscoRecv(op.rbuf, op.count, toFusco(op.type), op.peer, c->fc, op.stream);
    if (fr != fuscoSuccess && first == ncclSuccess) first = fromFusco(c, fr, "ncclSend/ncclRecv");
  }
  r = fromFusco(c, fuscoGroupEnd(), "ncclGroupEnd");
  if (first == ncclSuccess) first = r;
  for (const GroupOp& op : ops) {
    if (op.kind != GroupOp::AllToAll) continue;
    r = fromFusco(c, fuscoAllToAll(op.sbuf, op.rbuf, op.count, toFusco(op.type), c->fc, op.stream),
                  "ncclAlltoAll");
    if (first == ncclSuccess) first = r;
  }
  if (first == ncclSuccess) {
    std::lock_guard<std::mutex> lock(c->mu);
    c->lastError.clear();
  }
  return first;
}

}  // namespace

ncclResult_t interposeAllToAll(const void* s, void* r, size_t count, ncclDataType_t t,
                               ncclComm_t comm, cudaStream_t stream) {
  GroupState& g = group();
  if (g.depth > 0) {
    const RealNccl& real = global().real;
    g.ops.push_back(GroupOp{GroupOp::AllToAll, comm, -1, s, r, count, t, stream,
                            [=, &real] {
                              return callReal(real.AlltoAll, "ncclAlltoAll", s, r, count, t, comm,
                                              stream);
                            },
                            nullptr});
    return ncclSuccess;
  }
  std::vector<GroupOp> one{
      GroupOp{GroupOp::AllToAll, comm, -1, s, r, count, t, stream, nullptr, nullptr}};
  if (comm == nullptr)
    return callReal(global().real.AlltoAll, "ncclAlltoAll", s, r, count, t, comm, stream);
  return serveGroup(comm, one);
}

ncclResult_t interposeGroupEnd(GroupState& g) {
  std::vector<GroupOp> ops;
  ops.swap(g.ops);
  const bool realOpen = g.realOpen;
  g.realOpen = false;
  const RealNccl& real = global().real;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclSuccess;
  if (servedByFusco(ops, &comm)) {
    r = serveGroup(comm, ops);
  } else if (!ops.empty()) {
    if (!realOpen) r = callReal(real.GroupStart, "ncclGroupStart");
    for (GroupOp& op : ops) {
      RealScope scope;
      ncclResult_t opr = op.replay();
      if (r == ncclSuccess) r = opr;
    }
    ncclResult_t er = callReal(real.GroupEnd, "ncclGroupEnd");
    return r != ncclSuccess ? r : er;
  }
  if (realOpen) {
    ncclResult_t er = callReal(real.GroupEnd, "ncclGroupEnd");
    if (r == ncclSuccess) r = er;
  }
  return r;
}

void openRealGroup() {
  GroupState& g = group();
  if (global().mode != Mode::Interposer || inReal() || g.depth == 0 || g.realOpen) return;
  if (callReal(global().real.GroupStart, "ncclGroupStart") == ncclSuccess) g.realOpen = true;
}

ncclResult_t interposeSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                            ncclConfig_t* config) {
  const RealNccl& real = global().real;
  openRealGroup();
  // The new communicator gets its own fusco communicator, lazily, like any other.
  return callReal(real.CommSplit, "ncclCommSplit", comm, color, key, newcomm, config);
}

}  // namespace fnccl
