// NCCL-compatible all-to-all entry points: fuscoAllToAll(v), groups, send/recv and the row
// primitives fuscoGatherSend / fuscoScatterRecv. Each builds an engine Op; a rank whose own
// arguments are invalid still runs the Op's header exchange (with its error) so no peer waits.
#include <string>
#include <utility>
#include <vector>

#include "api/api_internal.h"
#include "core/checked_math.h"
#include "engine/collective_ops.h"
#include "engine/group_calls.h"
#include "plan/layout_check.h"

using namespace fusco;

namespace {

uint64_t commTagOf(fuscoComm_t comm) { return commIsLive(comm) ? implOf(comm).commTag() : 0; }

fuscoResult_t runGroup(std::vector<PendingCall> calls) {
  const std::vector<fuscoComm_t> comms = groupComms(calls, commTagOf);
  fuscoResult_t first = fuscoSuccess;
  std::string firstMsg;
  for (fuscoComm_t comm : comms) {
    fuscoResult_t r = guarded(comm, "fuscoGroupEnd", CallKind::Group, [&]() -> fuscoResult_t {
      FUSCO_CHECK(checkComm(comm, "fuscoGroupEnd"));
      ArgCheck a;
      const std::vector<P2pCall> mine = groupCallsOf(calls, comm, isCudaComm(comm), &a);
      Op op = groupOp(implOf(comm).nranks(), mine);
      return runOp(implOf(comm), op, a);
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
  int n = implOf(call.comm).nranks();
  if (call.call.peer < 0 || call.call.peer >= n)
    call.check.fail("%s: peer %d is outside [0, %d)", fn, call.call.peer, n);
  fuscoResult_t own = call.check.status;
  std::string ownMsg = call.check.message;
  if (threadGroup().depth > 0) {
    threadGroup().calls.push_back(call);
    if (own != fuscoSuccess) return FUSCO_FAIL(own, kApi, "%s", ownMsg.c_str());
    return fuscoSuccess;
  }
  std::vector<PendingCall> one{call};
  return runGroup(std::move(one));
}

PendingCall makeCall(fuscoComm_t comm, bool send, int peer, const void* buf, size_t rowBytes,
                     const int64_t* rows, size_t nrows, void* stream, const char* fn) {
  PendingCall c{comm, P2pCall{send, peer, RowStream::indexed(buf, rowBytes, rows, nrows), stream},
                ArgCheck{}};
  if (buf == nullptr && nrows > 0 && rowBytes > 0)
    c.check.fail("%s: buffer is NULL with %zu rows of %zu bytes to move", fn, nrows, rowBytes);
  if (commIsLive(comm)) {
    checkStream(comm, stream, fn, &c.check);
    // A call that moves nothing reads neither (NCCL programs pass the end of a buffer for a zero
    // count, which the CUDA runtime may not place in any allocation).
    if (nrows > 0 && rowBytes > 0) {
      checkDevicePtr(comm, buf, fn, "the buffer", &c.check);
      checkDevicePtr(comm, rows, fn, "rowIdx", &c.check);
    }
  }
  return c;
}

// fuscoSend / fuscoRecv: count elements of datatype, one contiguous row.
fuscoResult_t sendOrRecv(bool send, const void* buf, size_t count, fuscoDataType_t datatype,
                         int peer, fuscoComm_t comm, void* stream, const char* fn) {
  const size_t es = dataTypeSize(datatype);
  size_t bytes = 0;
  const bool fits = checkedMul(count, es ? es : 1, &bytes);
  PendingCall c = makeCall(comm, send, peer, buf, bytes, nullptr, 1, stream, fn);
  if (es == 0) c.check.fail("%s: invalid datatype %d", fn, rawEnum(datatype));
  if (!fits) c.check.fail("%s: count %zu x %zu-byte elements overflows a byte size", fn, count, es);
  return enqueue(c, fn);
}

}  // namespace

extern "C" {

fuscoResult_t fuscoAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                            fuscoDataType_t datatype, fuscoComm_t comm, void* stream) {
  return guarded(comm, "fuscoAllToAll", CallKind::Collective, [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkComm(comm, "fuscoAllToAll"));
    FUSCO_CHECK(implOf(comm).injectFault(FaultPhase::AllToAll));
    const int n = implOf(comm).nranks();
    ArgCheck a;
    checkStream(comm, stream, "fuscoAllToAll", &a);
    checkDevicePtr(comm, sendbuff, "fuscoAllToAll", "sendbuff", &a);
    checkDevicePtr(comm, recvbuff, "fuscoAllToAll", "recvbuff", &a);
    const size_t es = dataTypeSize(datatype);
    if (es == 0) a.fail("fuscoAllToAll: invalid datatype %d", rawEnum(datatype));
    if (count > 0 && (sendbuff == nullptr || recvbuff == nullptr))
      a.fail("fuscoAllToAll: sendbuff (%p) and recvbuff (%p) must be non-NULL when count > 0",
             sendbuff, recvbuff);
    size_t blockBytes = 0, totalBytes = 0;
    if (es != 0 && (!checkedMul(count, es, &blockBytes) || !checkedMul(blockBytes, n, &totalBytes)))
      a.fail("fuscoAllToAll: count %zu x %zu-byte elements x %d ranks overflows a byte size", count,
             es, n);
    std::string msg;
    if (a.ok() && !checkAllToAllOverlap(sendbuff, recvbuff, totalBytes, &msg))
      a.fail("%s", msg.c_str());
    InPlaceCopy copy;  // sendbuff == recvbuff: send from a copy (engine/collective_ops.h)
    if (a.ok() && totalBytes > 0 && sendbuff == recvbuff)
      sendbuff = copyInPlaceSendSide(implOf(comm), sendbuff, totalBytes, stream, &copy, &a);
    Op op = allToAllOp(n, sendbuff, recvbuff, blockBytes, stream, a.ok());
    return runOp(implOf(comm), op, a);
  });
}

fuscoResult_t fuscoAllToAllv(const void* sendbuff, const size_t sendcounts[],
                             const size_t sdispls[], void* recvbuff, const size_t recvcounts[],
                             const size_t rdispls[], fuscoDataType_t datatype, fuscoComm_t comm,
                             void* stream) {
  return guarded(comm, "fuscoAllToAllv", CallKind::Collective, [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkComm(comm, "fuscoAllToAllv"));
    FUSCO_CHECK(implOf(comm).injectFault(FaultPhase::AllToAll));
    const int n = implOf(comm).nranks();
    ArgCheck a;
    checkStream(comm, stream, "fuscoAllToAllv", &a);
    checkDevicePtr(comm, sendbuff, "fuscoAllToAllv", "sendbuff", &a);
    checkDevicePtr(comm, recvbuff, "fuscoAllToAllv", "recvbuff", &a);
    const size_t es = dataTypeSize(datatype);
    if (es == 0) a.fail("fuscoAllToAllv: invalid datatype %d", rawEnum(datatype));
    if (!sendcounts || !sdispls || !recvcounts || !rdispls)
      a.fail("fuscoAllToAllv: sendcounts, sdispls, recvcounts and rdispls must be non-NULL");
    for (int p = 0; a.ok() && p < n; ++p) {
      if (sendcounts[p] > 0 && sendbuff == nullptr)
        a.fail("fuscoAllToAllv: sendbuff is NULL but sendcounts[%d] = %zu", p, sendcounts[p]);
      if (recvcounts[p] > 0 && recvbuff == nullptr)
        a.fail("fuscoAllToAllv: recvbuff is NULL but recvcounts[%d] = %zu", p, recvcounts[p]);
    }
    std::string msg;
    if (a.ok() && !checkAllToAllvSizes(n, sendbuff, sendcounts, sdispls, recvbuff, recvcounts,
                                       rdispls, es, &msg))
      a.fail("%s", msg.c_str());
    Op op = allToAllvOp(n, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, es, stream,
                        a.ok());
    return runOp(implOf(comm), op, a);
  });
}

fuscoResult_t fuscoGroupStart(void) {
  threadGroup().depth++;
  return fuscoSuccess;
}

fuscoResult_t fuscoGroupEnd(void) {
  return guarded(nullptr, "fuscoGroupEnd", [&]() -> fuscoResult_t {
    if (threadGroup().depth == 0)
      return FUSCO_FAIL(fuscoInvalidUsage, kApi,
                        "fuscoGroupEnd without a matching fuscoGroupStart");
    if (--threadGroup().depth > 0) return fuscoSuccess;
    std::vector<PendingCall> calls;
    calls.swap(threadGroup().calls);
    return runGroup(std::move(calls));
  });
}

fuscoResult_t fuscoSend(const void* sendbuff, size_t count, fuscoDataType_t datatype, int peer,
                        fuscoComm_t comm, void* stream) {
  return guarded(comm, "fuscoSend", [&] {
    return sendOrRecv(true, sendbuff, count, datatype, peer, comm, stream, "fuscoSend");
  });
}

fuscoResult_t fuscoRecv(void* recvbuff, size_t count, fuscoDataType_t datatype, int peer,
                        fuscoComm_t comm, void* stream) {
  return guarded(comm, "fuscoRecv", [&] {
    return sendOrRecv(false, recvbuff, count, datatype, peer, comm, stream, "fuscoRecv");
  });
}

fuscoResult_t fuscoGatherSend(const void* sendbuff, const int64_t* rowIdx, size_t nrows,
                              size_t rowBytes, int peer, fuscoComm_t comm, void* stream) {
  return guarded(comm, "fuscoGatherSend", [&]() -> fuscoResult_t {
    PendingCall c =
        makeCall(comm, true, peer, sendbuff, rowBytes, rowIdx, nrows, stream, "fuscoGatherSend");
    checkGroupRows(rowIdx, nrows, rowBytes, false, !commIsLive(comm) || isCudaComm(comm),
                   "fuscoGatherSend", &c.check);
    return enqueue(c, "fuscoGatherSend");
  });
}

fuscoResult_t fuscoScatterRecv(void* recvbuff, const int64_t* rowIdx, size_t nrows, size_t rowBytes,
                               int peer, fuscoComm_t comm, void* stream) {
  return guarded(comm, "fuscoScatterRecv", [&]() -> fuscoResult_t {
    PendingCall c =
        makeCall(comm, false, peer, recvbuff, rowBytes, rowIdx, nrows, stream, "fuscoScatterRecv");
    checkGroupRows(rowIdx, nrows, rowBytes, true, !commIsLive(comm) || isCudaComm(comm),
                   "fuscoScatterRecv", &c.check);
    return enqueue(c, "fuscoScatterRecv");
  });
}

}  // extern "C"
