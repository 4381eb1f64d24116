#include "engine/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

#include "core/blob.h"
#include "core/clock.h"
#include "core/cuda_guard.h"
#include "core/fault.h"
#include "core/live_registry.h"
#include "core/log.h"
#include "core/params.h"
#include "core/result.h"
#include "device/cuda_rt.h"
#include "device/device_share.h"
#include "device/kernel_load.h"
#include "device/op_steps.h"
#include "engine/peer_info.h"
#include "exec/device_queue.h"
#include "exec/net_bridge.h"
#include "exec/stream_ops.h"

namespace fusco {

namespace {

constexpr size_t kDefaultChunkBytes = 512 << 10;
constexpr size_t kMinChunkBytes = 4 << 10;
constexpr size_t kMaxChunkBytes = 256 << 20;
constexpr int kDefaultDepth = 4;
constexpr int kMaxDepth = 64;

// Every rank's outcome of one setup step (failure "": success), in one allGather. *failed: the
// lowest rank that failed (-1: none), *why: its message.
// The first rank whose gathered record does not start with the success byte '\1' (-1: none) and
// what it said after its failure byte.
int firstFailure(const std::vector<std::string>& all, std::string* why) {
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty() && all[r][0] == '\1') continue;
    *why = all[r].size() > 1 ? all[r].substr(1) : "unknown";
    return static_cast<int>(r);
  }
  return -1;
}

fuscoResult_t agreeOnOutcome(Bootstrap& b, const std::string& failure, int* failed,
                             std::string* why) {
  std::vector<std::string> all;
  FUSCO_CHECK(
      b.allGather(failure.empty() ? std::string(1, '\1') : std::string(1, '\0') + failure, &all));
  *failed = firstFailure(all, why);
  return fuscoSuccess;
}

// Every rank must split the ranks into the same nodes, or ranks pick different transports for
// one pair. Each rank's node map follows from every rank's host identity and its own ranks per
// node, which all ranks published, so every rank finds the same first disagreement (a different
// setting that gives the same nodes is harmless).
fuscoResult_t agreeOnNodes(const std::vector<std::string>& hostIds,
                           const std::vector<int>& localSizes, NodeMap* out) {
  *out = buildNodeMap(hostIds, localSizes[0]);
  std::map<int, bool> same{{localSizes[0], true}};  // per value: the same nodes as rank 0's
  for (size_t r = 1; r < localSizes.size(); ++r) {
    auto it = same.find(localSizes[r]);
    if (it == same.end())
      it = same.emplace(localSizes[r], buildNodeMap(hostIds, localSizes[r]).nodeOf == out->nodeOf)
               .first;
    if (it->second) continue;
    return FUSCO_FAIL(fuscoInvalidUsage, kInit,
                      "ranks disagree on ranks per node (fuscoConfig_t.localSize, else "
                      "FUSCO_LOCAL_SIZE; 0: by host): rank 0 uses %d, rank %zu uses %d, which "
                      "makes other nodes; every rank must use the same value",
                      localSizes[0], r, localSizes[r]);
  }
  return fuscoSuccess;
}

}  // namespace

FUSCO_PARAM_INT(
    LocalSize, "FUSCO_LOCAL_SIZE", 0, 0, INT32_MAX,
    "ranks per node; > 0 splits one host into virtual nodes of this many ranks (0: by host)");
FUSCO_PARAM_STRING(NetDevices, "FUSCO_NET_DEVICES", "",
                   "inter-node devices/rails, comma separated (empty: auto)");
// The slice sizes the transports support: a value outside them is warned about and replaced by
// the default, like every knob (fusco_info shows the same). fuscoConfig_t.chunkBytes, an argument,
// is checked when a communicator is made.
FUSCO_PARAM_INT(ChunkBytes, "FUSCO_CHUNK_BYTES", kDefaultChunkBytes, kMinChunkBytes, kMaxChunkBytes,
                "pipeline slice size in bytes (4 KiB to 256 MiB)");
