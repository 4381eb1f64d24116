// fuscoMoePlan's NODE dedup steps (node_plan.h has the protocol): every rank's token counts per
// node, the balancer (the same routes on every rank), the forward metadata to the forwarders and
// the forwarders' blocks to the ranks of their node.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/params.h"
#include "engine/engine.h"
#include "moe/moe_exec.h"

namespace fusco {

namespace {

// Every rank's words (all[s * words + i]), from each rank's own `mine` (the same length on every
// rank: the node count and two settings).
fuscoResult_t gatherNodeCounts(Communicator& c, const char* name, const ArgCheck& a,
                               const std::vector<uint64_t>& mine, std::vector<uint64_t>* all) {
  const int n = c.nranks();
  const size_t nn = mine.size();
  all->assign(static_cast<size_t>(n) * nn, 0);
  std::vector<PeerWork> work(n);
  for (int p = 0; p < n && a.ok(); ++p) {
    work[p].sends.push_back(RowStream::flat(mine.data(), nn * sizeof(uint64_t)));
    work[p].recvs.push_back(RowStream::flat(all->data() + p * nn, nn * sizeof(uint64_t)));
  }
  return runMoeOp(c, name, a, work);
}

// The routes every rank computes alike from the all-gathered counts (rowsTo), logged.
void planNodeRoutes(const Communicator& c, const char* call, MoeHandle::NodeState& st,
                    const std::vector<uint64_t>& rowsTo, uint32_t slack) {
  const NodeMap& nodes = c.nodes();
  planBalance(st.balance, nodes, rowsTo, st.balance == Balance::Greedy, &st.plan, slack);
  nodeSegmentsInto(nodes, st.plan, &st.segs);
  const std::string balance = describeBalance(st.balance, st.plan);
  if (paramPlanTrace() != 0)  // FUSCO_PLAN_TRACE prints it whatever the log level
    FUSCO_LOG_ALWAYS(LogLevel::Info, kPlan, "%s: NODE dedup, %zu routes; %s", call, st.segs.size(),
                     balance.c_str());
  else if (c.rank() == 0)
    FUSCO_INFO(kPlan, "%s: NODE dedup, %zu routes; %s", call, st.segs.size(), balance.c_str());
  if (logEnabled(LogLevel::Trace, kPlan))
    for (const NodeSegment& g : st.segs)
      FUSCO_TRACE(kPlan, "%s: segment src %d node %d route %d relay %d forwarder %d rows %llu+%llu",
                  call, g.src, g.node, g.route, g.relay, g.forwarder,
                  static_cast<unsigned long long>(g.pos0), static_cast<unsigned long long>(g.rows));
}

// Every rank's counts per node (rowsTo[s * numNodes + k]) and the check that every rank balances
// with the same settings and sent sane counts; a disagreement fails *agreed on every rank.
fuscoResult_t agreeNodeCounts(Communicator& c, const MoeHandle& h, const ArgCheck& a,
                              uint32_t slack, std::vector<uint64_t>* rowsTo, ArgCheck* agreed) {
  const NodeMap& nodes = c.nodes();
  const int n = c.nranks();
  const size_t nn = nodes.numNodes, words = nn + 2;
  std::vector<uint64_t> mine(words, 0), all;
  mine[nn] = static_cast<uint64_t>(h.node.balance), mine[nn + 1] = slack;
  if (a.ok()) remoteNodeRows(nodes, c.rank(), h.node.send.nodeTokens, mine.data());
  FUSCO_CHECK(gatherNodeCounts(c, h.names->nodeCounts, a, mine, &all));
  *agreed = a;
  rowsTo->assign(static_cast<size_t>(n) * nn, 0);
  auto modeName = [](uint64_t v) { return v <= 2 ? balanceName(static_cast<Balance>(v)) : "?"; };
  for (int s = 0; s < n; ++s) {
    const uint64_t* w = all.data() + s * words;
    std::copy(w, w + nn, rowsTo->begin() + s * nn);
    if (agreed->ok() && (w[nn] != mine[nn] || w[nn + 1] != mine[nn + 1]))
      agreed->fail(
          "%s: rank %d balances NODE routes with mode %s slack %llu, this rank "
          "with mode %s slack %llu (the config's balance and FUSCO_BALANCE_SLACK must "
          "agree)",
          h.names->call, s, modeName(w[nn]), static_cast<unsigned long long>(w[nn + 1]),
          modeName(mine[nn]), static_cast<unsigned long long>(mine[nn + 1]));
    for (size_t k = 0; k < nn && agreed->ok(); ++k)
      if (w[k] > kMaxPlanWords)
        agreed->fail("%s: rank %d sent a count of %llu rows to node %zu", h.names->call, s,
                     static_cast<unsigned long long>(w[k]), k);
  }
  return fuscoSuccess;
}

// The routes, this rank's node send plan and the segments it relays for peers of its node; the
// words to send in step 2 (RANK metadata to this node, forward metadata to forwarders).
void planNodeSendSide(const Communicator& c, MoeHandle& h, const std::vector<uint64_t>& rowsTo,
                      uint32_t slack, std::vector<std::vector<int32_t>>* out) {
  const NodeMap& nodes = c.nodes();
  const int me = c.rank();
  auto& st = h.node;
  planNodeRoutes(c, h.names->call, st, rowsTo, slack);
  planNodeSend(nodes, me, h.send, st.segs, &st.send);
  // A relay is a rank of the source's node: only the segments of this node's ranks can name it.
  st.relayed.clear();
  for (int s : nodes.ranksOfNode[nodes.nodeOf[me]]) {
    const auto [first, last] = segmentsOf(st.segs, s);
    for (size_t i = first; i < last; ++i)
      if (st.segs[i].relay == me && s != me) st.relayed.push_back(i);
  }
  for (int p = 0; p < c.nranks(); ++p)
    (*out)[p] = nodes.sameNode(p, me) ? h.send.meta[p] : st.send.fwdMeta[p];
}

// A step that failed on a malformed peer message: recorded in *b, its output left empty.
template <typename T>
void noteMalformed(fuscoResult_t r, ArgCheck* b, T* out, T empty) {
  if (r == fuscoSuccess) return;
  b->status = fuscoRemoteError;
  b->message = threadLastError();
  *out = std::move(empty);
}

}  // namespace

Balance balanceMode(int requested) {
  switch (requested) {
    case FUSCO_BALANCE_NONE:
      return Balance::None;
    case FUSCO_BALANCE_STATIC:
      return Balance::Static;
    default:
      return Balance::Greedy;  // AUTO: the best available
  }
}

fuscoResult_t planNodeDedup(MoeHandle& h, const ArgCheck& a,
                            std::vector<std::vector<int32_t>>* metaFrom, ArgCheck* b) {
  Communicator& c = *h.comm;
  const NodeMap& nodes = c.nodes();
  const int me = c.rank(), n = c.nranks();
  auto& st = h.node;
  // GREEDY may relay part of a heavy rank's rows through a local peer's NIC (one more intra-node
  // hop, pipelined like the forwarder's). Relays and splits cost hops and messages: only worth
  // it beyond a few percent (FUSCO_BALANCE_SLACK, in 1/1024 of the lower bound).
  const uint32_t slack = static_cast<uint32_t>(paramBalanceSlack());  // range-checked
  // Step 1: every rank's counts, then the settings its routes depend on.
  if (a.ok()) nodeTokensOf(nodes, h.send, &st.send.nodeTokens);
  std::vector<uint64_t> rowsTo;
  ArgCheck agreed;
  FUSCO_CHECK(agreeNodeCounts(c, h, a, slack, &rowsTo, &agreed));
  // Step 2: the RANK metadata to the ranks of this node, the forward metadata to forwarders. A
  // plan that failed already sends nothing: the exchange only carries the failure. What arrives
  // lands in *metaFrom, whose entries of this node's ranks are already what RANK would have sent.
  auto& sc = h.scratch;
  sc.wordsOut.resize(n);
  if (agreed.ok()) planNodeSendSide(c, h, rowsTo, slack, &sc.wordsOut);
  FUSCO_CHECK(exchangeWords(c, h.names->metadata, agreed, sc.wordsOut, metaFrom));
  // Step 3: what this rank forwards, told to each rank of its node.
  noteMalformed(planNodeForward(h.shape, nodes, me, st.segs, *metaFrom, &st.fwd), b, &st.fwd, {});
  sc.blocksOut.resize(n);
  for (int p = 0; p < n; ++p) {
    sc.blocksOut[p].clear();
    if (b->ok() && nodes.sameNode(p, me))
      nodeBlocksFor(st.fwd, st.segs, nodes.localRankOf[p], &sc.blocksOut[p]);
  }
  FUSCO_CHECK(exchangeWords(c, h.names->forwarded, *b, sc.blocksOut, &sc.blocksIn));
  // Step 4: per remote source, the metadata of the rows forwarded to this rank.
  for (int p = 0; p < n; ++p)
    if (!nodes.sameNode(p, me)) (*metaFrom)[p].clear();
  noteMalformed(planNodeReceive(nodes, me, st.segs, sc.blocksIn, metaFrom, &st.inFrom), b,
                &st.inFrom, std::vector<std::vector<NodeInSeg>>(n));
  return fuscoSuccess;
}

namespace {

// Splits what each rank of this node sent (fanIn): its RANK fan rows, then those of every segment
// this rank forwards to it.
void splitNodeFanRows(MoeHandle& h) {
  const NodeMap& nodes = h.comm->nodes();
  const int n = h.comm->nranks(), me = h.comm->rank();
  auto& st = h.node;
  const auto& in = h.scratch.fanIn;
  const size_t nf = st.fwd.size(), ls = nodes.ranksOfNode[nodes.nodeOf[me]].size();
  h.remoteFanRows.resize(n);
  st.fwdFanStart.resize(nf * ls);
  st.fwdFanRows.resize(nf * ls);
  for (auto& v : st.fwdFanStart) v.clear();
  for (auto& v : st.fwdFanRows) v.clear();
  for (int p = 0; p < n; ++p) {
    h.remoteFanRows[p].clear();
    if (!nodes.sameNode(p, me) || in[p].empty()) continue;
    const size_t rankPart = h.send.kSlots[p].size();
    h.remoteFanRows[p].assign(in[p].begin(), in[p].begin() + rankPart);
    size_t at = rankPart;
    const int lr = nodes.localRankOf[p];
    for (size_t k = 0; k < nf; ++k) {
      const auto& meta = st.fwd[k].meta[lr];
      auto& start = st.fwdFanStart[k * ls + lr];
      start.assign(1, 0);
      for (size_t w = 0; w < meta.size(); w += 1 + meta[w]) start.push_back(start.back() + meta[w]);
      st.fwdFanRows[k * ls + lr].assign(in[p].begin() + at, in[p].begin() + at + start.back());
      at += start.back();
    }
  }
}

}  // namespace

fuscoResult_t exchangeNodeFanRows(MoeHandle& h, const ArgCheck& a) {
  Communicator& c = *h.comm;
  const NodeMap& nodes = c.nodes();
  const int n = c.nranks(), me = c.rank();
  auto& st = h.node;
  auto &out = h.scratch.fanOut, &in = h.scratch.fanIn;
  out.resize(n);
  in.resize(n);
  std::vector<PeerWork> work(n);
  for (int p = 0; p < n; ++p) {
    out[p].clear();
    in[p].clear();
    if (!a.ok() || !nodes.sameNode(p, me)) continue;  // other nodes' rows arrive via forwarders
    out[p] = h.recv.fanRows[p];
    for (const NodeInSeg& e : st.inFrom[p]) {
      const int src = st.segs[e.seg].src;
      if (e.rows == 0) continue;
      const auto& fs = h.recv.fanStart[src];
      out[p].insert(out[p].end(), h.recv.fanRows[src].begin() + fs[e.rowOffset],
                    h.recv.fanRows[src].begin() + fs[e.rowOffset + e.rows]);
    }
    size_t expect = h.send.kSlots[p].size();
    const int lr = nodes.localRankOf[p];
    for (const NodeFwdSeg& f : st.fwd) expect += f.meta[lr].size() - f.rowsTo[lr].size();
    in[p].resize(expect);
    work[p].sends.push_back(RowStream::flat(out[p].data(), out[p].size() * sizeof(int64_t)));
    work[p].recvs.push_back(RowStream::flat(in[p].data(), in[p].size() * sizeof(int64_t)));
  }
  FUSCO_CHECK(runMoeOp(c, h.names->fanRows, a, work));
  splitNodeFanRows(h);
  return fuscoSuccess;
}

}  // namespace fusco
