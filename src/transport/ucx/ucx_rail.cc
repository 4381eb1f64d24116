// UCX lifecycle: one context and worker per rail, worker-address blobs, endpoints with peer
// error handling, and a teardown that never hangs on dead peers.
#include <cstring>
#include <string>
#include <vector>

#include "core/blob.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/result.h"
#include "transport/ucx/ucx_comm.h"

namespace fusco::ucx {

namespace {

constexpr uint32_t kBlobMagic = 0x55435846;  // "FXCU"
constexpr uint32_t kBlobVersion = 1;
constexpr int64_t kCloseFlushMs = 2000;  // at most this long flushing endpoints in close

struct BlobHeader {
  uint32_t magic;
  uint32_t version;
  uint64_t commTag;
  int32_t rank;
  uint32_t numRails;
};

void epErrorHandler(void* arg, ucp_ep_h /*ep*/, ucs_status_t st) {
  EpErrArg* a = static_cast<EpErrArg*>(arg);
  markFailed(a->comm, a->peer, st);
}

// Cancels (if needed) and frees a request.
void dropRequest(ucp_worker_h w, void** req) {
  if (*req == nullptr) return;
  if (ucp_request_check_status(*req) == UCS_INPROGRESS && w != nullptr) ucp_request_cancel(w, *req);
  ucp_request_free(*req);
  *req = nullptr;
}

// Starts closing every endpoint: a flush first where the peer is healthy, forced otherwise.
std::vector<void*> startClose(UcxComm* c, bool force) {
  std::vector<void*> reqs;
  for (UcxPeer& p : c->peers) {
    if (p.ep == nullptr) continue;
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = (force || p.failed) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = ucp_ep_close_nbx(p.ep, &prm);
    p.ep = nullptr;
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) reqs.push_back(r);
  }
  return reqs;
}

// Progresses until every request is done or the deadline passes; returns those still running.
std::vector<void*> waitRequests(UcxComm* c, std::vector<void*> reqs, const Deadline& d) {
  while (!reqs.empty() && !d.expired()) {
    for (UcxRail& r : c->rails) ucp_worker_progress(r.worker);
    std::vector<void*> left;
    for (void* q : reqs) {
      ucs_status_t st;
      if (!requestDone(q, &st)) left.push_back(q);
    }
    reqs.swap(left);
  }
  return reqs;
}

}  // namespace

bool requestDone(void* req, ucs_status_t* st) {
  *st = ucp_request_check_status(req);
  if (*st == UCS_INPROGRESS) return false;
  ucp_request_free(req);
  return true;
}

bool reapSend(UcxComm* c, int peer, void** req, bool* failed) {
  if (*req == nullptr) return true;
  ucs_status_t st;
  if (!requestDone(*req, &st)) return false;
  *req = nullptr;
  if (st != UCS_OK) {
    markFailed(c, peer, st);
    if (failed != nullptr) *failed = true;
  }
  return true;
}

fuscoResult_t openRail(UcxComm* c, const std::string& device, UcxRail* rail) {
  rail->device = device;
  ucp_config_t* cfg = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &cfg);
  if (st != UCS_OK)
    return FUSCO_FAIL(fuscoSystemError, kUcx, "ucx: reading the UCX configuration failed: %s",
                      ucs_status_string(st));
  if (!device.empty()) st = ucp_config_modify(cfg, "NET_DEVICES", device.c_str());
  if (st == UCS_OK) {
    ucp_params_t prm{};
    prm.field_mask = UCP_PARAM_FIELD_FEATURES;
    prm.features = UCP_FEATURE_AM;
    st = ucp_init(&prm, cfg, &rail->context);
  }
  ucp_config_release(cfg);
  if (st != UCS_OK)
    return FUSCO_FAIL(fuscoSystemError, kUcx, "ucx: rank %d cannot open UCX on device '%s': %s",
                      c->rank, device.empty() ? "(auto)" : device.c_str(), ucs_status_string(st));
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // UcxComm::mu serializes every call
  st = ucp_worker_create(rail->context, &wp, &rail->worker);
  if (st != UCS_OK)
    return FUSCO_FAIL(fuscoSystemError, kUcx, "ucx: creating a worker on '%s' failed: %s",
                      device.c_str(), ucs_status_string(st));
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  st = ucp_worker_get_address(rail->worker, &addr, &len);
  if (st != UCS_OK)
    return FUSCO_FAIL(fuscoSystemError, kUcx, "ucx: worker address on '%s': %s", device.c_str(),
                      ucs_status_string(st));
  rail->address.assign(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(rail->worker, addr);
  return registerHandlers(c, rail);
}

