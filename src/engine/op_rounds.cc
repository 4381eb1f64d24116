// The header and verdict rounds of an operation: every pair's counts and offers, checked pairwise,
// then every rank's verdict, so no rank moves data for a call that failed anywhere.
#include <algorithm>
#include <cstring>

#include "core/fault.h"
#include "engine/op_runner.h"

namespace fusco {

void OpRunner::buildHeaders() {
  const bool direct = paramShmDirect() != 0;
  for (int p = 0; p < n_; ++p) {
    if (p == me_ || (!op_.collective && op_.peers[p].empty())) continue;
    involved_[p] = true;
    PairHeader& h = mine_[p];
    h.kind = op_.kind;
    h.call = op_.call;
    h.seq = c_.nextPairSeq(p);
    h.status = op_.argStatus;
    h.onStream = onDevice() ? 1 : 0;
    if (op_.firstInCall)
      for (const AgreeValue& v : op_.agree) h.agree.push_back(v.value);
    for (const auto& s : op_.peers[p].sends) h.sendBytes.push_back(s.bytes());
    for (const auto& r : op_.peers[p].recvs) {
      uint64_t token = kStagedToken;
      const size_t extent = r.extentBytes();
      if (direct && !op_.pullRun && op_.argStatus == fuscoSuccess && r.bytes() > 0 && extent > 0 &&
          (r.contiguous() || r.layoutShared) && !c_.offerToken(p, r.base, extent, &token))
        token = kStagedToken;
      h.recvBytes.push_back(r.bytes());
      h.recvTokens.push_back(token);
      h.recvExtents.push_back(r.contiguous() ? extent : (extent | kLayoutSharedBit));
    }
    if (op_.pullRun && op_.argStatus == fuscoSuccess) offerSends(p, &h);
  }
  for (int i = 1; i < n_; ++i) order_.push_back((me_ + i) % n_);
  // The GPU path offers every receive buffer to its sender: in place, or the pair's channel.
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
    PairHeader bad;  // nothing but who, which operation, and the failure
    bad.kind = h.kind;
    bad.call = h.call;
    bad.seq = h.seq;
    bad.status = op_.argStatus;
    bad.onStream = h.onStream;
    h = std::move(bad);
  }
}

// A pull operation: every send stream's buffer, offered to its receiver (which reads it), or the
// staged token for a stream pushed through the pair's channel. Pull operations run on the GPU
// only, with one message per pair.
void OpRunner::offerSends(int p, PairHeader* h) {
  const char* why = !onDevice() ? "runs on the GPU only"
                    : op_.peers[p].sends.size() > 1 || op_.peers[p].recvs.size() > 1
                        ? "has one message per pair"
                        : nullptr;
  if (why != nullptr) {
    op_.argStatus = fuscoInternalError;
    op_.argError = std::string(op_.name) + ": a pull operation " + why;
    return;
  }
  for (const auto& s : op_.peers[p].sends) {
    uint64_t token = kStagedToken;
    if (s.push) {  // through the pair's channel: nothing to offer
      h->sendTokens.push_back(token);
      h->sendExtents.push_back(s.bytes());
      continue;
    }
    const size_t extent = s.extentBytes();
    if (s.bytes() > 0 && (extent < s.bytes() || !c_.offerToken(p, s.base, extent, &token))) {
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
            return FUSCO_FAIL(fuscoInternalError, kEngine, "%s: call header does not fit a slot",
                              op_.name);
          if (op_.corruptHeaders) faultCorruptBytes(buf, len);  // FUSCO_FAULT corrupt-header
          FUSCO_CHECK(pc.ops->sendPost(pc.tc, p, kTagHeader, len));
          sc_[p].headerSent = *progressed = true;
        }
      }
      if (!rc_[p].headerSeen) {
        const void* buf;
        size_t len;
        uint32_t tag;
        FUSCO_CHECK(c_.pollPeer(p, &buf, &len, &tag));
        if (buf != nullptr) {
          if (tag != kTagHeader || !decodeHeader(buf, len, &theirs_[p]))
            return protocolError(p, "an unexpected message instead of a call header");
          FUSCO_CHECK(c_.releasePeer(p));
          rc_[p].headerSeen = *progressed = true;
        }
      }
      *done = *done && sc_[p].headerSent && rc_[p].headerSeen;
    }
    return fuscoSuccess;
  });
}

