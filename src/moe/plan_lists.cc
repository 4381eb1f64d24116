// The last part of a plan by the steps (plan_lists.h): what the summary says, the receive lists'
// exchange, and the lists where dispatch and combine read them. These read only the handle, so
// a capacity plan runs them on the progress thread once its summary is on the host.
#include "moe/plan_lists.h"

#include <algorithm>
#include <mutex>
#include <string>

#include "core/log.h"
#include "exec/progress.h"
#include "moe/moe.h"
#include "moe/moe_op.h"

namespace fusco {

namespace {

uint32_t numLocal(const MoeHandle& h) {
  return static_cast<uint32_t>(h.shape.localExperts[h.comm->rank()].size());
}

// CUDA comms: the device paths' pointers into the layer plan.
void deviceLists(MoeHandle& h, const PlanView& v) {
  const int n = h.comm->nranks();
  MoeHandle::DevicePlan& dv = h.dev;
  const LayerPlan& p = v.plan;
  const LayerPlan& st = v.staged;
  dv.sendRows.resize(n), dv.remoteFanRows.resize(n), dv.recvFanRows.resize(n);
  dv.sendKStart.resize(n), dv.recvFanStart.resize(n);
  for (int q = 0; q < n; ++q) {
    const uint32_t rOff = st.send.rowOff[q], sOff = st.send.slotOff[q];
    dv.sendRows[q] = p.send.rows + rOff;
    dv.remoteFanRows[q] = p.fan.remoteFan + sOff;
    dv.sendKStart[q] = p.send.kStart + rOff + q;
    dv.recvFanStart[q] = v.fanStart + h.steps.rowOffFrom[q];
    dv.recvFanRows[q] = v.fanRows + h.steps.entryOff[q];
  }
  dv.paddingRanges = p.layout.padding;
  dv.paddingLongest = 0;
  for (const RowRange& r : h.recv.padding) dv.paddingLongest = std::max(dv.paddingLongest, r.count);
  dv.termStart = p.send.termStart;
  dv.termRank = p.send.termRank;
  dv.termRow = p.send.termRow;
  dv.termWeight = p.send.termWeight;
  dv.termLast = p.send.termLast;
}

template <typename T>
void takeList(const T* from, size_t count, std::vector<T>* to) {
  to->assign(from, from + count);
}

// Host comms: the host paths' lists, copied out of the layer plan.
void hostLists(MoeHandle& h, const PlanView& v) {
  const int n = h.comm->nranks();
  const gplan::SendArgs& s = v.plan.send;
  const MoeHandle::Sizes& z = h.sizes;
  MoeSendPlan& sp = h.send;
  sp.numTokens = h.numTokens, sp.topk = h.topk;
  for (auto* v : {&sp.rows, &h.remoteFanRows, &h.weightIdx}) v->resize(n);
  sp.meta.resize(n), sp.kStart.resize(n), sp.kSlots.resize(n);
  h.recv.fanStart.resize(n), h.recv.fanRows.resize(n);
  for (int r = 0; r < n; ++r) {
    const uint32_t rOff = s.rowOff[r], sOff = s.slotOff[r];
    takeList(s.rows + rOff, z.rowsTo[r], &sp.rows[r]);
    takeList(s.meta + rOff + sOff, z.rowsTo[r] + z.slotsTo[r], &sp.meta[r]);
    takeList(s.kStart + rOff + r, z.rowsTo[r] + 1, &sp.kStart[r]);
    takeList(s.kSlots + sOff, z.slotsTo[r], &sp.kSlots[r]);
    takeList(v.plan.fan.remoteFan + sOff, z.slotsTo[r], &h.remoteFanRows[r]);
    takeList(s.weightIdx + sOff, z.slotsTo[r], &h.weightIdx[r]);
    takeList(v.fanStart + h.steps.rowOffFrom[r], z.rowsFrom[r] + 1, &h.recv.fanStart[r]);
    takeList(v.fanRows + h.steps.entryOff[r], z.slotsFrom[r], &h.recv.fanRows[r]);
  }
}

}  // namespace

void checkSummary(MoeHandle& h, const PlanView& v, ArgCheck* b, int* badSource) {
  const int n = h.comm->nranks();
  const LayerPlan& st = v.staged;
  MoeHandle::Sizes& z = h.sizes;
  const uint32_t mine = numLocal(h);
  z.rowsTo.assign(n, 0), z.slotsTo.assign(n, 0), z.rowsFrom.assign(n, 0), z.slotsFrom.assign(n, 0);
  *badSource = -1;
  uint64_t slots = 0;
  for (int r = 0; r < n; ++r) {
    z.rowsTo[r] = st.send.rowOff[r + 1] - st.send.rowOff[r];
    z.slotsTo[r] = st.send.slotOff[r + 1] - st.send.slotOff[r];
    const uint32_t* m = st.layout.countsIn + r * (mine + 2ull);
    if (m[0] == gplan::kBadRouting) {  // a source with a bad slot, which says so to every rank
      if (*badSource < 0) *badSource = r;
      continue;
    }
    uint64_t sum = 0;
    for (uint32_t e = 0; e < mine; ++e) sum += m[2 + e];
    if (sum != m[1] || m[0] > m[1] || (h.dedup == Dedup::None && m[0] != m[1])) {
      b->fail("rank %d: malformed MoE counts from rank %d: %u rows, %u slots, %llu by expert",
              h.comm->rank(), r, m[0], m[1], static_cast<unsigned long long>(sum));
      b->status = fuscoRemoteError;
      return;
    }
    z.rowsFrom[r] = m[0], z.slotsFrom[r] = m[1];
    slots += m[1];
  }
  uint64_t padded = 0;  // the receive rows with padding, exactly (the device sums in 32 bits)
  const uint64_t align = static_cast<uint64_t>(h.shape.expertAlignment);
  for (uint32_t e = 0; e < mine; ++e)
    padded += (static_cast<uint64_t>(st.layout.tokensPerLocal[e]) + align - 1) / align * align;
  if (padded > UINT32_MAX) {
    b->fail("rank %d: %llu receive rows with padding, more than the supported 2^32 - 1",
            h.comm->rank(), static_cast<unsigned long long>(padded));
  } else if (slots > UINT32_MAX) {
    b->fail("rank %d: %llu (row, expert) pairs to receive, more than the supported 2^32 - 1",
            h.comm->rank(), static_cast<unsigned long long>(slots));
  } else if (h.capacity != 0 && st.layout.totals[0] > h.capacity) {
    b->fail(
        "rank %d: the routing needs %u receive rows (padding included), more than its "
        "recvCapacity of %zu",
        h.comm->rank(), st.layout.totals[0], h.capacity);
  }
}

void fanListsWork(MoeHandle& h, const PlanView& v, std::vector<PeerWork>* work) {
  const int n = h.comm->nranks();
  const MoeHandle::Sizes& z = h.sizes;
  const LayerPlan& p = v.plan;
  const LayerPlan& st = v.staged;
  std::vector<uint32_t>& ro = h.steps.rowOffFrom;
  std::vector<uint32_t>& eo = h.steps.entryOff;
  ro.assign(n + 1, 0), eo.assign(n + 1, 0);
  for (int s = 0; s < n; ++s) {
    ro[s + 1] = ro[s] + static_cast<uint32_t>(z.rowsFrom[s] + 1);
    eo[s + 1] = eo[s] + static_cast<uint32_t>(z.slotsFrom[s]);
  }
  work->assign(n, PeerWork());
  for (int r = 0; r < n; ++r) {
    const uint32_t rOff = st.send.rowOff[r], sOff = st.send.slotOff[r];
    PeerWork& w = (*work)[r];
    w.sends.push_back(
        RowStream::flat(p.send.kStart + rOff + r, (z.rowsTo[r] + 1) * sizeof(uint32_t)));
    w.sends.push_back(RowStream::flat(p.fan.remoteFan + sOff, z.slotsTo[r] * sizeof(int64_t)));
    w.recvs.push_back(RowStream::flat(v.fanStart + ro[r], (z.rowsFrom[r] + 1) * sizeof(uint32_t)));
    w.recvs.push_back(RowStream::flat(v.fanRows + eo[r], z.slotsFrom[r] * sizeof(int64_t)));
  }
}

void finishLists(MoeHandle& h, const PlanView& v) {
  const LayerPlan& st = v.staged;
  MoeRecvPlan& rp = h.recv;
  const uint32_t mine = numLocal(h);
  rp.numRecvRows = st.layout.totals[0];
  rp.tokensPerLocalExpert.assign(st.layout.tokensPerLocal, st.layout.tokensPerLocal + mine);
  rp.blockStart.assign(st.layout.blockStart, st.layout.blockStart + mine);
  rp.padding.reserve(mine);  // one range per block at most: a replan never allocates it again
  rp.padding.resize(st.layout.totals[1]);
  for (size_t i = 0; i < rp.padding.size(); ++i)
    rp.padding[i] = RowRange{st.layout.padding[2 * i], st.layout.padding[2 * i + 1]};
  if (h.comm->memType() == fuscoMemCuda) {
    deviceLists(h, v);
  } else {
    hostLists(h, v);
  }
}

void keepRouting(const int64_t* topkIdx, MoeHandle* h) {
  if (topkIdx == h->topkIdx.data()) return;
  if (topkIdx == nullptr || h->numTokens == 0)
    h->topkIdx.clear();
  else
    h->topkIdx.assign(topkIdx, topkIdx + h->numTokens * h->topk);
}

fuscoResult_t moeQuiesce(MoeHandle& h) {
  Progress* progress = h.comm->progress();
  return progress != nullptr ? progress->runSync([] { return fuscoSuccess; }) : fuscoSuccess;
}

void resetStats(MoeHandle& h) {
  std::lock_guard<std::mutex> lk(h.statsMu);
  h.stats = fuscoMoeStats_t{sizeof(fuscoMoeStats_t), 0, 0, 0, 0, 0, 0};
}

fuscoResult_t moeWaitPlan(MoeHandle& h) {
  if (h.capacity == 0) return fuscoSuccess;
  FUSCO_CHECK(moeQuiesce(h));
  if (h.planState == MoeHandle::kPlanReady) return fuscoSuccess;
  return FUSCO_FAIL(fuscoInvalidUsage, kApi,
                    "the handle's fuscoMoePlanCapacity failed on every rank "
                    "(fuscoCommGetAsyncError says why); replan it");
}

fuscoResult_t moeRecvCountsDevice(const MoeHandle& h, const int64_t** numRecvRows,
                                  const int64_t** tokensPerLocalExpert) {
  if (!h.bySteps)
    return FUSCO_FAIL(fuscoInvalidUsage, kApi,
                      "fuscoMoeGetRecvCountsDevice: this handle was planned on the host "
                      "(FUSCO_PLAN=host, or NODE dedup across nodes); use fuscoMoeGetRecvCounts");
  *numRecvRows = h.steps.counts;
  if (tokensPerLocalExpert != nullptr) *tokensPerLocalExpert = h.steps.counts + 1;
  return fuscoSuccess;
}

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

}  // namespace fusco
