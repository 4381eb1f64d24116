// Low-latency dispatch and combine on host communicators (docs/API.md, "Low-latency dispatch and
// combine") for the [mp] suites: the calls with this rank's regenerated inputs, and checked rounds
// against the sequential reference of harness/ll_reference.h. On host comms a call returns once its
// receive is done (with FUSCO_LL_RECV_HOOK, once its hook ran), so results are read right away.
// Checks record gtest failures and do not abort, so every rank keeps making the same calls.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fusco.h"
#include "harness/ll_reference.h"
#include "harness/mp_harness.h"

namespace fusco::test {

// Poisoned bytes past the end of every combine `out`; they must stay poison.
constexpr size_t kLlTailBytes = 64;

// A host comm of ctx's ranks on one node (localSize = nranks, so FUSCO_LOCAL_SIZE in the
// environment cannot split it), with timeoutMs.
fuscoConfig_t llCommConfig(const RankCtx& ctx, int timeoutMs = 60000);

// The smallest useful case of n ranks: 2 experts per rank, top-2, 4 tokens at most per rank (2
// each), rows of 128 bf16: for tests of the calls' life cycle rather than their data.
LlCase llSmallCase(int n);

// fuscoLowLatencyCreate for c on comm; NULL (failure recorded) when it fails.
fuscoLowLatency_t llCreate(fuscoComm_t comm, const LlCase& c);

// This rank's inputs to the calls (NULL where empty).
fuscoResult_t llDispatchCall(fuscoLowLatency_t ll, const LlInputs& in, int rank, int format,
                             unsigned int flags, fuscoLowLatencyDispatch_t* d);
fuscoResult_t llCombineCall(fuscoLowLatency_t ll, const fuscoLowLatencyDispatch_t* d,
                            const LlInputs& in, int rank, const std::vector<uint8_t>& expertOut,
                            bool weighted, unsigned int flags, void* out, unsigned long long* hook);

// The fields a dispatch returned: buffer, format, a hook exactly when asked for, every output.
::testing::AssertionResult llDispatchFields(const fuscoLowLatencyDispatch_t& d, int format,
                                            int buffer, bool hooked);

// The received rows copied out of host memory.
LlRecv llFetchHost(const fuscoLowLatencyDispatch_t& d, const LlCase& c, int format);

struct LlRound {
  int format = FUSCO_LL_BF16;
  bool hook = false;     // both calls with FUSCO_LL_RECV_HOOK, completed by their hooks
  bool weighted = true;  // topkWeights, else NULL
  int buffer = 0;        // the half the dispatch must use
};

// Dispatch (with its hook when asked) and the checks of llDispatchFields and llRecvMatches.
// Returns false when the call failed; *d and *got hold the result.
bool llDispatchChecked(fuscoComm_t comm, fuscoLowLatency_t ll, const RankCtx& ctx,
                       const LlInputs& in, const LlRound& o, const std::string& what,
                       fuscoLowLatencyDispatch_t* d, LlRecv* got);

// Combine of d with the tests' expert outputs of got into a poisoned `out` (plus a poisoned tail),
// checked bitwise against llRefCombine. Returns out (empty when the call failed).
std::vector<uint8_t> llCombineChecked(fuscoComm_t comm, fuscoLowLatency_t ll, const RankCtx& ctx,
                                      const LlInputs& in, const LlRound& o,
                                      const fuscoLowLatencyDispatch_t& d, const LlRecv& got,
                                      const std::string& what);

// One checked dispatch and its checked combine. Returns the combine's out.
std::vector<uint8_t> llRoundChecked(fuscoComm_t comm, fuscoLowLatency_t ll, const RankCtx& ctx,
                                    const LlInputs& in, const LlRound& o, const std::string& what);

// On a fresh comm and buffer for in(format).c: one checked round (llRoundChecked) per format,
// bf16 then FP8, alternating buffers; label names the case in failures.
void llFormatRounds(const RankCtx& ctx, const std::function<LlInputs(int format)>& in,
                    const std::string& label);

// True when msg names `what` number n ("token 5", "slot=1", "token #5"; 5 not matched in 15).
bool llNamesNumber(const std::string& msg, const std::string& what, int n);

}  // namespace fusco::test
