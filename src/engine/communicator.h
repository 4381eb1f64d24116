// A communicator: bootstrap, node map, one transport connection per peer, and the state every
// operation shares (timeouts, slice size, error state). Built by create(), which runs the whole
// init sequence; the engine (engine.h) runs operations on it.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/bootstrap.h"
#include "core/fault.h"
#include "core/topology.h"
#include "engine/channels.h"
#include "exec/bridge_link.h"
#include "exec/exec_room.h"
#include "fusco.h"
#include "transport/transport.h"

namespace fusco {

struct CommOptions {
  fuscoMemType_t memType = fuscoMemHost;
  int cudaDevice = -1;
  int64_t timeoutMs = 0;   // 0: FUSCO_TIMEOUT_MS
  int localSize = 0;       // 0: FUSCO_LOCAL_SIZE, else by host
  std::string netDevices;  // "" : FUSCO_NET_DEVICES
  size_t chunkBytes = 0;   // 0: FUSCO_CHUNK_BYTES or auto
  int depth = 0;           // 0: FUSCO_PIPELINE_DEPTH or auto
  int maxSms = 0;          // 0: FUSCO_CUDA_SMS or all
};

// The options of fuscoCommInitRankConfig's config (NULL: the defaults) into *o, after checking its
// size, magic and version and the range of its fields: fuscoInvalidArgument saying why otherwise.
fuscoResult_t commOptionsFromConfig(const fuscoConfig_t* config, CommOptions* o);

// A value every rank must pass alike in one call (a datatype, a size, a config field). The values
// of a call ride in the headers of its first operation, which every rank exchanges with every
// peer, so a difference fails that operation on every rank before any data moves.
class CudaSetupWindow;  // core/cuda_guard.h

struct AgreeValue {
  const char* name;  // the argument or field, as the error message names it
  uint64_t value;
  std::string (*show)(uint64_t) = nullptr;  // how the message prints a value; nullptr: decimal
};

// The communicator's scratch slots (Communicator::scratch), one per use, so no two uses that can
// be in flight together share a buffer.
enum ScratchSlot : int {
  kLandingScratch = 1,  // host MoE combine: partial rows landing at the source
  kStagingScratch = 2,  // host MoE NODE dispatch: rows a forwarder or relay passes on
  kInPlaceScratch = 5,  // CUDA in-place fuscoAllToAll: a copy of the send side
};

class Communicator final : public BridgeLink {
 public:
  static fuscoResult_t create(const fuscoUniqueId& id, int nranks, int rank,
                              const CommOptions& opts, std::unique_ptr<Communicator>* out);
  ~Communicator() override;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  const NodeMap& nodes() const override { return nodes_; }
  fuscoMemType_t memType() const { return ctx_.memType; }
  int64_t timeoutMs() const { return ctx_.timeoutMs; }
  size_t chunkBytes() const override { return ctx_.chunkBytes; }
  int depth() const override { return ctx_.depth; }
  const PeerConn& conn(int peer) const override { return conns_[peer]; }
  // fuscoSuccess while peer is alive (its transport's checkPeer; always for this rank itself).
  fuscoResult_t checkPeer(int peer) const override {
    const PeerConn& pc = conns_[peer];
    return pc.ops != nullptr ? pc.ops->checkPeer(pc.tc, peer) : fuscoSuccess;
  }
  Bootstrap& bootstrap() { return *bootstrap_; }
  // Every rank learns the first rank whose `failure` is not empty (*failed, -1: none) and why.
  // Collective over the bootstrap.
  fuscoResult_t agreeOnOutcome(const std::string& failure, int* failed, std::string* why);
  // The same on every rank of this communicator and different for every other one (it comes from
  // the unique id's secret): an order of communicators that every rank agrees on.
  uint64_t commTag() const { return ctx_.commTag; }

