// The GPU planner's cases and its comparison with the host planner (gpu_plan_cases.h).
#include "harness/gpu_plan_cases.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>

#include "core/result.h"
#include "harness/data_gen.h"

namespace fusco {
namespace test {

namespace {

GpuPlanCase makeCase(std::string name, int n, int experts, int topk, std::vector<size_t> tokens,
                     Dedup dedup) {
  GpuPlanCase c;
  c.name = std::move(name) + (dedup == Dedup::None ? "_NONE" : "_RANK");
  c.moe.nranks = n;
  c.moe.numExperts = experts;
  c.moe.topk = topk;
  c.moe.numTokens = std::move(tokens);
  c.dedup = dedup;
  c.salt = std::hash<std::string>()(c.name);
  return c;
}

std::vector<size_t> uneven(int n, size_t base) {
  std::vector<size_t> t(n);
  for (int r = 0; r < n; ++r) t[r] = base + 37 * r;
  if (n > 1) t[1] = 0;  // an empty rank
  if (n > 2) t[2] = 1;
  return t;
}

// "" when got[0..want.size()) equals want, else the first difference.
template <typename T>
std::string diffList(const char* what, int a, int b, const T* got, const std::vector<T>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (memcmp(&got[i], &want[i], sizeof(T)) == 0) continue;
    char buf[200];
    snprintf(buf, sizeof(buf), "%s (%d, %d) entry %zu of %zu: got %lld, want %lld", what, a, b, i,
             want.size(), static_cast<long long>(got[i]), static_cast<long long>(want[i]));
    return buf;
  }
  return "";
}

#define FUSCO_DIFF(expr)        \
  do {                          \
    std::string d_ = (expr);    \
    if (!d_.empty()) return d_; \
  } while (0)

bool allPoison(const void* p, size_t bytes) { return findNotPoison(p, bytes) == SIZE_MAX; }

}  // namespace

std::vector<GpuPlanCase> gpuPlanCases() {
  std::vector<GpuPlanCase> v;
  for (Dedup d : {Dedup::Rank, Dedup::None}) {
    for (int n : {1, 2, 3, 4, 8}) {
      v.push_back(makeCase("uniform_" + std::to_string(n) + "ranks_top4", n, 8 * n,
                           std::min(4, 8 * n), uneven(n, 90), d));
      v.push_back(makeCase("top1_" + std::to_string(n) + "ranks", n, 4 * n, 1, uneven(n, 60), d));
    }
    v.push_back(makeCase("top8_8ranks_64experts", 8, 64, 8, uneven(8, 700), d));
    v.push_back(makeCase("top8_2ranks_4096tokens", 2, 64, 8, {4096, 4096}, d));
    v.push_back(makeCase("top32_4ranks", 4, 64, 32, uneven(4, 50), d));
    GpuPlanCase hot = makeCase("one_hot_expert_4ranks", 4, 16, 4, uneven(4, 200), d);
    hot.moe.route = Route::OneExpert;
    hot.moe.fixedExpert = 6;
    v.push_back(hot);
    GpuPlanCase idle = makeCase("idle_experts_8ranks", 8, 24, 3, uneven(8, 80), d);
    idle.moe.route = Route::SomeExpertsIdle;
    v.push_back(idle);
    GpuPlanCase pad = makeCase("padded16_4ranks", 4, 16, 4, uneven(4, 70), d);
    pad.moe.align = 16;
    v.push_back(pad);
    GpuPlanCase placed = makeCase("placement_13experts_4ranks_pad4", 4, 13, 3, uneven(4, 50), d);
    placed.moe.align = 4;
    placed.moe.placement = {3, 0, 0, 2, 1, 3, 3, 0, 2, 2, 1, 0, 3};
    v.push_back(placed);
    v.push_back(makeCase("no_tokens_4ranks", 4, 8, 2, {0, 0, 0, 0}, d));
    GpuPlanCase slack = makeCase("roomy_receive_3ranks", 3, 9, 3, uneven(3, 40), d);
    slack.entrySlack = 1000;
    v.push_back(slack);
    GpuPlanCase dense = makeCase("no_unused_slots_4ranks", 4, 32, 8, uneven(4, 120), d);
    dense.moe.unusedPercent = 0;
    v.push_back(dense);
  }
  return v;
}

GpuPlanSendOnly::GpuPlanSendOnly(const MoeShape& shape, const int64_t* topkIdx, size_t numTokens,
                                 int topk, Dedup dedup)
    : shape_(shape),
      topk_(topkIdx, topkIdx + numTokens * topk),
      numTokens_(numTokens),
      k_(topk),
      dedup_(dedup) {}

unsigned long long GpuPlanSendOnly::badSlot() const { return *host_.badSlot; }

bool GpuPlanSendOnly::listsUntouched() const {
  const uint64_t slots = numTokens_ * k_;
  const uint64_t n = shape_.nranks;
  return allPoison(host_.rows, slots * 8) && allPoison(host_.meta, 2 * slots * 4) &&
         allPoison(host_.kStart, (slots + n) * 4) && allPoison(host_.kSlots, slots) &&
         allPoison(host_.local, slots * 4) && allPoison(host_.weightIdx, slots * 8) &&
         allPoison(host_.termRank, slots * 4) && allPoison(host_.termWeight, slots * 8) &&
         allPoison(host_.termLast, slots) && allPoison(host_.termSrc, slots * 4);
}

GpuPlanRun::GpuPlanRun(const MoeRefProblem& p, Dedup dedup, uint64_t entrySlack)
    : p_(p), dedup_(dedup), slack_(entrySlack) {
  const int* placement = p.placement.empty() ? nullptr : p.placement.data();
  if (buildMoeShape(p.nranks, p.numExperts, placement, p.expertAlignment, &shape_) != fuscoSuccess)
    ADD_FAILURE() << threadLastError();
  rankOf_.assign(shape_.expertToRank.begin(), shape_.expertToRank.end());
  localOf_.assign(shape_.localIndexOf.begin(), shape_.localIndexOf.end());
  send_.reserve(p.nranks);
  for (int s = 0; s < p.nranks; ++s)
    send_.emplace_back(shape_, p.topkIdx[s].data(), p.numTokens[s], p.topk, dedup);
  recv_.resize(p.nranks);
}

uint32_t GpuPlanRun::rowsTo(int s, int r) const {
  return send_[s].host_.rowOff[r + 1] - send_[s].host_.rowOff[r];
}

uint32_t GpuPlanRun::slotsTo(int s, int r) const {
  return send_[s].host_.slotOff[r + 1] - send_[s].host_.slotOff[r];
}

uint32_t GpuPlanRun::recvErrors(int r) const { return *recv_[r].host.errors; }

bool GpuPlanRun::fanRowsUntouched(int r) const {
  return allPoison(recv_[r].host.fanRows, recv_[r].host.maxEntries * 8);
}

std::string GpuPlanRun::compareWithHostPlanner() const {
  for (int s = 0; s < p_.nranks; ++s) FUSCO_DIFF(compareSend(s));
  for (int r = 0; r < p_.nranks; ++r) FUSCO_DIFF(compareRecv(r));
  for (int s = 0; s < p_.nranks; ++s) FUSCO_DIFF(compareTerms(s));
  return "";
}

std::string GpuPlanRun::compareSend(int s) const {
  const gplan::SendArgs& h = send_[s].host_;
  if (*h.badSlot != gplan::kNoBadSlot) return "rank " + std::to_string(s) + ": bad slot reported";
  const MoeSendPlan want =
      planSend(shape_, s, p_.topkIdx[s].data(), p_.numTokens[s], p_.topk, dedup_);
  for (int r = 0; r < p_.nranks; ++r) {
    if (rowsTo(s, r) != want.rows[r].size() || slotsTo(s, r) != want.kSlots[r].size())
      return "rows or slots " + std::to_string(s) + " -> " + std::to_string(r) + " differ";
    const uint32_t ro = h.rowOff[r], so = h.slotOff[r];
    FUSCO_DIFF(diffList("rows", s, r, h.rows + ro, want.rows[r]));
    FUSCO_DIFF(diffList("meta", s, r, h.meta + ro + so, want.meta[r]));
    FUSCO_DIFF(diffList("kStart", s, r, h.kStart + ro + r, want.kStart[r]));
    FUSCO_DIFF(diffList("kSlots", s, r, h.kSlots + so, want.kSlots[r]));
    std::vector<int64_t> weights;
    for (size_t i = 0; i < want.rows[r].size(); ++i)
      for (uint32_t j = want.kStart[r][i]; j < want.kStart[r][i + 1]; ++j)
        weights.push_back(want.rows[r][i] * p_.topk + want.kSlots[r][j]);
    FUSCO_DIFF(diffList("weightIdx", s, r, h.weightIdx + so, weights));
  }
  return "";
}

std::string GpuPlanRun::compareRecv(int r) const {
  const int n = p_.nranks;
  std::vector<std::vector<int32_t>> metaFrom(n);
  for (int s = 0; s < n; ++s)
    metaFrom[s] =
        planSend(shape_, s, p_.topkIdx[s].data(), p_.numTokens[s], p_.topk, dedup_).meta[r];
  MoeRecvPlan want;
  if (planRecv(shape_, r, metaFrom, &want) != fuscoSuccess) return threadLastError();
  const gplan::RecvArgs& h = recv_[r].host;
  if (*h.errors != 0) return "rank " + std::to_string(r) + ": receive errors reported";
  if (h.totals[0] != want.numRecvRows || h.totals[1] != want.padding.size())
    return "rank " + std::to_string(r) + ": numRecvRows or padding ranges differ";
  FUSCO_DIFF(diffList("tokensPerLocalExpert", r, r, h.tokensPerLocal, want.tokensPerLocalExpert));
  FUSCO_DIFF(diffList("blockStart", r, r, h.blockStart, want.blockStart));
  std::vector<int64_t> pad;
  for (const RowRange& q : want.padding) pad.insert(pad.end(), {q.start, q.count});
  FUSCO_DIFF(diffList("padding", r, r, h.padding, pad));
  for (int s = 0; s < n; ++s) {
    FUSCO_DIFF(diffList("fanStart", s, r, h.fanStart + h.rowOffFrom[s], want.fanStart[s]));
    FUSCO_DIFF(diffList("fanRows", s, r, h.fanRows + h.entryOff[s], want.fanRows[s]));
  }
  return "";
}

std::string GpuPlanRun::compareTerms(int s) const {
  const int n = p_.nranks;
  const MoeSendPlan send =
      planSend(shape_, s, p_.topkIdx[s].data(), p_.numTokens[s], p_.topk, dedup_);
  std::vector<std::vector<int64_t>> remoteFan(n);
  for (int r = 0; r < n; ++r) {
    const gplan::RecvArgs& rv = recv_[r].host;
    remoteFan[r].assign(rv.fanRows + rv.entryOff[s], rv.fanRows + rv.entryOff[s + 1]);
  }
  MoeSumTerms want;
  planSumTerms(send, remoteFan, &want);
  const gplan::SendArgs& h = send_[s].host_;
  FUSCO_DIFF(diffList("termStart", s, s, h.termStart, want.start));
  FUSCO_DIFF(diffList("termRank", s, s, h.termRank, want.rank));
  FUSCO_DIFF(diffList("termRow", s, s, h.termRow, want.row));
  FUSCO_DIFF(diffList("termWeight", s, s, h.termWeight, want.weight));
  FUSCO_DIFF(diffList("termLast", s, s, h.termLast, want.last));
  return "";
}

}  // namespace test
}  // namespace fusco
