// Combine's sum at the source when some peers push their rows (docs/DESIGN.md, "Combine: pull
// where offered, push otherwise"), written once (FUSCO_HD) for the operation kernel and its twin.
//
// A peer whose expert output this rank cannot map streams the rows this rank's terms need, in
// this rank's slot order, through the pair's channel (a producer role, chan_roles.h). The reduce
// role reads them in place from the ring's slots (the feed roles name the rings) and the other
// ranks' rows from their mapped expert outputs, and writes each token's sum in the fixed order of
// docs/API.md: each rank's group of terms summed in fp32 and rounded, then the groups summed in
// order, as the sum kernel does (device_kernels.cu), so the bits are the same.
//
// Term k of a pushing rank r is row termSeq[k] - seqBase[r] of r's message: byte o of it lies in
// the message's slot o / payload at o % payload (a message's slots are full but its last). A slot
// is checked (epoch, size) when first needed and handed back once no later token needs it: every
// rank's terms are in slot order, so a token needs only slots at or after its first row. The slot
// holding a token's first row may still hold the previous token's last, so a token's rows from
// one rank must fit in depth - 1 slots (reduceWindowFits): the caller checks it.
#pragma once

#include <cstdint>

#include "device/chan_steps.h"
#include "device/chan_table.h"
#include "device/device_ops.h"
#include "device/reduce_math.h"
#include "fusco.h"

namespace fusco {
namespace chan {

// The reduce role's arguments (in the operation's parameter block; addresses are the stream's).
struct ReduceArgs {
  uint64_t termStart, termRank, termRow, termSeq, termWeight, termLast;  // device_ops.h
  uint64_t weights;  // float per (token, slot); 0: every term unweighted
  uint64_t out;      // the sums, one row per token
  uint64_t bases;    // const char*[nranks]: a pulled rank's mapped expert output
  uint64_t seqBase;  // uint64_t[nranks]: the packed slot of each rank's first row
  uint64_t feedOf;   // int32_t[nranks]: a pushing rank's feed role, -1 when pulled
  uint64_t feeds;    // FeedState[nranks]
  uint64_t ntokens;  // tokens (rows of out)
  uint64_t hidden;   // elements per row
  uint32_t dt;       // fuscoDataType_t
  uint32_t pad;
  uint64_t next;  // the next token to sum (reset when the operation starts)
};

// Where the reducer stands in one pushing rank's message.
struct FeedState {
  uint64_t start;    // the ring position of the message's first slot
  uint64_t checked;  // slots of the message checked so far
};

FUSCO_HD inline uint64_t elemBytes(uint32_t dt) { return dt == fuscoFloat32 ? 4 : 2; }

// Whether `rows` rows of rowBytes (the most one token takes from one rank) always fit the slots
// the reducer may hold at once in a ring of d.
FUSCO_HD inline bool reduceWindowFits(const RingDims& d, uint64_t rows, uint64_t rowBytes) {
  return d.slots >= 2 && (d.slots - 1) * payloadBytes(d) >= rows * rowBytes;
}

FUSCO_HD inline float loadElem(uint32_t dt, const char* p) {
  if (dt == fuscoFloat32) {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p, 2);
  return dt == fuscoBfloat16 ? asFloat(static_cast<uint32_t>(h) << 16) : halfToFloatInline(h);
}

FUSCO_HD inline void storeElem(uint32_t dt, char* p, float x) {
  if (dt == fuscoFloat32) {
    memcpy(p, &x, 4);
    return;
  }
  const uint16_t h = dt == fuscoBfloat16 ? floatToBf16Inline(x) : floatToHalfInline(x);
  memcpy(p, &h, 2);
}

// x rounded to the datatype and back (a group's sum, as stored).
FUSCO_HD inline float roundTo(uint32_t dt, float x) {
  char b[4];
  storeElem(dt, b, x);
  return loadElem(dt, b);
}

// The reduce role's view of one operation.
struct Reducer {
  ReduceArgs& a;
  Role* roles;
  uint64_t rowBytes;

