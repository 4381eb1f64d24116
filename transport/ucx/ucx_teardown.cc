// Teardown of the UCX transport. UCX must not destroy a worker while one of its endpoints still
// holds a request (it asserts and aborts the process), and a peer that stopped in the middle of a
// transfer leaves exactly that: sends it never fetched, a flush that never ends. So close first
// lets healthy peers take what this rank posted (bounded), then closes every endpoint that still
// has requests with a forced close, which completes them with UCS_ERR_CANCELED, and steps the
// workers until every request ended (bounded) before it frees them and destroys the workers.
#include <algorithm>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/log.h"
#include "transport/ucx/ucx_comm.h"

namespace fusco::ucx {

namespace {

constexpr int64_t kCloseFlushMs = 2000;  // at most this long for peers to take what was posted
constexpr int64_t kCancelMs = 1000;      // then at most this long for cancelled requests to end

// Every request this rank holds for peer p that has not completed.
bool peerBusy(const UcxPeer& p) {
  if (inFlight(p.creditReq) || inFlight(p.abortReq)) return true;
  for (void* q : p.sendReq)
    if (inFlight(q)) return true;
  for (const RecvSlot& s : p.recv)
    if (inFlight(s.req)) return true;
  return false;
}

bool anyBusy(const UcxComm* c) { return std::any_of(c->peers.begin(), c->peers.end(), peerBusy); }

void progressWorkers(UcxComm* c) {
  for (UcxRail& r : c->rails)
    if (r.worker != nullptr) ucp_worker_progress(r.worker);
}

// Waits (bounded) until every healthy peer has released every message this rank posted to it
// and this rank's own requests to it completed: an operation completes on the sender once its
// slices are posted, so a rank that destroys its communicator right after must not disconnect
// while a peer is still pulling its last slices.
void drainPosted(UcxComm* c, const Deadline& d) {
  for (;;) {
    bool pending = false;
    for (int p : c->peerList) {
      const UcxPeer& q = c->peers[p];
      if (q.ep != nullptr && !q.failed && (q.credited < q.posted || peerBusy(q))) pending = true;
    }
    if (!pending || d.expired()) return;
    progressAll(c);
  }
}

struct Closing {
  void* req;
  int peer;
  bool forced;
};

// Closes every endpoint: with a flush where the peer is healthy and nothing is in flight to it,
// forced otherwise (a forced close ends the endpoint's requests at once, cancelled). Rendezvous
// receives nobody will poll any more are cancelled first. Returns the close requests.
std::vector<Closing> closeEndpoints(UcxComm* c) {
  for (UcxPeer& p : c->peers)
    for (RecvSlot& s : p.recv)
      for (UcxRail& r : c->rails)
        if (inFlight(s.req) && r.worker != nullptr) ucp_request_cancel(r.worker, s.req);
  std::vector<Closing> reqs;
  for (UcxPeer& p : c->peers) {
    if (p.ep == nullptr) continue;
    const bool force = p.failed || peerBusy(p) || p.credited < p.posted;
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = ucp_ep_close_nbx(p.ep, &prm);
    p.ep = nullptr;
    if (r != nullptr && !UCS_PTR_IS_ERR(r))
      reqs.push_back(Closing{r, static_cast<int>(&p - c->peers.data()), force});
  }
  return reqs;
}

// Steps the workers until the close requests and every request still held ended, or the deadline
// passed; frees the close requests that ended and returns those that did not.
std::vector<Closing> waitQuiet(UcxComm* c, std::vector<Closing> closing, const Deadline& d) {
  for (;;) {
    std::vector<Closing> left;
    for (const Closing& q : closing) {
      ucs_status_t st;
      if (!requestDone(q.req, &st)) left.push_back(q);
    }
    closing.swap(left);
    if ((closing.empty() && !anyBusy(c)) || d.expired()) return closing;
    progressWorkers(c);
  }
}

void freeRequest(void** req) {
  if (*req != nullptr) ucp_request_free(*req);
  *req = nullptr;
}

}  // namespace

bool teardown(UcxComm* c) {
  const bool haveWorker =
      std::any_of(c->rails.begin(), c->rails.end(), [](const UcxRail& r) { return r.worker; });
  if (haveWorker) {
    Deadline flush(
        std::min<int64_t>(kCloseFlushMs, c->timeoutMs > 0 ? c->timeoutMs : kCloseFlushMs));
    drainPosted(c, flush);
    std::vector<Closing> closing = waitQuiet(c, closeEndpoints(c), Deadline(kCancelMs));
    if (!closing.empty() || anyBusy(c)) {
      // Destroying the workers now would abort the process inside UCX. They are left as they are
      // (nothing steps them again, so no handler runs), and so is the state their handlers see.
      std::string which;
      for (const Closing& q : closing)
        which += " " + std::to_string(q.peer) + (q.forced ? " (forced)" : " (flushed)");
      FUSCO_WARN(kUcx,
                 "ucx: rank %d: within %lld ms of being cancelled, closing the endpoints to "
                 "rank(s)%s did not end%s; leaving this communicator's UCX workers behind",
                 c->rank, static_cast<long long>(kCancelMs), which.empty() ? " -" : which.c_str(),
                 anyBusy(c) ? " and requests are still in flight" : "");
      return false;
    }
  }
  // Every request has ended: free them, then the workers and contexts.
  for (UcxPeer& p : c->peers) {
    for (void*& q : p.sendReq) freeRequest(&q);
    freeRequest(&p.creditReq);
    freeRequest(&p.abortReq);
    for (RecvSlot& s : p.recv) freeRequest(&s.req);
  }
  for (UcxRail& r : c->rails) {
    if (r.worker != nullptr) ucp_worker_destroy(r.worker);
    if (r.context != nullptr) ucp_cleanup(r.context);
    r.worker = nullptr;
    r.context = nullptr;
  }
  return true;
}

}  // namespace fusco::ucx