  // Memory peers can write directly (the first transport that offers an allocator).
  fuscoResult_t memAlloc(size_t bytes, void** ptr);
  fuscoResult_t memFree(void* ptr);
  // Token naming [ptr, ptr+bytes) to peers of `peer`'s transport, if it is peer-reachable.
  bool regionToken(int peer, const void* ptr, size_t bytes, uint64_t* token) const;
  // regionToken for a region an operation offers `peer`, which must have mapped it already (its
  // progress thread never opens one; docs/DESIGN.md, "The CUDA rules"): false otherwise, and the
  // operation stages instead.
  bool offerToken(int peer, const void* ptr, size_t bytes, uint64_t* token) const;
  // Grow-only scratch memory of this communicator, from memAlloc so peers can write it directly;
  // kept across calls so no operation pays for fresh pages. One buffer per slot (ScratchSlot).
  fuscoResult_t scratch(int slot, size_t bytes, char** ptr);
  // scratch() for a call on `stream` (a CUDA comm): while the stream is being captured into a CUDA
  // graph the buffer is the graph's own (graphBuffer), since every replay reuses it.
  fuscoResult_t scratchOn(int slot, size_t bytes, void* stream, char** ptr);
  // Peer-mappable memory for one captured operation, kept until the comm is destroyed (a graph may
  // be replayed at any time before that).
  fuscoResult_t graphBuffer(size_t bytes, char** ptr);
  // The comm has captured operations: the idle progress thread checks the peers every
  // FUSCO_LIVENESS_MS, since replays are not announced to it (graph waits are released when
  // a peer dies).
  void noteCapture();
  // fuscoCommGetAsyncError on a host comm: when no call ran on it for the comm's timeout, a peer
  // that died or aborted meanwhile breaks it now (fuscoRemoteError naming the peer), as a blocked
  // call would find. Each transport's checkPeer returns at once. Comms with a progress thread
  // leave it to that thread.
  void checkIdlePeers();
  // fuscoSuccess while the comm can be used; otherwise the error that broke it, naming fn. Looks
  // at the peers first: a dead or aborted peer breaks the comm now (each check returns at once).
  fuscoResult_t checkUsable(const char* fn);
  // Checks of device-side state that kernels write without the host (the low-latency buffers'
  // words): run by the idle progress thread every FUSCO_LIVENESS_MS (which then also checks the
  // peers, as for captured operations) and by takeAsyncError. A check may break the comm or set
  // an asynchronous error; removeWatch returns once no check of key runs.
  void addWatch(const void* key, std::function<void()> check);
  void removeWatch(const void* key);
  // Steps every transport that moves posted messages in the background (TransportOps::progress),
  // and on the progress thread the network bridge (net_bridge.h).
  void progressTransports();
  // The next message from peer and its release (TransportOps::recvPoll / recvRelease): every
  // wait of the engine reads its channels through these, so the network bridge sees its own
  // messages among the engine's.
  fuscoResult_t pollPeer(int peer, const void** buf, size_t* len, uint32_t* tag);
  fuscoResult_t releasePeer(int peer);

  // Error state. A failure in the middle of moving data breaks the communicator (rings may hold
  // half an operation); every later call fails fast with the original message.
  fuscoResult_t brokenResult() const { return broken_.load(); }
  // A copy: the watch thread of a CUDA comm may break the comm while a call reads the message.
  std::string brokenMessage() const;
  void markBroken(fuscoResult_t r, const std::string& msg);
  // A fault injected at this phase (FUSCO_FAULT) breaks the comm as a dead peer would.
  fuscoResult_t injectFault(FaultPhase phase);
  // fuscoCommAbort from any thread: blocked waits notice it and return.
  void requestAbort() { abortRequested_ = true; }
  bool abortRequested() const { return abortRequested_.load(std::memory_order_relaxed); }
  const std::atomic<bool>* abortFlag() const { return &abortRequested_; }

  // Low-latency buffers made on this comm so far: each gets the next number, alike on every rank
  // (creates are collective), so a destroy can name its buffer to the peers.
  uint64_t nextLowLatencyNumber() { return ++lowLatencyMade_; }

  // Per-peer operation counter: both sides of a pair count the operations they share.
  uint64_t nextPairSeq(int peer) { return ++pairSeq_[peer]; }