FUSCO_PARAM_INT(PipelineDepth, "FUSCO_PIPELINE_DEPTH", 0, 0, kMaxDepth,
                "slices in flight per peer (0: auto, 4)");

// Bytes of a version-1 fuscoConfig_t, which ended at pipelineDepth (padded as the struct is).
constexpr size_t kConfigV1Bytes = (offsetof(fuscoConfig_t, maxSms) + alignof(fuscoConfig_t) - 1) /
                                  alignof(fuscoConfig_t) * alignof(fuscoConfig_t);

// Whether the config's header is one this library reads: the current version, or version 1.
bool configHeaderKnown(const fuscoConfig_t* config) {
  if (config->magic != FUSCO_CONFIG_MAGIC) return false;
  if (config->version == FUSCO_CONFIG_VERSION) return config->size == sizeof(fuscoConfig_t);
  return config->version == 1 && config->size == kConfigV1Bytes;
}

fuscoResult_t commOptionsFromConfig(const fuscoConfig_t* config, CommOptions* o) {
  if (config == nullptr) return fuscoSuccess;
  if (!configHeaderKnown(config))
    return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                      "fuscoCommInitRankConfig: config has size %zu, magic 0x%x, version %u; "
                      "expected %zu, 0x%x, %u (initialize it with FUSCO_CONFIG_INITIALIZER)",
                      config->size, config->magic, config->version, sizeof(fuscoConfig_t),
                      FUSCO_CONFIG_MAGIC, FUSCO_CONFIG_VERSION);
  if (config->memType != fuscoMemHost && config->memType != fuscoMemCuda)
    return FUSCO_FAIL(fuscoInvalidArgument, kApi, "config.memType %d is not a memory type",
                      (int)config->memType);
  const int maxSms = config->version >= 2 ? config->maxSms : 0;
  if (config->timeoutMs < 0 || config->localSize < 0 || config->pipelineDepth < 0 || maxSms < 0)
    return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                      "config: timeoutMs (%d), localSize (%d), pipelineDepth (%d) and maxSms (%d) "
                      "must be >= 0",
                      config->timeoutMs, config->localSize, config->pipelineDepth, maxSms);
  o->memType = config->memType;
  o->cudaDevice = config->cudaDevice;
  o->timeoutMs = config->timeoutMs;
  o->localSize = config->localSize;
  o->netDevices = config->netDevices ? config->netDevices : "";
  o->chunkBytes = config->chunkBytes;
  o->depth = config->pipelineDepth;
  o->maxSms = maxSms;
  return fuscoSuccess;
}

fuscoResult_t Communicator::resolveOptions(const CommOptions& o) {
  ctx_.memType = o.memType;
  ctx_.netDevices = !o.netDevices.empty() ? o.netDevices : paramNetDevices();
  ctx_.timeoutMs = o.timeoutMs > 0 ? o.timeoutMs : paramTimeoutMs();
  const int64_t chunk = o.chunkBytes ? static_cast<int64_t>(o.chunkBytes) : paramChunkBytes();
  if (chunk < static_cast<int64_t>(kMinChunkBytes) || chunk > static_cast<int64_t>(kMaxChunkBytes))
    return FUSCO_FAIL(fuscoInvalidArgument, kInit,
                      "config.chunkBytes %lld is outside the supported range [%zu, %zu]",
                      static_cast<long long>(chunk), kMinChunkBytes, kMaxChunkBytes);
  ctx_.chunkBytes = static_cast<size_t>(chunk);
  int64_t depth = o.depth ? o.depth : paramPipelineDepth();
  if (depth == 0) depth = kDefaultDepth;
  if (depth < 1 || depth > kMaxDepth)
    return FUSCO_FAIL(fuscoInvalidArgument, kInit,
                      "pipeline depth %lld is outside the supported range [1, %d]",
                      static_cast<long long>(depth), kMaxDepth);
  ctx_.depth = static_cast<int>(depth);
  if (o.localSize < 0)
    return FUSCO_FAIL(fuscoInvalidArgument, kInit, "localSize %d must be >= 0", o.localSize);
  return fuscoSuccess;
}

