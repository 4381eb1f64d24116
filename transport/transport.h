// The transport interface: one ops table per transport (transport/<name>/), the same shape for
// all of them. The engine drives transports only through this table and never names one. This is
// the one place the contract is written; tests/unit/test_transport_conformance.cc checks it for
// every transport the build has, and a new transport passes that suite before it is used.
//
// Channels. A transport offers, per connected peer, an ordered channel of messages in both
// directions: the sender acquires a slot (memory the message is gathered straight into), posts it
// with a tag and a length (0..capacity bytes), and the receiver polls for the next message, reads
// it in place and releases it. Slots hold up to `chunkBytes` (the context's, or the transport's
// default when 0); anything longer is the engine's to cut into slot-sized messages.
//  - Order: messages from one peer arrive exactly once, whole, in the order they were posted, with
//    the tag and length they were posted with. There is no order between different peers.
//  - Credits: at most `depth` messages per direction per peer are posted and not yet released by
//    the receiver. A sender that runs out gets "not now" from sendAcquire (never an error, never a
//    wait) and gets a slot again once the receiver releases; nothing is dropped or overwritten.
//    The bytes of a polled message stay valid and unchanged until recvRelease.
//  - Misuse (sendPost without an acquired slot or longer than the slot, recvRelease without a
//    polled message, a peer that is not connected by this transport) is fuscoInternalError.
//
// Progress and blocking. The engine calls the ops of a communicator from one thread (the one in the
// current fusco call), except markAborted, which may come from another thread at any time
// (fuscoCommAbort, a CUDA communicator's watch thread) and must be safe against the others.
//  - The channel ops, checkPeer, regionToken, peerPointer, progress and sendsInFlight never wait:
//    they return "not now" (a null buffer, false) and the engine decides how long to wait. The
//    engine's wait loop steps every transport's progress whenever a round moves nothing, polls
//    checkPeer for the peers it still waits for every FUSCO_LIVENESS_MS, and gives up with
//    fuscoTimeout after the communicator's timeout (ctx.timeoutMs) without progress. So no wait is
//    forever: a dead or aborted peer ends it through checkPeer, anything else through the timeout.
//  - A transport whose sends finish in the background (UCX rendezvous) has a progress op and also
//    steps itself in its channel ops; its peer may wait for bytes this rank already posted, so the
//    engine keeps calling progress while this rank waits for anything, between and after its own
//    messages (tests do the same while they wait at a barrier).
//  - setup and connect do bounded local work (open devices, map a peer's published memory); they
//    never wait for a peer (the caller runs the barriers). markAborted and close may wait a bounded
//    time to flush what is posted, never longer than ctx.timeoutMs and never on a dead peer.
//
// Completion. sendPost returning means the slot is handed over, not that the bytes left this rank.
// sendsInFlight(peer) is true while a posted message has not completed locally (a send the peer
// has not fetched yet), and also once a send to peer completed with an error, for every later call
// (the failure is sticky): such a pair stays pending, so the engine reports checkPeer's error
// instead of success. A send that completed cleanly counts as delivered even if the peer fails
// later. The engine ends an operation only once sendsInFlight is false for every peer, so no
// peer's bytes depend on this rank stepping the transport after the call returned.
//
// Failure. checkPeer returns fuscoRemoteError, with a message naming the peer's rank (and pid and
// host, and its abort reason when it gave one), once the peer died, aborted (markAborted) or became
// unreachable; it may be called at any time, also before connect finished and after the peer was
// reaped. Other ops log where they detect an error (FUSCO_FAIL, file:line) and return its code;
// after a peer failed, channel ops on it may return errors or "not now" but never crash, never
// touch freed memory and never wait. Errors of one pair do not break the other pairs.
//
// Close. close frees everything the transport holds (memory, mappings, file descriptors,
// endpoints, requests), also while sends are still in flight, after a failed connect and after
// peers died; what was in flight is flushed for a bounded time or dropped, and a peer that was
// still to receive it sees either the whole messages in order or an error, never a hang.
//
// Registered memory (shared memory, CUDA IPC): transports that can map a peer's memory expose
// peerPointer so the engine can write final rows straight into a peer's registered buffer (one
// copy); the others leave these ops nullptr and the engine stages every message through the
// channel.
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

