// State of the UCX transport ("ucx"): one UCP context and worker per rail (NIC), one endpoint per
// peer, and a message channel per peer pair built on active messages:
//  - data: header {commTag, src, tag, seq} + the payload of one sender slot; the receiver copies
//    it (eager) or pulls it (rendezvous, ucp_am_recv_data_nbx) into its ring slot seq % depth;
//  - credit: header {commTag, src, released}: how many messages the receiver has released, so
//    the sender never has more than `depth` unreleased messages (and the receiver's ring slots
//    are never overwritten before release);
//  - abort: header {commTag, src} + the reason, so a peer's error names the rank that gave up.
// Every channel call also progresses the workers (nothing waits: transport.h). A mutex serializes
// the calls because markAborted may come from another thread.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace fusco::ucx {

enum AmId : unsigned { kAmData = 0x4655, kAmCredit = 0x4656, kAmAbort = 0x4657 };

struct DataHeader {
  uint64_t commTag;
  uint64_t seq;
  int32_t src;
  uint32_t tag;
};

struct CreditHeader {
  uint64_t commTag;
  uint64_t released;  // cumulative count of messages released by the receiver
  int32_t src;
  uint32_t pad;
};

struct AbortHeader {
  uint64_t commTag;
  int32_t src;
  uint32_t pad;
};

struct UcxComm;

struct UcxRail {
  UcxComm* comm = nullptr;  // the active-message handlers' argument is the rail
  std::string device;       // "" : UCX's own choice (UCX_NET_DEVICES or all)
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::string address;  // this worker's address, published in the blob
};

// Argument of an endpoint's error handler.
struct EpErrArg {
  UcxComm* comm = nullptr;
  int peer = -1;
};

struct RecvSlot {
  enum State : uint8_t { kEmpty, kPending, kReady } state = kEmpty;
  uint32_t tag = 0;
  size_t len = 0;
  void* req = nullptr;  // rendezvous receive in progress
};

struct UcxPeer {
  bool inSetup = false;
  bool connected = false;
  int rail = 0;
  ucp_ep_h ep = nullptr;
  EpErrArg errArg;
  PeerInfo info;
  // Failure state: set by the error handler, a failed request, or an abort message.
  bool failed = false;
  ucs_status_t failStatus = UCS_OK;
  bool aborted = false;
  std::string abortReason;
  // Send side.
  std::vector<char> sendSlots;  // depth x chunkBytes
  std::vector<DataHeader> sendHdr;
  std::vector<void*> sendReq;  // per slot: send in flight
  bool sendFailed = false;     // a data send completed with an error (sticky: the peer is failed)
  uint64_t posted = 0;
  uint64_t credited = 0;  // messages the receiver has released
  bool acquired = false;
  // Receive side.
  std::vector<char> recvSlots;  // depth x chunkBytes
  std::vector<RecvSlot> recv;
  uint64_t consumed = 0;  // messages released here
  CreditHeader creditHdr{};
  void* creditReq = nullptr;
  bool creditDirty = false;  // `consumed` changed since the last credit message
  void* abortReq = nullptr;  // this rank's abort notice to the peer, in flight
};

struct UcxComm {
  std::mutex mu;
  int rank = 0;
  int nranks = 0;
  uint64_t commTag = 0;
  size_t chunkBytes = 0;
  int depth = 0;
  int64_t timeoutMs = 0;
  int localRank = 0;
  std::vector<UcxRail> rails;  // never resized after setup (handlers point into it)
  std::vector<int> peerList;
  std::vector<UcxPeer> peers;  // [nranks]; never resized after setup (callbacks point into it)
  bool abortSent = false;
  std::string abortReason;
  AbortHeader abortHdr{};
};

inline UcxComm* asUcx(TransportComm* tc) { return reinterpret_cast<UcxComm*>(tc); }

// ucx_rail.cc: contexts, workers, endpoints, blobs, teardown.
fuscoResult_t openRail(UcxComm* c, const std::string& device, UcxRail* rail);
std::string encodeBlob(const UcxComm* c);
// Parses a peer's blob into its worker addresses (one per rail).
bool decodeBlob(const std::string& blob, uint64_t commTag, int rank,
                std::vector<std::string>* addrs);
fuscoResult_t createEndpoint(UcxComm* c, int peer, const std::string& remoteAddr);
// Polls a request: true when it is done (then freed, *st its status); false while in flight.
bool requestDone(void* req, ucs_status_t* st);
// A request that has not completed yet (nullptr: none).
inline bool inFlight(void* req) {
  return req != nullptr && ucp_request_check_status(req) == UCS_INPROGRESS;
}
// Polls the send request *req to peer (nullptr: none): false while it runs; once done, clears
// *req, marks the peer failed if the send failed (and then sets *failed, which stays set), and
// returns true.
bool reapSend(UcxComm* c, int peer, void** req, bool* failed = nullptr);
// Closes endpoints (bounded flush), cancels and completes every request still in flight, then
// destroys workers and contexts. False when some request would not complete in time: the workers
// are then left (never progressed again) rather than destroyed under it, and c must not be freed.
bool teardown(UcxComm* c);

// ucx_transport.cc
void markFailed(UcxComm* c, int peer, ucs_status_t st);
fuscoResult_t registerHandlers(UcxComm* c, UcxRail* rail);
// Progresses every rail's worker and sends the credits that are due.
void progressAll(UcxComm* c);
// Sends the cumulative release count to peer p if it changed and no credit is in flight.
void pumpCredit(UcxComm* c, UcxPeer& p);
// fuscoRemoteError naming peer and why it failed (aborted with its reason, or lost).
fuscoResult_t peerError(UcxComm* c, int peer);

}  // namespace fusco::ucx
