// The MoE planner (moe_plan.h). Every function is pure and linear in numTokens * topk + nranks +
// numExperts: one counting pass sizes every vector exactly, filling passes write it, and no
// allocation happens per token.
#include "plan/moe_plan.h"

#include <cinttypes>
#include <cstdio>

#include "core/params.h"
#include "core/result.h"

namespace fusco {

namespace {

// kSlots is uint8_t: a token's slot index must fit.
constexpr int kMaxTopk = 255;

// Rows and slot totals per destination, for exact reservations. Branch-free per slot: a token's
// later slots on a rank it already has add a slot but no row.
struct SendCount {
  int64_t lastTok;
  uint64_t rows, slots;
};

void countSend(const MoeShape& shape, const int64_t* topkIdx, size_t numTokens, int topk,
               bool perRank, std::vector<SendCount>* out) {
  out->assign(shape.nranks, SendCount{-1, 0, 0});
  SendCount* c = out->data();
  const int* rankOf = shape.expertToRank.data();
  const uint64_t numExperts = static_cast<uint64_t>(shape.numExperts);
  for (size_t t = 0; t < numTokens; ++t) {
    const int64_t* row = topkIdx + t * topk;
    for (int k = 0; k < topk; ++k) {
      if (static_cast<uint64_t>(row[k]) >= numExperts) continue;  // -1: dropped
      SendCount& q = c[rankOf[row[k]]];
      q.rows += !perRank || q.lastTok != static_cast<int64_t>(t);
      q.lastTok = static_cast<int64_t>(t);
      ++q.slots;
    }
  }
}

// One valid slot of the routing, bucketed by destination rank (token order kept within a rank).
using SlotRecord = MoeSendPlan::Slot;

// Scatters every valid slot into its rank's bucket: bucket r starts at rec + (slots of ranks
// before r), as counted by countSend. One sequential write stream per rank.
void bucketSlots(const MoeShape& shape, const int64_t* topkIdx, size_t numTokens, int topk,
                 const std::vector<SendCount>& c, SlotRecord* rec) {
  std::vector<SlotRecord*> at(shape.nranks);
  for (int r = 0; r < shape.nranks; ++r) {
    at[r] = rec;
    rec += c[r].slots;
  }
  const int* rankOf = shape.expertToRank.data();
  const int* localOf = shape.localIndexOf.data();
  const uint64_t numExperts = static_cast<uint64_t>(shape.numExperts);
  for (size_t t = 0; t < numTokens; ++t) {
    const int64_t* row = topkIdx + t * topk;
    for (int k = 0; k < topk; ++k) {
      const int64_t e = row[k];
      if (static_cast<uint64_t>(e) >= numExperts) continue;
      *at[rankOf[e]]++ = SlotRecord{static_cast<int64_t>(t), localOf[e], static_cast<uint32_t>(k)};
    }
  }
}

// One rank's part of the plan from its bucket, all writes sequential and branch-free: a slot
// that starts a row (a new token, or every slot without dedup) advances the row; the others
// rewrite the current row's token and kStart with the same values, and every slot rewrites its
// row's count with the slots seen so far.
void expandBucket(const SlotRecord* q, size_t slots, bool perRank, int64_t* rows, int32_t* meta,
                  uint32_t* kStart, uint8_t* kSlots) {
  int64_t last = -1;
  size_t row = 0;        // rows started so far
  uint32_t rowSlot = 0;  // kStart of the current row
  for (size_t i = 0; i < slots; ++i) {
    const bool fresh = !perRank || q[i].token != last;
    last = q[i].token;
    row += fresh;
    rowSlot = fresh ? static_cast<uint32_t>(i) : rowSlot;
    rows[row - 1] = q[i].token;
    kStart[row - 1] = rowSlot;
    meta[row - 1 + rowSlot] = static_cast<int32_t>(i + 1 - rowSlot);
    meta[row + i] = q[i].local;  // after the counts of rows 0..row-1 and the slots before it
    kSlots[i] = static_cast<uint8_t>(q[i].k);
  }
  kStart[row] = static_cast<uint32_t>(slots);
}

// Parses rank s's metadata once: validates it and counts rows per local expert.
fuscoResult_t scanMeta(int rank, int s, const std::vector<int32_t>& meta, int numLocal,
                       std::vector<int64_t>* perExpert, std::vector<uint64_t>* seen,
                       uint64_t* stampNext, size_t* rowsOut, size_t* slotsOut) {
  size_t rows = 0, slots = 0;
  size_t i = 0;
  const int32_t* w = meta.data();
  const size_t size = meta.size();
  int64_t* count = perExpert->data();
  while (i < size) {
    const int32_t m = w[i];
    // Most rows feed one expert of this rank: in range, and nothing to check for duplicates.
    if (m == 1 && i + 1 < size &&
        static_cast<uint32_t>(w[i + 1]) < static_cast<uint32_t>(numLocal)) {
      ++count[w[i + 1]];
      ++slots;
      ++rows;
      i += 2;
      continue;
    }
    if (m <= 0 || m > numLocal) {
      return FUSCO_FAIL(fuscoRemoteError, kPlan,
                        "rank %d: malformed MoE metadata from rank %d: row %zu has count %d "
                        "(supported range [1, %d], the local experts of rank %d)",
                        rank, s, rows, m, numLocal, rank);
    }
    if (static_cast<size_t>(m) > meta.size() - i - 1) {
      return FUSCO_FAIL(fuscoRemoteError, kPlan,
                        "rank %d: malformed MoE metadata from rank %d: row %zu is truncated "
                        "(count %d, %zu entries left)",
                        rank, s, rows, m, meta.size() - i - 1);
    }
    // Unique per row over all sources, so `seen` never needs clearing.
    const uint64_t stamp = ++*stampNext;
    for (int j = 1; j <= m; ++j) {
      const int32_t e = meta[i + j];
      if (e < 0 || e >= numLocal) {
        return FUSCO_FAIL(fuscoRemoteError, kPlan,
                          "rank %d: malformed MoE metadata from rank %d: row %zu local expert %d "
                          "outside [0, %d)",
                          rank, s, rows, e, numLocal);
      }
      if ((*seen)[e] == stamp) {
        return FUSCO_FAIL(fuscoRemoteError, kPlan,
                          "rank %d: malformed MoE metadata from rank %d: row %zu names local "
                          "expert %d twice",
                          rank, s, rows, e);
      }
      (*seen)[e] = stamp;
      ++(*perExpert)[e];
    }
    slots += static_cast<size_t>(m);
    ++rows;
    i += static_cast<size_t>(m) + 1;
  }
  *rowsOut = rows;
  *slotsOut = slots;
  return fuscoSuccess;
}

// The receive blocks from the rows per local expert: expert-major, each padded up to the
// alignment (an empty block stays empty), and the padding ranges.
void layoutBlocks(int64_t align, MoeRecvPlan* p) {
  const size_t numLocal = p->tokensPerLocalExpert.size();
  p->blockStart.resize(numLocal);
  p->padding.clear();
  p->padding.reserve(numLocal);  // at most one range per block, so a reused plan never grows it
  int64_t next = 0;
  for (size_t e = 0; e < numLocal; ++e) {
    const int64_t rows = p->tokensPerLocalExpert[e];
    p->blockStart[e] = next;
    const int64_t padded = (rows + align - 1) / align * align;
    if (padded > rows) p->padding.push_back(RowRange{next + rows, padded - rows});
    next += padded;
  }
  p->numRecvRows = static_cast<size_t>(next);
}

}  // namespace

const char* dedupName(Dedup d) {
  switch (d) {
    case Dedup::None:
      return "NONE";
    case Dedup::Rank:
      return "RANK";
    case Dedup::Node:
      return "NODE";
  }
  return "?";
}

FUSCO_PARAM_INT(PlanTrace, "FUSCO_PLAN_TRACE", 0, 0, 1,
                "1: log one line per MoE plan (rows, bytes, dedup), whatever the log level");

fuscoResult_t buildMoeShape(int nranks, int numExperts, const int* placement, int expertAlignment,
                            MoeShape* out) {
  if (out == nullptr) return FUSCO_FAIL(fuscoInvalidArgument, kPlan, "MoE shape: null output");
  if (nranks <= 0) {
    return FUSCO_FAIL(fuscoInvalidArgument, kPlan, "MoE shape: nranks %d outside [1, inf)", nranks);
  }
  if (numExperts <= 0 || numExperts > kMaxExperts) {
    return FUSCO_FAIL(fuscoInvalidArgument, kPlan,
                      "MoE config: numExperts %d outside the supported range [1, %d]", numExperts,
                      kMaxExperts);
  }
  if (expertAlignment < 0 || expertAlignment > kMaxExpertAlignment) {
    return FUSCO_FAIL(fuscoInvalidArgument, kPlan,
                      "MoE config: expertAlignment %d outside the supported range [0, %d] (0 or 1: "
                      "no padding)",
                      expertAlignment, kMaxExpertAlignment);
  }
  if (placement == nullptr && numExperts % nranks != 0) {
    return FUSCO_FAIL(fuscoInvalidArgument, kPlan,
                      "MoE config: numExperts %d is not a multiple of nranks %d; give an explicit "
                      "expertToRank placement",
                      numExperts, nranks);
  }
  MoeShape s;
  s.nranks = nranks;
  s.numExperts = numExperts;
  s.expertAlignment = expertAlignment > 1 ? expertAlignment : 1;
  s.expertToRank.resize(numExperts);
  const int perRank = numExperts / nranks;
  for (int e = 0; e < numExperts; ++e) {
    const int r = placement ? placement[e] : e / perRank;
    if (r < 0 || r >= nranks) {
      return FUSCO_FAIL(fuscoInvalidArgument, kPlan,
                        "MoE config: expertToRank[%d] = %d outside [0, %d)", e, r, nranks);
    }
    s.expertToRank[e] = r;
  }
  std::vector<int> perRankCount(nranks, 0);
  for (int e = 0; e < numExperts; ++e) ++perRankCount[s.expertToRank[e]];
  s.localExperts.resize(nranks);
  for (int r = 0; r < nranks; ++r) s.localExperts[r].reserve(perRankCount[r]);
  s.localIndexOf.resize(numExperts);
  for (int e = 0; e < numExperts; ++e) {
    std::vector<int>& mine = s.localExperts[s.expertToRank[e]];
    s.localIndexOf[e] = static_cast<int>(mine.size());
    mine.push_back(e);
  }
  *out = std::move(s);
  return fuscoSuccess;
}

fuscoResult_t validateTopkLimits(const int64_t* topkIdx, size_t numTokens, int topk) {
  if (topk < 1 || topk > kMaxTopk) {
    return FUSCO_FAIL(fuscoInvalidArgument, kPlan, "MoE routing: topk %d outside [1, %d]", topk,
                      kMaxTopk);
  }
  if (numTokens > 0 && topkIdx == nullptr) {
    return FUSCO_FAIL(fuscoInvalidArgument, kPlan, "MoE routing: topkIdx is null for %zu tokens",
                      numTokens);
  }
  // Rows and forward-metadata row indices are 32-bit on the wire.
  if (numTokens > static_cast<size_t>(INT32_MAX)) {
    return FUSCO_FAIL(fuscoInvalidArgument, kPlan,
                      "MoE routing: %zu tokens, more than the supported 2^31 - 1 per rank",
                      numTokens);
  }
  return fuscoSuccess;
}

fuscoResult_t validateTopk(const MoeShape& shape, const int64_t* topkIdx, size_t numTokens,
                           int topk, size_t firstToken) {
  FUSCO_CHECK(validateTopkLimits(topkIdx, numTokens, topk));
  // stampOf[e] = token + 1 that last selected e, slotOf[e] its slot: duplicates in O(1) per slot.
  std::vector<size_t> stampOf(shape.numExperts, 0);
  std::vector<int> slotOf(shape.numExperts, -1);
  for (size_t t = 0; t < numTokens; ++t) {
    const int64_t* row = topkIdx + t * topk;
    for (int k = 0; k < topk; ++k) {
      const int64_t e = row[k];
      if (e == -1) continue;
      if (e < -1 || e >= shape.numExperts) {
        return FUSCO_FAIL(fuscoInvalidArgument, kPlan,
                          "MoE routing: token %zu slot %d: expert id %" PRId64 " outside [-1, %d)",
                          firstToken + t, k, e, shape.numExperts);
      }
      if (stampOf[e] == t + 1) {
        return FUSCO_FAIL(fuscoInvalidArgument, kPlan,
                          "MoE routing: token %zu slot %d: expert %" PRId64
                          " already selected in slot %d",
                          firstToken + t, k, e, slotOf[e]);
      }
      stampOf[e] = t + 1;
      slotOf[e] = k;
    }
  }
  return fuscoSuccess;
}

void planSendInto(const MoeShape& shape, int rank, const int64_t* topkIdx, size_t numTokens,
                  int topk, Dedup dedup, MoeSendPlan* out) {
  (void)rank;  // the plan to self is built like any other (the engine copies it locally)
  MoeSendPlan& p = *out;
  p.numTokens = numTokens;
  p.topk = topk;
  const int n = shape.nranks;
  p.rows.resize(n);
  p.meta.resize(n);
  p.kStart.resize(n);
  p.kSlots.resize(n);
  if (topk <= 0) numTokens = 0;
  // NODE dedup is a transport-level refinement: per destination rank the rows are RANK's.
  const bool perRank = dedup != Dedup::None;
  std::vector<SendCount> c;
  countSend(shape, topkIdx, numTokens, topk, perRank, &c);
  // Exact sizes (a reused plan keeps its capacity, scratch included, so layer after layer only
  // the counters above and the bucket cursors are allocated). The slots go through per-rank buckets
  // first: scattering one record per slot and then writing each rank's four lists in sequence is
  // much cheaper than scattering into all of them at once.
  size_t total = 0;
  for (int r = 0; r < n; ++r) {
    p.rows[r].resize(c[r].rows);
    p.meta[r].resize(c[r].rows + c[r].slots);
    p.kStart[r].resize(c[r].rows + 1);
    p.kSlots[r].resize(c[r].slots);
    total += c[r].slots;
  }
  p.scratch.resize(total);
  bucketSlots(shape, topkIdx, numTokens, topk, c, p.scratch.data());
  const SlotRecord* q = p.scratch.data();
  for (int r = 0; r < n; ++r) {
    expandBucket(q, c[r].slots, perRank, p.rows[r].data(), p.meta[r].data(), p.kStart[r].data(),
                 p.kSlots[r].data());
    q += c[r].slots;
  }
}

MoeSendPlan planSend(const MoeShape& shape, int rank, const int64_t* topkIdx, size_t numTokens,
                     int topk, Dedup dedup) {
  MoeSendPlan p;
  planSendInto(shape, rank, topkIdx, numTokens, topk, dedup, &p);
  p.scratch = {};  // a plan kept in a handle does not hold the working space
  return p;
}

fuscoResult_t planRecv(const MoeShape& shape, int rank,
                       const std::vector<std::vector<int32_t>>& metaFrom, MoeRecvPlan* out) {
  const int n = shape.nranks;
  if (out == nullptr || rank < 0 || rank >= n) {
    return FUSCO_FAIL(fuscoInvalidArgument, kPlan, "MoE receive plan: rank %d outside [0, %d)",
                      rank, n);
  }
  if (static_cast<int>(metaFrom.size()) != n) {
    return FUSCO_FAIL(fuscoInternalError, kPlan,
                      "MoE receive plan: metadata from %zu ranks, expected %d", metaFrom.size(), n);
  }
  // Validate and count everything before touching *out (no output on failure).
  const int numLocal = static_cast<int>(shape.localExperts[rank].size());
  std::vector<int64_t> perExpert(numLocal, 0);
  std::vector<uint64_t> seen(numLocal, 0);
  uint64_t stampNext = 0;
  std::vector<size_t> rowsFrom(n, 0), slotsFrom(n, 0);
  for (int s = 0; s < n; ++s) {
    FUSCO_CHECK(scanMeta(rank, s, metaFrom[s], numLocal, &perExpert, &seen, &stampNext,
                         &rowsFrom[s], &slotsFrom[s]));
    if (slotsFrom[s] > UINT32_MAX)  // fanStart is 32-bit
      return FUSCO_FAIL(fuscoRemoteError, kPlan,
                        "rank %d: MoE metadata from rank %d names %zu (row, expert) pairs, more "
                        "than the supported 2^32 - 1",
                        rank, s, slotsFrom[s]);
  }
  // Fill *out in place so a reused plan keeps its capacity.
  MoeRecvPlan& p = *out;
  p.tokensPerLocalExpert.swap(perExpert);
  layoutBlocks(shape.expertAlignment > 1 ? shape.expertAlignment : 1, &p);
  // Sources in ascending order, rows in arrival order: a running cursor per block yields
  // blockStart[e] + sum_{s' < s} count[s'][e] + (earlier rows from s feeding e).
  std::vector<int64_t>& cursor = perExpert;  // reuse the swapped-out buffer
  cursor.assign(p.blockStart.begin(), p.blockStart.end());
  p.fanStart.resize(n);
  p.fanRows.resize(n);
  for (int s = 0; s < n; ++s) {
    const std::vector<int32_t>& meta = metaFrom[s];
    p.fanStart[s].resize(rowsFrom[s] + 1);
    p.fanRows[s].resize(slotsFrom[s]);
    uint32_t* fs = p.fanStart[s].data();
    int64_t* fr = p.fanRows[s].data();
    uint32_t pos = 0;
    *fs++ = 0;
    int64_t* cur = cursor.data();
    const int32_t* w = meta.data();
    for (size_t i = 0; i < meta.size();) {
      const int32_t m = w[i];
      fr[pos++] = cur[w[i + 1]]++;  // m >= 1 (scanned above)
      for (int32_t j = 2; j <= m; ++j) fr[pos++] = cur[w[i + j]]++;
      *fs++ = pos;
      i += static_cast<size_t>(m) + 1;
    }
  }
  return fuscoSuccess;
}

void planSumTerms(const MoeSendPlan& send, const std::vector<std::vector<int64_t>>& remoteFanRows,
                  MoeSumTerms* out) {
  const int n = static_cast<int>(send.rows.size());
  std::vector<size_t> cursor(n, 0);
  std::vector<uint32_t> slotBase(n, 0);
  for (int r = 1; r < n; ++r)
    slotBase[r] = slotBase[r - 1] + static_cast<uint32_t>(send.kSlots[r - 1].size());
  out->start.assign(1, 0);
  out->rank.clear(), out->row.clear(), out->weight.clear(), out->last.clear(), out->seq.clear();
  for (size_t t = 0; t < send.numTokens; ++t) {
    for (int r = 0; r < n; ++r) {
      const auto& rows = send.rows[r];
      size_t& cur = cursor[r];
      if (cur >= rows.size() || rows[cur] != static_cast<int64_t>(t)) continue;
      for (; cur < rows.size() && rows[cur] == static_cast<int64_t>(t); ++cur) {
        for (uint32_t j = send.kStart[r][cur]; j < send.kStart[r][cur + 1]; ++j) {
          out->rank.push_back(static_cast<uint32_t>(r));
          out->row.push_back(remoteFanRows[r][j]);
          out->seq.push_back(slotBase[r] + j);
          out->weight.push_back(static_cast<int64_t>(t) * send.topk + send.kSlots[r][j]);
          out->last.push_back(0);
        }
      }
      if (!out->last.empty()) out->last.back() = 1;
    }
    out->start.push_back(static_cast<uint32_t>(out->row.size()));
  }
}

std::string describePlan(const MoeShape& shape, const NodeMap& nodes, int rank,
                         const MoeSendPlan& send, const MoeRecvPlan& recv, size_t rowBytes,
                         Dedup dedup) {
  const int n = static_cast<int>(send.rows.size());
  const bool haveNodes = static_cast<int>(nodes.nodeOf.size()) == n && rank >= 0 && rank < n;
  size_t intraRows = 0, interRows = 0, noneRows = 0, sentRows = 0;
  std::string peers = "[";
  for (int r = 0; r < n; ++r) {
    const size_t rows = send.rows[r].size();
    peers += (r ? "," : "") + std::to_string(rows);
    if (r == rank) continue;  // kept locally: no path
    sentRows += rows;
    noneRows += r < static_cast<int>(send.kSlots.size()) ? send.kSlots[r].size() : rows;
    if (!haveNodes || nodes.nodeOf[r] == nodes.nodeOf[rank]) {
      intraRows += rows;
    } else {
      interRows += rows;
    }
  }
  peers += "]";
  // Bytes only when the row size is known (a plan is made before the first dispatch names it).
  auto path = [rowBytes](size_t rows) {
    return std::to_string(rows) + " rows" +
           (rowBytes ? "/" + std::to_string(rows * rowBytes) + " B" : "");
  };
  char buf[512];
  snprintf(buf, sizeof(buf),
           "plan rank %d: dedup %s, rows to peers %s, intra-node %s, inter-node %s, recv %zu rows "
           "(%zu padding) in %zu local experts, saved %zu rows vs NONE",
           rank, dedupName(dedup), peers.c_str(), path(intraRows).c_str(), path(interRows).c_str(),
           recv.numRecvRows, static_cast<size_t>(recv.paddingRowCount()),
           rank >= 0 && rank < shape.nranks ? shape.localExperts[rank].size() : size_t{0},
           noneRows - sentRows);
  return buf;
}

}  // namespace fusco
