// The NODE dedup planner (node_plan.h). Every rank holds all segments (ordered by src, node,
// route); each step finds its own through binary searches on that order, so its cost follows the
// segments and rows it touches, not the size of the communicator.
#include "plan/node_plan.h"

#include <algorithm>
#include <utility>

#include "core/result.h"

namespace fusco {

namespace {

constexpr size_t kNoRow = SIZE_MAX;

// Set bits of x, without a library call where the target has no popcount instruction.
inline size_t popcount64(uint64_t x) {
  x = x - ((x >> 1) & 0x5555555555555555ull);
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return static_cast<size_t>((x * 0x0101010101010101ull) >> 56);
}

// Rows of a segment that exist in its node's token list of `size` tokens: [pos0, end).
uint64_t segRowsEnd(const NodeSegment& g, size_t size) {
  return std::min<uint64_t>(g.pos0 + g.rows, size);
}

// Rows in RANK-format metadata (per row a count m in [1, maxM], then m words); SIZE_MAX if
// malformed.
size_t metaRows(const int32_t* meta, size_t len, int32_t maxM = INT32_MAX) {
  size_t rows = 0;
  for (size_t i = 0; i < len; ++rows) {
    if (meta[i] < 1 || meta[i] > maxM || static_cast<size_t>(meta[i]) > len - i - 1)
      return SIZE_MAX;
    i += 1 + static_cast<size_t>(meta[i]);
  }
  return rows;
}

// Sets tokenRow[t], for the tokens of segments [a, b) (one node, route order), to where the token
// goes: (i - a) << 32 | its row within segment i (mark), or back to kNoRow.
void markRows(const std::vector<NodeSegment>& segs, size_t a, size_t b,
              const std::vector<int64_t>& tokens, bool mark, std::vector<size_t>* tokenRow) {
  const uint64_t n = tokenRow->size();
  for (size_t i = a; i < b; ++i) {
    const uint64_t end = segRowsEnd(segs[i], tokens.size());
    for (uint64_t j = segs[i].pos0; j < end; ++j) {
      const uint64_t t = static_cast<uint64_t>(tokens[j]);
      if (t < n) (*tokenRow)[t] = mark ? (i - a) << 32 | (j - segs[i].pos0) : kNoRow;
    }
  }
}

// Calls fn(lr, where, meta, m) for every RANK row sent to local rank lr of `local` whose token is
// marked (where = tokenRow[t]), rank by rank and in row order; meta points at that RANK row's
// metadata (m, then m local experts), found through kStart (row i covers slots [kStart[i],
// kStart[i + 1]) and starts at word i + kStart[i]).
template <class Fn>
void forEachRankRow(const std::vector<int>& local, const MoeSendPlan& plan,
                    const std::vector<size_t>& tokenRow, Fn fn) {
  const uint64_t n = tokenRow.size();
  for (size_t lr = 0; lr < local.size(); ++lr) {
    if (static_cast<size_t>(local[lr]) >= plan.rows.size() ||
        static_cast<size_t>(local[lr]) >= plan.kStart.size() ||
        static_cast<size_t>(local[lr]) >= plan.meta.size())
      continue;  // not planSend's output for this communicator
    const std::vector<int64_t>& rows = plan.rows[local[lr]];
    const uint32_t* kStart = plan.kStart[local[lr]].data();
    const int32_t* meta = plan.meta[local[lr]].data();
    if (plan.kStart[local[lr]].size() != rows.size() + 1 ||
        plan.meta[local[lr]].size() != rows.size() + kStart[rows.size()])
      continue;  // not planSend's output
    for (size_t i = 0; i < rows.size(); ++i) {
      const uint64_t t = static_cast<uint64_t>(rows[i]);
      if (t >= n || tokenRow[t] == kNoRow) continue;
      fn(lr, tokenRow[t], meta + i + kStart[i], kStart[i + 1] - kStart[i]);
    }
  }
}

// The forward metadata of segments [a, b) of one source (all to one node, route order) appended to
// their forwarders' lists: per segment, per local rank lr, [c, c rows of the segment, w, w words of
// lr's RANK metadata for them]. Rank-major, so every loop is long and regular: each block's size
// first, then the blocks. filled[f]: the words of f's list written so far (kNoRow: none yet).
void planNodeGroup(const std::vector<int>& local, const MoeSendPlan& plan,
                   const std::vector<NodeSegment>& segs, size_t a, size_t b,
                   const std::vector<int64_t>& tokens, NodeSendPlan::Scratch* s,
                   std::vector<size_t>* filled, std::vector<std::vector<int32_t>>* fwdMeta) {
  const size_t ls = local.size(), blocks = (b - a) * ls;
  markRows(segs, a, b, tokens, true, &s->tokenRow);
  // Per block k = (segment i - a, local rank lr): rows at 2k, metadata words at 2k + 1.
  s->blockSize.assign(2 * blocks, 0);
  uint64_t* size = s->blockSize.data();
  forEachRankRow(local, plan, s->tokenRow,
                 [size, ls](size_t lr, size_t where, const int32_t*, uint32_t m) {
                   const size_t k = (where >> 32) * ls + lr;
                   size[2 * k] += 1;
                   size[2 * k + 1] += 1 + m;
                 });
  // Where each segment starts in its forwarder's list; every list is resized once, before any
  // pointer into it is taken.
  s->segStart.resize(b - a);
  for (size_t i = a; i < b; ++i) {
    size_t& end = (*filled)[segs[i].forwarder];
    if (end == kNoRow) end = 0;
    s->segStart[i - a] = end;
    for (size_t k = (i - a) * ls; k < (i - a + 1) * ls; ++k)
      end += 2 + size[2 * k] + size[2 * k + 1];
  }
  for (size_t i = a; i < b; ++i) (*fwdMeta)[segs[i].forwarder].resize((*filled)[segs[i].forwarder]);
  // Each block's count words, and write cursors: blockAt[2k] for its rows, [2k + 1] for its words.
  s->blockAt.resize(2 * blocks);
  int32_t** at = s->blockAt.data();
  for (size_t i = a; i < b; ++i) {
    int32_t* p = (*fwdMeta)[segs[i].forwarder].data() + s->segStart[i - a];
    for (size_t k = (i - a) * ls; k < (i - a + 1) * ls; ++k) {
      *p++ = static_cast<int32_t>(size[2 * k]);
      at[2 * k] = p;
      p += size[2 * k];
      *p++ = static_cast<int32_t>(size[2 * k + 1]);
      at[2 * k + 1] = p;
      p += size[2 * k + 1];
    }
  }
  forEachRankRow(
      local, plan, s->tokenRow, [at, ls](size_t lr, size_t where, const int32_t* meta, uint32_t m) {
        const size_t k = (where >> 32) * ls + lr;
        *at[2 * k]++ = static_cast<int32_t>(where & 0xffffffffu);
        int32_t* d = at[2 * k + 1];
        d[0] = meta[0];
        d[1] = meta[1];  // m >= 1; m == 1 (one expert per rank and row) is by far the common case
        for (uint32_t w = 2; w <= m; ++w) d[w] = meta[w];
        at[2 * k + 1] = d + 1 + m;
      });
  markRows(segs, a, b, tokens, false, &s->tokenRow);
}

}  // namespace

void nodeSegmentsInto(const NodeMap& nodes, const BalancePlan& plan,
                      std::vector<NodeSegment>* out) {
  size_t count = 0;
  for (const auto& routes : plan.routes) count += routes.size();
  out->resize(count);  // an upper bound: routes of 0 rows are left out
  NodeSegment* seg = out->data();
  const size_t nn = static_cast<size_t>(nodes.numNodes);
  for (int s = 0; s < nodes.nranks; ++s) {
    for (size_t node = 0; node < nn; ++node) {
      const size_t at = static_cast<size_t>(s) * nn + node;
      if (at >= plan.routes.size()) continue;
      uint64_t pos = 0;
      const std::vector<RailRoute>& routes = plan.routes[at];
      for (size_t g = 0; g < routes.size(); ++g) {
        const RailRoute& r = routes[g];
        if (r.rows == 0) continue;
        *seg++ = NodeSegment{
            s, static_cast<int>(node), static_cast<int>(g), r.relay, r.forwarder, pos, r.rows};
        pos += r.rows;
      }
    }
  }
  out->resize(static_cast<size_t>(seg - out->data()));
}

std::pair<size_t, size_t> segmentsOf(const std::vector<NodeSegment>& segs, int src, int node) {
  auto before = [src, node](const NodeSegment& g) {
    return g.src < src || (node >= 0 && g.src == src && g.node < node);
  };
  auto upTo = [src, node](const NodeSegment& g) {
    return g.src < src || (g.src == src && (node < 0 || g.node <= node));
  };
  const auto lo = std::partition_point(segs.begin(), segs.end(), before);
  const auto hi = std::partition_point(lo, segs.end(), upTo);
  return {static_cast<size_t>(lo - segs.begin()), static_cast<size_t>(hi - segs.begin())};
}

std::vector<NodeSegment> nodeSegments(const NodeMap& nodes, const BalancePlan& plan) {
  std::vector<NodeSegment> segs;
  nodeSegmentsInto(nodes, plan, &segs);
  return segs;
}

void nodeTokensOf(const MoeShape& shape, const NodeMap& nodes, const int64_t* topkIdx,
                  size_t numTokens, int topk, std::vector<std::vector<int64_t>>* nodeTokens) {
  const int nn = nodes.numNodes;
  std::vector<int> nodeOfExpert(shape.numExperts);
  for (int e = 0; e < shape.numExperts; ++e) nodeOfExpert[e] = nodes.nodeOf[shape.expertToRank[e]];
  const uint64_t numExperts = static_cast<uint64_t>(shape.numExperts);
  if (topk <= 0) numTokens = 0;
  // A count pass sizes every list exactly (a reused list keeps its storage), then a fill pass.
  // Both are branch-free per slot: a token's later slots on a node it already has count nothing
  // and write to `sink`.
  struct Cursor {
    int64_t last;
    size_t count;
    int64_t* at;
  };
  std::vector<Cursor> cur(nn, Cursor{-1, 0, nullptr});
  for (size_t t = 0; t < numTokens; ++t) {
    const int64_t* row = topkIdx + t * topk;
    for (int k = 0; k < topk; ++k) {
      if (static_cast<uint64_t>(row[k]) >= numExperts) continue;  // -1: dropped
      Cursor& c = cur[nodeOfExpert[row[k]]];
      c.count += c.last != static_cast<int64_t>(t);
      c.last = static_cast<int64_t>(t);
    }
  }
  nodeTokens->resize(nn);
  for (int n = 0; n < nn; ++n) {
    (*nodeTokens)[n].resize(cur[n].count);
    cur[n].last = -1;
    cur[n].at = (*nodeTokens)[n].data();
  }
  int64_t sink = 0;
  for (size_t t = 0; t < numTokens; ++t) {
    const int64_t* row = topkIdx + t * topk;
    for (int k = 0; k < topk; ++k) {
      if (static_cast<uint64_t>(row[k]) >= numExperts) continue;
      Cursor& c = cur[nodeOfExpert[row[k]]];
      const bool fresh = c.last != static_cast<int64_t>(t);
      *(fresh ? c.at : &sink) = static_cast<int64_t>(t);
      c.at += fresh;
      c.last = static_cast<int64_t>(t);
    }
  }
}

void nodeTokensOf(const NodeMap& nodes, const MoeSendPlan& plan,
                  std::vector<std::vector<int64_t>>* nodeTokens) {
  // One bit per token, node by node: set from the rows sent to the node's ranks (a token sent to
  // several of them, or several times under NONE, sets it once), counted, then read back in
  // ascending order and cleared for the next node.
  const uint64_t numTokens = plan.numTokens;
  std::vector<uint64_t> bits((numTokens + 63) / 64, 0);
  nodeTokens->resize(nodes.numNodes);
  for (int n = 0; n < nodes.numNodes; ++n) {
    for (int r : nodes.ranksOfNode[n]) {
      if (static_cast<size_t>(r) >= plan.rows.size()) continue;
      for (const int64_t t : plan.rows[r])
        if (static_cast<uint64_t>(t) < numTokens) bits[t >> 6] |= uint64_t{1} << (t & 63);
    }
    size_t count = 0;
    for (const uint64_t b : bits) count += popcount64(b);
    std::vector<int64_t>& out = (*nodeTokens)[n];
    out.resize(count);
    int64_t* at = out.data();
    for (size_t w = 0; w < bits.size(); ++w) {
      for (uint64_t b = bits[w]; b != 0; b &= b - 1)
        *at++ = static_cast<int64_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(b)));
      bits[w] = 0;
    }
  }
}

