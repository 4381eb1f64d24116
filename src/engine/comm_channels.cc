// A communicator's channels (communicator.h): the transports' progress, the engine's reads of a
// peer's messages, and the network bridge that carries an enqueue-only comm's pairs on other
// nodes, which the progress thread pumps.
#include "core/log.h"
#include "core/result.h"
#include "engine/communicator.h"
#include "exec/net_bridge.h"

namespace fusco {

// A comm whose calls only enqueue reaches peers on other nodes through the network bridge
// (net_bridge.h), which the progress thread pumps.
fuscoResult_t Communicator::startBridge() {
  if (nodes_.numNodes <= 1) return fuscoSuccess;
  FUSCO_CHECK(exec_.startBridge(*this));
  FUSCO_INFO(kInit,
             "peers on other nodes: rows staged through %s memory and the network transport, "
             "driven by the progress thread",
             memType() == fuscoMemCuda ? "pinned host" : "host");
  return fuscoSuccess;
}

// One pump of the bridge on the progress thread; a failure breaks the comm and releases the
// streams. True while the bridge owes a peer something.
bool Communicator::pumpBridge() {
  stepTransports();  // what the bridge posted moves on (UCX sends complete in the background)
  // A broken or aborted comm owes its peers nothing more (their waits are released too).
  if (brokenResult() != fuscoSuccess || abortRequested()) return false;
  bool busy = false, moved = false;
  const fuscoResult_t r = exec_.bridge()->pump(&busy, &moved);
  // The progress thread is gone (null) while its destructor still pumps (teardown).
  if (r == fuscoSuccess) {
    if (moved && exec_.progress())
      exec_.progress()->noteProgress();  // rows on the move are progress
    return busy;
  }
  const std::string why = threadLastError();
  FUSCO_WARN(kEngine, "%s", why.c_str());
  markBroken(r, why);
  if (exec_.progress()) exec_.progress()->releaseWaits();
  return false;
}

void Communicator::stepTransports() {
  for (auto& t : transports_)
    if (t.first->progress != nullptr) t.first->progress(t.second);
}

void Communicator::progressTransports() {
  if (exec_.bridge() && exec_.progress() && exec_.progress()->onThread())
    pumpBridge();
  else
    stepTransports();
}

fuscoResult_t Communicator::pollPeer(int peer, const void** buf, size_t* len, uint32_t* tag) {
  if (exec_.bridge() && exec_.bridge()->remote(peer))
    return exec_.bridge()->poll(peer, buf, len, tag);
  const PeerConn& pc = conns_[peer];
  return pc.ops->recvPoll(pc.tc, peer, buf, len, tag);
}

fuscoResult_t Communicator::releasePeer(int peer) {
  if (exec_.bridge() && exec_.bridge()->remote(peer)) return exec_.bridge()->release(peer);
  const PeerConn& pc = conns_[peer];
  return pc.ops->recvRelease(pc.tc, peer);
}

}  // namespace fusco