// Length of the host name part of a host id (hostname/boot id/netns), for "%.*s" in messages
// (no allocation on the error path).
inline int hostNameLen(const std::string& hostId) {
  size_t n = hostId.find('/');
  return static_cast<int>(n == std::string::npos ? hostId.size() : n);
}

// Per-communicator facts a transport needs to set itself up.
struct TransportContext {
  int rank = 0;
  int nranks = 0;
  const NodeMap* nodes = nullptr;
  const std::vector<PeerInfo>* peers = nullptr;  // [nranks]
  fuscoMemType_t memType = fuscoMemHost;
  size_t chunkBytes = 0;  // slot payload capacity
  int depth = 0;          // slots per direction per peer
  int64_t timeoutMs = 0;
  uint64_t commTag = 0;  // unique per communicator (from the unique id's secret)
  std::string
      netDevices;  // inter-node devices (rails), comma separated; "": the transport's choice
};

// Completion flags of the CUDA path (one set per peer): 32-bit words in host memory that the GPU
// can read and write. Kinds 0 (ready) and 1 (done) are counters for calls enqueued eagerly: kind
// 0, the receiver tells the sender that its buffers may be written for the next operation; kind 1,
// the sender tells the receiver that the operation's data is in place. Kinds 2 and 3 mean the same
// for operations captured into CUDA graphs, as binary semaphores (post writes 1, the waiter resets
// its word to 0), since a graph replays fixed values. `wait` is this rank's word for the peer (the
// host reads it through hostWait; streams wait on devWait); `post` is the peer's word for this
// rank.
constexpr int kDeviceFlagKinds = 4;
struct DeviceFlags {
  volatile uint32_t* hostWait[kDeviceFlagKinds] = {};
  void* devWait[kDeviceFlagKinds] = {};
  void* devPost[kDeviceFlagKinds] = {};
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

  // The channel to peer (see the contract above); none of them waits. sendAcquire: *buf is a
  // slot of *capacity bytes, or nullptr ("not now": no credit). sendPost: hands the acquired slot
  // over with tag and len <= *capacity. recvPoll: the next message in order (*buf, *len, *tag), or
  // *buf == nullptr; polling again before recvRelease returns the same message. recvRelease:
  // consumes it and returns its credit to the sender.
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

  // fuscoRemoteError (the message names the peer) once the peer died, aborted or became
  // unreachable; fuscoSuccess otherwise. Never waits.
  fuscoResult_t (*checkPeer)(TransportComm* tc, int peer);
  // Tell every connected peer that this rank gave up, and why (so their waits end promptly and
  // their errors name the rank that really failed). Idempotent: the first reason stays. May be
  // called from another thread; waits at most a short, bounded time.
  void (*markAborted)(TransportComm* tc, const char* reason);
  // Frees everything, also with sends in flight and after peers died; bounded. tc may be nullptr.
  void (*close)(TransportComm* tc);
  // Moves along what was posted to any peer. nullptr: every post completes at once. Called by the
  // engine whenever a wait makes no progress, also for pairs this rank is done with.
  void (*progress)(TransportComm* tc);
  // Whether the pair with peer must stay pending: a message posted to it has not completed
  // locally, or a send to it completed with an error (sticky). nullptr: every post completes at
  // once and cannot fail later (shared memory).
  bool (*sendsInFlight)(TransportComm* tc, int peer);

  // Device-memory transports only (nullptr elsewhere). Opening a peer's region may wait for the
  // device, so it never happens inside an operation (docs/DESIGN.md, "The CUDA rules"):
  // regionsToMap says, without waiting, whether peers exported regions this rank has not opened;
  // mapRegions opens them (setup face: a caller's thread, in a setup window).
  bool (*regionsToMap)(TransportComm* tc);
  fuscoResult_t (*mapRegions)(TransportComm* tc);
  // Whether `peer` has opened this rank's region named by `token` (so an operation may offer it
  // to the peer: the peer's progress thread must not have to open it). nullptr: always.
  bool (*peerMapped)(TransportComm* tc, int peer, uint64_t token);
};

// Every transport compiled into this build, in a fixed order.
const std::vector<const TransportOps*>& transportList();

}  // namespace fusco
