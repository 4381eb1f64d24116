// The NODE dedup planner (node_plan.h). Linear in the rows and metadata words it touches.
#include "plan/node_plan.h"

#include "core/result.h"

namespace fusco {

std::vector<NodeSegment> nodeSegments(const NodeMap& nodes, const BalancePlan& plan) {
  std::vector<NodeSegment> segs;
  size_t count = 0;
  for (const auto& routes : plan.routes) count += routes.size();
  segs.reserve(count);
  for (int s = 0; s < nodes.nranks; ++s) {
    for (int node = 0; node < nodes.numNodes; ++node) {
      const size_t at = static_cast<size_t>(s) * nodes.numNodes + node;
      if (at >= plan.routes.size()) continue;
      uint64_t pos = 0;
      for (size_t g = 0; g < plan.routes[at].size(); ++g) {
        const RailRoute& r = plan.routes[at][g];
        if (r.rows == 0) continue;
        NodeSegment seg;
        seg.src = s;
        seg.node = node;
        seg.route = static_cast<int>(g);
        seg.relay = r.relay;
        seg.forwarder = r.forwarder;
        seg.pos0 = pos;
        seg.rows = r.rows;
        segs.push_back(seg);
        pos += r.rows;
      }
    }
  }
  return segs;
}

void nodeTokensOf(const MoeShape& shape, const NodeMap& nodes, const int64_t* topkIdx,
                  size_t numTokens, int topk, std::vector<std::vector<int64_t>>* nodeTokens) {
  nodeTokens->assign(nodes.numNodes, {});
  std::vector<int64_t> last(nodes.numNodes, -1);
  for (size_t t = 0; t < numTokens; ++t) {
    for (int k = 0; k < topk; ++k) {
      const int64_t e = topkIdx[t * topk + k];
      if (e < 0 || e >= shape.numExperts) continue;
      const int node = nodes.nodeOf[shape.expertToRank[e]];
      if (last[node] == static_cast<int64_t>(t)) continue;
      last[node] = static_cast<int64_t>(t);
      (*nodeTokens)[node].push_back(static_cast<int64_t>(t));
    }
  }
}

void planNodeSend(const NodeMap& nodes, int rank, const MoeSendPlan& rankPlan,
                  const std::vector<NodeSegment>& segs, NodeSendPlan* out) {
  out->segs.clear();
  out->fwdMeta.assign(nodes.nranks, {});
  // Cursors into the RANK plan of every destination rank: rows and metadata words.
  std::vector<size_t> row(nodes.nranks, 0), word(nodes.nranks, 0);
  for (size_t i = 0; i < segs.size(); ++i) {
    const NodeSegment& g = segs[i];
    if (g.src != rank) continue;
    out->segs.push_back(i);
    const auto& tokens = out->nodeTokens[g.node];
    const auto& local = nodes.ranksOfNode[g.node];
    auto& meta = out->fwdMeta[g.forwarder];
    for (uint64_t j = g.pos0; j < g.pos0 + g.rows && j < tokens.size(); ++j) {
      const int64_t t = tokens[j];
      const size_t countAt = meta.size();
      meta.push_back(0);
      for (size_t lr = 0; lr < local.size(); ++lr) {
        const int r = local[lr];
        if (row[r] >= rankPlan.rows[r].size() || rankPlan.rows[r][row[r]] != t) continue;
        const auto& rm = rankPlan.meta[r];
        const int32_t m = rm[word[r]];
        meta.push_back(static_cast<int32_t>(lr));
        meta.insert(meta.end(), rm.begin() + word[r], rm.begin() + word[r] + 1 + m);
        word[r] += 1 + m;
        ++row[r];
        ++meta[countAt];
      }
    }
  }
}

namespace {

// Reads the forward metadata of one segment (g.rows rows) from words [*at, end) of `from`.
fuscoResult_t readSegment(const MoeShape& shape, const NodeMap& nodes, const NodeSegment& g,
                          const std::vector<int32_t>& from, size_t* at, NodeFwdSeg* f) {
  const auto& local = nodes.ranksOfNode[g.node];
  const int ls = static_cast<int>(local.size());
  f->rowsTo.assign(ls, {});
  f->meta.assign(ls, {});
  f->termStart.assign(1, 0);
  auto bad = [&](const char* what) {
    return FUSCO_FAIL(fuscoRemoteError, kPlan,
                      "fuscoMoePlan: rank %d sent malformed forward metadata (%s) for route %d",
                      g.src, what, g.route);
  };
  for (uint64_t i = 0; i < g.rows; ++i) {
    if (*at >= from.size()) return bad("truncated");
    const int32_t d = from[(*at)++];
    if (d < 1 || d > ls) return bad("bad rank count");
    int prev = -1;
    for (int32_t j = 0; j < d; ++j) {
      if (*at + 2 > from.size()) return bad("truncated");
      const int32_t lr = from[(*at)++], m = from[*at];
      if (lr <= prev || lr >= ls) return bad("local rank out of order or range");
      prev = lr;
      const int nLocal = static_cast<int>(shape.localExperts[local[lr]].size());
      if (m < 1 || m > nLocal || *at + 1 + m > from.size()) return bad("bad expert count");
      f->meta[lr].insert(f->meta[lr].end(), from.begin() + *at, from.begin() + *at + 1 + m);
      *at += 1 + m;
      f->termLr.push_back(lr);
      f->termIdx.push_back(static_cast<uint32_t>(f->rowsTo[lr].size()));
      f->rowsTo[lr].push_back(static_cast<int64_t>(i));
    }
    // termStart and termIdx are 32-bit (every term index is below termLr.size()).
    if (f->termLr.size() > UINT32_MAX) return bad("more than 2^32 rows");
    f->termStart.push_back(static_cast<uint32_t>(f->termLr.size()));
  }
  return fuscoSuccess;
}

// Rows in RANK-format metadata (per row a count m >= 1, then m words); SIZE_MAX if malformed.
size_t metaRows(const int32_t* meta, size_t len) {
  size_t rows = 0;
  for (size_t i = 0; i < len; ++rows) {
    if (meta[i] < 1 || static_cast<size_t>(meta[i]) > len - i - 1) return SIZE_MAX;
    i += 1 + static_cast<size_t>(meta[i]);
  }
  return rows;
}

}  // namespace

fuscoResult_t planNodeForward(const MoeShape& shape, const NodeMap& nodes, int rank,
                              const std::vector<NodeSegment>& segs,
                              const std::vector<std::vector<int32_t>>& metaFrom,
                              std::vector<NodeFwdSeg>* out) {
  out->clear();
  std::vector<size_t> at(nodes.nranks, 0);
  for (size_t i = 0; i < segs.size(); ++i) {
    const NodeSegment& g = segs[i];
    if (g.forwarder != rank) continue;
    NodeFwdSeg f;
    f.seg = i;
    FUSCO_CHECK(readSegment(shape, nodes, g, metaFrom[g.src], &at[g.src], &f));
    out->push_back(std::move(f));
  }
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
  const int myNode = nodes.nodeOf[rank];
  struct Block {
    size_t word = 0, len = 0, rows = 0;
  };
  std::vector<Block> blocks(segs.size());
  std::vector<size_t> at(nodes.nranks, 0);
  // Pass 1: every forwarder's blocks, in the order it wrote them.
  for (size_t i = 0; i < segs.size(); ++i) {
    const NodeSegment& g = segs[i];
    if (g.node != myNode) continue;
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
    blocks[i] = Block{w + 4, static_cast<size_t>(b[w + 3]), static_cast<size_t>(b[w + 2])};
    w += 4 + blocks[i].len;
  }
  for (int f : nodes.ranksOfNode[myNode])
    if (at[f] != blocksFrom[f].size())
      return FUSCO_FAIL(fuscoRemoteError, kPlan,
                        "fuscoMoePlan: forwarder rank %d sent %zu block words, %zu expected", f,
                        blocksFrom[f].size(), at[f]);
  // Pass 2: per source, its segments in route order.
  inFrom->assign(nodes.nranks, {});
  std::vector<size_t> rowsSoFar(nodes.nranks, 0);
  for (size_t i = 0; i < segs.size(); ++i) {
    const NodeSegment& g = segs[i];
    if (g.node != myNode) continue;
    const auto& b = blocksFrom[g.forwarder];
    auto& m = (*metaFrom)[g.src];
    m.insert(m.end(), b.begin() + blocks[i].word, b.begin() + blocks[i].word + blocks[i].len);
    (*inFrom)[g.forwarder].push_back(NodeInSeg{i, rowsSoFar[g.src], blocks[i].rows});
    rowsSoFar[g.src] += blocks[i].rows;
  }
  return fuscoSuccess;
}

}  // namespace fusco
