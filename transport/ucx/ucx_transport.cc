// The UCX transport ("ucx"): ranks on different nodes exchange messages as UCP active messages
// over the rail chosen for the pair (see ucx_comm.h for the protocol). Peers on the same node use
// shm (host memory) or cuda_ipc (device memory); this transport scores -1 there. No registered
// memory: peers on other nodes cannot map it, so the engine stages every message through the
// channel (a CUDA comm's through its network bridge, exec/net_bridge.h).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/liveness.h"
#include "core/log.h"
#include "core/result.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_comm.h"
#include "transport/ucx/ucx_gdr.h"
#include "transport/ucx/ucx_nics.h"

namespace fusco {

namespace {

using ucx::asUcx;
using ucx::UcxComm;
using ucx::UcxPeer;

constexpr size_t kDefaultChunkBytes = 512 * 1024;
constexpr int kDefaultDepth = 4;
constexpr int64_t kAbortFlushMs = 200;  // markAborted waits at most this long for its messages
constexpr size_t kMaxReasonBytes = 512;

UcxPeer* connectedPeer(UcxComm* c, int peer, const char* what, fuscoResult_t* r) {
  if (c == nullptr || peer < 0 || peer >= c->nranks || !c->peers[peer].connected) {
    *r =
        FUSCO_FAIL(fuscoInternalError, kUcx, "ucx %s: rank %d is not connected by ucx", what, peer);
    return nullptr;
  }
  return &c->peers[peer];
}

// Host and CUDA comms alike: a CUDA comm's channel carries host memory (its rounds, and device
// rows its network bridge staged in pinned host memory).
int ucxScore(const TransportContext& ctx, int peer) {
  if (ctx.nodes == nullptr || peer == ctx.rank) return -1;
  if (peer < 0 || peer >= ctx.nodes->nranks || ctx.rank < 0 || ctx.rank >= ctx.nodes->nranks)
    return -1;
  return ctx.nodes->sameNode(ctx.rank, peer) ? -1 : 20;
}

fuscoResult_t checkSetupArgs(const TransportContext& ctx, const std::vector<int>& peers) {
  if (ctx.peers == nullptr || ctx.nodes == nullptr ||
      static_cast<int>(ctx.peers->size()) != ctx.nranks || ctx.rank < 0 || ctx.rank >= ctx.nranks)
    return FUSCO_FAIL(fuscoInternalError, kUcx, "ucx setup: bad context (rank %d of %d)", ctx.rank,
                      ctx.nranks);
  std::vector<bool> seen(ctx.nranks, false);
  for (int p : peers) {
    if (p < 0 || p >= ctx.nranks || p == ctx.rank || seen[p])
      return FUSCO_FAIL(fuscoInternalError, kUcx,
                        "ucx setup: peer %d is out of range, this rank (%d) or listed twice", p,
                        ctx.rank);
    seen[p] = true;
  }
  return fuscoSuccess;
}

void initPeer(UcxComm* c, UcxPeer& p) {
  size_t ring = static_cast<size_t>(c->depth) * c->chunkBytes;
  p.inSetup = true;
  p.sendSlots.assign(ring, 0);
  p.sendHdr.assign(c->depth, ucx::DataHeader{});
  p.sendReq.assign(c->depth, nullptr);
  p.recvSlots.assign(ring, 0);
  p.recv.assign(c->depth, ucx::RecvSlot{});
}

fuscoResult_t ucxSetupInto(UcxComm* c, const TransportContext& ctx, const std::vector<int>& peers,
                           std::string* blob) {
  c->rank = ctx.rank;
  c->nranks = ctx.nranks;
  c->commTag = ctx.commTag;
  c->chunkBytes = ctx.chunkBytes > 0 ? ctx.chunkBytes : kDefaultChunkBytes;
  c->depth = ctx.depth > 0 ? ctx.depth : kDefaultDepth;
  c->timeoutMs = ctx.timeoutMs;
  c->localRank = ctx.nodes->localRankOf[ctx.rank];
  c->peerList = peers;
  c->peers.resize(ctx.nranks);
  for (int r = 0; r < ctx.nranks; ++r) c->peers[r].info = (*ctx.peers)[r];
  for (int p : peers) initPeer(c, c->peers[p]);
  std::vector<std::string> devices = ucx::parseDevices(ctx.netDevices);
  if (devices.empty()) {  // auto: this rank's share of the node's RDMA NICs, else UCX picks
    int localSize = ctx.nodes->localSize(ctx.nodes->nodeOf[ctx.rank]);
    ucx::AutoRails a = ucx::pickAutoRails(c->localRank, localSize);
    devices = a.devices;
    FUSCO_INFO(kUcx, "ucx: rank %d (local %d of %d, NUMA %d) rails %s (%s)", ctx.rank, c->localRank,
               localSize, a.numa, ucx::joinDevices(devices).c_str(), a.why.c_str());
    if (devices.empty()) devices.push_back("");  // one rail, UCX picks (UCX_NET_DEVICES honoured)
  }
  c->rails.resize(devices.size());
  for (size_t i = 0; i < devices.size(); ++i)
    FUSCO_CHECK(ucx::openRail(c, devices[i], &c->rails[i]));
  if (ctx.memType == fuscoMemCuda) {
    size_t cudaRails = 0;
    for (size_t i = 0; i < c->rails.size(); ++i) cudaRails += ucx::railHasCudaMemory(c, i) ? 1 : 0;
    std::string path;
    FUSCO_CHECK(ucx::chooseNetPath(ucx::paramNetGdr(), cudaRails, c->rails.size(), &path));
    FUSCO_INFO(kUcx, "ucx: rank %d moves device rows to other nodes %s", ctx.rank, path.c_str());
  }
  *blob = ucx::encodeBlob(c);
  FUSCO_INFO(kUcx,
             "ucx: rank %d opened %zu rail(s) (%s) for %zu peers: %d x %zu-byte slots each way",
             ctx.rank, c->rails.size(), ucx::joinDevices(devices).c_str(), peers.size(), c->depth,
             c->chunkBytes);
  return fuscoSuccess;
}

void ucxClose(TransportComm* tc);

fuscoResult_t ucxSetup(const TransportContext& ctx, const std::vector<int>& peers,
                       TransportComm** tc, std::string* blob) {
  *tc = nullptr;
  FUSCO_CHECK(checkSetupArgs(ctx, peers));
  UcxComm* c = new (std::nothrow) UcxComm();
  if (c == nullptr) return FUSCO_FAIL(fuscoSystemError, kUcx, "ucx setup: out of memory");
  fuscoResult_t r;
  try {
    r = ucxSetupInto(c, ctx, peers, blob);
  } catch (const std::exception& e) {
    r = FUSCO_FAIL(fuscoSystemError, kUcx, "ucx setup: %s", e.what());
  }
  if (r != fuscoSuccess) {
    ucxClose(reinterpret_cast<TransportComm*>(c));
    return r;
  }
  *tc = reinterpret_cast<TransportComm*>(c);
  return fuscoSuccess;
}

// Both ranks of a pair send on the rail of the sender's local rank, to the same rail index of
// the receiver, so that a pair's traffic stays on one rail (NIC) at both ends.
fuscoResult_t connectPeer(UcxComm* c, int p, const std::string& blob) {
  std::vector<std::string> addrs;
  if (!ucx::decodeBlob(blob, c->commTag, p, &addrs))
    return FUSCO_FAIL(fuscoInternalError, kUcx,
                      "ucx connect: rank %d published no valid ucx setup (%zu bytes)", p,
                      blob.size());
  size_t n = std::min(addrs.size(), c->rails.size());
  UcxPeer& peer = c->peers[p];
  peer.rail = static_cast<int>(static_cast<size_t>(c->localRank) % n);
  FUSCO_CHECK(ucx::createEndpoint(c, p, addrs[peer.rail]));
  peer.connected = true;
  const std::string& dev = c->rails[peer.rail].device;
  FUSCO_INFO(kUcx, "ucx: rank %d -> rank %d on rail %d (device %s)", c->rank, p, peer.rail,
             dev.empty() ? "auto" : dev.c_str());
  return fuscoSuccess;
}

fuscoResult_t ucxConnect(TransportComm* tc, const std::vector<std::string>& blobs) {
  UcxComm* c = asUcx(tc);
  if (c == nullptr || static_cast<int>(blobs.size()) != c->nranks)
    return FUSCO_FAIL(fuscoInternalError, kUcx, "ucx connect: %zu blobs for %d ranks", blobs.size(),
                      c ? c->nranks : -1);
  std::lock_guard<std::mutex> lock(c->mu);
  try {
    for (int p : c->peerList) {
      if (c->peers[p].connected) continue;
      FUSCO_CHECK(connectPeer(c, p, blobs[p]));
    }
  } catch (const std::exception& e) {
    return FUSCO_FAIL(fuscoSystemError, kUcx, "ucx connect: %s", e.what());
  }
  ucx::progressAll(c);
  return fuscoSuccess;
}

fuscoResult_t ucxSendAcquire(TransportComm* tc, int peer, void** buf, size_t* capacity) {
  fuscoResult_t r = fuscoSuccess;
  UcxComm* c = asUcx(tc);
  *buf = nullptr;
  UcxPeer* p = connectedPeer(c, peer, "sendAcquire", &r);
  if (p == nullptr) return r;
  std::lock_guard<std::mutex> lock(c->mu);
  ucx::progressAll(c);
  *capacity = c->chunkBytes;
  // A failed peer gets no slot: the engine's liveness check reports it (checkPeer).
  if (p->failed || p->aborted || p->posted - p->credited >= static_cast<uint64_t>(c->depth))
    return fuscoSuccess;
  size_t slot = p->posted % c->depth;
  if (!ucx::reapSend(c, peer, &p->sendReq[slot], &p->sendFailed) || p->failed) return fuscoSuccess;
  p->acquired = true;
  *buf = p->sendSlots.data() + slot * c->chunkBytes;
  return fuscoSuccess;
}

fuscoResult_t ucxSendPost(TransportComm* tc, int peer, uint32_t tag, size_t len) {
  fuscoResult_t r = fuscoSuccess;
  UcxComm* c = asUcx(tc);
  UcxPeer* p = connectedPeer(c, peer, "sendPost", &r);
  if (p == nullptr) return r;
  std::lock_guard<std::mutex> lock(c->mu);
  if (!p->acquired)
    return FUSCO_FAIL(fuscoInternalError, kUcx,
                      "ucx sendPost to rank %d without a slot from sendAcquire", peer);
  if (len > c->chunkBytes)
    return FUSCO_FAIL(fuscoInternalError, kUcx, "ucx sendPost to rank %d: %zu bytes > slot of %zu",
                      peer, len, c->chunkBytes);
  size_t slot = p->posted % c->depth;
  p->sendHdr[slot] = ucx::DataHeader{c->commTag, p->posted, c->rank, tag};
  p->acquired = false;
  ++p->posted;
  ucp_request_param_t prm{};
  ucs_status_ptr_t q =
      ucp_am_send_nbx(p->ep, ucx::kAmData, &p->sendHdr[slot], sizeof(ucx::DataHeader),
                      p->sendSlots.data() + slot * c->chunkBytes, len, &prm);
  if (UCS_PTR_IS_ERR(q)) {
    ucx::markFailed(c, peer, UCS_PTR_STATUS(q));
    return ucx::peerError(c, peer);
  }
  p->sendReq[slot] = q;
  return fuscoSuccess;
}

fuscoResult_t ucxRecvPoll(TransportComm* tc, int peer, const void** buf, size_t* len,
                          uint32_t* tag) {
  fuscoResult_t r = fuscoSuccess;
  UcxComm* c = asUcx(tc);
  *buf = nullptr;
  UcxPeer* p = connectedPeer(c, peer, "recvPoll", &r);
  if (p == nullptr) return r;
  std::lock_guard<std::mutex> lock(c->mu);
  ucx::progressAll(c);
  size_t slot = p->consumed % c->depth;
  ucx::RecvSlot& s = p->recv[slot];
  if (s.state == ucx::RecvSlot::kPending) {
    ucs_status_t st;
    if (!ucx::requestDone(s.req, &st)) return fuscoSuccess;
    s.req = nullptr;
    if (st != UCS_OK) {
      s.state =
          ucx::RecvSlot::kEmpty;  // the peer is failed from now on; never poll a freed request
      ucx::markFailed(c, peer, st);
      return fuscoSuccess;
    }
    s.state = ucx::RecvSlot::kReady;
  }
  if (s.state != ucx::RecvSlot::kReady) return fuscoSuccess;
  *buf = p->recvSlots.data() + slot * c->chunkBytes;
  *len = s.len;
  *tag = s.tag;
  return fuscoSuccess;
}

fuscoResult_t ucxRecvRelease(TransportComm* tc, int peer) {
  fuscoResult_t r = fuscoSuccess;
  UcxComm* c = asUcx(tc);
  UcxPeer* p = connectedPeer(c, peer, "recvRelease", &r);
  if (p == nullptr) return r;
  std::lock_guard<std::mutex> lock(c->mu);
  ucx::RecvSlot& s = p->recv[p->consumed % c->depth];
  if (s.state != ucx::RecvSlot::kReady)
    return FUSCO_FAIL(fuscoInternalError, kUcx, "ucx recvRelease from rank %d without a message",
                      peer);
  s = ucx::RecvSlot{};
  ++p->consumed;
  p->creditDirty = true;
  ucx::pumpCredit(c, *p);
  return fuscoSuccess;
}

fuscoResult_t ucxCheckPeer(TransportComm* tc, int peer) {
  UcxComm* c = asUcx(tc);
  if (c == nullptr || peer < 0 || peer >= c->nranks || !c->peers[peer].inSetup)
    return FUSCO_FAIL(fuscoInternalError, kUcx, "ucx checkPeer: rank %d is not a ucx peer", peer);
  std::lock_guard<std::mutex> lock(c->mu);
  ucx::progressAll(c);
  const UcxPeer& p = c->peers[peer];
  if (p.aborted || p.failed) return ucx::peerError(c, peer);
  // Virtual nodes on this host: a dead process is known at once, before UCX notices.
  const PeerInfo& me = c->peers[c->rank].info;
  if (p.info.pid > 0 && p.info.hostId == me.hostId && !processAlive(p.info.pid, p.info.startTime)) {
    ucx::markFailed(c, peer, UCS_ERR_ENDPOINT_TIMEOUT);
    const int hl = hostNameLen(p.info.hostId);
    return FUSCO_FAIL(fuscoRemoteError, kUcx, "rank %d (pid %d on host %.*s) died", peer,
                      static_cast<int>(p.info.pid), hl, p.info.hostId.c_str());
  }
  return fuscoSuccess;
}

void ucxMarkAborted(TransportComm* tc, const char* reason) {
  UcxComm* c = asUcx(tc);
  if (c == nullptr) return;
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->abortSent) return;  // keep the first reason
  c->abortSent = true;
  c->abortReason.assign(reason ? reason : "", 0, kMaxReasonBytes);
  c->abortHdr = ucx::AbortHeader{c->commTag, c->rank, 0};
  for (int peer : c->peerList) {
    UcxPeer& p = c->peers[peer];
    if (!p.connected || p.failed || p.ep == nullptr) continue;
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t q = ucp_am_send_nbx(p.ep, ucx::kAmAbort, &c->abortHdr, sizeof(c->abortHdr),
                                         c->abortReason.data(), c->abortReason.size(), &prm);
    if (q != nullptr && !UCS_PTR_IS_ERR(q)) p.abortReq = q;
  }
  // Best effort: give the messages a moment to leave; close flushes the rest.
  Deadline d(kAbortFlushMs);
  while (!d.expired()) {
    ucx::progressAll(c);
    bool busy = false;
    for (int peer : c->peerList) busy |= ucx::inFlight(c->peers[peer].abortReq);
    if (!busy) break;
  }
}

void ucxProgress(TransportComm* tc) {
  UcxComm* c = asUcx(tc);
  if (c == nullptr) return;
  std::lock_guard<std::mutex> lock(c->mu);
  ucx::progressAll(c);
}

bool ucxSendsInFlight(TransportComm* tc, int peer) {
  UcxComm* c = asUcx(tc);
  if (c == nullptr || peer < 0 || peer >= c->nranks || !c->peers[peer].connected) return false;
  // No progress here: the engine steps the transports whenever a wait makes none.
  std::lock_guard<std::mutex> lock(c->mu);
  // Semantics in transport.h. A failed send is remembered in sendFailed, since reapSend frees its
  // request (and clears the slot) on the call that sees it fail.
  UcxPeer& p = c->peers[peer];
  for (void*& q : p.sendReq)
    if (!ucx::reapSend(c, peer, &q, &p.sendFailed)) return true;
  return p.sendFailed;
}

void ucxClose(TransportComm* tc) {
  UcxComm* c = asUcx(tc);
  if (c == nullptr) return;
  bool freed;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    freed = ucx::teardown(c);
  }
  if (freed) delete c;
}

}  // namespace

extern const TransportOps kUcxTransport;
const TransportOps kUcxTransport = {
    "ucx",             // name
    ucxScore,          // score
    ucxSetup,          // setup
    ucxConnect,        // connect
    ucxSendAcquire,    // sendAcquire
    ucxSendPost,       // sendPost
    ucxRecvPoll,       // recvPoll
    ucxRecvRelease,    // recvRelease
    nullptr,           // memAlloc
    nullptr,           // memFree
    nullptr,           // regionToken
    nullptr,           // peerPointer
    nullptr,           // memRegister
    nullptr,           // memDeregister
    nullptr,           // deviceFlags
    ucxCheckPeer,      // checkPeer
    ucxMarkAborted,    // markAborted
    ucxClose,          // close
    ucxProgress,       // progress
    ucxSendsInFlight,  // sendsInFlight
    nullptr,           // regionsToMap
    nullptr,           // mapRegions
    nullptr,           // peerMapped
};

}  // namespace fusco
