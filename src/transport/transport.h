// The transport interface: one ops table per transport (transport/<name>/), the same shape for
// all of them. The engine drives transports only through this table and never names one.
//
// A transport offers, per connected peer, an ordered channel of messages in both directions: the
// sender acquires a slot (memory the message is gathered straight into), posts it with a tag and
// a length, and the receiver polls for the next message in order, reads it in place and releases
// the slot (a credit back to the sender). Slots hold up to `chunkBytes` and `depth` of them may
// be in flight per direction. All channel calls are non-blocking; the engine does the waiting.
// Transports that can also map a peer's memory (shared memory, CUDA IPC) expose peerPointer so
// the engine can write final rows straight into a peer's registered buffer (one copy).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/topology.h"
#include "fusco.h"

namespace fusco {

// What every rank published at bootstrap (the part transports need).
struct PeerInfo {
  std::string hostId;
  pid_t pid = 0;
  uint64_t startTime = 0;  // for pid-reuse-safe liveness checks
};

// Per-communicator facts a transport needs to set itself up.
struct TransportContext {
  int rank = 0;
  int nranks = 0;
  const NodeMap* nodes = nullptr;
  const std::vector<PeerInfo>* peers = nullptr;  // [nranks]
  fuscoMemType_t memType = fuscoMemHost;
  size_t chunkBytes = 0;   // slot payload capacity
  int depth = 0;           // slots per direction per peer
  int64_t timeoutMs = 0;
  uint64_t commTag = 0;    // unique per communicator (from the unique id's secret)
  std::string netDevices;  // inter-node devices (rails), comma separated; "": the transport's choice
};

// Completion flags of the CUDA path (one pair per peer): stream-ordered 32-bit counters in host
// memory that the GPU can read and write. kind 0 (ready): the receiver tells the sender that its
// buffers may be written for the next operation; kind 1 (done): the sender tells the receiver that
// the operation's data is in place. `wait` is this rank's counter for the peer (the host reads it
// through hostWait; streams wait on devWait); `post` is the peer's counter for this rank.
struct DeviceFlags {
  volatile uint32_t* hostWait[2] = {nullptr, nullptr};
  void* devWait[2] = {nullptr, nullptr};
  void* devPost[2] = {nullptr, nullptr};
};

struct TransportComm;  // a transport's per-communicator state, opaque to the engine
// Each transport keeps its own state type (e.g. ShmComm) and reinterpret_casts it to and from
// TransportComm*; none defines TransportComm itself (two definitions would break the ODR).

struct TransportOps {
  const char* name;
  // How well this transport connects ctx.rank to peer: < 0 cannot; the highest score wins.
  int (*score)(const TransportContext& ctx, int peer);
  // Phase 1: create local resources for `peers`; *blob is published to every rank.
  fuscoResult_t (*setup)(const TransportContext& ctx, const std::vector<int>& peers,
                         TransportComm** tc, std::string* blob);
  // Phase 2: with every rank's blob ([nranks], "" for ranks that published none), attach to each
  // peer given to setup. A barrier follows (the caller runs it).
  fuscoResult_t (*connect)(TransportComm* tc, const std::vector<std::string>& blobs);

  // Channel to peer, non-blocking. *buf == nullptr means "not now" (no free slot / no message).
  fuscoResult_t (*sendAcquire)(TransportComm* tc, int peer, void** buf, size_t* capacity);
  fuscoResult_t (*sendPost)(TransportComm* tc, int peer, uint32_t tag, size_t len);
  fuscoResult_t (*recvPoll)(TransportComm* tc, int peer, const void** buf, size_t* len,
                            uint32_t* tag);
  fuscoResult_t (*recvRelease)(TransportComm* tc, int peer);

  // Registered memory (may be nullptr when the transport has none). memAlloc returns memory that
  // connected peers can reach directly; regionToken names a local range to peers (false if the
  // range is not peer-reachable); peerPointer maps a peer's token to an address in this process
  // (nullptr if not load/store reachable).
  fuscoResult_t (*memAlloc)(TransportComm* tc, size_t bytes, void** ptr);
  fuscoResult_t (*memFree)(TransportComm* tc, void* ptr);
  bool (*regionToken)(TransportComm* tc, const void* ptr, size_t bytes, uint64_t* token);
  void* (*peerPointer)(TransportComm* tc, int peer, uint64_t token, size_t bytes);

  // Device-memory transports only (nullptr elsewhere): make a caller's CUDA allocation [base,
  // base + bytes) reachable by peers (fuscoCommRegister; registrations of one allocation are
  // counted) and drop one registration again, and the completion flags shared with a peer.
  fuscoResult_t (*memRegister)(TransportComm* tc, void* base, size_t bytes);
  fuscoResult_t (*memDeregister)(TransportComm* tc, void* base);
  fuscoResult_t (*deviceFlags)(TransportComm* tc, int peer, DeviceFlags* out);

  // fuscoRemoteError (message names the peer) if the peer died or aborted; fuscoSuccess otherwise.
  fuscoResult_t (*checkPeer)(TransportComm* tc, int peer);
  // Tell every connected peer that this rank gave up, and why (so their waits end promptly and
  // their errors name the rank that really failed). Idempotent: the first reason stays.
  void (*markAborted)(TransportComm* tc, const char* reason);
  // Frees everything; safe after peers died. tc may be nullptr.
  void (*close)(TransportComm* tc);
  // Moves along what was posted to any peer (transports whose sends finish in the background
  // need their owner to keep stepping them even once every message of a pair is posted, or a
  // peer that waits for those bytes, possibly to forward them, waits forever). nullptr: nothing
  // to do. Called by the engine whenever a wait makes no progress.
  void (*progress)(TransportComm* tc);
  // Whether a message posted to peer is still leaving this rank (its send has not completed
  // locally: a rendezvous the peer has not fetched yet). The engine ends an operation only once
  // this is false for every peer, so no peer's bytes wait on this rank stepping the transport
  // after the call returned; true as well once a send to peer failed, so the engine keeps the pair
  // pending and reports checkPeer's error instead of success. nullptr: every post completes at
  // once (shared memory).
  bool (*sendsInFlight)(TransportComm* tc, int peer);
};

// Every transport compiled into this build, in a fixed order.
const std::vector<const TransportOps*>& transportList();

}  // namespace fusco