fuscoResult_t Communicator::create(const fuscoUniqueId& id, int nranks, int rank,
                                   const CommOptions& opts, std::unique_ptr<Communicator>* out) {
  std::unique_ptr<Communicator> c(new Communicator());
  c->rank_ = rank;
  c->nranks_ = nranks;
  FUSCO_CHECK(c->resolveOptions(opts));
  // A CUDA comm checks its device before any peer waits on it: a rank without one still joins the
  // bootstrap (below) and says so, so its peers fail promptly rather than after the timeout.
  std::string deviceError;
  fuscoResult_t deviceStatus = fuscoSuccess;
  if (opts.memType == fuscoMemCuda) {
    deviceStatus = cudaUseDevice(opts.cudaDevice, &c->device_);
    if (deviceStatus == fuscoSuccess) deviceStatus = c->loadKernels();
    if (deviceStatus != fuscoSuccess) deviceError = threadLastError();
  }
  faultConfigure();  // FUSCO_FAULT (debug): parsed once per communicator

  const int localSize = opts.localSize > 0 ? opts.localSize : static_cast<int>(paramLocalSize());
  std::vector<std::string> blobs;
  FUSCO_CHECK(Bootstrap::init(id, nranks, rank, c->ctx_.timeoutMs,
                              encodePeerInfo(localPeerInfo(), localSize), &c->bootstrap_, &blobs));
  c->bootstrap_->setAbortFlag(&c->abortRequested_);  // fuscoCommAbort wakes its collectives
  FUSCO_CHECK(faultPoint(FaultPhase::Bootstrap, rank));
  c->peers_.resize(nranks);
  std::vector<std::string> hostIds(nranks);
  std::vector<int> localSizes(nranks);
  for (int r = 0; r < nranks; ++r) {
    if (!decodePeerInfo(blobs[r], &c->peers_[r], &localSizes[r]))
      return FUSCO_FAIL(fuscoInternalError, kInit, "malformed peer record from rank %d", r);
    hostIds[r] = c->peers_[r].hostId;
  }
  FUSCO_CHECK(agreeOnNodes(hostIds, localSizes, &c->nodes_));
  c->ctx_.rank = rank;
  c->ctx_.nranks = nranks;
  c->ctx_.nodes = &c->nodes_;
  c->ctx_.peers = &c->peers_;
  c->ctx_.commTag = c->bootstrap_->commTag();
  c->pairSeq_.assign(nranks, 0);
  if (opts.memType == fuscoMemCuda) {
    FUSCO_CHECK(c->agreeOnDevices(deviceStatus, deviceError));
    FUSCO_CHECK(c->shareDevices(opts.maxSms));
  }
  // The setup calls of init run once no operation of another comm of this process can wait
  // (docs/DESIGN.md, "The CUDA rules"), each in a setup window of its own: a window is never held
  // across an exchange with the peers, whose processes may wait for this one's other comms.
  FUSCO_CHECK(c->connectTransports());
  c->devSendSeq_.assign(nranks, 0);
  c->devRecvSeq_.assign(nranks, 0);
  if (opts.memType == fuscoMemCuda) {
    c->exec_.setStreamOps(cudaStreamOps());
    FUSCO_CHECK(c->startStreams());
    FUSCO_CHECK(c->channels_.map(*c));
  } else if (paramAsyncHost() != 0) {
    FUSCO_CHECK(c->twinFlags());
    if (!c->twinPeerFlags_.empty() || nranks == 1) {
      c->exec_.setStreamOps(hostStreamOps(c->ctx_.timeoutMs, c->twinBeatWord(c->twinOwnFlags_)));
      FUSCO_CHECK(c->startStreams());
      Communicator* self = c.get();
      c->exec_.progress()->setBeat([self](int p) { return self->streamBeat(p); });
      c->exec_.streamOps()->setMotion([self] { return self->streamMotion(); });
      FUSCO_CHECK(c->channels_.map(*c));
      FUSCO_INFO(kInit,
                 "FUSCO_ASYNC_HOST: calls run through the enqueue-only engine on a host "
                 "twin of the stream");
    }
  }
  FUSCO_INFO(kInit,
             "comm rank %d/%d node %d/%d local rank %d/%d: chunk %zu B, depth %d, timeout %lld ms",
             rank, nranks, c->nodes_.nodeOf[rank], c->nodes_.numNodes, c->nodes_.localRankOf[rank],
             c->nodes_.localSize(c->nodes_.nodeOf[rank]), c->ctx_.chunkBytes, c->ctx_.depth,
             static_cast<long long>(c->ctx_.timeoutMs));
  c->lastCallNs_ = nowNs();  // init saw every peer
  *out = std::move(c);
  return fuscoSuccess;
}

