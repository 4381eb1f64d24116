// What the engine room (src/exec, docs/DESIGN.md "Layers") needs from its communicator, behind one
// interface the communicator implements: who the ranks are, the connection to each peer, the
// pipeline's slice size and depth, whether a peer is alive, and the stream's implementation. The
// network bridge reaches the communicator only through it, so no include runs from the engine
// room back up into the engine.
#pragma once

#include <cstddef>

#include "core/topology.h"
#include "fusco.h"
#include "transport/transport.h"

namespace fusco {

class StreamOps;  // exec/stream_ops.h

// One peer's connection: the transport that carries it.
struct PeerConn {
  const TransportOps* ops = nullptr;  // nullptr for self
  TransportComm* tc = nullptr;
};

class BridgeLink {
 public:
  virtual ~BridgeLink() = default;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  virtual const NodeMap& nodes() const = 0;
  virtual const PeerConn& conn(int peer) const = 0;
  // The pipeline's slice size and the slices in flight per peer (FUSCO_CHUNK_BYTES, depth).
  virtual size_t chunkBytes() const = 0;
  virtual int depth() const = 0;
  // fuscoSuccess while peer is alive (returns at once).
  virtual fuscoResult_t checkPeer(int peer) const = 0;
  virtual StreamOps* streamOps() = 0;
};

}  // namespace fusco
