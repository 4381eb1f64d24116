// NCCL-compatible all-to-all entry points: fuscoAllToAll(v), groups, send/recv and the row
// primitives fuscoGatherSend / fuscoScatterRecv. Each builds an engine Op; a rank whose own
// arguments are invalid still runs the Op's header exchange (with its error) so no peer waits.
#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "api/api_internal.h"
#include "core/checked_math.h"
#include "device/cuda_rt.h"
#include "engine/collective_ops.h"
#include "plan/layout_check.h"

using namespace fusco;

namespace {

fuscoResult_t runChecked(Op& op, const ArgCheck& a, fuscoComm_t comm) {
  op.argStatus = a.status;
  op.argError = a.message;
  return runOp(*comm->impl, op);
}

// ------------------------------------------------------------------ byte sizes and overlap
// An in-place fuscoAllToAll reads its send side from a copy taken before any byte moves: block j
// of the buffer is overwritten by rank j's data while rank j may not have read it yet.
struct InPlaceCopy {
  std::unique_ptr<char[]> host;
};

// The buffer to send from: sendbuff itself, or for sendbuff == recvbuff a copy of it (host memory
// here; the comm's scratch on a CUDA comm, copied on the stream). Partial overlap is refused.
const void* sendSide(fuscoComm_t comm, const void* sendbuff, void* recvbuff, size_t bytes,
                     void* stream, InPlaceCopy* copy, ArgCheck* a) {
  const uintptr_t s = reinterpret_cast<uintptr_t>(sendbuff),
                  r = reinterpret_cast<uintptr_t>(recvbuff);
  if (s != r && s < r + bytes && r < s + bytes)
    a->fail(
        "fuscoAllToAll: sendbuff %p and recvbuff %p overlap over %zu bytes each; pass the same "
        "pointer for an in-place all-to-all, or separate buffers",
        sendbuff, recvbuff, bytes);
  if (s != r || !a->ok()) return sendbuff;
  if (isCudaComm(comm)) {
    char* p = nullptr;
    if (comm->impl->scratch(kInPlaceScratch, bytes, &p) != fuscoSuccess ||
        cudaCopyDeviceAsync(p, sendbuff, bytes, stream) != fuscoSuccess) {
      a->status = fuscoSystemError;
      a->message = "fuscoAllToAll: copying the send side of an in-place call: " + threadLastError();
      return sendbuff;
    }
    return p;
  }
  copy->host.reset(new (std::nothrow) char[bytes]);
  if (copy->host == nullptr) {
    a->status = fuscoSystemError;
    a->message = "fuscoAllToAll: out of memory for the copy of an in-place call's " +
                 std::to_string(bytes) + " bytes";
    return sendbuff;
  }
  memcpy(copy->host.get(), sendbuff, bytes);
  return copy->host.get();
}

// One side of fuscoAllToAllv: every count and displacement in bytes, and their sum, without
// overflow; the byte ranges into *ranges.
void checkVSide(int n, const void* buff, const size_t counts[], const size_t displs[], size_t es,
                const char* side, std::vector<ByteRange>* ranges, ArgCheck* a) {
  size_t total = 0;
  for (int p = 0; p < n && a->ok(); ++p) {
    size_t end = 0, bytes = 0;
    if (!checkedEnd(displs[p], counts[p], es, &end) || !checkedAdd(total, counts[p], &total) ||
        !checkedMul(total, es, &bytes) || end > UINTPTR_MAX - reinterpret_cast<uintptr_t>(buff))
      return a->fail(
          "fuscoAllToAllv: %scounts[%d] = %zu at %sdispls[%d] = %zu of %zu-byte "
          "elements overflows a byte size (or the sum of the counts does)",
          side, p, counts[p], side, p, displs[p], es);
    const uintptr_t b = reinterpret_cast<uintptr_t>(buff);
    ranges->push_back(ByteRange{b + displs[p] * es, b + end});
  }
}

void checkAllToAllvSizes(int n, const void* sendbuff, const size_t sendcounts[],
                         const size_t sdispls[], const void* recvbuff, const size_t recvcounts[],
                         const size_t rdispls[], size_t es, ArgCheck* a) {
  std::vector<ByteRange> sends, recvs;
  checkVSide(n, sendbuff, sendcounts, sdispls, es, "send", &sends, a);
  checkVSide(n, recvbuff, recvcounts, rdispls, es, "recv", &recvs, a);
  size_t si = 0, ri = 0;
  if (a->ok() && findSendRecvOverlap(sends, recvs, &si, &ri))
    a->fail(
        "fuscoAllToAllv: the send block for rank %zu overlaps the receive block from rank %zu "
        "(send and receive ranges of one call must not overlap; fuscoAllToAll supports "
        "sendbuff == recvbuff)",
        si, ri);
}

// ------------------------------------------------------------------ groups
struct PendingCall {
  fuscoComm_t comm;
  P2pCall call;
  ArgCheck check;
};

struct GroupState {
  int depth = 0;
  std::vector<PendingCall> calls;
};
thread_local GroupState tGroup;

// The bytes one call of a group touches: its whole range when contiguous; on a host comm, each
// row it names (a CUDA comm's row lists live on the device and are not read here).
void callRanges(fuscoComm_t comm, const RowStream& d, std::vector<ByteRange>* out) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(d.base);
  if (d.rows == nullptr) return out->push_back(ByteRange{b, b + d.bytes()});
  if (isCudaComm(comm)) return;
  for (size_t i = 0; i < d.nrows; ++i) {
    const uintptr_t at = b + static_cast<uintptr_t>(d.rows[i]) * d.rowBytes;
    out->push_back(ByteRange{at, at + d.rowBytes});
  }
}

