// The GPU planner's buffer layout and its host twin (device_plan_ops.h): the steps of
// plan_steps.h run as sequential loops, with the same scans, so the twin's lists are the ones the
// kernels write.
#include <algorithm>
#include <cstring>

#include "device/device_plan_ops.h"

namespace fusco {

namespace {

// Places arrays in one buffer, 16-byte aligned; with a null base it only measures.
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  template <typename T>
  T* take(uint64_t count) {
    const size_t off = at_;
    at_ += (count * sizeof(T) + 15) / 16 * 16;
    return base_ ? reinterpret_cast<T*>(base_ + off) : nullptr;
  }
  size_t bytes() const { return at_; }

 private:
  char* base_;
  size_t at_ = 0;
};

struct HostExec {
  template <typename F>
  void forEach(uint64_t n, const uint32_t* dynCount, const F& f) {
    if (dynCount != nullptr) n = std::min<uint64_t>(n, *dynCount);
    for (uint64_t i = 0; i < n; ++i) f(i);
  }
  void scan(uint32_t* data, uint64_t nseg, uint64_t segLen, uint32_t* totals) {
    for (uint64_t s = 0; s < nseg; ++s) {
      uint32_t sum = 0;
      for (uint64_t i = 0; i < segLen; ++i) {
        const uint32_t v = data[s * segLen + i];
        data[s * segLen + i] = sum;
        sum += v;
      }
      totals[s] = sum;
    }
  }
  void zero(void* p, size_t bytes) {
    if (bytes > 0) memset(p, 0, bytes);
  }
};

// (expert, chunk) counting tables stay under 2^20 counters (4 MiB); chunks hold at least 256
// entries.
void chooseChunks(uint64_t entries, uint64_t keys, uint32_t* chunk, uint32_t* maxChunks) {
  constexpr uint64_t kMaxTable = 1u << 20, kMinChunk = 256;
  const uint64_t byTable = std::max<uint64_t>(kMaxTable / std::max<uint64_t>(keys, 1), 1);
  uint64_t chunks = std::min<uint64_t>((entries + kMinChunk - 1) / kMinChunk, byTable);
  chunks = std::max<uint64_t>(chunks, 1);
  *chunk = static_cast<uint32_t>(std::max<uint64_t>((entries + chunks - 1) / chunks, 1));
  *maxChunks = static_cast<uint32_t>(chunks);
}

// A send side's per-slot lists and work arrays (everything but the offsets, the bad slot, the count
// message and the experts, which the two carvings place differently).
void carveSendWork(Carver& c, uint64_t numTokens, uint32_t topk, uint32_t nranks,
                   gplan::SendArgs* a) {
  const uint64_t slots = numTokens * topk;
  a->rowsTR = c.take<uint32_t>(nranks * numTokens);
  a->slotsTR = c.take<uint32_t>(nranks * numTokens);
  a->termSrc = c.take<uint32_t>(slots);
  a->rows = c.take<int64_t>(slots);
  a->meta = c.take<int32_t>(2 * slots);
  a->kStart = c.take<uint32_t>(slots + nranks);
  a->kSlots = c.take<uint8_t>(slots);
  a->local = c.take<int32_t>(slots);
  a->weightIdx = c.take<int64_t>(slots);
  a->termStart = c.take<uint32_t>(numTokens + 1);
  a->termRank = c.take<uint32_t>(slots);
  a->termWeight = c.take<int64_t>(slots);
  a->termLast = c.take<uint8_t>(slots);
  a->termRow = c.take<int64_t>(slots);
}

}  // namespace

size_t carvePlanSend(char* base, uint64_t numTokens, uint32_t topk, uint32_t nranks,
                     gplan::SendArgs* a) {
  Carver c(base);
  a->rowOff = c.take<uint32_t>(nranks + 1);
  a->slotOff = c.take<uint32_t>(nranks + 1);
  a->badSlot = c.take<unsigned long long>(1);
  carveSendWork(c, numTokens, topk, nranks, a);
  return c.bytes();
}

size_t carvePlanRecv(char* base, uint32_t nranks, uint32_t numLocal, uint64_t maxEntries,
                     uint64_t maxRows, gplan::RecvArgs* a) {
  const uint64_t local = std::max<uint32_t>(numLocal, 1);
  a->maxEntries = maxEntries;
  a->maxRows = maxRows;
  chooseChunks(maxEntries, local, &a->chunk, &a->maxChunks);
  const uint64_t chunks = a->maxChunks;
  Carver c(base);
  a->rowOffFrom = c.take<uint32_t>(nranks + 1);
  a->entryOff = c.take<uint32_t>(nranks + 1);
  a->hist = c.take<uint32_t>(local * chunks);
  a->expertCount = c.take<uint32_t>(local);
  a->padded = c.take<uint32_t>(local);
  a->padFlag = c.take<uint32_t>(local);
  a->totals = c.take<uint32_t>(2);
  a->errors = c.take<uint32_t>(1);
  a->tokensPerLocal = c.take<int64_t>(local);
  a->blockStart = c.take<int64_t>(local);
  a->padding = c.take<int64_t>(2 * local);
  a->fanStart = c.take<uint32_t>(maxRows + nranks);
  a->fanRows = c.take<int64_t>(maxEntries);
  return c.bytes();
}

