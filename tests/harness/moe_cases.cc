// Shared MoE test cases and checkers (see moe_cases.h): routing and row generation from a seed,
// plan/dispatch/combine helpers that compare against the sequential reference in
// harness/moe_reference.h and record gtest failures.
#include "harness/moe_cases.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "harness/data_gen.h"
#include "harness/mp_harness.h"

namespace fusco::test {

namespace {

// Ranks per node the comm will use: config wins, then FUSCO_LOCAL_SIZE, else everything on one
// node.
int effectiveLocalSize(const MoeCase& c) {
  if (c.localSize > 0) return c.localSize;
  const char* env = std::getenv("FUSCO_LOCAL_SIZE");
  if (env && std::atoi(env) > 0) return std::atoi(env);
  return c.nranks;
}

// Row t of rank s: byte j depends on (seed, s, t, j); never 0, never the poison.
uint8_t rowByte(uint64_t seed, int s, size_t t, size_t j) {
  const uint64_t key =
      mix64(seed ^ (static_cast<uint64_t>(s) << 56) ^ (static_cast<uint64_t>(t) << 20));
  uint8_t b = static_cast<uint8_t>(mix64(key + (j >> 3)) >> (8 * (j & 7)));
  if (b == 0) b = 1;
  if (b == kPoison) b = 0x5A;
  return b;
}

// Rows of `hidden` elements of dt whose values are nonzero multiples of 1/64 below 4 in magnitude
// (exact in every combine type), derived from (seed, s, t, j).
Bytes2D makeValueRows(const MoeRefProblem& p, uint64_t seed, fuscoDataType_t dt, size_t hidden) {
  const size_t es = fusco::test::dtypeSize(dt);
  Bytes2D x(p.nranks);
  for (int s = 0; s < p.nranks; ++s) {
    x[s].resize(p.numTokens[s] * hidden * es);
    for (size_t t = 0; t < p.numTokens[s]; ++t)
      for (size_t j = 0; j < hidden; ++j) {
        const uint64_t h = mix64(seed ^ (static_cast<uint64_t>(s) << 56) ^ (t << 24) ^ j);
        float v = static_cast<float>(h % 255 + 1) / 64.0f;
        if (h & 0x100) v = -v;
        fusco::test::refFromFloat(dt, v, x[s].data() + (t * hidden + j) * es);
      }
  }
  return x;
}

// What each row of rank r's recvX should hold, for messages.
std::vector<std::string> rowOrigins(const MoeRefProblem& p, const MoeRefDispatch& d, int r) {
  std::vector<std::string> o(d.numRecvRows[r], "a zero padding row");
  for (int s = 0; s < p.nranks; ++s)
    for (size_t t = 0; t < p.numTokens[s]; ++t)
      for (int k = 0; k < p.topk; ++k) {
        const int64_t e = p.topkIdx[s][t * p.topk + k];
        if (e < 0 || p.rankOfExpert(static_cast<int>(e)) != r) continue;
        o[d.slotRow[s][t * p.topk + k]] = "token " + std::to_string(t) + " of rank " +
                                          std::to_string(s) + " for expert " + std::to_string(e);
      }
  return o;
}

std::string identifyRow(const uint8_t* row, size_t rowBytes, const Bytes2D& x) {
  if (fusco::test::findNotPoison(row, rowBytes) == SIZE_MAX) return "unwritten (all poison)";
  bool zero = std::all_of(row, row + rowBytes, [](uint8_t b) { return b == 0; });
  if (zero) return "all zero";
  for (size_t s = 0; s < x.size(); ++s)
    for (size_t t = 0; t * rowBytes < x[s].size(); ++t)
      if (std::memcmp(row, x[s].data() + t * rowBytes, rowBytes) == 0)
        return "token " + std::to_string(t) + " of rank " + std::to_string(s);
  return "unknown bytes";
}

::testing::AssertionResult recvXMatches(const MoeRefProblem& p, const MoeRefDispatch& d, int r,
                                        const uint8_t* got, size_t rowBytes, const Bytes2D& x) {
  const auto& want = d.recvX[r];
  if (want.empty() || std::memcmp(want.data(), got, want.size()) == 0)
    return ::testing::AssertionSuccess();
  auto origins = rowOrigins(p, d, r);
  auto fail = ::testing::AssertionFailure();
  int shown = 0;
  for (size_t i = 0; i < d.numRecvRows[r] && shown < 3; ++i) {
    const uint8_t* w = want.data() + i * rowBytes;
    const uint8_t* g = got + i * rowBytes;
    if (std::memcmp(w, g, rowBytes) == 0) continue;
    size_t j = 0;
    while (w[j] == g[j]) ++j;
    fail << "\n  rank " << r << " recvX row " << i << " should be " << origins[i] << "; byte " << j
         << " expected " << fusco::test::hexBytes(w + j, 1) << " got "
         << fusco::test::hexBytes(g + j, 1) << "; the row holds " << identifyRow(g, rowBytes, x);
    ++shown;
  }
  return fail;
}

// Expected combine payload bytes this rank sends, per path (see moe_cases.h).
void expectedCombineBytes(const MoeRefProblem& p, int me, int dedup, size_t rowOut, size_t* intra,
                          size_t* inter) {
  *intra = *inter = 0;
  for (int s = 0; s < p.nranks; ++s) {
    if (s == me) continue;
    size_t& acc = p.nodeOf[s] == p.nodeOf[me] ? *intra : *inter;
    for (size_t t = 0; t < p.numTokens[s]; ++t) {
      size_t slots = 0;
      for (int k = 0; k < p.topk; ++k) {
        const int64_t e = p.topkIdx[s][t * p.topk + k];
        if (e >= 0 && p.rankOfExpert(static_cast<int>(e)) == me) ++slots;
      }
      acc += (dedup == FUSCO_DEDUP_NONE ? slots : (slots > 0 ? 1 : 0)) * rowOut;
    }
  }
  if (dedup == FUSCO_DEDUP_NONE) return;
  for (size_t t = 0; t < p.numTokens[me]; ++t)
    for (int k = 0; k < p.topk; ++k) {
      const int64_t e = p.topkIdx[me][t * p.topk + k];
      if (e < 0) continue;
      const int r = p.rankOfExpert(static_cast<int>(e));
      if (r != me) (p.nodeOf[r] == p.nodeOf[me] ? *intra : *inter) += sizeof(float);
    }
}

::testing::AssertionResult outMatches(const CombineSetup& s, const std::vector<uint8_t>& want,
                                      const std::vector<uint8_t>& got, int rank) {
  if (want == got) return ::testing::AssertionSuccess();
  if (want.size() != got.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  const size_t es = fusco::test::dtypeSize(s.dt);
  auto fail = ::testing::AssertionFailure();
  int shown = 0;
  for (size_t i = 0; i < want.size() / es && shown < 4; ++i) {
    if (std::memcmp(want.data() + i * es, got.data() + i * es, es) == 0) continue;
    fail << "\n  rank " << rank << " out token " << i / s.hidden << " element " << i % s.hidden
         << ": expected " << fusco::test::refToFloat(s.dt, want.data() + i * es) << " ("
         << fusco::test::hexBytes(want.data() + i * es, es) << ") got "
         << fusco::test::refToFloat(s.dt, got.data() + i * es) << " ("
         << fusco::test::hexBytes(got.data() + i * es, es) << ")";
    ++shown;
  }
  return fail;
}

}  // namespace

const char* dedupName(int d) {
  return d == FUSCO_DEDUP_NONE   ? "NONE"
         : d == FUSCO_DEDUP_RANK ? "RANK"
         : d == FUSCO_DEDUP_NODE ? "NODE"
                                 : "AUTO";
}

MoeRefProblem makeProblem(const MoeCase& c, uint64_t seed) {
  MoeRefProblem p;
  p.nranks = c.nranks;
  p.numExperts = c.numExperts;
  p.placement = c.placement;
  p.expertAlignment = c.align;
  p.topk = c.topk;
  p.numTokens = c.numTokens;
  const int L = effectiveLocalSize(c);
  for (int r = 0; r < c.nranks; ++r) p.nodeOf.push_back(r / L);
  std::vector<int64_t> candidates;
  for (int e = 0; e < c.numExperts; ++e)
    if (c.route != Route::SomeExpertsIdle || e % 3 != 1) candidates.push_back(e);
  p.topkIdx.resize(c.nranks);
  for (int s = 0; s < c.nranks; ++s) {
    std::mt19937_64 rng(mix64(seed ^ (0x517ull + s)));
    auto& idx = p.topkIdx[s];
    idx.assign(c.numTokens[s] * c.topk, -1);
    for (size_t t = 0; t < c.numTokens[s]; ++t) {
      if (c.route == Route::OneExpert) {
        idx[t * c.topk + t % c.topk] = c.fixedExpert;
        continue;
      }
      std::vector<int64_t>* from = &candidates;
      std::vector<int64_t> onNode;
      const int numNodes = p.nodeOf.back() + 1;
      if (c.route == Route::HeavyRails && numNodes > 1) {
        int node = p.nodeOf[s];
        if (s % L == 0 || rng() % 3 == 0)
          node = (node + 1 + static_cast<int>(rng() % (numNodes - 1))) % numNodes;
        for (int64_t e : candidates)
          if (p.nodeOf[p.rankOfExpert(static_cast<int>(e))] == node) onNode.push_back(e);
        from = &onNode;
      }
      std::shuffle(from->begin(), from->end(), rng);
      for (int k = 0; k < c.topk && k < static_cast<int>(from->size()); ++k)
        if (static_cast<int>(rng() % 100) >= c.unusedPercent) idx[t * c.topk + k] = (*from)[k];
    }
  }
  return p;
}

Bytes2D makeRows(const MoeRefProblem& p, uint64_t seed, size_t rowBytes) {
  Bytes2D x(p.nranks);
  for (int s = 0; s < p.nranks; ++s) {
    x[s].resize(p.numTokens[s] * rowBytes);
    for (size_t t = 0; t < p.numTokens[s]; ++t)
      for (size_t j = 0; j < rowBytes; ++j) x[s][t * rowBytes + j] = rowByte(seed, s, t, j);
  }
  return x;
}

fuscoConfig_t commConfig(const MoeCase& c, int timeoutMs) {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = timeoutMs;
  cfg.localSize = c.localSize;
  return cfg;
}

fuscoMoeConfig_t moeConfig(const MoeCase& c, int dedup) {
  fuscoMoeConfig_t m = FUSCO_MOE_CONFIG_INITIALIZER;
  m.numExperts = c.numExperts;
  m.expertToRank = c.placement.empty() ? nullptr : c.placement.data();
  m.dedup = dedup;
  m.expertAlignment = c.align;
  m.balance = c.balance;
  return m;
}

std::string caseName(const MoeCase& c, int dedup, size_t rowBytes) {
  std::ostringstream os;
  os << "[" << c.nranks << " ranks, " << c.numExperts << " experts, top-" << c.topk << ", rowBytes "
     << rowBytes << ", align " << c.align << ", dedup " << dedupName(dedup)
     << (c.placement.empty() ? "" : ", explicit placement") << ", tokens";
  for (size_t n : c.numTokens) os << " " << n;
  os << "]";
  return os.str();
}

// Plans on comm and checks the receive counts; returns the handle or nullptr (failure recorded).
fuscoMoeHandle_t planChecked(fuscoComm_t comm, const RankCtx& ctx, const MoeCase& c,
                             const MoeRefProblem& p, const MoeRefDispatch& d, int dedup,
                             const std::string& what) {
  fuscoMoeConfig_t m = moeConfig(c, dedup);
  fuscoMoeHandle_t h = nullptr;
  const auto& idx = p.topkIdx[ctx.rank];
  fuscoResult_t r = fuscoMoePlan(&h, comm, &m, idx.empty() ? nullptr : idx.data(),
                                 p.numTokens[ctx.rank], c.topk, nullptr);
  EXPECT_EQ(r, fuscoSuccess) << what << " fuscoMoePlan -> " << fuscoGetErrorString(r) << ": "
                             << fuscoGetLastError(comm);
  if (r != fuscoSuccess) return nullptr;
  recvCountsChecked(comm, h, ctx, d, what);
  return h;
}

void recvCountsChecked(fuscoComm_t comm, fuscoMoeHandle_t h, const RankCtx& ctx,
                       const MoeRefDispatch& d, const std::string& what) {
  const size_t nLocal = d.tokensPerLocalExpert[ctx.rank].size();
  std::vector<int64_t> perExpert(nLocal + 1, -7);
  size_t numRecv = 12345678;
  FUSCO_EXPECT_OK(comm, fuscoMoeGetRecvCounts(h, &numRecv, perExpert.data()));
  EXPECT_EQ(numRecv, d.numRecvRows[ctx.rank]) << what << " numRecvRows";
  perExpert.resize(nLocal);
  EXPECT_EQ(perExpert, d.tokensPerLocalExpert[ctx.rank]) << what << " tokensPerLocalExpert";
  size_t again = 0;
  FUSCO_EXPECT_OK(comm, fuscoMoeGetRecvCounts(h, &again, nullptr));
  EXPECT_EQ(again, numRecv) << what << " numRecvRows with tokensPerLocalExpert NULL";
}

namespace {
bool gArenaBuffers = false;
}  // namespace

void setMoeArenaBuffers(bool on) { gArenaBuffers = on; }

// Dispatch on h into a poisoned recvX; checks bytes and dispatch stats. Returns recvX.
std::vector<uint8_t> dispatchChecked(fuscoComm_t comm, fuscoMoeHandle_t h, const RankCtx& ctx,
                                     const MoeRefProblem& p, const MoeRefDispatch& d,
                                     const Bytes2D& x, size_t rowBytes, int dedup,
                                     const std::string& what) {
  const size_t n = d.numRecvRows[ctx.rank];
  std::vector<uint8_t> recvX(n * rowBytes + 1);
  fusco::test::poison(recvX.data(), recvX.size());
  const auto& mine = x[ctx.rank];
  void* arena = nullptr;
  if (gArenaBuffers && n > 0) {
    FUSCO_EXPECT_OK(comm, fuscoMemAlloc(comm, &arena, recvX.size()));
    if (arena != nullptr) std::memcpy(arena, recvX.data(), recvX.size());
  }
  uint8_t* dst = arena != nullptr ? static_cast<uint8_t*>(arena) : recvX.data();
  fuscoResult_t r = fuscoMoeDispatch(h, mine.empty() ? nullptr : mine.data(), rowBytes,
                                     n == 0 ? nullptr : dst, nullptr);
  if (arena != nullptr) {
    std::memcpy(recvX.data(), arena, recvX.size());
    FUSCO_EXPECT_OK(comm, fuscoMemFree(comm, arena));
  }
  EXPECT_EQ(r, fuscoSuccess) << what << " fuscoMoeDispatch -> " << fuscoGetErrorString(r) << ": "
                             << fuscoGetLastError(comm);
  if (r != fuscoSuccess) return {};
  EXPECT_TRUE(recvXMatches(p, d, ctx.rank, recvX.data(), rowBytes, x)) << what;
  EXPECT_EQ(recvX.back(), kPoison) << what << " wrote past numRecvRows * rowBytes";
  recvX.pop_back();

  fuscoMoeStats_t st;
  std::memset(&st, 0x77, sizeof st);
  st.size = sizeof st;
  FUSCO_EXPECT_OK(comm, fuscoMoeGetStats(h, &st));
  if (dedup == FUSCO_DEDUP_RANK || dedup == FUSCO_DEDUP_NONE) {
    auto ref = fusco::test::moeRefSendStats(p, ctx.rank);
    const size_t intra = dedup == FUSCO_DEDUP_RANK ? ref.rankIntra : ref.noneIntra;
    const size_t inter = dedup == FUSCO_DEDUP_RANK ? ref.rankInter : ref.noneInter;
    EXPECT_EQ(st.dispatchRowsIntraNode, intra) << what << " dispatchRowsIntraNode";
    EXPECT_EQ(st.dispatchRowsInterNode, inter) << what << " dispatchRowsInterNode";
    EXPECT_EQ(st.dispatchBytesIntraNode, intra * rowBytes) << what << " dispatchBytesIntraNode";
    EXPECT_EQ(st.dispatchBytesInterNode, inter * rowBytes) << what << " dispatchBytesInterNode";
  } else if (*std::max_element(p.nodeOf.begin(), p.nodeOf.end()) > 0) {
    // NODE dedup (AUTO across nodes): each token crosses the network once per remote node. A
    // relay may carry another rank's rows, so the sum over ranks is what is exact.
    std::vector<int64_t> mine(p.nranks, static_cast<int64_t>(st.dispatchRowsInterNode)),
        all(p.nranks, -1);
    FUSCO_EXPECT_OK(comm, fuscoAllToAll(mine.data(), all.data(), 1, fuscoInt64, comm, nullptr));
    int64_t got = 0, want = 0;
    for (int r = 0; r < p.nranks; ++r) {
      got += all[r];
      want += static_cast<int64_t>(fusco::test::moeRefSendStats(p, r).nodeInter);
    }
    EXPECT_EQ(got, want) << what << " network rows over all ranks";
    EXPECT_EQ(st.dispatchBytesInterNode, st.dispatchRowsInterNode * rowBytes)
        << what << " dispatchBytesInterNode";
  }
  return recvX;
}

// Plan + dispatch + checks for every dedup mode in `modes` on one comm.
void runDispatchCase(fuscoComm_t comm, const RankCtx& ctx, const MoeCase& c, uint64_t seed,
                     size_t rowBytes, const std::vector<int>& modes) {
  MoeRefProblem p = makeProblem(c, seed);
  Bytes2D x = makeRows(p, seed + 1, rowBytes);
  MoeRefDispatch d = fusco::test::moeRefDispatch(p, x, rowBytes);
  for (int dedup : modes) {
    const std::string what = caseName(c, dedup, rowBytes);
    fuscoMoeHandle_t h = planChecked(comm, ctx, c, p, d, dedup, what);
    if (!h) continue;
    dispatchChecked(comm, h, ctx, p, d, x, rowBytes, dedup, what);
    FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  }
}

CombineSetup makeCombine(const MoeCase& c, uint64_t seed, fuscoDataType_t dt, size_t hidden) {
  MoeRefProblem p = makeProblem(c, seed);
  // Token 0 of every rank has no valid expert: its output must be zeros.
  for (auto& idx : p.topkIdx)
    for (int k = 0; k < c.topk && !idx.empty(); ++k) idx[k] = -1;
  return makeCombineFor(c, std::move(p), seed, dt, hidden);
}

CombineSetup makeCombineFor(const MoeCase& c, MoeRefProblem p, uint64_t seed, fuscoDataType_t dt,
                            size_t hidden) {
  CombineSetup s{c, std::move(p), {}, {}, {}, {}, dt, hidden};
  const size_t es = fusco::test::dtypeSize(dt), rowOut = hidden * es;
  s.x = makeValueRows(s.p, seed + 1, dt, hidden);
  s.d = fusco::test::moeRefDispatch(s.p, s.x, rowOut);
  s.expertOut.resize(c.nranks);
  s.weights.resize(c.nranks);
  for (int r = 0; r < c.nranks; ++r) {
    const auto& in = s.d.recvX[r];
    auto& out = s.expertOut[r];
    out.resize(in.size());
    for (size_t i = 0; i * rowOut < in.size(); ++i) {
      const float scale = 1.0f + static_cast<float>((r * 5 + i) % 4) * 0.3f;
      for (size_t j = 0; j < hidden; ++j) {
        const size_t off = (i * hidden + j) * es;
        fusco::test::refFromFloat(dt, fusco::test::refToFloat(dt, in.data() + off) * scale,
                                  out.data() + off);
      }
    }
    std::mt19937 rng(static_cast<uint32_t>(mix64(seed ^ (0xabcull + r))));
    std::uniform_real_distribution<float> u(0.05f, 1.2f);
    for (size_t k = 0; k < s.p.numTokens[r] * c.topk; ++k) s.weights[r].push_back(u(rng));
  }
  return s;
}

// Plans, dispatches (checked), combines twice with and without weights and checks `out` bitwise
// against the reference and the combine stats. Returns the outputs (weighted, unweighted).
std::vector<std::vector<uint8_t>> combineChecked(fuscoComm_t comm, const RankCtx& ctx,
                                                 const CombineSetup& s, int dedup) {
  const std::string what = caseName(s.c, dedup, s.hidden) + " " + fusco::test::dtypeName(s.dt);
  fuscoMoeHandle_t h = planChecked(comm, ctx, s.c, s.p, s.d, dedup, what);
  if (!h) return {};
  auto results = combineOnHandle(comm, h, ctx, s, dedup);
  FUSCO_EXPECT_OK(comm, fuscoMoeHandleDestroy(h));
  return results;
}

std::vector<std::vector<uint8_t>> combineOnHandle(fuscoComm_t comm, fuscoMoeHandle_t h,
                                                  const RankCtx& ctx, const CombineSetup& s,
                                                  int dedup, std::vector<uint8_t>* recvXOut) {
  const std::string what = caseName(s.c, dedup, s.hidden) + " " + fusco::test::dtypeName(s.dt);
  const size_t es = fusco::test::dtypeSize(s.dt), rowOut = s.hidden * es;
  std::vector<std::vector<uint8_t>> results;
  auto recvX = dispatchChecked(comm, h, ctx, s.p, s.d, s.x, rowOut, dedup, what);
  if (recvXOut != nullptr) *recvXOut = recvX;
  const auto& eo = s.expertOut[ctx.rank];
  const size_t nTok = s.p.numTokens[ctx.rank];
  for (bool weighted : {true, false}) {
    std::vector<std::vector<float>> w;
    if (weighted) w = s.weights;
    auto want = fusco::test::moeRefCombine(s.p, s.d, s.expertOut, s.dt, s.hidden, w)[ctx.rank];
    std::vector<uint8_t> first;
    for (int rep = 0; rep < 2; ++rep) {
      std::vector<uint8_t> out(nTok * rowOut + 1);
      fusco::test::poison(out.data(), out.size());
      fuscoResult_t r = fuscoMoeCombine(h, eo.empty() ? nullptr : eo.data(), s.dt, s.hidden,
                                        weighted && nTok ? s.weights[ctx.rank].data() : nullptr,
                                        nTok ? out.data() : nullptr, nullptr);
      EXPECT_EQ(r, fuscoSuccess) << what << " fuscoMoeCombine -> " << fuscoGetErrorString(r) << ": "
                                 << fuscoGetLastError(comm);
      if (r != fuscoSuccess) break;
      EXPECT_EQ(out.back(), kPoison) << what << " combine wrote past the output";
      out.pop_back();
      EXPECT_TRUE(outMatches(s, want, out, ctx.rank))
          << what << (weighted ? " with weights" : " with NULL weights") << ", call " << rep + 1;
      if (rep == 0) {
        first = out;
      } else {
        EXPECT_TRUE(first == out) << what << " second combine differs from the first";
      }
      fuscoMoeStats_t st{};
      st.size = sizeof st;
      FUSCO_EXPECT_OK(comm, fuscoMoeGetStats(h, &st));
      if (dedup == FUSCO_DEDUP_NONE || dedup == FUSCO_DEDUP_RANK) {
        size_t intra = 0, inter = 0;
        expectedCombineBytes(s.p, ctx.rank, dedup, rowOut, &intra, &inter);
        EXPECT_EQ(st.combineBytesIntraNode, intra) << what << " combineBytesIntraNode";
        EXPECT_EQ(st.combineBytesInterNode, inter) << what << " combineBytesInterNode";
      }
    }
    results.push_back(first);
  }
  return results;
}

// Runs combineChecked in NONE, RANK, NODE and AUTO and checks they agree bitwise.
void combineAllModes(fuscoComm_t comm, const RankCtx& ctx, const CombineSetup& s) {
  auto none = combineChecked(comm, ctx, s, FUSCO_DEDUP_NONE);
  auto rank = combineChecked(comm, ctx, s, FUSCO_DEDUP_RANK);
  auto node = combineChecked(comm, ctx, s, FUSCO_DEDUP_NODE);
  auto autoMode = combineChecked(comm, ctx, s, FUSCO_DEDUP_AUTO);
  EXPECT_TRUE(none == rank) << "combine NONE and RANK differ on rank " << ctx.rank;
  EXPECT_TRUE(none == node) << "combine NONE and NODE differ on rank " << ctx.rank;
  EXPECT_TRUE(none == autoMode) << "combine NONE and AUTO differ on rank " << ctx.rank;
}

}  // namespace fusco::test
