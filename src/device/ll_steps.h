// The low-latency path's arithmetic and addresses (docs/DESIGN.md, "Low-latency mode"), written
// once (FUSCO_HD) for the kernels (ll_kernels.cu) and their host twin (ll_twin.cc): the buffer's
// regions, the e4m3 conversion and FP8 scales, the order of a token's combine terms, and the
// acquire / release words the ranks signal each other with.
//
// One rank's buffer is two halves and a state block. In half h (dispatch n uses n % 2):
//   dispRows   [local][ranks][maxTokens] row slots that source ranks write (rowStride bytes each)
//   dispScales [local][ranks][maxTokens][groups] fp32 (FP8)
//   dispSlot   [local][ranks][maxTokens] int32: t * maxTopk + k of the row on its source
//   dispCount  [local][ranks] u64: ((epoch + 1) << 32) | rows, posted by the source
//   packX, packScales, packSlot, packRank, packToken: the packed receive side, [local][ranks *
//              maxTokens] rows (what fuscoLowLatencyDispatch_t points at), recvCount [local] int32,
//              recvLayout [local][ranks] int64
//   combRows   [maxTokens][maxTopk] bf16 rows that expert ranks write back
//   combFlag   [ranks] u64: epoch + 1, posted by each expert rank after its rows
//   dispFreed  [ranks] u64: epoch + 1, posted by each receiver once it has read this half's rows
//   combFreed  [ranks] u64: the same for combine
// Every word only grows (epochs count the uses of a half and live in the state block, in device
// memory, so a replayed CUDA graph advances them too), so every wait is "word >= value".
#pragma once

#include <cstddef>
#include <cstdint>

#include "device/op_steps.h"
#include "device/reduce_math.h"

