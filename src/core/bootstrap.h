// TCP bootstrap: the rendezvous that turns a fuscoUniqueId into connected ranks.
//
// fuscoGetUniqueId (bootstrapCreateId) binds a listening socket in the calling process and puts
// its address, a random 64-bit secret and a magic into the id. Rank 0 (in that process, or in a
// child forked from it after the call) accepts one connection per other rank. Every connection
// must present the secret before anything it says is believed; one that does not is logged and
// dropped. The root then all-gathers each rank's blob (host identity, pid, transport addresses)
// and keeps one socket per rank for later bootstrap collectives (a star through the root).
// Every wait is bounded by the timeout, counted as time without progress (a large all-gather that
// keeps moving is never cut off); a closed socket is reported as fuscoRemoteError naming the rank.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusco.h"

namespace fusco {

// Fills id (magic, version, root address from FUSCO_SOCKET_IFNAME or the first up non-loopback
// IPv4 interface, else loopback, port, secret). Keeps the listening socket open in this process.
fuscoResult_t bootstrapCreateId(fuscoUniqueId* id);
// Checks magic/version of an id: fuscoInvalidArgument with a message for an id not made by
// bootstrapCreateId.
fuscoResult_t bootstrapCheckId(const fuscoUniqueId& id);
// FUSCO_TIMEOUT_MS: the bootstrap's and the communicator's timeout of every blocking wait, in ms.
int64_t paramTimeoutMs();
// Closes this process's listening socket for id, if it holds one (a launcher that forked the
// ranks calls this in the parent).
void bootstrapReleaseId(const fuscoUniqueId& id);
// "ip:port" of the id's root, for messages.
std::string bootstrapIdAddress(const fuscoUniqueId& id);

class Bootstrap {
 public:
  // Collective over nranks. rank may be out of range (the caller validated nothing else): such a
  // rank still says hello so the root can fail everyone promptly, and gets fuscoInvalidArgument.
  // On success *out is connected and (*allBlobs)[r] is rank r's myBlob.
  // Errors: fuscoTimeout (a rank did not arrive: message names the missing ranks),
  // fuscoInvalidUsage (ranks disagree on nranks, duplicate rank), fuscoInvalidArgument (bad id),
  // fuscoRemoteError (root or a rank went away), fuscoSystemError.
  static fuscoResult_t init(const fuscoUniqueId& id, int nranks, int rank, int64_t timeoutMs,
                            const std::string& myBlob, std::unique_ptr<Bootstrap>* out,
                            std::vector<std::string>* allBlobs);
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  // Every rank contributes one blob (any size up to 64 MiB); all[r] is rank r's.
  fuscoResult_t allGather(const std::string& mine, std::vector<std::string>* all);
  fuscoResult_t barrier();
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  // The owner's abort flag (fuscoCommAbort): a collective waiting for its peers returns
  // fuscoInvalidUsage ("aborted") within Deadline::kAbortPollMs of it being raised.
  void setAbortFlag(const std::atomic<bool>* flag) { abort_ = flag; }
  // 64-bit value unique to this communicator and equal on all its ranks (a hash of the id's
  // secret, never the secret itself): names per-communicator resources (shm segments, ...).
  uint64_t commTag() const { return tag_; }

 private:
  Bootstrap(int rank, int nranks, int64_t timeoutMs)
      : rank_(rank), nranks_(nranks), timeoutMs_(timeoutMs) {}
  int rank_;
  int nranks_;
  int64_t timeoutMs_;
  const std::atomic<bool>* abort_ = nullptr;
  int rootFd_ = -1;           // non-root: socket to the root
  std::vector<int> peerFds_;  // root: socket per rank (-1 for itself)
  uint64_t secret_ = 0;
  uint64_t seq_ = 0;      // collective sequence number, checked on every message
  uint64_t tag_ = 0;      // see commTag()
  std::string rootAddr_;  // "ip:port" of the root, for messages
  // After a failed collective the star is out of step: later calls fail at once with this code.
  fuscoResult_t broken_ = fuscoSuccess;
  friend struct BootstrapAccess;
};

}  // namespace fusco
