// The channels' rings and the steps that move data through them, written once (FUSCO_HD) for the
// operation kernel and its host twin. Every ordered pair of local ranks has a channel mapped at
// init (docs/DESIGN.md, "The third rule: an operation never maps, allocates or exports"): split
// sub-rings of `slots` slots of slotBytes each, used as chunked FIFOs at any message size.
//
// Items: one operation's messages of a pair form one stream of items (positions [0, items)), each
// with its byte size; sub-ring s carries the contiguous range splitRange gives it. A slot holds a
// SlotHeader {bytes, epoch} and up to payloadBytes of one item; a larger item is cut into pieces
// that follow each other in order, and an item of zero bytes moves nothing.
//
// Credits: the producer fills slot tail % slots while tail - head < slots, then publishes the tail
// (fence, release store); the consumer acquires the tail, checks the header, copies the payload
// out and returns the slot with a release store of the head. The tail lives in the consumer's area
// and the head in the producer's, so each side polls only its own memory.
//
// Positions (tail, head) and the operation epoch live in device memory and only grow: eager calls
// and CUDA-graph replays share them, and the host computes no sequence numbers. A new operation's
// epoch is the previous one + 1; its cursors restart at their range (startItems) while the tail and
// head carry on.
//
// No step blocks: a step returns kNoCredit / kNoData instead of spinning, so one resident block
// can step every role of its rank in turn; pollCredit / pollData are the bounded waits for them.
#pragma once

#include <cstdint>
#include <cstring>

#include "device/op_steps.h"

