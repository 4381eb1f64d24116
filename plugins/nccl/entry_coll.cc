// NCCL's data-moving entry points. fusco serves ncclAlltoAll and ncclSend/ncclRecv; in
// standalone mode every other collective is ncclInvalidUsage with a message saying how to
// interpose a real NCCL instead; in interposer mode they go to the real NCCL, queued in order
// when called inside a group.
#include "shim.h"

using namespace fnccl;

namespace {

ncclResult_t unserved(ncclComm_t comm, const char* call) {
  CommRef c;
  ncclResult_t r = checkComm(comm, call, &c);
  if (r != ncclSuccess) return noteGroupError(r);
  return noteGroupError(
      fail(c.get(), ncclInvalidUsage,
           "%s is not served by fusco: standalone libfusco_nccl serves ncclAlltoAll and "
           "ncclSend/ncclRecv only. To run it, interpose a real NCCL: set "
           "FUSCO_NCCL_LIBRARY=/path/to/the/real/libnccl.so.2 (or LD_PRELOAD=libfusco_nccl.so "
           "in a program linked to NCCL)",
           call));
}

// Interposer: a call inside a group waits, in order, for the group's end; outside one it runs.
ncclResult_t forwardOrQueue(ncclComm_t comm, std::function<ncclResult_t()> call) {
  GroupState& g = group();
  if (g.depth == 0) {
    RealScope scope;
    return call();
  }
  GroupOp op{GroupOp::Other,  comm,   -1, nullptr, nullptr, 0, ncclInt8, nullptr,
             std::move(call), nullptr};
  g.ops.push_back(std::move(op));
  return ncclSuccess;
}

ncclResult_t runAllToAll(Comm* c, const void* s, void* r, size_t count, ncclDataType_t t,
                         cudaStream_t stream) {
  logServed(c);
  return fromFusco(c, fuscoAllToAll(s, r, count, toFusco(t), c->fc, stream), "ncclAlltoAll");
}

// Standalone send/recv: straight into fusco's group (or run alone outside one). The group
// remembers each call's communicator so a failure at the end is recorded on it.
ncclResult_t p2p(bool send, void* buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                 cudaStream_t stream) {
  const char* call = send ? "ncclSend" : "ncclRecv";
  CommRef c;
  ncclResult_t r = checkComm(comm, call, &c);
  if (r != ncclSuccess) return noteGroupError(r);
  logServed(c.get());
  fuscoResult_t fr = send ? fuscoSend(buf, count, toFusco(t), peer, c->fc, stream)
                          : fuscoRecv(buf, count, toFusco(t), peer, c->fc, stream);
  r = fromFusco(c.get(), fr, call);
  GroupState& g = group();
  if (g.depth > 0) {
    g.ops.push_back(GroupOp{send ? GroupOp::Send : GroupOp::Recv, comm, peer, buf, buf, count, t,
                            stream, nullptr, c});
    noteGroupError(r);
  }
  return r;
}

ncclResult_t interposeP2p(bool send, void* buf, size_t count, ncclDataType_t t, int peer,
                          ncclComm_t comm, cudaStream_t stream) {
  const RealNccl& real = global().real;
  std::function<ncclResult_t()> call =
      send ? std::function<ncclResult_t()>([=, &real] {
        return callReal(real.Send, "ncclSend", static_cast<const void*>(buf), count, t, peer, comm,
                        stream);
      })
           : std::function<ncclResult_t()>([=, &real] {
               return callReal(real.Recv, "ncclRecv", buf, count, t, peer, comm, stream);
             });
  GroupState& g = group();
  if (g.depth == 0) return call();
  g.ops.push_back(GroupOp{send ? GroupOp::Send : GroupOp::Recv, comm, peer, buf, buf, count, t,
                          stream, std::move(call), nullptr});
  return ncclSuccess;
}

// Whether op's communicator is still the one the call was made on (not destroyed or aborted since).
bool opLive(const GroupOp& op) { return op.ref != nullptr && liveComm(op.comm) == op.ref; }

// The first call of the group whose communicator was destroyed or aborted before the group's end:
// the group is ncclInvalidArgument (as fuscoGroupEnd is for the same sequence).
ncclResult_t deadCommInGroup(const std::vector<GroupOp>& ops) {
  for (const GroupOp& op : ops) {
    if (opLive(op)) continue;
    const char* call = op.kind == GroupOp::Send   ? "ncclSend"
                       : op.kind == GroupOp::Recv ? "ncclRecv"
                                                  : "ncclAlltoAll";
    return fail(nullptr, ncclInvalidArgument,
                "ncclGroupEnd: comm %p of this group's %s was destroyed or aborted before "
                "ncclGroupEnd (end the group first): none of the group's calls on it ran",
                static_cast<void*>(op.comm), call);
  }
  return ncclSuccess;
}

// Standalone: fusco's group ends with the outermost NCCL one; then the collectives called inside
// the group run. Failures are recorded on the communicators still live (a group holds its
// communicators' records, so one destroyed or aborted meanwhile, from any thread, is never freed
// under it).
ncclResult_t standaloneGroupEnd(GroupState& g) {
  const ncclResult_t dead = g.depth > 0 ? ncclSuccess : deadCommInGroup(g.ops);
  const std::string deadMsg = threadLastError();
  ncclResult_t r = fromFusco(nullptr, fuscoGroupEnd(), "ncclGroupEnd");
  if (dead != ncclSuccess) r = fail(nullptr, dead, "%s", deadMsg.c_str());
  if (r != ncclSuccess) {
    std::string msg = threadLastError();
    for (GroupOp& op : g.ops) {
      if (!opLive(op)) continue;
      if (op.kind != GroupOp::AllToAll) fail(op.ref.get(), r, "%s", msg.c_str());
      if (r == ncclRemoteError) op.ref->asyncError = ncclRemoteError;
    }
  }
  if (g.depth > 0) return r;
  std::vector<GroupOp> ops;
  ops.swap(g.ops);
  ncclResult_t first = r;
  if (g.sticky != ncclSuccess) first = fail(nullptr, g.sticky, "%s", g.stickyMsg.c_str());
  g.sticky = ncclSuccess;
  g.stickyMsg.clear();
  for (GroupOp& op : ops) {
    if (op.kind != GroupOp::AllToAll || !opLive(op)) continue;
    ncclResult_t ar = runAllToAll(op.ref.get(), op.sbuf, op.rbuf, op.count, op.type, op.stream);
    if (first == ncclSuccess) first = ar;
  }
  return first;
}

}  // namespace