// Picks a transport per peer, sets each used transport up, exchanges their blobs, connects, and
// agrees on the outcome: every rank learns whether every other rank connected.
fuscoResult_t Communicator::connectTransports() {
  const auto& list = transportList();
  conns_.assign(nranks_, PeerConn{});
  std::vector<std::vector<int>> peersOf(list.size());
  std::string failure;
  fuscoResult_t failureCode = fuscoInvalidUsage;  // no transport for a pair: a usage error
  for (int p = 0; p < nranks_; ++p) {
    if (p == rank_) continue;
    int best = -1, bestScore = -1;
    for (size_t t = 0; t < list.size(); ++t) {
      int s = list[t]->score(ctx_, p);
      if (s > bestScore) bestScore = s, best = static_cast<int>(t);
    }
    if (best < 0) {
      failure = "no transport connects rank " + std::to_string(rank_) + " (node " +
                std::to_string(nodes_.nodeOf[rank_]) + ") to rank " + std::to_string(p) +
                " (node " + std::to_string(nodes_.nodeOf[p]) + ") for this memory type";
      break;
    }
    peersOf[best].push_back(p);
    conns_[p].ops = list[best];
  }
  std::string mine(1, failure.empty() ? '\1' : '\0');
  std::vector<TransportComm*> tcs(list.size(), nullptr);
  for (size_t t = 0; t < list.size() && failure.empty(); ++t) {
    std::string blob;
    if (!peersOf[t].empty()) {
      if (fuscoResult_t r = list[t]->setup(ctx_, peersOf[t], &tcs[t], &blob); r != fuscoSuccess) {
        failure = std::string(list[t]->name) + " setup failed: " + threadLastError();
        failureCode = r;  // the transport's own code (out of memory, a failed mmap: system)
        mine[0] = '\0';
        break;
      }
      transports_.push_back({list[t], tcs[t]});
      FUSCO_INFO(kInit, "transport %s connects %zu peers", list[t]->name, peersOf[t].size());
    }
    appendBlob(&mine, blob);
  }
  if (!failure.empty()) mine = std::string(1, '\0') + failure;
  std::vector<std::string> all;
  FUSCO_CHECK(bootstrap_->allGather(mine, &all));
  std::string why;
  if (const int r = firstFailure(all, &why); r >= 0) {
    if (r == rank_) return FUSCO_FAIL(failureCode, kInit, "%s", why.c_str());
    return FUSCO_FAIL(fuscoRemoteError, kInit, "rank %d could not set up transports: %s", r,
                      why.c_str());
  }
  for (size_t t = 0; t < list.size(); ++t) {
    if (tcs[t] == nullptr) continue;
    std::vector<std::string> blobs(nranks_);
    for (int r = 0; r < nranks_; ++r) {
      std::vector<std::string> parts;
      if (!splitBlobs(all[r], 1, list.size(), &parts))
        return FUSCO_FAIL(fuscoInternalError, kInit, "malformed transport record from rank %d", r);
      blobs[r] = parts[t];
    }
    for (int p : peersOf[t]) conns_[p].tc = tcs[t];
    if (list[t]->connect(tcs[t], blobs) != fuscoSuccess) {
      failure = std::string(list[t]->name) + " connect failed: " + threadLastError();
      break;
    }
  }
  // Second agreement: nobody starts an operation unless everybody connected.
  int failed = -1;
  FUSCO_CHECK(agreeOnOutcome(failure, &failed, &why));
  if (failed >= 0)
    return FUSCO_FAIL(failed == rank_ ? fuscoSystemError : fuscoRemoteError, kInit,
                      "rank %d could not connect: %s", failed, why.c_str());
  for (int p = 0; p < nranks_; ++p)
    if (conns_[p].ops) FUSCO_INFO(kInit, "peer %d via %s", p, conns_[p].ops->name);
  return fuscoSuccess;
}

