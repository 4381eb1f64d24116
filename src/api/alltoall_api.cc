// NCCL-compatible all-to-all entry points: fuscoAllToAll(v), groups, send/recv and the row
// primitives fuscoGatherSend / fuscoScatterRecv. Each builds an engine Op; a rank whose own
// arguments are invalid still runs the Op's header exchange (with its error) so no peer waits.
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <vector>

#include "api/api_internal.h"
#include "core/fault.h"
#include "engine/engine.h"

using namespace fusco;

namespace {

void checkStream(const fuscoComm_t comm, void* stream, const char* fn, ArgCheck* a) {
  if (comm->impl->memType() == fuscoMemHost && stream != nullptr)
    a->fail("%s: stream must be NULL for a host-memory communicator", fn);
}

fuscoResult_t runChecked(Op& op, const ArgCheck& a, fuscoComm_t comm) {
  op.argStatus = a.status;
  op.argError = a.message;
  return runOp(*comm->impl, op);
}

// ------------------------------------------------------------------ groups
struct PendingCall {
  fuscoComm_t comm;
  bool send;
  int peer;
  RowStream data;
  ArgCheck check;
  void* stream;
};

struct GroupState {
  int depth = 0;
  std::vector<PendingCall> calls;
};
thread_local GroupState tGroup;

fuscoResult_t runGroup(std::vector<PendingCall> calls) {
  std::vector<fuscoComm_t> comms;
  for (const auto& c : calls)
    if (std::find(comms.begin(), comms.end(), c.comm) == comms.end()) comms.push_back(c.comm);
  fuscoResult_t first = fuscoSuccess;
  std::string firstMsg;
  for (fuscoComm_t comm : comms) {
    fuscoResult_t r = guarded(comm, "fuscoGroupEnd", [&]() -> fuscoResult_t {
      FUSCO_CHECK(checkComm(comm, "fuscoGroupEnd"));
      Op op(comm->impl->nranks());
      op.name = "group send/recv";
      op.kind = OpKind::Group;
      ArgCheck a;
      for (auto& c : calls) {
        if (c.comm != comm) continue;
        if (op.stream == nullptr) op.stream = c.stream;  // one stream per group (as in NCCL)
        if (c.check.status != fuscoSuccess && a.status == fuscoSuccess) a = c.check;
        if (c.peer < 0 || c.peer >= comm->impl->nranks()) continue;
        auto& w = op.peers[c.peer];
        (c.send ? w.sends : w.recvs).push_back(c.data);
      }
      return runChecked(op, a, comm);
    });
    if (r != fuscoSuccess && first == fuscoSuccess) {
      first = r;
      firstMsg = threadLastError();
    }
  }
  if (first != fuscoSuccess) FUSCO_FAIL(first, kApi, "%s", firstMsg.c_str());
  return first;
}

// Adds a point-to-point call to the current group (or runs it alone outside a group).
fuscoResult_t enqueue(PendingCall call, const char* fn) {
  FUSCO_CHECK(checkComm(call.comm, fn));
  int n = call.comm->impl->nranks();
  if (call.peer < 0 || call.peer >= n)
    call.check.fail("%s: peer %d is outside [0, %d)", fn, call.peer, n);
  fuscoResult_t own = call.check.status;
  std::string ownMsg = call.check.message;
  if (tGroup.depth > 0) {
    tGroup.calls.push_back(call);
    if (own != fuscoSuccess) return FUSCO_FAIL(own, kApi, "%s", ownMsg.c_str());
    return fuscoSuccess;
  }
  std::vector<PendingCall> one{call};
  return runGroup(std::move(one));
}

PendingCall makeCall(fuscoComm_t comm, bool send, int peer, const void* buf, size_t rowBytes,
                     const int64_t* rows, size_t nrows, void* stream, const char* fn) {
  PendingCall c{comm, send, peer, RowStream{}, ArgCheck{}, stream};
  c.data.base = static_cast<char*>(const_cast<void*>(buf));
  c.data.rowBytes = rowBytes;
  c.data.rows = rows;
  c.data.nrows = nrows;
  if (buf == nullptr && nrows * rowBytes > 0) c.check.fail("%s: buffer is NULL with %zu bytes to move", fn, nrows * rowBytes);
  if (commIsLive(comm)) {
    checkStream(comm, stream, fn, &c.check);
    checkDevicePtr(comm, buf, fn, "the buffer", &c.check);
    checkDevicePtr(comm, rows, fn, "rowIdx", &c.check);
  }
  return c;
}

// Row indices of a host comm are checked here; a CUDA comm's live on the device (reading them
// would stall the caller's stream), so only their presence is checked.
fuscoResult_t checkRows(fuscoComm_t comm, const int64_t* rows, size_t nrows, size_t rowBytes, bool unique,
                        const char* fn, ArgCheck* a) {
  if (nrows > 0 && rows == nullptr) { a->fail("%s: rowIdx is NULL with %zu rows", fn, nrows); return fuscoSuccess; }
  if (rowBytes == 0) { a->fail("%s: rowBytes is 0", fn); return fuscoSuccess; }
  if (!commIsLive(comm) || isCudaComm(comm)) return fuscoSuccess;
  for (size_t i = 0; i < nrows; ++i)
    if (rows[i] < 0) { a->fail("%s: rowIdx[%zu] = %lld is negative", fn, i, (long long)rows[i]); return fuscoSuccess; }
  if (unique && nrows > 1) {
    std::vector<int64_t> sorted(rows, rows + nrows);
    std::sort(sorted.begin(), sorted.end());
    auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    if (dup != sorted.end()) a->fail("%s: receive row %lld appears more than once", fn, (long long)*dup);
  }
  return fuscoSuccess;
}

}  // namespace