// Within one group on one comm, a send range that overlaps a receive range has no defined result
// (the receive may land before the send has read it): refused.
void checkGroupOverlap(fuscoComm_t comm, const std::vector<P2pCall>& calls, ArgCheck* a) {
  std::vector<ByteRange> sends, recvs;
  std::vector<size_t> sendCall, recvCall;
  for (size_t i = 0; i < calls.size(); ++i) {
    std::vector<ByteRange>& side = calls[i].send ? sends : recvs;
    callRanges(comm, calls[i].data, &side);
    (calls[i].send ? sendCall : recvCall).resize(side.size(), i);
  }
  size_t si = 0, ri = 0;
  if (!findSendRecvOverlap(sends, recvs, &si, &ri)) return;
  const P2pCall& s = calls[sendCall[si]];
  const P2pCall& r = calls[recvCall[ri]];
  a->fail(
      "fuscoGroupEnd: a send to rank %d (call %zu of the group, bytes from %p) overlaps a "
      "receive from rank %d (call %zu, bytes from %p); send and receive ranges of one group "
      "must not overlap",
      s.peer, sendCall[si], reinterpret_cast<void*>(sends[si].begin), r.peer, recvCall[ri],
      reinterpret_cast<void*>(recvs[ri].begin));
}

// The communicators of a group, each once, in an order every rank agrees on: by their tag, which
// is the same on every rank of a communicator (pointers and call order are not). Each runs one
// engine operation, and an operation waits only for ranks of its own communicator; with one order
// for all, no two ranks can wait for each other on two communicators in opposite orders, however
// the calls were added. A comm that is not live sorts first (its operation fails at once).
std::vector<fuscoComm_t> groupComms(const std::vector<PendingCall>& calls) {
  std::vector<std::pair<uint64_t, fuscoComm_t>> comms;
  for (const auto& c : calls) {
    if (std::any_of(comms.begin(), comms.end(), [&](const auto& x) { return x.second == c.comm; }))
      continue;
    comms.push_back({commIsLive(c.comm) ? c.comm->impl->commTag() : 0, c.comm});
  }
  std::stable_sort(comms.begin(), comms.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<fuscoComm_t> out;
  for (const auto& x : comms) out.push_back(x.second);
  return out;
}

fuscoResult_t runGroup(std::vector<PendingCall> calls) {
  const std::vector<fuscoComm_t> comms = groupComms(calls);
  fuscoResult_t first = fuscoSuccess;
  std::string firstMsg;
  for (fuscoComm_t comm : comms) {
    fuscoResult_t r = guarded(comm, "fuscoGroupEnd", CallKind::Group, [&]() -> fuscoResult_t {
      FUSCO_CHECK(checkComm(comm, "fuscoGroupEnd"));
      ArgCheck a;
      std::vector<P2pCall> mine;
      for (const auto& c : calls) {
        if (c.comm != comm) continue;
        if (!c.check.ok() && a.ok()) a = c.check;
        mine.push_back(c.call);
      }
      if (a.ok()) checkGroupOverlap(comm, mine, &a);
      Op op = groupOp(comm->impl->nranks(), mine);
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
  if (call.call.peer < 0 || call.call.peer >= n)
    call.check.fail("%s: peer %d is outside [0, %d)", fn, call.call.peer, n);
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
  PendingCall c{comm, P2pCall{send, peer, RowStream::indexed(buf, rowBytes, rows, nrows), stream},
                ArgCheck{}};
  if (buf == nullptr && nrows > 0 && rowBytes > 0)
    c.check.fail("%s: buffer is NULL with %zu rows of %zu bytes to move", fn, nrows, rowBytes);
  if (commIsLive(comm)) {
    checkStream(comm, stream, fn, &c.check);
    checkDevicePtr(comm, buf, fn, "the buffer", &c.check);
    checkDevicePtr(comm, rows, fn, "rowIdx", &c.check);
  }
  return c;
}

// Row indices of a host comm are checked here; a CUDA comm's live on the device (reading them
// would stall the caller's stream), so only their presence is checked.
void checkRows(fuscoComm_t comm, const int64_t* rows, size_t nrows, size_t rowBytes, bool unique,
               const char* fn, ArgCheck* a) {
  std::string msg;
  size_t bytes = 0;
  if (nrows > 0 && rows == nullptr) return a->fail("%s: rowIdx is NULL with %zu rows", fn, nrows);
  if (rowBytes == 0) return a->fail("%s: rowBytes is 0", fn);
  if (!checkedMul(nrows, rowBytes, &bytes))
    return a->fail("%s: nrows %zu x rowBytes %zu overflows a byte size", fn, nrows, rowBytes);
  if (!commIsLive(comm) || isCudaComm(comm)) return;
  if (!checkRowIndices(rows, nrows, unique, fn, &msg)) return a->fail("%s", msg.c_str());
  int64_t top = 0;
  for (size_t i = 0; i < nrows; ++i) top = std::max(top, rows[i]);
  if (nrows > 0 && !checkedEnd(static_cast<size_t>(top), 1, rowBytes, &bytes))
    a->fail("%s: row %lld x rowBytes %zu overflows a byte offset", fn, static_cast<long long>(top),
            rowBytes);
}

}  // namespace

extern "C" {

fuscoResult_t fuscoAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                            fuscoDataType_t datatype, fuscoComm_t comm, void* stream) {
  return guarded(comm, "fuscoAllToAll", CallKind::Collective, [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkComm(comm, "fuscoAllToAll"));
    FUSCO_CHECK(injectFault(comm, FaultPhase::AllToAll));
    const int n = comm->impl->nranks();
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
    InPlaceCopy copy;
    if (a.ok() && totalBytes > 0)
      sendbuff = sendSide(comm, sendbuff, recvbuff, totalBytes, stream, &copy, &a);
    Op op = allToAllOp(n, sendbuff, recvbuff, blockBytes, stream, a.ok());
    return runChecked(op, a, comm);
  });
}

fuscoResult_t fuscoAllToAllv(const void* sendbuff, const size_t sendcounts[],
                             const size_t sdispls[], void* recvbuff, const size_t recvcounts[],
                             const size_t rdispls[], fuscoDataType_t datatype, fuscoComm_t comm,
                             void* stream) {
  return guarded(comm, "fuscoAllToAllv", CallKind::Collective, [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkComm(comm, "fuscoAllToAllv"));
    FUSCO_CHECK(injectFault(comm, FaultPhase::AllToAll));
    const int n = comm->impl->nranks();
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
    if (a.ok())
      checkAllToAllvSizes(n, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, es, &a);
    Op op = allToAllvOp(n, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, es, stream,
                        a.ok());
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
      return FUSCO_FAIL(fuscoInvalidUsage, kApi,
                        "fuscoGroupEnd without a matching fuscoGroupStart");
    if (--tGroup.depth > 0) return fuscoSuccess;
    std::vector<PendingCall> calls;
    calls.swap(tGroup.calls);
    return runGroup(std::move(calls));
  });
}

fuscoResult_t fuscoSend(const void* sendbuff, size_t count, fuscoDataType_t datatype, int peer,
                        fuscoComm_t comm, void* stream) {
  return guarded(comm, "fuscoSend", [&]() -> fuscoResult_t {
    const size_t es = dataTypeSize(datatype);
    size_t bytes = 0;
    const bool fits = checkedMul(count, es ? es : 1, &bytes);
    PendingCall c = makeCall(comm, true, peer, sendbuff, bytes, nullptr, 1, stream, "fuscoSend");
    if (es == 0) c.check.fail("fuscoSend: invalid datatype %d", rawEnum(datatype));
    if (!fits)
      c.check.fail("fuscoSend: count %zu x %zu-byte elements overflows a byte size", count, es);
    return enqueue(c, "fuscoSend");
  });
}

fuscoResult_t fuscoRecv(void* recvbuff, size_t count, fuscoDataType_t datatype, int peer,
                        fuscoComm_t comm, void* stream) {
  return guarded(comm, "fuscoRecv", [&]() -> fuscoResult_t {
    const size_t es = dataTypeSize(datatype);
    size_t bytes = 0;
    const bool fits = checkedMul(count, es ? es : 1, &bytes);
    PendingCall c = makeCall(comm, false, peer, recvbuff, bytes, nullptr, 1, stream, "fuscoRecv");
    if (es == 0) c.check.fail("fuscoRecv: invalid datatype %d", rawEnum(datatype));
    if (!fits)
      c.check.fail("fuscoRecv: count %zu x %zu-byte elements overflows a byte size", count, es);
    return enqueue(c, "fuscoRecv");
  });
}

fuscoResult_t fuscoGatherSend(const void* sendbuff, const int64_t* rowIdx, size_t nrows,
                              size_t rowBytes, int peer, fuscoComm_t comm, void* stream) {
  return guarded(comm, "fuscoGatherSend", [&]() -> fuscoResult_t {
    PendingCall c =
        makeCall(comm, true, peer, sendbuff, rowBytes, rowIdx, nrows, stream, "fuscoGatherSend");
    checkRows(comm, rowIdx, nrows, rowBytes, false, "fuscoGatherSend", &c.check);
    return enqueue(c, "fuscoGatherSend");
  });
}

fuscoResult_t fuscoScatterRecv(void* recvbuff, const int64_t* rowIdx, size_t nrows, size_t rowBytes,
                               int peer, fuscoComm_t comm, void* stream) {
  return guarded(comm, "fuscoScatterRecv", [&]() -> fuscoResult_t {
    PendingCall c =
        makeCall(comm, false, peer, recvbuff, rowBytes, rowIdx, nrows, stream, "fuscoScatterRecv");
    checkRows(comm, rowIdx, nrows, rowBytes, true, "fuscoScatterRecv", &c.check);
    return enqueue(c, "fuscoScatterRecv");
  });
}

}  // extern "C"
