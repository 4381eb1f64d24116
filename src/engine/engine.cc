#include "engine/engine.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "core/clock.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/params.h"
#include "core/result.h"
#include "engine/engine_device.h"
#include "engine/engine_wire.h"

namespace fusco {

FUSCO_PARAM_INT(SpinBeforeYield, "FUSCO_SPIN_BEFORE_YIELD", 64, 0, INT32_MAX,
                "polls of a wait loop before it yields the core to other processes");
FUSCO_PARAM_INT(
    ShmDirect, "FUSCO_SHM_DIRECT", 1, 0, 1,
    "1: write straight into a peer's arena buffer when it is one (one copy); 0: always stage");

namespace {

enum class PairState { Ok, SelfBad, PeerBad, Mismatch };

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
      : c_(c), op_(op), n_(c.nranks()), me_(c.rank()), mine_(n_), theirs_(n_), state_(n_),
        verdicts_(n_), sc_(n_), rc_(n_), involved_(n_, false) {}
  fuscoResult_t run();
  // True when run() failed only because arguments or counts were wrong somewhere: every rank
  // agreed, no data moved, and the communicator stays usable.
  bool failedValidation() const { return failedValidation_; }

 private:
  fuscoResult_t validationError(fuscoResult_t r, const char* fmt, const std::string& a,
                                const std::string& b = "");
  template <typename Step> fuscoResult_t loop(const char* phase, Step step);
  fuscoResult_t failPending(fuscoResult_t r, const char* phase, const char* why);
  void buildHeaders();
  fuscoResult_t headerRound();
  void checkPairs();
  void offerSends(int p, PairHeader* h);
  fuscoResult_t verdictRound(Verdict* first);
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
    return p != me_ && pc.ops != nullptr && pc.ops->sendsInFlight != nullptr && pc.ops->sendsInFlight(pc.tc, p);
  }
  // The data lives in device memory and moves on the GPU (engine_device.h).
  bool onDevice() const { return c_.memType() == fuscoMemCuda && !op_.hostData; }
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

fuscoResult_t OpRunner::validationError(fuscoResult_t r, const char* fmt, const std::string& a,
                                        const std::string& b) {
  failedValidation_ = true;
  return FUSCO_FAIL(r, kApi, fmt, a.c_str(), b.c_str());
}

// Polls `step` until it reports done. Progress resets the no-progress clock; when nothing moves,
// the loop yields the core, notices aborts and dead peers, and gives up after the timeout.
template <typename Step>
fuscoResult_t OpRunner::loop(const char* phase, Step step) {
  const int64_t timeoutNs = c_.timeoutMs() * 1000000LL;
  const int64_t livenessNs = paramLivenessMs() * 1000000LL;
  const int64_t spin = paramSpinBeforeYield();
  int64_t lastProgress = nowNs(), lastLive = lastProgress, idle = 0;
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
      return failPending(fuscoInvalidUsage, phase, "the communicator was aborted");
    if (now - lastLive >= livenessNs) {
      lastLive = now;
      for (int p : order_) {
        if (!pending(p) || c_.conn(p).ops == nullptr) continue;
        if (c_.conn(p).ops->checkPeer(c_.conn(p).tc, p) != fuscoSuccess) {
          std::string why = threadLastError();
          return FUSCO_FAIL(fuscoRemoteError, kEngine, "%s: %s during %s", op_.name, why.c_str(), phase);
        }
      }
    }
    if (now - lastProgress >= timeoutNs)
      return failPending(fuscoTimeout, phase, "no progress within the timeout");
  }
}