namespace {

// The summary the host reads back, contiguous.
void carveSummary(Carver& c, const LayerPlanDims& d, LayerPlan* p) {
  gplan::SendArgs& s = p->send;
  gplan::RecvArgs& l = p->layout;
  const uint64_t local = std::max<uint32_t>(d.numLocal, 1);
  s.rowOff = c.take<uint32_t>(d.nranks + 1);
  s.slotOff = c.take<uint32_t>(d.nranks + 1);
  s.badSlot = c.take<unsigned long long>(1);
  l.totals = c.take<uint32_t>(2);
  l.countsIn = c.take<uint32_t>(d.nranks * (d.numLocal + 2ull));
  l.tokensPerLocal = c.take<int64_t>(local);
  l.blockStart = c.take<int64_t>(local);
  l.padding = c.take<int64_t>(2 * local);
}

// The send side's lists and work, as carvePlanSend, less what the summary holds, plus the count
// message and each slot's expert.
void carveSendLists(Carver& c, const LayerPlanDims& d, gplan::SendArgs* a) {
  carveSendWork(c, d.numTokens, d.topk, d.nranks, a);
  a->countsMsg = c.take<uint32_t>(d.numExperts + 2ull * d.nranks);
  a->expert = c.take<int32_t>(d.numTokens * d.topk);
}

// The arrays one step reads from another's, and the dimensions.
void linkLayerPlan(const LayerPlanDims& d, LayerPlan* p) {
  gplan::SendArgs& s = p->send;
  s.numTokens = d.numTokens;
  s.topk = d.topk;
  s.rankOf = p->rankOf;
  s.localOf = p->localOf;
  s.numExperts = d.numExperts;
  s.nranks = d.nranks;
  s.msgOff = p->msgOff;
  s.msgPos = p->msgPos;
  gplan::RecvArgs& l = p->layout;
  l.nranks = d.nranks;
  l.numLocal = d.numLocal;
  gplan::FanArgs& f = p->fan;
  f.expert = s.expert;
  f.slotCount = s.slotOff + d.nranks;
  f.numExperts = d.numExperts;
  f.basesIn = p->basesIn;
  f.basePos = p->basePos;
  f.badSlot = s.badSlot;
}

}  // namespace

size_t carveLayerPlan(char* base, const LayerPlanDims& d, LayerPlan* p) {
  Carver c(base);
  const uint64_t local = std::max<uint32_t>(d.numLocal, 1);
  p->rankOf = c.take<int32_t>(d.numExperts);
  p->localOf = c.take<int32_t>(d.numExperts);
  p->msgOff = c.take<uint32_t>(d.nranks);
  p->msgPos = c.take<uint32_t>(d.numExperts);
  p->basePos = c.take<uint32_t>(d.numExperts);
  p->tablesBytes = c.bytes();
  p->summaryOffset = c.bytes();
  carveSummary(c, d, p);
  p->summaryBytes = c.bytes() - p->summaryOffset;
  carveSendLists(c, d, &p->send);
  gplan::RecvArgs& l = p->layout;
  l.expertCount = c.take<uint32_t>(local);
  l.padded = c.take<uint32_t>(local);
  l.padFlag = c.take<uint32_t>(local);
  l.basesOut = c.take<int64_t>(d.nranks * local);
  l.padByExpert = c.take<int64_t>(2 * local);
  p->basesIn = c.take<int64_t>(d.numExperts);
  gplan::FanArgs& f = p->fan;
  f.maxSlots = d.numTokens * d.topk;
  chooseChunks(f.maxSlots, d.numExperts, &f.chunk, &f.maxChunks);
  f.hist = c.take<uint32_t>(static_cast<uint64_t>(d.numExperts) * f.maxChunks);
  f.expertTotals = c.take<uint32_t>(d.numExperts);
  f.remoteFan = c.take<int64_t>(f.maxSlots);
  linkLayerPlan(d, p);
  return c.bytes();
}

void hostPlanSend(const gplan::SendArgs& a) {
  HostExec x;
  gplan::planSendSteps(x, a);
}

void hostPlanTermRows(const gplan::SendArgs& a, const int64_t* remoteFan) {
  HostExec x;
  gplan::planTermRowSteps(x, a, remoteFan);
}

void hostPlanRecv(const gplan::RecvArgs& a) {
  HostExec x;
  gplan::planRecvSteps(x, a);
}

void hostPlanLayout(const gplan::RecvArgs& a) {
  HostExec x;
  gplan::planLayoutSteps(x, a);
}

void hostPlanFan(const gplan::FanArgs& f, const gplan::SendArgs& a) {
  HostExec x;
  gplan::planFanSteps(x, f, a);
}

}  // namespace fusco
