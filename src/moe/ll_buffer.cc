// The low-latency buffer (ll_buffer.h): create and destroy, and the calls that run its kernels
// or their host twin.
#include "moe/ll_buffer.h"

#include <cstdio>
#include <cstring>

#include "core/bootstrap.h"
#include "core/cuda_guard.h"
#include "core/log.h"
#include "core/result.h"
#include "device/cuda_rt.h"

namespace fusco {

namespace {

constexpr uint64_t kHookTag = 0x11ull << 56;
// The regions every rank's kernels read words from, in both halves.
std::vector<std::pair<uint64_t, uint64_t>> wordRegions(const ll::Layout& l, const ll::Dims& d) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (uint64_t h = 0; h < 2; ++h) {
    const uint64_t at = h * l.halfBytes;
    out.push_back({at + l.dispCount, uint64_t{d.local} * d.ranks * 8});
    out.push_back({at + l.recvCount, uint64_t{d.local} * 4});
    out.push_back({at + l.combFlag, uint64_t{d.ranks} * 8});
    out.push_back({at + l.dispFreed, uint64_t{d.ranks} * 8});
    out.push_back({at + l.combFreed, uint64_t{d.ranks} * 8});
  }
  return out;
}

// What a dispatch says of the first slot it refused (bad: (t << 8 | k) + 1 from the kernels).
std::string badSlotMessage(const char* fn, uint32_t bad, int numExperts) {
  char msg[256];
  std::snprintf(msg, sizeof(msg),
                "%s: token %u slot %u has an invalid expert id (outside [-1, %d), or an expert the "
                "token chose at a lower slot); that slot moved nothing",
                fn, (bad - 1) >> 8, (bad - 1) & 0xffu, numExperts);
  return msg;
}

fuscoResult_t hostCheckPeer(void* ctx, int peer) {
  return static_cast<Communicator*>(ctx)->checkPeer(peer);
}

// The config fields every rank must pass alike: each sizes the buffer's layout that peers write
// into, so a difference would have them write past it; like every value ranks must pass alike it
// is fuscoInvalidUsage on every rank (docs/API.md, "The collective error rule").
constexpr int kAgreedFields = 4;
constexpr const char* kFieldNames[kAgreedFields] = {"maxTokensPerRank", "hidden", "numExperts",
                                                    "maxTopk"};

std::string configWords(const LlConfig& c) {
  return std::to_string(c.maxTokensPerRank) + " " + std::to_string(c.hidden) + " " +
         std::to_string(c.numExperts) + " " + std::to_string(c.maxTopk);
}

// Every rank's outcome of its checks (all[p]: its config's words, or "-" and its message), the
// same verdict on every rank: the first rank that failed its checks, else the first field in
// which some rank's config differs from rank 0's, named with both values.
fuscoResult_t agreeOnConfig(const Communicator& c, const ArgCheck& a,
                            const std::vector<std::string>& all) {
  if (!a.ok()) return FUSCO_FAIL(a.status, kApi, "%s", a.message.c_str());
  for (int p = 0; p < c.nranks(); ++p)
    if (!all[p].empty() && all[p][0] == '-')
      return FUSCO_FAIL(fuscoRemoteError, kApi, "fuscoLowLatencyCreate failed on rank %d: %s", p,
                        all[p].c_str() + 1);
  long long first[kAgreedFields] = {};
  for (int p = 0; p < c.nranks(); ++p) {
    long long v[kAgreedFields] = {};
    if (std::sscanf(all[p].c_str(), "%lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3]) != 4)
      return FUSCO_FAIL(fuscoRemoteError, kApi,
                        "fuscoLowLatencyCreate: rank %d sent a malformed config", p);
    for (int f = 0; f < kAgreedFields; ++f) {
      if (p == 0) first[f] = v[f];
      if (v[f] != first[f])
        return FUSCO_FAIL(fuscoInvalidUsage, kApi,
                          "fuscoLowLatencyCreate: config->%s differs between ranks: %lld on rank "
                          "0, %lld on rank %d; every rank must pass the same config",
                          kFieldNames[f], first[f], v[f], p);
    }
  }
  return fuscoSuccess;
}

// Every bootstrap message of a create or destroy starts with the step that sent it, so ranks that
// make these calls in different orders are told so, naming the call each made.
constexpr const char* kCreateStep = "create ";
constexpr const char* kMapStep = "map ";
constexpr const char* kDestroyStep = "destroy ";

const char* stepCall(const std::string& msg) {
  if (msg.rfind(kCreateStep, 0) == 0 || msg.rfind(kMapStep, 0) == 0) return "fuscoLowLatencyCreate";
  if (msg.rfind(kDestroyStep, 0) == 0) return "fuscoLowLatencyDestroy";
  return "another call";
}

// All ranks gather (step + mine); every reply must come from the same step. out: each rank's
// message with the step taken off.
fuscoResult_t gatherStep(Communicator& c, const char* step, const std::string& mine,
                         std::vector<std::string>* out) {
  std::vector<std::string> all;
  FUSCO_CHECK(c.bootstrap().allGather(step + mine, &all));
  const std::string tag(step);
  for (int p = 0; p < c.nranks(); ++p) {
    if (all[p].rfind(tag, 0) == 0) continue;
    const char* mineCall = stepCall(tag);
    const fuscoResult_t r = FUSCO_FAIL(
        fuscoInvalidUsage, kApi,
        "%s: rank %d is in %s while rank %d is in %s; every rank must create and destroy its "
        "low-latency buffers in the same order (the communicator cannot be used any more)",
        mineCall, p, stepCall(all[p]), c.rank(), mineCall);
    c.markBroken(r, threadLastError());
    return r;
  }
  out->resize(all.size());
  for (size_t p = 0; p < all.size(); ++p) (*out)[p] = all[p].substr(tag.size());
  return fuscoSuccess;
}

}  // namespace

LowLatency::~LowLatency() {
  // The frees wait for the device: once nothing of the process waits (the comm may be gone).
  CudaSetupWindow window;
  if (device_ && window.open(paramTimeoutMs(), "fuscoLowLatencyDestroy") != fuscoSuccess)
    FUSCO_WARN(kApi, "%s", threadLastError().c_str());
  if (device_) {
    cudaFreeMapped(hostWords_);
    if (peersDev_ != nullptr) cudaFreeDevice(peersDev_);
  } else {
    delete hostWords_;
  }
}

// This rank's buffer with its words zeroed and its state set, before any peer may write it.
fuscoResult_t LowLatency::allocate() {
  dims_.ranks = static_cast<uint32_t>(c_.nranks());
  dims_.local = static_cast<uint32_t>(cfg_.numExperts / c_.nranks());
  dims_.maxTokens = static_cast<uint32_t>(cfg_.maxTokensPerRank);
  dims_.hidden = static_cast<uint32_t>(cfg_.hidden);
  dims_.maxTopk = static_cast<uint32_t>(cfg_.maxTopk);
  layout_ = ll::layoutFor(dims_);
  void* p = nullptr;
  FUSCO_CHECK(c_.memAlloc(layout_.total, &p));
  buf_ = static_cast<char*>(p);
  ll::State st{};
  st.badCode = ll::kNoBad;
  if (device_) {
    void *h = nullptr, *d = nullptr;
    FUSCO_CHECK(cudaAllocMapped(sizeof(ll::HostWords), &h, &d));
    hostWords_ = static_cast<ll::HostWords*>(h);
    hostWordsDev_ = static_cast<ll::HostWords*>(d);
    std::memset(hostWords_, 0, sizeof(ll::HostWords));
    for (const auto& r : wordRegions(layout_, dims_))
      FUSCO_CHECK(cudaZeroSync(buf_ + r.first, r.second));
    return cudaCopySync(buf_ + layout_.state, &st, sizeof(st));
  }
  hostWords_ = hostWordsDev_ = new ll::HostWords();
  for (const auto& r : wordRegions(layout_, dims_)) std::memset(buf_ + r.first, 0, r.second);
  std::memcpy(buf_ + layout_.state, &st, sizeof(st));
  return fuscoSuccess;
}

fuscoResult_t LowLatency::mapPeers(const std::vector<std::string>& tokens) {
  peers_.assign(dims_.ranks, 0);
  for (int p = 0; p < c_.nranks(); ++p) {
    if (p == c_.rank()) {
      peers_[p] = reinterpret_cast<uint64_t>(buf_);
      continue;
    }
    const PeerConn& pc = c_.conn(p);
    void* m = pc.ops == nullptr || pc.ops->peerPointer == nullptr
                  ? nullptr
                  : pc.ops->peerPointer(pc.tc, p, std::strtoull(tokens[p].c_str(), nullptr, 10),
                                        layout_.total);
    if (m == nullptr)
      return FUSCO_FAIL(fuscoInvalidUsage, kApi,
                        "fuscoLowLatencyCreate: rank %d cannot map the buffer of rank %d",
                        c_.rank(), p);
    peers_[p] = reinterpret_cast<uint64_t>(m);
  }
  if (!device_) return fuscoSuccess;
  void* d = nullptr;
  FUSCO_CHECK(cudaAllocDevice(peers_.size() * 8, &d));
  peersDev_ = static_cast<uint64_t*>(d);
  return cudaCopySync(peersDev_, peers_.data(), peers_.size() * 8);
}

// Allocation, the words' reset and the peers' mappings are setup calls (docs/DESIGN.md, "The CUDA
// rules"): each runs in a setup window of its own, closed before the ranks exchange anything. A
// window held across a wait for the peers would hold back the stream waits of every other
// communicator of the process, whose peers may be waiting for this rank meanwhile.
void LowLatency::allocateInWindow(ArgCheck* a) {
  CudaSetupWindow window;
  fuscoResult_t r = c_.setupWindow(&window, "fuscoLowLatencyCreate");
  if (r == fuscoSuccess && allocate() != fuscoSuccess) r = fuscoSystemError;
  if (r == fuscoSuccess) return;
  a->status = r;
  a->message = threadLastError();
}

fuscoResult_t LowLatency::mapPeersInWindow(const std::vector<std::string>& tokens) {
  CudaSetupWindow window;
  FUSCO_CHECK(c_.setupWindow(&window, "fuscoLowLatencyCreate"));
  return mapPeers(tokens);
}

fuscoResult_t LowLatency::create(Communicator& c, const LlConfig& cfg, ArgCheck a,
                                 std::unique_ptr<LowLatency>* out) {
  if (c.nodes().numNodes > 1)
    return FUSCO_FAIL(fuscoInvalidUsage, kApi,
                      "fuscoLowLatencyCreate: every rank must reach every other through mapped "
                      "memory (one node); these %d ranks form %d nodes",
                      c.nranks(), c.nodes().numNodes);
  // A broken comm, or one whose peer died, fails at once, as every other collective call does.
  FUSCO_CHECK(c.checkUsable("fuscoLowLatencyCreate"));
  // The configs first, before anything is allocated or mapped: a rank sized differently would
  // write past its peers' buffers.
  std::vector<std::string> cfgs;
  FUSCO_CHECK(gatherStep(c, kCreateStep, a.ok() ? configWords(cfg) : "-" + a.message, &cfgs));
  FUSCO_CHECK(agreeOnConfig(c, a, cfgs));
  std::unique_ptr<LowLatency> l(new LowLatency(c));
  l->cfg_ = cfg;
  uint64_t token = 0;
  if (a.ok()) l->allocateInWindow(&a);
  for (int p = 0; p < c.nranks() && a.ok(); ++p)
    if (p != c.rank() && !c.regionToken(p, l->buf_, l->layout_.total, &token))
      a.fail("fuscoLowLatencyCreate: rank %d's buffer cannot be mapped by rank %d", c.rank(), p);
  std::vector<std::string> all;
  fuscoResult_t r = gatherStep(c, kMapStep, a.ok() ? std::to_string(token) : "-" + a.message, &all);
  if (r == fuscoSuccess && !a.ok()) r = FUSCO_FAIL(a.status, kApi, "%s", a.message.c_str());
  for (int p = 0; p < c.nranks() && r == fuscoSuccess; ++p)
    if (!all[p].empty() && all[p][0] == '-')
      r = FUSCO_FAIL(fuscoRemoteError, kApi, "fuscoLowLatencyCreate failed on rank %d: %s", p,
                     all[p].c_str() + 1);
  if (r == fuscoSuccess) {
    // Mapping can fail on one rank alone: the ranks compare outcomes once more.
    r = l->mapPeersInWindow(all);
    int failed = -1;
    std::string why;
    const fuscoResult_t g =
        c.agreeOnOutcome(r == fuscoSuccess ? "" : threadLastError(), &failed, &why);
    if (r == fuscoSuccess) r = g;
    if (r == fuscoSuccess && failed >= 0)
      r = FUSCO_FAIL(fuscoRemoteError, kApi, "fuscoLowLatencyCreate failed on rank %d: %s", failed,
                     why.c_str());
  }
  if (r != fuscoSuccess) {
    if (l->buf_ != nullptr) c.memFree(l->buf_);
    return r;
  }
  LowLatency* self = l.get();
  self->number_ = c.nextLowLatencyNumber();  // created alike on every rank: the same number
  if (self->device_) c.addWatch(self, [self] { self->watch(); });
  *out = std::move(l);
  return fuscoSuccess;
}

fuscoResult_t LowLatency::destroy() {
  fuscoResult_t r = fuscoSuccess;
  const bool wasUsable = c_.brokenResult() == fuscoSuccess;
  if (device_) {
    // The watch stays until the device is idle: it releases kernels still waiting on a peer.
    r = c_.useDevice();
    if (r == fuscoSuccess) cudaDeviceSyncQuiet();
    c_.removeWatch(this);
  }
  // No peer writes this buffer once every rank is here (a dead peer fails the barrier at once:
  // nobody writes it either). A broken rank joins too, so no peer waits for it. On a comm that was
  // usable, a rank that never came is an error that breaks it: nobody knows what it still writes.
  std::vector<std::string> all;
  fuscoResult_t g = gatherStep(c_, kDestroyStep, std::to_string(number_), &all);
  if (g == fuscoSuccess && wasUsable) g = checkSameBuffer(all);
  if (g != fuscoSuccess && wasUsable && c_.brokenResult() == fuscoSuccess)
    c_.markBroken(g, "fuscoLowLatencyDestroy: " + threadLastError());
  if (!wasUsable) g = fuscoSuccess;  // the comm's failure was reported by the call that broke it
  const fuscoResult_t f = c_.memFree(buf_);
  return r != fuscoSuccess ? r : g != fuscoSuccess ? g : f;
}

// Each rank's destroy names its buffer by its number on the comm: ranks that destroy different
// buffers (a garbage collector finalizing them in another order on each rank) would free memory a
// peer still writes. Every rank sees the same numbers, so all of them fail alike and the comm
// breaks (destroy marks it) before anything more is written.
fuscoResult_t LowLatency::checkSameBuffer(const std::vector<std::string>& numbers) const {
  const std::string mine = std::to_string(number_);
  for (int p = 0; p < c_.nranks(); ++p) {
    if (numbers[p] == mine) continue;
    return FUSCO_FAIL(fuscoInvalidUsage, kApi,
                      "fuscoLowLatencyDestroy: rank %d destroys low-latency buffer #%s while rank "
                      "%d destroys buffer #%s (buffers are numbered in the order the comm made "
                      "them); every rank must destroy the same buffer in the same call (the "
                      "communicator cannot be used any more)",
                      p, numbers[p].c_str(), c_.rank(), mine.c_str());
  }
  return fuscoSuccess;
}

ll::Args LowLatency::argsFor(const LlCall& call) const {
  ll::Args a;
  a.d = dims_;
  a.l = layout_;
  a.rank = static_cast<uint32_t>(c_.rank());
  a.half = static_cast<uint32_t>(call.half);
  a.numTokens = static_cast<uint32_t>(call.numTokens);
  a.topk = static_cast<uint32_t>(call.topk);
  a.numExperts = static_cast<uint32_t>(cfg_.numExperts);
  a.fp8 = call.format == FUSCO_LL_FP8 ? 1 : 0;
  a.self = buf_;
  a.peers = device_ ? peersDev_ : peers_.data();
  a.x = static_cast<const uint16_t*>(call.x);
  a.topkIdx = call.topkIdx;
  a.weights = call.weights;
  a.expertOut = static_cast<const uint16_t*>(call.expertOut);
  a.out = static_cast<uint16_t*>(call.out);
  a.host = hostWordsDev_;
  a.timeoutNs = static_cast<uint64_t>(c_.timeoutMs()) * 1000000ull;
  return a;
}

fuscoResult_t LowLatency::run(const ll::Args& a, uint32_t phases, void* stream) {
  FUSCO_CHECK(c_.brokenResult() == fuscoSuccess
                  ? fuscoSuccess
                  : FUSCO_FAIL(c_.brokenResult(), kApi, "%s", c_.brokenMessage().c_str()));
  if (device_) {
    const fuscoResult_t r = launch(a, phases, stream);
    // Peers wait for this launch's words: a rank that cannot launch cannot stay in step.
    if (r != fuscoSuccess) c_.markBroken(r, threadLastError());
    return r;
  }
  ll::HostWait w;
  w.check = hostCheckPeer;
  w.ctx = &c_;
  w.timeoutMs = c_.timeoutMs();
  w.livenessMs = paramLivenessMs();
  w.abort = c_.abortFlag();
  const fuscoResult_t r = ll::hostRun(a, phases, w);
  if (r != fuscoSuccess) c_.markBroken(r, threadLastError());
  return r;
}

// The kernel on `stream` after the last launch on its half (on whatever stream that was).
fuscoResult_t LowLatency::launch(const ll::Args& a, uint32_t phases, void* stream) {
  FUSCO_CHECK(c_.useDevice());
  bool capturing = false;
  FUSCO_CHECK(cudaStreamCapturing(stream, &capturing));
  // A wait crosses from eager work into a capture (or back) nowhere: each graph orders itself.
  if (lastCaptured_[a.half] == capturing) FUSCO_CHECK(lastOnHalf_[a.half].waitOn(stream));
  FUSCO_CHECK(ll::deviceRun(a, phases, stream));
  FUSCO_CHECK(lastOnHalf_[a.half].record(stream));
  lastCaptured_[a.half] = capturing;
  return fuscoSuccess;
}

fuscoResult_t LowLatency::checkNoHook(int h, uint32_t phases, const char* fn) const {
  for (const auto& k : hooks_)
    if (static_cast<int>(k.second.first.half) == h && (k.second.second & phases) != 0)
      return FUSCO_FAIL(fuscoInvalidUsage, kApi,
                        "%s: buffer %d still waits for fuscoLowLatencyRecvHook(%llu) of an "
                        "earlier call; complete that receive first",
                        fn, h, static_cast<unsigned long long>(k.first));
  return fuscoSuccess;
}

// Host comms: an invalid id the dispatch skipped is this call's error.
fuscoResult_t LowLatency::reportHostWords(const char* fn) {
  const uint32_t bad = __atomic_exchange_n(&hostWords_->bad, 0u, __ATOMIC_ACQ_REL);
  if (bad == 0) return fuscoSuccess;
  return FUSCO_FAIL(fuscoInvalidArgument, kApi, "%s",
                    badSlotMessage(fn, bad, cfg_.numExperts).c_str());
}

// CUDA comms: what the kernels left in the host words, as the comm's errors.
void LowLatency::watch() {
  volatile ll::HostWords* w = hostWords_;
  if (c_.brokenResult() != fuscoSuccess) w->release = 1;
  if (const uint32_t bad = __atomic_exchange_n(&hostWords_->bad, 0u, __ATOMIC_ACQ_REL)) {
    c_.setAsyncError(fuscoInvalidArgument,
                     badSlotMessage("fuscoLowLatencyDispatch", bad, cfg_.numExperts),
                     fuscoInvalidArgument);
  }
  if (const uint32_t peer = __atomic_exchange_n(&hostWords_->timedOut, 0u, __ATOMIC_ACQ_REL)) {
    const uint32_t ph = w->phase;
    c_.markBroken(fuscoTimeout, "low-latency " + std::string(ll::phaseName(ph)) +
                                    ": waited more than " + std::to_string(c_.timeoutMs()) +
                                    " ms for rank " + std::to_string(peer - 1));
    w->release = 1;
  }
}

void LowLatency::noteOut(int h, const void* out) {
  if (halfOut_[h] == out) return;
  const void** old = supersededOut_[h];
  for (int i = 0; i < kSuperseded; ++i)
    if (old[i] == out) old[i] = nullptr;  // current again
  if (halfOut_[h] != nullptr) {
    for (int i = kSuperseded - 1; i > 0; --i) old[i] = old[i - 1];
    old[0] = halfOut_[h];
  }
  halfOut_[h] = out;
}

bool LowLatency::supersededOn(int h, const fuscoLowLatencyDispatch_t* d) const {
  if (d == halfOut_[h]) return false;
  for (const void* p : supersededOut_[h])
    if (p == d) return true;
  return false;
}

fuscoResult_t LowLatency::dispatch(const LlCall& call, fuscoLowLatencyDispatch_t* out,
                                   void* stream) {
  LlCall cl = call;
  cl.half = nextHalf();
  FUSCO_CHECK(checkNoHook(cl.half, ll::bit(ll::kDispatchRecv), "fuscoLowLatencyDispatch"));
  ++dispatches_;
  halfTokens_[cl.half] = cl.numTokens;
  halfTopk_[cl.half] = cl.topk;
  halfHook_[cl.half] = 0;
  const ll::Args a = argsFor(cl);
  const uint32_t send = ll::bit(ll::kDispatchSend), recv = ll::bit(ll::kDispatchRecv);
  FUSCO_CHECK(run(a, cl.hook ? send : send | recv, stream));
  fuscoLowLatencyDispatch_t o{};
  if (cl.hook) {
    o.hook = kHookTag | ++nextHook_;
    hooks_[o.hook] = {a, recv};
  }
  halfHook_[cl.half] = o.hook;
  noteOut(cl.half, out);
  char* half = buf_ + static_cast<uint64_t>(cl.half) * layout_.halfBytes;
  o.buffer = cl.half;
  o.format = cl.format;
  o.recvX = half + layout_.packX;
  o.recvScales =
      cl.format == FUSCO_LL_FP8 ? reinterpret_cast<float*>(half + layout_.packScales) : nullptr;
  o.recvCount = reinterpret_cast<int*>(half + layout_.recvCount);
  o.recvLayout = reinterpret_cast<int64_t*>(half + layout_.recvLayout);
  o.recvSrcToken = reinterpret_cast<int*>(half + layout_.packToken);
  *out = o;
  return device_ ? fuscoSuccess : reportHostWords("fuscoLowLatencyDispatch");
}

fuscoResult_t LowLatency::combine(const LlCall& call, unsigned long long* hook, void* stream) {
  // Combine reads what its dispatch received, and a half holds one combine's rows at a time.
  FUSCO_CHECK(checkNoHook(call.half, ll::bit(ll::kDispatchRecv) | ll::bit(ll::kCombineRecv),
                          "fuscoLowLatencyCombine"));
  const ll::Args a = argsFor(call);
  const uint32_t send = ll::bit(ll::kCombineSend), recv = ll::bit(ll::kCombineRecv);
  FUSCO_CHECK(run(a, call.hook ? send : send | recv, stream));
  if (call.hook) {
    *hook = kHookTag | ++nextHook_;
    hooks_[*hook] = {a, recv};
  } else if (hook != nullptr) {
    *hook = 0;
  }
  return fuscoSuccess;
}

fuscoResult_t LowLatency::recvHook(unsigned long long hook, void* stream) {
  auto it = hooks_.find(hook);
  if (it == hooks_.end())
    return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                      "fuscoLowLatencyRecvHook: %llu is not a pending hook of this buffer (never "
                      "returned, or completed already)",
                      hook);
  const auto pending = it->second;
  hooks_.erase(it);
  return run(pending.first, pending.second, stream);
}

}  // namespace fusco
