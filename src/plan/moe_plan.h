// The MoE planner: pure host code that turns router output (topkIdx) into the rows each rank
// sends and where each received row lands, deterministically (docs/API.md, "Dispatch output
// layout").
//
// Protocol (run by the API layer over the engine):
//   1. Each rank validates its routing and computes its send plan locally (planSend): per
//      destination rank, the token rows it sends (deduplicated per rank in RANK mode) and, per
//      row, the destination's local expert indices that row feeds, in k order (the wire metadata).
//   2. The metadata travels to each destination (an all-to-all of sizes, then of metadata).
//   3. Each rank computes its receive plan (planRecv) from every source's metadata alone: block
//      sizes, padding and, per received row, the final rows it is replicated into (k order).
// Combine mirrors it: the rows a rank received from s are reduced (weighted, k order) into one
// partial per row and sent back in the same order; the source sums partials over ranks of a node
// (rank ascending) and then over nodes (node ascending).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/topology.h"
#include "fusco.h"

namespace fusco {

enum class Dedup : int {
  None = FUSCO_DEDUP_NONE,
  Rank = FUSCO_DEDUP_RANK,
  Node = FUSCO_DEDUP_NODE
};
// "NONE", "RANK", "NODE" (for messages).
const char* dedupName(Dedup d);

// Runtime limits of the MoE config (docs/API.md, "MoE dispatch and combine"). A plan's own memory
// grows with numExperts (placement tables, per-expert counters), so it is bounded; padding costs
// one range per local expert whatever the alignment, and the alignment bound keeps the padded
// receive size a small multiple of what an expert can really use.
constexpr int kMaxExperts = 1 << 20;
constexpr int kMaxExpertAlignment = 1 << 16;

// Rows [start, start + count) of a buffer.
struct RowRange {
  int64_t start = 0;
  int64_t count = 0;
  bool operator==(const RowRange& o) const { return start == o.start && count == o.count; }
};

// The communicator's shape and the expert placement (same on every rank).
struct MoeShape {
  int nranks = 0;
  int numExperts = 0;
  std::vector<int> expertToRank;               // [numExperts]
  std::vector<std::vector<int>> localExperts;  // [nranks] global ids, ascending
  std::vector<int> localIndexOf;               // [numExperts] index of e among its rank's experts
  int expertAlignment = 1;                     // >= 1
};

// Builds the shape; placement == nullptr means contiguous blocks of numExperts / nranks.
// fuscoInvalidArgument (message says why) for numExperts outside [1, kMaxExperts], an alignment
// outside [0, kMaxExpertAlignment], numExperts % nranks != 0 without a placement, or a placement
// entry outside [0, nranks).
fuscoResult_t buildMoeShape(int nranks, int numExperts, const int* placement, int expertAlignment,
                            MoeShape* out);

// Checks topkIdx: every id in [-1, numExperts), no id twice within one token.
// fuscoInvalidArgument with a message naming the token and slot ("token 17 slot 3: ..."); the
// tokens are numbered from firstToken (a part of a routing checked on its own).
fuscoResult_t validateTopk(const MoeShape& shape, const int64_t* topkIdx, size_t numTokens,
                           int topk, size_t firstToken = 0);
// The part of validateTopk that reads no id: topk in [1, 255], a routing when there are tokens,
// at most 2^31 - 1 tokens (a planner that checks the ids elsewhere, e.g. on the device).
fuscoResult_t validateTopkLimits(const int64_t* topkIdx, size_t numTokens, int topk);

// What one rank sends in dispatch.
struct MoeSendPlan {
  // [nranks] token index of each row sent to rank r, in send order. RANK: each token once per
  // destination rank, ascending token. NONE: one row per (token, expert), ascending token, then k.
  std::vector<std::vector<int64_t>> rows;
  // [nranks] wire metadata for rank r: for each row, a count m followed by m local expert indices
  // of rank r in k order (the k order of the token's slots).
  std::vector<std::vector<int32_t>> meta;
  // [nranks] CSR: for row i sent to r, the topk slots k it covers are kSlots[r][kStart[r][i] ..
  // kStart[r][i+1]) in ascending k (combine uses them to pick weights and to sum in k order).
  std::vector<std::vector<uint32_t>> kStart;
  std::vector<std::vector<uint8_t>> kSlots;
  size_t numTokens = 0;
  int topk = 0;
  // planSendInto's working space, one record per valid slot bucketed by destination rank; kept so
  // a plan rebuilt every layer allocates only O(nranks) counters (planSend returns it empty).
  struct Slot {
    int64_t token;
    int32_t local;  // the expert's index among its rank's experts
    uint32_t k;     // the slot
  };
  std::vector<Slot> scratch;
};
MoeSendPlan planSend(const MoeShape& shape, int rank, const int64_t* topkIdx, size_t numTokens,
                     int topk, Dedup dedup);
// The same plan written into *out, reusing its vectors' capacity (once it has seen its largest
// layer, a plan rebuilt every layer allocates only O(nranks) counters). Expects validateTopk to
// have passed; ids outside the range are skipped.
void planSendInto(const MoeShape& shape, int rank, const int64_t* topkIdx, size_t numTokens,
                  int topk, Dedup dedup, MoeSendPlan* out);

// What one rank receives in dispatch.
struct MoeRecvPlan {
  size_t numRecvRows = 0;                     // including padding
  std::vector<int64_t> tokensPerLocalExpert;  // [numLocalExperts] rows before padding
  std::vector<int64_t> blockStart;            // [numLocalExperts] first row of each block
  std::vector<RowRange> padding;              // rows to zero-fill: one range per padded block
  int64_t paddingRowCount() const {
    int64_t n = 0;
    for (const RowRange& r : padding) n += r.count;
    return n;
  }
  // [nranks] CSR: row i received from s is written to fanRows[s][fanStart[s][i] ..
  // fanStart[s][i+1]) (k order of the source token), so rowsFrom(s) = fanStart[s].size() - 1.
  std::vector<std::vector<uint32_t>> fanStart;
  std::vector<std::vector<int64_t>> fanRows;
  size_t rowsFrom(int s) const { return fanStart[s].empty() ? 0 : fanStart[s].size() - 1; }
};
// metaFrom[s] is the metadata rank s sent to `rank` (may be empty). fuscoRemoteError with a message
// naming the source if it is malformed (count 0, index out of range, truncated, an expert twice
// in one row); *out is untouched on failure and its vectors' capacity is reused on success.
fuscoResult_t planRecv(const MoeShape& shape, int rank,
                       const std::vector<std::vector<int32_t>>& metaFrom, MoeRecvPlan* out);

// The terms of combine's sum at the source, read from the ranks' expert outputs (docs/API.md's
// tree on one node): per token, one group per rank that holds rows of it (rank ascending), closed
// by `last`; in a group, each of the token's (t, k) rows at that rank in the order the rank
// received them. start [numTokens + 1]; per term its rank, its row in that rank's expert output
// (remoteFanRows[r], the receiver's fan rows for this rank's slots), its weight index t*topk+k.
struct MoeSumTerms {
  std::vector<uint32_t> start, rank;
  std::vector<int64_t> row, weight;
  std::vector<uint8_t> last;
  // Each term's slot in this rank's packed slot order (every rank's slots, rank by rank): where
  // its row lies in the rows a peer pushes back in combine.
  std::vector<uint32_t> seq;
};
// Fills *out from this rank's send plan, reusing its vectors' capacity.
void planSumTerms(const MoeSendPlan& send, const std::vector<std::vector<int64_t>>& remoteFanRows,
                  MoeSumTerms* out);

// FUSCO_PLAN_TRACE: 1 logs describePlan's line for every plan, whatever the log level.
int64_t paramPlanTrace();

// One line summarizing a plan (FUSCO_PLAN_TRACE): rows per peer, bytes per path, dedup savings.
std::string describePlan(const MoeShape& shape, const NodeMap& nodes, int rank,
                         const MoeSendPlan& send, const MoeRecvPlan& recv, size_t rowBytes,
                         Dedup dedup);

}  // namespace fusco
