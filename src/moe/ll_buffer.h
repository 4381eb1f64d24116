// A low-latency buffer (docs/API.md, "Low-latency dispatch and combine"; docs/DESIGN.md,
// "Low-latency mode"): this rank's buffer of ll_steps.h's layout in the comm's peer-mappable
// memory, every peer's buffer mapped here, and the calls that run the kernels (CUDA comms) or
// their host twin (host comms) on it. No host round with the peers after create: the kernels
// signal each other through the buffers' words.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/arg_check.h"
#include "device/cuda_rt.h"
#include "device/ll_ops.h"
#include "engine/communicator.h"
#include "fusco.h"

namespace fusco {

struct LlConfig {
  int maxTokensPerRank = 0, hidden = 0, numExperts = 0, maxTopk = 0;
};

// The arguments of a dispatch or combine call (what a receive hook runs later).
struct LlCall {
  const void* x = nullptr;
  const void* expertOut = nullptr;
  const int64_t* topkIdx = nullptr;
  const float* weights = nullptr;
  void* out = nullptr;
  int numTokens = 0, topk = 0, format = FUSCO_LL_BF16, half = 0;
  bool hook = false;
};

class LowLatency {
 public:
  ~LowLatency();
  // Collective: checks cfg (a on this rank) and that every rank passed the same, then allocates
  // and maps; every rank fails alike, before anything is allocated when the configs differ.
  static fuscoResult_t create(Communicator& c, const LlConfig& cfg, ArgCheck a,
                              std::unique_ptr<LowLatency>* out);
  // Collective: the calls on every rank are done, then the memory goes.
  fuscoResult_t destroy();

  fuscoResult_t dispatch(const LlCall& call, fuscoLowLatencyDispatch_t* out, void* stream);
  fuscoResult_t combine(const LlCall& call, unsigned long long* hook, void* stream);
  fuscoResult_t recvHook(unsigned long long hook, void* stream);

  const LlConfig& config() const { return cfg_; }
  int nextHalf() const { return static_cast<int>(dispatches_ % 2); }
  // The numTokens and topk of the last dispatch on half h (-1: none yet).
  int tokensOn(int h) const { return halfTokens_[h]; }
  int topkOn(int h) const { return halfTopk_[h]; }
  // The hook of the last dispatch on half h (0: none, or made without FUSCO_LL_RECV_HOOK): the
  // one field that tells a dispatch from the half's later ones, so a stale combine is refused.
  unsigned long long hookOn(int h) const { return halfHook_[h]; }
  // Whether `d` is the very output struct of a dispatch on half h that a later dispatch there
  // superseded (the structs of two dispatches without hooks are equal byte for byte, but not at
  // one address unless the caller reused it, which then holds the later dispatch).
  bool supersededOn(int h, const fuscoLowLatencyDispatch_t* d) const;

 private:
  explicit LowLatency(Communicator& c) : c_(c), device_(c.memType() == fuscoMemCuda) {}
  fuscoResult_t allocate();
  void allocateInWindow(ArgCheck* a);  // a failure goes into *a, for the peers to hear of
  fuscoResult_t mapPeers(const std::vector<std::string>& tokens);
  fuscoResult_t mapPeersInWindow(const std::vector<std::string>& tokens);
  // fuscoInvalidUsage naming both buffers unless every rank's destroy names this one.
  fuscoResult_t checkSameBuffer(const std::vector<std::string>& numbers) const;
  ll::Args argsFor(const LlCall& call) const;
  fuscoResult_t run(const ll::Args& a, uint32_t phases, void* stream);
  fuscoResult_t launch(const ll::Args& a, uint32_t phases, void* stream);
  // fuscoInvalidUsage when half h has a pending hook of a phase in `phases` (its receive first).
  fuscoResult_t checkNoHook(int h, uint32_t phases, const char* fn) const;
  fuscoResult_t reportHostWords(const char* fn);
  void watch();

  Communicator& c_;  // not used by the destructor (the comm may be gone by then)
  const bool device_;
  LlConfig cfg_;
  uint64_t number_ =
      0;  // this buffer's creation number on the comm (1, 2, ...), equal on every rank
  ll::Dims dims_;
  ll::Layout layout_;
  char* buf_ = nullptr;
  ll::HostWords* hostWords_ = nullptr;     // this process's address
  ll::HostWords* hostWordsDev_ = nullptr;  // the kernels' address (host comms: the same)
  std::vector<uint64_t> peers_;            // every rank's buffer as mapped here
  uint64_t* peersDev_ = nullptr;           // the same, in device memory (CUDA comms)
  uint64_t dispatches_ = 0;
  int halfTokens_[2] = {-1, -1}, halfTopk_[2] = {-1, -1};
  unsigned long long halfHook_[2] = {0, 0};
  // The output struct of each half's last dispatch, and of the few before it (most recent first).
  static constexpr int kSuperseded = 8;
  void noteOut(int h, const void* out);
  const void* halfOut_[2] = {nullptr, nullptr};
  const void* supersededOut_[2][kSuperseded] = {};
  uint64_t nextHook_ = 0;
  std::map<uint64_t, std::pair<ll::Args, uint32_t>> hooks_;  // hook -> (arguments, phase bits)
  // CUDA comms: the last launch on each half, which the next one (on any stream) waits for, so
  // a hook follows its send and the next call on the half follows the hook.
  StreamEvent lastOnHalf_[2];
  bool lastCaptured_[2] = {false, false};
};

}  // namespace fusco
