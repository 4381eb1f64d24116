#include "fusco_sim_model.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "plan/node_plan.h"

namespace fusco {
namespace sim {

const char* strategyName(Strategy s) {
  switch (s) {
    case Strategy::NcclLike:
      return "nccl-like";
    case Strategy::DeepepLike:
      return "deepep-like";
    case Strategy::FuscoPaperLike:
      return "fusco-paper-like";
    case Strategy::Fusco:
      return "fusco";
  }
  return "?";
}

void LinkBytes::reset(int nranks) {
  for (auto* v : {&nicSend, &nicRecv, &nvSend, &nvRecv, &hbm}) v->assign(nranks, 0);
}

uint64_t LinkBytes::totalNicSend() const {
  return std::accumulate(nicSend.begin(), nicSend.end(), uint64_t{0});
}

uint64_t LinkBytes::totalNvSend() const {
  return std::accumulate(nvSend.begin(), nvSend.end(), uint64_t{0});
}

NodeMap simNodeMap(int nodes, int gpus) {
  return buildNodeMap(std::vector<std::string>(static_cast<size_t>(nodes) * gpus, "host"), gpus);
}

void paperBalance(const NodeMap& nodes, const std::vector<uint64_t>& rowsTo, BalancePlan* out) {
  const int nn = nodes.numNodes;
  const int nr = nodes.nranks;
  std::vector<uint64_t> load(nr, 0);
  for (int s = 0; s < nr; ++s)
    for (int n = 0; n < nn; ++n)
      if (n != nodes.nodeOf[s]) load[s] += rowsTo[static_cast<size_t>(s) * nn + n];
  // rotated[X][p]: the rank at position p of node X; posOf[s]: its position.
  std::vector<std::vector<int>> rotated(nn);
  std::vector<int> posOf(nr, 0);
  for (int x = 0; x < nn; ++x) {
    std::vector<int> order = nodes.ranksOfNode[x];
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return load[a] > load[b]; });
    const int L = static_cast<int>(order.size());
    rotated[x].resize(L);
    for (int p = 0; p < L; ++p) {
      rotated[x][p] = order[(p + x) % L];
      posOf[rotated[x][p]] = p;
    }
  }
  out->routes.assign(static_cast<size_t>(nr) * nn, {});
  out->sendLoad.assign(nr, 0);
  out->recvLoad.assign(nr, 0);
  std::vector<uint64_t> nodeSent(nn, 0), nodeRecv(nn, 0);
  uint64_t maxSingle = 0;
  for (int s = 0; s < nr; ++s) {
    const int x = nodes.nodeOf[s];
    for (int n = 0; n < nn; ++n) {
      const uint64_t rows = rowsTo[static_cast<size_t>(s) * nn + n];
      if (n == x || rows == 0) continue;
      const int f = rotated[n][posOf[s] % static_cast<int>(rotated[n].size())];
      out->routes[static_cast<size_t>(s) * nn + n].push_back(RailRoute{s, f, rows});
      out->sendLoad[s] += rows;
      out->recvLoad[f] += rows;
      nodeSent[x] += rows;
      nodeRecv[n] += rows;
    }
    maxSingle = std::max(maxSingle, out->sendLoad[s]);
  }
  out->maxLoad = 0;
  out->lowerBound = maxSingle;  // no relays: a rank's own send total cannot be shared
  for (int r = 0; r < nr; ++r)
    out->maxLoad = std::max({out->maxLoad, out->sendLoad[r], out->recvLoad[r]});
  for (int x = 0; x < nn; ++x) {
    const uint64_t L = static_cast<uint64_t>(nodes.localSize(x));
    out->lowerBound = std::max(out->lowerBound, (std::max(nodeSent[x], nodeRecv[x]) + L - 1) / L);
  }
}

