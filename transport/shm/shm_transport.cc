// The shared-memory transport ("shm"): ranks on one host exchange messages through slot rings
// in each other's memfd segments and write straight into each other's arenas (one copy).
// See shm_segment.h for the segment layout and shm_ring.h for the ring protocol.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "core/liveness.h"
#include "core/log.h"
#include "core/params.h"
#include "core/result.h"
#include "transport/shm/shm_arena.h"
#include "transport/shm/shm_ring.h"
#include "transport/shm/shm_segment.h"
#include "transport/transport.h"

namespace fusco {

FUSCO_PARAM_INT(
    ShmArenaBytes, "FUSCO_SHM_ARENA_BYTES", 4LL << 30, 0, INT64_MAX,
    "virtual size of each rank's shared arena for fuscoMemAlloc (pages are used on touch)");

namespace {

constexpr size_t kDefaultChunkBytes = 512 * 1024;
constexpr int kDefaultDepth = 4;

struct ShmPeer {
  bool inSetup = false;    // given to setup: a ring in our segment is reserved for it
  bool connected = false;  // its segment is mapped and both rings are ready
  uint32_t ringHere = 0;   // index of the ring in our segment that this peer writes
  PeerInfo info;
  ShmMapping seg;    // the peer's segment as mapped here
  ShmSender send;    // our ring in the peer's segment
  ShmReceiver recv;  // the peer's ring in our segment
};

// Per-communicator state. TransportComm stays opaque: each transport casts its own type to it.
struct ShmComm {
  int rank = 0;
  int nranks = 0;
  uint64_t commTag = 0;
  ShmLayout layout;
  ShmMapping own;
  ShmArena arena;
  std::vector<int> peerList;   // ring i of our segment is written by peerList[i]
  std::vector<ShmPeer> peers;  // [nranks]
};

ShmComm* asShm(TransportComm* tc) { return reinterpret_cast<ShmComm*>(tc); }

// The connected peer `peer`, or nullptr after logging an internal error into *r.
ShmPeer* connectedPeer(ShmComm* c, int peer, const char* what, fuscoResult_t* r) {
  if (c == nullptr || peer < 0 || peer >= c->nranks || !c->peers[peer].connected) {
    *r =
        FUSCO_FAIL(fuscoInternalError, kShm, "shm %s: rank %d is not connected by shm", what, peer);
    return nullptr;
  }
  return &c->peers[peer];
}

int shmScore(const TransportContext& ctx, int peer) {
  if (ctx.memType != fuscoMemHost || ctx.peers == nullptr || peer == ctx.rank) return -1;
  if (peer < 0 || peer >= static_cast<int>(ctx.peers->size()) || ctx.rank < 0 ||
      ctx.rank >= static_cast<int>(ctx.peers->size()))
    return -1;
  if ((*ctx.peers)[peer].hostId != (*ctx.peers)[ctx.rank].hostId) return -1;
  // Virtual nodes on one host still reach each other by shm, unless a network transport is
  // preferred for them (it scores higher).
  if (ctx.nodes != nullptr && !ctx.nodes->sameNode(ctx.rank, peer)) return 1;
  return 10;
}

fuscoResult_t checkSetupArgs(const TransportContext& ctx, const std::vector<int>& peers) {
  if (ctx.peers == nullptr || static_cast<int>(ctx.peers->size()) != ctx.nranks || ctx.rank < 0 ||
      ctx.rank >= ctx.nranks)
    return FUSCO_FAIL(fuscoInternalError, kShm,
                      "shm setup: bad context (rank %d of %d, %zu peer infos)", ctx.rank,
                      ctx.nranks, ctx.peers ? ctx.peers->size() : size_t(0));
  std::vector<bool> seen(ctx.nranks, false);
  for (int p : peers) {
    if (p < 0 || p >= ctx.nranks || p == ctx.rank || seen[p])
      return FUSCO_FAIL(fuscoInternalError, kShm,
                        "shm setup: peer %d is out of range, this rank (%d) or listed twice", p,
                        ctx.rank);
    seen[p] = true;
  }
  return fuscoSuccess;
}

fuscoResult_t shmSetupInto(ShmComm* c, const TransportContext& ctx, const std::vector<int>& peers,
                           std::string* blob) {
  c->rank = ctx.rank;
  c->nranks = ctx.nranks;
  c->commTag = ctx.commTag;
  c->peerList = peers;
  c->peers.resize(ctx.nranks);
  for (int r = 0; r < ctx.nranks; ++r) c->peers[r].info = (*ctx.peers)[r];
  for (size_t i = 0; i < peers.size(); ++i) {
    c->peers[peers[i]].inSetup = true;
    c->peers[peers[i]].ringHere = static_cast<uint32_t>(i);
  }
  uint64_t chunk = ctx.chunkBytes > 0 ? ctx.chunkBytes : kDefaultChunkBytes;
  uint64_t depth = ctx.depth > 0 ? static_cast<uint64_t>(ctx.depth) : kDefaultDepth;
  const uint64_t arenaBytes = static_cast<uint64_t>(paramShmArenaBytes());
  if (!shmComputeLayout(static_cast<uint32_t>(peers.size()), depth, chunk, arenaBytes, &c->layout))
    return FUSCO_FAIL(fuscoInvalidArgument, kShm,
                      "shm segment size overflows: %zu rings of depth %llu x %llu bytes, arena "
                      "%llu bytes (check FUSCO_CHUNK_BYTES, FUSCO_PIPELINE_DEPTH, "
                      "FUSCO_SHM_ARENA_BYTES)",
                      peers.size(), (unsigned long long)depth, (unsigned long long)chunk,
                      (unsigned long long)arenaBytes);
  FUSCO_CHECK(shmCreateSegment(c->layout, ctx.rank, ctx.commTag, peers, &c->own));
  c->arena.init(c->own.arena(), c->layout.arenaBytes);
  for (int p : peers) {
    c->peers[p].recv.ring = shmRingView(c->own, c->peers[p].ringHere);
  }
  ShmBlob b{};
  b.magic = kShmSegmentMagic;
  b.version = kShmLayoutVersion;
  b.pid = static_cast<int32_t>(getpid());
  b.fd = c->own.fd;
  b.segBytes = c->layout.segBytes;
  b.commTag = ctx.commTag;
  *blob = shmEncodeBlob(b);
  FUSCO_INFO(kShm,
             "shm: rank %d segment %llu bytes (memfd fd %d): %zu rings of %llu x %llu-byte slots, "
             "arena %llu bytes (virtual, used on touch)",
             ctx.rank, (unsigned long long)c->layout.segBytes, c->own.fd, peers.size(),
             (unsigned long long)depth, (unsigned long long)chunk,
             (unsigned long long)c->layout.arenaBytes);
  return fuscoSuccess;
}

void shmClose(TransportComm* tc);

fuscoResult_t shmSetup(const TransportContext& ctx, const std::vector<int>& peers,
                       TransportComm** tc, std::string* blob) {
  *tc = nullptr;
  FUSCO_CHECK(checkSetupArgs(ctx, peers));
  ShmComm* c = new (std::nothrow) ShmComm();
  if (c == nullptr) return FUSCO_FAIL(fuscoSystemError, kShm, "shm setup: out of memory");
  fuscoResult_t r;
  try {
    r = shmSetupInto(c, ctx, peers, blob);
  } catch (const std::exception& e) {
    r = FUSCO_FAIL(fuscoSystemError, kShm, "shm setup: %s", e.what());
  }
  if (r != fuscoSuccess) {
    shmClose(reinterpret_cast<TransportComm*>(c));
    return r;
  }
  *tc = reinterpret_cast<TransportComm*>(c);
  return fuscoSuccess;
}

// Maps peer p's segment and finds the ring it reserved for us.
fuscoResult_t connectPeer(ShmComm* c, int p, const std::string& blobText) {
  ShmPeer& peer = c->peers[p];
  ShmBlob b;
  if (!shmDecodeBlob(blobText, &b))
    return FUSCO_FAIL(fuscoInternalError, kShm,
                      "shm connect: rank %d published no valid shm setup (%zu bytes)", p,
                      blobText.size());
  if (b.commTag != c->commTag || (peer.info.pid != 0 && b.pid != peer.info.pid))
    return FUSCO_FAIL(fuscoInternalError, kShm,
                      "shm connect: setup of rank %d is for another communicator or process "
                      "(pid %d, expected %d)",
                      p, b.pid, static_cast<int>(peer.info.pid));
  FUSCO_CHECK(shmOpenPeerSegment(p, b, &peer.seg));
  const ShmSegmentHeader* h = peer.seg.header();
  const int32_t* senders = peer.seg.senderTable();
  uint32_t idx = h->numRings;
  for (uint32_t i = 0; i < h->numRings; ++i)
    if (senders[i] == c->rank) idx = i;
  if (idx == h->numRings)
    return FUSCO_FAIL(fuscoInternalError, kShm,
                      "shm connect: rank %d (pid %d) set up no shm ring for rank %d", p, b.pid,
                      c->rank);
  peer.send.ring = shmRingView(peer.seg, idx);
  peer.connected = true;
  return fuscoSuccess;
}

fuscoResult_t shmConnect(TransportComm* tc, const std::vector<std::string>& blobs) {
  ShmComm* c = asShm(tc);
  if (c == nullptr || static_cast<int>(blobs.size()) != c->nranks)
    return FUSCO_FAIL(fuscoInternalError, kShm, "shm connect: %zu blobs for %d ranks", blobs.size(),
                      c ? c->nranks : -1);
  try {
    for (int p : c->peerList) {
      if (c->peers[p].connected) continue;
      FUSCO_CHECK(connectPeer(c, p, blobs[p]));
    }
  } catch (const std::exception& e) {
    return FUSCO_FAIL(fuscoSystemError, kShm, "shm connect: %s", e.what());
  }
  FUSCO_INFO(kShm, "shm: rank %d connected to %zu local peers", c->rank, c->peerList.size());
  return fuscoSuccess;
}

fuscoResult_t shmSendAcquire(TransportComm* tc, int peer, void** buf, size_t* capacity) {
  fuscoResult_t r = fuscoSuccess;
  ShmPeer* p = connectedPeer(asShm(tc), peer, "sendAcquire", &r);
  *buf = nullptr;
  if (p == nullptr) return r;
  *buf = p->send.acquire();
  *capacity = p->send.ring.chunkBytes;
  return fuscoSuccess;
}

fuscoResult_t shmSendPost(TransportComm* tc, int peer, uint32_t tag, size_t len) {
  fuscoResult_t r = fuscoSuccess;
  ShmPeer* p = connectedPeer(asShm(tc), peer, "sendPost", &r);
  if (p == nullptr) return r;
  if (!p->send.acquired)
    return FUSCO_FAIL(fuscoInternalError, kShm,
                      "shm sendPost to rank %d without a slot from sendAcquire", peer);
  if (len > p->send.ring.chunkBytes)
    return FUSCO_FAIL(fuscoInternalError, kShm, "shm sendPost to rank %d: %zu bytes > slot of %llu",
                      peer, len, (unsigned long long)p->send.ring.chunkBytes);
  p->send.post(tag, len);
  return fuscoSuccess;
}

fuscoResult_t shmRecvPoll(TransportComm* tc, int peer, const void** buf, size_t* len,
                          uint32_t* tag) {
  fuscoResult_t r = fuscoSuccess;
  ShmPeer* p = connectedPeer(asShm(tc), peer, "recvPoll", &r);
  *buf = nullptr;
  if (p == nullptr) return r;
  if (!p->recv.hasMessage()) return fuscoSuccess;
  const ShmSlotHeader* s = p->recv.peek();
  if (s->seq != p->recv.tail || s->len > p->recv.ring.chunkBytes)
    return FUSCO_FAIL(fuscoInternalError, kShm,
                      "shm ring from rank %d is corrupt: slot seq %llu (expected %llu), len %llu",
                      peer, (unsigned long long)s->seq, (unsigned long long)p->recv.tail,
                      (unsigned long long)s->len);
  *buf = p->recv.payload();
  *len = s->len;
  *tag = s->tag;
  return fuscoSuccess;
}

fuscoResult_t shmRecvRelease(TransportComm* tc, int peer) {
  fuscoResult_t r = fuscoSuccess;
  ShmPeer* p = connectedPeer(asShm(tc), peer, "recvRelease", &r);
  if (p == nullptr) return r;
  if (!p->recv.hasMessage())
    return FUSCO_FAIL(fuscoInternalError, kShm, "shm recvRelease from rank %d without a message",
                      peer);
  p->recv.release();
  return fuscoSuccess;
}

fuscoResult_t shmMemAlloc(TransportComm* tc, size_t bytes, void** ptr) {
  ShmComm* c = asShm(tc);
  if (c == nullptr || ptr == nullptr)
    return FUSCO_FAIL(fuscoInternalError, kShm, "shm memAlloc without a communicator or pointer");
  try {
    return c->arena.alloc(bytes, ptr);
  } catch (const std::exception& e) {
    return FUSCO_FAIL(fuscoSystemError, kShm, "shm memAlloc: %s", e.what());
  }
}

fuscoResult_t shmMemFree(TransportComm* tc, void* ptr) {
  ShmComm* c = asShm(tc);
  if (c == nullptr)
    return FUSCO_FAIL(fuscoInternalError, kShm, "shm memFree without a communicator");
  try {
    return c->arena.release(ptr);
  } catch (const std::exception& e) {
    return FUSCO_FAIL(fuscoSystemError, kShm, "shm memFree: %s", e.what());
  }
}

bool shmRegionToken(TransportComm* tc, const void* ptr, size_t bytes, uint64_t* token) {
  ShmComm* c = asShm(tc);
  return c != nullptr && c->arena.contains(ptr, bytes, token);
}

void* shmPeerPointer(TransportComm* tc, int peer, uint64_t token, size_t bytes) {
  ShmComm* c = asShm(tc);
  if (c == nullptr || peer < 0 || peer >= c->nranks || !c->peers[peer].connected) return nullptr;
  const ShmSegmentHeader* h = c->peers[peer].seg.header();
  if (token > h->arenaBytes || bytes > h->arenaBytes - token) return nullptr;
  return c->peers[peer].seg.arena() + token;
}

fuscoResult_t shmCheckPeer(TransportComm* tc, int peer) {
  ShmComm* c = asShm(tc);
  if (c == nullptr || peer < 0 || peer >= c->nranks || !c->peers[peer].inSetup)
    return FUSCO_FAIL(fuscoInternalError, kShm, "shm checkPeer: rank %d is not an shm peer", peer);
  const ShmPeer& p = c->peers[peer];
  if (p.connected && p.seg.header()->aborted.load(std::memory_order_acquire) != 0) {
    char reason[sizeof(p.seg.header()->abortReason)];
    memcpy(reason, p.seg.header()->abortReason, sizeof(reason));
    reason[sizeof(reason) - 1] = '\0';
    return FUSCO_FAIL(fuscoRemoteError, kShm, "rank %d (pid %d on host %.*s) aborted: %s", peer,
                      static_cast<int>(p.info.pid), hostNameLen(p.info.hostId),
                      p.info.hostId.c_str(), reason[0] ? reason : "no reason given");
  }
  if (p.info.pid > 0 && !processAlive(p.info.pid, p.info.startTime))
    return FUSCO_FAIL(fuscoRemoteError, kShm, "rank %d (pid %d on host %.*s) died", peer,
                      static_cast<int>(p.info.pid), hostNameLen(p.info.hostId),
                      p.info.hostId.c_str());
  return fuscoSuccess;
}

void shmMarkAborted(TransportComm* tc, const char* reason) {
  ShmComm* c = asShm(tc);
  if (c == nullptr || c->own.base == nullptr) return;
  ShmSegmentHeader* h = c->own.header();
  if (h->aborted.load(std::memory_order_acquire) != 0) return;  // keep the first reason
  snprintf(h->abortReason, sizeof(h->abortReason), "%s", reason ? reason : "");
  h->aborted.store(1, std::memory_order_release);
}

void shmClose(TransportComm* tc) {
  ShmComm* c = asShm(tc);
  if (c == nullptr) return;
  // Unmapping never touches the peer's process, so this is safe when peers are dead.
  for (ShmPeer& p : c->peers) shmUnmap(&p.seg);
  shmUnmap(&c->own);
  delete c;
}

}  // namespace

extern const TransportOps kShmTransport;
const TransportOps kShmTransport = {
    "shm",           // name
    shmScore,        // score
    shmSetup,        // setup
    shmConnect,      // connect
    shmSendAcquire,  // sendAcquire
    shmSendPost,     // sendPost
    shmRecvPoll,     // recvPoll
    shmRecvRelease,  // recvRelease
    shmMemAlloc,     // memAlloc
    shmMemFree,      // memFree
    shmRegionToken,  // regionToken
    shmPeerPointer,  // peerPointer
    nullptr,         // memRegister
    nullptr,         // memDeregister
    nullptr,         // deviceFlags
    shmCheckPeer,    // checkPeer
    shmMarkAborted,  // markAborted
    shmClose,        // close
    nullptr,         // progress
    nullptr,         // sendsInFlight (a post is complete once copied)
    nullptr,         // regionsToMap
    nullptr,         // mapRegions
    nullptr,         // peerMapped
};
}  // namespace fusco