namespace fusco {
namespace ll {

constexpr uint32_t kGroup = 128;  // channels per FP8 scale
constexpr uint32_t kMaxTopk = 64;
constexpr uint32_t kNoBad = 0xffffffffu;

// The four halves of a call, as kernel phases and as state counters.
enum Phase : uint32_t {
  kDispatchSend = 0,
  kDispatchRecv = 1,
  kCombineSend = 2,
  kCombineRecv = 3,
  kPhases = 4
};

struct Dims {
  uint32_t ranks = 0, local = 0, maxTokens = 0, hidden = 0, maxTopk = 0;
};

// Byte offsets into one rank's buffer (half regions are relative to the half's start).
struct Layout {
  uint64_t rowStride = 0;  // a bf16 row rounded up to 16 bytes
  uint64_t groups = 0;     // FP8 scales per row: hidden / 128 (0 when hidden % 128 != 0)
  uint64_t dispRows = 0, dispScales = 0, dispSlot = 0, dispCount = 0;
  uint64_t packX = 0, packScales = 0, packSlot = 0, packRank = 0, packToken = 0;
  uint64_t recvCount = 0, recvLayout = 0;
  uint64_t combRows = 0, combFlag = 0, dispFreed = 0, combFreed = 0;
  uint64_t halfBytes = 0;
  uint64_t state = 0, total = 0;  // the state block after both halves; the whole buffer
};

// This rank's own counters (never written by peers).
struct State {
  uint64_t epoch[kPhases][2];
  uint32_t done[kPhases][2];    // blocks of the running phase that finished (the last one resets)
  uint32_t failed[kPhases][2];  // a wait of the running phase gave up: post nothing
  uint32_t badCode;             // first invalid slot of the last dispatch: (t << 8) | k; kNoBad
  uint32_t pad;
};

// Words the host reads without synchronizing the stream (mapped pinned memory on CUDA comms).
struct HostWords {
  uint32_t release;   // set by the host: the comm broke, every wait gives up
  uint32_t bad;       // (t << 8 | k) + 1 of an invalid id a dispatch skipped; 0: none
  uint32_t timedOut;  // peer + 1 of a wait that passed the timeout; 0: none
  uint32_t phase;     // the phase of that wait
};

// The arguments of one kernel launch (or twin run).
struct Args {
  Dims d;
  Layout l;
  uint32_t rank = 0, half = 0, numTokens = 0, topk = 0, numExperts = 0, fp8 = 0;
  char* self = nullptr;                 // this rank's buffer
  const uint64_t* peers = nullptr;      // [ranks] every rank's buffer as mapped here
  const uint16_t* x = nullptr;          // dispatch: [numTokens][hidden] bf16
  const int64_t* topkIdx = nullptr;     // [numTokens][topk]
  const float* weights = nullptr;       // combine: [numTokens][topk] or null (weight 1)
  const uint16_t* expertOut = nullptr;  // combine: the packed layout, bf16
  uint16_t* out = nullptr;              // combine: [numTokens][hidden] bf16
  HostWords* host = nullptr;            // as the executor addresses it
  uint64_t timeoutNs = 0;
};

FUSCO_HD inline char* halfOf(const Args& a, uint64_t base) {
  return reinterpret_cast<char*>(base) + static_cast<uint64_t>(a.half) * a.l.halfBytes;
}
FUSCO_HD inline char* ownHalf(const Args& a) {
  return halfOf(a, reinterpret_cast<uint64_t>(a.self));
}
FUSCO_HD inline State* stateOf(const Args& a) {
  return reinterpret_cast<State*>(a.self + a.l.state);
}
// Packed rows per local expert.
FUSCO_HD inline uint64_t packRows(const Dims& d) {
  return static_cast<uint64_t>(d.ranks) * d.maxTokens;
}
// The slot of (local expert le, source r, i-th row) in dispRows / dispSlot / dispScales.
FUSCO_HD inline uint64_t dispIndex(const Dims& d, uint32_t le, uint32_t r, uint64_t i) {
  return (static_cast<uint64_t>(le) * d.ranks + r) * d.maxTokens + i;
}
FUSCO_HD inline uint64_t packedRowBytes(const Args& a) {
  return a.fp8 ? a.d.hidden : static_cast<uint64_t>(a.d.hidden) * 2;
}
FUSCO_HD inline bool validId(int64_t e, uint32_t numExperts) {
  return e >= 0 && e < static_cast<int64_t>(numExperts);
}
// Whether slot k of a token (ids: its topk ids) moves a row: a valid id not seen at a lower slot
// (a repeated expert is refused, as fuscoMoeDispatch refuses it, so no source sends an expert
// more than one row per token and maxTokens slots per (expert, source) always suffice).
FUSCO_HD inline bool movesSlot(const int64_t* ids, uint32_t k, uint32_t numExperts) {
  if (!validId(ids[k], numExperts)) return false;
  for (uint32_t j = 0; j < k; ++j)
    if (ids[j] == ids[k]) return false;
  return true;
}
// A slot the call reports: neither -1 nor a row it moves.
FUSCO_HD inline bool badSlot(const int64_t* ids, uint32_t k, uint32_t numExperts) {
  return ids[k] != -1 && !movesSlot(ids, k, numExperts);
}

// Release / acquire on words other ranks read and write (system scope: peers are processes).
using op::loadAcquire;
using op::storeRelease;

FUSCO_HD inline float bf16Value(uint16_t h) { return asFloat(static_cast<uint32_t>(h) << 16); }
// fp32 -> e4m3 (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities): round to
// nearest even, saturate to +-448, NaN -> 0x7f with its sign.
FUSCO_HD inline uint8_t floatToE4m3(float f) {
  const uint32_t u = asBits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 448 (and inf)
  if (a < 0x3c800000u) {
    // Below 2^-6: multiples of 2^-9. Adding 2^14 puts 2^-9 at the mantissa's last bit, and the
    // fp32 add rounds to nearest even (8 is the smallest normal, 2^-6).
    const uint32_t m = asBits(addRn(asFloat(a), 16384.0f)) - 0x46800000u;
    return static_cast<uint8_t>(sign | m);
  }
  const uint32_t b = a - (120u << 23);  // rebias 127 -> 7
  const uint32_t r = (b + 0x7ffffu + ((b >> 20) & 1u)) >> 20;
  return static_cast<uint8_t>(sign | r);
}

// The FP8 scale of a group whose largest magnitude is amax.
FUSCO_HD inline float groupScale(float amax) { return divRn(amax > 1e-4f ? amax : 1e-4f, 448.0f); }
FUSCO_HD inline float absOf(float v) { return asFloat(asBits(v) & 0x7fffffffu); }
// max(m, |v|), ignoring NaN (a NaN element never raises the group's scale).
FUSCO_HD inline float amaxWith(float m, float v) {
  const float av = absOf(v);
  return av > m ? av : m;
}

// A token's combine terms in the fixed tree's order (docs/API.md, "Combine"): its valid slots
// grouped by the expert's rank, ranks ascending, k ascending within a rank. Writes the k of each
// term into order[] and whether it closes its rank's group into last[]; returns the count.
FUSCO_HD inline uint32_t termOrder(const int64_t* ids, uint32_t topk, uint32_t numExperts,
                                   uint32_t local, uint8_t* order, uint8_t* last) {
  uint32_t n = 0;
  for (uint32_t k = 0; k < topk; ++k) {
    if (!movesSlot(ids, k, numExperts)) continue;
    const uint32_t rk = static_cast<uint32_t>(ids[k]) / local;
    uint32_t at = n++;
    while (at > 0 && static_cast<uint32_t>(ids[order[at - 1]]) / local > rk) {
      order[at] = order[at - 1];
      --at;
    }
    order[at] = static_cast<uint8_t>(k);
  }
  for (uint32_t i = 0; i < n; ++i)
    last[i] = i + 1 == n || static_cast<uint32_t>(ids[order[i + 1]]) / local !=
                                static_cast<uint32_t>(ids[order[i]]) / local;
  return n;
}

// One element of a token's combine sum over its ordered terms (rows[i], weight w[i]; w null:
// weight 1): each rank's group in fp32, rounded to bf16, the groups summed in fp32, rounded.
FUSCO_HD inline uint16_t combineElement(const uint16_t* const* rows, const float* w,
                                        const uint8_t* last, uint32_t n, uint64_t j) {
  float acc = 0.0f, grp = 0.0f;
  for (uint32_t i = 0; i < n; ++i) {
    const float y = bf16Value(rows[i][j]);
    grp = addRn(grp, w != nullptr ? mulRn(w[i], y) : y);
    if (last[i]) {
      acc = addRn(acc, bf16Value(floatToBf16Inline(grp)));
      grp = 0.0f;
    }
  }
  return floatToBf16Inline(acc);
}

}  // namespace ll
}  // namespace fusco