  // Calls. Every public call that communicates is one call of one or more engine operations.
  // Collective calls are numbered (callSeq): every rank makes the same collective calls in the same
  // order, a call that fails included, so the number is the same on every rank; point-to-point
  // groups carry the number of the last collective call. Every operation's header carries it next
  // to the pair's operation number, so ranks that are a call apart see it and never pair
  // operations of two different calls (engine_wire.h, pairInStep).
  void beginCall(bool collective);
  // Ends the open call with its result. A failure that did not end the call alike on every rank
  // (anything but an agreed validation failure of its last operation: a local error between two
  // operations, or before the first) breaks the communicator, and the transports tell the peers,
  // so they fail at once instead of pairing their next operation with this rank's next call.
  void endCall(fuscoResult_t r, const std::string& why);
  uint64_t callSeq() const { return callSeq_; }
  // Every call of this rank, point-to-point groups included (local: ranks need not agree on it).
  uint64_t callSerial() const { return callSerial_; }
  // The values of the open call that every rank must agree on (carried by its first operation).
  void agreeInCall(std::vector<AgreeValue> values) { callAgree_ = std::move(values); }
  const std::vector<AgreeValue>& callAgreement() const { return callAgree_; }
  size_t opsInCall() const { return callOps_; }
  // The engine, after each operation: agreedFailure when it failed validation on every rank alike;
  // hostRound when the caller's thread waited for it (host data, or a comm without streams).
  void endOp(bool agreedFailure, bool hostRound) {
    ++callOps_;
    callAgreedFailure_ = agreedFailure;
    hostRounds_ += hostRound ? 1 : 0;
  }
  // The call is failing on every rank alike, as its operations' verdict said (a plan's read-back
  // found it): ending it with that error leaves the ranks in step.
  void noteAgreedFailure() { callAgreedFailure_ = true; }
  // Operations so far that the calling thread exchanged with the peers and waited for (host
  // rounds), as opposed to operations enqueued on a stream. Caller's thread only.
  uint64_t hostRounds() const { return hostRounds_; }

  // The CUDA path (fuscoMemCuda). device(): the CUDA device of this comm (-1 for host comms).
  int device() const { return device_; }
  // Makes the comm's device current for the calling thread.
  fuscoResult_t useDevice() const;
  // The CUDA rules (docs/DESIGN.md): opens *w, a setup window, on a caller's thread of an
  // enqueue-only comm (nothing on host comms and on the progress thread, where guardSetup decides);
  // guardSetup: the guard's verdict on a setup call `what` (always fine on host comms).
  fuscoResult_t setupWindow(CudaSetupWindow* w, const char* what);
  fuscoResult_t guardSetup(const char* what) const;
  // Opens, in a setup window, the buffers peers exported since the last call (a caller's thread,
  // before its operation's first wait), so operations find them mapped.
  fuscoResult_t mapPeerRegions();
  // fuscoCommRegister / fuscoCommDeregister of device buffers: peers may then write them directly.
  fuscoResult_t memRegister(void* ptr, size_t bytes);
  fuscoResult_t memDeregister(void* ptr);
  // The handle fuscoCommRegister returns for a registered range (freed with the comm if never
  // taken back), and taking it back: false when handle is not one of this comm's registrations.
  void* addRegistration(void* buff, size_t bytes);
  bool takeRegistration(void* handle, void** buff);
  // Completion flags shared with a peer, and the counters of the data operations between this
  // rank and the peer in each direction (both sides count the same operations).
  fuscoResult_t deviceFlags(int peer, DeviceFlags* out) const;
  uint32_t nextDeviceSendSeq(int peer) { return ++devSendSeq_[peer]; }
  uint32_t nextDeviceRecvSeq(int peer) { return ++devRecvSeq_[peer]; }
  // The progress thread (progress.h) and the enqueued operations (engine_async.h) of a CUDA comm;
  // nullptr on host comms.
  Progress* progress() { return exec_.progress(); }
  DeviceQueue* deviceQueue() { return exec_.queue(); }
  StreamOps* streamOps() override { return exec_.streamOps(); }
  // The network bridge of an enqueue-only comm with ranks on other nodes; nullptr otherwise.
  NetBridge* bridge() { return exec_.bridge(); }
  // The channels of an enqueue-only comm to the ranks of its node (channels.h).
  const Channels& channels() const { return channels_; }
  // A host comm whose calls run through the enqueue-only engine on a host twin of the stream
  // (FUSCO_ASYNC_HOST=1, stream_ops.h).
  bool hostTwin() const { return memType() == fuscoMemHost && exec_.streamOps() != nullptr; }
  // How far the host twin's stream of `peer` (-1: this rank) has come: a word its stream raises
  // as it finishes each item and copy task, which peers on the node read (the progress thread's
  // timeout restarts while the ranks it waits for keep moving); 0 without a twin.
  uint32_t streamBeat(int peer) const;
  // Every rank's beat of the node in one number (0 without a twin): changes while any moves.
  uint64_t streamMotion() const;
  // An enqueued operation whose arguments disagreed between ranks (no data moved, the comm stays
  // usable): fuscoCommGetAsyncError reports it once. takeAsyncError: the error that broke the comm,
  // else the last such failure (then forgotten), else fuscoSuccess; *why: its message.
  // engineResult: the code the host engine gives the same failure (what a host twin's call
  // returns, *engineResult from takeAsyncError).
  void setAsyncError(fuscoResult_t r, const std::string& why, fuscoResult_t engineResult);
  fuscoResult_t takeAsyncError(std::string* why, fuscoResult_t* engineResult = nullptr);
  // Progress thread only: the call (callSerial) an operation of which failed validation (its later
  // operations are skipped alike on every rank).
  uint64_t asyncFailedCall() const { return asyncFailedCall_; }
  void setAsyncFailedCall(uint64_t call) { asyncFailedCall_ = call; }

