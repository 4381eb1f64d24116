// fuscoMoePlan by the planner's steps (docs/DESIGN.md, "Planning on the GPU"): on a CUDA comm the
// kernels plan from topkIdx where it lies, and the ranks exchange counts, bases and fan lists
// through device operations; the host reads one summary back (the plan's one synchronization).
// On a host comm the same protocol runs with the steps' host twin (FUSCO_PLAN=steps), which is how
// it is checked by the multi-process suites without a GPU. The lists equal the host planner's.
//
//   1. a host round: every rank's argument checks and the call's agreement;
//   2. send steps: this rank's lists, and per destination rank its rows, slots and slots per local
//      expert (the count message);
//   3. operation: count messages to every rank;
//   4. layout steps: block sizes, starts and padding, and where each source's rows of each expert
//      begin (the bases);
//   5. operation: bases back to every source;
//   6. fan steps: where each of this rank's slots lands at its destination, and combine's terms;
//   7. the summary read back (sizes, a bad slot), then a host round: the routing's verdict;
//   8. operation: each destination gets the source's kStart and fan rows (its receive lists).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/params.h"
#include "device/cuda_rt.h"
#include "moe/moe.h"
#include "moe/moe_exec.h"
#include "moe/plan_layer.h"

namespace fusco {

namespace {

constexpr ParamChoice kPlanChoices[] = {{"auto", 0}, {"host", 1}, {"steps", 2}};

// The layer plan of one call, with where it lives.
class LayerRun {
 public:
  LayerRun(MoeHandle& h, void* stream)
      : h_(h), c_(*h.comm), s_(stream), dev_(c_.memType() == fuscoMemCuda), n_(c_.nranks()) {}
  void prepare(const fuscoMoeConfig_t* config, const int64_t* topkIdx, ArgCheck* a);
  fuscoResult_t countsAndBases();
  void readSummary(ArgCheck* b);
  fuscoResult_t exchangeFanLists();
  void finish();

 private:
  uint32_t localOf(int r) const { return static_cast<uint32_t>(h_.shape.localExperts[r].size()); }
  void fillTables();
  fuscoResult_t run(fuscoResult_t (*onDevice)(const LayerPlan&, void*),
                    void (*onHost)(const LayerPlan&));
  fuscoResult_t op(const char* name, const std::vector<PeerWork>& w, bool agreed);
  void badSlotMessage(ArgCheck* b);
  void checkCounts(ArgCheck* b);
  void deviceLists();
  void hostLists();

