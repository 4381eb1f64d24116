// The NIC / forwarder load balancer for node-level dedup: pure, deterministic host code.
//
// With FUSCO_DEDUP_NODE each rank s sends, per remote node N, rowsTo[s][N] rows that cross the
// network once, to one "forwarder" rank on N that fans them out over the intra-node path. Every
// rank has its own NIC (rail); a rail carries the network rows its rank sends and the network rows
// it receives as a forwarder, in both directions at once, so the figure to minimise is
//   maxLoad = max over ranks r of max(sendLoad[r], recvLoad[r]).
// Send and receive sides are independent under that figure: relays (which NIC on the source node a
// row leaves through) decide only the send loads, forwarders only the receive loads.
//
// Modes:
//   NONE, STATIC: one route per (s, N): leaves through s's NIC, lands at the rank of N with s's
//     local index (modulo N's size). Same routes for both; NONE exists for symmetry with the API.
//   GREEDY: reaches the lower bound below exactly (proof in balance.cc), splitting flows by whole
//     rows only where that is needed to reach it:
//     - forwarders, per destination node N: the flows into N, largest first (ties: lower s), each
//       to the forwarder with the lowest receive load so far (ties: s's STATIC forwarder, then the
//       lowest local index); a flow that would push that forwarder above the target fills it to
//       the target and the rest goes on to the next lowest one. Splitting a flow over forwarders
//       adds no hop, so it is done with or without allowRelay.
//     - relays (allowRelay only), per source node X: a rank whose send total is above the target
//       hands its excess rows, from its largest flows first, to the peers of X with the lowest send
//       load, filling each up to the target. A relayed row first crosses the intra-node path.
//     The target is lowerBound; the result is never worse than STATIC (checked).
//
// lowerBound:
//   allowRelay:  max over nodes X of ceil(max(rows sent from X's ranks, rows received by X) / |X|)
//   !allowRelay: the same, or the largest single rank's send total if larger (it cannot be shared).
// Both are true lower bounds for every assignment of the corresponding kind, split or not.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/topology.h"
#include "fusco.h"

namespace fusco {

enum class Balance : int {
  None = FUSCO_BALANCE_NONE,
  Static = FUSCO_BALANCE_STATIC,
  Greedy = FUSCO_BALANCE_GREEDY
};

// One path for part of s's rows to node N: the rows leave through relay's NIC (relay == s, or a
// rank on s's node that receives them over the intra-node path first) and land at forwarder (a
// rank on N). rows > 0.
struct RailRoute {
  int relay = 0;
  int forwarder = 0;
  uint64_t rows = 0;

  bool operator==(const RailRoute& o) const {
    return relay == o.relay && forwarder == o.forwarder && rows == o.rows;
  }
};

struct BalancePlan {
  // [nranks * numNodes], index s * numNodes + N; empty where rowsTo is 0 or N == nodeOf[s]. Within
  // one (s, N) the routes are in a fixed order (s's own NIC first, then relays; forwarders in the
  // order their rows were assigned), and their rows sum to rowsTo[s * numNodes + N].
  std::vector<std::vector<RailRoute>> routes;
  std::vector<uint64_t> sendLoad;  // [nranks] network rows each rank's rail sends
  std::vector<uint64_t> recvLoad;  // [nranks] network rows each rank's rail receives
  uint64_t maxLoad = 0;            // max over ranks of max(sendLoad, recvLoad)
  uint64_t lowerBound = 0;         // see the top of this file
};

// Plans the routes of every (source rank, remote node) flow. Pure and deterministic: the same input
// gives the same plan on every rank (integer arithmetic, total orders for every tie).
// [in]  mode: NONE, STATIC or GREEDY (anything else throws std::invalid_argument).
// [in]  nodes: the communicator's node map.
// [in]  rowsTo: [nranks * numNodes] rows rank s sends to node N; entries for s's own node are
//       ignored. A different size throws std::invalid_argument.
// [in]  allowRelay: GREEDY may send part of a rank's rows through a local peer's NIC.
// [in]  slack1024: GREEDY only; a relay or a split costs an extra hop or message, so with slack
//       s > 0 GREEDY keeps STATIC's routes when their maxLoad is within lowerBound * (1 + s/1024)
//       and otherwise fills each rail only up to that figure (fewer relays and splits). 0: exact.
// [out] out: overwritten; its vectors' storage is reused, so a caller that keeps one BalancePlan
//       across layers allocates nothing once sizes settle.
void planBalance(Balance mode, const NodeMap& nodes, const std::vector<uint64_t>& rowsTo,
                 bool allowRelay, BalancePlan* out, uint32_t slack1024 = 0);

// FUSCO_BALANCE_SLACK: the slack1024 of the NODE plans' balancing, in [0, 2^20] (default 64).
int64_t paramBalanceSlack();

// "NONE", "STATIC", "GREEDY" (or "?" for a value outside the enum).
const char* balanceName(Balance mode);

// One line for logs and plan traces, e.g.
//   "balance GREEDY: maxLoad 1400 lowerBound 1400 ratio 1.000 routes 448 relayed 32 split 16"
// relayed: routes whose relay is not the source; split: (s, N) flows with more than one route.
std::string describeBalance(Balance mode, const BalancePlan& plan);

}  // namespace fusco