fuscoResult_t OpRunner::failPending(fuscoResult_t r, const char* phase, const char* why) {
  std::string waiting;
  for (int p : order_)
    if (pending(p)) waiting += (waiting.empty() ? "" : ",") + std::to_string(p);
  // Where each unfinished pair stands (message index and offset each way), for the trace log.
  if (inData_) {
    for (int p = 0; p < n_; ++p) {
      if (p != me_ && !pending(p)) continue;
      if (p == me_ && sendDone(me_)) continue;
      FUSCO_TRACE(kEngine, "%s: rank %d: send message %zu/%zu at byte %zu, receive %zu/%zu at byte %zu",
                  op_.name, p, sc_[p].msg, op_.peers[p].sends.size(), sc_[p].off, rc_[p].msg,
                  op_.peers[p].recvs.size(), rc_[p].off);
    }
  }
  return FUSCO_FAIL(r, kEngine, "%s: %s (%lld ms) during %s; waiting for rank(s) %s", op_.name,
                    why, static_cast<long long>(c_.timeoutMs()), phase,
                    waiting.empty() ? "none" : waiting.c_str());
}

fuscoResult_t OpRunner::protocolError(int p, const char* what) {
  return FUSCO_FAIL(fuscoRemoteError, kEngine,
                    "%s: rank %d sent %s; the ranks are out of step (different calls?)", op_.name,
                    p, what);
}

void OpRunner::buildHeaders() {
  const bool direct = paramShmDirect() != 0;
  for (int p = 0; p < n_; ++p) {
    if (p == me_ || (!op_.collective && op_.peers[p].empty())) continue;
    involved_[p] = true;
    PairHeader& h = mine_[p];
    h.kind = op_.kind;
    h.seq = c_.nextPairSeq(p);
    h.status = op_.argStatus;
    for (const auto& s : op_.peers[p].sends) h.sendBytes.push_back(s.bytes());
    for (const auto& r : op_.peers[p].recvs) {
      uint64_t token = kStagedToken;
      const size_t extent = r.extentBytes();
      if (direct && !op_.pullRun && op_.argStatus == fuscoSuccess && r.bytes() > 0 && extent > 0 &&
          (r.contiguous() || r.layoutShared) && !c_.regionToken(p, r.base, extent, &token))
        token = kStagedToken;
      h.recvBytes.push_back(r.bytes());
      h.recvTokens.push_back(token);
      h.recvExtents.push_back(r.contiguous() ? extent : (extent | kLayoutSharedBit));
    }
    if (op_.pullRun && op_.argStatus == fuscoSuccess) offerSends(p, &h);
  }
  for (int i = 1; i < n_; ++i) order_.push_back((me_ + i) % n_);
  // The GPU path offers every receive buffer to its sender: in place, or a staging area.
  if (onDevice() && !op_.pullRun && !op_.validateOnly && op_.argStatus == fuscoSuccess) {
    fuscoResult_t r = deviceOffers(c_, op_, involved_, &mine_, &offers_);
    if (r != fuscoSuccess) {
      op_.argStatus = r;
      op_.argError = threadLastError();
    }
  }
  // A header must fit one slot. If one does not, this rank's call is unusable: every peer gets a
  // short header saying so, decided before any header leaves.
  for (int p = 0; p < n_; ++p) {
    const PairHeader& h = mine_[p];
    if (!involved_[p] || encodedHeaderBytes(h) <= c_.chunkBytes()) continue;
    if (op_.argStatus == fuscoSuccess) {
      op_.argStatus = fuscoInvalidArgument;
      op_.argError = std::string(op_.name) + ": too many messages to rank " + std::to_string(p) +
                     " in one call for a " + std::to_string(c_.chunkBytes()) +
                     "-byte slot (raise FUSCO_CHUNK_BYTES)";
    }
  }
  if (op_.argStatus == fuscoSuccess) return;
  for (auto& h : mine_) {
    h.status = op_.argStatus;
    h.sendBytes.clear();
    h.recvBytes.clear();
    h.recvTokens.clear();
    h.recvExtents.clear();
    h.sendTokens.clear();
    h.sendExtents.clear();
  }
}