  FUSCO_HD int32_t feedOf(uint32_t r) const {
    return reinterpret_cast<const int32_t*>(a.feedOf)[r];
  }
  FUSCO_HD FeedState& feed(uint32_t r) const { return reinterpret_cast<FeedState*>(a.feeds)[r]; }
  FUSCO_HD uint64_t seq(uint64_t k, uint32_t r) const {
    return reinterpret_cast<const uint32_t*>(a.termSeq)[k] -
           reinterpret_cast<const uint64_t*>(a.seqBase)[r];
  }
  FUSCO_HD uint32_t rank(uint64_t k) const {
    return reinterpret_cast<const uint32_t*>(a.termRank)[k];
  }
  FUSCO_HD uint64_t messageBytes(int32_t f) const {
    return reinterpret_cast<const DevCopyTask*>(roles[f].tasks)->totalBytes;
  }
  FUSCO_HD uint64_t slotsOf(int32_t f) const {
    const uint64_t p = payloadBytes(ringOf(roles[f], 0).d);
    return (messageBytes(f) + p - 1) / p;
  }

  // Makes sure the slots of rank r's message before `end` bytes are published and this
  // operation's: kProgress when they are, kNoData, or kCorrupt.
  FUSCO_HD StepStatus need(uint32_t r, uint64_t end) const {
    const int32_t f = feedOf(r);
    const Ring ring = ringOf(roles[f], 0);
    const uint64_t payload = payloadBytes(ring.d), total = messageBytes(f);
    const uint64_t epoch = *reinterpret_cast<const uint64_t*>(roles[f].epoch);
    FeedState& st = feed(r);
    while (st.checked * payload < end) {
      if (op::loadAcquire(ring.tail) <= st.start + st.checked) return kNoData;
      const SlotHeader* h =
          reinterpret_cast<const SlotHeader*>(slotAt(ring, st.start + st.checked));
      const uint64_t left = total - st.checked * payload;
      if (h->epoch != epoch || h->bytes != (left < payload ? left : payload)) return kCorrupt;
      ++st.checked;
    }
    return kProgress;
  }

  // Hands back rank r's slots wholly before byte `from` of its message.
  FUSCO_HD void release(uint32_t r, uint64_t from) const {
    const int32_t f = feedOf(r);
    const Ring ring = ringOf(roles[f], 0);
    ConsumerCursor& c = reinterpret_cast<ConsumerCursor*>(roles[f].cursors)[0];
    const uint64_t done = from / payloadBytes(ring.d);
    if (c.head >= feed(r).start + done) return;
    op::fenceSystem();  // the payload is read before the slot is handed back
    c.head = feed(r).start + done;
    op::storeRelease(ring.head, c.head);
  }

