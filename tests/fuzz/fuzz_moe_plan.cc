// libFuzzer target: MoE plan input validation (src/plan/moe_plan.h). The bytes pick a shape
// (nranks, numExperts, an optional placement with entries in and out of range, alignment), a
// routing (topkIdx with ids in and out of range, duplicates, -1) and raw metadata as if sent by
// every peer. Properties: buildMoeShape and validateTopk reject bad input with an error; routing
// they accept plans consistently in every dedup mode (planSend's metadata, fed back through
// planRecv on every rank, gives each rank's rows a unique place); planRecv survives arbitrary
// metadata, and on success every row it names is inside numRecvRows.
#include <cstdio>
#include <set>
#include <vector>

#include "fuzz_common.h"
#include "plan/moe_plan.h"

using fusco::fuzz::Bytes;

namespace {

void checkRecvPlan(const fusco::MoeRecvPlan& p, int n) {
  FUZZ_CHECK(static_cast<int>(p.fanStart.size()) == n);
  std::set<int64_t> rows;
  for (const fusco::RowRange& r : p.padding) {
    FUZZ_CHECK(r.count > 0);
    for (int64_t row = r.start; row < r.start + r.count; ++row) FUZZ_CHECK(rows.insert(row).second);
  }
  for (int s = 0; s < n; ++s) {
    for (int64_t r : p.fanRows[s]) {
      FUZZ_CHECK(r >= 0 && static_cast<size_t>(r) < p.numRecvRows);
      FUZZ_CHECK(rows.insert(r).second);  // every final row written once
    }
  }
  FUZZ_CHECK(rows.size() == p.numRecvRows);  // every row is data or padding
}

// Every rank's send plan, its metadata delivered, every rank's receive plan.
void planEverywhere(const fusco::MoeShape& shape, const std::vector<int64_t>& idx, size_t numTokens,
                    int topk, fusco::Dedup dedup) {
  const int n = shape.nranks;
  std::vector<fusco::MoeSendPlan> sends(n);
  for (int r = 0; r < n; ++r) {
    // Every rank routes the same tokens here; enough to exercise every destination.
    sends[r] = fusco::planSend(shape, r, idx.data(), numTokens, topk, dedup);
    fusco::MoeSendPlan again;
    fusco::planSendInto(shape, r, idx.data(), numTokens, topk, dedup, &again);
    FUZZ_CHECK(again.rows == sends[r].rows && again.meta == sends[r].meta);
  }
  for (int r = 0; r < n; ++r) {
    std::vector<std::vector<int32_t>> metaFrom(n);
    for (int s = 0; s < n; ++s) metaFrom[s] = sends[s].meta[r];
    fusco::MoeRecvPlan p;
    FUZZ_CHECK(fusco::planRecv(shape, r, metaFrom, &p) == fuscoSuccess);
    checkRecvPlan(p, n);
    for (int s = 0; s < n; ++s) FUZZ_CHECK(p.rowsFrom(s) == sends[s].rows[r].size());
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fusco::fuzz::quietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  const uint8_t flags = in.u8();
  const int nranks = 1 + in.u8() % 8;
  const int numExperts = static_cast<int8_t>(in.u8());  // includes 0 and negatives
  const int align = in.u8() % 20;
  int topk = in.u8() % 12;
  if (flags & 0x40) topk = 250 + in.u8() % 10;  // around the 255-slot limit
  const size_t numTokens = in.u8() % 48;
  std::vector<int> placement;
  if (flags & 1) {
    placement.resize(numExperts > 0 ? numExperts : 0);
    for (int& p : placement) p = static_cast<int8_t>(in.u8()) % (nranks + 2);
  }
  fusco::MoeShape shape;
  fuscoResult_t r = fusco::buildMoeShape(nranks, numExperts,
                                         (flags & 1) ? placement.data() : nullptr, align, &shape);
  if (r != fuscoSuccess) return 0;
  FUZZ_CHECK(shape.nranks == nranks && shape.numExperts == numExperts);
  FUZZ_CHECK(static_cast<int>(shape.expertToRank.size()) == numExperts);
  for (int e : shape.expertToRank) FUZZ_CHECK(e >= 0 && e < nranks);

  const bool tinyTopk = topk > 0 && topk <= 12;
  std::vector<int64_t> idx(tinyTopk ? numTokens * topk : 0);
  for (auto& v : idx) {
    const uint8_t b = in.u8();
    v = (flags & 2) && b == 0xff ? static_cast<int64_t>(in.u64()) : static_cast<int64_t>(b) - 2;
  }
  const size_t tokens = tinyTopk ? numTokens : 0;
  const int k = tinyTopk ? topk : 0;
  bool valid = fusco::validateTopk(shape, idx.data(), tokens, k) == fuscoSuccess;
  // Topk outside the supported range is judged by the validator alone (no rows to read).
  if (!tinyTopk) fusco::validateTopk(shape, nullptr, 0, topk);
  if (valid && tinyTopk) {
    for (int e = 0; e < (int)idx.size(); ++e) FUZZ_CHECK(idx[e] >= -1 && idx[e] < numExperts);
    planEverywhere(shape, idx, tokens, k, (flags & 4) ? fusco::Dedup::None : fusco::Dedup::Rank);
  }

  // Arbitrary metadata from every peer, to a fuzzer-chosen rank.
  const int rank = in.u8() % nranks;
  std::vector<std::vector<int32_t>> metaFrom(nranks);
  for (int s = 0; s < nranks && in.left() > 0; ++s) {
    const size_t len = in.u8() % 64;
    for (size_t i = 0; i < len; ++i)
      metaFrom[s].push_back((flags & 8) ? static_cast<int32_t>(in.u32())
                                        : static_cast<int32_t>(in.u8() % 8) - 1);
  }
  fusco::MoeRecvPlan p;
  if (fusco::planRecv(shape, rank, metaFrom, &p) == fuscoSuccess) checkRecvPlan(p, nranks);
  return 0;
}