uint64_t remoteNodeRows(const NodeMap& nodes, int rank,
                        const std::vector<std::vector<int64_t>>& nodeTokens, uint64_t* out) {
  uint64_t total = 0;
  for (int node = 0; node < nodes.numNodes; ++node) {
    const bool remote = node != nodes.nodeOf[rank] && static_cast<size_t>(node) < nodeTokens.size();
    out[node] = remote ? nodeTokens[node].size() : 0;
    total += out[node];
  }
  return total;
}

void planNodeSend(const NodeMap& nodes, int rank, const MoeSendPlan& rankPlan,
                  const std::vector<NodeSegment>& segs, NodeSendPlan* out) {
  const auto [first, last] = segmentsOf(segs, rank);
  out->segs.clear();
  for (size_t i = first; i < last; ++i) out->segs.push_back(i);
  out->scratch.tokenRow.assign(rankPlan.numTokens, kNoRow);
  out->fwdMeta.resize(nodes.nranks);
  std::vector<size_t> filled(nodes.nranks, kNoRow);
  const std::vector<int64_t> none;
  // This rank's segments are ordered by node: one group per destination node.
  for (size_t a = first, b = first; a < last; a = b) {
    const int node = segs[a].node;
    while (b < last && segs[b].node == node) ++b;
    const bool listed = static_cast<size_t>(node) < out->nodeTokens.size();
    planNodeGroup(nodes.ranksOfNode[node], rankPlan, segs, a, b,
                  listed ? out->nodeTokens[node] : none, &out->scratch, &filled, &out->fwdMeta);
  }
  for (int f = 0; f < nodes.nranks; ++f)
    if (filled[f] == kNoRow) out->fwdMeta[f].clear();
}