  // Element e of term k.
  FUSCO_HD const char* elem(uint64_t k, uint64_t e, uint64_t es) const {
    const uint32_t r = rank(k);
    if (feedOf(r) < 0) {
      const char* base = reinterpret_cast<const char* const*>(a.bases)[r];
      const int64_t row = reinterpret_cast<const int64_t*>(a.termRow)[k];
      return base + static_cast<uint64_t>(row) * rowBytes + e * es;
    }
    const Ring ring = ringOf(roles[feedOf(r)], 0);
    const uint64_t payload = payloadBytes(ring.d), o = seq(k, r) * rowBytes + e * es;
    return slotAt(ring, feed(r).start + o / payload) + kHeaderBytes + o % payload;
  }
};

// A new operation: the first token, and where each pushing rank's message starts in its ring
// (its feed's consumer cursor, started by startRoles).
FUSCO_HD inline void startReduce(const Role& self, Role* roles, uint32_t nranks) {
  ReduceArgs& a = *reinterpret_cast<ReduceArgs*>(self.tasks);
  a.next = 0;
  for (uint32_t r = 0; r < nranks; ++r) {
    const int32_t f = reinterpret_cast<const int32_t*>(a.feedOf)[r];
    if (f < 0) continue;
    FeedState& st = reinterpret_cast<FeedState*>(a.feeds)[r];
    st.start = reinterpret_cast<const ConsumerCursor*>(roles[f].cursors)[0].head;
    st.checked = 0;
  }
}

// One token's sum into out: every rank's group rounded, the groups summed in order.
FUSCO_HD inline void sumToken(const Reducer& R, uint64_t t) {
  const ReduceArgs& a = R.a;
  const uint32_t* start = reinterpret_cast<const uint32_t*>(a.termStart);
  const int64_t* weight = reinterpret_cast<const int64_t*>(a.termWeight);
  const uint8_t* last = reinterpret_cast<const uint8_t*>(a.termLast);
  const float* w = reinterpret_cast<const float*>(a.weights);
  const uint64_t es = elemBytes(a.dt);
  char* out = reinterpret_cast<char*>(a.out) + t * R.rowBytes;
  for (uint64_t e = 0; e < a.hidden; ++e) {
    float acc = 0.0f, grp = 0.0f;
    for (uint64_t k = start[t]; k < start[t + 1]; ++k) {
      const float x = loadElem(a.dt, R.elem(k, e, es));
      const bool plain = weight[k] < 0 || w == nullptr;
      grp = addRn(grp, plain ? x : mulRn(w[weight[k]], x));
      if (last[k] != 0) {
        acc = addRn(acc, roundTo(a.dt, grp));
        grp = 0.0f;
      }
    }
    storeElem(a.dt, out + e * es, acc);
  }
}

// The reduce role's step: the next token when every row it needs has arrived, else what stops
// it; after the last token, every slot of every pushing rank handed back. *peer: the rank it
// waits for. Check is check(ptr, bytes, write) -> bool: false stops the role (kCorrupt).
template <class Check>
FUSCO_HD inline StepStatus reduceStep(const Role& self, Role* roles, uint32_t nranks,
                                      const Check& check, uint32_t* peer) {
  ReduceArgs& a = *reinterpret_cast<ReduceArgs*>(self.tasks);
  const Reducer R{a, roles, a.hidden * elemBytes(a.dt)};
  const uint32_t* start = reinterpret_cast<const uint32_t*>(a.termStart);
  if (a.next == a.ntokens) {
    for (uint32_t r = 0; r < nranks; ++r) {
      if (R.feedOf(r) < 0) continue;
      const StepStatus s = R.need(r, R.messageBytes(R.feedOf(r)));
      *peer = r;
      if (s != kProgress) return s;
      R.release(r, R.slotsOf(R.feedOf(r)) * payloadBytes(ringOf(roles[R.feedOf(r)], 0).d));
    }
    return kFinished;
  }
  const uint64_t t = a.next;
  for (uint64_t k = start[t]; k < start[t + 1]; ++k) {
    const uint32_t r = R.rank(k);
    if (R.feedOf(r) >= 0) {
      *peer = r;
      const StepStatus s = R.need(r, (R.seq(k, r) + 1) * R.rowBytes);
      if (s != kProgress) return s;
    } else if (!check(R.elem(k, 0, 0), R.rowBytes, false)) {
      *peer = r;
      return kCorrupt;
    }
  }
  if (!check(reinterpret_cast<char*>(a.out) + t * R.rowBytes, R.rowBytes, true)) return kCorrupt;
  sumToken(R, t);
  // Slots wholly before each pushing rank's next row are done with.
  for (uint64_t k = start[t]; k < start[t + 1]; ++k) {
    const uint32_t r = R.rank(k);
    if (R.feedOf(r) >= 0 && (k + 1 == start[t + 1] || R.rank(k + 1) != r))
      R.release(r, (R.seq(k, r) + 1) * R.rowBytes);
  }
  ++a.next;
  return kProgress;
}

}  // namespace chan
}  // namespace fusco