// A pull operation: every send stream's buffer, offered to its receiver (which reads it). Pull
// operations run on the GPU only, with one message per pair.
void OpRunner::offerSends(int p, PairHeader* h) {
  const char* why = !onDevice() ? "runs on the GPU only" : op_.peers[p].sends.size() > 1 || op_.peers[p].recvs.size() > 1
                                                              ? "has one message per pair"
                                                              : nullptr;
  if (why != nullptr) {
    op_.argStatus = fuscoInternalError;
    op_.argError = std::string(op_.name) + ": a pull operation " + why;
    return;
  }
  for (const auto& s : op_.peers[p].sends) {
    uint64_t token = kStagedToken;
    const size_t extent = s.extentBytes();
    if (s.bytes() > 0 && (extent < s.bytes() || !c_.regionToken(p, s.base, extent, &token))) {
      op_.argStatus = fuscoInternalError;
      op_.argError = std::string(op_.name) + ": a buffer rank " + std::to_string(p) +
                     " reads cannot be offered to it (not mappable by its peers)";
      return;
    }
    h->sendTokens.push_back(token);
    h->sendExtents.push_back(extent);
  }
}

fuscoResult_t OpRunner::headerRound() {
  return loop("the header exchange", [&](bool* progressed, bool* done) -> fuscoResult_t {
    *done = true;
    for (int p : order_) {
      if (!involved_[p]) continue;
      const PeerConn& pc = c_.conn(p);
      if (!sc_[p].headerSent) {
        void* buf;
        size_t cap, len;
        FUSCO_CHECK(pc.ops->sendAcquire(pc.tc, p, &buf, &cap));
        if (buf != nullptr) {
          if (!encodeHeader(mine_[p], buf, cap, &len))
            return FUSCO_FAIL(fuscoInternalError, kEngine, "%s: call header does not fit a slot", op_.name);
          if (faultCorruptHeaders()) faultCorruptBytes(buf, len);  // FUSCO_FAULT corrupt-header
          FUSCO_CHECK(pc.ops->sendPost(pc.tc, p, kTagHeader, len));
          sc_[p].headerSent = *progressed = true;
        }
      }
      if (!rc_[p].headerSeen) {
        const void* buf;
        size_t len;
        uint32_t tag;
        FUSCO_CHECK(pc.ops->recvPoll(pc.tc, p, &buf, &len, &tag));
        if (buf != nullptr) {
          if (tag != kTagHeader || !decodeHeader(buf, len, &theirs_[p]))
            return protocolError(p, "an unexpected message instead of a call header");
          FUSCO_CHECK(pc.ops->recvRelease(pc.tc, p));
          rc_[p].headerSeen = *progressed = true;
        }
      }
      *done = *done && sc_[p].headerSent && rc_[p].headerSeen;
    }
    return fuscoSuccess;
  });
}

// Both ranks of a pair reach the same conclusion from the same two headers.
void OpRunner::checkPairs() {
  pairMsg_.assign(n_, "");
  for (int p = 0; p < n_; ++p) {
    if (p == me_) {
      const PeerWork& w = op_.peers[p];
      bool same = w.sends.size() == w.recvs.size();
      for (size_t i = 0; same && i < w.sends.size(); ++i) same = w.sends[i].bytes() == w.recvs[i].bytes();
      state_[p] = op_.argStatus != fuscoSuccess ? PairState::SelfBad
                  : same ? PairState::Ok : PairState::Mismatch;
      if (!same) pairMsg_[p] = "what rank " + std::to_string(me_) + " sends to itself does not match what it receives from itself";
      continue;
    }
    if (!involved_[p]) { state_[p] = PairState::Ok; continue; }
    const PairHeader &m = mine_[p], &t = theirs_[p];
    if (t.kind != m.kind || t.seq != m.seq) {
      state_[p] = PairState::Mismatch;
      pairMsg_[p] = "rank " + std::to_string(p) + " is in a different call (call #" +
                    std::to_string(t.seq) + " of kind " + std::to_string((int)t.kind) + ", this rank: #" +
                    std::to_string(m.seq) + " of kind " + std::to_string((int)m.kind) + ")";
    } else if (m.status != fuscoSuccess) {
      state_[p] = PairState::SelfBad;
    } else if (t.status != fuscoSuccess) {
      state_[p] = PairState::PeerBad;
      pairMsg_[p] = "rank " + std::to_string(p) + " passed invalid arguments";
    } else if (m.sendBytes != t.recvBytes || m.recvBytes != t.sendBytes) {
      state_[p] = PairState::Mismatch;
      auto str = [](const std::vector<uint64_t>& v) {
        std::string s;
        for (size_t i = 0; i < v.size() && i < 4; ++i) s += (i ? "," : "") + std::to_string(v[i]);
        return s + (v.size() > 4 ? ",..." : "") + " (" + std::to_string(v.size()) + " messages)";
      };
      pairMsg_[p] = "byte counts disagree with rank " + std::to_string(p) + ": this rank sends " +
                    str(m.sendBytes) + " and expects " + str(m.recvBytes) + "; rank " +
                    std::to_string(p) + " expects " + str(t.recvBytes) + " and sends " + str(t.sendBytes);
    } else if (op_.pullRun && t.sendTokens.size() != t.sendBytes.size()) {
      state_[p] = PairState::Mismatch;
      pairMsg_[p] = "rank " + std::to_string(p) + " offered no buffer to read in a pull operation";
    } else {
      state_[p] = PairState::Ok;
    }
  }
}

