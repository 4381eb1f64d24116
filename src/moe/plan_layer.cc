// fuscoMoePlan by the planner's steps (docs/DESIGN.md, "Planning on the GPU"): on a CUDA comm the
// kernels plan from topkIdx where it lies, and the ranks exchange counts, bases and fan lists
// through device operations; the host reads one summary back (the plan's one synchronization, and
// its only host round). On a host comm the same protocol runs with the steps' host twin
// (FUSCO_PLAN=steps), which is how it is checked by the multi-process suites without a GPU. The
// lists equal the host planner's.
//
//   1. send steps: this rank's lists, and per destination rank its rows (kBadRouting when the
//      routing has a bad slot), slots and slots per local expert (the count message);
//   2. operation: count messages to every rank. It carries every rank's argument checks and the
//      call's agreement: a failure there fails it on every rank, and later operations of the call
//      are skipped;
//   3. layout steps: block sizes, starts and padding, and where each source's rows of each expert
//      begin (the bases);
//   4. operation: bases back to every source;
//   5. fan steps: where each of this rank's slots lands at its destination, and combine's terms;
//   6. the summary read back: sizes, this rank's bad slot, every source's bad routing, and (once
//      the stream passed them) whether the operations above failed;
//   7. operation: each destination gets the source's kStart and fan rows (its receive lists); it
//      carries what the summary refused on one rank only (its receive side's limits).
#include "moe/plan_layer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/log.h"
#include "core/params.h"
#include "device/cuda_rt.h"
#include "moe/moe.h"
#include "moe/moe_exec.h"
#include "moe/plan_lists.h"

namespace fusco {

namespace {

constexpr ParamChoice kPlanChoices[] = {{"auto", 0}, {"host", 1}, {"steps", 2}};

// The layer plan of one call, with where it lives.
class LayerRun {
 public:
  LayerRun(MoeHandle& h, void* stream)
      : h_(h), c_(*h.comm), s_(stream), dev_(c_.memType() == fuscoMemCuda), n_(c_.nranks()) {}
  void prepare(const int64_t* topkIdx, ArgCheck* a);
  fuscoResult_t counts(ArgCheck a);
  fuscoResult_t joinFailedCall(const ArgCheck& a);
  fuscoResult_t basesAndFan();
  fuscoResult_t readSummary(ArgCheck* b);
  fuscoResult_t exchangeFanLists(const ArgCheck& b);
  fuscoResult_t lateFanLists();
  void finish();

 private:
  uint32_t localOf(int r) const { return static_cast<uint32_t>(h_.shape.localExperts[r].size()); }
  void checkCapture(ArgCheck* a);
  fuscoResult_t reserve(size_t bytes);
  fuscoResult_t reserveFanLists(uint64_t rows, uint64_t entries);
  fuscoResult_t reserveCounts();
  void fillTables();
  fuscoResult_t run(fuscoResult_t (*onDevice)(const LayerPlan&, void*),
                    void (*onHost)(const LayerPlan&));
  fuscoResult_t op(const char* name, const ArgCheck& a, const std::vector<PeerWork>& w, bool agreed,
                   LateSizes late = nullptr, std::function<void(bool)> after = nullptr,
                   size_t latePeerBound = 0);
  void badSlotMessage(ArgCheck* b);
  fuscoResult_t callVerdict();

