// tools/fusco_sim: link accounting from the REAL planner and balancer (src/plan), and the link
// model that turns bytes per link into time. Pure host code: no transport, no CUDA.
//
// Accounting (dispatch; combine is its mirror: every link's send and receive bytes swapped, since
// combine returns the same rows the same way back, one partial per (token, node) under NODE dedup):
//   nccl-like         planSend(Dedup::None): one row per (token, expert) to each remote rank over
//   the
//                     source's NIC, to each same-node rank over NVLink; permute passes around it
//                     (the sender's gather and the receiver's sort-chunks each read and write the
//                     rows once: HBM bytes = rows sent + rows received).
//   deepep-like       NODE dedup (planSend Rank + nodeTokensOf + nodeSegments + planNodeSend) with
//                     planBalance(Static), hops overlapped, the same permute passes as nccl-like.
//   fusco-paper-like  NODE dedup with the FUSCO paper's balancer (paperBalance below), hops one
//                     after the other, no permute passes (fused).
//   fusco             NODE dedup with planBalance(Greedy, relays, slack), hops pipelined, fused.
// Under NODE dedup: a segment's rows leave through the relay's NIC (first crossing NVLink from the
// source when relay != source) and land at the forwarder's NIC; the forwarder fans each row out
// over NVLink to every other rank of its node that needs it (from planNodeSend's forward
// metadata); rows to same-node ranks go direct over NVLink (the Rank plan's rows).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/topology.h"
#include "plan/balance.h"
#include "plan/moe_plan.h"

namespace fusco {
namespace sim {

enum class Strategy { NcclLike = 0, DeepepLike = 1, FuscoPaperLike = 2, Fusco = 3 };
constexpr int kNumStrategies = 4;
const char* strategyName(Strategy s);

// Bytes per link of one phase (dispatch), one entry per rank.
struct LinkBytes {
  std::vector<uint64_t> nicSend, nicRecv;  // the rank's NIC (rail)
  std::vector<uint64_t> nvSend, nvRecv;    // the rank's intra-node (NVLink) ports
  std::vector<uint64_t> hbm;               // permutation bytes (read + write counted once per row)
  void reset(int nranks);
  uint64_t totalNicSend() const;
  uint64_t totalNvSend() const;
};

// The FUSCO paper's balancer (Algorithm 1), as we read it: on every node sort the ranks by their
// inter-node send load (descending, ties: lower rank), rotate that order by the node index, and
// group ranks by position; a rank at position p sends all its rows for node N through its own NIC
// to the rank at position p of N. Only forwarders are chosen (no relays, no splits).
// The node map of a simulated cluster: nodes x gpus ranks, gpus per node, node-major.
NodeMap simNodeMap(int nodes, int gpus);

// [in] rowsTo: [nranks * numNodes] as planBalance takes it. [out] out: routes, loads, maxLoad.
void paperBalance(const NodeMap& nodes, const std::vector<uint64_t>& rowsTo, BalancePlan* out);

// The router output of one rank: tokens x topk expert ids.
using RouteFn = std::function<void(int rank, std::vector<int64_t>* topkIdx)>;

struct AccountSpec {
  size_t tokens = 0;  // per rank
  int topk = 8;
  size_t rowBytes = 0;      // hidden x element size
  uint32_t slack1024 = 64;  // fusco's GREEDY slack
};

struct Accounting {
  LinkBytes links[kNumStrategies];
  uint64_t netCopies = 0;  // (token, remote node) pairs over all ranks: the line-rate bound's rows
  uint64_t flatRemoteRows = 0;          // (token, expert) rows to remote ranks (nccl-like)
  BalancePlan balance[kNumStrategies];  // deepep-like, fusco-paper-like, fusco (nccl-like: empty)
};

// Runs the planner for every rank of the cluster (two passes over the routing: counts, then the
// node plans of each strategy) and fills *out.
void accountCluster(const MoeShape& shape, const NodeMap& nodes, const RouteFn& route,
                    const AccountSpec& spec, Accounting* out);

// ---------------------------------------------------------------- link model -> time
struct LinkModel {
  double nicGBs = 50;       // line rate per NIC and direction (400 Gb/s)
  double nvlinkGBs = 170;   // effective intra-node bandwidth per GPU and direction
  double permuteGBs = 500;  // rows per second of one permutation pass (bytes / s)
  double stepUs = 10;       // latency per communication step (hop)
  double sliceKB = 512;     // pipeline slice
};

enum class HopMode { Flat, Sequential, Pipelined };

struct StrategyModel {
  double nicEff = 0.67;
  HopMode hops = HopMode::Pipelined;
  bool permute = false;
  double fixedMs = 4;  // per dispatch + combine
};

struct PhaseTime {
  double ms = 0, interMs = 0, intraMs = 0, permMs = 0;
  std::string busiest;  // e.g. "nic-tx r12"
  uint64_t busiestBytes = 0;
};

// Time of one phase: per hop the busiest link's bytes / its bandwidth (the max over links), hops
// combined per mode (flat: one step, max; sequential: sum; pipelined: max plus one slice), permute
// passes added before / after. combine = true swaps every link's send and receive sides.
PhaseTime phaseTime(const LinkBytes& b, bool combine, const LinkModel& m, const StrategyModel& s);

// Line-rate lower bound of dispatch + combine in ms: netCopies rows spread over every NIC at line
// rate, each way, hops overlapped, no fixed cost.
double lowerBoundMs(uint64_t netCopies, size_t rowBytes, int nranks, const LinkModel& m);

}  // namespace sim
}  // namespace fusco