fuscoResult_t OpRunner::verdictRound(Verdict* first) {
  Verdict& v = verdicts_[me_];
  v.status = fuscoSuccess;
  if (op_.argStatus != fuscoSuccess) {
    v.status = op_.argStatus;
    v.culprit = me_;
    v.message = op_.argError;
  } else {
    for (int p = 0; p < n_; ++p) {
      if (state_[p] != PairState::Mismatch) continue;
      v.status = fuscoInvalidUsage;
      v.culprit = me_;
      v.message = pairMsg_[p];
      break;
    }
  }
  inVerdict_ = true;
  FUSCO_CHECK(loop("the verdict exchange", [&](bool* progressed, bool* done) -> fuscoResult_t {
    *done = true;
    for (int p : order_) {
      const PeerConn& pc = c_.conn(p);
      if (!sc_[p].verdictSent) {
        void* buf;
        size_t cap, len;
        FUSCO_CHECK(pc.ops->sendAcquire(pc.tc, p, &buf, &cap));
        if (buf != nullptr) {
          encodeVerdict(v, buf, cap, &len);
          FUSCO_CHECK(pc.ops->sendPost(pc.tc, p, kTagVerdict, len));
          sc_[p].verdictSent = *progressed = true;
        }
      }
      if (!rc_[p].verdictSeen) {
        const void* buf;
        size_t len;
        uint32_t tag;
        FUSCO_CHECK(pc.ops->recvPoll(pc.tc, p, &buf, &len, &tag));
        if (buf != nullptr) {
          if (tag != kTagVerdict || !decodeVerdict(buf, len, &verdicts_[p]))
            return protocolError(p, "an unexpected message instead of a verdict");
          FUSCO_CHECK(pc.ops->recvRelease(pc.tc, p));
          rc_[p].verdictSeen = *progressed = true;
        }
      }
      *done = *done && sc_[p].verdictSent && rc_[p].verdictSeen;
    }
    return fuscoSuccess;
  }));
  *first = Verdict();
  for (int r = 0; r < n_; ++r)
    if (verdicts_[r].status != fuscoSuccess) { *first = verdicts_[r]; break; }
  return fuscoSuccess;
}