namespace {

// Adds the NIC, relay and fan-out bytes of rank s's segments under one node strategy.
void accountNodeSegments(const NodeMap& nodes, int s, const std::vector<NodeSegment>& segs,
                         const NodeSendPlan& nsp, uint64_t B, LinkBytes* lb) {
  std::vector<size_t> cursor(nodes.nranks, 0);
  for (size_t i : nsp.segs) {
    const NodeSegment& g = segs[i];
    const uint64_t bytes = g.rows * B;
    if (g.relay != g.src) {  // the relay hand-off crosses NVLink first
      lb->nvSend[g.src] += bytes;
      lb->nvRecv[g.relay] += bytes;
    }
    lb->nicSend[g.relay] += bytes;
    lb->nicRecv[g.forwarder] += bytes;
    // The forward metadata (node_plan.h): per local rank, [c, c rows, w, w words].
    const auto& meta = nsp.fwdMeta[g.forwarder];
    const auto& local = nodes.ranksOfNode[g.node];
    size_t& at = cursor[g.forwarder];
    for (size_t lr = 0; lr < local.size() && at < meta.size() && meta[at] >= 0; ++lr) {
      const uint64_t c = static_cast<uint64_t>(meta[at]);
      at += 1 + c;
      if (at < meta.size() && meta[at] >= 0) at += 1 + static_cast<size_t>(meta[at]);
      if (local[lr] == g.forwarder) continue;  // the forwarder's own rows: a local write
      lb->nvSend[g.forwarder] += c * B;
      lb->nvRecv[local[lr]] += c * B;
    }
  }
}

}  // namespace

void accountCluster(const MoeShape& shape, const NodeMap& nodes, const RouteFn& route,
                    const AccountSpec& spec, Accounting* out) {
  const int nr = nodes.nranks;
  const int nn = nodes.numNodes;
  const uint64_t B = spec.rowBytes;
  for (auto& l : out->links) l.reset(nr);
  out->netCopies = 0;
  out->flatRemoteRows = 0;
  std::vector<uint64_t> rowsTo(static_cast<size_t>(nr) * nn, 0);
  std::vector<int64_t> idx;
  MoeSendPlan flat, rankPlan;
  NodeSendPlan nsp;
  LinkBytes& nccl = out->links[static_cast<int>(Strategy::NcclLike)];
  // Pass 1: flat rows (nccl-like and the permute passes), same-node rows, rows per remote node.
  for (int s = 0; s < nr; ++s) {
    route(s, &idx);
    planSendInto(shape, s, idx.data(), spec.tokens, spec.topk, Dedup::None, &flat);
    for (int r = 0; r < nr; ++r) {
      const uint64_t bytes = flat.rows[r].size() * B;
      nccl.hbm[s] += bytes;  // the sender's permute and the receiver's sort-chunks pass
      nccl.hbm[r] += bytes;
      if (r == s) continue;
      if (nodes.sameNode(r, s)) {
        nccl.nvSend[s] += bytes;
        nccl.nvRecv[r] += bytes;
      } else {
        nccl.nicSend[s] += bytes;
        nccl.nicRecv[r] += bytes;
        out->flatRemoteRows += flat.rows[r].size();
      }
    }
    planSendInto(shape, s, idx.data(), spec.tokens, spec.topk, Dedup::Rank, &rankPlan);
    for (int st = 1; st < kNumStrategies; ++st) {
      for (int r : nodes.ranksOfNode[nodes.nodeOf[s]]) {
        if (r == s) continue;
        const uint64_t bytes = rankPlan.rows[r].size() * B;
        out->links[st].nvSend[s] += bytes;
        out->links[st].nvRecv[r] += bytes;
      }
    }
    nodeTokensOf(nodes, rankPlan, &nsp.nodeTokens);  // the API's way: from the RANK plan
    out->netCopies +=
        remoteNodeRows(nodes, s, nsp.nodeTokens, rowsTo.data() + static_cast<size_t>(s) * nn);
  }
  out->links[static_cast<int>(Strategy::DeepepLike)].hbm = nccl.hbm;  // separate permute passes
  planBalance(Balance::Static, nodes, rowsTo, false, &out->balance[1]);
  paperBalance(nodes, rowsTo, &out->balance[2]);
  planBalance(Balance::Greedy, nodes, rowsTo, true, &out->balance[3], spec.slack1024);
  std::vector<NodeSegment> segs[kNumStrategies];
  for (int st = 1; st < kNumStrategies; ++st) segs[st] = nodeSegments(nodes, out->balance[st]);
  // Pass 2: the node plans of each strategy (forward metadata: who each forwarded row fans out to).
  for (int s = 0; s < nr; ++s) {
    route(s, &idx);
    planSendInto(shape, s, idx.data(), spec.tokens, spec.topk, Dedup::Rank, &rankPlan);
    nodeTokensOf(nodes, rankPlan, &nsp.nodeTokens);  // the API's way: from the RANK plan
    for (int st = 1; st < kNumStrategies; ++st) {
      planNodeSend(nodes, s, rankPlan, segs[st], &nsp);
      accountNodeSegments(nodes, s, segs[st], nsp, B, &out->links[st]);
    }
  }
}

