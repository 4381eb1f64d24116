#include "engine/collective_ops.h"

namespace fusco {

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

}  // namespace fusco
