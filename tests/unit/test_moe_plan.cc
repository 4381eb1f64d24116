// The MoE planner (src/plan/moe_plan.h) simulated in one process: every rank plans its sends, the
// metadata is handed to every destination's receive plan, rows are moved and combined by hand
// (with the host twins in device/reduce.h) and the result is compared bitwise with the independent
// sequential reference (tests/harness/moe_reference.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/result.h"
#include "device/reduce.h"
#include "harness/moe_reference.h"
#include "plan/moe_plan.h"

namespace fusco {
namespace {

using test::MoeRefProblem;

constexpr uint8_t kPoison = 0xA5;

struct CaseSpec {
  std::string name;
  int nranks = 1;
  int localSize = 1;  // ranks per node
  int numExperts = 1;
  bool explicitPlacement = false;
  int align = 1;
  int topk = 1;
  std::vector<size_t> tokens;  // per rank; empty: random in [0, maxTokens]
  size_t maxTokens = 20;
  int minusOnePercent = 15;
  int expertsUsed = 0;  // > 0: only experts [0, expertsUsed) are chosen (others get nothing)
  int hotExpert = -1;   // >= 0: every token selects this expert in a random slot
  uint64_t seed = 1;
};

// Routing: distinct experts per token, -1 slots, optional hot expert and unused experts.
MoeRefProblem makeProblem(const CaseSpec& c) {
  std::mt19937_64 rng(c.seed * 0x9e3779b97f4a7c15ull + 17);
  MoeRefProblem p;
  p.nranks = c.nranks;
  p.numExperts = c.numExperts;
  p.expertAlignment = c.align;
  p.topk = c.topk;
  for (int r = 0; r < c.nranks; ++r) p.nodeOf.push_back(r / c.localSize);
  if (c.explicitPlacement) {
    for (int e = 0; e < c.numExperts; ++e)
      p.placement.push_back(static_cast<int>(rng() % c.nranks));
  }
  const int used = c.expertsUsed > 0 ? c.expertsUsed : c.numExperts;
  std::vector<int> pool(used);
  for (int r = 0; r < c.nranks; ++r) {
    const size_t n = c.tokens.empty() ? rng() % (c.maxTokens + 1) : c.tokens[r];
    p.numTokens.push_back(n);
    std::vector<int64_t> idx(n * c.topk, -1);
    for (size_t t = 0; t < n; ++t) {
      for (int e = 0; e < used; ++e) pool[e] = e;
      std::shuffle(pool.begin(), pool.end(), rng);
      if (c.hotExpert >= 0) {
        std::iter_swap(pool.begin(), std::find(pool.begin(), pool.end(), c.hotExpert));
        std::swap(pool[0], pool[rng() % std::min(c.topk, used)]);
      }
      for (int k = 0; k < c.topk && k < used; ++k) {
        const bool keep =
            pool[k] == c.hotExpert || static_cast<int>(rng() % 100) >= c.minusOnePercent;
        if (keep) idx[t * c.topk + k] = pool[k];
      }
    }
    p.topkIdx.push_back(std::move(idx));
  }
  return p;
}

// Row payload: every byte a function of (seed, rank, token, column); never 0, never the poison.
std::vector<uint8_t> makeX(const MoeRefProblem& p, int s, size_t rowBytes, uint64_t seed) {
  std::vector<uint8_t> x(p.numTokens[s] * rowBytes);
  for (size_t i = 0; i < x.size(); ++i) {
    uint64_t h = (seed + 1) * 0xff51afd7ed558ccdull ^ (static_cast<uint64_t>(s) << 40) ^ i;
    h ^= h >> 29;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 32;
    uint8_t b = static_cast<uint8_t>(1 + h % 255);
    x[i] = b == kPoison ? 0x5A : b;
  }
  return x;
}

// "" when equal; otherwise where the first difference is, in units of `unit` bytes.
std::string firstDiff(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                      size_t unit, const char* unitName) {
  if (got.size() != want.size()) {
    return "size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    char buf[160];
    snprintf(buf, sizeof(buf), "first difference in %s %zu, byte %zu: got 0x%02x, want 0x%02x%s",
             unitName, i / unit, i % unit, got[i], want[i],
             got[i] == kPoison ? " (never written)" : "");
    return buf;
  }
  return "";
}

struct Sim {
  MoeShape shape;
  std::vector<MoeSendPlan> send;  // [s]
  std::vector<MoeRecvPlan> recv;  // [r]
};

// Plans every rank's send and every rank's receive, checking that the sizes agree.
Sim planAll(const MoeRefProblem& p, Dedup dedup) {
  Sim sim;
  EXPECT_EQ(
      buildMoeShape(p.nranks, p.numExperts, p.placement.empty() ? nullptr : p.placement.data(),
                    p.expertAlignment, &sim.shape),
      fuscoSuccess)
      << threadLastError();
  for (int s = 0; s < p.nranks; ++s) {
    EXPECT_EQ(validateTopk(sim.shape, p.topkIdx[s].data(), p.numTokens[s], p.topk), fuscoSuccess)
        << threadLastError();
    sim.send.push_back(planSend(sim.shape, s, p.topkIdx[s].data(), p.numTokens[s], p.topk, dedup));
  }
  sim.recv.resize(p.nranks);
  for (int r = 0; r < p.nranks; ++r) {
    std::vector<std::vector<int32_t>> metaFrom(p.nranks);
    for (int s = 0; s < p.nranks; ++s) metaFrom[s] = sim.send[s].meta[r];
    EXPECT_EQ(planRecv(sim.shape, r, metaFrom, &sim.recv[r]), fuscoSuccess) << threadLastError();
    for (int s = 0; s < p.nranks; ++s) {
      EXPECT_EQ(sim.recv[r].rowsFrom(s), sim.send[s].rows[r].size()) << "rows " << s << "->" << r;
    }
  }
  return sim;
}

// Moves rows by hand (one read per sent row, replicated into its fan rows) and checks the bytes,
// and that each fan row is the slot the reference assigns to the matching k.
void checkDispatch(const MoeRefProblem& p, const Sim& sim, const test::MoeRefDispatch& ref,
                   const std::vector<std::vector<uint8_t>>& x, size_t rowBytes) {
  for (int r = 0; r < p.nranks; ++r) {
    const MoeRecvPlan& rp = sim.recv[r];
    ASSERT_EQ(rp.numRecvRows, ref.numRecvRows[r]) << "rank " << r;
    ASSERT_EQ(rp.tokensPerLocalExpert, ref.tokensPerLocalExpert[r]) << "rank " << r;
    std::vector<uint8_t> recvX(rp.numRecvRows * rowBytes, kPoison);
    std::vector<int> writes(rp.numRecvRows, 0);
    for (int s = 0; s < p.nranks; ++s) {
      const MoeSendPlan& sp = sim.send[s];
      for (size_t i = 0; i < sp.rows[r].size(); ++i) {
        const int64_t t = sp.rows[r][i];
        const uint32_t f0 = rp.fanStart[s][i], f1 = rp.fanStart[s][i + 1];
        ASSERT_EQ(f1 - f0, sp.kStart[r][i + 1] - sp.kStart[r][i]) << "fan vs k slots";
        for (uint32_t j = f0; j < f1; ++j) {
          const int64_t row = rp.fanRows[s][j];
          const int k = sp.kSlots[r][sp.kStart[r][i] + (j - f0)];
          ASSERT_EQ(row, ref.slotRow[s][t * p.topk + k])
              << s << "->" << r << " token " << t << " k " << k;
          std::memcpy(recvX.data() + row * rowBytes, x[s].data() + t * rowBytes, rowBytes);
          ++writes[row];
        }
      }
    }
    for (const RowRange& range : rp.padding) {
      for (int64_t row = range.start; row < range.start + range.count; ++row) {
        std::memset(recvX.data() + row * rowBytes, 0, rowBytes);
        ++writes[row];
      }
    }
    for (size_t row = 0; row < rp.numRecvRows; ++row) ASSERT_EQ(writes[row], 1) << "row " << row;
    ASSERT_EQ(firstDiff(recvX, ref.recvX[r], rowBytes, "row"), "") << "recvX of rank " << r;
  }
}

std::vector<uint8_t> randomValues(fuscoDataType_t dt, size_t n, std::mt19937_64& rng) {
  const size_t es = dt == fuscoFloat32 ? 4 : 2;
  std::vector<uint8_t> v(n * es);
  std::uniform_real_distribution<float> mag(0.05f, 4.0f);
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = (rng() % 3 == 0 ? -1.0f : 1.0f) * mag(rng);
  storeFromFloat(dt, f.data(), n, v.data());
  return v;
}

// Combine by hand. RANK: the expert rank reduces each received row's fan (weights of its k slots,
// k order); NONE: single raw rows come back and the source applies the same rank level. Then the
// source sums per node (ranks ascending) and over nodes (ascending).
std::vector<std::vector<uint8_t>> combineByHand(const MoeRefProblem& p, const Sim& sim, Dedup dedup,
                                                const std::vector<std::vector<uint8_t>>& expertOut,
                                                fuscoDataType_t dt, size_t hidden,
                                                const std::vector<std::vector<float>>& w) {
  const size_t es = dt == fuscoFloat32 ? 4 : 2, rb = hidden * es;
  const int n = p.nranks;
  const int numNodes = p.nodeOf.back() + 1;
  std::vector<std::vector<uint8_t>> out(n);
  for (int s = 0; s < n; ++s) {
    const MoeSendPlan& sp = sim.send[s];
    const size_t T = p.numTokens[s];
    // partial[r]: T rows (valid where has[r][t]).
    std::vector<std::vector<uint8_t>> partial(n, std::vector<uint8_t>(T * rb));
    std::vector<std::vector<char>> has(n, std::vector<char>(T, 0));
    for (int r = 0; r < n; ++r) {
      const MoeRecvPlan& rp = sim.recv[r];
      std::vector<std::vector<const void*>> rowsOf(T);
      std::vector<std::vector<float>> wOf(T);
      for (size_t i = 0; i < sp.rows[r].size(); ++i) {
        const int64_t t = sp.rows[r][i];
        for (uint32_t j = rp.fanStart[s][i]; j < rp.fanStart[s][i + 1]; ++j) {
          const int k = sp.kSlots[r][sp.kStart[r][i] + (j - rp.fanStart[s][i])];
          rowsOf[t].push_back(expertOut[r].data() + rp.fanRows[s][j] * rb);
          wOf[t].push_back(w[s][t * p.topk + k]);
        }
        if (dedup == Dedup::Rank) {  // one partial per received row, computed at the expert rank
          EXPECT_FALSE(has[r][t]) << "token sent twice to one rank in RANK mode";
          weightedSumRows(dt, hidden, rowsOf[t].data(), wOf[t].data(), rowsOf[t].size(),
                          partial[r].data() + t * rb);
          has[r][t] = 1;
        }
      }
      if (dedup == Dedup::None) {  // raw rows came back; the source applies the rank level
        for (size_t t = 0; t < T; ++t) {
          if (rowsOf[t].empty()) continue;
          weightedSumRows(dt, hidden, rowsOf[t].data(), wOf[t].data(), rowsOf[t].size(),
                          partial[r].data() + t * rb);
          has[r][t] = 1;
        }
      }
    }
    out[s].assign(T * rb, kPoison);
    std::vector<uint8_t> nodePartial(numNodes * rb);
    for (size_t t = 0; t < T; ++t) {
      std::vector<const void*> nodes;
      for (int node = 0; node < numNodes; ++node) {
        std::vector<const void*> ranks;
        for (int r = 0; r < n; ++r) {
          if (p.nodeOf[r] == node && has[r][t]) ranks.push_back(partial[r].data() + t * rb);
        }
        if (ranks.empty()) continue;
        sumRows(dt, hidden, ranks.data(), ranks.size(), nodePartial.data() + node * rb);
        nodes.push_back(nodePartial.data() + node * rb);
      }
      sumRows(dt, hidden, nodes.data(), nodes.size(), out[s].data() + t * rb);
    }
  }
  return out;
}

void checkStats(const MoeRefProblem& p, const Sim& sim, Dedup dedup) {
  for (int s = 0; s < p.nranks; ++s) {
    size_t intra = 0, inter = 0;
    for (int r = 0; r < p.nranks; ++r) {
      if (r == s) continue;
      (p.nodeOf[r] == p.nodeOf[s] ? intra : inter) += sim.send[s].rows[r].size();
    }
    const test::MoeRefSendStats st = test::moeRefSendStats(p, s);
    EXPECT_EQ(intra, dedup == Dedup::None ? st.noneIntra : st.rankIntra) << "rank " << s;
    EXPECT_EQ(inter, dedup == Dedup::None ? st.noneInter : st.rankInter) << "rank " << s;
  }
}

void runCase(const CaseSpec& c) {
  SCOPED_TRACE(c.name);
  const MoeRefProblem p = makeProblem(c);
  const size_t rowBytes = 13 + c.seed % 20;  // never a multiple of 16
  std::vector<std::vector<uint8_t>> x;
  for (int s = 0; s < p.nranks; ++s) x.push_back(makeX(p, s, rowBytes, c.seed));
  const test::MoeRefDispatch ref = test::moeRefDispatch(p, x, rowBytes);

  std::mt19937_64 rng(c.seed ^ 0xabcdef);
  std::vector<std::vector<float>> w(p.nranks);
  for (int s = 0; s < p.nranks; ++s) {
    for (size_t i = 0; i < p.numTokens[s] * p.topk; ++i) {
      w[s].push_back(std::uniform_real_distribution<float>(-0.3f, 1.0f)(rng) + 0.01f);
    }
  }
  const size_t hidden = 11;
  std::vector<Sim> sims;
  for (Dedup d : {Dedup::None, Dedup::Rank}) {
    SCOPED_TRACE(d == Dedup::None ? "NONE" : "RANK");
    sims.push_back(planAll(p, d));
    checkDispatch(p, sims.back(), ref, x, rowBytes);
    checkStats(p, sims.back(), d);
  }
  for (fuscoDataType_t dt : {fuscoFloat32, fuscoBfloat16, fuscoFloat16}) {
    SCOPED_TRACE("dtype " + std::to_string(dt));
    std::vector<std::vector<uint8_t>> expertOut;
    for (int r = 0; r < p.nranks; ++r)
      expertOut.push_back(randomValues(dt, ref.numRecvRows[r] * hidden, rng));
    const auto want = test::moeRefCombine(p, ref, expertOut, dt, hidden, w);
    const auto none = combineByHand(p, sims[0], Dedup::None, expertOut, dt, hidden, w);
    const auto rank = combineByHand(p, sims[1], Dedup::Rank, expertOut, dt, hidden, w);
    for (int s = 0; s < p.nranks; ++s) {
      const size_t rb = hidden * (dt == fuscoFloat32 ? 4 : 2);
      ASSERT_EQ(firstDiff(none[s], want[s], rb, "token"), "") << "NONE combine of rank " << s;
      ASSERT_EQ(firstDiff(rank[s], want[s], rb, "token"), "") << "RANK combine of rank " << s;
    }
    const auto unweighted = test::moeRefCombine(p, ref, expertOut, dt, hidden, {});
    std::vector<std::vector<float>> ones(p.nranks);
    for (int s = 0; s < p.nranks; ++s) ones[s].assign(p.numTokens[s] * p.topk, 1.0f);
    const auto rank1 = combineByHand(p, sims[1], Dedup::Rank, expertOut, dt, hidden, ones);
    for (int s = 0; s < p.nranks; ++s) {
      ASSERT_EQ(firstDiff(rank1[s], unweighted[s], hidden, "element*hidden"), "")
          << "weights 1, rank " << s;
    }
  }
}

std::vector<CaseSpec> sweep() {
  std::vector<CaseSpec> cases;
  uint64_t seed = 100;
  const int aligns[3] = {1, 4, 16};
  for (int n = 1; n <= 8; ++n) {
    for (int variant = 0; variant < 4; ++variant) {
      CaseSpec c;
      c.nranks = n;
      c.localSize = variant % 2 ? std::max(1, n / 2) : (n >= 4 ? 4 : n);
      c.topk = 1 + (n + variant * 3) % 8;
      c.numExperts = n * (1 + variant % 3);
      c.explicitPlacement = variant == 3;
      if (c.explicitPlacement) c.numExperts = n * 2 + 3;  // not a multiple of nranks
      c.numExperts = std::max(c.numExperts, c.topk);
      if (c.explicitPlacement) {
        c.numExperts += c.numExperts % n == 0 ? 1 : 0;
      } else {
        c.numExperts = (c.numExperts + n - 1) / n * n;
      }
      c.align = aligns[(n + variant) % 3];
      c.expertsUsed = variant == 2 ? std::max(c.topk, c.numExperts / 2) : 0;
      c.seed = seed++;
      c.name = "n" + std::to_string(n) + " variant " + std::to_string(variant);
      cases.push_back(c);
    }
  }
  return cases;
}

TEST(MoePlan, SweepMatchesReferenceInBothModes) {
  for (const CaseSpec& c : sweep()) runCase(c);
}

TEST(MoePlan, ZeroAndOneTokenRanks) {
  CaseSpec c;
  c.name = "uneven tokens";
  c.nranks = 5;
  c.localSize = 2;
  c.numExperts = 10;
  c.topk = 4;
  c.align = 4;
  c.tokens = {0, 1, 7, 0, 33};
  runCase(c);
  c.tokens = {0, 0, 0, 0, 0};
  c.name = "no tokens anywhere";
  runCase(c);
}

TEST(MoePlan, EveryTokenToOneExpert) {
  CaseSpec c;
  c.name = "hot expert";
  c.nranks = 4;
  c.localSize = 2;
  c.numExperts = 8;
  c.topk = 3;
  c.align = 16;
  c.hotExpert = 5;
  c.maxTokens = 40;
  runCase(c);
  c.name = "topk 1, one expert";
  c.topk = 1;
  c.minusOnePercent = 0;
  runCase(c);
}

TEST(MoePlan, ExpertsThatReceiveNothingStayEmpty) {
  CaseSpec c;
  c.name = "half the experts idle";
  c.nranks = 3;
  c.localSize = 3;
  c.numExperts = 12;
  c.topk = 2;
  c.align = 4;
  c.expertsUsed = 3;  // ranks 1 and 2 receive nothing
  runCase(c);
  const MoeRefProblem p = makeProblem(c);
  const Sim sim = planAll(p, Dedup::Rank);
  EXPECT_EQ(sim.recv[2].numRecvRows, 0u);
  EXPECT_TRUE(sim.recv[2].padding.empty());
}

TEST(MoePlan, TokenToTwoExpertsOnOneRankCrossesOnce) {
  MoeShape shape;
  ASSERT_EQ(buildMoeShape(2, 4, nullptr, 1, &shape), fuscoSuccess);
  const int64_t idx[4] = {3, 2, 0, -1};  // experts 3 and 2 live on rank 1, in that k order
  const MoeSendPlan rank = planSend(shape, 0, idx, 1, 4, Dedup::Rank);
  EXPECT_EQ(rank.rows[1], std::vector<int64_t>({0}));
  EXPECT_EQ(rank.meta[1], std::vector<int32_t>({2, 1, 0}));  // local indices, k order
  EXPECT_EQ(rank.kSlots[1], std::vector<uint8_t>({0, 1}));
  EXPECT_EQ(rank.meta[0], std::vector<int32_t>({1, 0}));
  const MoeSendPlan none = planSend(shape, 0, idx, 1, 4, Dedup::None);
  EXPECT_EQ(none.rows[1], std::vector<int64_t>({0, 0}));
  EXPECT_EQ(none.meta[1], std::vector<int32_t>({1, 1, 1, 0}));
  const MoeSendPlan node = planSend(shape, 0, idx, 1, 4, Dedup::Node);
  EXPECT_EQ(node.meta, rank.meta);
  EXPECT_EQ(node.rows, rank.rows);
  MoeRecvPlan rp;
  ASSERT_EQ(planRecv(shape, 1, {{}, rank.meta[1]}, &rp), fuscoSuccess);
  EXPECT_EQ(rp.fanRows[1], std::vector<int64_t>({1, 0}));  // expert 3 is block 1, expert 2 block 0
}

TEST(MoePlan, SamePlanTwice) {
  CaseSpec c;
  c.nranks = 6;
  c.localSize = 3;
  c.numExperts = 17;
  c.explicitPlacement = true;
  c.topk = 6;
  c.align = 4;
  c.maxTokens = 50;
  const MoeRefProblem p = makeProblem(c);
  for (Dedup d : {Dedup::None, Dedup::Rank}) {
    const Sim a = planAll(p, d), b = planAll(p, d);
    for (int r = 0; r < p.nranks; ++r) {
      EXPECT_EQ(a.send[r].rows, b.send[r].rows);
      EXPECT_EQ(a.send[r].meta, b.send[r].meta);
      EXPECT_EQ(a.send[r].kStart, b.send[r].kStart);
      EXPECT_EQ(a.send[r].kSlots, b.send[r].kSlots);
      EXPECT_EQ(a.recv[r].fanStart, b.recv[r].fanStart);
      EXPECT_EQ(a.recv[r].fanRows, b.recv[r].fanRows);
      EXPECT_EQ(a.recv[r].blockStart, b.recv[r].blockStart);
      EXPECT_EQ(a.recv[r].padding, b.recv[r].padding);
    }
  }
}

TEST(MoePlan, ReusedPlansEqualFreshOnes) {
  CaseSpec big, small;
  big.nranks = small.nranks = 4;
  big.localSize = small.localSize = 2;
  big.numExperts = small.numExperts = 8;
  big.topk = small.topk = 4;
  big.align = small.align = 4;
  big.maxTokens = 60;
  small.maxTokens = 5;
  small.seed = 2;
  const MoeRefProblem pb = makeProblem(big), ps = makeProblem(small);
  const Sim fresh = planAll(ps, Dedup::Rank);
  const Sim dirty = planAll(pb, Dedup::None);
  for (int s = 0; s < ps.nranks; ++s) {
    MoeSendPlan reused = dirty.send[s];
    planSendInto(fresh.shape, s, ps.topkIdx[s].data(), ps.numTokens[s], ps.topk, Dedup::Rank,
                 &reused);
    EXPECT_EQ(reused.rows, fresh.send[s].rows);
    EXPECT_EQ(reused.meta, fresh.send[s].meta);
    EXPECT_EQ(reused.kStart, fresh.send[s].kStart);
    EXPECT_EQ(reused.kSlots, fresh.send[s].kSlots);
  }
  for (int r = 0; r < ps.nranks; ++r) {
    std::vector<std::vector<int32_t>> metaFrom(ps.nranks);
    for (int s = 0; s < ps.nranks; ++s) metaFrom[s] = fresh.send[s].meta[r];
    MoeRecvPlan reused = dirty.recv[r];
    ASSERT_EQ(planRecv(fresh.shape, r, metaFrom, &reused), fuscoSuccess);
    EXPECT_EQ(reused.numRecvRows, fresh.recv[r].numRecvRows);
    EXPECT_EQ(reused.tokensPerLocalExpert, fresh.recv[r].tokensPerLocalExpert);
    EXPECT_EQ(reused.blockStart, fresh.recv[r].blockStart);
    EXPECT_EQ(reused.padding, fresh.recv[r].padding);
    EXPECT_EQ(reused.fanStart, fresh.recv[r].fanStart);
    EXPECT_EQ(reused.fanRows, fresh.recv[r].fanRows);
  }
}

// The straightforward send plan: slot by slot, one push per row and per (row, slot).
MoeSendPlan referenceSendPlan(const MoeShape& shape, const int64_t* topkIdx, size_t numTokens,
                              int topk, Dedup dedup) {
  MoeSendPlan p;
  p.numTokens = numTokens;
  p.topk = topk;
  p.rows.resize(shape.nranks);
  p.meta.resize(shape.nranks);
  p.kStart.assign(shape.nranks, {0});
  p.kSlots.resize(shape.nranks);
  std::vector<size_t> countAt(shape.nranks);
  for (size_t t = 0; t < numTokens; ++t)
    for (int k = 0; k < topk; ++k) {
      const int64_t e = topkIdx[t * topk + k];
      if (e < 0) continue;
      const int r = shape.expertToRank[e];
      if (dedup == Dedup::None || p.rows[r].empty() ||
          p.rows[r].back() != static_cast<int64_t>(t)) {
        if (!p.rows[r].empty()) p.kStart[r].push_back(static_cast<uint32_t>(p.kSlots[r].size()));
        p.rows[r].push_back(static_cast<int64_t>(t));
        countAt[r] = p.meta[r].size();
        p.meta[r].push_back(0);
      }
      ++p.meta[r][countAt[r]];
      p.meta[r].push_back(shape.localIndexOf[e]);
      p.kSlots[r].push_back(static_cast<uint8_t>(k));
    }
  for (int r = 0; r < shape.nranks; ++r)
    if (!p.rows[r].empty()) p.kStart[r].push_back(static_cast<uint32_t>(p.kSlots[r].size()));
  return p;
}

TEST(MoePlan, SendPlansEqualTheSlotBySlotPlanOnRandomRoutings) {
  MoeSendPlan reused;  // planned into for every case below: its storage is reused
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    CaseSpec c;
    std::mt19937_64 rng(seed);
    c.nranks = 1 + static_cast<int>(rng() % 12);
    c.numExperts = c.nranks * (1 + static_cast<int>(rng() % 5));
    c.explicitPlacement = seed % 3 == 0;
    c.topk = 1 + static_cast<int>(rng() % std::min(c.numExperts, 9));
    c.maxTokens = 1 + rng() % 200;
    c.minusOnePercent = static_cast<int>(rng() % 40);
    c.hotExpert = seed % 4 == 0 ? static_cast<int>(rng() % c.numExperts) : -1;
    c.seed = seed;
    const MoeRefProblem p = makeProblem(c);
    MoeShape shape;
    ASSERT_EQ(buildMoeShape(p.nranks, p.numExperts,
                            p.placement.empty() ? nullptr : p.placement.data(), 1, &shape),
              fuscoSuccess);
    for (int s = 0; s < p.nranks; ++s)
      for (Dedup dedup : {Dedup::None, Dedup::Rank, Dedup::Node}) {
        SCOPED_TRACE("seed " + std::to_string(seed) + " rank " + std::to_string(s) + " dedup " +
                     std::to_string(static_cast<int>(dedup)));
        const MoeSendPlan want =
            referenceSendPlan(shape, p.topkIdx[s].data(), p.numTokens[s], p.topk,
                              dedup == Dedup::None ? Dedup::None : Dedup::Rank);
        planSendInto(shape, s, p.topkIdx[s].data(), p.numTokens[s], p.topk, dedup, &reused);
        EXPECT_EQ(reused.rows, want.rows);
        EXPECT_EQ(reused.meta, want.meta);
        EXPECT_EQ(reused.kStart, want.kStart);
        EXPECT_EQ(reused.kSlots, want.kSlots);
        EXPECT_EQ(reused.numTokens, p.numTokens[s]);
      }
  }
}

TEST(MoePlanBadInput, ExpertIdOutOfRangeNamesTokenAndSlot) {
  MoeShape shape;
  ASSERT_EQ(buildMoeShape(2, 4, nullptr, 1, &shape), fuscoSuccess);
  const int64_t idx[6] = {0, 1, 2, 3, -1, 4};
  EXPECT_EQ(validateTopk(shape, idx, 3, 2), fuscoInvalidArgument);
  EXPECT_NE(threadLastError().find("token 2 slot 1"), std::string::npos) << threadLastError();
  EXPECT_NE(threadLastError().find("[-1, 4)"), std::string::npos) << threadLastError();
  const int64_t neg[2] = {-2, 0};
  EXPECT_EQ(validateTopk(shape, neg, 1, 2), fuscoInvalidArgument);
  EXPECT_NE(threadLastError().find("token 0 slot 0"), std::string::npos) << threadLastError();
}

TEST(MoePlanBadInput, DuplicateExpertNamesTokenAndSlot) {
  MoeShape shape;
  ASSERT_EQ(buildMoeShape(2, 8, nullptr, 1, &shape), fuscoSuccess);
  const int64_t idx[12] = {0, 1, 2, 3, 5, 6, 7, -1, 4, -1, 1, 4};
  EXPECT_EQ(validateTopk(shape, idx, 3, 4), fuscoInvalidArgument);
  EXPECT_NE(threadLastError().find("token 2 slot 3"), std::string::npos) << threadLastError();
  EXPECT_NE(threadLastError().find("slot 0"), std::string::npos) << threadLastError();
  // The same expert in different tokens is fine; -1 may repeat.
  const int64_t ok[8] = {1, -1, -1, 2, 1, 2, -1, -1};
  EXPECT_EQ(validateTopk(shape, ok, 2, 4), fuscoSuccess);
}

TEST(MoePlanBadInput, TopkOutsideSupportedRange) {
  MoeShape shape;
  ASSERT_EQ(buildMoeShape(1, 4, nullptr, 1, &shape), fuscoSuccess);
  const int64_t idx[1] = {0};
  EXPECT_EQ(validateTopk(shape, idx, 1, 0), fuscoInvalidArgument);
  EXPECT_NE(threadLastError().find("[1, 255]"), std::string::npos) << threadLastError();
  EXPECT_EQ(validateTopk(shape, idx, 0, 256), fuscoInvalidArgument);
  EXPECT_EQ(validateTopk(shape, nullptr, 0, 2), fuscoSuccess);  // zero tokens
  EXPECT_EQ(validateTopk(shape, nullptr, 3, 2), fuscoInvalidArgument);
  // More tokens than the wire's 32-bit row indices: refused before the routing is read.
  const int64_t one[2] = {0, 1};
  EXPECT_EQ(validateTopk(shape, one, static_cast<size_t>(INT32_MAX) + 1, 2), fuscoInvalidArgument);
  EXPECT_NE(threadLastError().find("2^31 - 1"), std::string::npos) << threadLastError();
}

TEST(MoePlanBadInput, BadShapeAndPlacement) {
  MoeShape shape;
  EXPECT_EQ(buildMoeShape(4, 0, nullptr, 1, &shape), fuscoInvalidArgument);
  EXPECT_EQ(buildMoeShape(4, 10, nullptr, 1, &shape), fuscoInvalidArgument);
  EXPECT_NE(threadLastError().find("not a multiple"), std::string::npos) << threadLastError();
  const int bad[3] = {0, 4, 1};
  EXPECT_EQ(buildMoeShape(4, 3, bad, 1, &shape), fuscoInvalidArgument);
  EXPECT_NE(threadLastError().find("expertToRank[1] = 4 outside [0, 4)"), std::string::npos)
      << threadLastError();
  const int neg[3] = {0, 1, -1};
  EXPECT_EQ(buildMoeShape(4, 3, neg, 1, &shape), fuscoInvalidArgument);
  EXPECT_EQ(buildMoeShape(0, 4, nullptr, 1, &shape), fuscoInvalidArgument);
  EXPECT_EQ(buildMoeShape(2, 4, nullptr, -1, &shape), fuscoInvalidArgument);
  // A valid uneven placement: rank 3 has no experts at all.
  const int good[5] = {2, 0, 2, 1, 0};
  ASSERT_EQ(buildMoeShape(4, 5, good, 0, &shape), fuscoSuccess);
  EXPECT_EQ(shape.localExperts[0], std::vector<int>({1, 4}));
  EXPECT_EQ(shape.localExperts[2], std::vector<int>({0, 2}));
  EXPECT_TRUE(shape.localExperts[3].empty());
  EXPECT_EQ(shape.localIndexOf, std::vector<int>({0, 0, 1, 0, 1}));
  EXPECT_EQ(shape.expertAlignment, 1);
}

TEST(MoePlanBadInput, MalformedMetadataNamesTheSource) {
  MoeShape shape;
  ASSERT_EQ(buildMoeShape(2, 6, nullptr, 1, &shape), fuscoSuccess);  // 3 local experts each
  const std::vector<std::vector<int32_t>> bad[] = {
      {{}, {1, 0, 0}},        // count 0
      {{}, {1, 3}},           // local index out of range
      {{}, {2, 0}},           // truncated
      {{}, {1, 0, 2, 1, 1}},  // same local expert twice in one row
      {{}, {4, 0, 1, 2, 0}},  // more experts than the rank has
      {{}, {-1}},             // negative count
  };
  for (const auto& metaFrom : bad) {
    MoeRecvPlan rp;
    rp.numRecvRows = 1234;
    EXPECT_EQ(planRecv(shape, 0, metaFrom, &rp), fuscoRemoteError);
    EXPECT_NE(threadLastError().find("from rank 1"), std::string::npos) << threadLastError();
    EXPECT_EQ(rp.numRecvRows, 1234u) << "no output on failure";
  }
  MoeRecvPlan rp;
  EXPECT_NE(planRecv(shape, 0, std::vector<std::vector<int32_t>>(1), &rp),
            fuscoSuccess);  // metadata from too few ranks
  EXPECT_NE(planRecv(shape, 2, std::vector<std::vector<int32_t>>(2), &rp), fuscoSuccess);
}

TEST(MoePlan, DescribePlanSummarizesPaths) {
  MoeShape shape;
  ASSERT_EQ(buildMoeShape(4, 8, nullptr, 4, &shape), fuscoSuccess);
  NodeMap nodes;
  nodes.nranks = 4;
  nodes.numNodes = 2;
  nodes.nodeOf = {0, 0, 1, 1};
  nodes.localRankOf = {0, 1, 0, 1};
  nodes.ranksOfNode = {{0, 1}, {2, 3}};
  // Token 0: experts 2,3 (rank 1) and 4 (rank 2); token 1: expert 0 (self) and 7 (rank 3).
  const int64_t idx[6] = {2, 3, 4, 0, 7, -1};
  const MoeSendPlan send = planSend(shape, 0, idx, 2, 3, Dedup::Rank);
  std::vector<std::vector<int32_t>> metaFrom(4);
  metaFrom[0] = send.meta[0];
  MoeRecvPlan recv;
  ASSERT_EQ(planRecv(shape, 0, metaFrom, &recv), fuscoSuccess);
  const std::string line = describePlan(shape, nodes, 0, send, recv, 100, Dedup::Rank);
  EXPECT_NE(line.find("plan rank 0: dedup RANK"), std::string::npos) << line;
  EXPECT_NE(line.find("rows to peers [1,1,1,1]"), std::string::npos) << line;
  EXPECT_NE(line.find("intra-node 1 rows/100 B"), std::string::npos) << line;
  EXPECT_NE(line.find("inter-node 2 rows/200 B"), std::string::npos) << line;
  EXPECT_NE(line.find("recv 4 rows (3 padding)"), std::string::npos) << line;
  EXPECT_NE(line.find("saved 1 rows vs NONE"), std::string::npos) << line;
  // Before the row size is known, the line counts rows only (no misleading "0 B").
  const std::string rowsOnly = describePlan(shape, nodes, 0, send, recv, 0, Dedup::Rank);
  EXPECT_NE(rowsOnly.find("intra-node 1 rows, inter-node 2 rows,"), std::string::npos) << rowsOnly;
  EXPECT_EQ(rowsOnly.find(" B,"), std::string::npos) << rowsOnly;
}

TEST(MoePlan, LargeLayerPlansQuickly) {
  // A DeepSeek-like layer: 64 ranks, 256 experts, top-8, 4096 tokens; checks the sizes only.
  MoeShape shape;
  ASSERT_EQ(buildMoeShape(64, 256, nullptr, 16, &shape), fuscoSuccess);
  std::mt19937_64 rng(7);
  const size_t T = 4096;
  const int topk = 8;
  std::vector<int64_t> idx(T * topk);
  std::vector<int> pool(256);
  for (size_t t = 0; t < T; ++t) {
    for (int e = 0; e < 256; ++e) pool[e] = e;
    for (int k = 0; k < topk; ++k) {
      std::swap(pool[k], pool[k + rng() % (256 - k)]);
      idx[t * topk + k] = pool[k];
    }
  }
  ASSERT_EQ(validateTopk(shape, idx.data(), T, topk), fuscoSuccess);
  const MoeSendPlan sp = planSend(shape, 5, idx.data(), T, topk, Dedup::Rank);
  size_t slots = 0;
  for (int r = 0; r < 64; ++r) slots += sp.kSlots[r].size();
  EXPECT_EQ(slots, T * topk);
  std::vector<std::vector<int32_t>> metaFrom(64, sp.meta[5]);
  MoeRecvPlan rp;
  ASSERT_EQ(planRecv(shape, 5, metaFrom, &rp), fuscoSuccess);
  EXPECT_EQ(rp.rowsFrom(63), sp.rows[5].size());
}

}  // namespace
}  // namespace fusco
