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
#include "engine/engine_async.h"
#include "engine/engine_device.h"
#include "engine/engine_wire.h"
#include "engine/op_runner.h"
#include "exec/stream_ops.h"

namespace fusco {

FUSCO_PARAM_INT(SpinBeforeYield, "FUSCO_SPIN_BEFORE_YIELD", 64, 0, INT32_MAX,
                "polls of a wait loop before it yields the core to other processes");
FUSCO_PARAM_INT(
    ShmDirect, "FUSCO_SHM_DIRECT", 1, 0, 1,
    "1: write straight into a peer's arena buffer when it is one (one copy); 0: always stage");

fuscoResult_t OpRunner::validationError(fuscoResult_t r, const char* fmt, const std::string& a,
                                        const std::string& b) {
  failedValidation_ = true;
  return FUSCO_FAIL(r, kApi, fmt, a.c_str(), b.c_str());
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
      FUSCO_TRACE(kEngine,
                  "%s: rank %d: send message %zu/%zu at byte %zu, receive %zu/%zu at byte %zu",
                  op_.name, p, sc_[p].msg, op_.peers[p].sends.size(), sc_[p].off, rc_[p].msg,
                  op_.peers[p].recvs.size(), rc_[p].off);
    }
  }
  return FUSCO_FAIL(r, kEngine, "%s: %s during %s; waiting for rank(s) %s", op_.name, why, phase,
                    waiting.empty() ? "none" : waiting.c_str());
}

fuscoResult_t OpRunner::protocolError(int p, const char* what) {
  return FUSCO_FAIL(fuscoRemoteError, kEngine,
                    "%s: rank %d sent %s; the ranks are out of step (different calls?)", op_.name,
                    p, what);
}

