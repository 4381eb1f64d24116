// fuscoMoeDispatch and fuscoMoeCombine on fuscoMemCuda comms: the same plan and the same engine
// operations as on the host, with the plan's index lists on the device and the rows moved by
// kernels (engine_device.h). Dispatch: one pass, source rows straight into the receivers' final
// expert-major rows (replicated per local expert). Combine: one pull operation; each source's
// kernel reads its tokens' rows straight from every rank's expert output (mapped through CUDA
// IPC) and writes the weighted sum in the fixed order of docs/API.md: one pass, no partials, no
// landing area, and the routing weights never leave the source. A rank whose expert output a
// peer cannot map pushes that peer's rows through their channel instead, and the peer's
// operation sums them where they lie in the ring (device/chan_reduce.h), with the same bits.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/datatype.h"
#include "device/chan_reduce.h"
#include "device/device_ops.h"
#include "engine/channels.h"
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

void deviceCombineStreams(const MoeHandle& h, bool sized, const char* expertOut, size_t rowOut,
                          size_t extent, const std::vector<bool>& push,
                          std::vector<PeerWork>* work) {
  for (size_t p = 0; p < work->size(); ++p) {
    PeerWork& w = (*work)[p];
    const size_t rows = sized ? h.sizes.slotsFrom[p] : 0;
    RowStream s = RowStream::indexed(expertOut, rowOut, nullptr, rows);
    if (push[p]) {
      // p's rows in p's slot order: the fan rows p sent in dispatch, one per slot.
      s.rows = sized ? h.dev.recvFanRows[p] : nullptr;
      s.push = true;
    } else {
      s.extent = extent;
    }
    w.sends.assign(1, s);
    w.recvs.assign(1, RowStream::indexed(nullptr, rowOut, nullptr, sized ? h.sizes.slotsTo[p] : 0));
  }
}

LateSizes deviceCombineLate(MoeHandle& h, const char* expertOut, size_t rowOut, size_t extent,
                            const std::vector<bool>& push) {
  MoeHandle* hp = &h;
  return [hp, expertOut, rowOut, extent, push](Op& op) {
    if (planFailed(*hp, "fuscoMoeCombine", op)) return fuscoSuccess;
    // Sized from the plan now: a zero-byte message would leave the peer's base unmapped (null)
    // while the sum kernel reads that peer's rows.
    deviceCombineStreams(*hp, true, expertOut, rowOut, extent, push, &op.peers);
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

namespace {

// The peers that cannot map this rank's expert output (fuscoMemAlloc'd or registered memory is
// mapped by every local peer): its rows go to them through the pair's channel instead, and their
// ring steps sum them where they lie (docs/DESIGN.md, "Combine: pull where offered, push
// otherwise"). A token's rows from one rank must fit the ring's window (chan_reduce.h).
std::vector<bool> combinePushes(const MoeHandle& h, const void* expertOut, size_t rowOut,
                                size_t extent, ArgCheck* a) {
  Communicator& c = *h.comm;
  const int n = c.nranks(), me = c.rank();
  std::vector<bool> push(n, false);
  uint64_t token = 0;
  bool any = false;
  for (int p = 0; p < n && extent > 0; ++p)
    any = (push[p] = p != me && !c.offerToken(p, expertOut, extent, &token)) || any;
  if (any && a->ok() &&
      !chan::reduceWindowFits(c.channels().dims(), static_cast<uint64_t>(h.topk), rowOut))
    a->fail(
        "fuscoMoeCombine: expertOut is not memory every local peer maps (fuscoMemAlloc, "
        "fuscoCommRegister), so its rows go through the pairs' channels, whose slots cannot hold "
        "%d rows of %zu bytes at once; raise FUSCO_CUDA_RING_BYTES or FUSCO_CUDA_RING_SLOTS, or "
        "allocate expertOut with fuscoMemAlloc",
        h.topk, rowOut);
  return push;
}

// The sum the ring step computes when a peer pushes (engine.h's PullSum).
PullSum pullSum(const MoeHandle& h, const DevFinalSum& f, fuscoDataType_t dt, size_t hidden) {
  PullSum s;
  s.terms = f;
  s.termSeq = h.bySteps ? h.steps.plan.send.termSrc : h.dev.termSeq;
  s.hidden = hidden;
  s.dt = dt;
  return s;
}

}  // namespace

fuscoResult_t deviceCombine(MoeHandle& h, const void* expertOut, fuscoDataType_t dt, size_t hidden,
                            const float* topkWeights, void* out, ArgCheck a, void* stream,
                            std::vector<PeerWork>* workOut) {
  Communicator& c = *h.comm;
  const size_t rowOut = hidden * dataTypeSize(dt);
  if (a.status == fuscoSuccess) joinFailure(c.useDevice(), &a);
  if (a.status == fuscoSuccess) joinFailure(h.devBuffer.waitUploaded(stream), &a);
  // Peers read this rank's expert output in place when they can map it (fuscoMemAlloc or
  // registered); the others get its rows pushed through their channel.
  const size_t extent = h.recvRowsBound() * rowOut;
  const char* rows = static_cast<const char*>(expertOut);
  const std::vector<bool> push = combinePushes(h, expertOut, rowOut, extent, &a);
  // One pull operation: the message from p is the (t, k) rows this rank sent p, read by this
  // rank's sum kernel in p's expert output, or pushed by p.
  std::vector<PeerWork>& work = *workOut;
  // A capacity plan's sizes are known on the progress thread only: placeholders now, the real
  // streams from the late operation.
  const bool sized = h.capacity == 0;
  if (a.status == fuscoSuccess) deviceCombineStreams(h, sized, rows, rowOut, extent, push, &work);
  LateSizes late;
  if (a.status == fuscoSuccess && !sized) late = deviceCombineLate(h, rows, rowOut, extent, push);
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
  FUSCO_CHECK(runMoeOp(c, "fuscoMoeCombine", a, work, false, stream, true,
                       PullRead(sum, pullSum(h, f, dt, hidden)), std::move(late)));
  return markListsUsed(h, stream);
}

}  // namespace fusco
