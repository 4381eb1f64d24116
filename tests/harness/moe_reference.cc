// Sequential MoE reference: the definitions of docs/API.md written as plain loops.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "harness/moe_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

namespace fusco::test {

namespace {

uint32_t bitsOf(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
float floatOf(uint32_t u) {
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

// Magnitude of a bf16 pattern (sign cleared) as a double; the pattern after the largest finite
// one (inf) counts as 2^128, the value rounding compares against.
double bf16Magnitude(uint32_t pattern) {
  if (pattern >= 0x7f80u) return std::ldexp(1.0, 128);
  return static_cast<double>(floatOf(pattern << 16));
}

float roundTo(fuscoDataType_t dt, float v) {
  uint8_t buf[4];
  refFromFloat(dt, v, buf);
  return refToFloat(dt, buf);
}

size_t esizeOf(fuscoDataType_t dt) { return dt == fuscoFloat32 ? 4 : 2; }

}  // namespace

int MoeRefProblem::rankOfExpert(int e) const {
  if (!placement.empty()) return placement[e];
  return e / (numExperts / nranks);
}

uint16_t refFloatToBf16(float v) {
  const uint32_t b = bitsOf(v);
  const uint32_t sign = (b >> 16) & 0x8000u;
  if (std::isnan(v)) return static_cast<uint16_t>((b >> 16) | 0x40u);
  if (std::isinf(v)) return static_cast<uint16_t>(b >> 16);
  const double a = std::fabs(static_cast<double>(v));
  const uint32_t lo = (b & 0x7fffffffu) >> 16;  // truncated toward zero
  const uint32_t hi = lo + 1;
  const double dlo = a - bf16Magnitude(lo), dhi = bf16Magnitude(hi) - a;
  uint32_t pick;
  if (dlo < dhi) {
    pick = lo;
  } else if (dhi < dlo) {
    pick = hi;
  } else {
    pick = (lo % 2 == 0) ? lo : hi;
  }
  return static_cast<uint16_t>(sign | pick);
}

uint16_t refFloatToHalf(float v) {
  const uint32_t b = bitsOf(v);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  if (std::isnan(v)) return static_cast<uint16_t>(sign | 0x7e00u | ((b >> 13) & 0x3ffu));
  const double a = std::fabs(static_cast<double>(v));
  if (a >= 65520.0) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  // The ulp of the binade of a (subnormals share the smallest normal binade's ulp 2^-24).
  int ex = 0;
  std::frexp(a, &ex);  // a = m * 2^ex, m in [0.5, 1)
  const int e = std::max(ex - 1, -14);
  const double ulp = std::ldexp(1.0, e - 10);
  const double r = std::nearbyint(a / ulp);  // exact quotient; default mode: ties to even
  const double value = r * ulp;
  if (value < std::ldexp(1.0, -14)) return static_cast<uint16_t>(sign | static_cast<uint16_t>(r));
  int ex2 = 0;
  const double m = std::frexp(value, &ex2);  // value = m * 2^ex2
  const uint32_t biased = static_cast<uint32_t>(ex2 - 1 + 15);
  const uint32_t mant = static_cast<uint32_t>((m * 2.0 - 1.0) * 1024.0);
  return static_cast<uint16_t>(sign | (biased << 10) | mant);
}

float refHalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) ? 0x80000000u : 0u;
  const int E = (h >> 10) & 31;
  const int M = h & 1023;
  if (E == 31) {
    if (M == 0) return floatOf(sign | 0x7f800000u);
    return floatOf(sign | 0x7fc00000u | (static_cast<uint32_t>(M) << 13));
  }
  const double mag = E == 0 ? std::ldexp(static_cast<double>(M), -24)
                            : std::ldexp(static_cast<double>(1024 + M), E - 25);
  return floatOf(sign | bitsOf(static_cast<float>(mag)));
}

float refToFloat(fuscoDataType_t dt, const uint8_t* elem) {
  if (dt == fuscoFloat32) {
    float v;
    std::memcpy(&v, elem, 4);
    return v;
  }
  const uint16_t h = static_cast<uint16_t>(elem[0] | (elem[1] << 8));
  if (dt == fuscoBfloat16) return floatOf(static_cast<uint32_t>(h) << 16);
  return refHalfToFloat(h);
}

void refFromFloat(fuscoDataType_t dt, float v, uint8_t* elem) {
  if (dt == fuscoFloat32) {
    std::memcpy(elem, &v, 4);
    return;
  }
  const uint16_t h = dt == fuscoBfloat16 ? refFloatToBf16(v) : refFloatToHalf(v);
  elem[0] = static_cast<uint8_t>(h & 0xff);
  elem[1] = static_cast<uint8_t>(h >> 8);
}

MoeRefDispatch moeRefDispatch(const MoeRefProblem& p, const std::vector<std::vector<uint8_t>>& x,
                              size_t rowBytes) {
  MoeRefDispatch d;
  const int n = p.nranks;
  const size_t align = p.expertAlignment > 1 ? static_cast<size_t>(p.expertAlignment) : 1;
  d.recvX.resize(n);
  d.numRecvRows.assign(n, 0);
  d.tokensPerLocalExpert.resize(n);
  d.slotRow.resize(n);
  for (int s = 0; s < n; ++s) d.slotRow[s].assign(p.numTokens[s] * p.topk, -1);
  for (int r = 0; r < n; ++r) {
    std::vector<uint8_t>& out = d.recvX[r];
    size_t row = 0;
    for (int e = 0; e < p.numExperts; ++e) {  // local experts: ascending global id
      if (p.rankOfExpert(e) != r) continue;
      size_t got = 0;
      for (int s = 0; s < n; ++s) {
        for (size_t t = 0; t < p.numTokens[s]; ++t) {
          for (int k = 0; k < p.topk; ++k) {
            if (p.topkIdx[s][t * p.topk + k] != e) continue;
            const uint8_t* src = x[s].data() + t * rowBytes;
            out.insert(out.end(), src, src + rowBytes);
            d.slotRow[s][t * p.topk + k] = static_cast<int64_t>(row);
            ++row;
            ++got;
          }
        }
      }
      d.tokensPerLocalExpert[r].push_back(static_cast<int64_t>(got));
      while (got % align != 0) {
        out.insert(out.end(), rowBytes, 0);
        ++got;
        ++row;
      }
    }
    d.numRecvRows[r] = row;
  }
  return d;
}

std::vector<std::vector<uint8_t>> moeRefCombine(const MoeRefProblem& p, const MoeRefDispatch& d,
                                                const std::vector<std::vector<uint8_t>>& expertOut,
                                                fuscoDataType_t dt, size_t hidden,
                                                const std::vector<std::vector<float>>& weights) {
  const int n = p.nranks;
  const size_t es = esizeOf(dt);
  const int numNodes = *std::max_element(p.nodeOf.begin(), p.nodeOf.end()) + 1;
  std::vector<std::vector<uint8_t>> out(n);
  for (int s = 0; s < n; ++s) {
    out[s].assign(p.numTokens[s] * hidden * es, 0);
    for (size_t t = 0; t < p.numTokens[s]; ++t) {
      for (size_t j = 0; j < hidden; ++j) {
        float total = 0.0f;
        bool anyNode = false;
        for (int node = 0; node < numNodes; ++node) {
          float nodeSum = 0.0f;
          bool anyRank = false;
          for (int r = 0; r < n; ++r) {
            if (p.nodeOf[r] != node) continue;
            float rankSum = 0.0f;
            bool any = false;
            for (int k = 0; k < p.topk; ++k) {
              const int64_t e = p.topkIdx[s][t * p.topk + k];
              if (e < 0 || p.rankOfExpert(static_cast<int>(e)) != r) continue;
              const int64_t row = d.slotRow[s][t * p.topk + k];
              const float xv = refToFloat(dt, expertOut[r].data() + (row * hidden + j) * es);
              const float w =
                  weights.empty() || weights[s].empty() ? 1.0f : weights[s][t * p.topk + k];
              const float prod = w * xv;
              rankSum = rankSum + prod;
              any = true;
            }
            if (!any) continue;
            nodeSum = nodeSum + roundTo(dt, rankSum);
            anyRank = true;
          }
          if (!anyRank) continue;
          total = total + roundTo(dt, nodeSum);
          anyNode = true;
        }
        if (anyNode) refFromFloat(dt, total, out[s].data() + (t * hidden + j) * es);
      }
    }
  }
  return out;
}

MoeRefSendStats moeRefSendStats(const MoeRefProblem& p, int rank) {
  MoeRefSendStats st;
  for (size_t t = 0; t < p.numTokens[rank]; ++t) {
    std::set<int> remote, remoteNodes;
    for (int k = 0; k < p.topk; ++k) {
      const int64_t e = p.topkIdx[rank][t * p.topk + k];
      if (e < 0) continue;
      const int r = p.rankOfExpert(static_cast<int>(e));
      if (p.nodeOf[r] != p.nodeOf[rank]) remoteNodes.insert(p.nodeOf[r]);
      if (r == rank) continue;
      remote.insert(r);
      (p.nodeOf[r] == p.nodeOf[rank] ? st.noneIntra : st.noneInter)++;
    }
    for (int r : remote) (p.nodeOf[r] == p.nodeOf[rank] ? st.rankIntra : st.rankInter)++;
    st.nodeInter += remoteNodes.size();
  }
  return st;
}

}  // namespace fusco::test
