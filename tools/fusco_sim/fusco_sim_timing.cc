#include "fusco_sim_timing.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <vector>

#include "fusco_sim_model.h"
#include "plan/balance.h"
#include "plan/moe_plan.h"
#include "plan/node_plan.h"

namespace fusco {
namespace sim {

namespace {

using Words = std::vector<std::vector<int32_t>>;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// What the rest of the cluster hands rank 0 (node 0) in one layer.
struct ClusterInputs {
  std::vector<uint64_t> rowsTo;  // [src * nodes + node] the balancer's counts
  Words rankMeta;                // [src] RANK metadata to rank 0 (sources of node 0)
  std::vector<Words> fwdTo;      // [local rank f of node 0][src] forward metadata to f
};

void must(fuscoResult_t r, const char* what) {
  if (r != fuscoSuccess)
    throw std::runtime_error(std::string("fusco_sim timing: ") + what + " failed");
}

// Every rank's counts first (they decide the routes), then, source by source, what it sends
// node 0: forward metadata from remote sources, RANK metadata from node 0's own ranks.
ClusterInputs clusterInputs(const MoeShape& shape, const NodeMap& nodes, const SimRouter& router,
                            const PlanTimingSpec& spec, std::vector<NodeSegment>* segs) {
  const int ep = nodes.nranks, nn = nodes.numNodes;
  const size_t tokens = spec.routing.tokens;
  const int topk = spec.routing.topk;
  ClusterInputs in;
  in.rowsTo.assign(static_cast<size_t>(ep) * nn, 0);
  std::vector<int64_t> idx;
  std::vector<std::vector<int64_t>> nt;
  for (int s = 0; s < ep; ++s) {
    router.route(s, &idx);
    nodeTokensOf(shape, nodes, idx.data(), tokens, topk, &nt);
    remoteNodeRows(nodes, s, nt, in.rowsTo.data() + static_cast<size_t>(s) * nn);
  }
  BalancePlan bp;
  planBalance(Balance::Greedy, nodes, in.rowsTo, true, &bp, spec.slack);
  nodeSegmentsInto(nodes, bp, segs);
  const std::vector<int>& mine = nodes.ranksOfNode[0];
  in.rankMeta.assign(ep, {});
  in.fwdTo.assign(mine.size(), Words(ep));
  MoeSendPlan plan;
  NodeSendPlan nsp;
  for (int s = 0; s < ep; ++s) {
    router.route(s, &idx);
    planSendInto(shape, s, idx.data(), tokens, topk, Dedup::Rank, &plan);
    if (nodes.nodeOf[s] == 0) {
      in.rankMeta[s] = plan.meta[0];
      continue;
    }
    nodeTokensOf(nodes, plan, &nsp.nodeTokens);
    planNodeSend(nodes, s, plan, *segs, &nsp);
    for (size_t f = 0; f < mine.size(); ++f) in.fwdTo[f][s] = nsp.fwdMeta[mine[f]];
  }
  return in;
}

}  // namespace

PlanTiming timePlanLayer(const PlanTimingSpec& spec) {
  const SimRoutingSpec& rs = spec.routing;
  const int ep = rs.nodes * rs.gpus;
  const NodeMap nodes = simNodeMap(rs.nodes, rs.gpus);
  MoeShape shape;
  must(buildMoeShape(ep, rs.numExperts, nullptr, 1, &shape), "buildMoeShape");
  const SimRouter router(rs);
  std::vector<NodeSegment> segsAll;
  const ClusterInputs in = clusterInputs(shape, nodes, router, spec, &segsAll);
  const std::vector<int>& mine = nodes.ranksOfNode[0];
  // The blocks the other forwarders of node 0 send rank 0 (untimed: their work, not rank 0's).
  Words blocksFrom(ep);
  std::vector<NodeFwdSeg> fwd;
  for (size_t f = 1; f < mine.size(); ++f) {
    must(planNodeForward(shape, nodes, mine[f], segsAll, in.fwdTo[f], &fwd), "planNodeForward");
    nodeBlocksFor(fwd, segsAll, 0, &blocksFrom[mine[f]]);
  }
  std::vector<int64_t> idx;
  router.route(0, &idx);
  MoeSendPlan plan;
  NodeSendPlan nsp;
  BalancePlan bp, pp;
  std::vector<NodeSegment> segs;
  MoeRecvPlan recv;
  std::vector<std::vector<NodeInSeg>> inFrom;
  Words metaFrom;
  std::vector<int32_t> blocksOut;
  std::vector<double> t[7];
  using clk = std::chrono::steady_clock;
  auto ms = [](clk::time_point a, clk::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  PlanTiming out;
  for (int rep = 0; rep < std::max(1, spec.reps); ++rep) {
    metaFrom = in.rankMeta;  // what the RANK exchange delivers (moved there, copied here)
    const auto a = clk::now();
    must(validateTopk(shape, idx.data(), rs.tokens, rs.topk), "validateTopk");
    const auto b = clk::now();
    planSendInto(shape, 0, idx.data(), rs.tokens, rs.topk, Dedup::Rank, &plan);
    const auto c = clk::now();
    planBalance(Balance::Greedy, nodes, in.rowsTo, true, &bp, spec.slack);
    nodeSegmentsInto(nodes, bp, &segs);
    const auto d = clk::now();
    nodeTokensOf(nodes, plan, &nsp.nodeTokens);
    planNodeSend(nodes, 0, plan, segs, &nsp);
    const auto e = clk::now();
    must(planNodeForward(shape, nodes, 0, segs, in.fwdTo[0], &fwd), "planNodeForward");
    // Rank 0's own block (local rank 0) is what the exchange loops back to it.
    for (size_t lr = 0; lr < mine.size(); ++lr)
      nodeBlocksFor(fwd, segs, static_cast<int>(lr), lr == 0 ? &blocksFrom[0] : &blocksOut);
    const auto f = clk::now();
    must(planNodeReceive(nodes, 0, segs, blocksFrom, &metaFrom, &inFrom), "planNodeReceive");
    must(planRecv(shape, 0, metaFrom, &recv), "planRecv");
    const auto h = clk::now();
    paperBalance(nodes, in.rowsTo, &pp);
    const auto i = clk::now();
    const double each[7] = {ms(a, b), ms(b, c), ms(c, d), ms(d, e), ms(e, f), ms(f, h), ms(h, i)};
    for (int k = 0; k < 7; ++k) t[k].push_back(each[k]);
  }
  out.validate = median(t[0]);
  out.send = median(t[1]);
  out.balance = median(t[2]);
  out.nodeSend = median(t[3]);
  out.forward = median(t[4]);
  out.receive = median(t[5]);
  out.paper = median(t[6]);
  out.balanceLine = describeBalance(Balance::Greedy, bp);
  for (const NodeFwdSeg& s : fwd) out.forwardedRows += segs[s.seg].rows;
  out.receivedRows = recv.numRecvRows;
  return out;
}

}  // namespace sim
}  // namespace fusco