extern "C" {

fuscoResult_t fuscoAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                            fuscoDataType_t datatype, fuscoComm_t comm, void* stream) {
  return guarded(comm, "fuscoAllToAll", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkComm(comm, "fuscoAllToAll"));
    FUSCO_CHECK(faultPoint(FaultPhase::AllToAll, comm->impl->rank(), [&](const char* w) { comm->impl->markBroken(fuscoRemoteError, w); }));
    int n = comm->impl->nranks();
    Op op(n);
    op.name = "fuscoAllToAll";
    op.kind = OpKind::AllToAll;
    op.collective = true;
    ArgCheck a;
    checkStream(comm, stream, "fuscoAllToAll", &a);
    checkDevicePtr(comm, sendbuff, "fuscoAllToAll", "sendbuff", &a);
    checkDevicePtr(comm, recvbuff, "fuscoAllToAll", "recvbuff", &a);
    op.stream = stream;
    size_t es = dataTypeSize(datatype);
    if (es == 0) a.fail("fuscoAllToAll: invalid datatype %d", rawEnum(datatype));
    if (count > 0 && (sendbuff == nullptr || recvbuff == nullptr))
      a.fail("fuscoAllToAll: sendbuff (%p) and recvbuff (%p) must be non-NULL when count > 0", sendbuff, recvbuff);
    if (a.status == fuscoSuccess) {
      size_t block = count * es;
      for (int p = 0; p < n; ++p) {
        op.peers[p].sends.push_back(RowStream::flat(static_cast<const char*>(sendbuff) + p * block, block));
        op.peers[p].recvs.push_back(RowStream::flat(static_cast<char*>(recvbuff) + p * block, block));
      }
    }
    return runChecked(op, a, comm);
  });
}