namespace {

// Reads the forward metadata of one segment (g.rows rows) from words [*at, end) of `from`: per
// local rank lr, [c, c ascending rows of the segment, w, w words of RANK metadata for them]. Each
// block is checked and copied whole; the combine terms (per row, the local ranks holding it, in
// ascending order) follow from the row lists by counting. Kept storage is reused, so a forwarder
// plans layer after layer without allocating once sizes settle.
fuscoResult_t readSegment(const MoeShape& shape, const NodeMap& nodes, const NodeSegment& g,
                          const std::vector<int32_t>& from, size_t* at, NodeFwdSeg* f) {
  const auto& local = nodes.ranksOfNode[g.node];
  const size_t ls = local.size();
  auto bad = [&](const char* what) {
    return FUSCO_FAIL(fuscoRemoteError, kPlan,
                      "fuscoMoePlan: rank %d sent malformed forward metadata (%s) for route %d",
                      g.src, what, g.route);
  };
  // termStart and termIdx are 32-bit.
  if (g.rows >= UINT32_MAX) return bad("more than 2^32 rows");
  // Every row costs at least 3 words (its index, then m and one expert): check that before sizing
  // anything by the row count, which comes from counts other ranks reported.
  if (*at > from.size() || g.rows > (from.size() - *at) / 3) return bad("truncated");
  f->rowsTo.resize(ls);
  f->meta.resize(ls);
  f->termStart.assign(g.rows + 1, 0);
  uint32_t* count = f->termStart.data() + 1;  // terms of each row, then prefix sums
  const int32_t* const base = from.data();
  const size_t size = from.size();
  size_t w = *at, terms = 0;
  for (size_t lr = 0; lr < ls; ++lr) {
    if (w >= size) return bad("truncated");
    const int64_t c = base[w++];
    if (c < 0 || static_cast<uint64_t>(c) > g.rows || static_cast<size_t>(c) > size - w)
      return bad("bad row count");
    std::vector<int64_t>& rows = f->rowsTo[lr];
    rows.resize(static_cast<size_t>(c));
    int64_t prev = -1;
    for (int64_t i = 0; i < c; ++i) {
      const int64_t row = base[w + i];
      if (row <= prev || static_cast<uint64_t>(row) >= g.rows)
        return bad("rows out of order or range");
      rows[i] = prev = row;
      ++count[row];
    }
    w += static_cast<size_t>(c);
    if (w >= size) return bad("truncated");
    const int64_t words = base[w++];
    if (words < 0 || static_cast<size_t>(words) > size - w) return bad("truncated");
    // RANK-format metadata of exactly c rows, each naming 1 .. (lr's local experts) experts.
    const int32_t nLocal = static_cast<int32_t>(shape.localExperts[local[lr]].size());
    const int32_t* meta = base + w;
    const size_t metaRowsSeen = metaRows(meta, static_cast<size_t>(words), nLocal);
    if (metaRowsSeen == SIZE_MAX) return bad("bad expert count");
    if (metaRowsSeen != static_cast<size_t>(c))
      return bad("metadata rows differ from the row count");
    f->meta[lr].assign(meta, meta + words);
    w += static_cast<size_t>(words);
    terms += static_cast<size_t>(c);
  }
  if (terms > UINT32_MAX) return bad("more than 2^32 terms");
  uint32_t* start = f->termStart.data();
  for (uint64_t i = 0; i < g.rows; ++i) {
    if (count[i] == 0) return bad("a row no local rank needs");
    start[i + 1] += start[i];
  }
  // Fill: local ranks ascending, so each row's terms are too; start[i] walks up to start[i + 1]
  // and is then moved back.
  f->termLr.resize(terms);
  f->termIdx.resize(terms);
  int32_t* termLr = f->termLr.data();
  uint32_t* termIdx = f->termIdx.data();
  for (size_t lr = 0; lr < ls; ++lr) {
    const std::vector<int64_t>& rows = f->rowsTo[lr];
    for (size_t i = 0; i < rows.size(); ++i) {
      const uint32_t t = start[rows[i]]++;
      termLr[t] = static_cast<int32_t>(lr);
      termIdx[t] = static_cast<uint32_t>(i);
    }
  }
  for (uint64_t i = g.rows; i > 0; --i) start[i] = start[i - 1];
  start[0] = 0;
  *at = w;
  return fuscoSuccess;
}

}  // namespace

