// fuscoMoePlan's NODE dedup steps (node_plan.h has the protocol): every rank's token counts per
// node, the balancer (the same routes on every rank), the forward metadata to the forwarders and
// the forwarders' blocks to the ranks of their node.
#include <cstdio>
#include <vector>

#include "api/moe_handle.h"
#include "core/log.h"
#include "core/params.h"
#include "engine/engine.h"

namespace fusco {

namespace {

// Every rank's rows per node (rowsTo[s * numNodes + N]), from each rank's own counts.
fuscoResult_t gatherNodeCounts(fuscoComm_t comm, const ArgCheck& a,
                               const std::vector<uint64_t>& mine, std::vector<uint64_t>* all) {
  const int n = comm->impl->nranks();
  const size_t nn = mine.size();
  all->assign(static_cast<size_t>(n) * nn, 0);
  std::vector<PeerWork> work(n);
  for (int p = 0; p < n && a.status == fuscoSuccess; ++p) {
    work[p].sends.push_back(RowStream::flat(mine.data(), nn * sizeof(uint64_t)));
    work[p].recvs.push_back(RowStream::flat(all->data() + p * nn, nn * sizeof(uint64_t)));
  }
  return runMoeOp(comm, "fuscoMoePlan (node counts)", a, work);
}

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

}  // namespace

fuscoResult_t planNodeDedup(fuscoComm_t comm, fuscoMoeHandle& h, const ArgCheck& a, int balance,
                            const int64_t* topkIdx, std::vector<std::vector<int32_t>>* metaFrom,
                            ArgCheck* b) {
  Communicator& c = *comm->impl;
  const NodeMap& nodes = c.nodes();
  const int me = c.rank(), n = c.nranks();
  auto& st = h.node;
  st.balance = balanceMode(balance);
  std::vector<uint64_t> mine(nodes.numNodes, 0), all;
  if (a.status == fuscoSuccess) {
    nodeTokensOf(h.shape, nodes, topkIdx, h.numTokens, h.topk, &st.send.nodeTokens);
    for (int node = 0; node < nodes.numNodes; ++node)
      if (node != nodes.nodeOf[me]) mine[node] = st.send.nodeTokens[node].size();
  }
  FUSCO_CHECK(gatherNodeCounts(comm, a, mine, &all));
  // GREEDY may relay part of a heavy rank's rows through a local peer's NIC (one more intra-node
  // hop, pipelined like the forwarder's).
  planBalance(st.balance, nodes, all, st.balance == Balance::Greedy, &st.plan);
  st.segs = nodeSegments(nodes, st.plan);
  if (me == 0 || paramInt("FUSCO_PLAN_TRACE") != 0)
    FUSCO_INFO(kPlan, "fuscoMoePlan: NODE dedup, %zu routes; %s", st.segs.size(),
               describeBalance(st.balance, st.plan).c_str());
  for (const NodeSegment& g : st.segs)
    FUSCO_TRACE(kPlan, "fuscoMoePlan: segment src %d node %d route %d relay %d forwarder %d rows %llu+%llu",
                g.src, g.node, g.route, g.relay, g.forwarder, static_cast<unsigned long long>(g.pos0),
                static_cast<unsigned long long>(g.rows));
  planNodeSend(nodes, me, h.send, st.segs, &st.send);
  st.relayed.clear();
  for (size_t i = 0; i < st.segs.size(); ++i)
    if (st.segs[i].relay == me && st.segs[i].src != me) st.relayed.push_back(i);
  // Step 2: the RANK metadata to the ranks of this node, the forward metadata to forwarders.
  std::vector<std::vector<int32_t>> out(n), in;
  for (int p = 0; p < n; ++p) out[p] = nodes.sameNode(p, me) ? h.send.meta[p] : st.send.fwdMeta[p];
  FUSCO_CHECK(exchangeWords(comm, "fuscoMoePlan (metadata)", a, out, &in));
  // Step 3: what this rank forwards, told to each rank of its node.
  if (planNodeForward(h.shape, nodes, me, st.segs, in, &st.fwd) != fuscoSuccess) {
    b->status = fuscoRemoteError;
    b->message = threadLastError();
    st.fwd.clear();
  }
  std::vector<std::vector<int32_t>> blocksOut(n), blocksIn;
  for (int p = 0; p < n && b->status == fuscoSuccess; ++p)
    if (nodes.sameNode(p, me)) nodeBlocksFor(st.fwd, st.segs, nodes.localRankOf[p], &blocksOut[p]);
  FUSCO_CHECK(exchangeWords(comm, "fuscoMoePlan (forwarded metadata)", *b, blocksOut, &blocksIn));
  // Step 4: per source, the metadata RANK dedup would have sent.
  metaFrom->assign(n, {});
  for (int p = 0; p < n; ++p)
    if (nodes.sameNode(p, me)) (*metaFrom)[p] = std::move(in[p]);
  if (planNodeReceive(nodes, me, st.segs, blocksIn, metaFrom, &st.inFrom) != fuscoSuccess) {
    b->status = fuscoRemoteError;
    b->message = threadLastError();
    st.inFrom.assign(n, {});
  }
  return fuscoSuccess;
}

}  // namespace fusco