fuscoResult_t OpRunner::stepSend(int p, bool* progressed) {
  const PeerConn& pc = c_.conn(p);
  auto& cur = sc_[p];
  const auto& sends = op_.peers[p].sends;
  for (int budget = c_.depth(); budget > 0 && cur.msg < sends.size();) {
    const RowStream& s = sends[cur.msg];
    const size_t bytes = s.bytes();
    if (bytes == 0) {
      ++cur.msg;
      continue;
    }
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
    void* base =
        pc.ops->peerPointer(pc.tc, p, t.recvTokens[m], t.recvExtents[m] & ~kLayoutSharedBit);
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
  auto& cur = rc_[p];
  const auto& recvs = op_.peers[p].recvs;
  for (int budget = c_.depth(); budget > 0 && cur.msg < recvs.size();) {
    const RowStream& r = recvs[cur.msg];
    const size_t bytes = r.bytes();
    if (bytes == 0) {
      ++cur.msg;
      continue;
    }
    const void* buf;
    size_t len;
    uint32_t tag;
    FUSCO_CHECK(c_.pollPeer(p, &buf, &len, &tag));
    if (buf == nullptr) return fuscoSuccess;
    if (tag == kTagDirectDone) {
      if (mine_[p].recvTokens[cur.msg] == kStagedToken || cur.off != 0)
        return protocolError(p, "a direct-write completion for a staged message");
      if (r.landed != nullptr) *r.landed = bytes;
      ++cur.msg;
    } else if (tag == kTagData) {
      if (len == 0 || len > bytes - cur.off)
        return protocolError(p, "a slice larger than the message");
      scatterBytes(r, cur.off, len, buf);
      cur.off += len;
      if (r.landed != nullptr) *r.landed = cur.off;
      if (cur.off == bytes) ++cur.msg, cur.off = 0;
    } else {
      return protocolError(p, "an unexpected message in the data phase");
    }
    FUSCO_CHECK(c_.releasePeer(p));
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

// Header and verdict rounds: after them every pair's state is known and, for a collective, every
// rank agreed that the call is valid.
fuscoResult_t OpRunner::rounds() {
  buildHeaders();
  FUSCO_CHECK(headerRound());
  checkPairs();
  // A peer in another call cannot take part in this one, nor this rank in its: neither the verdict
  // nor the data of this operation can be exchanged with it.
  for (int p = 0; p < n_; ++p)
    if (state_[p] == PairState::Skew)
      return FUSCO_FAIL(fuscoInvalidUsage, kEngine,
                        "%s: %s; the communicator cannot be used any more", op_.name,
                        pairMsg_[p].c_str());
  if (op_.collective && n_ > 1) FUSCO_CHECK(op_.agreed ? decideAgreed() : decideCollective());
  // Peers skip their pairs with a rank whose arguments are invalid, so nobody waits for data.
  if (op_.argStatus != fuscoSuccess) return validationError(op_.argStatus, "%s", op_.argError);
  return fuscoSuccess;
}

// Pairs that disagree moved nothing; they fail the operation once the others are done.
fuscoResult_t OpRunner::pairVerdict() {
  for (int p = 0; p < n_; ++p) {
    if (state_[p] == PairState::Mismatch || state_[p] == PairState::PeerBad)
      return validationError(fuscoInvalidUsage, "%s: %s", op_.name, pairMsg_[p]);
  }
  return fuscoSuccess;
}

fuscoResult_t OpRunner::run() {
  FUSCO_CHECK(rounds());
  if (!op_.validateOnly) FUSCO_CHECK(dataPhase());
  return pairVerdict();
}

fuscoResult_t OpRunner::resolve(DeviceTasks* out) {
  FUSCO_CHECK(rounds());
  std::vector<bool> moves(n_);
  for (int p = 0; p < n_; ++p) moves[p] = involved_[p] || p == me_ ? this->moves(p) : false;
  if (!op_.validateOnly) FUSCO_CHECK(deviceTasks(c_, op_, theirs_, moves, offers_, out));
  return pairVerdict();
}

// The call's state the operation carries (Op::call): taken on the caller's thread.
void snapshotCall(Communicator& comm, Op& op) {
  op.call = comm.callSeq();
  op.callSerial = comm.callSerial();
  op.firstInCall = comm.opsInCall() == 0;
  if (op.firstInCall) op.agree = comm.callAgreement();
  op.corruptHeaders = faultCorruptHeaders();
}

// Runs op here and now (a host comm, or a CUDA comm's host-memory exchanges on its progress
// thread).
// An operation run now: its late sizes first (engine.h, Op::late), its outcome to `after`.
fuscoResult_t runOpNow(Communicator& comm, Op& op, bool* validation) {
  fuscoResult_t r = runGuarded(comm, op, validation, [&op](OpRunner& runner) {
    if (op.late) FUSCO_CHECK(op.late(op));
    return runner.run();
  });
  // Anything but an agreed validation failure may leave half an operation in the channels.
  if (r != fuscoSuccess && !*validation) comm.markBroken(r, threadLastError());
  if (op.after) op.after(r == fuscoSuccess);
  return r;
}

// A host twin's call (stream_ops.h) returns when the data is in place, like any host call: it
// waits for its stream, then reports what the progress thread found as the call's result.
fuscoResult_t finishTwin(Communicator& comm, fuscoResult_t r, bool* agreed) {
  fuscoResult_t d = comm.streamOps()->drain();
  if (r != fuscoSuccess) return r;
  if (d != fuscoSuccess) {
    comm.markBroken(d, threadLastError());
    return d;
  }
  std::string why;
  fuscoResult_t engine = fuscoSuccess;
  if (comm.takeAsyncError(&why, &engine) == fuscoSuccess) return fuscoSuccess;
  *agreed = comm.brokenResult() == fuscoSuccess;  // a disagreement every rank saw alike
  setThreadLastError(why);
  return engine;
}

fuscoResult_t runOp(Communicator& comm, Op& op) {
  if (comm.brokenResult() != fuscoSuccess)
    return FUSCO_FAIL(comm.brokenResult(), kEngine,
                      "%s: the communicator failed in an earlier call and cannot be used: %s",
                      op.name, comm.brokenMessage().c_str());
  // FUSCO_FAULT oom: this rank runs out of host memory between two operations of its call.
  if (faultOomNow(comm.opsInCall())) throw std::bad_alloc();
  snapshotCall(comm, op);
  bool agreed = false;
  fuscoResult_t r;
  Progress* progress = comm.progress();
  if (progress != nullptr && !op.hostData) {
    // A CUDA comm's device operation: enqueued, resolved later by the progress thread.
    r = enqueueDeviceOp(comm, op, &agreed);
    if (r != fuscoSuccess && !agreed) comm.markBroken(r, threadLastError());
    if (comm.hostTwin()) r = finishTwin(comm, r, &agreed);
  } else if (progress != nullptr) {
    // Host-memory exchanges of a CUDA comm share the channels with the enqueued operations: they
    // run on the progress thread after them.
    r = progress->runSync([&] { return runOpNow(comm, op, &agreed); });
  } else {
    r = runOpNow(comm, op, &agreed);
  }
  comm.endOp(r != fuscoSuccess && agreed, progress == nullptr || op.hostData);
  return r;
}

fuscoResult_t runOp(Communicator& comm, Op& op, const ArgCheck& a) {
  op.argStatus = a.status;
  op.argError = a.message;
  return runOp(comm, op);
}

}  // namespace fusco
