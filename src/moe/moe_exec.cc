// moeDispatch and moeCombine: the host or device algorithm by the comm's memory type, then the
// call's statistics from the operation this rank actually ran (fuscoMoeGetStats).
#include "moe/moe_exec.h"

#include <mutex>
#include <vector>

#include "core/datatype.h"
#include "moe/moe.h"

namespace fusco {

namespace {

// Rows and bytes this rank put on the intra-node and inter-node paths.
struct Traffic {
  size_t intraRows = 0, interRows = 0, intraBytes = 0, interBytes = 0;
  void add(const Communicator& c, int peer, size_t rows, size_t bytes) {
    if (peer == c.rank()) return;  // rows a rank keeps for itself are not traffic
    if (c.nodes().sameNode(c.rank(), peer))
      intraRows += rows, intraBytes += bytes;
    else
      interRows += rows, interBytes += bytes;
  }
  // Every message this rank sends in an operation, as rows of rowBytes each.
  void addSends(const Communicator& c, const std::vector<PeerWork>& work, size_t rowBytes) {
    for (size_t p = 0; p < work.size(); ++p)
      for (const RowStream& s : work[p].sends)
        add(c, static_cast<int>(p), s.bytes() / rowBytes, s.bytes());
  }
};

}  // namespace

void noteDispatchStats(MoeHandle& h, const std::vector<PeerWork>& work, size_t rowBytes) {
  Traffic traffic;
  traffic.addSends(*h.comm, work, rowBytes);
  std::lock_guard<std::mutex> lk(h.statsMu);
  h.stats.dispatchRowsIntraNode = traffic.intraRows;
  h.stats.dispatchRowsInterNode = traffic.interRows;
  h.stats.dispatchBytesIntraNode = traffic.intraBytes;
  h.stats.dispatchBytesInterNode = traffic.interBytes;
}

void noteCombineStats(MoeHandle& h, const std::vector<PeerWork>& work, size_t rowBytes) {
  Traffic traffic;
  const Communicator& c = *h.comm;
  // The routing weights go to the expert side on the host path (RANK and NODE); a CUDA comm's
  // combine reads the rows from the source, so its weights never leave it.
  const size_t weightBytes =
      h.dedup != Dedup::None && c.memType() != fuscoMemCuda ? sizeof(float) : 0;
  for (int p = 0; p < c.nranks() && weightBytes > 0; ++p)
    traffic.add(c, p, 0, h.weightIdx[p].size() * weightBytes);
  traffic.addSends(c, work, rowBytes);
  std::lock_guard<std::mutex> lk(h.statsMu);
  h.stats.combineBytesIntraNode = traffic.intraBytes;
  h.stats.combineBytesInterNode = traffic.interBytes;
}

fuscoResult_t moeDispatch(MoeHandle& h, const void* x, size_t rowBytes, void* recvX,
                          const ArgCheck& a, void* stream) {
  Communicator& c = *h.comm;
  c.agreeInCall(dispatchAgreement(rowBytes));
  MoeWork work(c.nranks());
  if (c.memType() == fuscoMemCuda)
    FUSCO_CHECK(deviceDispatch(h, x, rowBytes, recvX, a, stream, &work.peers));
  else
    FUSCO_CHECK(hostDispatch(h, x, rowBytes, recvX, a, &work));
  // A capacity plan's CUDA dispatch notes its traffic once sized, on the progress thread.
  if (!(c.memType() == fuscoMemCuda && h.capacity != 0)) noteDispatchStats(h, work.peers, rowBytes);
  return fuscoSuccess;
}

fuscoResult_t moeCombine(MoeHandle& h, const void* expertOut, fuscoDataType_t dt, size_t hidden,
                         const float* topkWeights, void* out, const ArgCheck& a, void* stream) {
  Communicator& c = *h.comm;
  const bool onDevice = c.memType() == fuscoMemCuda;
  c.agreeInCall(combineAgreement(dt, hidden));
  MoeWork work(c.nranks());
  if (onDevice)
    FUSCO_CHECK(deviceCombine(h, expertOut, dt, hidden, topkWeights, out, a, stream, &work.peers));
  else
    FUSCO_CHECK(hostCombine(h, expertOut, dt, hidden, topkWeights, out, a, &work));
  // What this rank put on each path (on the GPU: the rows its peers read from it).
  if (!(onDevice && h.capacity != 0)) noteCombineStats(h, work.peers, hidden * dataTypeSize(dt));
  return fuscoSuccess;
}

}  // namespace fusco