namespace {

// Why a pair cannot run one operation whose sides run it in different places (theirsOnStream: the
// peer enqueues it on its stream).
std::string streamMismatch(int p, bool theirsOnStream) {
  const char* stream = "enqueues it on its stream";
  const char* host = "runs it with host data";
  return "how the operation runs differs between ranks: rank " + std::to_string(p) + " " +
         (theirsOnStream ? stream : host) + ", this rank " + (theirsOnStream ? host : stream) +
         " (the ranks made different calls, or a MoE plan's planner or capacity mode differs "
         "between them)";
}

// The first message whose sender and receiver disagree, naming both ranks: "rank 3 sends 400
// bytes to rank 5, which expects 384 (message 0)".
std::string countDisagreement(const PairHeader& m, const PairHeader& t, int me, int p) {
  auto first = [](const std::vector<uint64_t>& send, const std::vector<uint64_t>& recv, int from,
                  int to, std::string* out) {
    const size_t n = std::max(send.size(), recv.size());
    for (size_t i = 0; i < n; ++i) {
      const uint64_t s = i < send.size() ? send[i] : 0, r = i < recv.size() ? recv[i] : 0;
      if (s == r && i < send.size() && i < recv.size()) continue;
      *out = "rank " + std::to_string(from) + " sends " +
             (i < send.size() ? std::to_string(s) + " bytes" : std::string("no message")) +
             " to rank " + std::to_string(to) + ", which expects " +
             (i < recv.size() ? std::to_string(r) + " bytes" : std::string("no message")) +
             " (message " + std::to_string(i) + ")";
      return true;
    }
    return false;
  };
  std::string out;
  if (!first(m.sendBytes, t.recvBytes, me, p, &out)) first(t.sendBytes, m.recvBytes, p, me, &out);
  return out;
}

}  // namespace

// Both ranks of a pair reach the same conclusion from the same two headers.
void OpRunner::checkPairs() {
  pairMsg_.assign(n_, "");
  for (int p = 0; p < n_; ++p) {
    if (p == me_) {
      const PeerWork& w = op_.peers[p];
      bool same = w.sends.size() == w.recvs.size();
      for (size_t i = 0; same && i < w.sends.size(); ++i)
        same = w.sends[i].bytes() == w.recvs[i].bytes();
      state_[p] = op_.argStatus != fuscoSuccess ? PairState::SelfBad
                  : same                        ? PairState::Ok
                                                : PairState::Mismatch;
      if (!same)
        pairMsg_[p] = "what rank " + std::to_string(me_) +
                      " sends to itself does not match what it receives from itself";
      continue;
    }
    if (!involved_[p]) {
      state_[p] = PairState::Ok;
      continue;
    }
    const PairHeader &m = mine_[p], &t = theirs_[p];
    std::string why;
    if (!pairInStep(m, t, p, &why)) {
      state_[p] = PairState::Skew;
      pairMsg_[p] = why;
    } else if (t.onStream != m.onStream) {
      // A stream's waits for the pair's flags would wait for a peer that raises none.
      state_[p] = PairState::Skew;
      pairMsg_[p] = streamMismatch(p, t.onStream != 0);
    } else if (t.kind != m.kind) {
      state_[p] = PairState::Mismatch;
      pairMsg_[p] = "rank " + std::to_string(p) + " is in a different call (call #" +
                    std::to_string(t.seq) + " of kind " + std::to_string((int)t.kind) +
                    ", this rank: #" + std::to_string(m.seq) + " of kind " +
                    std::to_string((int)m.kind) + ")";
    } else if (m.status != fuscoSuccess) {
      state_[p] = PairState::SelfBad;
    } else if (t.status != fuscoSuccess) {
      state_[p] = PairState::PeerBad;
      pairMsg_[p] = "rank " + std::to_string(p) + " passed invalid arguments";
    } else if ((!m.agree.empty() || !t.agree.empty()) &&
               !valuesAgree(m.agree.empty() ? std::vector<AgreeValue>() : op_.agree, t.agree, me_,
                            p, &why)) {
      state_[p] = PairState::Mismatch;
      pairMsg_[p] = why;
    } else if (m.sendBytes != t.recvBytes || m.recvBytes != t.sendBytes) {
      state_[p] = PairState::Mismatch;
      auto str = [](const std::vector<uint64_t>& v) {
        if (v.empty()) return std::string("nothing (0 messages)");
        std::string s;
        for (size_t i = 0; i < v.size() && i < 4; ++i) s += (i ? "," : "") + std::to_string(v[i]);
        return s + (v.size() > 4 ? ",..." : "") + " (" + std::to_string(v.size()) + " messages)";
      };
      pairMsg_[p] = countDisagreement(m, t, me_, p) + "; byte counts disagree with rank " +
                    std::to_string(p) + ": this rank (" + std::to_string(me_) + ") sends " +
                    str(m.sendBytes) + " and expects " + str(m.recvBytes) + "; rank " +
                    std::to_string(p) + " expects " + str(t.recvBytes) + " and sends " +
                    str(t.sendBytes);
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
        FUSCO_CHECK(c_.pollPeer(p, &buf, &len, &tag));
        if (buf != nullptr) {
          if (tag != kTagVerdict || !decodeVerdict(buf, len, &verdicts_[p]))
            return protocolError(p, "an unexpected message instead of a verdict");
          FUSCO_CHECK(c_.releasePeer(p));
          rc_[p].verdictSeen = *progressed = true;
        }
      }
      *done = *done && sc_[p].verdictSent && rc_[p].verdictSeen;
    }
    return fuscoSuccess;
  }));
  *first = Verdict();
  for (int r = 0; r < n_; ++r)
    if (verdicts_[r].status != fuscoSuccess) {
      *first = verdicts_[r];
      break;
    }
  return fuscoSuccess;
}

