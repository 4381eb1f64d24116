// A sequential reference for low-latency dispatch and combine (docs/API.md, "Low-latency dispatch
// and combine"): every rank's routing and bf16 rows regenerated from a seed, what each rank must
// find in its receive slots (rows, counts, per-source layout, source tokens and, for FP8, the e4m3
// bytes and scales of the reference quantiser below), the expert outputs the tests compute from
// received rows, and every rank's combine `out` through moeRefCombine's fixed tree on one node.
// Independent of the library: plain loops and its own e4m3 conversion. Host code only; the checks
// take copies of what the library returned, so [mp] and [gpu] suites share them.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fusco.h"

namespace fusco::test {

constexpr int kLlGroup = 128;  // channels per FP8 scale

// fp32 -> e4m3fn (1 sign, 4 exponent bits of bias 7, 3 mantissa bits, no infinities, 0x7f and
// 0xff are NaN): round to nearest, ties to even, on the bits; subnormals down to 2^-9; magnitudes
// past 448 (infinity included) saturate to +-448 (0x7e); NaN gives 0x7f with the sign bit.
uint8_t refFloatToE4m3(float v);
// The exact value of an e4m3fn byte (NaN for 0x7f and 0xff).
float refE4m3ToFloat(uint8_t q);

// FP8 dispatch of one bf16 row: for each group of 128 channels, amax = max |x| in fp32,
// scale = max(amax, 1e-4f) / 448.0f and q = e4m3(x / scale) (IEEE fp32 division).
// q: hidden bytes; scales: hidden / 128 floats.
void llRefQuantize(const uint8_t* bf16Row, int hidden, uint8_t* q, float* scales);

struct LlCase {
  int nranks = 2;
  int numExperts = 8;  // contiguous blocks of numExperts / nranks per rank
  int topk = 4;
  int maxTopk = 8;
  int maxTokensPerRank = 128;
  int hidden = 64;             // bf16 elements per row
  std::vector<int> numTokens;  // [nranks]
  int unusedPercent = 15;      // chance that a slot is -1
  int repeatPercent = 0;       // chance that a slot repeats an expert of an earlier slot
  int idleEvery = 0;           // > 0: experts e with e % idleEvery == 1 receive nothing
};

// Every rank's inputs, identical on every rank for the same case and seed. Rows are random bf16
// values (never the 0xA5A5 poison pattern); some groups of 128 are all zero or tiny, so the FP8
// scale floor and e4m3 subnormals occur. With repeats, no source sends an expert more than
// maxTokensPerRank rows (the slots past that become -1).
struct LlInputs {
  LlCase c;
  std::vector<std::vector<int64_t>> topkIdx;  // [rank][token * topk], -1: unused slot
  std::vector<std::vector<uint8_t>> x;        // [rank][token * hidden] bf16
  std::vector<std::vector<float>> weights;    // [rank][token * topk]
};
LlInputs makeLlInputs(const LlCase& c, uint64_t seed);

fuscoLowLatencyConfig_t llConfig(const LlCase& c);
int llNumLocal(const LlCase& c);
size_t llCap(const LlCase& c);  // receive rows per local expert: maxTokensPerRank * nranks
size_t llRowBytes(const LlCase& c, int format);
// "[3 ranks, 12 experts, top-4 of 8, hidden 64 BF16, tokens 8 0 64]" for messages.
std::string llCaseName(const LlCase& c, int format);

// Where a received row comes from.
struct LlRow {
  int src;
  int token;
  int slot;
};

// What one rank must hold after a dispatch. Ids outside [-1, numExperts) move nothing.
struct LlExpect {
  std::vector<std::vector<LlRow>> rows;    // [local expert] in receive order
  std::vector<int64_t> layout;             // [local expert * nranks + src]
  std::vector<std::vector<uint8_t>> x;     // [local expert] rows * rowBytes
  std::vector<std::vector<float>> scales;  // FP8: [local expert] rows * hidden / 128
};
LlExpect llRefDispatch(const LlInputs& in, int rank, int format);

// A rank's dispatch result copied out of the low-latency buffer: the counts, the layout, and the
// counted rows of every local expert (no more than its capacity).
struct LlRecv {
  std::vector<int> count;                  // [local expert]
  std::vector<int64_t> layout;             // [local expert * nranks + src]
  std::vector<std::vector<uint8_t>> x;     // [local expert] count rows * rowBytes
  std::vector<std::vector<float>> scales;  // FP8 only
  std::vector<std::vector<int>> srcToken;  // [local expert] count entries
};
// Copies bytes from library memory (memcpy on host comms, cudaMemcpy on CUDA ones); false on
// failure (recorded by the caller's copy).
using LlCopyOut = std::function<bool(void* dst, const void* src, size_t bytes)>;
LlRecv llFetch(const fuscoLowLatencyDispatch_t& d, const LlCase& c, int format,
               const LlCopyOut& copy);

// What llFetch gives when the rank received exactly `want` (for expert outputs computed before a
// call, as a CUDA graph replay needs them).
LlRecv llRecvOf(const LlExpect& want);

// Counts, layout, source tokens, row bytes and scales all exact; names the first differences.
::testing::AssertionResult llRecvMatches(const LlCase& c, int format, const LlExpect& want,
                                         const LlRecv& got);

// The tests' expert: y_j = bf16(v_j * m + b) for the row's values v (bf16, or e4m3 times the
// group's scale), m and b depending on the global expert id; every operation rounded in fp32.
void llExpertRow(int globalExpert, int format, int hidden, const uint8_t* row, const float* scales,
                 uint8_t* y);
// expertOut in recvX's layout ([local expert][cap][hidden] bf16) from what this rank received:
// the counted rows through llExpertRow, every other row kFiller bytes (combine must not read them).
std::vector<uint8_t> llExpertOut(const LlCase& c, int format, int rank, const LlRecv& got);

// This rank's combine `out` ([numTokens][hidden] bf16): the experts' outputs of the reference
// rows summed with the weights (or 1) in the fixed tree of docs/API.md, "Combine" (per rank k
// ascending, ranks ascending, each level rounded to bf16); tokens without a valid slot are zero.
std::vector<uint8_t> llRefCombine(const LlInputs& in, int rank, int format, bool weighted);

// Bitwise comparison of two combine outputs, naming the first differing elements.
::testing::AssertionResult llOutMatches(const std::vector<uint8_t>& want,
                                        const std::vector<uint8_t>& got, int hidden,
                                        const std::string& what);

// Whether slot k of a token (ids: its topk ids) moves a row: a valid id no lower slot of the token
// chose (a repeated expert is refused, and reported, like an invalid id).
bool llRefMoves(const int64_t* ids, int k, int numExperts);
// The first (token, slot) of rank's routing that the call refuses (an invalid or repeated id);
// false when there is none.
bool llRefFirstRefused(const LlInputs& in, int rank, int* token, int* slot);

}  // namespace fusco::test
