// MoE test cases and checkers shared by tests/mp/test_moe_*.cc (docs/API.md, "MoE dispatch and
// combine"), checked against the sequential reference in harness/moe_reference.h. Every rank
// regenerates every rank's routing and rows from the test seed, so the reference sees all inputs;
// each rank checks its own recvX (bit-exact, padding rows zero over a 0xA5 poison), numRecvRows,
// tokensPerLocalExpert, stats and combine `out`. Checks record gtest failures; they do not abort.
//
// Stats asserted (payload bytes this rank put on each path, self excluded):
//  - dispatch, RANK: one row per (token, distinct remote rank); NONE: one per (token, remote slot).
//  - combine, NONE: every received row goes back raw: rows * hidden * elemSize.
//  - combine, RANK: one partial row per (source token, this rank) back to the source, plus the
//    routing weights this rank ships to the expert side first (4 bytes per own (token, slot) whose
//    expert is on a remote rank; ones when topkWeights is NULL).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fusco.h"
#include "harness/moe_reference.h"
#include "harness/mp_harness.h"

namespace fusco::test {

using Bytes2D = std::vector<std::vector<uint8_t>>;

// HeavyRails (several nodes): the first rank of every node sends each token to experts of one
// other node; the other ranks do so for a third of their tokens and keep the rest on their node.
enum class Route { Random, OneExpert, SomeExpertsIdle, HeavyRails };

struct MoeCase {
  int nranks = 2;
  int numExperts = 8;
  int topk = 2;
  std::vector<size_t> numTokens;  // [nranks]
  int align = 0;
  std::vector<int> placement;  // empty: contiguous blocks
  int localSize = 0;           // config.localSize of the comm (0: env or one node)
  Route route = Route::Random;
  int unusedPercent = 15;  // chance that a slot is -1
  int fixedExpert = 0;     // Route::OneExpert
  int balance = FUSCO_BALANCE_AUTO;
};

inline const std::vector<int> kAllModes = {FUSCO_DEDUP_NONE, FUSCO_DEDUP_RANK, FUSCO_DEDUP_NODE,
                                           FUSCO_DEDUP_AUTO};

const char* dedupName(int d);

// Every rank's routing for case c, derived from seed (nodeOf follows config.localSize, then
// FUSCO_LOCAL_SIZE, else one node).
MoeRefProblem makeProblem(const MoeCase& c, uint64_t seed);

// Every rank's dispatch input rows: byte j of row t of rank s depends on (seed, s, t, j) and is
// never 0 nor the poison.
Bytes2D makeRows(const MoeRefProblem& p, uint64_t seed, size_t rowBytes);

fuscoConfig_t commConfig(const MoeCase& c, int timeoutMs = 60000);
fuscoMoeConfig_t moeConfig(const MoeCase& c, int dedup);

// "[3 ranks, 12 experts, top-4, ...]" for failure messages.
std::string caseName(const MoeCase& c, int dedup, size_t rowBytes);

// Plans on comm and checks the receive counts; returns the handle or nullptr (failure recorded).
fuscoMoeHandle_t planChecked(fuscoComm_t comm, const RankCtx& ctx, const MoeCase& c,
                             const MoeRefProblem& p, const MoeRefDispatch& d, int dedup,
                             const std::string& what);

// Checks h's numRecvRows and tokensPerLocalExpert against the reference (failures recorded).
void recvCountsChecked(fuscoComm_t comm, fuscoMoeHandle_t h, const RankCtx& ctx,
                       const MoeRefDispatch& d, const std::string& what);

// When on (in this rank process), dispatchChecked lands rows in a recvX from fuscoMemAlloc, so
// peers on the node write final rows straight into it (the one-copy path) instead of staging.
void setMoeArenaBuffers(bool on);

// Dispatch on h into a poisoned recvX; checks bytes and dispatch stats. Returns recvX.
std::vector<uint8_t> dispatchChecked(fuscoComm_t comm, fuscoMoeHandle_t h, const RankCtx& ctx,
                                     const MoeRefProblem& p, const MoeRefDispatch& d,
                                     const Bytes2D& x, size_t rowBytes, int dedup,
                                     const std::string& what);

// Plan + dispatch + checks for every dedup mode in `modes` on one comm.
void runDispatchCase(fuscoComm_t comm, const RankCtx& ctx, const MoeCase& c, uint64_t seed,
                     size_t rowBytes, const std::vector<int>& modes);

// A combine problem: routing (token 0 of every rank has no valid expert), value rows exact in
// every combine type, a per-row scaled expert output and routing weights.
struct CombineSetup {
  MoeCase c;
  MoeRefProblem p;
  Bytes2D x;  // dispatch input: hidden elements of dt per row
  MoeRefDispatch d;
  Bytes2D expertOut;                        // [rank] per-row transform of the reference recvX
  std::vector<std::vector<float>> weights;  // [rank][token * topk]
  fuscoDataType_t dt;
  size_t hidden;
};

CombineSetup makeCombine(const MoeCase& c, uint64_t seed, fuscoDataType_t dt, size_t hidden);
// The same around a given routing p (used as is: no token is cleared).
CombineSetup makeCombineFor(const MoeCase& c, MoeRefProblem p, uint64_t seed, fuscoDataType_t dt,
                            size_t hidden);

// Plans, dispatches (checked), combines twice with and without weights and checks `out` bitwise
// against the reference and the combine stats. Returns the outputs (weighted, unweighted).
std::vector<std::vector<uint8_t>> combineChecked(fuscoComm_t comm, const RankCtx& ctx,
                                                 const CombineSetup& s, int dedup);

// combineChecked's dispatch and combines on a handle planned (or replanned) for s, which stays.
// *recvX (when non-NULL) receives the dispatch output.
std::vector<std::vector<uint8_t>> combineOnHandle(fuscoComm_t comm, fuscoMoeHandle_t h,
                                                  const RankCtx& ctx, const CombineSetup& s,
                                                  int dedup, std::vector<uint8_t>* recvX = nullptr);

// Runs combineChecked in NONE, RANK and AUTO and checks they agree bitwise.
void combineAllModes(fuscoComm_t comm, const RankCtx& ctx, const CombineSetup& s);

}  // namespace fusco::test