PhaseTime phaseTime(const LinkBytes& b, bool combine, const LinkModel& m, const StrategyModel& s) {
  const double nicBps = m.nicGBs * s.nicEff * 1e9;
  const double nvBps = m.nvlinkGBs * 1e9;
  const double permBps = m.permuteGBs * 1e9;
  PhaseTime t;
  double worst = -1;
  auto consider = [&](const char* name, int r, uint64_t bytes, double bps, double* hopMs) {
    const double ms = static_cast<double>(bytes) / bps * 1e3;
    *hopMs = std::max(*hopMs, ms);
    if (ms > worst) {
      worst = ms;
      t.busiest = std::string(name) + " r" + std::to_string(r);
      t.busiestBytes = bytes;
    }
  };
  const auto& nicTx = combine ? b.nicRecv : b.nicSend;
  const auto& nicRx = combine ? b.nicSend : b.nicRecv;
  const auto& nvTx = combine ? b.nvRecv : b.nvSend;
  const auto& nvRx = combine ? b.nvSend : b.nvRecv;
  for (size_t r = 0; r < nicTx.size(); ++r) {
    const int ri = static_cast<int>(r);
    consider("nic-tx", ri, nicTx[r], nicBps, &t.interMs);
    consider("nic-rx", ri, nicRx[r], nicBps, &t.interMs);
    consider("nvlink-tx", ri, nvTx[r], nvBps, &t.intraMs);
    consider("nvlink-rx", ri, nvRx[r], nvBps, &t.intraMs);
    if (s.permute) consider("hbm-permute", ri, b.hbm[r], permBps, &t.permMs);
  }
  const double step = m.stepUs * 1e-3;
  const double interMs = t.interMs > 0 ? t.interMs + step : 0;
  const double intraMs = t.intraMs > 0 ? t.intraMs + step : 0;
  double comm = 0;
  switch (s.hops) {
    case HopMode::Flat:
      comm = std::max(t.interMs, t.intraMs) + step;
      break;
    case HopMode::Sequential:
      comm = interMs + intraMs;
      break;
    case HopMode::Pipelined: {
      // The first slice still crosses both hops: one slice time on the slower link, both steps.
      const double sliceMs = m.sliceKB * 1024.0 / std::min(nicBps, nvBps) * 1e3;
      comm = std::max(t.interMs, t.intraMs) + sliceMs + (interMs > 0 ? step : 0) +
             (intraMs > 0 ? step : 0);
      break;
    }
  }
  t.ms = comm + t.permMs;
  return t;
}

double lowerBoundMs(uint64_t netCopies, size_t rowBytes, int nranks, const LinkModel& m) {
  const double perNic = static_cast<double>(netCopies) * rowBytes / nranks;
  return 2.0 * perNic / (m.nicGBs * 1e9) * 1e3;
}

}  // namespace sim
}  // namespace fusco