extern "C" {

ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  FNCCL_PASSTHROUGH(AlltoAll, sendbuff, recvbuff, count, datatype, comm, stream);
  if (global().mode == Mode::Interposer)
    return interposeAllToAll(sendbuff, recvbuff, count, datatype, comm, stream);
  CommRef c;
  ncclResult_t r = checkComm(comm, "ncclAlltoAll", &c);
  if (r != ncclSuccess) return noteGroupError(r);
  GroupState& g = group();
  if (g.depth == 0) return runAllToAll(c.get(), sendbuff, recvbuff, count, datatype, stream);
  g.ops.push_back(GroupOp{GroupOp::AllToAll, comm, -1, sendbuff, recvbuff, count, datatype, stream,
                          nullptr, c});
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  FNCCL_PASSTHROUGH(Send, sendbuff, count, datatype, peer, comm, stream);
  void* buf = const_cast<void*>(sendbuff);
  if (global().mode == Mode::Interposer)
    return interposeP2p(true, buf, count, datatype, peer, comm, stream);
  return p2p(true, buf, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  FNCCL_PASSTHROUGH(Recv, recvbuff, count, datatype, peer, comm, stream);
  if (global().mode == Mode::Interposer)
    return interposeP2p(false, recvbuff, count, datatype, peer, comm, stream);
  return p2p(false, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart() {
  FNCCL_PASSTHROUGH(GroupStart);
  GroupState& g = group();
  g.depth++;
  if (global().mode == Mode::Standalone) fuscoGroupStart();
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  FNCCL_PASSTHROUGH(GroupEnd);
  GroupState& g = group();
  if (g.depth == 0)
    return fail(nullptr, ncclInvalidUsage, "ncclGroupEnd without a matching ncclGroupStart");
  g.depth--;
  if (global().mode == Mode::Standalone) return standaloneGroupEnd(g);
  if (g.depth > 0) return ncclSuccess;
  return interposeGroupEnd(g);
}

ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  FNCCL_FORWARD(GroupSimulateEnd, simInfo);
  return fail(nullptr, ncclInvalidUsage,
              "ncclGroupSimulateEnd is not served by fusco: interpose a real NCCL "
              "(FUSCO_NCCL_LIBRARY)");
}

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  FNCCL_FORWARD(RedOpCreatePreMulSum, op, scalar, datatype, residence, comm);
  return unserved(comm, "ncclRedOpCreatePreMulSum");
}

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  FNCCL_FORWARD(RedOpDestroy, op, comm);
  return unserved(comm, "ncclRedOpDestroy");
}

// The collectives fusco does not serve: the real NCCL's in interposer mode, else refused.
#define FNCCL_UNSERVED(name, params, args)                                                       \
  ncclResult_t nccl##name params {                                                               \
    FNCCL_PASSTHROUGH(name, FNCCL_UNPAREN args);                                                 \
    const Global& g = global();                                                                  \
    if (g.mode == Mode::Interposer)                                                              \
      return forwardOrQueue(                                                                     \
          comm, [=, &g] { return g.real.name ? g.real.name args : missingReal("nccl" #name); }); \
    return unserved(comm, "nccl" #name);                                                         \
  }
#define FNCCL_UNPAREN(...) __VA_ARGS__

FNCCL_UNSERVED(Reduce,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream),
               (sendbuff, recvbuff, count, datatype, op, root, comm, stream))
FNCCL_UNSERVED(Bcast,
               (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                cudaStream_t stream),
               (buff, count, datatype, root, comm, stream))
FNCCL_UNSERVED(Broadcast,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                int root, ncclComm_t comm, cudaStream_t stream),
               (sendbuff, recvbuff, count, datatype, root, comm, stream))
FNCCL_UNSERVED(AllReduce,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream),
               (sendbuff, recvbuff, count, datatype, op, comm, stream))
FNCCL_UNSERVED(ReduceScatter,
               (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream),
               (sendbuff, recvbuff, recvcount, datatype, op, comm, stream))
FNCCL_UNSERVED(AllGather,
               (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                ncclComm_t comm, cudaStream_t stream),
               (sendbuff, recvbuff, sendcount, datatype, comm, stream))
FNCCL_UNSERVED(Gather,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                int root, ncclComm_t comm, cudaStream_t stream),
               (sendbuff, recvbuff, count, datatype, root, comm, stream))
FNCCL_UNSERVED(Scatter,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                int root, ncclComm_t comm, cudaStream_t stream),
               (sendbuff, recvbuff, count, datatype, root, comm, stream))

}  // extern "C"
