// The single-producer single-consumer slot ring of one direction between two local ranks. The
// ring lives in the receiver's segment, so the sender gathers straight into the receiver's
// memory and the receiver reads the message in place (one copy in all).
//
// Protocol: the sender owns `head`, the receiver owns `tail`. A slot is free when
// head - tail < depth. The sender fills the payload and the slot header, then publishes with
// head.store(release); the receiver sees it with head.load(acquire), reads in place and gives
// the slot back with tail.store(release). Each side keeps a cached copy of the other side's
// counter and only re-reads the shared line when the cache says "full" / "empty".
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport/shm/shm_segment.h"

namespace fusco {

// Where one ring's pieces are, as mapped in this process.
struct ShmRingView {
  ShmRingCtrl* ctrl = nullptr;
  ShmSlotHeader* slots = nullptr;  // [depth]
  uint8_t* payloads = nullptr;     // depth payloads, slotStride apart
  uint64_t depth = 0;
  uint64_t slotStride = 0;
  uint64_t chunkBytes = 0;

  uint8_t* payload(uint64_t seq) const { return payloads + (seq % depth) * slotStride; }
  ShmSlotHeader* slot(uint64_t seq) const { return &slots[seq % depth]; }
};

// Ring i of a mapped segment (own or a peer's), with the layout taken from its header.
inline ShmRingView shmRingView(const ShmMapping& m, uint32_t i) {
  const ShmSegmentHeader* h = m.header();
  ShmRingView v;
  v.ctrl = m.ring(i);
  v.slots =
      reinterpret_cast<ShmSlotHeader*>(reinterpret_cast<uint8_t*>(v.ctrl) + sizeof(ShmRingCtrl));
  v.payloads = reinterpret_cast<uint8_t*>(v.ctrl) + h->payloadOffset;
  v.depth = h->depth;
  v.slotStride = h->slotStride;
  v.chunkBytes = h->chunkBytes;
  return v;
}

// Sender side of one ring (process-local state).
struct ShmSender {
  ShmRingView ring;
  uint64_t head = 0;        // next slot to post (only this side writes head)
  uint64_t cachedTail = 0;  // last tail seen
  bool acquired = false;    // a slot was handed out and not posted yet

  // The payload of the next free slot, or nullptr if `depth` slots are in flight.
  uint8_t* acquire() {
    if (head - cachedTail >= ring.depth) {
      cachedTail = ring.ctrl->tail.load(std::memory_order_acquire);
      if (head - cachedTail >= ring.depth) return nullptr;
    }
    acquired = true;
    return ring.payload(head);
  }
  // Publishes the acquired slot. Caller checks `acquired` and len <= chunkBytes.
  void post(uint32_t tag, uint64_t len) {
    ShmSlotHeader* s = ring.slot(head);
    s->seq = head;
    s->len = len;
    s->tag = tag;
    ++head;
    acquired = false;
    ring.ctrl->head.store(head, std::memory_order_release);
  }
};

// Receiver side of one ring (process-local state).
struct ShmReceiver {
  ShmRingView ring;
  uint64_t tail = 0;        // next slot to read (only this side writes tail)
  uint64_t cachedHead = 0;  // last head seen

  bool hasMessage() {
    if (cachedHead > tail) return true;
    cachedHead = ring.ctrl->head.load(std::memory_order_acquire);
    return cachedHead > tail;
  }
  const ShmSlotHeader* peek() const { return ring.slot(tail); }
  const uint8_t* payload() const { return ring.payload(tail); }
  void release() {
    ++tail;
    ring.ctrl->tail.store(tail, std::memory_order_release);
  }
};

}  // namespace fusco