// A wait of an operation's kernel that gave up after the timeout, as the comm's error: "" while
// none did.
static std::string kernelTimeout(const DeviceQueue& q) {
  uint32_t peer = 0, phase = 0;
  if (!q.timedOut(&peer, &phase)) return std::string();
  return "an operation's kernel waited for rank " + std::to_string(peer) + " (" +
         op::phaseName(phase) + ") without progress for twice the timeout";
}

// The parameter queue and the progress thread of the enqueue-only engine (engine_async.h).
fuscoResult_t Communicator::startAsync() {
  Communicator* self = this;
  FUSCO_CHECK(exec_.startQueue(static_cast<size_t>(paramCudaParamBytes()),
                               static_cast<size_t>(paramCudaGraphParamBytes())));
  const int device = device_;
  exec_.setProgress(std::make_unique<Progress>(
      ctx_.timeoutMs, paramLivenessMs(), [self](int p) { return self->checkPeer(p); },
      [self](fuscoResult_t r, const std::string& why) { self->markBroken(r, why); },
      [device] {
        if (device < 0) return;
        cudaSetCurrent(device);
        cudaRelaxCaptureOnThisThread();  // allocations while the caller captures a graph
      }));
  DeviceQueue* q = exec_.queue();
  exec_.progress()->setAbort([q] { q->abort(); }, [q] { return kernelTimeout(*q); });
  if (exec_.bridge() && exec_.bridge()->any())
    exec_.progress()->setPump([self] { return self->pumpBridge(); });
  return fuscoSuccess;
}

// The host twin's flags (DeviceFlags, kDeviceFlagKinds words per peer) in this rank's shm arena,
// mapped by every peer of its node; peers on other nodes have the network bridge's (net_bridge.h).
// Left empty (no twin) on every rank when a pair of ranks of one node cannot map each other's
// memory: such comms keep the host engine.
// After the flags, one more word: the twin stream's beat (streamBeat).
fuscoResult_t Communicator::twinFlags() {
  const size_t bytes = (static_cast<size_t>(kDeviceFlagKinds) * nranks_ + 1) * 64;
  void* own = nullptr;
  FUSCO_CHECK(memAlloc(bytes, &own));
  std::memset(own, 0, bytes);
  twinOwnFlags_ = static_cast<char*>(own);
  uint64_t token = 0;
  bool mappable = true;
  for (int p = 0; p < nranks_ && mappable; ++p)
    mappable = p == rank_ || !nodes_.sameNode(rank_, p) || regionToken(p, own, bytes, &token);
  std::vector<std::string> all;
  FUSCO_CHECK(bootstrap_->allGather(mappable ? std::to_string(token) : "-", &all));
  std::vector<char*> peers(nranks_, nullptr);
  bool ok = true;
  for (int p = 0; p < nranks_ && ok; ++p) {
    if (p == rank_ || !nodes_.sameNode(rank_, p)) continue;
    const PeerConn& pc = conns_[p];
    ok = all[p] != "-" && pc.ops != nullptr && pc.ops->peerPointer != nullptr;
    if (ok)
      peers[p] = static_cast<char*>(
          pc.ops->peerPointer(pc.tc, p, std::strtoull(all[p].c_str(), nullptr, 10), bytes));
    ok = ok && peers[p] != nullptr;
  }
  // Every rank runs the twin, or none does: a pair of a twin and a host engine cannot talk.
  std::vector<std::string> agreed;
  FUSCO_CHECK(bootstrap_->allGather(ok ? "1" : "0", &agreed));
  for (const std::string& a : agreed)
    if (a != "1") return fuscoSuccess;
  twinPeerFlags_ = std::move(peers);
  return fuscoSuccess;
}

