// Dispatch with dedup NONE or RANK (and the RANK part of NODE dedup): one engine operation, rows
// gathered from x by token index and written straight into their final expert-major rows, in the
// receiver's buffer when it can be mapped (the sender knows the receiver's fan rows from the
// plan), else through a staging slot that the receiver scatters.
#include <cstring>

#include "moe/moe_exec.h"

namespace fusco {

void addRankDispatch(const MoeHandle& h, int p, const void* x, size_t rowBytes, void* recvX,
                     MoeWork* work) {
  const size_t rows = h.send.rows[p].size();
  PeerWork& w = work->peers[p];
  work->sendDirect(p, MsgKind::Plain, RowStream::indexed(x, rowBytes, h.send.rows[p].data(), rows),
                   RowStream::fanOut(nullptr, rowBytes, h.send.kStart[p].data(),
                                     h.remoteFanRows[p].data(), rows));
  RowStream r = RowStream::fanOut(recvX, rowBytes, h.recv.fanStart[p].data(),
                                  h.recv.fanRows[p].data(), h.recv.rowsFrom(p));
  r.layoutShared = true;
  r.extent = h.recv.numRecvRows * rowBytes;
  w.recvs.push_back(r);
}

void zeroPaddingRows(const MoeHandle& h, size_t rowBytes, void* recvX) {
  for (const RowRange& r : h.recv.padding)
    memset(static_cast<char*>(recvX) + r.start * rowBytes, 0, r.count * rowBytes);
}

fuscoResult_t hostDispatch(MoeHandle& h, const void* x, size_t rowBytes, void* recvX,
                           const ArgCheck& a, MoeWork* work) {
  if (h.dedup == Dedup::Node) return hostDispatchNode(h, x, rowBytes, recvX, a, work);
  for (int p = 0; p < h.shape.nranks && a.ok(); ++p)
    addRankDispatch(h, p, x, rowBytes, recvX, work);
  if (a.ok()) zeroPaddingRows(h, rowBytes, recvX);
  return runMoeWork(*h.comm, "fuscoMoeDispatch", a, *work);
}

}  // namespace fusco
