// fuscoMoeDispatch and fuscoMoeCombine on fuscoMemCuda comms: the same plan and the same engine
// operations as on the host, with the plan's index lists on the device and the rows moved by
// kernels (engine_device.h). Dispatch: one pass, source rows straight into the receivers' final
// expert-major rows (replicated per local expert). Combine: one pull operation; each source's
// kernel reads its tokens' rows straight from every rank's expert output (mapped through CUDA
// IPC) and writes the weighted sum in the fixed order of docs/API.md: one pass, no partials, no
// landing area, and the routing weights never leave the source.
#include <cstring>
#include <vector>

#include "core/datatype.h"
#include "device/device_ops.h"
#include "moe/moe_exec.h"

namespace fusco {

namespace {

// Combine's reading kernel (the pull operation's run, enqueued on the caller's thread). The ranks'
// mapped bases are filled in by the progress thread once the peers agreed (engine_async.h); the
// kernel reads them when the stream reaches it. What it takes from the handle is copied now, so
// the run never refers to a handle that a later replan rewrites.
PullRun finalSumRun(const MoeHandle& h, fuscoDataType_t dt, size_t hidden, const float* weights,
                    void* out) {
  DevFinalSum f;
  f.termStart = h.dev.termStart;
  f.termRank = h.dev.termRank;
  f.termRow = h.dev.termRow;
  f.termWeight = h.dev.termWeight;
  f.termLast = h.dev.termLast;
  f.weights = weights;
  f.out = static_cast<char*>(out);
  f.ntokens = h.numTokens;
  return [f, dt, hidden](const char* const* bases, const uint32_t* basesAligned,
                         void* s) -> fuscoResult_t {
    if (f.ntokens == 0) return fuscoSuccess;
    DevFinalSum g = f;
    g.bases = bases;
    g.basesAligned = basesAligned;
    return deviceFinalSum(dt, hidden, g, s);
  };
}

}  // namespace

fuscoResult_t deviceDispatch(MoeHandle& h, const void* x, size_t rowBytes, void* recvX, ArgCheck a,
                             void* stream, std::vector<PeerWork>* work) {
  Communicator& c = *h.comm;
  const int n = c.nranks();
  if (a.status == fuscoSuccess) joinFailure(c.useDevice(), &a);
  if (a.status == fuscoSuccess) joinFailure(h.devBuffer.waitUploaded(stream), &a);
  if (a.status == fuscoSuccess) {
    for (int p = 0; p < n; ++p) {
      const size_t rows = h.send.rows[p].size();
      auto& w = (*work)[p];
      w.sends.push_back(RowStream::indexed(x, rowBytes, h.dev.sendRows[p], rows));
      w.remoteDst.push_back(
          RowStream::fanOut(nullptr, rowBytes, h.dev.sendKStart[p], h.dev.remoteFanRows[p], rows));
      RowStream r = RowStream::fanOut(recvX, rowBytes, h.dev.recvFanStart[p], h.dev.recvFanRows[p],
                                      h.recv.rowsFrom(p));
      r.layoutShared = true;
      r.extent = h.recv.numRecvRows * rowBytes;
      w.recvs.push_back(r);
    }
    joinFailure(deviceZeroRowRanges(recvX, rowBytes, h.dev.paddingRanges, h.recv.padding.size(),
                                    h.dev.paddingLongest, stream),
                &a);
  }
  FUSCO_CHECK(runMoeOp(c, "fuscoMoeDispatch", a, *work, false, stream, true));
  // A replan's upload waits for this call's kernels, which read the lists (device_plan.cc).
  return h.devBuffer.markUsed(stream);
}

fuscoResult_t deviceCombine(MoeHandle& h, const void* expertOut, fuscoDataType_t dt, size_t hidden,
                            const float* topkWeights, void* out, ArgCheck a, void* stream,
                            std::vector<PeerWork>* workOut) {
  Communicator& c = *h.comm;
  const int n = c.nranks(), me = c.rank();
  const size_t rowOut = hidden * dataTypeSize(dt);
  if (a.status == fuscoSuccess) joinFailure(c.useDevice(), &a);
  if (a.status == fuscoSuccess) joinFailure(h.devBuffer.waitUploaded(stream), &a);
  // Peers read this rank's expert output in place when every one of them can map it (fuscoMemAlloc
  // or registered), else a copy of it in the comm's scratch.
  const size_t extent = h.recv.numRecvRows * rowOut;
  const char* offered = static_cast<const char*>(expertOut);
  bool mappable = true;
  uint64_t token = 0;
  for (int p = 0; p < n && mappable && extent > 0 && a.status == fuscoSuccess; ++p)
    mappable = p == me || c.regionToken(p, expertOut, extent, &token);
  if (a.status == fuscoSuccess && !mappable) {
    char* copy = nullptr;
    joinFailure(c.scratchOn(kExpertCopyScratch, extent, stream, &copy), &a);
    if (copy != nullptr)
      joinFailure(deviceCopy({flatCopyTask(expertOut, copy, extent)}, stream), &a);
    offered = copy;
  }
  // One pull operation: the message from p is the (t, k) rows this rank sent p, read by this
  // rank's sum kernel in p's expert output.
  std::vector<PeerWork>& work = *workOut;
  for (int p = 0; p < n && a.status == fuscoSuccess; ++p) {
    RowStream s = RowStream::indexed(offered, rowOut, nullptr, h.recv.fanRows[p].size());
    s.extent = extent;
    work[p].sends.push_back(s);
    work[p].recvs.push_back(RowStream::indexed(nullptr, rowOut, nullptr, h.send.kSlots[p].size()));
  }
  FUSCO_CHECK(runMoeOp(c, "fuscoMoeCombine", a, work, false, stream, true,
                       finalSumRun(h, dt, hidden, topkWeights, out)));
  return h.devBuffer.markUsed(stream);
}

}  // namespace fusco