namespace fusco {
namespace chan {

constexpr uint32_t kMaxSplit = 16;
constexpr uint32_t kMaxSlots = 16;

struct RingDims {
  uint32_t split;      // sub-rings per ordered pair
  uint32_t slots;      // slots per sub-ring (the depth)
  uint64_t slotBytes;  // header and payload
};

struct SlotHeader {
  uint64_t bytes;  // payload bytes in the slot
  uint64_t epoch;  // the operation that wrote it
};
constexpr uint64_t kHeaderBytes = sizeof(SlotHeader);

// The slots of one ordered pair: every sub-ring, one after another (the tail and head words are
// placed by the area's layout).
FUSCO_HD inline uint64_t pairBytes(const RingDims& d) {
  return static_cast<uint64_t>(d.split) * d.slots * d.slotBytes;
}
FUSCO_HD inline uint64_t payloadBytes(const RingDims& d) { return d.slotBytes - kHeaderBytes; }
// Sub-ring s's first slot within its pair's slots.
FUSCO_HD inline char* subRingSlots(char* pair, const RingDims& d, uint32_t s) {
  return pair + static_cast<uint64_t>(s) * d.slots * d.slotBytes;
}

// Null when d is usable, else what is wrong with it, naming the supported range.
FUSCO_HD inline const char* dimsProblem(const RingDims& d) {
  if (d.split < 1 || d.split > kMaxSplit) return "the ring split must be 1 to 16 sub-rings";
  if (d.slots < 1 || d.slots > kMaxSlots) return "a sub-ring must have 1 to 16 slots";
  if (d.slotBytes % 16 != 0 || d.slotBytes <= kHeaderBytes)
    return "a slot must be a multiple of 16 bytes, larger than its 16-byte header";
  return nullptr;
}

// Sub-ring s's positions [*begin, *end) of items: contiguous ranges, sizes differing by one at
// most, the larger ones first.
FUSCO_HD inline void splitRange(uint64_t items, uint32_t split, uint32_t s, uint64_t* begin,
                                uint64_t* end) {
  const uint64_t q = items / split, r = items % split;
  *begin = s * q + (s < r ? s : r);
  *end = *begin + q + (s < r ? 1 : 0);
}

// One sub-ring as a side addresses it.
struct Ring {
  char* slots;     // the sub-ring's first slot
  uint64_t* tail;  // slots published ever: the producer writes it, it lives in the consumer's area
  uint64_t* head;  // slots consumed ever: the consumer writes it, it lives in the producer's area
  RingDims d;
};

FUSCO_HD inline char* slotAt(const Ring& r, uint64_t position) {
  return r.slots + (position % r.d.slots) * r.d.slotBytes;
}

// An operation's items on the sending side, indexed by position.
struct ItemSource {
  const char* const* ptrs;
  const uint64_t* bytes;
};
// The same items on the receiving side (the sizes agree with the sender's).
struct ItemSink {
  char* const* ptrs;
  const uint64_t* bytes;
};

// A side's place in its sub-ring; it lives in the side's state block and persists across
// operations (the position only grows).
struct ProducerCursor {
  uint64_t item;    // the item being sent
  uint64_t offset;  // its bytes already sent
  uint64_t tail;    // slots published ever
};
struct ConsumerCursor {
  uint64_t item;    // the item being received
  uint64_t offset;  // its bytes already received
  uint64_t head;    // slots consumed ever
};

enum StepStatus : uint32_t {
  kProgress,  // one slot moved
  kNoCredit,  // the producer's sub-ring is full
  kNoData,    // the consumer's sub-ring is empty
  kFinished,  // every item of the range moved
  kCorrupt    // a slot's header is not what the protocol says: another epoch or size
};

// The byte copy of a step (the kernel's roles may copy with their own wide loads).
FUSCO_HD inline void copyBytes(char* dst, const char* src, uint64_t n) {
#if defined(__CUDA_ARCH__)
  for (uint64_t i = 0; i < n; ++i) dst[i] = src[i];
#else
  if (n != 0) std::memcpy(dst, src, n);
#endif
}

// A new operation's range starts at item begin; the position carries on.
FUSCO_HD inline void startItems(ProducerCursor& c, uint64_t begin) {
  c.item = begin;
  c.offset = 0;
}
FUSCO_HD inline void startItems(ConsumerCursor& c, uint64_t begin) {
  c.item = begin;
  c.offset = 0;
}

// Skips items of zero bytes; true when items remain before end.
template <class Items>
FUSCO_HD inline bool nextItem(uint64_t& item, const Items& items, uint64_t end) {
  while (item < end && items.bytes(item) == 0) ++item;
  return item < end;
}
// The bytes of the next piece of an item.
FUSCO_HD inline uint64_t pieceBytes(const RingDims& d, uint64_t itemBytes, uint64_t offset) {
  const uint64_t left = itemBytes - offset, cap = payloadBytes(d);
  return left < cap ? left : cap;
}
FUSCO_HD inline void advance(uint64_t& item, uint64_t& offset, uint64_t piece, uint64_t bytes) {
  offset += piece;
  if (offset == bytes) {
    ++item;
    offset = 0;
  }
}

// Items as arrays of pointers and sizes (ItemSource, ItemSink), for produce and consume.
struct SourceItems {
  const ItemSource& s;
  FUSCO_HD uint64_t bytes(uint64_t i) const { return s.bytes[i]; }
  FUSCO_HD void read(uint64_t i, uint64_t off, char* to, uint64_t n) const {
    copyBytes(to, s.ptrs[i] + off, n);
  }
};
struct SinkItems {
  const ItemSink& s;
  FUSCO_HD uint64_t bytes(uint64_t i) const { return s.bytes[i]; }
  FUSCO_HD void write(uint64_t i, uint64_t off, const char* from, uint64_t n) const {
    copyBytes(s.ptrs[i] + off, from, n);
  }
};

// Sends the next piece of the range's items, through itemEnd, when a slot is free. Src gives
// bytes(item) and read(item, offset, to, n): where the item's bytes come from.
//   [in,out] c: the producer's cursor; epoch: the operation's
// Returns kProgress (one slot published), kNoCredit or kFinished (nothing touched).
template <class Src>
FUSCO_HD inline StepStatus produce(const Ring& r, ProducerCursor& c, const Src& src,
                                   uint64_t itemEnd, uint64_t epoch) {
  if (!nextItem(c.item, src, itemEnd)) return kFinished;
  if (c.tail - op::loadAcquire(r.head) >= r.d.slots) return kNoCredit;
  char* slot = slotAt(r, c.tail);
  const uint64_t bytes = src.bytes(c.item), piece = pieceBytes(r.d, bytes, c.offset);
  SlotHeader* h = reinterpret_cast<SlotHeader*>(slot);
  h->bytes = piece;
  h->epoch = epoch;
  src.read(c.item, c.offset, slot + kHeaderBytes, piece);
  advance(c.item, c.offset, piece, bytes);
  op::fenceSystem();
  op::storeRelease(r.tail, ++c.tail);
  return kProgress;
}

// Receives the next piece of the range's items, through itemEnd, when one was published. Dst
// gives bytes(item) and write(item, offset, from, n): where the item's bytes go.
//   [in,out] c: the consumer's cursor; epoch: the operation's
// Returns kProgress (one slot consumed and returned), kNoData, kFinished, or kCorrupt (the slot's
// header names another epoch or size; nothing is copied and the slot is kept).
template <class Dst>
FUSCO_HD inline StepStatus consume(const Ring& r, ConsumerCursor& c, const Dst& dst,
                                   uint64_t itemEnd, uint64_t epoch) {
  if (!nextItem(c.item, dst, itemEnd)) return kFinished;
  if (op::loadAcquire(r.tail) <= c.head) return kNoData;
  const char* slot = slotAt(r, c.head);
  const uint64_t bytes = dst.bytes(c.item), piece = pieceBytes(r.d, bytes, c.offset);
  const SlotHeader* h = reinterpret_cast<const SlotHeader*>(slot);
  if (h->epoch != epoch || h->bytes != piece) return kCorrupt;
  dst.write(c.item, c.offset, slot + kHeaderBytes, piece);
  advance(c.item, c.offset, piece, bytes);
  op::fenceSystem();  // the payload is read before the slot is handed back
  op::storeRelease(r.head, ++c.head);
  return kProgress;
}

FUSCO_HD inline StepStatus produceStep(const Ring& r, ProducerCursor& c, const ItemSource& src,
                                       uint64_t itemEnd, uint64_t epoch) {
  return produce(r, c, SourceItems{src}, itemEnd, epoch);
}
FUSCO_HD inline StepStatus consumeStep(const Ring& r, ConsumerCursor& c, const ItemSink& dst,
                                       uint64_t itemEnd, uint64_t epoch) {
  return consume(r, c, SinkItems{dst}, itemEnd, epoch);
}

// The bounded wait behind kNoCredit: one poll of the head for the producer's next slot.
// w is zeroed when the wait starts (after a step that made progress). Returns as op::pollWait.
FUSCO_HD inline op::WaitStatus pollCredit(const Ring& r, const ProducerCursor& c, op::Wait& w,
                                          op::OpWords* words, uint64_t nowNs, uint64_t timeoutNs,
                                          uint32_t peer) {
  if (c.tail < r.d.slots) return op::kReady;
  return op::pollWait(w, r.head, c.tail - r.d.slots + 1, words, nowNs, timeoutNs, peer,
                      op::kPhaseHead);
}
// The bounded wait behind kNoData: one poll of the tail for the consumer's next slot.
FUSCO_HD inline op::WaitStatus pollData(const Ring& r, const ConsumerCursor& c, op::Wait& w,
                                        op::OpWords* words, uint64_t nowNs, uint64_t timeoutNs,
                                        uint32_t peer) {
  return op::pollWait(w, r.tail, c.head + 1, words, nowNs, timeoutNs, peer, op::kPhaseTail);
}

}  // namespace chan
}  // namespace fusco