volatile uint32_t* Communicator::twinBeatWord(char* flags) const {
  if (flags == nullptr) return nullptr;
  return reinterpret_cast<volatile uint32_t*>(flags +
                                              static_cast<size_t>(kDeviceFlagKinds) * nranks_ * 64);
}

uint32_t Communicator::streamBeat(int peer) const {
  char* flags = peer < 0 || peer == rank_                           ? twinOwnFlags_
                : static_cast<size_t>(peer) < twinPeerFlags_.size() ? twinPeerFlags_[peer]
                                                                    : nullptr;
  volatile uint32_t* w = twinBeatWord(flags);
  return w != nullptr ? *w : 0;
}

uint64_t Communicator::streamMotion() const {
  if (twinOwnFlags_ == nullptr) return 0;
  uint64_t sum = 0;
  for (int p = -1; p < nranks_; ++p) sum = sum * 0x100000001b3ull + streamBeat(p);
  return sum;
}

void Communicator::setAsyncError(fuscoResult_t r, const std::string& why,
                                 fuscoResult_t engineResult) {
  std::lock_guard<std::mutex> g(asyncMu_);
  asyncError_ = r;
  asyncEngineResult_ = engineResult;
  asyncWhy_ = why;
}

fuscoResult_t Communicator::takeAsyncError(std::string* why, fuscoResult_t* engineResult) {
  runWatches();
  if (brokenResult() != fuscoSuccess) {
    *why = brokenMessage();
    if (engineResult != nullptr) *engineResult = brokenResult();
    return brokenResult();
  }
  std::lock_guard<std::mutex> g(asyncMu_);
  fuscoResult_t r = asyncError_;
  if (engineResult != nullptr) *engineResult = asyncEngineResult_;
  *why = asyncWhy_;
  asyncError_ = fuscoSuccess;
  asyncWhy_.clear();
  return r;
}

void Communicator::noteCapture() { startIdleCheck(); }

// Once per comm: the idle progress thread checks the peers and the watches every liveness period.
void Communicator::startIdleCheck() {
  if (!exec_.progress() || idleChecking_.exchange(true)) return;
  exec_.progress()->setIdleCheck([this] { idleCheck(); });
}

fuscoResult_t Communicator::agreeOnOutcome(const std::string& failure, int* failed,
                                           std::string* why) {
  return fusco::agreeOnOutcome(*bootstrap_, failure, failed, why);
}

void Communicator::addWatch(const void* key, std::function<void()> check) {
  {
    std::lock_guard<std::mutex> g(watchMu_);
    watches_[key] = std::move(check);
  }
  startIdleCheck();
}

void Communicator::removeWatch(const void* key) {
  std::lock_guard<std::mutex> g(watchMu_);
  watches_.erase(key);
}

void Communicator::runWatches() {
  std::lock_guard<std::mutex> g(watchMu_);
  for (auto& w : watches_) w.second();
}

void Communicator::idleCheck() {
  checkGraphPeers();
  runWatches();
}

bool Communicator::breakOnDeadPeer() {
  if (brokenResult() != fuscoSuccess) return false;
  for (int p = 0; p < nranks_; ++p) {
    if (p == rank_ || checkPeer(p) == fuscoSuccess) continue;
    std::string why = "rank " + std::to_string(p) + " failed: " + threadLastError();
    FUSCO_WARN(kEngine, "%s", why.c_str());
    markBroken(fuscoRemoteError, why);
    return true;
  }
  return false;
}

fuscoResult_t Communicator::checkUsable(const char* fn) {
  breakOnDeadPeer();
  if (brokenResult() == fuscoSuccess) return fuscoSuccess;
  return FUSCO_FAIL(brokenResult(), kApi,
                    "%s: the communicator failed in an earlier call and cannot be used: %s", fn,
                    brokenMessage().c_str());
}

