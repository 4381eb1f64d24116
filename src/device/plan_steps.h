// The MoE planner as data-parallel steps (docs/DESIGN.md, "Planning on the GPU"): the same plan as
// plan/moe_plan.h's host planner, list for list, computed by per-token and per-chunk steps and
// segmented scans, so that a CUDA communicator plans on the device without copying topkIdx to
// the host. The steps are written once (FUSCO_HD) and run by two executors: kernels on a stream
// (plan_kernels.cu) and a host twin of them (plan_twin.cc), which is how the algorithm is checked
// against the host planner on machines without a GPU.
//
// Layout of the outputs: one packed array per list, rank after rank. With rowOff/slotOff the
// exclusive sums over ranks of the rows and (row, expert) slots sent to each rank, rank r's lists
// are rows[rowOff[r]..], meta[rowOff[r] + slotOff[r]..], kStart[rowOff[r] + r..] (rows + 1
// entries) and kSlots/local/weightIdx[slotOff[r]..]. The receive side packs fanStart and fanRows
// the same way by source.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define FUSCO_HD __host__ __device__
#else
#define FUSCO_HD
#endif

namespace fusco {
namespace gplan {

constexpr unsigned long long kNoBadSlot = ~0ull;
// The rows word of a count message whose source's routing is invalid (a bad slot): every receiver
// learns it with the counts, so every rank fails the plan without a round of its own.
constexpr uint32_t kBadRouting = ~0u;
// RecvArgs::errors bits.
constexpr uint32_t kErrLocalRange = 1;  // a source named a local expert outside [0, numLocal)
constexpr uint32_t kErrOverflow = 2;    // more entries than the receive side was sized for

FUSCO_HD inline void noteFirst(unsigned long long* at, unsigned long long v) {
#if defined(__CUDA_ARCH__)
  atomicMin(at, v);
#else
  if (v < *at) *at = v;
#endif
}

FUSCO_HD inline void noteBits(uint32_t* at, uint32_t bits) {
#if defined(__CUDA_ARCH__)
  atomicOr(at, bits);
#else
  *at |= bits;
#endif
}

FUSCO_HD inline void addOne(uint32_t* at) {
#if defined(__CUDA_ARCH__)
  atomicAdd(at, 1u);
#else
  ++*at;
#endif
}

// The send side: the routing in, this rank's send lists and combine's sum terms out.
struct SendArgs {
  const int64_t* topkIdx = nullptr;  // [numTokens * topk]
  uint64_t numTokens = 0;
  uint32_t topk = 0;
  const int32_t* rankOf = nullptr;   // [numExperts]
  const int32_t* localOf = nullptr;  // [numExperts]
  int64_t numExperts = 0;
  uint32_t nranks = 0;
  uint32_t perRank = 1;  // 1: RANK dedup (one row per token and rank); 0: NONE
  // Work: per (rank, token) rows and slots, scanned in place into each one's first row and slot.
  uint32_t* rowsTR = nullptr;             // [nranks * numTokens]
  uint32_t* slotsTR = nullptr;            // [nranks * numTokens]
  uint32_t* rowOff = nullptr;             // [nranks + 1]
  uint32_t* slotOff = nullptr;            // [nranks + 1]
  unsigned long long* badSlot = nullptr;  // the first invalid t * topk + k, else kNoBadSlot
  uint32_t* termSrc = nullptr;            // [numTokens * topk] packed slot of each sum term
  // Out (packed as above).
  int64_t* rows = nullptr;
  int32_t* meta = nullptr;
  uint32_t* kStart = nullptr;
  uint8_t* kSlots = nullptr;
  int32_t* local = nullptr;      // the local expert index of each slot at its destination
  int64_t* weightIdx = nullptr;  // t * topk + k of each slot
  // Combine's sum at the source: termStart [numTokens + 1]; per term its rank, weight index,
  // group end, and (once the receivers' fan rows are known) its row.
  uint32_t* termStart = nullptr;
  uint32_t* termRank = nullptr;
  int64_t* termWeight = nullptr;
  uint8_t* termLast = nullptr;
  int64_t* termRow = nullptr;
  // A layer plan's count message (optional, null in a bare send side): rank r's part at
  // msgOff[r] is [rows to r, slots to r, slots per local expert of r]; expert e's count is at
  // msgPos[e]. expert: the global expert of each slot (packed like local).
  const uint32_t* msgOff = nullptr;  // [nranks]
  const uint32_t* msgPos = nullptr;  // [numExperts]
  uint32_t* countsMsg = nullptr;     // [numExperts + 2 * nranks]
  int32_t* expert = nullptr;
};

// Expert e of a token's slot, or -1 when the slot holds no valid expert (-1, or out of range).
FUSCO_HD inline int64_t slotExpert(const SendArgs& a, const int64_t* row, uint32_t k) {
  const int64_t e = row[k];
  return e >= 0 && e < a.numExperts ? e : -1;
}

struct ResetBadSlot {
  SendArgs a;
  FUSCO_HD void operator()(uint64_t) const { *a.badSlot = kNoBadSlot; }
};

// Token t: checks its slots (the host planner's validateTopk, first failure by t * topk + k) and
// counts its rows and slots per destination rank and its valid slots (termStart[t]).
struct CountToken {
  SendArgs a;
  FUSCO_HD void operator()(uint64_t t) const {
    const int64_t* row = a.topkIdx + t * a.topk;
    uint32_t valid = 0;
    for (uint32_t k = 0; k < a.topk; ++k) {
      const int64_t e = row[k];
      if (e == -1) continue;
      bool bad = e < -1 || e >= a.numExperts;
      for (uint32_t j = 0; j < k && !bad; ++j) bad = row[j] == e;
      if (bad) {
        noteFirst(a.badSlot, t * a.topk + k);
        continue;
      }
      const uint64_t at = static_cast<uint64_t>(a.rankOf[e]) * a.numTokens + t;
      const uint32_t s = ++a.slotsTR[at];
      a.rowsTR[at] = a.perRank ? 1 : s;
      if (a.countsMsg != nullptr) addOne(a.countsMsg + a.msgPos[e]);
      ++valid;
    }
    a.termStart[t] = valid;
  }
};

// Token t's slot k, once the counts are scanned: where it goes in every list.
struct SlotPlace {
  uint32_t rank, j, count, before;  // j: its index among the token's slots to rank; before:
                                    // the token's slots to lower ranks
};

FUSCO_HD inline SlotPlace placeSlot(const SendArgs& a, const int64_t* row, uint32_t k, int64_t e) {
  SlotPlace p{static_cast<uint32_t>(a.rankOf[e]), 0, 0, 0};
  for (uint32_t q = 0; q < a.topk; ++q) {
    const int64_t f = slotExpert(a, row, q);
    if (f < 0) continue;
    const uint32_t r = static_cast<uint32_t>(a.rankOf[f]);
    p.count += r == p.rank;
    p.j += r == p.rank && q < k;
    p.before += r < p.rank;
  }
  return p;
}

// Token t: writes its rows, metadata, k slots and sum terms (nothing when the routing is invalid,
// so invalid input never writes past the lists sized for valid input).
struct WriteToken {
  SendArgs a;
  FUSCO_HD void operator()(uint64_t t) const {
    if (*a.badSlot != kNoBadSlot) return;
    const int64_t* row = a.topkIdx + t * a.topk;
    for (uint32_t k = 0; k < a.topk; ++k) {
      const int64_t e = slotExpert(a, row, k);
      if (e < 0) continue;
      const SlotPlace p = placeSlot(a, row, k, e);
      const uint64_t at = static_cast<uint64_t>(p.rank) * a.numTokens + t;
      const uint32_t slot = a.slotsTR[at] + p.j;
      const uint32_t rowIdx = a.perRank ? a.rowsTR[at] : a.rowsTR[at] + p.j;
      const uint32_t first = a.perRank ? a.slotsTR[at] : slot;
      const uint32_t ro = a.rowOff[p.rank], so = a.slotOff[p.rank];
      if (!a.perRank || p.j == 0) {
        a.rows[ro + rowIdx] = static_cast<int64_t>(t);
        a.kStart[ro + p.rank + rowIdx] = first;
        a.meta[ro + so + rowIdx + first] = static_cast<int32_t>(a.perRank ? p.count : 1);
      }
      a.meta[ro + so + rowIdx + 1 + slot] = a.localOf[e];
      a.kSlots[so + slot] = static_cast<uint8_t>(k);
      a.local[so + slot] = a.localOf[e];
      a.weightIdx[so + slot] = static_cast<int64_t>(t * a.topk + k);
      if (a.expert != nullptr) a.expert[so + slot] = static_cast<int32_t>(e);
      const uint32_t term = a.termStart[t] + p.before + p.j;
      a.termRank[term] = p.rank;
      a.termWeight[term] = static_cast<int64_t>(t * a.topk + k);
      a.termLast[term] = p.j + 1 == p.count;
      a.termSrc[term] = so + slot;
    }
  }
};

// Rank r: the closing kStart entry of its list (its slot count) and its count message's header
// (rows kBadRouting when the routing has a bad slot).
struct CloseRank {
  SendArgs a;
  FUSCO_HD void operator()(uint64_t r) const {
    const uint32_t rows = a.rowOff[r + 1] - a.rowOff[r];
    const uint32_t slots = a.slotOff[r + 1] - a.slotOff[r];
    if (a.countsMsg != nullptr) {
      a.countsMsg[a.msgOff[r]] = *a.badSlot != kNoBadSlot ? kBadRouting : rows;
      a.countsMsg[a.msgOff[r] + 1] = slots;
    }
    if (*a.badSlot != kNoBadSlot) return;
    a.kStart[a.rowOff[r] + r + rows] = slots;
  }
};

// Term i: its row in its rank's expert output, from that rank's fan rows for this rank's slots
// (remoteFan, packed by slotOff like the slot lists).
struct TermRow {
  SendArgs a;
  const int64_t* remoteFan;
  FUSCO_HD void operator()(uint64_t i) const {
    if (*a.badSlot == kNoBadSlot) a.termRow[i] = remoteFan[a.termSrc[i]];
  }
};

// The receive side: every source's kStart and local-expert list for this rank in, the receive
// layout out (plan/moe_plan.h's MoeRecvPlan, packed by source).
struct RecvArgs {
  uint32_t nranks = 0;
  uint32_t numLocal = 0;
  uint32_t align = 1;
  const uint32_t* const* srcKStart = nullptr;  // [nranks] rowsFrom[s] + 1 entries each
  const int32_t* const* srcLocal = nullptr;    // [nranks] slots from s each
  const uint32_t* rowsFrom = nullptr;          // [nranks]
  uint64_t maxEntries = 0;                     // (row, expert) entries the lists below hold
  uint64_t maxRows = 0;    // rows from all sources the fanStart list holds (without the n ends)
  uint32_t chunk = 256;    // entries per counting chunk
  uint32_t maxChunks = 0;  // ceil(maxEntries / chunk)
  // Work.
  uint32_t* rowOffFrom = nullptr;   // [nranks + 1] fanStart entries before source s
  uint32_t* entryOff = nullptr;     // [nranks + 1] entries before source s
  uint32_t* hist = nullptr;         // [numLocal * maxChunks] entries per (expert, chunk)
  uint32_t* expertCount = nullptr;  // [numLocal]
  uint32_t* padded = nullptr;       // [numLocal] padded block sizes, scanned into block starts
  uint32_t* padFlag = nullptr;      // [numLocal] 1 when padded, scanned into range indices
  uint32_t* totals = nullptr;       // [2] numRecvRows, padding ranges
  uint32_t* errors = nullptr;       // kErr* bits
  // Out.
  int64_t* tokensPerLocal = nullptr;  // [numLocal]
  int64_t* blockStart = nullptr;      // [numLocal]
  int64_t* padding = nullptr;         // [2 * numLocal] (start, count) pairs
  uint32_t* fanStart = nullptr;       // [maxRows + nranks]
  int64_t* fanRows = nullptr;         // [maxEntries]
  // A layer plan's receive layout from the sources' count messages instead of their lists
  // (planLayoutSteps): countsIn[s * (numLocal + 2) ..] is source s's message; basesOut[s *
  // numLocal + e] the first row of expert e's block that source s's rows take.
  const uint32_t* countsIn = nullptr;
  int64_t* basesOut = nullptr;
  // padByExpert [2 * numLocal]: expert e's padding range (count 0 when none, and for every expert
  // when the rows exceed a nonzero capacity), so a zero-filling kernel needs no count from the
  // host.
  uint64_t capacity = 0;
  int64_t* padByExpert = nullptr;
  // counts [1 + numLocal]: the receive rows (padding included), then the rows per local expert,
  // where the device reads them (fuscoMoeGetRecvCountsDevice; zeros when the rows exceed a nonzero
  // capacity). Optional.
  int64_t* counts = nullptr;
};

// The last s in [0, n] with off[s] <= g (off ascending, off[0] = 0).
FUSCO_HD inline uint32_t sourceOf(const uint32_t* off, uint32_t n, uint64_t g) {
  uint32_t lo = 0, hi = n;
  while (lo < hi) {
    const uint32_t mid = (lo + hi + 1) / 2;
    if (off[mid] <= g) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Source s: its fanStart entries and (row, expert) entries, for the scans over sources.
struct SourceSizes {
  RecvArgs a;
  FUSCO_HD void operator()(uint64_t s) const {
    a.rowOffFrom[s] = a.rowsFrom[s] + 1;
    a.entryOff[s] = a.srcKStart[s][a.rowsFrom[s]];
  }
};

// Walks the entries of chunk c in order: f(expert, packed entry index).
template <typename F>
FUSCO_HD inline void walkChunk(const RecvArgs& a, uint64_t c, F f) {
  const uint64_t total = a.entryOff[a.nranks];
  if (total > a.maxEntries) {
    if (c == 0) noteBits(a.errors, kErrOverflow);
    return;
  }
  const uint64_t start = c * a.chunk;
  if (start >= total) return;
  const uint64_t end = start + a.chunk < total ? start + a.chunk : total;
  uint32_t s = sourceOf(a.entryOff, a.nranks, start);
  for (uint64_t g = start; g < end; ++g) {
    while (g >= a.entryOff[s + 1]) ++s;
    const int32_t e = a.srcLocal[s][g - a.entryOff[s]];
    if (e < 0 || static_cast<uint32_t>(e) >= a.numLocal) {
      noteBits(a.errors, kErrLocalRange);
      continue;
    }
    f(static_cast<uint32_t>(e), g);
  }
}

// Expert e's block size padded up to the alignment (an empty block stays empty).
FUSCO_HD inline uint32_t paddedBlock(const RecvArgs& a, uint64_t e) {
  return (a.expertCount[e] + a.align - 1) / a.align * a.align;
}

struct PadBlock {
  RecvArgs a;
  FUSCO_HD void operator()(uint64_t e) const {
    a.padded[e] = paddedBlock(a, e);
    a.padFlag[e] = a.padded[e] > a.expertCount[e];
  }
};

// Expert e, once the padded sizes are scanned: its count, block start and padding range.
struct WriteBlock {
  RecvArgs a;
  FUSCO_HD void operator()(uint64_t e) const {
    const uint32_t n = a.expertCount[e];
    const uint32_t p = paddedBlock(a, e);
    a.tokensPerLocal[e] = n;
    a.blockStart[e] = a.padded[e];
    if (p > n) {
      a.padding[2 * a.padFlag[e]] = static_cast<int64_t>(a.padded[e]) + n;
      a.padding[2 * a.padFlag[e] + 1] = p - n;
    }
    if (a.padByExpert != nullptr) {
      a.padByExpert[2 * e] = static_cast<int64_t>(a.padded[e]) + n;
      a.padByExpert[2 * e + 1] = p - n;
    }
  }
};

// Expert e, once the totals are known: no padding range past a capacity the rows exceed, and the
// receive rows where the device reads them.
struct FinishLayout {
  RecvArgs a;
  FUSCO_HD void operator()(uint64_t e) const {
    const bool over = a.capacity != 0 && a.totals[0] > a.capacity;
    if (a.counts != nullptr && e == 0) a.counts[0] = over ? 0 : a.totals[0];
    if (a.counts != nullptr && e < a.numLocal) a.counts[1 + e] = over ? 0 : a.expertCount[e];
    if (a.padByExpert == nullptr || a.capacity == 0 || e >= a.numLocal) return;
    // Never a range past the capacity, whatever the totals say (a zero-filling kernel trusts it).
    const uint64_t end = static_cast<uint64_t>(a.padByExpert[2 * e]) + a.padByExpert[2 * e + 1];
    if (over || end > a.capacity) a.padByExpert[2 * e + 1] = 0;
  }
};

// Chunk c: the final row of each of its entries (its expert's block start, then the entries of
// that expert before it: earlier sources, earlier rows, earlier chunks).
struct FanChunk {
  RecvArgs a;
  FUSCO_HD void operator()(uint64_t c) const {
    uint32_t* h = a.hist;
    const uint32_t m = a.maxChunks;
    const int64_t* bs = a.blockStart;
    int64_t* out = a.fanRows;
    walkChunk(a, c, [h, m, c, bs, out](uint32_t e, uint64_t g) {
      out[g] = bs[e] + h[e * static_cast<uint64_t>(m) + c]++;
    });
  }
};

// fanStart entry g: source s's kStart, entry for entry.
struct FanStart {
  RecvArgs a;
  FUSCO_HD void operator()(uint64_t g) const {
    const uint32_t s = sourceOf(a.rowOffFrom, a.nranks, g);
    a.fanStart[g] = a.srcKStart[s][g - a.rowOffFrom[s]];
  }
};

// Expert e: its rows from every source (a layer plan's count messages).
struct CountsTotals {
  RecvArgs a;
  FUSCO_HD void operator()(uint64_t e) const {
    uint32_t n = 0;
    for (uint32_t s = 0; s < a.nranks; ++s) n += a.countsIn[s * (a.numLocal + 2ull) + 2 + e];
    a.expertCount[e] = n;
  }
};

// Expert e, once the block starts are known: where each source's rows of it begin (sources in
// rank order, as the host planner's receive layout).
struct SourceBases {
  RecvArgs a;
  FUSCO_HD void operator()(uint64_t e) const {
    int64_t at = a.blockStart[e];
    for (uint32_t s = 0; s < a.nranks; ++s) {
      a.basesOut[s * static_cast<uint64_t>(a.numLocal) + e] = at;
      at += a.countsIn[s * (a.numLocal + 2ull) + 2 + e];
    }
  }
};

// A layer plan's fan rows at the source: where each of this rank's slots lands in its
// destination's expert-major rows, from the bases the destinations computed (planLayoutSteps).
struct FanArgs {
  const int32_t* expert = nullptr;      // [maxSlots] global expert of each packed slot
  const uint32_t* slotCount = nullptr;  // the slots (the send side's slotOff[nranks])
  uint64_t maxSlots = 0;
  uint32_t numExperts = 0;
  const int64_t* basesIn = nullptr;   // expert e's first row for this rank: basesIn[basePos[e]]
  const uint32_t* basePos = nullptr;  // [numExperts]
  uint32_t chunk = 256;
  uint32_t maxChunks = 1;
  uint32_t* hist = nullptr;          // [numExperts * maxChunks]
  uint32_t* expertTotals = nullptr;  // [numExperts]
  int64_t* remoteFan = nullptr;      // [maxSlots] packed like the slot lists
  // The send side's first bad slot: an invalid routing has no slot lists to walk (the send side
  // wrote none), so the fan steps write nothing.
  const unsigned long long* badSlot = nullptr;
};

template <typename F>
FUSCO_HD inline void walkChunk(const FanArgs& a, uint64_t c, F f) {
  if (*a.badSlot != kNoBadSlot) return;
  const uint64_t total = *a.slotCount;
  const uint64_t start = c * a.chunk;
  if (start >= total || total > a.maxSlots) return;
  const uint64_t end = start + a.chunk < total ? start + a.chunk : total;
  for (uint64_t i = start; i < end; ++i) {
    const uint32_t e = static_cast<uint32_t>(a.expert[i]);
    if (e < a.numExperts) f(e, i);
  }
}

// Chunk c: its entries per expert, into the (expert, chunk) table (RecvArgs: the entries that
// arrive; FanArgs: this rank's own slots).
template <typename Args>
struct CountChunk {
  Args a;
  FUSCO_HD void operator()(uint64_t c) const {
    uint32_t* h = a.hist;
    const uint32_t m = a.maxChunks;
    walkChunk(a, c, [h, m, c](uint32_t e, uint64_t) { ++h[e * static_cast<uint64_t>(m) + c]; });
  }
};

struct FanOwnChunk {
  FanArgs a;
  FUSCO_HD void operator()(uint64_t c) const {
    uint32_t* h = a.hist;
    const uint32_t m = a.maxChunks;
    const int64_t* base = a.basesIn;
    const uint32_t* pos = a.basePos;
    int64_t* out = a.remoteFan;
    walkChunk(a, c, [h, m, c, base, pos, out](uint32_t e, uint64_t i) {
      out[i] = base[pos[e]] + h[e * static_cast<uint64_t>(m) + c]++;
    });
  }
};

// The pipelines, for an executor X with
//   X.forEach(n, dynCount, f): f(i) for i < n, and i < *dynCount when dynCount is not null;
//   X.scan(data, nseg, segLen, totals): exclusive scan of each segment in place, its sum in
//     totals[seg];
//   X.zero(p, bytes).
// Send side: everything but the terms' rows (which need the receivers' fan rows).
template <typename X>
void planSendSteps(X& x, const SendArgs& a) {
  const uint64_t tr = a.nranks * a.numTokens;
  x.zero(a.rowsTR, tr * sizeof(uint32_t));
  x.zero(a.slotsTR, tr * sizeof(uint32_t));
  if (a.countsMsg != nullptr) x.zero(a.countsMsg, (a.numExperts + 2 * a.nranks) * sizeof(uint32_t));
  x.forEach(1, nullptr, ResetBadSlot{a});
  x.forEach(a.numTokens, nullptr, CountToken{a});
  x.scan(a.rowsTR, a.nranks, a.numTokens, a.rowOff);
  x.scan(a.slotsTR, a.nranks, a.numTokens, a.slotOff);
  x.scan(a.rowOff, 1, a.nranks, a.rowOff + a.nranks);
  x.scan(a.slotOff, 1, a.nranks, a.slotOff + a.nranks);
  x.scan(a.termStart, 1, a.numTokens, a.termStart + a.numTokens);
  x.forEach(a.numTokens, nullptr, WriteToken{a});
  x.forEach(a.nranks, nullptr, CloseRank{a});
}

template <typename X>
void planTermRowSteps(X& x, const SendArgs& a, const int64_t* remoteFan) {
  x.forEach(a.numTokens * a.topk, a.termStart + a.numTokens, TermRow{a, remoteFan});
}

template <typename X>
void planRecvSteps(X& x, const RecvArgs& a) {
  x.zero(a.hist, static_cast<uint64_t>(a.numLocal) * a.maxChunks * sizeof(uint32_t));
  x.zero(a.errors, sizeof(uint32_t));
  x.forEach(a.nranks, nullptr, SourceSizes{a});
  x.scan(a.rowOffFrom, 1, a.nranks, a.rowOffFrom + a.nranks);
  x.scan(a.entryOff, 1, a.nranks, a.entryOff + a.nranks);
  x.forEach(a.maxChunks, nullptr, CountChunk<RecvArgs>{a});
  x.scan(a.hist, a.numLocal, a.maxChunks, a.expertCount);
  x.forEach(a.numLocal, nullptr, PadBlock{a});
  x.scan(a.padded, 1, a.numLocal, a.totals);
  x.scan(a.padFlag, 1, a.numLocal, a.totals + 1);
  x.forEach(a.numLocal, nullptr, WriteBlock{a});
  x.forEach(a.maxChunks, nullptr, FanChunk{a});
  x.forEach(a.maxRows + a.nranks, a.rowOffFrom + a.nranks, FanStart{a});
}

// A layer plan's receive layout from the count messages (countsIn): block sizes, starts, padding
// and each source's bases (basesOut).
template <typename X>
void planLayoutSteps(X& x, const RecvArgs& a) {
  x.forEach(a.numLocal, nullptr, CountsTotals{a});
  x.forEach(a.numLocal, nullptr, PadBlock{a});
  x.scan(a.padded, 1, a.numLocal, a.totals);
  x.scan(a.padFlag, 1, a.numLocal, a.totals + 1);
  x.forEach(a.numLocal, nullptr, WriteBlock{a});
  x.forEach(a.numLocal, nullptr, SourceBases{a});
  x.forEach(a.numLocal > 0 ? a.numLocal : 1, nullptr, FinishLayout{a});
}

// A layer plan's fan rows at the source (remoteFan) from the destinations' bases, then the sum
// terms' rows.
template <typename X>
void planFanSteps(X& x, const FanArgs& f, const SendArgs& a) {
  x.zero(f.hist, static_cast<uint64_t>(f.numExperts) * f.maxChunks * sizeof(uint32_t));
  x.forEach(f.maxChunks, nullptr, CountChunk<FanArgs>{f});
  x.scan(f.hist, f.numExperts, f.maxChunks, f.expertTotals);
  x.forEach(f.maxChunks, nullptr, FanOwnChunk{f});
  planTermRowSteps(x, a, f.remoteFan);
}

}  // namespace gplan
}  // namespace fusco
