// UCX lifecycle: one context and worker per rail, worker-address blobs, endpoints with peer
// error handling (the teardown is in ucx_teardown.cc).
#include <cstring>
#include <string>
#include <vector>

#include "core/blob.h"
#include "core/log.h"
#include "core/result.h"
#include "transport/ucx/ucx_comm.h"

namespace fusco::ucx {

namespace {

constexpr uint32_t kBlobMagic = 0x55435846;  // "FXCU"
constexpr uint32_t kBlobVersion = 1;

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

}  // namespace fusco::ucx