void Communicator::checkIdlePeers() {
  // A call in flight on another thread watches the peers itself.
  if (exec_.progress() || activeCalls.load() > 1) return;
  if (nowNs() - lastCallNs_.load() < ctx_.timeoutMs * 1000000LL) return;
  breakOnDeadPeer();
}

// The idle progress thread of a comm with captured operations: a dead peer breaks the comm, and
// while it is broken every graph wait of this rank is released (a replay may start any time).
void Communicator::checkGraphPeers() {
  if (breakOnDeadPeer()) exec_.progress()->releaseWaits();
  if (brokenResult() == fuscoSuccess) return;
  for (int p = 0; p < nranks_; ++p) {
    DeviceFlags f;
    if (p == rank_ || deviceFlags(p, &f) != fuscoSuccess) continue;
    for (int kind = 2; kind < kDeviceFlagKinds; ++kind) *f.hostWait[kind] = 1;
  }
}

// Every rank of a CUDA comm learns whether every rank has its device, before any transport is set
// up.
// Ranks on one GPU (equal device UUIDs) share its multiprocessors: each rank's kernels are capped
// at its part, so the spinning grids of co-located ranks fit on the GPU together
// (docs/DESIGN.md, "When ranks share one GPU").
fuscoResult_t Communicator::shareDevices(int maxSms) {
  std::string mine;
  if (cudaDeviceIdentity(device_, &mine) != fuscoSuccess) mine.clear();  // counted alone
  std::vector<std::string> all;
  FUSCO_CHECK(bootstrap_->allGather(mine, &all));
  const std::string queues = connectionsWarning(getenv("CUDA_DEVICE_MAX_CONNECTIONS"));
  if (!queues.empty() && rank_ == 0) FUSCO_WARN(kInit, "%s", queues.c_str());
  const int ranks = ranksSharingDevice(all, rank_);
  deviceSetShare(device_, ranks);
  if (ranks > 1)
    FUSCO_INFO(kInit,
               "%d ranks share CUDA device %d: each rank's kernels take at most 1/%d of its "
               "multiprocessors",
               ranks, device_, ranks);
  deviceSetBudget(device_, maxSms);
  if (maxSms > 0)
    FUSCO_INFO(kInit, "SM budget: kernels on CUDA device %d take at most %d multiprocessors",
               device_, maxSms);
  return fuscoSuccess;
}

fuscoResult_t Communicator::agreeOnDevices(fuscoResult_t status, const std::string& error) {
  const std::string failure = status == fuscoSuccess ? "" : error.empty() ? "unknown" : error;
  int failed = -1;
  std::string why;
  FUSCO_CHECK(agreeOnOutcome(failure, &failed, &why));
  if (status != fuscoSuccess) return FUSCO_FAIL(status, kInit, "%s", error.c_str());
  if (failed >= 0)
    return FUSCO_FAIL(fuscoRemoteError, kInit, "rank %d has no usable CUDA device: %s", failed,
                      why.c_str());
  return fuscoSuccess;
}

fuscoResult_t Communicator::deviceFlags(int peer, DeviceFlags* out) const {
  if (exec_.bridge() && exec_.bridge()->remote(peer)) {
    exec_.bridge()->flags(peer, out);
    return fuscoSuccess;
  }
  if (!twinPeerFlags_.empty()) {
    for (int kind = 0; kind < kDeviceFlagKinds; ++kind) {
      char* mine = twinOwnFlags_ + (static_cast<size_t>(kind) * nranks_ + peer) * 64;
      out->hostWait[kind] = reinterpret_cast<volatile uint32_t*>(mine);
      out->devWait[kind] = mine;
      out->devPost[kind] =
          twinPeerFlags_[peer] + (static_cast<size_t>(kind) * nranks_ + rank_) * 64;
    }
    return fuscoSuccess;
  }
  const PeerConn& pc = conns_[peer];
  if (pc.ops == nullptr || pc.ops->deviceFlags == nullptr)
    return FUSCO_FAIL(fuscoInternalError, kEngine, "rank %d is not connected by a device transport",
                      peer);
  return pc.ops->deviceFlags(pc.tc, peer, out);
}

