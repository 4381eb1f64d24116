// Active-message handlers of the UCX transport (data, credit, abort; see ucx_comm.h), credit
// sending and worker progress.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/result.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_comm.h"

namespace fusco {

namespace ucx {

namespace {

constexpr size_t kMaxReasonBytes = 512;

// The peer a message from `src` belongs to, or nullptr if it is not one of ours.
UcxPeer* sourcePeer(UcxComm* c, uint64_t commTag, int32_t src) {
  if (commTag != c->commTag || src < 0 || src >= c->nranks || !c->peers[src].inSetup)
    return nullptr;
  return &c->peers[src];
}

ucs_status_t onData(void* arg, const void* header, size_t headerLen, void* data, size_t length,
                    const ucp_am_recv_param_t* param) {
  UcxRail* rail = static_cast<UcxRail*>(arg);
  UcxComm* c = rail->comm;
  DataHeader h;
  if (headerLen != sizeof(h)) return UCS_OK;
  memcpy(&h, header, sizeof(h));
  UcxPeer* p = sourcePeer(c, h.commTag, h.src);
  if (p == nullptr) return UCS_OK;  // a stale or foreign message: dropped
  const uint64_t depth = static_cast<uint64_t>(c->depth);
  if (h.seq < p->consumed || h.seq >= p->consumed + depth || length > c->chunkBytes ||
      p->recv[h.seq % depth].state != RecvSlot::kEmpty) {
    FUSCO_WARN(kUcx, "ucx: rank %d got message %llu (%zu bytes) from rank %d outside its window",
               c->rank, (unsigned long long)h.seq, length, h.src);
    markFailed(c, h.src, UCS_ERR_MESSAGE_TRUNCATED);
    return UCS_OK;
  }
  RecvSlot& s = p->recv[h.seq % depth];
  char* dst = p->recvSlots.data() + (h.seq % depth) * c->chunkBytes;
  s.tag = h.tag;
  s.len = length;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
    if (length > 0) memcpy(dst, data, length);
    s.state = RecvSlot::kReady;
    return UCS_OK;
  }
  // Rendezvous: pull the payload straight into the ring slot.
  ucp_request_param_t prm{};
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(rail->worker, data, dst, length, &prm);
  if (UCS_PTR_IS_ERR(r)) {
    markFailed(c, h.src, UCS_PTR_STATUS(r));
    return UCS_OK;
  }
  s.req = r;
  s.state = r == nullptr ? RecvSlot::kReady : RecvSlot::kPending;
  return UCS_OK;
}

ucs_status_t onCredit(void* arg, const void* header, size_t headerLen, void* /*data*/,
                      size_t /*length*/, const ucp_am_recv_param_t* /*param*/) {
  UcxComm* c = static_cast<UcxRail*>(arg)->comm;
  CreditHeader h;
  if (headerLen != sizeof(h)) return UCS_OK;
  memcpy(&h, header, sizeof(h));
  UcxPeer* p = sourcePeer(c, h.commTag, h.src);
  if (p != nullptr && h.released > p->credited && h.released <= p->posted) p->credited = h.released;
  return UCS_OK;
}

ucs_status_t onAbort(void* arg, const void* header, size_t headerLen, void* data, size_t length,
                     const ucp_am_recv_param_t* param) {
  UcxComm* c = static_cast<UcxRail*>(arg)->comm;
  AbortHeader h;
  if (headerLen != sizeof(h)) return UCS_OK;
  memcpy(&h, header, sizeof(h));
  UcxPeer* p = sourcePeer(c, h.commTag, h.src);
  if (p == nullptr || p->aborted) return UCS_OK;
  p->aborted = true;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0 && data != nullptr)
    p->abortReason.assign(static_cast<const char*>(data), std::min(length, kMaxReasonBytes));
  return UCS_OK;
}

}  // namespace

void markFailed(UcxComm* c, int peer, ucs_status_t st) {
  if (peer < 0 || peer >= c->nranks) return;
  UcxPeer& p = c->peers[peer];
  if (p.failed) return;
  p.failed = true;
  p.failStatus = st;
  FUSCO_INFO(kUcx, "ucx: rank %d lost rank %d: %s", c->rank, peer, ucs_status_string(st));
}

fuscoResult_t peerError(UcxComm* c, int peer) {
  const UcxPeer& p = c->peers[peer];
  const int hl = hostNameLen(p.info.hostId);
  if (p.aborted)
    return FUSCO_FAIL(fuscoRemoteError, kUcx, "rank %d (pid %d on host %.*s) aborted: %s", peer,
                      static_cast<int>(p.info.pid), hl, p.info.hostId.c_str(),
                      p.abortReason.empty() ? "no reason given" : p.abortReason.c_str());
  return FUSCO_FAIL(fuscoRemoteError, kUcx,
                    "rank %d (pid %d on host %.*s) is unreachable over UCX (%s): it died or its "
                    "network failed",
                    peer, static_cast<int>(p.info.pid), hl, p.info.hostId.c_str(),
                    ucs_status_string(p.failStatus));
}

// Sends the cumulative release count to peer p if it changed and no credit is in flight.
void pumpCredit(UcxComm* c, UcxPeer& p) {
  const int peer = static_cast<int>(&p - c->peers.data());
  if (!reapSend(c, peer, &p.creditReq)) return;
  if (!p.creditDirty || p.ep == nullptr || p.failed) return;
  p.creditHdr = CreditHeader{c->commTag, p.consumed, c->rank, 0};
  p.creditDirty = false;
  ucp_request_param_t prm{};
  ucs_status_ptr_t r =
      ucp_am_send_nbx(p.ep, kAmCredit, &p.creditHdr, sizeof(p.creditHdr), nullptr, 0, &prm);
  if (UCS_PTR_IS_ERR(r)) return markFailed(c, peer, UCS_PTR_STATUS(r));
  p.creditReq = r;
}

void progressAll(UcxComm* c) {
  for (UcxRail& r : c->rails)
    for (int i = 0; i < 8 && ucp_worker_progress(r.worker) != 0; ++i) {
    }
  for (int p : c->peerList) {
    UcxPeer& q = c->peers[p];
    if (q.creditDirty || q.creditReq != nullptr) pumpCredit(c, q);
  }
}

fuscoResult_t registerHandlers(UcxComm* c, UcxRail* rail) {
  rail->comm = c;
  const struct {
    unsigned id;
    ucp_am_recv_callback_t cb;
  } handlers[] = {{kAmData, onData}, {kAmCredit, onCredit}, {kAmAbort, onAbort}};
  for (const auto& h : handlers) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = h.id;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.cb = h.cb;
    hp.arg = rail;
    ucs_status_t st = ucp_worker_set_am_recv_handler(rail->worker, &hp);
    if (st != UCS_OK)
      return FUSCO_FAIL(fuscoSystemError, kUcx, "ucx: registering an active-message handler: %s",
                        ucs_status_string(st));
  }
  return fuscoSuccess;
}

}  // namespace ucx

}  // namespace fusco
