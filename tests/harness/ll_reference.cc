// Sequential low-latency reference (see ll_reference.h): the definitions of docs/API.md,
// "Low-latency dispatch and combine", as plain loops.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "harness/ll_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

#include "harness/data_gen.h"
#include "harness/moe_reference.h"

namespace fusco::test {

bool llRefMoves(const int64_t* ids, int k, int numExperts) {
  if (ids[k] < 0 || ids[k] >= numExperts) return false;
  for (int j = 0; j < k; ++j)
    if (ids[j] == ids[k]) return false;
  return true;
}

bool llRefFirstRefused(const LlInputs& in, int rank, int* token, int* slot) {
  const LlCase& c = in.c;
  for (int t = 0; t < c.numTokens[rank]; ++t) {
    const int64_t* ids = in.topkIdx[rank].data() + static_cast<size_t>(t) * c.topk;
    for (int k = 0; k < c.topk; ++k)
      if (ids[k] != -1 && !llRefMoves(ids, k, c.numExperts)) {
        *token = t;
        *slot = k;
        return true;
      }
  }
  return false;
}

namespace {

uint32_t bitsOf(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

float bf16At(const uint8_t* row, size_t j) {
  const uint32_t h = static_cast<uint32_t>(row[2 * j] | (row[2 * j + 1] << 8));
  const uint32_t u = h << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

// Rounds `full` (an integer significand) right by `shift` bits to nearest, ties to even.
uint32_t roundShift(uint32_t full, int shift) {
  if (shift >= 32) return 0;
  const uint32_t q = full >> shift;
  const uint32_t rem = full & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return (rem > half || (rem == half && (q & 1u))) ? q + 1 : q;
}

// A random bf16 of magnitude (1 + m/128) * 2^(base - u), u in [0, 12]; 1 in 32 is a signed zero.
uint16_t randomBf16(std::mt19937_64& rng, int base) {
  const uint64_t h = rng();
  const uint16_t sign = (h & 1) ? 0x8000 : 0;
  if ((h >> 1) % 32 == 0) return sign;
  const int e = base - static_cast<int>((h >> 8) % 13);
  const uint16_t mant = static_cast<uint16_t>((h >> 16) & 0x7f);
  return static_cast<uint16_t>(sign | ((e + 127) << 7) | mant);
}

// A row of `hidden` bf16: each group of 128 is all zero (1 in 16), tiny (amax below the 1e-4
// scale floor, 2 in 16), small (4 in 16) or around 1 to 8.
void randomRow(std::mt19937_64& rng, int hidden, uint8_t* row) {
  int base = 0;
  bool zero = false;
  for (int j = 0; j < hidden; ++j) {
    if (j % kLlGroup == 0) {
      const int kind = static_cast<int>(rng() % 16);
      zero = kind == 0;
      base = kind <= 2 ? -15 : kind <= 6 ? -3 : 2;
    }
    const uint16_t v = zero ? 0 : randomBf16(rng, base);
    row[2 * j] = static_cast<uint8_t>(v & 0xff);
    row[2 * j + 1] = static_cast<uint8_t>(v >> 8);
  }
}

// Every rank's topkIdx: distinct experts per token (shuffled candidates), some -1 slots, some
// repeats of an earlier slot's expert; then at most maxTokensPerRank rows per (source, expert).
std::vector<int64_t> randomRouting(const LlCase& c, uint64_t seed, int s) {
  std::mt19937_64 rng(mix64(seed ^ (0x11ull + static_cast<uint64_t>(s))));
  std::vector<int64_t> candidates;
  for (int e = 0; e < c.numExperts; ++e)
    if (c.idleEvery <= 0 || e % c.idleEvery != 1) candidates.push_back(e);
  std::vector<int64_t> idx(static_cast<size_t>(c.numTokens[s]) * c.topk, -1);
  for (int t = 0; t < c.numTokens[s]; ++t) {
    std::shuffle(candidates.begin(), candidates.end(), rng);
    size_t pick = 0;
    int64_t* row = idx.data() + static_cast<size_t>(t) * c.topk;
    for (int k = 0; k < c.topk; ++k) {
      if (static_cast<int>(rng() % 100) < c.unusedPercent) continue;
      std::vector<int64_t> earlier;
      for (int j = 0; j < k; ++j)
        if (row[j] >= 0) earlier.push_back(row[j]);
      if (!earlier.empty() && static_cast<int>(rng() % 100) < c.repeatPercent) {
        row[k] = earlier[rng() % earlier.size()];
      } else if (pick < candidates.size()) {
        row[k] = candidates[pick++];
      }
    }
  }
  std::vector<int> perExpert(c.numExperts, 0);
  for (int64_t& e : idx) {
    if (e < 0) continue;
    if (perExpert[e] == c.maxTokensPerRank) {
      e = -1;
    } else {
      ++perExpert[e];
    }
  }
  return idx;
}

std::string rowName(const LlRow& r) {
  return "token " + std::to_string(r.token) + " slot " + std::to_string(r.slot) + " of rank " +
         std::to_string(r.src);
}

std::string layoutName(int64_t v) {
  return "(first " + std::to_string(static_cast<uint64_t>(v) >> 32) + ", rows " +
         std::to_string(static_cast<uint64_t>(v) & 0xffffffffu) + ")";
}

}  // namespace

uint8_t refFloatToE4m3(float v) {
  const uint32_t b = bitsOf(v);
  const uint8_t sign = static_cast<uint8_t>((b >> 24) & 0x80u);
  const int biased = static_cast<int>((b >> 23) & 0xffu);
  const uint32_t mant = b & 0x7fffffu;
  if (biased == 255) return static_cast<uint8_t>(sign | (mant != 0 ? 0x7f : 0x7e));
  if (biased == 0) return sign;  // fp32 zeros and subnormals are far below 2^-10
  const int e = biased - 127;
  const uint32_t full = (1u << 23) | mant;  // value = full * 2^(e - 23)
  uint32_t code;
  if (e < -6) {
    // Subnormal range: units of 2^-9; a carry into 8 units is the smallest normal, 0x08.
    code = roundShift(full, 14 - e);
  } else {
    uint32_t q = roundShift(full, 20);  // 1.xxx as 8..16
    int ex = e;
    if (q == 16) {
      q = 8;
      ++ex;
    }
    if (ex > 8 || (ex == 8 && q > 14)) return static_cast<uint8_t>(sign | 0x7e);
    code = (static_cast<uint32_t>(ex + 7) << 3) | (q & 7u);
  }
  return static_cast<uint8_t>(sign | code);
}

float refE4m3ToFloat(uint8_t q) {
  const int E = (q >> 3) & 15, M = q & 7;
  float mag;
  if (E == 15 && M == 7) {
    mag = std::numeric_limits<float>::quiet_NaN();
  } else if (E == 0) {
    mag = std::ldexp(static_cast<float>(M), -9);
  } else {
    mag = std::ldexp(static_cast<float>(8 + M), E - 10);
  }
  return (q & 0x80) ? -mag : mag;
}

void llRefQuantize(const uint8_t* bf16Row, int hidden, uint8_t* q, float* scales) {
  for (int g = 0; g * kLlGroup < hidden; ++g) {
    float amax = 0.0f;
    for (int j = g * kLlGroup; j < (g + 1) * kLlGroup; ++j)
      amax = std::max(amax, std::fabs(bf16At(bf16Row, j)));
    const float scale = std::max(amax, 1e-4f) / 448.0f;
    scales[g] = scale;
    for (int j = g * kLlGroup; j < (g + 1) * kLlGroup; ++j) {
      const float x = bf16At(bf16Row, j);
      const float scaled = x / scale;
      q[j] = refFloatToE4m3(scaled);
    }
  }
}

LlInputs makeLlInputs(const LlCase& c, uint64_t seed) {
  LlInputs in;
  in.c = c;
  in.topkIdx.resize(c.nranks);
  in.x.resize(c.nranks);
  in.weights.resize(c.nranks);
  for (int s = 0; s < c.nranks; ++s) {
    in.topkIdx[s] = randomRouting(c, seed, s);
    std::mt19937_64 rng(mix64(seed ^ (0x5e0000ull + static_cast<uint64_t>(s))));
    in.x[s].resize(static_cast<size_t>(c.numTokens[s]) * c.hidden * 2);
    for (int t = 0; t < c.numTokens[s]; ++t)
      randomRow(rng, c.hidden, in.x[s].data() + static_cast<size_t>(t) * c.hidden * 2);
    std::uniform_real_distribution<float> u(0.05f, 1.2f);
    for (size_t k = 0; k < in.topkIdx[s].size(); ++k) in.weights[s].push_back(u(rng));
  }
  return in;
}

fuscoLowLatencyConfig_t llConfig(const LlCase& c) {
  fuscoLowLatencyConfig_t cfg = FUSCO_LOW_LATENCY_CONFIG_INITIALIZER;
  cfg.maxTokensPerRank = c.maxTokensPerRank;
  cfg.hidden = c.hidden;
  cfg.numExperts = c.numExperts;
  cfg.maxTopk = c.maxTopk;
  return cfg;
}

int llNumLocal(const LlCase& c) { return c.numExperts / c.nranks; }
size_t llCap(const LlCase& c) { return static_cast<size_t>(c.maxTokensPerRank) * c.nranks; }
size_t llRowBytes(const LlCase& c, int format) {
  return static_cast<size_t>(c.hidden) * (format == FUSCO_LL_FP8 ? 1 : 2);
}

std::string llCaseName(const LlCase& c, int format) {
  std::ostringstream os;
  os << "[" << c.nranks << " ranks, " << c.numExperts << " experts, top-" << c.topk << " of "
     << c.maxTopk << ", hidden " << c.hidden << (format == FUSCO_LL_FP8 ? " FP8" : " BF16")
     << ", tokens";
  for (int n : c.numTokens) os << " " << n;
  os << "]";
  return os.str();
}

LlExpect llRefDispatch(const LlInputs& in, int rank, int format) {
  const LlCase& c = in.c;
  const int numLocal = llNumLocal(c), groups = c.hidden / kLlGroup;
  const size_t rowBytes = llRowBytes(c, format);
  LlExpect w;
  w.rows.resize(numLocal);
  w.x.resize(numLocal);
  w.scales.resize(numLocal);
  w.layout.assign(static_cast<size_t>(numLocal) * c.nranks, 0);
  std::vector<uint8_t> q(c.hidden);
  std::vector<float> sc(groups > 0 ? groups : 1);
  for (int le = 0; le < numLocal; ++le) {
    const int64_t g = static_cast<int64_t>(rank) * numLocal + le;
    for (int s = 0; s < c.nranks; ++s) {
      const uint64_t first = w.rows[le].size();
      for (int t = 0; t < c.numTokens[s]; ++t)
        for (int k = 0; k < c.topk; ++k) {
          const int64_t* ids = in.topkIdx[s].data() + static_cast<size_t>(t) * c.topk;
          if (ids[k] != g || !llRefMoves(ids, k, c.numExperts)) continue;
          w.rows[le].push_back(LlRow{s, t, k});
          const uint8_t* row = in.x[s].data() + static_cast<size_t>(t) * c.hidden * 2;
          if (format == FUSCO_LL_FP8) {
            llRefQuantize(row, c.hidden, q.data(), sc.data());
            w.x[le].insert(w.x[le].end(), q.begin(), q.end());
            w.scales[le].insert(w.scales[le].end(), sc.begin(), sc.begin() + groups);
          } else {
            w.x[le].insert(w.x[le].end(), row, row + rowBytes);
          }
        }
      const uint64_t rows = w.rows[le].size() - first;
      w.layout[static_cast<size_t>(le) * c.nranks + s] = static_cast<int64_t>((first << 32) | rows);
    }
  }
  return w;
}

LlRecv llFetch(const fuscoLowLatencyDispatch_t& d, const LlCase& c, int format,
               const LlCopyOut& copy) {
  const int numLocal = llNumLocal(c), groups = c.hidden / kLlGroup;
  const size_t cap = llCap(c), rowBytes = llRowBytes(c, format);
  LlRecv got;
  if (d.recvCount == nullptr || d.recvLayout == nullptr || d.recvX == nullptr ||
      d.recvSrcToken == nullptr || (format == FUSCO_LL_FP8 && d.recvScales == nullptr))
    return got;  // the checker names the missing output
  got.count.resize(numLocal);
  got.layout.resize(static_cast<size_t>(numLocal) * c.nranks);
  if (!copy(got.count.data(), d.recvCount, numLocal * sizeof(int)) ||
      !copy(got.layout.data(), d.recvLayout, got.layout.size() * sizeof(int64_t)))
    return LlRecv{};
  got.x.resize(numLocal);
  got.scales.resize(numLocal);
  got.srcToken.resize(numLocal);
  for (int e = 0; e < numLocal; ++e) {
    const size_t n = static_cast<size_t>(std::clamp<int64_t>(got.count[e], 0, cap));
    const size_t base = static_cast<size_t>(e) * cap;
    got.x[e].resize(n * rowBytes);
    got.srcToken[e].resize(n);
    copy(got.x[e].data(), static_cast<const uint8_t*>(d.recvX) + base * rowBytes, n * rowBytes);
    copy(got.srcToken[e].data(), d.recvSrcToken + base, n * sizeof(int));
    if (format != FUSCO_LL_FP8) continue;
    got.scales[e].resize(n * groups);
    copy(got.scales[e].data(), d.recvScales + base * groups, n * groups * sizeof(float));
  }
  return got;
}

LlRecv llRecvOf(const LlExpect& want) {
  LlRecv r;
  r.layout = want.layout;
  r.x = want.x;
  r.scales = want.scales;
  for (const auto& rows : want.rows) {
    r.count.push_back(static_cast<int>(rows.size()));
    r.srcToken.emplace_back();
    for (const LlRow& row : rows) r.srcToken.back().push_back(row.token);
  }
  return r;
}

::testing::AssertionResult llRecvMatches(const LlCase& c, int format, const LlExpect& want,
                                         const LlRecv& got) {
  const int numLocal = llNumLocal(c), groups = format == FUSCO_LL_FP8 ? c.hidden / kLlGroup : 0;
  const size_t rowBytes = llRowBytes(c, format);
  if (got.count.size() != static_cast<size_t>(numLocal))
    return ::testing::AssertionFailure() << "a receive output is NULL or could not be copied";
  auto fail = ::testing::AssertionFailure();
  int shown = 0;
  for (int e = 0; e < numLocal && shown < 6; ++e) {
    const std::string ex = "local expert " + std::to_string(e);
    const size_t n = want.rows[e].size();
    if (static_cast<size_t>(got.count[e]) != n) {
      fail << "\n  " << ex << ": recvCount " << got.count[e] << ", expected " << n;
      ++shown;
    }
    for (int s = 0; s < c.nranks; ++s) {
      const size_t i = static_cast<size_t>(e) * c.nranks + s;
      if (got.layout[i] == want.layout[i]) continue;
      fail << "\n  " << ex << " source " << s << ": recvLayout " << layoutName(got.layout[i])
           << ", expected " << layoutName(want.layout[i]);
      ++shown;
    }
    for (size_t i = 0; i < n && i < got.srcToken[e].size() && shown < 6; ++i) {
      const LlRow& r = want.rows[e][i];
      const bool tokenOk = got.srcToken[e][i] == r.token;
      const bool bytesOk = std::memcmp(got.x[e].data() + i * rowBytes,
                                       want.x[e].data() + i * rowBytes, rowBytes) == 0;
      const bool scalesOk =
          groups == 0 || std::memcmp(got.scales[e].data() + i * groups,
                                     want.scales[e].data() + i * groups, groups * 4) == 0;
      if (tokenOk && bytesOk && scalesOk) continue;
      fail << "\n  " << ex << " row " << i << " should be " << rowName(r) << ":"
           << (tokenOk ? "" : " recvSrcToken " + std::to_string(got.srcToken[e][i]) + ";")
           << (bytesOk ? "" : " row bytes differ;") << (scalesOk ? "" : " scales differ;");
      if (!bytesOk) {
        size_t j = 0;
        while (got.x[e][i * rowBytes + j] == want.x[e][i * rowBytes + j]) ++j;
        fail << " byte " << j << " expected " << hexBytes(want.x[e].data() + i * rowBytes + j, 1)
             << " got " << hexBytes(got.x[e].data() + i * rowBytes + j, 1);
      }
      ++shown;
    }
  }
  if (shown == 0) return ::testing::AssertionSuccess();
  return fail;
}

void llExpertRow(int globalExpert, int format, int hidden, const uint8_t* row, const float* scales,
                 uint8_t* y) {
  const float m = 1.0f + 0.25f * static_cast<float>(globalExpert % 4);
  const float b = 0.0078125f * static_cast<float>(globalExpert % 5 - 2);
  for (int j = 0; j < hidden; ++j) {
    float v;
    if (format == FUSCO_LL_FP8) {
      v = refE4m3ToFloat(row[j]) * scales[j / kLlGroup];
    } else {
      v = bf16At(row, j);
    }
    const float prod = v * m;
    const float sum = prod + b;
    const uint16_t h = refFloatToBf16(sum);
    y[2 * j] = static_cast<uint8_t>(h & 0xff);
    y[2 * j + 1] = static_cast<uint8_t>(h >> 8);
  }
}

std::vector<uint8_t> llExpertOut(const LlCase& c, int format, int rank, const LlRecv& got) {
  const int numLocal = llNumLocal(c), groups = c.hidden / kLlGroup;
  const size_t cap = llCap(c), rowIn = llRowBytes(c, format), rowOut = c.hidden * 2u;
  std::vector<uint8_t> out(numLocal * cap * rowOut, kFiller);
  for (int e = 0; e < numLocal && e < static_cast<int>(got.x.size()); ++e)
    for (size_t i = 0; i * rowIn < got.x[e].size(); ++i)
      llExpertRow(rank * numLocal + e, format, c.hidden, got.x[e].data() + i * rowIn,
                  format == FUSCO_LL_FP8 ? got.scales[e].data() + i * groups : nullptr,
                  out.data() + (e * cap + i) * rowOut);
  return out;
}

std::vector<uint8_t> llRefCombine(const LlInputs& in, int rank, int format, bool weighted) {
  const LlCase& c = in.c;
  MoeRefProblem p;
  p.nranks = c.nranks;
  p.numExperts = c.numExperts;
  p.nodeOf.assign(c.nranks, 0);
  p.topk = c.topk;
  for (int s = 0; s < c.nranks; ++s) {
    p.numTokens.push_back(static_cast<size_t>(c.numTokens[s]));
    p.topkIdx.push_back(in.topkIdx[s]);
    // An invalid id, or an expert the token chose at a lower slot, moves nothing.
    for (int t = 0; t < c.numTokens[s]; ++t)
      for (int k = c.topk - 1; k >= 0; --k) {
        int64_t* ids = p.topkIdx.back().data() + static_cast<size_t>(t) * c.topk;
        if (!llRefMoves(ids, k, c.numExperts)) ids[k] = -1;
      }
  }
  const MoeRefDispatch d = moeRefDispatch(p, in.x, c.hidden * 2u);
  const int numLocal = llNumLocal(c), groups = c.hidden / kLlGroup;
  const size_t rowIn = llRowBytes(c, format), rowOut = c.hidden * 2u;
  std::vector<std::vector<uint8_t>> expertOut(c.nranks);
  for (int r = 0; r < c.nranks; ++r) {
    const LlExpect w = llRefDispatch(in, r, format);
    for (int e = 0; e < numLocal; ++e)
      for (size_t i = 0; i < w.rows[e].size(); ++i) {
        expertOut[r].resize(expertOut[r].size() + rowOut);
        llExpertRow(r * numLocal + e, format, c.hidden, w.x[e].data() + i * rowIn,
                    format == FUSCO_LL_FP8 ? w.scales[e].data() + i * groups : nullptr,
                    expertOut[r].data() + expertOut[r].size() - rowOut);
      }
  }
  std::vector<std::vector<float>> weights;
  if (weighted) weights = in.weights;
  return moeRefCombine(p, d, expertOut, fuscoBfloat16, c.hidden, weights)[rank];
}

::testing::AssertionResult llOutMatches(const std::vector<uint8_t>& want,
                                        const std::vector<uint8_t>& got, int hidden,
                                        const std::string& what) {
  if (want == got) return ::testing::AssertionSuccess();
  auto fail = ::testing::AssertionFailure() << what;
  if (want.size() != got.size()) return fail << ": " << got.size() << " bytes, not " << want.size();
  int shown = 0;
  for (size_t i = 0; i < want.size() / 2 && shown < 4; ++i) {
    if (want[2 * i] == got[2 * i] && want[2 * i + 1] == got[2 * i + 1]) continue;
    fail << "\n  out token " << i / hidden << " element " << i % hidden << ": expected "
         << bf16At(want.data(), i) << " (" << hexBytes(want.data() + 2 * i, 2) << ") got "
         << bf16At(got.data(), i) << " (" << hexBytes(got.data() + 2 * i, 2) << ")";
    ++shown;
  }
  return fail;
}

}  // namespace fusco::test
