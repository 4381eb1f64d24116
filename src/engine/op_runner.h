// The runner of one engine operation (engine.cc: data phase and errors; op_rounds.cc: the
// header and verdict rounds). Internal to the engine layer.
#pragma once

#include <string>
#include <vector>

#include "core/clock.h"
#include "core/log.h"
#include "core/result.h"
#include "engine/communicator.h"
#include "engine/engine.h"
#include "engine/engine_device.h"
#include "engine/engine_wire.h"

namespace fusco {

// FUSCO_SPIN_BEFORE_YIELD (engine.cc): polls of a wait loop before it yields the core.
int64_t paramSpinBeforeYield();
// FUSCO_SHM_DIRECT (engine.cc): 1 writes straight into a peer's arena buffer when it is one.
int64_t paramShmDirect();

// Skew: the pair is in two different calls (or operations): the ranks are out of step.
enum class PairState { Ok, SelfBad, PeerBad, Mismatch, Skew };

struct SendCursor {
  size_t msg = 0, off = 0;
  bool headerSent = false, verdictSent = false;
};
struct RecvCursor {
  size_t msg = 0, off = 0;
  bool headerSeen = false, verdictSeen = false;
};

class OpRunner {
 public:
  OpRunner(Communicator& c, Op& op)
      : c_(c),
        op_(op),
        n_(c.nranks()),
        me_(c.rank()),
        mine_(n_),
        theirs_(n_),
        state_(n_),
        verdicts_(n_),
        sc_(n_),
        rc_(n_),
        involved_(n_, false) {}
  // A host data phase: rounds, data, and the pairs' verdict.
  fuscoResult_t run();
  // A device operation (engine_async.h): rounds, then the kernels' tasks instead of moving data.
  fuscoResult_t resolve(DeviceTasks* out);
  // True when run() failed only because arguments or counts were wrong somewhere: every rank
  // agreed, no data moved, and the communicator stays usable.
  bool failedValidation() const { return failedValidation_; }

 private:
  fuscoResult_t validationError(fuscoResult_t r, const char* fmt, const std::string& a,
                                const std::string& b = "");
  template <typename Step>
  fuscoResult_t loop(const char* phase, Step step);
  fuscoResult_t failPending(fuscoResult_t r, const char* phase, const char* why);
  void buildHeaders();
  fuscoResult_t headerRound();
  void checkPairs();
  void offerSends(int p, PairHeader* h);
  fuscoResult_t verdictRound(Verdict* first);
  fuscoResult_t decideCollective();
  fuscoResult_t decideAgreed();
  fuscoResult_t rounds();
  fuscoResult_t pairVerdict();
  fuscoResult_t dataPhase();
  fuscoResult_t stepSend(int p, bool* progressed);
  fuscoResult_t stepRecv(int p, bool* progressed);
  void stepSelf(bool* progressed);
  bool directTarget(int p, size_t m, RowStream* dst);
  fuscoResult_t protocolError(int p, const char* what);
  bool sendDone(int p) const { return sc_[p].msg >= op_.peers[p].sends.size(); }
  bool recvDone(int p) const { return rc_[p].msg >= op_.peers[p].recvs.size(); }
  bool moves(int p) const { return state_[p] == PairState::Ok; }
  // The transport has not finished sending what this rank posted to p (engine ends an operation
  // only once every such send completed locally).
  bool sendsInFlight(int p) const {
    const PeerConn& pc = c_.conn(p);
    return p != me_ && pc.ops != nullptr && pc.ops->sendsInFlight != nullptr &&
           pc.ops->sendsInFlight(pc.tc, p);
  }
  // The data lives in device memory and moves on the GPU (engine_device.h).
  bool onDevice() const { return (c_.memType() == fuscoMemCuda || c_.hostTwin()) && !op_.hostData; }
  // Still owes this rank something in the current phase (finished peers may exit at will).
  bool pending(int p) const {
    if (!involved_[p]) return false;
    if (!sc_[p].headerSent || !rc_[p].headerSeen) return true;
    if (inVerdict_ && (!sc_[p].verdictSent || !rc_[p].verdictSeen)) return true;
    return inData_ && moves(p) && (!sendDone(p) || !recvDone(p) || sendsInFlight(p));
  }

  Communicator& c_;
  Op& op_;
  int n_, me_;
  std::vector<PairHeader> mine_, theirs_;
  std::vector<PairState> state_;
  std::vector<std::string> pairMsg_;
  std::vector<Verdict> verdicts_;
  std::vector<SendCursor> sc_;
  std::vector<RecvCursor> rc_;
  std::vector<bool> involved_;
  std::vector<int> order_;  // peers in staggered order: me+1, me+2, ...
  bool failedValidation_ = false;
  bool inVerdict_ = false, inData_ = false;
  DeviceOffers offers_;
};

// Runs body(runner) with a runner made for op. Host memory running out anywhere in it (the runner's
// own tables included) fails it like any other error; *validation: it failed validation on every
// rank alike (the communicator stays usable).
template <typename Body>
fuscoResult_t runGuarded(Communicator& c, Op& op, bool* validation, Body body) {
  *validation = false;
  try {
    OpRunner runner(c, op);
    const fuscoResult_t r = body(runner);
    *validation = r != fuscoSuccess && runner.failedValidation();
    return r;
  } catch (const std::bad_alloc&) {
    return FUSCO_FAIL(fuscoSystemError, kEngine, "%s: out of host memory", op.name);
  }
}

// Polls `step` until it reports done. Progress resets the no-progress clock; when nothing moves,
// the loop yields the core, notices aborts and dead peers, and gives up after the timeout.
template <typename Step>
fuscoResult_t OpRunner::loop(const char* phase, Step step) {
  const int64_t timeoutNs = c_.timeoutMs() * 1000000LL;
  const int64_t livenessNs = paramLivenessMs() * 1000000LL;
  const int64_t spin = paramSpinBeforeYield();
  int64_t lastProgress = nowNs(), lastLive = lastProgress, idle = 0;
  uint64_t motion = c_.streamMotion();
  for (;;) {
    bool progressed = false, done = false;
    FUSCO_CHECK(step(&progressed, &done));
    if (done) return fuscoSuccess;
    if (progressed) {
      idle = 0;
      lastProgress = nowNs();
      continue;
    }
    // Pairs this rank is done with may still have bytes in flight that a peer waits for.
    c_.progressTransports();
    if (++idle > spin) sched_yield();
    if ((idle & 15) != 0 && idle <= spin) continue;
    int64_t now = nowNs();
    if (c_.abortRequested())
      return failPending(fuscoInvalidUsage, phase, "aborted (fuscoCommAbort)");
    if (now - lastLive >= livenessNs) {
      lastLive = now;
      // Peers still finishing earlier work on their streams (host twin) are not stuck.
      const uint64_t m = c_.streamMotion();
      if (m != motion) lastProgress = now;
      motion = m;
      for (int p : order_) {
        if (!pending(p)) continue;
        if (c_.checkPeer(p) != fuscoSuccess) {
          std::string why = threadLastError();
          return FUSCO_FAIL(fuscoRemoteError, kEngine, "%s: %s during %s", op_.name, why.c_str(),
                            phase);
        }
      }
    }
    if (now - lastProgress >= timeoutNs)
      return failPending(
          fuscoTimeout, phase,
          ("no progress within the timeout (" + std::to_string(c_.timeoutMs()) + " ms)").c_str());
  }
}

}  // namespace fusco