fuscoResult_t planNodeForward(const MoeShape& shape, const NodeMap& nodes, int rank,
                              const std::vector<NodeSegment>& segs,
                              const std::vector<std::vector<int32_t>>& metaFrom,
                              std::vector<NodeFwdSeg>* out) {
  if (static_cast<int>(metaFrom.size()) != nodes.nranks) {
    return FUSCO_FAIL(fuscoInternalError, kPlan,
                      "fuscoMoePlan: forward metadata from %zu ranks, expected %d", metaFrom.size(),
                      nodes.nranks);
  }
  // out's elements are reused (their lists keep their storage); extras are dropped at the end.
  size_t count = 0;
  std::vector<size_t> at(nodes.nranks, 0);
  // This rank forwards only segments into its own node: per source, one range of routes.
  const int myNode = nodes.nodeOf[rank];
  for (int s = 0; s < nodes.nranks; ++s) {
    const auto [first, last] = segmentsOf(segs, s, myNode);
    for (size_t i = first; i < last; ++i) {
      const NodeSegment& g = segs[i];
      if (g.forwarder != rank) continue;
      if (count == out->size()) out->emplace_back();
      NodeFwdSeg& f = (*out)[count++];
      f.seg = i;
      const fuscoResult_t r = readSegment(shape, nodes, g, metaFrom[g.src], &at[g.src], &f);
      if (r != fuscoSuccess) {
        out->resize(count - 1);  // only segments read whole stay
        return r;
      }
    }
  }
  out->resize(count);
  for (int s = 0; s < nodes.nranks; ++s) {
    if (nodes.sameNode(s, rank) || at[s] == metaFrom[s].size()) continue;
    return FUSCO_FAIL(fuscoRemoteError, kPlan,
                      "fuscoMoePlan: rank %d sent %zu forward metadata words, %zu expected", s,
                      metaFrom[s].size(), at[s]);
  }
  return fuscoSuccess;
}