fuscoResult_t fuscoAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                             void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                             fuscoDataType_t datatype, fuscoComm_t comm, void* stream) {
  return guarded(comm, "fuscoAllToAllv", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkComm(comm, "fuscoAllToAllv"));
    FUSCO_CHECK(faultPoint(FaultPhase::AllToAll, comm->impl->rank(), [&](const char* w) { comm->impl->markBroken(fuscoRemoteError, w); }));
    int n = comm->impl->nranks();
    Op op(n);
    op.name = "fuscoAllToAllv";
    op.kind = OpKind::AllToAllv;
    op.collective = true;
    ArgCheck a;
    checkStream(comm, stream, "fuscoAllToAllv", &a);
    checkDevicePtr(comm, sendbuff, "fuscoAllToAllv", "sendbuff", &a);
    checkDevicePtr(comm, recvbuff, "fuscoAllToAllv", "recvbuff", &a);
    op.stream = stream;
    size_t es = dataTypeSize(datatype);
    if (es == 0) a.fail("fuscoAllToAllv: invalid datatype %d", rawEnum(datatype));
    if (!sendcounts || !sdispls || !recvcounts || !rdispls)
      a.fail("fuscoAllToAllv: sendcounts, sdispls, recvcounts and rdispls must be non-NULL");
    for (int p = 0; a.status == fuscoSuccess && p < n; ++p) {
      if (sendcounts[p] > 0 && sendbuff == nullptr) a.fail("fuscoAllToAllv: sendbuff is NULL but sendcounts[%d] = %zu", p, sendcounts[p]);
      if (recvcounts[p] > 0 && recvbuff == nullptr) a.fail("fuscoAllToAllv: recvbuff is NULL but recvcounts[%d] = %zu", p, recvcounts[p]);
    }
    if (a.status == fuscoSuccess) {
      for (int p = 0; p < n; ++p) {
        op.peers[p].sends.push_back(RowStream::flat(static_cast<const char*>(sendbuff) + sdispls[p] * es, sendcounts[p] * es));
        op.peers[p].recvs.push_back(RowStream::flat(static_cast<char*>(recvbuff) + rdispls[p] * es, recvcounts[p] * es));
      }
    }
    return runChecked(op, a, comm);
  });
}

fuscoResult_t fuscoGroupStart(void) {
  tGroup.depth++;
  return fuscoSuccess;
}

fuscoResult_t fuscoGroupEnd(void) {
  return guarded(nullptr, "fuscoGroupEnd", [&]() -> fuscoResult_t {
    if (tGroup.depth == 0)
      return FUSCO_FAIL(fuscoInvalidUsage, kApi, "fuscoGroupEnd without a matching fuscoGroupStart");
    if (--tGroup.depth > 0) return fuscoSuccess;
    std::vector<PendingCall> calls;
    calls.swap(tGroup.calls);
    return runGroup(std::move(calls));
  });
}

fuscoResult_t fuscoSend(const void* sendbuff, size_t count, fuscoDataType_t datatype, int peer,
                        fuscoComm_t comm, void* stream) {
  return guarded(comm, "fuscoSend", [&]() -> fuscoResult_t {
    size_t es = dataTypeSize(datatype);
    PendingCall c = makeCall(comm, true, peer, sendbuff, count * (es ? es : 1), nullptr, 1, stream, "fuscoSend");
    if (es == 0) c.check.fail("fuscoSend: invalid datatype %d", rawEnum(datatype));
    return enqueue(c, "fuscoSend");
  });
}

fuscoResult_t fuscoRecv(void* recvbuff, size_t count, fuscoDataType_t datatype, int peer,
                        fuscoComm_t comm, void* stream) {
  return guarded(comm, "fuscoRecv", [&]() -> fuscoResult_t {
    size_t es = dataTypeSize(datatype);
    PendingCall c = makeCall(comm, false, peer, recvbuff, count * (es ? es : 1), nullptr, 1, stream, "fuscoRecv");
    if (es == 0) c.check.fail("fuscoRecv: invalid datatype %d", rawEnum(datatype));
    return enqueue(c, "fuscoRecv");
  });
}

fuscoResult_t fuscoGatherSend(const void* sendbuff, const int64_t* rowIdx, size_t nrows,
                              size_t rowBytes, int peer, fuscoComm_t comm, void* stream) {
  return guarded(comm, "fuscoGatherSend", [&]() -> fuscoResult_t {
    PendingCall c = makeCall(comm, true, peer, sendbuff, rowBytes, rowIdx, nrows, stream, "fuscoGatherSend");
    checkRows(comm, rowIdx, nrows, rowBytes, false, "fuscoGatherSend", &c.check);
    return enqueue(c, "fuscoGatherSend");
  });
}

fuscoResult_t fuscoScatterRecv(void* recvbuff, const int64_t* rowIdx, size_t nrows,
                               size_t rowBytes, int peer, fuscoComm_t comm, void* stream) {
  return guarded(comm, "fuscoScatterRecv", [&]() -> fuscoResult_t {
    PendingCall c = makeCall(comm, false, peer, recvbuff, rowBytes, rowIdx, nrows, stream, "fuscoScatterRecv");
    checkRows(comm, rowIdx, nrows, rowBytes, true, "fuscoScatterRecv", &c.check);
    return enqueue(c, "fuscoScatterRecv");
  });
}

}  // extern "C"
