#include "engine/collective_ops.h"

#include <cstdio>
#include <cstring>
#include <new>

#include "core/result.h"
#include "device/cuda_rt.h"
#include "plan/layout_check.h"

namespace fusco {

namespace {

// The bytes one call of a group touches: its whole range when contiguous; otherwise each row it
// names, unless the row list lives on the device.
void callRanges(const RowStream& d, bool deviceRows, std::vector<ByteRange>* out) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(d.base);
  if (d.rows == nullptr) return out->push_back(ByteRange{b, b + d.bytes()});
  if (deviceRows) return;
  for (size_t i = 0; i < d.nrows; ++i) {
    const uintptr_t at = b + static_cast<uintptr_t>(d.rows[i]) * d.rowBytes;
    out->push_back(ByteRange{at, at + d.rowBytes});
  }
}

}  // namespace

Op allToAllOp(int nranks, const void* sendbuff, void* recvbuff, size_t blockBytes, void* stream,
              bool withData) {
  Op op(nranks);
  op.name = "fuscoAllToAll";
  op.kind = OpKind::AllToAll;
  op.collective = true;
  op.stream = stream;
  for (int p = 0; p < nranks && withData; ++p) {
    const size_t at = p * blockBytes;
    op.peers[p].sends.push_back(
        RowStream::flat(static_cast<const char*>(sendbuff) + at, blockBytes));
    op.peers[p].recvs.push_back(RowStream::flat(static_cast<char*>(recvbuff) + at, blockBytes));
  }
  return op;
}

Op allToAllvOp(int nranks, const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
               void* recvbuff, const size_t recvcounts[], const size_t rdispls[], size_t elemBytes,
               void* stream, bool withData) {
  Op op(nranks);
  op.name = "fuscoAllToAllv";
  op.kind = OpKind::AllToAllv;
  op.collective = true;
  op.stream = stream;
  const char* s = static_cast<const char*>(sendbuff);
  char* r = static_cast<char*>(recvbuff);
  for (int p = 0; p < nranks && withData; ++p) {
    op.peers[p].sends.push_back(
        RowStream::flat(s + sdispls[p] * elemBytes, sendcounts[p] * elemBytes));
    op.peers[p].recvs.push_back(
        RowStream::flat(r + rdispls[p] * elemBytes, recvcounts[p] * elemBytes));
  }
  return op;
}

Op groupOp(int nranks, const std::vector<P2pCall>& calls) {
  Op op(nranks);
  op.name = "group send/recv";
  op.kind = OpKind::Group;
  for (const P2pCall& c : calls) {
    if (op.stream == nullptr) op.stream = c.stream;
    if (c.peer < 0 || c.peer >= nranks) continue;
    PeerWork& w = op.peers[c.peer];
    (c.send ? w.sends : w.recvs).push_back(c.data);
  }
  return op;
}

const void* copyInPlaceSendSide(Communicator& comm, const void* buff, size_t bytes, void* stream,
                                InPlaceCopy* copy, ArgCheck* a) {
  if (comm.memType() == fuscoMemCuda) {
    char* p = nullptr;
    if (comm.scratchOn(kInPlaceScratch, bytes, stream, &p) != fuscoSuccess ||
        cudaCopyAsync(p, buff, bytes, stream) != fuscoSuccess) {
      a->status = fuscoSystemError;
      a->message = "fuscoAllToAll: copying the send side of an in-place call: " + threadLastError();
      return buff;
    }
    return p;
  }
  copy->host.reset(new (std::nothrow) char[bytes]);
  if (copy->host == nullptr) {
    a->status = fuscoSystemError;
    a->message = "fuscoAllToAll: out of memory for the copy of an in-place call's " +
                 std::to_string(bytes) + " bytes";
    return buff;
  }
  memcpy(copy->host.get(), buff, bytes);
  return copy->host.get();
}

std::string groupOverlap(const std::vector<P2pCall>& calls, bool deviceRows) {
  std::vector<ByteRange> sends, recvs;
  std::vector<size_t> sendCall, recvCall;
  for (size_t i = 0; i < calls.size(); ++i) {
    std::vector<ByteRange>& side = calls[i].send ? sends : recvs;
    callRanges(calls[i].data, deviceRows, &side);
    (calls[i].send ? sendCall : recvCall).resize(side.size(), i);
  }
  size_t si = 0, ri = 0;
  if (!findSendRecvOverlap(sends, recvs, &si, &ri)) return "";
  const P2pCall& s = calls[sendCall[si]];
  const P2pCall& r = calls[recvCall[ri]];
  char buf[512];  // the size ArgCheck uses
  snprintf(buf, sizeof(buf),
           "fuscoGroupEnd: a send to rank %d (call %zu of the group, bytes from %p) overlaps a "
           "receive from rank %d (call %zu, bytes from %p); send and receive ranges of one group "
           "must not overlap",
           s.peer, sendCall[si], reinterpret_cast<void*>(sends[si].begin), r.peer, recvCall[ri],
           reinterpret_cast<void*>(recvs[ri].begin));
  return buf;
}

}  // namespace fusco
