// One shared-memory segment per rank: an anonymous memfd (never a name in /dev/shm, so a crash
// leaves nothing behind) that peers on the same host map through /proc/<pid>/fd/<fd>.
//
// Layout (offsets page-aligned, see ShmLayout):
//   [ShmSegmentHeader | int32 senderOf[numRings]]   header page(s)
//   [ring 0][ring 1]...                             one receive ring per peer that sends to us
//   [arena]                                         fuscoMemAlloc memory (sparse, used on touch)
// A ring is [ShmRingCtrl (head, tail on their own cache lines)][slot headers, one cache line
// each][payloads, each page-aligned, slotStride apart].
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fusco.h"

namespace fusco {

constexpr uint64_t kShmSegmentMagic = 0x6673636f73686d31ULL;  // "fscoshm1"
constexpr uint32_t kShmLayoutVersion = 1;
constexpr size_t kShmPage = 4096;
constexpr size_t kShmCacheLine = 64;

static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "shm rings need lock-free 64-bit atomics");
static_assert(std::atomic<uint32_t>::is_always_lock_free,
              "shm flags need lock-free 32-bit atomics");

// Start of every segment. Written once by the owner at creation, except `aborted`.
struct ShmSegmentHeader {
  uint64_t magic;
  uint32_t version;
  int32_t ownerPid;
  int32_t ownerRank;
  uint32_t numRings;
  uint64_t commTag;
  uint64_t segBytes;
  uint64_t ringsOffset;
  uint64_t ringStride;
  uint64_t depth;
  uint64_t chunkBytes;
  uint64_t slotStride;     // distance between two payloads of a ring
  uint64_t payloadOffset;  // from the start of a ring to its first payload
  uint64_t arenaOffset;
  uint64_t arenaBytes;
  // Set by the owner when it gives up (markAborted); peers poll it in checkPeer.
  alignas(kShmCacheLine) std::atomic<uint32_t> aborted;
  // Why it gave up (NUL-terminated), written before `aborted` is set, so a peer's error can name
  // the rank that really failed rather than the rank that noticed it.
  char abortReason[256];
  // Followed (at senderTableOffset()) by int32 senderOf[numRings]: the rank writing each ring.
};

// Producer/consumer counters of one ring, on separate cache lines so the two sides do not
// bounce one line. head: slots posted (written by the sender); tail: slots consumed (written by
// the receiver). head - tail <= depth always.
struct ShmRingCtrl {
  alignas(kShmCacheLine) std::atomic<uint64_t> head;
  alignas(kShmCacheLine) std::atomic<uint64_t> tail;
};

// Per-slot message header, one cache line each. seq is the message's index (checks FIFO).
struct alignas(kShmCacheLine) ShmSlotHeader {
  uint64_t seq;
  uint64_t len;
  uint32_t tag;
};

// Every offset and size of a segment, computed the same way by owner and (for checking) peers.
struct ShmLayout {
  uint32_t numRings = 0;
  uint64_t depth = 0;
  uint64_t chunkBytes = 0;
  uint64_t slotStride = 0;
  uint64_t payloadOffset = 0;
  uint64_t ringStride = 0;
  uint64_t ringsOffset = 0;
  uint64_t arenaOffset = 0;
  uint64_t arenaBytes = 0;
  uint64_t segBytes = 0;
};

inline uint64_t shmAlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
inline size_t senderTableOffset() { return shmAlignUp(sizeof(ShmSegmentHeader), kShmCacheLine); }

// Computes the layout; false if the sizes overflow.
bool shmComputeLayout(uint32_t numRings, uint64_t depth, uint64_t chunkBytes, uint64_t arenaBytes,
                      ShmLayout* out);

// What a rank publishes so that peers can map its segment.
struct ShmBlob {
  uint64_t magic;
  uint32_t version;
  int32_t pid;
  int32_t fd;
  uint32_t reserved;
  uint64_t segBytes;
  uint64_t commTag;
};

std::string shmEncodeBlob(const ShmBlob& b);
bool shmDecodeBlob(const std::string& s, ShmBlob* b);

// A mapped segment (own or a peer's).
struct ShmMapping {
  int fd = -1;
  uint8_t* base = nullptr;
  size_t bytes = 0;

  ShmSegmentHeader* header() const { return reinterpret_cast<ShmSegmentHeader*>(base); }
  int32_t* senderTable() const { return reinterpret_cast<int32_t*>(base + senderTableOffset()); }
  ShmRingCtrl* ring(uint32_t i) const {
    const ShmSegmentHeader* h = header();
    return reinterpret_cast<ShmRingCtrl*>(base + h->ringsOffset + i * h->ringStride);
  }
  uint8_t* arena() const { return base + header()->arenaOffset; }
};

// Creates this rank's segment (memfd, mode 0600, sized, mapped) and writes its header, sender
// table and empty rings. [in] senders: the rank writing each ring. On failure nothing is left
// open.
fuscoResult_t shmCreateSegment(const ShmLayout& layout, int rank, uint64_t commTag,
                               const std::vector<int>& senders, ShmMapping* out);

// Maps peer `rank`'s segment described by blob via /proc/<pid>/fd/<fd> and checks its header.
// The fd is closed once mapped (the mapping keeps the memory alive).
fuscoResult_t shmOpenPeerSegment(int rank, const ShmBlob& blob, ShmMapping* out);

// The two halves of the above for any memfd-backed memory shared between local ranks: create and
// map `bytes` of this rank's memfd (owner-only), and map a peer's memfd through
// /proc/<pid>/fd/<fd>, checking that it holds `bytes` (the fd is closed once mapped).
fuscoResult_t shmMemfdMap(const char* name, size_t bytes, ShmMapping* out);
fuscoResult_t shmMapPeerFd(int rank, int32_t pid, int32_t fd, uint64_t bytes, ShmMapping* out);

// Unmaps and closes; safe on an empty mapping.
void shmUnmap(ShmMapping* m);

}  // namespace fusco
