// The host twin of the low-latency kernels (ll_ops.h): the same steps as ll_kernels.cu, one unit
// after another on the calling thread, over host memory that peers map (shared memory). Host
// communicators run their low-latency calls with it, which is how the protocol and the exact bytes
// are checked on machines without a GPU.
#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/log.h"
#include "core/result.h"
#include "device/ll_ops.h"

namespace fusco {
namespace ll {
namespace {

uint64_t up(uint64_t v) { return (v + 255) & ~uint64_t{255}; }

// Waits until *word >= want (peer advances it); bounded by the timeout, the peer's liveness and
// the host's release word.
fuscoResult_t waitFor(const Args& a, const HostWait& w, Phase ph, const uint64_t* word,
                      uint64_t want, uint32_t peer) {
  const Deadline deadline(w.timeoutMs);
  int64_t lastLive = nowNs();
  for (uint64_t spins = 0; loadAcquire(word) < want; ++spins) {
    if (__atomic_load_n(&a.host->release, __ATOMIC_ACQUIRE) != 0)
      return FUSCO_FAIL(fuscoRemoteError, kEngine,
                        "low-latency %s: the communicator broke while waiting for rank %u",
                        phaseName(ph), peer);
    if (spins < 256) continue;
    if (w.abort != nullptr && w.abort->load(std::memory_order_relaxed))
      return FUSCO_FAIL(fuscoInvalidUsage, kEngine,
                        "low-latency %s: aborted (fuscoCommAbort) while waiting for rank %u",
                        phaseName(ph), peer);
    std::this_thread::yield();
    const int64_t now = nowNs();
    if (now - lastLive >= w.livenessMs * 1000000LL) {
      FUSCO_CHECK(w.check(w.ctx, static_cast<int>(peer)));
      lastLive = now;
    }
    if (deadline.expired()) {
      a.host->timedOut = peer + 1;
      a.host->phase = ph;
      return FUSCO_FAIL(fuscoTimeout, kEngine,
                        "low-latency %s: waited more than %lld ms for rank %u", phaseName(ph),
                        static_cast<long long>(w.timeoutMs), peer);
    }
  }
  return fuscoSuccess;
}

uint64_t* word(char* half, uint64_t region, uint64_t index) {
  return reinterpret_cast<uint64_t*>(half + region) + index;
}

// Token t's row into slot `at` of a destination half: a bf16 copy, or e4m3 with its scales.
void writeRow(const Args& a, char* dst, uint64_t at, uint32_t t) {
  const uint16_t* src = a.x + static_cast<uint64_t>(t) * a.d.hidden;
  char* row = dst + a.l.dispRows + at * a.l.rowStride;
  if (!a.fp8) {
    std::memcpy(row, src, static_cast<size_t>(a.d.hidden) * 2);
    return;
  }
  float* scales = reinterpret_cast<float*>(dst + a.l.dispScales) + at * a.l.groups;
  for (uint64_t g = 0; g < a.l.groups; ++g) {
    const uint16_t* in = src + g * kGroup;
    float amax = 0.0f;
    for (uint32_t c = 0; c < kGroup; ++c) amax = amaxWith(amax, bf16Value(in[c]));
    const float scale = groupScale(amax);
    for (uint32_t c = 0; c < kGroup; ++c)
      row[g * kGroup + c] = static_cast<char>(floatToE4m3(divRn(bf16Value(in[c]), scale)));
    scales[g] = scale;
  }
}

fuscoResult_t dispatchSend(const Args& a, const HostWait& w, uint64_t epoch) {
  State* st = stateOf(a);
  const uint64_t n = static_cast<uint64_t>(a.numTokens) * a.topk;
  for (uint64_t i = 0; i < n; ++i)
    if (badSlot(a.topkIdx + i / a.topk * a.topk, static_cast<uint32_t>(i % a.topk), a.numExperts))
      st->badCode = std::min<uint32_t>(
          st->badCode, static_cast<uint32_t>(i / a.topk) << 8 | static_cast<uint32_t>(i % a.topk));
  for (uint32_t e = 0; e < a.numExperts; ++e) {
    const uint32_t dst = e / a.d.local, le = e % a.d.local;
    FUSCO_CHECK(waitFor(a, w, kDispatchSend, word(ownHalf(a), a.l.dispFreed, dst), epoch, dst));
    char* half = halfOf(a, a.peers[dst]);
    uint64_t pos = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const uint32_t t = static_cast<uint32_t>(i / a.topk), k = static_cast<uint32_t>(i % a.topk);
      const int64_t* ids = a.topkIdx + i - k;
      if (ids[k] != e || !movesSlot(ids, k, a.numExperts)) continue;
      const uint64_t at = dispIndex(a.d, le, a.rank, pos++);
      writeRow(a, half, at, t);
      reinterpret_cast<int32_t*>(half + a.l.dispSlot)[at] =
          static_cast<int32_t>(t * a.d.maxTopk + k);
    }
    storeRelease(word(half, a.l.dispCount, static_cast<uint64_t>(le) * a.d.ranks + a.rank),
                 (epoch + 1) << 32 | pos);
  }
  return fuscoSuccess;
}

// Local expert le's rows of source r (cnt of them) into the packed side from row `off` on.
void packRows(const Args& a, char* half, uint32_t le, uint32_t r, uint64_t cnt, uint64_t off) {
  const uint64_t rowBytes = packedRowBytes(a);
  for (uint64_t i = 0; i < cnt; ++i) {
    const uint64_t from = dispIndex(a.d, le, r, i), to = le * packRows(a.d) + off + i;
    std::memcpy(half + a.l.packX + to * rowBytes, half + a.l.dispRows + from * a.l.rowStride,
                rowBytes);
    if (a.fp8)
      std::memcpy(half + a.l.packScales + to * a.l.groups * 4,
                  half + a.l.dispScales + from * a.l.groups * 4, a.l.groups * 4);
    const int32_t slot = reinterpret_cast<const int32_t*>(half + a.l.dispSlot)[from];
    reinterpret_cast<int32_t*>(half + a.l.packSlot)[to] = slot;
    reinterpret_cast<int32_t*>(half + a.l.packRank)[to] = static_cast<int32_t>(r);
    reinterpret_cast<int32_t*>(half + a.l.packToken)[to] = slot / static_cast<int32_t>(a.d.maxTopk);
  }
}

// Every rank's word[rank] of region in half (this rank tells all that it is done with epoch).
void postAll(const Args& a, uint64_t region, uint64_t value) {
  for (uint32_t r = 0; r < a.d.ranks; ++r)
    storeRelease(word(halfOf(a, a.peers[r]), region, a.rank), value);
}

// Waits until every rank's word[r] of region in this rank's half is >= want.
fuscoResult_t waitRanks(const Args& a, const HostWait& w, Phase ph, uint64_t region,
                        uint64_t want) {
  for (uint32_t r = 0; r < a.d.ranks; ++r)
    FUSCO_CHECK(waitFor(a, w, ph, word(ownHalf(a), region, r), want, r));
  return fuscoSuccess;
}

// The end of a phase (the kernels' last block): what it tells every rank, then the next epoch.
void finishPhase(const Args& a, Phase p, uint64_t epoch) {
  State* st = stateOf(a);
  if (p == kDispatchRecv) postAll(a, a.l.dispFreed, epoch + 1);
  if (p == kCombineSend) postAll(a, a.l.combFlag, epoch + 1);
  if (p == kCombineRecv) postAll(a, a.l.combFreed, epoch + 1);
  if (p == kDispatchSend && st->badCode != kNoBad) a.host->bad = st->badCode + 1;
  st->badCode = p == kDispatchSend ? kNoBad : st->badCode;
  st->epoch[p][a.half] = epoch + 1;
}

fuscoResult_t dispatchRecv(const Args& a, const HostWait& w, uint64_t epoch) {
  char* half = ownHalf(a);
  for (uint32_t le = 0; le < a.d.local; ++le) {
    uint64_t off = 0;
    for (uint32_t r = 0; r < a.d.ranks; ++r) {
      const uint64_t* c = word(half, a.l.dispCount, static_cast<uint64_t>(le) * a.d.ranks + r);
      FUSCO_CHECK(waitFor(a, w, kDispatchRecv, c, (epoch + 1) << 32, r));
      const uint64_t cnt = loadAcquire(c) & 0xffffffffu;
      reinterpret_cast<int64_t*>(half + a.l.recvLayout)[le * a.d.ranks + r] =
          static_cast<int64_t>(off << 32 | cnt);
      packRows(a, half, le, r, cnt, off);
      off += cnt;
    }
    reinterpret_cast<int32_t*>(half + a.l.recvCount)[le] = static_cast<int32_t>(off);
  }
  return fuscoSuccess;
}

fuscoResult_t combineSend(const Args& a, const HostWait& w, uint64_t epoch) {
  char* half = ownHalf(a);
  FUSCO_CHECK(waitRanks(a, w, kCombineSend, a.l.combFreed, epoch));
  const uint64_t rowBytes = static_cast<uint64_t>(a.d.hidden) * 2;
  for (uint32_t le = 0; le < a.d.local; ++le) {
    const int32_t n = reinterpret_cast<const int32_t*>(half + a.l.recvCount)[le];
    for (int32_t g = 0; g < n; ++g) {
      const uint64_t at = le * packRows(a.d) + static_cast<uint64_t>(g);
      const int32_t r = reinterpret_cast<const int32_t*>(half + a.l.packRank)[at];
      const int32_t slot = reinterpret_cast<const int32_t*>(half + a.l.packSlot)[at];
      char* dst =
          halfOf(a, a.peers[r]) + a.l.combRows + static_cast<uint64_t>(slot) * a.l.rowStride;
      std::memcpy(dst, a.expertOut + at * a.d.hidden, rowBytes);
    }
  }
  return fuscoSuccess;
}

// combineElement (ll_steps.h) for every element of a token, term after term over whole rows (the
// same operations per element in the same order, so the same bits), which the compiler vectorizes.
void sumToken(const uint16_t* const* rows, const float* w, const uint8_t* last, uint32_t n,
              uint64_t hidden, uint16_t* out, std::vector<float>* accBuf,
              std::vector<float>* grpBuf) {
  accBuf->assign(hidden, 0.0f);
  grpBuf->assign(hidden, 0.0f);
  float* acc = accBuf->data();
  float* grp = grpBuf->data();
  for (uint32_t i = 0; i < n; ++i) {
    const uint16_t* y = rows[i];
    if (w != nullptr)
      for (uint64_t j = 0; j < hidden; ++j) grp[j] = addRn(grp[j], mulRn(w[i], bf16Value(y[j])));
    else
      for (uint64_t j = 0; j < hidden; ++j) grp[j] = addRn(grp[j], bf16Value(y[j]));
    if (!last[i]) continue;
    for (uint64_t j = 0; j < hidden; ++j) {
      acc[j] = addRn(acc[j], bf16Value(floatToBf16Inline(grp[j])));
      grp[j] = 0.0f;
    }
  }
  for (uint64_t j = 0; j < hidden; ++j) out[j] = floatToBf16Inline(acc[j]);
}

fuscoResult_t combineRecv(const Args& a, const HostWait& w, uint64_t epoch) {
  char* half = ownHalf(a);
  FUSCO_CHECK(waitRanks(a, w, kCombineRecv, a.l.combFlag, epoch + 1));
  uint8_t order[kMaxTopk], last[kMaxTopk];
  const uint16_t* rows[kMaxTopk];
  float wt[kMaxTopk];
  std::vector<float> acc, grp;
  for (uint32_t t = 0; t < a.numTokens; ++t) {
    const int64_t* ids = a.topkIdx + static_cast<uint64_t>(t) * a.topk;
    const uint32_t n = termOrder(ids, a.topk, a.numExperts, a.d.local, order, last);
    for (uint32_t i = 0; i < n; ++i) {
      const uint64_t slot = static_cast<uint64_t>(t) * a.d.maxTopk + order[i];
      rows[i] = reinterpret_cast<const uint16_t*>(half + a.l.combRows + slot * a.l.rowStride);
      if (a.weights != nullptr) wt[i] = a.weights[static_cast<uint64_t>(t) * a.topk + order[i]];
    }
    sumToken(rows, a.weights != nullptr ? wt : nullptr, last, n, a.d.hidden,
             a.out + static_cast<uint64_t>(t) * a.d.hidden, &acc, &grp);
  }
  return fuscoSuccess;
}

}  // namespace

Layout layoutFor(const Dims& d) {
  Layout l;
  const uint64_t L = d.local, R = d.ranks, M = d.maxTokens, H = d.hidden;
  l.rowStride = (H * 2 + 15) & ~uint64_t{15};
  l.groups = H % kGroup == 0 ? H / kGroup : 0;
  const uint64_t slots = L * R * M;
  uint64_t at = 0;
  auto take = [&](uint64_t* off, uint64_t bytes) {
    *off = at;
    at = up(at + bytes);
  };
  take(&l.dispRows, slots * l.rowStride);
  take(&l.dispScales, slots * l.groups * 4);
  take(&l.dispSlot, slots * 4);
  take(&l.dispCount, L * R * 8);
  take(&l.packX, slots * H * 2);
  take(&l.packScales, slots * l.groups * 4);
  take(&l.packSlot, slots * 4);
  take(&l.packRank, slots * 4);
  take(&l.packToken, slots * 4);
  take(&l.recvCount, L * 4);
  take(&l.recvLayout, L * R * 8);
  take(&l.combRows, M * d.maxTopk * l.rowStride);
  take(&l.combFlag, R * 8);
  take(&l.dispFreed, R * 8);
  take(&l.combFreed, R * 8);
  l.halfBytes = at;
  l.state = 2 * l.halfBytes;
  l.total = up(l.state + sizeof(State));
  return l;
}

fuscoResult_t hostRun(const Args& a, uint32_t phases, const HostWait& w) {
  using Step = fuscoResult_t (*)(const Args&, const HostWait&, uint64_t);
  static constexpr Step kSteps[kPhases] = {dispatchSend, dispatchRecv, combineSend, combineRecv};
  for (uint32_t p = 0; p < kPhases; ++p) {
    if (!(phases & (1u << p))) continue;
    const uint64_t epoch = stateOf(a)->epoch[p][a.half];
    FUSCO_CHECK(kSteps[p](a, w, epoch));
    finishPhase(a, static_cast<Phase>(p), epoch);
  }
  return fuscoSuccess;
}

#ifndef FUSCO_HAVE_CUDA
fuscoResult_t deviceRun(const Args&, uint32_t, void*) {
  return FUSCO_FAIL(fuscoInvalidUsage, kEngine, "this build of fusco has no CUDA support");
}
#endif

}  // namespace ll
}  // namespace fusco