fuscoResult_t OpRunner::stepSend(int p, bool* progressed) {
  const PeerConn& pc = c_.conn(p);
  auto& cur = sc_[p];
  const auto& sends = op_.peers[p].sends;
  for (int budget = c_.depth(); budget > 0 && cur.msg < sends.size();) {
    const RowStream& s = sends[cur.msg];
    const size_t bytes = s.bytes();
    if (bytes == 0) { ++cur.msg; continue; }
    // A forwarded stream moves only what has landed; the rest waits for a later step.
    const size_t avail = s.readyBytes();
    if (cur.off < bytes && cur.off >= avail) return fuscoSuccess;
    RowStream dst;
    const bool direct = directTarget(p, cur.msg, &dst);
    if (direct && cur.off == 0)
      FUSCO_TRACE(kEngine, "%s: message %zu (%zu B) to rank %d written directly into its buffer",
                  op_.name, cur.msg, bytes, p);
    if (direct && cur.off < bytes) {
      // One copy: source rows straight into the receiver's final rows, a slice at a time so
      // this rank keeps serving its other peers.
      size_t len = std::min(c_.chunkBytes(), avail - cur.off);
      streamCopy(s, cur.off, dst, cur.off, len);
      cur.off += len;
      *progressed = true;
      --budget;
      continue;
    }
    void* buf;
    size_t cap;
    FUSCO_CHECK(pc.ops->sendAcquire(pc.tc, p, &buf, &cap));
    if (buf == nullptr) return fuscoSuccess;
    if (direct) {
      FUSCO_CHECK(pc.ops->sendPost(pc.tc, p, kTagDirectDone, 0));
      ++cur.msg, cur.off = 0;
    } else {
      size_t len = std::min(cap, avail - cur.off);
      gatherBytes(s, cur.off, len, buf);
      FUSCO_CHECK(pc.ops->sendPost(pc.tc, p, kTagData, len));
      cur.off += len;
      if (cur.off == bytes) ++cur.msg, cur.off = 0;
    }
    *progressed = true;
    --budget;
  }
  return fuscoSuccess;
}

// Where message m to peer p can be written directly: the receiver offered its buffer and this
// rank can map it. The destination is the receiver's contiguous buffer, or its shared layout.
bool OpRunner::directTarget(int p, size_t m, RowStream* dst) {
  const PeerConn& pc = c_.conn(p);
  const PairHeader& t = theirs_[p];
  if (t.recvTokens[m] == kStagedToken || pc.ops->peerPointer == nullptr) return false;
  const auto& remote = op_.peers[p].remoteDst;
  if (t.recvExtents[m] & kLayoutSharedBit) {
    if (remote.size() <= m || remote[m].nrows == 0) return false;
    void* base = pc.ops->peerPointer(pc.tc, p, t.recvTokens[m], t.recvExtents[m] & ~kLayoutSharedBit);
    if (base == nullptr) return false;
    *dst = remote[m];
    dst->base = static_cast<char*>(base);
    return true;
  }
  if (t.recvExtents[m] != t.recvBytes[m]) return false;  // receiver is not contiguous
  void* base = pc.ops->peerPointer(pc.tc, p, t.recvTokens[m], t.recvBytes[m]);
  if (base == nullptr) return false;
  *dst = RowStream::flat(base, t.recvBytes[m]);
  return true;
}

fuscoResult_t OpRunner::stepRecv(int p, bool* progressed) {
  const PeerConn& pc = c_.conn(p);
  auto& cur = rc_[p];
  const auto& recvs = op_.peers[p].recvs;
  for (int budget = c_.depth(); budget > 0 && cur.msg < recvs.size();) {
    const RowStream& r = recvs[cur.msg];
    const size_t bytes = r.bytes();
    if (bytes == 0) { ++cur.msg; continue; }
    const void* buf;
    size_t len;
    uint32_t tag;
    FUSCO_CHECK(pc.ops->recvPoll(pc.tc, p, &buf, &len, &tag));
    if (buf == nullptr) return fuscoSuccess;
    if (tag == kTagDirectDone) {
      if (mine_[p].recvTokens[cur.msg] == kStagedToken || cur.off != 0)
        return protocolError(p, "a direct-write completion for a staged message");
      if (r.landed != nullptr) *r.landed = bytes;
      ++cur.msg;
    } else if (tag == kTagData) {
      if (len == 0 || len > bytes - cur.off) return protocolError(p, "a slice larger than the message");
      scatterBytes(r, cur.off, len, buf);
      cur.off += len;
      if (r.landed != nullptr) *r.landed = cur.off;
      if (cur.off == bytes) ++cur.msg, cur.off = 0;
    } else {
      return protocolError(p, "an unexpected message in the data phase");
    }
    FUSCO_CHECK(pc.ops->recvRelease(pc.tc, p));
    *progressed = true;
    --budget;
  }
  return fuscoSuccess;
}