  // The message of the last failed call on this comm (set by the API layer). Any thread may set
  // or read it while another aborts or uses the comm, so it is copied under a lock.
  void setLastError(const std::string& msg) {
    std::lock_guard<std::mutex> g(lastErrorMu_);
    lastError_ = msg;
  }
  std::string lastError() const {
    std::lock_guard<std::mutex> g(lastErrorMu_);
    return lastError_;
  }
  std::atomic<int> activeCalls{0};

 private:
  Communicator() = default;
  fuscoResult_t resolveOptions(const CommOptions& opts);
  // CUDA comms: exchanges the device identities; caps every grid at this rank's share of a GPU
  // that ranks share, and at maxSms (the config's SM budget; 0: none).
  fuscoResult_t shareDevices(int maxSms);
  fuscoResult_t connectTransports();
  fuscoResult_t agreeOnDevices(fuscoResult_t status, const std::string& error);
  fuscoResult_t loadKernels();

  int rank_ = 0;
  int nranks_ = 0;
  NodeMap nodes_;
  std::vector<PeerInfo> peers_;
  TransportContext ctx_;
  std::unique_ptr<Bootstrap> bootstrap_;
  std::vector<PeerConn> conns_;
  std::vector<std::pair<const TransportOps*, TransportComm*>> transports_;
  std::vector<uint64_t> pairSeq_;
  uint64_t callSeq_ = 0;
  uint64_t lowLatencyMade_ = 0;
  uint64_t callSerial_ = 0;
  uint64_t hostRounds_ = 0;
  bool callOpen_ = false, callAgreedFailure_ = false;
  size_t callOps_ = 0;
  std::vector<AgreeValue> callAgree_;
  std::atomic<fuscoResult_t> broken_{fuscoSuccess};
  mutable std::mutex brokenMu_;
  std::string brokenMsg_;
  std::atomic<bool> abortRequested_{false};
  mutable std::mutex lastErrorMu_;
  std::string lastError_;
  std::map<void*, size_t> plainAllocs_;
  std::map<void*, size_t> deviceAllocs_;  // a CUDA comm without a device transport (one rank)
  std::map<int, std::pair<void*, size_t>> scratch_;
  std::vector<void*> retiredScratch_;  // outgrown scratch of a CUDA comm, freed with the comm
  std::vector<void*> graphBuffers_;    // captured operations' buffers, freed with the comm
  std::atomic<bool> idleChecking_{false};
  std::atomic<int64_t> lastCallNs_{0};  // when a call last began or ended (checkIdlePeers)
  void startIdleCheck();
  void checkGraphPeers();
  bool breakOnDeadPeer();  // true when a dead or aborted peer broke the comm just now
  void idleCheck();
  void runWatches();
  std::mutex watchMu_;
  std::map<const void*, std::function<void()>> watches_;
  fuscoResult_t startAsync();
  fuscoResult_t startStreams();  // startBridge and startAsync in a setup window
  fuscoResult_t twinFlags();
  char* twinOwnFlags_ = nullptr;  // the host twin's flag words (in the shm arena)
  volatile uint32_t* twinBeatWord(char* flags) const;
  std::vector<char*> twinPeerFlags_;                         // each peer's, mapped here
  std::map<void*, std::pair<void*, size_t>> registrations_;  // handle -> range
  int device_ = -1;
  std::vector<uint32_t> devSendSeq_, devRecvSeq_;
  fuscoResult_t startBridge();
  bool pumpBridge();
  void stepTransports();
  ExecRoom exec_;  // stream ops, bridge, queue, progress thread (exec/exec_room.h)
  Channels channels_;
  std::mutex asyncMu_;
  fuscoResult_t asyncError_ = fuscoSuccess, asyncEngineResult_ = fuscoSuccess;
  std::string asyncWhy_;
  uint64_t asyncFailedCall_ = UINT64_MAX;
  // Memory registrations, scratch and region tokens: the caller and the progress thread use them.
  mutable std::recursive_mutex memMu_;
};

}  // namespace fusco
