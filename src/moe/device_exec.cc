// fuscoMoeDispatch and fuscoMoeCombine on fuscoMemCuda comms: the same plan and the same engine
// operations as on the host, with the plan's index lists on the device and the rows moved by
// kernels (engine_device.h). Dispatch: one pass, source rows straight into the receivers' final
// expert-major rows (replicated per local expert). Combine: one pull operation; each source's
// kernel reads its tokens' rows straight from every rank's expert output (mapped through CUDA
// IPC) and writes the weighted sum in the fixed order of docs/API.md: one pass, no partials, no
// landing area, and the routing weights never leave the source.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/datatype.h"
#include "device/device_ops.h"
#include "moe/moe.h"
#include "moe/moe_exec.h"

namespace fusco {

namespace {

// Dispatch's streams with peer p, from the plan's sizes and device lists.
void dispatchStreams(const MoeHandle& h, int p, const void* x, size_t rowBytes, void* recvX,
                     PeerWork* w) {
  const size_t rows = h.sizes.rowsTo[p];
  w->sends.push_back(RowStream::indexed(x, rowBytes, h.dev.sendRows[p], rows));
  w->remoteDst.push_back(
      RowStream::fanOut(nullptr, rowBytes, h.dev.sendKStart[p], h.dev.remoteFanRows[p], rows));
  RowStream r = RowStream::fanOut(recvX, rowBytes, h.dev.recvFanStart[p], h.dev.recvFanRows[p],
                                  h.sizes.rowsFrom[p]);
  r.layoutShared = true;
  r.extent = h.recvRowsBound() * rowBytes;
  w->recvs.push_back(r);
}

// A capacity plan's outcome, as a late operation sees it (docs/API.md, capacity mode): an
// operation of a handle whose plan failed fails alike on every rank (every rank's plan failed).
bool planFailed(const MoeHandle& h, const char* fn, Op& op) {
  if (op.argStatus != fuscoSuccess) return true;
  if (h.planState == MoeHandle::kPlanReady) return false;
  op.argStatus = fuscoInvalidUsage;
  op.argError = std::string(fn) +
                ": the handle's last plan failed on every rank (fuscoCommGetAsyncError said why); "
                "plan it again (fuscoMoeReplan)";
  return true;
}

// A replan's upload waits for this call's kernels, which read the plan's lists (the layer plan
// and, for a plan by the steps, its receive lists too).
fuscoResult_t markListsUsed(MoeHandle& h, void* stream) {
  FUSCO_CHECK(h.devBuffer.markUsed(stream));
  return h.bySteps ? h.steps.fanBuffer.markUsed(stream) : fuscoSuccess;
}

}  // namespace

void deviceCombineStreams(const MoeHandle& h, bool sized, const char* offered, size_t rowOut,
                          size_t extent, std::vector<PeerWork>* work) {
  for (size_t p = 0; p < work->size(); ++p) {
    PeerWork& w = (*work)[p];
    RowStream s = RowStream::indexed(offered, rowOut, nullptr, sized ? h.sizes.slotsFrom[p] : 0);
    s.extent = extent;
    w.sends.assign(1, s);
    w.recvs.assign(1, RowStream::indexed(nullptr, rowOut, nullptr, sized ? h.sizes.slotsTo[p] : 0));
  }
}

LateSizes deviceCombineLate(MoeHandle& h, const char* offered, size_t rowOut, size_t extent) {
  MoeHandle* hp = &h;
  return [hp, offered, rowOut, extent](Op& op) {
    if (planFailed(*hp, "fuscoMoeCombine", op)) return fuscoSuccess;
    // Sized from the plan now: a zero-byte message would leave the peer's base unmapped (null)
    // while the sum kernel reads that peer's rows.
    deviceCombineStreams(*hp, true, offered, rowOut, extent, &op.peers);
    noteCombineStats(*hp, op.peers, rowOut);
    return fuscoSuccess;
  };
}

fuscoResult_t deviceDispatch(MoeHandle& h, const void* x, size_t rowBytes, void* recvX, ArgCheck a,
                             void* stream, std::vector<PeerWork>* work) {
  Communicator& c = *h.comm;
  const int n = c.nranks();
  if (a.status == fuscoSuccess) joinFailure(c.useDevice(), &a);
  if (a.status == fuscoSuccess) joinFailure(h.devBuffer.waitUploaded(stream), &a);
  LateSizes late;
  if (a.status == fuscoSuccess && h.capacity != 0) {
    // The sizes and lists are known on the progress thread only: placeholders now (one stream of
    // each kind per peer), the real streams once the plan resolved.
    for (PeerWork& w : *work) w.sends.resize(1), w.remoteDst.resize(1), w.recvs.resize(1);
    MoeHandle* hp = &h;
    late = [hp, x, rowBytes, recvX](Op& op) {
      if (planFailed(*hp, "fuscoMoeDispatch", op)) return fuscoSuccess;
      for (size_t p = 0; p < op.peers.size(); ++p) {
        op.peers[p] = PeerWork();
        dispatchStreams(*hp, static_cast<int>(p), x, rowBytes, recvX, &op.peers[p]);
      }
      noteDispatchStats(*hp, op.peers, rowBytes);
      return fuscoSuccess;
    };
    // Padding ranges by expert, empty where a range would pass the capacity.
    const LayerPlan& lp = h.steps.plan;
    const int64_t longest = std::max(h.shape.expertAlignment - 1, 0);
    joinFailure(deviceZeroRowRanges(recvX, rowBytes, lp.layout.padByExpert,
                                    h.shape.localExperts[c.rank()].size(), longest, stream),
                &a);
  } else if (a.status == fuscoSuccess) {
    for (int p = 0; p < n; ++p) dispatchStreams(h, p, x, rowBytes, recvX, &(*work)[p]);
    joinFailure(deviceZeroRowRanges(recvX, rowBytes, h.dev.paddingRanges, h.recv.padding.size(),
                                    h.dev.paddingLongest, stream),
                &a);
  }
  // A capacity plan's rows are sized late: each pair moves at most every token once (sends) or
  // `capacity` rows (receives), which a peer on another node's bridge areas must hold.
  const size_t latePair = h.capacity != 0 ? std::max(h.capacity, h.numTokens) * rowBytes : 0;
  FUSCO_CHECK(runMoeOp(c, "fuscoMoeDispatch", a, *work, false, stream, true, nullptr,
                       std::move(late), nullptr, latePair));
  return markListsUsed(h, stream);
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
  const size_t extent = h.recvRowsBound() * rowOut;
  const char* offered = static_cast<const char*>(expertOut);
  bool mappable = true;
  uint64_t token = 0;
  for (int p = 0; p < n && mappable && extent > 0 && a.status == fuscoSuccess; ++p)
    mappable = p == me || c.offerToken(p, expertOut, extent, &token);
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
  // A capacity plan's sizes are known on the progress thread only: placeholders now, the real
  // streams from the late operation.
  const bool sized = h.capacity == 0;
  if (a.status == fuscoSuccess) deviceCombineStreams(h, sized, offered, rowOut, extent, &work);
  LateSizes late;
  if (a.status == fuscoSuccess && !sized) late = deviceCombineLate(h, offered, rowOut, extent);
  // The ranks' mapped bases are filled in by the progress thread once the peers agreed
  // (engine_async.h); the kernel reads them when the stream reaches it. A plan by the steps keeps
  // its terms where its buffer was carved (known before a capacity plan resolves).
  DevFinalSum f;
  const bool steps = h.bySteps;
  f.termStart = steps ? h.steps.plan.send.termStart : h.dev.termStart;
  f.termRank = steps ? h.steps.plan.send.termRank : h.dev.termRank;
  f.termRow = steps ? h.steps.plan.send.termRow : h.dev.termRow;
  f.termWeight = steps ? h.steps.plan.send.termWeight : h.dev.termWeight;
  f.termLast = steps ? h.steps.plan.send.termLast : h.dev.termLast;
  f.weights = topkWeights;
  f.out = static_cast<char*>(out);
  f.ntokens = h.numTokens;
  auto sum = [f, dt, hidden](const char* const* bases, const uint32_t* basesAligned,
                             void* s) mutable -> fuscoResult_t {
    if (f.ntokens == 0) return fuscoSuccess;
    f.bases = bases;
    f.basesAligned = basesAligned;
    return deviceFinalSum(dt, hidden, f, s);
  };
  FUSCO_CHECK(runMoeOp(c, "fuscoMoeCombine", a, work, false, stream, true, sum, std::move(late)));
  return markListsUsed(h, stream);
}

}  // namespace fusco