  MoeHandle& h_;
  Communicator& c_;
  void* s_;
  bool dev_;
  int n_;
  const int64_t* topk_ = nullptr;
  LayerPlanDims d_;
  LayerPlan& p_ = h_.steps.plan;      // where the steps run
  LayerPlan& st_ = h_.steps.staged;   // the tables and the summary, on the host
  std::vector<uint64_t> prefixL_;     // [nranks + 1] local experts of ranks before r
};

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

// Every rank's checks, the capture refusal, then the buffers and the tables.
void LayerRun::prepare(const fuscoMoeConfig_t* config, const int64_t* topkIdx, ArgCheck* a) {
  if (dev_ && a->ok()) {
    bool capturing = false;
    joinFailure(cudaStreamCapturing(s_, &capturing), a);
    if (capturing) {
      a->fail(
          "fuscoMoePlan: cannot be captured into a CUDA graph: it reads the plan's sizes back to "
          "the host; plan before the capture and capture dispatch and combine");
      a->status = fuscoInvalidUsage;
    }
  }
  if (a->ok() && h_.topk <= 0) a->fail("fuscoMoePlan: topk %d must be > 0", h_.topk);
  if (a->ok() && h_.topk > 255) a->fail("MoE routing: topk %d outside [1, 255]", h_.topk);
  if (a->ok() && h_.numTokens > static_cast<size_t>(INT32_MAX))
    a->fail("MoE routing: %zu tokens, more than the supported 2^31 - 1 per rank", h_.numTokens);
  if (a->ok() && buildMoeShape(n_, config->numExperts, config->expertToRank,
                               config->expertAlignment, &h_.shape) != fuscoSuccess)
    a->fail("%s", threadLastError().c_str());
  if (a->ok() && dev_) joinFailure(c_.useDevice(), a);
  if (!a->ok()) return;
  topk_ = topkIdx;
  d_.numTokens = h_.numTokens;
  d_.topk = static_cast<uint32_t>(h_.topk);
  d_.nranks = static_cast<uint32_t>(n_);
  d_.numExperts = static_cast<uint32_t>(h_.shape.numExperts);
  d_.numLocal = localOf(c_.rank());
  const size_t bytes = carveLayerPlan(nullptr, d_, &p_);
  if (dev_) {
    joinFailure(h_.devBuffer.reserve(bytes), a);
    if (!a->ok()) return;
    carveLayerPlan(h_.devBuffer.device(), d_, &p_);
    carveLayerPlan(h_.devBuffer.host(), d_, &st_);
  } else {
    h_.steps.hostMem.resize(bytes);
    carveLayerPlan(h_.steps.hostMem.data(), d_, &p_);
    st_ = p_;
  }
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

fuscoResult_t LayerRun::op(const char* name, const std::vector<PeerWork>& w, bool agreed) {
  return runMoeOp(c_, name, ArgCheck(), w, agreed, s_, dev_);
}

// Steps 2-6: everything but the summary and the receive lists.
fuscoResult_t LayerRun::countsAndBases() {
  const uint32_t mine = d_.numLocal;
  FUSCO_CHECK(run(sendOnDevice, sendOnHost));
  std::vector<PeerWork> w(n_);
  for (int r = 0; r < n_; ++r) {
    w[r].sends.push_back(
        RowStream::flat(p_.send.countsMsg + st_.msgOff[r], (localOf(r) + 2) * sizeof(uint32_t)));
    w[r].recvs.push_back(
        RowStream::flat(p_.layout.countsIn + r * (mine + 2ull), (mine + 2) * sizeof(uint32_t)));
  }
  FUSCO_CHECK(op("fuscoMoePlan (counts)", w, true));
  FUSCO_CHECK(run(layoutOnDevice, layoutOnHost));
  for (int r = 0; r < n_; ++r) {
    w[r].sends.assign(1, RowStream::flat(p_.layout.basesOut + r * uint64_t{mine},
                                         mine * sizeof(int64_t)));
    w[r].recvs.assign(
        1, RowStream::flat(p_.basesIn + prefixL_[r], localOf(r) * sizeof(int64_t)));
  }
  FUSCO_CHECK(op("fuscoMoePlan (bases)", w, true));
  return run(fanOnDevice, fanOnHost);
}

// Step 7: the one read back (on a CUDA comm it waits for everything enqueued so far), then what
// it says about this rank's routing and the counts that arrived.
void LayerRun::readSummary(ArgCheck* b) {
  if (dev_) {
    const char* from = h_.devBuffer.device() + p_.summaryOffset;
    joinFailure(cudaCopyToHostSync(h_.devBuffer.host() + p_.summaryOffset, from, p_.summaryBytes,
                                   s_),
                b);
    if (!b->ok()) return;
  }
  if (*st_.send.badSlot != gplan::kNoBadSlot) return badSlotMessage(b);
  checkCounts(b);
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

// Sizes from the count messages; a message whose counts do not add up is malformed.
void LayerRun::checkCounts(ArgCheck* b) {
  MoeHandle::Sizes& z = h_.sizes;
  const uint32_t mine = d_.numLocal;
  z.rowsTo.assign(n_, 0), z.slotsTo.assign(n_, 0), z.rowsFrom.assign(n_, 0);
  z.slotsFrom.assign(n_, 0);
  uint64_t slots = 0;
  for (int r = 0; r < n_; ++r) {
    z.rowsTo[r] = st_.send.rowOff[r + 1] - st_.send.rowOff[r];
    z.slotsTo[r] = st_.send.slotOff[r + 1] - st_.send.slotOff[r];
    const uint32_t* m = st_.layout.countsIn + r * (mine + 2ull);
    uint64_t sum = 0;
    for (uint32_t e = 0; e < mine; ++e) sum += m[2 + e];
    if (sum != m[1] || m[0] > m[1] || (h_.dedup == Dedup::None && m[0] != m[1])) {
      b->fail("rank %d: malformed MoE counts from rank %d: %u rows, %u slots, %llu by expert",
              c_.rank(), r, m[0], m[1], static_cast<unsigned long long>(sum));
      b->status = fuscoRemoteError;
      return;
    }
    z.rowsFrom[r] = m[0], z.slotsFrom[r] = m[1];
    slots += m[1];
  }
  if (slots > UINT32_MAX)
    b->fail("rank %d: %llu (row, expert) pairs to receive, more than the supported 2^32 - 1",
            c_.rank(), static_cast<unsigned long long>(slots));
}

// Step 8: each source's kStart and fan rows for this rank, into its receive lists.
fuscoResult_t LayerRun::exchangeFanLists() {
  const MoeHandle::Sizes& z = h_.sizes;
  std::vector<uint32_t>& ro = h_.steps.rowOffFrom;
  std::vector<uint32_t>& eo = h_.steps.entryOff;
  ro.assign(n_ + 1, 0), eo.assign(n_ + 1, 0);
  for (int s = 0; s < n_; ++s) {
    ro[s + 1] = ro[s] + static_cast<uint32_t>(z.rowsFrom[s] + 1);
    eo[s + 1] = eo[s] + static_cast<uint32_t>(z.slotsFrom[s]);
  }
  const size_t startBytes = (ro[n_] * sizeof(uint32_t) + 15) / 16 * 16;
  const size_t bytes = startBytes + eo[n_] * sizeof(int64_t);
  char* base = nullptr;
  if (dev_) {
    FUSCO_CHECK(h_.steps.fanBuffer.reserve(bytes));
    base = h_.steps.fanBuffer.device();
  } else {
    h_.steps.hostFan.resize(bytes);
    base = h_.steps.hostFan.data();
  }
  h_.steps.fanStart = reinterpret_cast<uint32_t*>(base);
  h_.steps.fanRows = reinterpret_cast<int64_t*>(base + startBytes);
  std::vector<PeerWork> w(n_);
  for (int r = 0; r < n_; ++r) {
    const uint32_t rOff = st_.send.rowOff[r], sOff = st_.send.slotOff[r];
    w[r].sends.push_back(
        RowStream::flat(p_.send.kStart + rOff + r, (z.rowsTo[r] + 1) * sizeof(uint32_t)));
    w[r].sends.push_back(RowStream::flat(p_.fan.remoteFan + sOff, z.slotsTo[r] * sizeof(int64_t)));
    w[r].recvs.push_back(
        RowStream::flat(h_.steps.fanStart + ro[r], (z.rowsFrom[r] + 1) * sizeof(uint32_t)));
    w[r].recvs.push_back(
        RowStream::flat(h_.steps.fanRows + eo[r], z.slotsFrom[r] * sizeof(int64_t)));
  }
  FUSCO_CHECK(op("fuscoMoePlan (fan lists)", w, false));
  // Dispatch and combine on other streams wait for everything above.
  return dev_ ? h_.devBuffer.upload(0, s_) : fuscoSuccess;
}

// The receive counts on the host, then the lists where the comm's paths read them.
void LayerRun::finish() {
  MoeRecvPlan& rp = h_.recv;
  const uint32_t mine = d_.numLocal;
  rp.numRecvRows = st_.layout.totals[0];
  rp.tokensPerLocalExpert.assign(st_.layout.tokensPerLocal, st_.layout.tokensPerLocal + mine);
  rp.blockStart.assign(st_.layout.blockStart, st_.layout.blockStart + mine);
  rp.padding.resize(st_.layout.totals[1]);
  for (size_t i = 0; i < rp.padding.size(); ++i)
    rp.padding[i] = RowRange{st_.layout.padding[2 * i], st_.layout.padding[2 * i + 1]};
  if (dev_) {
    deviceLists();
  } else {
    hostLists();
  }
}

// CUDA comms: the device paths' pointers into the layer plan.
void LayerRun::deviceLists() {
  MoeHandle::DevicePlan& dv = h_.dev;
  const gplan::SendArgs& s = p_.send;
  dv.sendRows.resize(n_), dv.remoteFanRows.resize(n_), dv.recvFanRows.resize(n_);
  dv.sendKStart.resize(n_), dv.recvFanStart.resize(n_);
  for (int p = 0; p < n_; ++p) {
    const uint32_t rOff = st_.send.rowOff[p], sOff = st_.send.slotOff[p];
    dv.sendRows[p] = s.rows + rOff;
    dv.remoteFanRows[p] = p_.fan.remoteFan + sOff;
    dv.sendKStart[p] = s.kStart + rOff + p;
    dv.recvFanStart[p] = h_.steps.fanStart + h_.steps.rowOffFrom[p];
    dv.recvFanRows[p] = h_.steps.fanRows + h_.steps.entryOff[p];
  }
  dv.paddingRanges = p_.layout.padding;
  dv.paddingLongest = 0;
  for (const RowRange& r : h_.recv.padding) dv.paddingLongest = std::max(dv.paddingLongest, r.count);
  dv.termStart = s.termStart;
  dv.termRank = s.termRank;
  dv.termRow = s.termRow;
  dv.termWeight = s.termWeight;
  dv.termLast = s.termLast;
}

template <typename T>
void takeList(const T* from, size_t n, std::vector<T>* to) {
  to->assign(from, from + n);
}

// Host comms: the host paths' lists, copied out of the layer plan.
void LayerRun::hostLists() {
  const gplan::SendArgs& s = p_.send;
  const MoeHandle::Sizes& z = h_.sizes;
  MoeSendPlan& sp = h_.send;
  sp.numTokens = h_.numTokens, sp.topk = h_.topk;
  for (auto* v : {&sp.rows, &h_.remoteFanRows, &h_.weightIdx}) v->resize(n_);
  sp.meta.resize(n_), sp.kStart.resize(n_), sp.kSlots.resize(n_);
  h_.recv.fanStart.resize(n_), h_.recv.fanRows.resize(n_);
  for (int r = 0; r < n_; ++r) {
    const uint32_t rOff = s.rowOff[r], sOff = s.slotOff[r];
    takeList(s.rows + rOff, z.rowsTo[r], &sp.rows[r]);
    takeList(s.meta + rOff + sOff, z.rowsTo[r] + z.slotsTo[r], &sp.meta[r]);
    takeList(s.kStart + rOff + r, z.rowsTo[r] + 1, &sp.kStart[r]);
    takeList(s.kSlots + sOff, z.slotsTo[r], &sp.kSlots[r]);
    takeList(p_.fan.remoteFan + sOff, z.slotsTo[r], &h_.remoteFanRows[r]);
    takeList(s.weightIdx + sOff, z.slotsTo[r], &h_.weightIdx[r]);
    takeList(h_.steps.fanStart + h_.steps.rowOffFrom[r], z.rowsFrom[r] + 1, &h_.recv.fanStart[r]);
    takeList(h_.steps.fanRows + h_.steps.entryOff[r], z.slotsFrom[r], &h_.recv.fanRows[r]);
  }
  takeList(topk_, h_.numTokens * h_.topk, &h_.topkIdx);
}

// FUSCO_PLAN_TRACE's line for a plan made by the steps.
void traceSizes(const MoeHandle& h) {
  std::string to;
  for (size_t r = 0; r < h.sizes.rowsTo.size(); ++r)
    to += (r ? "," : "") + std::to_string(h.sizes.rowsTo[r]);
  FUSCO_LOG_ALWAYS(LogLevel::Info, kPlan,
                   "plan rank %d by the GPU planner's steps (%s): dedup %s, rows to peers [%s], "
                   "recv %zu rows (%zu padding ranges)",
                   h.comm->rank(), h.comm->memType() == fuscoMemCuda ? "kernels" : "host twin",
                   dedupName(h.dedup), to.c_str(), h.recv.numRecvRows, h.recv.padding.size());
}

// A round of no data whose outcome is every rank's verdict on `a`.
fuscoResult_t verdict(Communicator& c, const char* name, const ArgCheck& a) {
  std::vector<RowStream> none(c.nranks());
  return exchange(c, name, a, none, none);
}

}  // namespace

fuscoResult_t planMoeSteps(const fuscoMoeConfig_t* config, const int64_t* topkIdx, void* stream,
                           ArgCheck a, MoeHandle* h) {
  Communicator& c = *h->comm;
  LayerRun run(*h, stream);
  run.prepare(config, topkIdx, &a);
  if (a.ok()) c.agreeInCall(planAgreement(*h));
  FUSCO_CHECK(verdict(c, "fuscoMoePlan (checks)", a));
  FUSCO_CHECK(run.countsAndBases());
  ArgCheck b;
  run.readSummary(&b);
  FUSCO_CHECK(verdict(c, "fuscoMoePlan (routing)", b));
  FUSCO_CHECK(run.exchangeFanLists());
  run.finish();
  if (paramPlanTrace() != 0) traceSizes(*h);
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
