// The NIC / forwarder load balancer (balance.h).
//
// Why GREEDY always reaches lowerBound (call it C):
//   Receive side, node N with m forwarders and R rows coming in: C >= ceil(R / m), so R <= m * C.
//   Each flow goes to the forwarder with the lowest load; if it does not fit under C there, that
//   forwarder is filled to exactly C and the rest goes on. While rows remain, some forwarder is
//   below C (otherwise the rows already placed would be m * C >= R), so the loop always has room
//   and no forwarder ever exceeds C.
//   Send side without relays: every send total is <= C by the definition of C. With relays, node X
//   with m ranks sends S <= m * C rows; an overloaded rank hands rows to the least-loaded peer up
//   to C, and while any rank is above C some other rank is below it (the total is <= m * C), so
//   every rank ends at <= C. Hence maxLoad <= C, and C is a lower bound, so maxLoad == C.
// Cost: O(F log F + F * m) for F flows and m ranks per node, F <= nranks * numNodes; no allocation
// per row (scratch vectors sized by flows).
#include "plan/balance.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <stdexcept>

#include "core/params.h"

namespace fusco {
namespace {

// Part of flow `flow` (index s * numNodes + N) placed on `rank` (a relay or a forwarder).
struct Piece {
  uint32_t flow;
  int rank;
  uint64_t rows;
};

int staticForwarder(const NodeMap& nodes, int s, int node) {
  const std::vector<int>& ranks = nodes.ranksOfNode[node];
  const size_t lr = static_cast<size_t>(nodes.localRankOf[s]);
  return ranks[lr < ranks.size() ? lr : lr % ranks.size()];  // divides only for a smaller node
}

uint64_t ceilDiv(uint64_t a, uint64_t b) { return b == 0 ? 0 : (a + b - 1) / b; }

// What every assignment starts from, in one pass over rowsTo: each rank's send total over remote
// nodes (its rail's load without relays), each node's receive total, and each rank's receive load
// under STATIC.
struct FlowTotals {
  std::vector<uint64_t> send;        // [nranks]
  std::vector<uint64_t> nodeRecv;    // [numNodes]
  std::vector<uint64_t> staticRecv;  // [nranks]
  uint64_t staticMax = 0;            // STATIC's maxLoad
};

void flowTotals(const NodeMap& nodes, const std::vector<uint64_t>& rowsTo, FlowTotals* t) {
  const int nn = nodes.numNodes;
  t->send.assign(nodes.nranks, 0);
  t->nodeRecv.assign(nn, 0);
  t->staticRecv.assign(nodes.nranks, 0);
  for (int s = 0; s < nodes.nranks; ++s) {
    const uint64_t* row = rowsTo.data() + static_cast<size_t>(s) * nn;
    uint64_t sum = 0;
    for (int n = 0; n < nn; ++n) {
      if (n == nodes.nodeOf[s]) continue;
      sum += row[n];
      t->nodeRecv[n] += row[n];
      t->staticRecv[staticForwarder(nodes, s, n)] += row[n];
    }
    t->send[s] = sum;
  }
  t->staticMax = 0;
  for (int r = 0; r < nodes.nranks; ++r)
    t->staticMax = std::max({t->staticMax, t->send[r], t->staticRecv[r]});
}

uint64_t computeLowerBound(const NodeMap& nodes, const FlowTotals& t, bool allowRelay) {
  const int nn = nodes.numNodes;
  std::vector<uint64_t> sent(nn, 0);
  uint64_t maxRank = 0;
  for (int s = 0; s < nodes.nranks; ++s) {
    sent[nodes.nodeOf[s]] += t.send[s];
    maxRank = std::max(maxRank, t.send[s]);
  }
  uint64_t lb = 0;
  for (int n = 0; n < nn; ++n)
    lb = std::max(lb, ceilDiv(std::max(sent[n], t.nodeRecv[n]), nodes.localSize(n)));
  return allowRelay ? lb : std::max(lb, maxRank);
}

// Loads and maxLoad from the routes.
void computeLoads(const NodeMap& nodes, BalancePlan* out) {
  out->sendLoad.assign(nodes.nranks, 0);
  out->recvLoad.assign(nodes.nranks, 0);
  for (const std::vector<RailRoute>& rs : out->routes)
    for (const RailRoute& r : rs) {
      out->sendLoad[r.relay] += r.rows;
      out->recvLoad[r.forwarder] += r.rows;
    }
  out->maxLoad = 0;
  for (int r = 0; r < nodes.nranks; ++r)
    out->maxLoad = std::max(out->maxLoad, std::max(out->sendLoad[r], out->recvLoad[r]));
}

void clearRoutes(const NodeMap& nodes, BalancePlan* out) {
  out->routes.resize(static_cast<size_t>(nodes.nranks) * nodes.numNodes);
  for (std::vector<RailRoute>& rs : out->routes) rs.clear();  // keeps capacity
}

// One route per remote flow (s's own NIC, s's STATIC forwarder); the loads are flowTotals'.
void planStatic(const NodeMap& nodes, const std::vector<uint64_t>& rowsTo, const FlowTotals& t,
                BalancePlan* out) {
  const int nn = nodes.numNodes;
  clearRoutes(nodes, out);
  for (int s = 0; s < nodes.nranks; ++s)
    for (int n = 0; n < nn; ++n) {
      const size_t f = static_cast<size_t>(s) * nn + n;
      if (n == nodes.nodeOf[s] || rowsTo[f] == 0) continue;
      out->routes[f].push_back({s, staticForwarder(nodes, s, n), rowsTo[f]});
    }
  out->sendLoad = t.send;
  out->recvLoad = t.staticRecv;
  out->maxLoad = t.staticMax;
}

// The lowest-loaded rank among ranks[0..m) (loads indexed by rank); ties go to `prefer` (a rank,
// or -1), then to the lowest local index. `skip` (a rank or -1) is never chosen.
int leastLoaded(const std::vector<int>& ranks, const std::vector<uint64_t>& load, int prefer,
                int skip) {
  int best = -1;
  for (int r : ranks) {
    if (r == skip) continue;
    if (best < 0 || load[r] < load[best] || (load[r] == load[best] && r == prefer)) best = r;
  }
  return best;
}

// Send side (relays): rows moved off each rank whose send total is above cap, onto its node's
// least-loaded peers. Only the relayed parts are recorded; the rest of each flow stays on s.
void assignRelays(const NodeMap& nodes, const std::vector<uint64_t>& rowsTo, uint64_t cap,
                  std::vector<uint64_t>* send, std::vector<Piece>* pieces) {
  const int nn = nodes.numNodes;
  std::vector<int> over;
  std::vector<uint32_t> flows;
  for (int x = 0; x < nn; ++x) {
    const std::vector<int>& ranks = nodes.ranksOfNode[x];
    if (ranks.size() < 2) continue;
    over.clear();
    for (int r : ranks)
      if ((*send)[r] > cap) over.push_back(r);
    // Largest excess first, so the most loaded rank gets the emptiest peers.
    std::sort(over.begin(), over.end(), [&](int a, int b) {
      return (*send)[a] != (*send)[b] ? (*send)[a] > (*send)[b] : a < b;
    });
    for (int s : over) {
      flows.clear();
      for (int n = 0; n < nn; ++n) {
        const size_t f = static_cast<size_t>(s) * nn + n;
        if (n != x && rowsTo[f] != 0) flows.push_back(static_cast<uint32_t>(f));
      }
      // Largest flows first: a whole flow moves as one piece where a peer has room for it.
      std::sort(flows.begin(), flows.end(), [&](uint32_t a, uint32_t b) {
        return rowsTo[a] != rowsTo[b] ? rowsTo[a] > rowsTo[b] : a < b;
      });
      uint64_t excess = (*send)[s] - cap;
      size_t k = 0;
      uint64_t flowLeft = flows.empty() ? 0 : rowsTo[flows[0]];
      while (excess > 0 && k < flows.size()) {
        const int p = leastLoaded(ranks, *send, -1, s);
        if ((*send)[p] >= cap) break;  // cannot happen when cap is a valid bound
        const uint64_t take = std::min({excess, cap - (*send)[p], flowLeft});
        pieces->push_back({flows[k], p, take});
        (*send)[p] += take;
        (*send)[s] -= take;
        excess -= take;
        flowLeft -= take;
        if (flowLeft == 0 && ++k < flows.size()) flowLeft = rowsTo[flows[k]];
      }
    }
  }
}

// A flow's routes: the common refinement of its relay split (s's own part first, then the relayed
// pieces in the order they were made) and its forwarder split, walked in step.
void emitRoutes(int s, uint64_t rows, const Piece* relays, size_t nr, const Piece* fwd, size_t nf,
                std::vector<RailRoute>* routes) {
  uint64_t relayed = 0;
  for (size_t i = 0; i < nr; ++i) relayed += relays[i].rows;
  int relay = s;
  uint64_t relayLeft = rows - relayed;
  size_t ri = 0;
  for (size_t fi = 0; fi < nf; ++fi) {
    uint64_t fwdLeft = fwd[fi].rows;
    while (fwdLeft > 0) {
      while (relayLeft == 0) {  // s's own part may be empty; relayed pieces never are
        relay = relays[ri].rank;
        relayLeft = relays[ri++].rows;
      }
      const uint64_t take = std::min(relayLeft, fwdLeft);
      routes->push_back({relay, fwd[fi].rank, take});
      relayLeft -= take;
      fwdLeft -= take;
    }
  }
}

struct FlowRows {
  uint64_t rows;
  uint32_t flow;
};

// Receive side, and every flow's routes. Per destination node, the flows into it largest first
// (LPT order; ties: lower s), each to the least-loaded forwarder (ties: s's STATIC forwarder, then
// the lowest local index), split where it would take that forwarder above cap. relayPieces are
// sorted by flow; hasRelay[s] says whether s has any.
void assignForwarders(const NodeMap& nodes, const std::vector<uint64_t>& rowsTo, uint64_t cap,
                      const std::vector<Piece>& relayPieces, const std::vector<char>& hasRelay,
                      BalancePlan* out) {
  const int nn = nodes.numNodes;
  // Bucket the flows by destination node in two sequential passes over rowsTo.
  std::vector<uint32_t> start(nn + 1, 0);
  for (int s = 0; s < nodes.nranks; ++s)
    for (int n = 0; n < nn; ++n)
      if (n != nodes.nodeOf[s] && rowsTo[static_cast<size_t>(s) * nn + n] != 0) ++start[n + 1];
  for (int n = 0; n < nn; ++n) start[n + 1] += start[n];
  std::vector<FlowRows> flows(start[nn]);
  {
    std::vector<uint32_t> next(start.begin(), start.end() - 1);
    for (int s = 0; s < nodes.nranks; ++s)
      for (int n = 0; n < nn; ++n) {
        const size_t f = static_cast<size_t>(s) * nn + n;
        if (n != nodes.nodeOf[s] && rowsTo[f] != 0)
          flows[next[n]++] = {rowsTo[f], static_cast<uint32_t>(f)};
      }
  }
  std::vector<uint64_t> recv(nodes.nranks, 0);
  std::vector<Piece> fwd;
  for (int n = 0; n < nn; ++n) {
    std::sort(flows.begin() + start[n], flows.begin() + start[n + 1],
              [](const FlowRows& a, const FlowRows& b) {
                return a.rows != b.rows ? a.rows > b.rows : a.flow < b.flow;
              });
    for (uint32_t i = start[n]; i < start[n + 1]; ++i) {
      const uint32_t f = flows[i].flow;
      const int s = static_cast<int>(f / nn);
      const int prefer = staticForwarder(nodes, s, n);
      fwd.clear();
      for (uint64_t rem = flows[i].rows; rem > 0;) {
        const int j = leastLoaded(nodes.ranksOfNode[n], recv, prefer, -1);
        // recv[j] < cap while rows remain (see the top of this file); the guard keeps a bad cap
        // from looping forever: then the rest simply lands on j.
        const uint64_t take = std::min(rem, recv[j] < cap ? cap - recv[j] : rem);
        fwd.push_back({f, j, take});
        recv[j] += take;
        rem -= take;
      }
      const Piece* rp = nullptr;
      size_t nr = 0;
      if (hasRelay[s]) {
        const auto range =
            std::equal_range(relayPieces.begin(), relayPieces.end(), Piece{f, 0, 0},
                             [](const Piece& a, const Piece& b) { return a.flow < b.flow; });
        rp = relayPieces.data() + (range.first - relayPieces.begin());
        nr = static_cast<size_t>(range.second - range.first);
      }
      emitRoutes(s, flows[i].rows, rp, nr, fwd.data(), fwd.size(), &out->routes[f]);
    }
  }
}

void planGreedy(const NodeMap& nodes, const std::vector<uint64_t>& rowsTo,
                const std::vector<uint64_t>& total, bool allowRelay, uint64_t cap,
                BalancePlan* out) {
  std::vector<Piece> relayPieces;
  std::vector<char> hasRelay(nodes.nranks, 0);
  if (allowRelay) {
    std::vector<uint64_t> send(total);
    assignRelays(nodes, rowsTo, cap, &send, &relayPieces);
    // Pieces of one flow were made consecutively; the stable sort keeps their order.
    std::stable_sort(relayPieces.begin(), relayPieces.end(),
                     [](const Piece& a, const Piece& b) { return a.flow < b.flow; });
    for (const Piece& p : relayPieces) hasRelay[p.flow / nodes.numNodes] = 1;
  }
  clearRoutes(nodes, out);
  assignForwarders(nodes, rowsTo, cap, relayPieces, hasRelay, out);
  computeLoads(nodes, out);
}

}  // namespace

FUSCO_PARAM_INT(
    BalanceSlack, "FUSCO_BALANCE_SLACK", 64, 0, 1 << 20,
    "GREEDY balance: keep same-index rails within this many 1/1024 of the bound (no relay/split)");

void planBalance(Balance mode, const NodeMap& nodes, const std::vector<uint64_t>& rowsTo,
                 bool allowRelay, BalancePlan* out, uint32_t slack1024) {
  if (mode != Balance::None && mode != Balance::Static && mode != Balance::Greedy)
    throw std::invalid_argument("planBalance: mode is not NONE, STATIC or GREEDY");
  if (rowsTo.size() != static_cast<size_t>(nodes.nranks) * nodes.numNodes)
    throw std::invalid_argument("planBalance: rowsTo must hold nranks * numNodes entries");
  if (rowsTo.size() > UINT32_MAX)
    throw std::invalid_argument("planBalance: more than 2^32 (rank, node) flows");
  FlowTotals t;
  flowTotals(nodes, rowsTo, &t);
  out->lowerBound = computeLowerBound(nodes, t, allowRelay);
  if (mode != Balance::Greedy) {
    planStatic(nodes, rowsTo, t, out);
    return;
  }
  // Any cap >= lowerBound is reached by the same argument (the top of this file).
  const uint64_t cap = out->lowerBound + out->lowerBound * slack1024 / 1024;
  if (slack1024 > 0 && t.staticMax <= cap) {
    planStatic(nodes, rowsTo, t, out);
    return;
  }
  planGreedy(nodes, rowsTo, t.send, allowRelay, cap, out);
  // Cannot trigger while the proof above holds; a cheap guard for the "never worse" promise.
  if (out->maxLoad > t.staticMax) planStatic(nodes, rowsTo, t, out);
}

const char* balanceName(Balance mode) {
  switch (mode) {
    case Balance::None:
      return "NONE";
    case Balance::Static:
      return "STATIC";
    case Balance::Greedy:
      return "GREEDY";
  }
  return "?";
}

std::string describeBalance(Balance mode, const BalancePlan& plan) {
  size_t routes = 0, relayed = 0, split = 0;
  const size_t nranks = plan.sendLoad.size();
  const size_t nn = nranks == 0 ? 1 : std::max<size_t>(1, plan.routes.size() / nranks);
  for (size_t f = 0; f < plan.routes.size(); ++f) {
    const std::vector<RailRoute>& rs = plan.routes[f];
    routes += rs.size();
    if (rs.size() > 1) ++split;
    const int s = static_cast<int>(f / nn);
    for (const RailRoute& r : rs)
      if (r.relay != s) ++relayed;
  }
  // Ratio in thousandths, integer only; 1.000 when there is nothing to send.
  const uint64_t milli = plan.lowerBound == 0 ? 1000 : plan.maxLoad * 1000 / plan.lowerBound;
  char buf[256];
  snprintf(buf, sizeof buf,
           "balance %s: maxLoad %" PRIu64 " lowerBound %" PRIu64 " ratio %" PRIu64 ".%03" PRIu64
           " routes %zu relayed %zu split %zu",
           balanceName(mode), plan.maxLoad, plan.lowerBound, milli / 1000, milli % 1000, routes,
           relayed, split);
  return buf;
}

}  // namespace fusco