void nodeBlocksFor(const std::vector<NodeFwdSeg>& fwd, const std::vector<NodeSegment>& segs, int lr,
                   std::vector<int32_t>* out) {
  out->clear();
  for (const NodeFwdSeg& f : fwd) {
    out->push_back(segs[f.seg].src);
    out->push_back(segs[f.seg].route);
    out->push_back(static_cast<int32_t>(f.rowsTo[lr].size()));
    out->push_back(static_cast<int32_t>(f.meta[lr].size()));
    out->insert(out->end(), f.meta[lr].begin(), f.meta[lr].end());
  }
}

fuscoResult_t planNodeReceive(const NodeMap& nodes, int rank, const std::vector<NodeSegment>& segs,
                              const std::vector<std::vector<int32_t>>& blocksFrom,
                              std::vector<std::vector<int32_t>>* metaFrom,
                              std::vector<std::vector<NodeInSeg>>* inFrom) {
  if (static_cast<int>(blocksFrom.size()) != nodes.nranks ||
      static_cast<int>(metaFrom->size()) != nodes.nranks) {
    return FUSCO_FAIL(fuscoInternalError, kPlan,
                      "fuscoMoePlan: blocks from %zu ranks and metadata for %zu, expected %d",
                      blocksFrom.size(), metaFrom->size(), nodes.nranks);
  }
  const int myNode = nodes.nodeOf[rank];
  // The segments into this node, in global order: per source, one range of routes.
  struct Block {
    size_t seg = 0, word = 0, len = 0, rows = 0;
  };
  std::vector<Block> blocks;
  for (int s = 0; s < nodes.nranks; ++s) {
    const auto [first, last] = segmentsOf(segs, s, myNode);
    for (size_t i = first; i < last; ++i) blocks.push_back(Block{i, 0, 0, 0});
  }
  std::vector<size_t> at(nodes.nranks, 0);
  // Pass 1: every forwarder's blocks, in the order it wrote them.
  for (Block& k : blocks) {
    const NodeSegment& g = segs[k.seg];
    const auto& b = blocksFrom[g.forwarder];
    size_t& w = at[g.forwarder];
    // The row count sizes this rank's views of src's fan rows (NodeInSeg): it must be the number
    // of rows the block's metadata describes, or those views run past the receive plan.
    if (w + 4 > b.size() || b[w] != g.src || b[w + 1] != g.route || b[w + 2] < 0 || b[w + 3] < 0 ||
        w + 4 + static_cast<size_t>(b[w + 3]) > b.size() ||
        metaRows(b.data() + w + 4, static_cast<size_t>(b[w + 3])) != static_cast<size_t>(b[w + 2]))
      return FUSCO_FAIL(
          fuscoRemoteError, kPlan,
          "fuscoMoePlan: forwarder rank %d sent a malformed block for rank %d's route %d",
          g.forwarder, g.src, g.route);
    k.word = w + 4;
    k.len = static_cast<size_t>(b[w + 3]);
    k.rows = static_cast<size_t>(b[w + 2]);
    w += 4 + k.len;
  }
  for (int f : nodes.ranksOfNode[myNode])
    if (at[f] != blocksFrom[f].size())
      return FUSCO_FAIL(fuscoRemoteError, kPlan,
                        "fuscoMoePlan: forwarder rank %d sent %zu block words, %zu expected", f,
                        blocksFrom[f].size(), at[f]);
  // Pass 2: per source, its segments in route order.
  inFrom->resize(nodes.nranks);
  for (auto& v : *inFrom) v.clear();
  std::vector<size_t> rowsSoFar(nodes.nranks, 0);
  for (const Block& k : blocks) {
    const NodeSegment& g = segs[k.seg];
    const auto& b = blocksFrom[g.forwarder];
    auto& m = (*metaFrom)[g.src];
    m.insert(m.end(), b.begin() + k.word, b.begin() + k.word + k.len);
    (*inFrom)[g.forwarder].push_back(NodeInSeg{k.seg, rowsSoFar[g.src], k.rows});
    rowsSoFar[g.src] += k.rows;
  }
  return fuscoSuccess;
}

}  // namespace fusco