  MoeHandle& h_;
  Communicator& c_;
  size_t fanListsBytes_ = 0;
  void* s_;
  bool dev_;
  int n_;
  const int64_t* topk_ = nullptr;
  LayerPlanDims d_;
  LayerPlan& p_ = h_.steps.plan;     // where the steps run
  LayerPlan& st_ = h_.steps.staged;  // the tables and the summary, on the host
  std::vector<uint64_t> prefixL_;    // [nranks + 1] local experts of ranks before r
};

// A host buffer of `bytes`; out of memory is an error of the call, not an exception.
fuscoResult_t hostBytes(std::vector<char>* v, size_t bytes) {
  try {
    v->resize(bytes);
  } catch (const std::bad_alloc&) {
    return FUSCO_FAIL(fuscoSystemError, kPlan, "out of host memory for a %zu-byte MoE plan", bytes);
  }
  return fuscoSuccess;
}

fuscoResult_t sendOnDevice(const LayerPlan& p, void* s) { return devicePlanSend(p.send, s); }
void sendOnHost(const LayerPlan& p) { hostPlanSend(p.send); }
fuscoResult_t layoutOnDevice(const LayerPlan& p, void* s) { return devicePlanLayout(p.layout, s); }
void layoutOnHost(const LayerPlan& p) { hostPlanLayout(p.layout); }
fuscoResult_t fanOnDevice(const LayerPlan& p, void* s) { return devicePlanFan(p.fan, p.send, s); }
void fanOnHost(const LayerPlan& p) { hostPlanFan(p.fan, p.send); }

fuscoResult_t LayerRun::run(fuscoResult_t (*onDevice)(const LayerPlan&, void*),
                            void (*onHost)(const LayerPlan&)) {
  if (dev_) return onDevice(p_, s_);
  onHost(p_);
  return fuscoSuccess;
}

// A plan with sizes reads them back to the host, which a capture cannot do.
void LayerRun::checkCapture(ArgCheck* a) {
  bool capturing = false;
  joinFailure(cudaStreamCapturing(s_, &capturing), a);
  if (capturing && h_.capacity == 0) {
    a->fail(
        "%s: cannot be captured into a CUDA graph: it reads the plan's sizes back to the host; "
        "plan before the capture and capture dispatch and combine",
        h_.names->call);
    a->status = fuscoInvalidUsage;
  } else if (capturing) {
    a->fail(
        "%s: a capacity plan cannot be captured into a CUDA graph yet; plan before the capture "
        "and capture dispatch and combine",
        h_.names->call);
    a->status = fuscoInvalidUsage;
  }
}

// The layer plan's buffer (a capacity plan also carves its receive lists now).
fuscoResult_t LayerRun::reserve(size_t bytes) {
  if (dev_) {
    // Growing frees both host halves, which an earlier capacity plan may still be resolving from.
    if (h_.capacity != 0 && bytes > h_.devBuffer.capacity()) FUSCO_CHECK(moeQuiesce(h_));
    FUSCO_CHECK(h_.devBuffer.reserve(bytes, c_.timeoutMs()));
    carveLayerPlan(h_.devBuffer.device(), d_, &p_);
    carveLayerPlan(h_.devBuffer.host(), d_, &st_);
  } else {
    FUSCO_CHECK(hostBytes(&h_.steps.hostMem, bytes));
    carveLayerPlan(h_.steps.hostMem.data(), d_, &p_);
    st_ = p_;
  }
  p_.layout.capacity = st_.layout.capacity = h_.capacity;
  FUSCO_CHECK(reserveCounts());
  p_.layout.counts = h_.steps.counts;
  if (h_.capacity != 0) FUSCO_CHECK(reserveFanLists(h_.capacity, h_.capacity));
  return fuscoSuccess;
}

// The receive counts' own allocation, made once per handle (its size depends on the placement
// only), so the device pointers a caller keeps stay valid across replans.
fuscoResult_t LayerRun::reserveCounts() {
  const size_t n = 1 + d_.numLocal;
  if (!dev_) {
    if (h_.steps.hostCounts.size() != n) h_.steps.hostCounts.assign(n, 0);
    h_.steps.counts = h_.steps.hostCounts.data();
  } else if (h_.steps.counts == nullptr) {
    FUSCO_CHECK(h_.steps.countsBuffer.reserve(n * sizeof(int64_t), c_.timeoutMs()));
    h_.steps.counts = reinterpret_cast<int64_t*>(h_.steps.countsBuffer.device());
  }
  return fuscoSuccess;
}

// Room for the receive lists: rows from every source (each with its kStart end) and entries.
fuscoResult_t LayerRun::reserveFanLists(uint64_t rows, uint64_t entries) {
  const size_t startBytes = ((rows + n_) * sizeof(uint32_t) + 15) / 16 * 16;
  const size_t bytes = startBytes + entries * sizeof(int64_t);
  fanListsBytes_ = bytes;  // what a capacity plan's late fan lists can bring at most
  char* base = nullptr;
  if (dev_) {
    FUSCO_CHECK(h_.steps.fanBuffer.reserve(bytes, c_.timeoutMs()));
    base = h_.steps.fanBuffer.device();
  } else if (!h_.steps.hostFan.reserve(bytes)) {
    return FUSCO_FAIL(fuscoSystemError, kPlan,
                      "out of host memory for the receive lists of %llu rows (%zu bytes; a "
                      "capacity plan sizes them for recvCapacity rows)",
                      static_cast<unsigned long long>(rows), bytes);
  }
  if (!dev_) base = h_.steps.hostFan.data();
  h_.steps.fanStart = reinterpret_cast<uint32_t*>(base);
  h_.steps.fanRows = reinterpret_cast<int64_t*>(base + startBytes);
  return fuscoSuccess;
}

// Every rank's checks, the capture refusal, then the buffers and the tables.
void LayerRun::prepare(const int64_t* topkIdx, ArgCheck* a) {
  if (dev_ && a->ok()) checkCapture(a);
  if (a->ok() && validateTopkLimits(topkIdx, h_.numTokens, h_.topk) != fuscoSuccess)
    a->fail("%s", threadLastError().c_str());
  // The steps number (token, slot) pairs in 32 bits.
  if (a->ok() && h_.numTokens * static_cast<uint64_t>(h_.topk) > UINT32_MAX)
    a->fail(
        "MoE routing: %zu tokens x top-%d, more than the supported 2^32 - 1 (token, slot) "
        "pairs per rank",
        h_.numTokens, h_.topk);
  if (a->ok() && dev_) joinFailure(c_.useDevice(), a);
  if (!a->ok()) return;
  topk_ = topkIdx;
  d_.numTokens = h_.numTokens;
  d_.topk = static_cast<uint32_t>(h_.topk);
  d_.nranks = static_cast<uint32_t>(n_);
  d_.numExperts = static_cast<uint32_t>(h_.shape.numExperts);
  d_.numLocal = localOf(c_.rank());
  joinFailure(reserve(carveLayerPlan(nullptr, d_, &p_)), a);
  if (!a->ok()) return;
  fillTables();
  if (dev_) joinFailure(h_.devBuffer.upload(p_.tablesBytes, s_), a);
}

// Placement tables and where each expert's count and base go in the messages.
void LayerRun::fillTables() {
  const MoeShape& sh = h_.shape;
  prefixL_.assign(n_ + 1, 0);
  for (int r = 0; r < n_; ++r) {
    prefixL_[r + 1] = prefixL_[r] + localOf(r);
    st_.msgOff[r] = static_cast<uint32_t>(prefixL_[r] + 2 * r);
  }
  for (int e = 0; e < sh.numExperts; ++e) {
    const int r = sh.expertToRank[e];
    st_.rankOf[e] = r;
    st_.localOf[e] = sh.localIndexOf[e];
    st_.msgPos[e] = st_.msgOff[r] + 2 + static_cast<uint32_t>(sh.localIndexOf[e]);
    st_.basePos[e] = static_cast<uint32_t>(prefixL_[r] + sh.localIndexOf[e]);
  }
  for (LayerPlan* p : {&p_, &st_}) {
    p->send.topkIdx = topk_;
    p->send.perRank = h_.dedup != Dedup::None;
    p->layout.align = static_cast<uint32_t>(sh.expertAlignment);
  }
}

fuscoResult_t LayerRun::op(const char* name, const ArgCheck& a, const std::vector<PeerWork>& w,
                           bool agreed, LateSizes late, std::function<void(bool)> after,
                           size_t latePeerBound) {
  // A host twin of the CUDA path runs the operations as the CUDA path does (enqueued, resolved by
  // the progress thread, late sizes included).
  return runMoeOp(c_, name, a, w, agreed, s_, dev_ || c_.hostTwin(), nullptr, std::move(late),
                  std::move(after), latePeerBound);
}

// Steps 1-2: the send side and the count messages. The operation carries this rank's checks (a)
// and the call's agreement, and is the call's verdict on every rank: a rank whose checks failed
// still joins it, with no data.
fuscoResult_t LayerRun::counts(ArgCheck a) {
  const uint32_t mine = d_.numLocal;
  if (a.ok()) joinFailure(run(sendOnDevice, sendOnHost), &a);
  std::vector<PeerWork> w(n_);
  for (int r = 0; r < n_ && a.ok(); ++r) {
    w[r].sends.push_back(
        RowStream::flat(p_.send.countsMsg + st_.msgOff[r], (localOf(r) + 2) * sizeof(uint32_t)));
    w[r].recvs.push_back(
        RowStream::flat(p_.layout.countsIn + r * (mine + 2ull), (mine + 2) * sizeof(uint32_t)));
  }
  return op(h_.names->counts, a, w, false);
}

// A rank whose own checks failed still joins, with no data, every operation its peers enqueue
// before the call's verdict reaches them (counts, bases and a capacity plan's fan lists): on a
// CUDA comm a peer's plan only enqueues those, so skipping one would pair the peer's next
// operation with this rank's next call. Returns the checks' failure.
fuscoResult_t LayerRun::joinFailedCall(const ArgCheck& a) {
  const fuscoResult_t r = counts(a);
  if (!dev_) return r;  // a host comm's counts end in the call (drained): every rank returned
  const std::string why = threadLastError();
  const std::vector<PeerWork> none(n_);
  (void)op(h_.names->bases, a, none, true);
  MoeHandle* h = &h_;  // the stats as lateFanLists leaves them
  if (h_.capacity != 0)
    (void)op(h_.names->fanLists, a, none, false, nullptr, [h](bool) { resetStats(*h); });
  setThreadLastError(why);
  return r;
}

// Steps 3-5: the layout, the bases back to the sources, their fan rows and combine's terms.
fuscoResult_t LayerRun::basesAndFan() {
  const uint32_t mine = d_.numLocal;
  FUSCO_CHECK(run(layoutOnDevice, layoutOnHost));
  std::vector<PeerWork> w(n_);
  for (int r = 0; r < n_; ++r) {
    w[r].sends.push_back(
        RowStream::flat(p_.layout.basesOut + r * uint64_t{mine}, mine * sizeof(int64_t)));
    w[r].recvs.push_back(RowStream::flat(p_.basesIn + prefixL_[r], localOf(r) * sizeof(int64_t)));
  }
  FUSCO_CHECK(op(h_.names->bases, ArgCheck(), w, true));
  return run(fanOnDevice, fanOnHost);
}

// Step 6: the one read back (on a CUDA comm it waits for everything enqueued so far), then what
// it says about this rank's routing and the counts that arrived. Returns the call's failure when
// an operation of it failed on every rank (the summary then means nothing).
fuscoResult_t LayerRun::readSummary(ArgCheck* b) {
  ++h_.steps.rounds.readBacks;
  if (dev_) {
    const char* from = h_.devBuffer.device() + p_.summaryOffset;
    FUSCO_CHECK(
        cudaCopyToHostSync(h_.devBuffer.host() + p_.summaryOffset, from, p_.summaryBytes, s_));
  }
  FUSCO_CHECK(callVerdict());
  if (*st_.send.badSlot != gplan::kNoBadSlot) {
    badSlotMessage(b);
    return fuscoSuccess;
  }
  int badSource = -1;
  checkSummary(h_, h_.stepsView(), b, &badSource);
  if (badSource >= 0) {
    // Every rank read it: each fails now, and no rank waits for another's verdict.
    *b = ArgCheck();
    b->fail(
        "MoE routing: rank %d's topkIdx holds an expert id outside [-1, %d) or repeated within a "
        "token (its own call names the token and slot)",
        badSource, h_.shape.numExperts);
    b->status = fuscoRemoteError;
  }
  return fuscoSuccess;
}

// An enqueued operation of this call that failed validation on every rank (another rank's
// arguments, or the ranks' disagreement) was resolved before the stream passed it: its error is
// the call's, taken here so that fuscoCommGetAsyncError does not report it a second time. (A host
// comm's operations returned it already.)
fuscoResult_t LayerRun::callVerdict() {
  if (c_.asyncFailedCall() != c_.callSerial()) return fuscoSuccess;
  std::string why;
  fuscoResult_t engine = fuscoInvalidArgument;
  const fuscoResult_t r = c_.takeAsyncError(&why, &engine);
  if (r == fuscoSuccess) engine = fuscoInvalidArgument;
  c_.noteAgreedFailure();  // every rank's operations of this call were skipped alike
  return FUSCO_FAIL(engine, kPlan, "%s", why.empty() ? "another rank's arguments" : why.c_str());
}

// The host check's message for the first bad slot (one token's ids read back).
void LayerRun::badSlotMessage(ArgCheck* b) {
  const size_t t = static_cast<size_t>(*st_.send.badSlot / d_.topk);
  std::vector<int64_t> row(d_.topk);
  if (dev_) {
    joinFailure(cudaCopyToHostSync(row.data(), topk_ + t * d_.topk, d_.topk * sizeof(int64_t), s_),
                b);
    if (!b->ok()) return;
  } else {
    memcpy(row.data(), topk_ + t * d_.topk, d_.topk * sizeof(int64_t));
  }
  if (validateTopk(h_.shape, row.data(), 1, h_.topk, t) != fuscoSuccess) {
    b->fail("%s", threadLastError().c_str());
  } else {
    b->fail("MoE routing: token %zu has an invalid expert id", t);
  }
}

// Step 7 of a plan with sizes: the receive lists, sized now. The operation carries the summary's
// verdict on this rank's routing (b), so that no host round is needed for it: a refusal every
// rank read from the summary (a source's bad routing) fails the call on every rank now; one that
// only this rank found fails it here and on its peers when the operation is resolved.
fuscoResult_t LayerRun::exchangeFanLists(const ArgCheck& b) {
  ArgCheck room = b;
  uint64_t rows = 0, entries = 0;
  for (int s = 0; s < n_ && room.ok(); ++s)
    rows += h_.sizes.rowsFrom[s], entries += h_.sizes.slotsFrom[s];
  // A rank that cannot hold its lists still joins, so its peers fail at once with its reason.
  if (room.ok()) joinFailure(reserveFanLists(rows, entries), &room);
  std::vector<PeerWork> w(n_);
  if (room.ok()) fanListsWork(h_, h_.stepsView(), &w);
  FUSCO_CHECK(op(h_.names->fanLists, room, w, false));
  // Dispatch and combine on other streams wait for everything above.
  return dev_ ? h_.devBuffer.upload(0, s_) : fuscoSuccess;
}

// The progress thread's wait for a capacity plan's summary (copied back by its stream), bounded
// by the comm's timeout and its peers' liveness.
// It runs on the progress thread, so like every wait there it keeps the transports (and a network
// bridge's posts, exec/net_bridge.h, which the earlier operations need) moving on every poll.
fuscoResult_t waitSummary(MoeHandle& h, int half) {
  Communicator& c = *h.comm;
  int64_t lastLive = nowNs();
  auto alive = [&c, &lastLive]() -> fuscoResult_t {
    c.progressTransports();
    if (c.brokenResult() != fuscoSuccess)
      return FUSCO_FAIL(c.brokenResult(), kPlan, "a capacity plan's summary: %s",
                        c.brokenMessage().c_str());
    if (nowNs() - lastLive < paramLivenessMs() * 1000000LL) return fuscoSuccess;
    lastLive = nowNs();
    for (int p = 0; p < c.nranks(); ++p)
      if (p != c.rank()) FUSCO_CHECK(c.checkPeer(p));
    return fuscoSuccess;
  };
  return h.steps.summaryReady[half].waitWithin(c.timeoutMs(), "a capacity plan's stream work",
                                               alive, 0);
}

// A capacity plan's last operation, once its summary is on the host (on the progress thread for
// an enqueued operation): the routing's and the capacity's verdict, the sizes and the lists. It
// reads the plan from `v`, its own copy: a replan may have carved the next one into the other
// half meanwhile.
fuscoResult_t resolveFanLists(MoeHandle& h, const PlanView& v, int half, Op& op) {
  FUSCO_CHECK(waitSummary(h, half));
  ArgCheck b;
  const gplan::SendArgs& st = v.staged.send;
  if (*st.badSlot != gplan::kNoBadSlot) {
    b.fail(
        "MoE routing: token %llu slot %llu: an expert id outside [-1, %d) or repeated within "
        "the token",
        *st.badSlot / st.topk, *st.badSlot % st.topk, h.shape.numExperts);
  } else {
    int badSource = -1;  // its own operation carries its verdict to every rank
    checkSummary(h, v, &b, &badSource);
  }
  op.argStatus = b.status;
  op.argError = b.message;
  if (!b.ok()) return fuscoSuccess;
  fanListsWork(h, v, &op.peers);
  // A CUDA comm's lists are pointers, known now; a host comm copies its lists out once they
  // arrived (LayerRun::finish).
  if (h.comm->memType() == fuscoMemCuda) finishLists(h, v);
  return fuscoSuccess;
}

// Step 8 of a capacity plan: enqueued now, sized by resolveFanLists.
fuscoResult_t LayerRun::lateFanLists() {
  const int half = dev_ ? h_.devBuffer.half() : 0;
  if (dev_)
    FUSCO_CHECK(cudaCopyAsync(h_.devBuffer.host() + p_.summaryOffset,
                              h_.devBuffer.device() + p_.summaryOffset, p_.summaryBytes, s_));
  if (dev_) FUSCO_CHECK(h_.steps.summaryReady[half].record(s_));
  std::vector<PeerWork> w(n_);
  for (PeerWork& pw : w) {
    pw.sends.resize(2);
    pw.recvs.resize(2);
  }
  // planState and the stats change on the progress thread only, in call order: an earlier
  // dispatch still resolving sees the plan it was called with, and notes its traffic before the
  // stats are a new plan's.
  // (A host comm's dispatch notes its traffic in the call, and its replan resets the stats.)
  MoeHandle* h = &h_;
  const PlanView v = h_.stepsView();
  const bool dev = dev_;
  FUSCO_CHECK(op(
      h_.names->fanLists, ArgCheck(), w, false,
      [h, v, half](Op& o) { return resolveFanLists(*h, v, half, o); },
      [h, dev](bool ok) {
        h->planState = ok ? MoeHandle::kPlanReady : MoeHandle::kPlanFailed;
        if (dev) resetStats(*h);
      },
      fanListsBytes_));
  return dev_ ? h_.devBuffer.upload(0, s_) : fuscoSuccess;
}

void LayerRun::finish() {
  if (h_.capacity == 0 || !dev_) finishLists(h_, h_.stepsView());
  if (!dev_) keepRouting(topk_, &h_);
  if (paramPlanTrace() != 0 && (h_.capacity == 0 || !dev_)) traceSizes(h_);
}

}  // namespace

fuscoResult_t planMoeSteps(const int64_t* topkIdx, void* stream, ArgCheck a, MoeHandle* h) {
  Communicator& c = *h->comm;
  const uint64_t hostRounds = c.hostRounds();
  h->steps.rounds = MoeHandle::PlanRounds{};
  LayerRun run(*h, stream);
  run.prepare(topkIdx, &a);
  if (!a.ok()) return run.joinFailedCall(a);
  c.agreeInCall(planAgreement(*h));
  FUSCO_CHECK(run.counts(a));
  FUSCO_CHECK(run.basesAndFan());
  if (h->capacity != 0) {
    // No read back: the routing's verdict rides on the last operation, which the progress thread
    // sizes once the summary is back (docs/DESIGN.md).
    FUSCO_CHECK(run.lateFanLists());
  } else {
    ArgCheck b;
    FUSCO_CHECK(run.readSummary(&b));
    FUSCO_CHECK(run.exchangeFanLists(b));
    h->planState = MoeHandle::kPlanReady;
  }
  run.finish();
  h->steps.rounds.hostRounds = c.hostRounds() - hostRounds;
  h->planned = true;
  return fuscoSuccess;
}

int64_t paramPlanWhere();
FUSCO_PARAM_CHOICE(PlanWhere, int64_t, "FUSCO_PLAN", "auto", kPlanChoices,
                   "where fuscoMoePlan plans: auto (on the GPU for CUDA comms on one node, else "
                   "the host planner), host, or steps (the GPU planner's steps wherever the "
                   "dedup mode allows; on host comms their host twin)");

bool planBySteps(const Communicator& c, Dedup dedup) {
  if (dedup == Dedup::Node) return false;
  const int64_t where = paramPlanWhere();
  if (where != 0) return where == 2;
  return c.memType() == fuscoMemCuda;
}

}  // namespace fusco