std::string encodeBlob(const UcxComm* c) {
  BlobHeader h{kBlobMagic, kBlobVersion, c->commTag, c->rank,
               static_cast<uint32_t>(c->rails.size())};
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  for (const UcxRail& r : c->rails) appendBlob(&out, r.address);
  return out;
}

bool decodeBlob(const std::string& blob, uint64_t commTag, int rank,
                std::vector<std::string>* addrs) {
  BlobHeader h;
  if (blob.size() < sizeof(h)) return false;
  memcpy(&h, blob.data(), sizeof(h));
  if (h.magic != kBlobMagic || h.version != kBlobVersion || h.commTag != commTag ||
      h.rank != rank || h.numRails == 0 || h.numRails > 64)
    return false;
  return splitBlobs(blob, sizeof(h), h.numRails, addrs);
}

fuscoResult_t createEndpoint(UcxComm* c, int peer, const std::string& remoteAddr) {
  UcxPeer& p = c->peers[peer];
  p.errArg.comm = c;
  p.errArg.peer = peer;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(remoteAddr.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = epErrorHandler;
  ep.err_handler.arg = &p.errArg;
  ucs_status_t st = ucp_ep_create(c->rails[p.rail].worker, &ep, &p.ep);
  if (st != UCS_OK) {
    p.ep = nullptr;
    return FUSCO_FAIL(fuscoSystemError, kUcx,
                      "ucx: rank %d cannot create an endpoint to rank %d: %s", c->rank, peer,
                      ucs_status_string(st));
  }
  return fuscoSuccess;
}

// Waits (bounded) until every healthy peer has released every message this rank posted to it:
// an operation completes on the sender once its slices are posted, so a rank that destroys its
// communicator right after must not disconnect while a peer is still pulling its last slices.
void drainPosted(UcxComm* c, const Deadline& d) {
  for (;;) {
    bool pending = false;
    for (int p : c->peerList) {
      const UcxPeer& q = c->peers[p];
      if (q.ep != nullptr && !q.failed && q.credited < q.posted) pending = true;
    }
    if (!pending || d.expired()) return;
    progressAll(c);
  }
}

void teardown(UcxComm* c) {
  if (!c->rails.empty() && c->rails[0].worker != nullptr) {
    // Let peers consume what this rank sent, flush what is still in flight, bounded, then
    // force-close whatever did not finish.
    Deadline d(std::min<int64_t>(kCloseFlushMs, c->timeoutMs > 0 ? c->timeoutMs : kCloseFlushMs));
    drainPosted(c, d);
    std::vector<void*> left = waitRequests(c, startClose(c, false), d);
    for (void* q : left) ucp_request_free(q);  // completes (or not) inside the worker teardown
  }
  for (UcxPeer& p : c->peers) {
    ucp_worker_h w = p.rail < static_cast<int>(c->rails.size()) ? c->rails[p.rail].worker : nullptr;
    for (void*& q : p.sendReq) dropRequest(w, &q);
    dropRequest(w, &p.creditReq);
    for (RecvSlot& s : p.recv) {
      // Rendezvous receives run on whichever worker the message arrived on.
      for (UcxRail& r : c->rails)
        if (s.req != nullptr && ucp_request_check_status(s.req) == UCS_INPROGRESS)
          ucp_request_cancel(r.worker, s.req);
      if (s.req != nullptr) ucp_request_free(s.req);
      s.req = nullptr;
    }
  }
  for (void*& q : c->abortReqs) dropRequest(c->rails.empty() ? nullptr : c->rails[0].worker, &q);
  for (UcxRail& r : c->rails) {
    if (r.worker != nullptr) ucp_worker_destroy(r.worker);
    if (r.context != nullptr) ucp_cleanup(r.context);
    r.worker = nullptr;
    r.context = nullptr;
  }
}

}  // namespace fusco::ucx