// Copies to self in message order, each as far as its source has landed (forwarded rows that
// this rank keeps wait for them like its peers do).
void OpRunner::stepSelf(bool* progressed) {
  const PeerWork& w = op_.peers[me_];
  auto& cur = sc_[me_];
  while (cur.msg < w.sends.size()) {
    const RowStream &s = w.sends[cur.msg], &r = w.recvs[cur.msg];
    const size_t avail = s.readyBytes();
    if (cur.off < avail) {
      streamCopy(s, cur.off, r, cur.off, avail - cur.off);
      cur.off = avail;
      if (r.landed != nullptr) *r.landed = avail;
      *progressed = true;
    }
    if (cur.off < s.bytes()) return;
    ++cur.msg, cur.off = 0;
  }
}

fuscoResult_t OpRunner::dataPhase() {
  bool selfProgress = false;
  if (moves(me_)) stepSelf(&selfProgress);
  inVerdict_ = false;
  inData_ = true;
  return loop("the data transfer", [&](bool* progressed, bool* done) -> fuscoResult_t {
    *done = true;
    if (moves(me_) && !sendDone(me_)) {
      stepSelf(progressed);
      *done = sendDone(me_);
    }
    for (int p : order_) {
      if (!involved_[p] || !moves(p)) continue;
      if (!sendDone(p)) FUSCO_CHECK(stepSend(p, progressed));
      if (!recvDone(p)) FUSCO_CHECK(stepRecv(p, progressed));
      *done = *done && sendDone(p) && recvDone(p) && !sendsInFlight(p);
    }
    return fuscoSuccess;
  });
}

fuscoResult_t OpRunner::run() {
  buildHeaders();
  FUSCO_CHECK(headerRound());
  checkPairs();
  if (op_.collective && !op_.agreed && n_ > 1) {
    Verdict first;
    FUSCO_CHECK(verdictRound(&first));
    if (op_.argStatus != fuscoSuccess) return validationError(op_.argStatus, "%s", op_.argError);
    if (first.status != fuscoSuccess) {
      for (int p = 0; p < n_; ++p)
        if (state_[p] == PairState::Mismatch)
          return validationError(fuscoInvalidUsage, "%s: %s", op_.name, pairMsg_[p]);
      return validationError(first.status == fuscoInvalidArgument ? fuscoInvalidUsage : fuscoRemoteError,
                             "%s", std::string(op_.name) + " failed on rank " +
                                       std::to_string(first.culprit) + ": " + first.message);
    }
  }
  // Peers skip their pairs with a rank whose arguments are invalid, so nobody waits for data.
  if (op_.argStatus != fuscoSuccess) return validationError(op_.argStatus, "%s", op_.argError);
  if (!op_.validateOnly && onDevice()) {
    std::vector<bool> moves(n_);
    for (int p = 0; p < n_; ++p) moves[p] = involved_[p] || p == me_ ? this->moves(p) : false;
    FUSCO_CHECK(deviceDataPhase(c_, op_, mine_, theirs_, moves, offers_));
  } else if (!op_.validateOnly) {
    FUSCO_CHECK(dataPhase());
  }
  for (int p = 0; p < n_; ++p) {
    if (state_[p] == PairState::Mismatch || state_[p] == PairState::PeerBad)
      return validationError(fuscoInvalidUsage, "%s: %s", op_.name, pairMsg_[p]);
  }
  return fuscoSuccess;
}

}  // namespace

fuscoResult_t runOp(Communicator& comm, Op& op) {
  if (comm.brokenResult() != fuscoSuccess)
    return FUSCO_FAIL(comm.brokenResult(), kEngine,
                      "%s: the communicator failed in an earlier call and cannot be used: %s",
                      op.name, comm.brokenMessage().c_str());
  OpRunner runner(comm, op);
  fuscoResult_t r;
  try {
    r = runner.run();
  } catch (const std::bad_alloc&) {
    // Half an operation may be in the channels: the communicator is broken like on any failure.
    r = FUSCO_FAIL(fuscoSystemError, kEngine, "%s: out of host memory", op.name);
  }
  // Anything but an agreed validation failure may leave half an operation in the channels.
  if (r != fuscoSuccess && !runner.failedValidation()) comm.markBroken(r, threadLastError());
  return r;
}

}  // namespace fusco