// A collective operation with a verdict round: every rank learns whether the call failed anywhere,
// so all of them fail it together (validation: no data moved, the comm stays usable).
fuscoResult_t OpRunner::decideCollective() {
  Verdict first;
  FUSCO_CHECK(verdictRound(&first));
  if (op_.argStatus != fuscoSuccess) return validationError(op_.argStatus, "%s", op_.argError);
  if (first.status == fuscoSuccess) return fuscoSuccess;
  for (int p = 0; p < n_; ++p)
    if (state_[p] == PairState::Mismatch)
      return validationError(fuscoInvalidUsage, "%s: %s", op_.name, pairMsg_[p]);
  fuscoResult_t r = first.status == fuscoInvalidArgument ? fuscoInvalidUsage : fuscoRemoteError;
  // A late check (a capacity plan's sizes, Op::late) fails as a CUDA comm reports it
  // asynchronously: fuscoInvalidArgument on every rank (docs/API.md, "Capacity mode").
  if (op_.late && first.status == fuscoInvalidArgument) r = fuscoInvalidArgument;
  return validationError(r, "%s",
                         std::string(op_.name) + " failed on rank " +
                             std::to_string(first.culprit) + ": " + first.message);
}

// A later operation of a call every rank already validated has no verdict round. A rank that
// failed since (its own status) is in every peer's header, so every rank stops before data moves,
// as after a verdict. A pair mismatch is seen by that pair only: the other ranks would move data
// and wait on rows the pair never sends, so it is no agreed failure and breaks the communicator.
fuscoResult_t OpRunner::decideAgreed() {
  if (op_.argStatus != fuscoSuccess) return validationError(op_.argStatus, "%s", op_.argError);
  for (int p = 0; p < n_; ++p)
    if (state_[p] == PairState::PeerBad)
      return validationError(fuscoInvalidUsage, "%s: %s", op_.name, pairMsg_[p]);
  for (int p = 0; p < n_; ++p)
    if (state_[p] == PairState::Mismatch)
      return FUSCO_FAIL(fuscoInvalidUsage, kEngine,
                        "%s: %s (after the call was validated on every rank)", op_.name,
                        pairMsg_[p].c_str());
  return fuscoSuccess;
}

}  // namespace fusco