Communicator::~Communicator() {
  CudaSetupWindow window;  // open for the frees below as well
  if (exec_.progress()) {
    // Operations still queued run first (each bounded by the timeout); streams may still wait for
    // peers: let them finish (or release them), then let the GPU drain before the memory they use
    // goes away.
    if (abortRequested()) exec_.progress()->releaseWaits();
    exec_.progress()->runSync([] { return fuscoSuccess; });
    exec_.progress()->drain();
    // This comm's waits are satisfied or released; the device work of other comms may still wait
    // for their progress threads: the synchronize and frees below run once nothing waits
    // (docs/DESIGN.md, "The CUDA rules"); past the timeout the guard skips them, leaking rather
    // than risking a deadlock.
    if (window.open(timeoutMs(), "destroying a communicator") != fuscoSuccess)
      FUSCO_WARN(kEngine, "%s", threadLastError().c_str());
    if (device_ >= 0) cudaDeviceSyncQuiet();
    if (exec_.streamOps()) exec_.streamOps()->drain();  // the host twin's stream
    exec_.close();
  }
  channels_.release(*this);
  for (auto& kv : scratch_)
    if (kv.second.first != nullptr) memFree(kv.second.first);
  for (void* p : retiredScratch_) memFree(p);
  for (void* p : graphBuffers_) memFree(p);
  for (auto& t : transports_) t.first->close(t.second);
  for (auto& kv : plainAllocs_) free(kv.first);
  for (auto& kv : deviceAllocs_) cudaFreeDevice(kv.first);
}

fuscoResult_t Communicator::injectFault(FaultPhase phase) {
  return faultPoint(phase, rank_, [&](const char* w) { markBroken(fuscoRemoteError, w); });
}

// A number, never an address and never reused by any comm of the process (the live registry's
// handles): a stale handle (its registration taken back) never names a later registration, even
// one of an equal range.
void* Communicator::addRegistration(void* buff, size_t bytes) {
  void* h = mintHandle(LiveKind::Registration);
  registrations_[h] = {buff, bytes};
  return h;
}

bool Communicator::takeRegistration(void* handle, void** buff) {
  auto it = registrations_.find(handle);
  if (it == registrations_.end()) return false;
  *buff = it->second.first;
  registrations_.erase(it);
  return true;
}

void Communicator::markBroken(fuscoResult_t r, const std::string& msg) {
  {
    std::lock_guard<std::mutex> g(brokenMu_);
    fuscoResult_t expected = fuscoSuccess;
    if (broken_.compare_exchange_strong(expected, r)) brokenMsg_ = msg;
    for (auto& t : transports_) t.first->markAborted(t.second, brokenMsg_.c_str());
  }
  // No stream of a broken comm may keep waiting (the progress thread releases its own waits).
  // Outside brokenMu_: the progress thread calls markBroken holding its own lock
  // (Progress::release), so taking that lock under brokenMu_ here would invert the order.
  if (exec_.progress() && !exec_.progress()->onThread()) exec_.progress()->releaseWaits();
}

void Communicator::beginCall(bool collective) {
  lastCallNs_ = nowNs();
  if (collective) ++callSeq_;
  ++callSerial_;
  callOpen_ = true;
  callAgreedFailure_ = false;
  callOps_ = 0;
  callAgree_.clear();
}

void Communicator::endCall(fuscoResult_t r, const std::string& why) {
  lastCallNs_ = nowNs();
  if (!callOpen_) return;
  callOpen_ = false;
  callAgree_.clear();
  if (r == fuscoSuccess || callAgreedFailure_ || broken_.load() != fuscoSuccess) return;
  markBroken(r, "rank " + std::to_string(rank_) + " failed in the middle of a call (" + why +
                    "): its peers may have gone on without it, so the communicator is out of step");
}

std::string Communicator::brokenMessage() const {
  std::lock_guard<std::mutex> g(brokenMu_);
  return brokenMsg_;
}

}  // namespace fusco
