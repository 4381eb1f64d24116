#include "exec/net_bridge.h"

#include <atomic>
#include <cstring>

#include "core/clock.h"
#include "core/log.h"
#include "core/result.h"
#include "core/seq_compare.h"
#include "exec/progress.h"
#include "exec/stream_ops.h"

namespace fusco {

namespace {

constexpr size_t kWordStride = 64;
constexpr size_t kWordsBytes = 2 * kDeviceFlagKinds * kWordStride;
constexpr size_t kAreaAlign = 256;

// A post on the wire: which flag, and its value.
struct PostWire {
  uint32_t kind;
  uint32_t value;
};

}  // namespace

NetBridge::~NetBridge() {
  StreamOps* ops = c_.streamOps();
  for (Peer& p : peers_) {
    if (p.wordsHost != nullptr) ops->freeMapped(p.wordsHost);  // init may have failed on it
    if (p.send.host != nullptr) ops->freeMapped(p.send.host);
    if (p.recv.host != nullptr) ops->freeMapped(p.recv.host);
  }
  for (char* r : retired_) ops->freeMapped(r);
}

fuscoResult_t NetBridge::init() {
  const int n = c_.nranks(), me = c_.rank();
  const NodeMap& nodes = c_.nodes();
  index_.assign(n, -1);
  for (int r = 0; r < n; ++r) {
    if (r == me || nodes.sameNode(me, r)) continue;
    index_[r] = static_cast<int>(peers_.size());
    peers_.emplace_back();
    Peer& p = peers_.back();
    p.rank = r;
    void *host = nullptr, *dev = nullptr;
    FUSCO_CHECK(c_.streamOps()->allocMapped(kWordsBytes, &host, &dev));
    std::memset(host, 0, kWordsBytes);
    p.wordsHost = static_cast<char*>(host);
    p.wordsDev = static_cast<char*>(dev);
  }
  return fuscoSuccess;
}

volatile uint32_t* NetBridge::waitWord(const Peer& p, int kind) const {
  return reinterpret_cast<volatile uint32_t*>(p.wordsHost + kind * kWordStride);
}

volatile uint32_t* NetBridge::postWord(const Peer& p, int kind) const {
  return reinterpret_cast<volatile uint32_t*>(p.wordsHost +
                                              (kDeviceFlagKinds + kind) * kWordStride);
}

void NetBridge::flags(int peer, DeviceFlags* out) const {
  const Peer& p = peers_[index_[peer]];
  for (int k = 0; k < kDeviceFlagKinds; ++k) {
    out->hostWait[k] = waitWord(p, k);
    out->devWait[k] = p.wordsDev + k * kWordStride;
    out->devPost[k] = p.wordsDev + (kDeviceFlagKinds + k) * kWordStride;
  }
}

fuscoResult_t NetBridge::grow(Buffer* b, size_t bytes) {
  if (bytes <= b->bytes) return fuscoSuccess;
  const size_t want = std::max(bytes, b->bytes * 2);
  void *host = nullptr, *dev = nullptr;
  FUSCO_CHECK(c_.streamOps()->allocMapped(want, &host, &dev));
  if (b->host != nullptr) retired_.push_back(b->host);
  *b = {static_cast<char*>(host), static_cast<char*>(dev), want};
  return fuscoSuccess;
}

bool NetBridge::fits(int peer, size_t sendBytes, size_t recvBytes) const {
  const Peer& p = peers_[index_[peer]];
  return sendBytes <= p.send.bytes && recvBytes <= p.recv.bytes;
}

fuscoResult_t NetBridge::reserve(int peer, size_t sendBytes, size_t recvBytes) {
  Peer& p = peers_[index_[peer]];
  FUSCO_CHECK(grow(&p.send, sendBytes));
  return grow(&p.recv, recvBytes);
}

fuscoResult_t NetBridge::areas(int peer, size_t sendBytes, size_t recvBytes, Area* send,
                               Area* recv) {
  Peer& p = peers_[index_[peer]];
  if (!fits(peer, sendBytes, recvBytes))
    return FUSCO_FAIL(fuscoInternalError, kEngine,
                      "network bridge: %zu + %zu bytes for rank %d, more than the %zu + %zu "
                      "reserved before the operation",
                      sendBytes, recvBytes, peer, p.send.bytes, p.recv.bytes);
  *send = {p.send.host, p.send.mapped};
  *recv = {p.recv.host, p.recv.mapped};
  return fuscoSuccess;
}

fuscoResult_t NetBridge::expect(int peer, const char* send, size_t sendBytes, char* recv,
                                size_t recvBytes, bool posted) {
  Peer& p = peers_[index_[peer]];
  p.ledger.expect({send, sendBytes}, {recv, recvBytes}, posted);
  uint32_t value = 0;
  std::string why;
  const int early = p.ledger.applyEarlyDone(&value, &why);
  if (early > 0) raiseWord(p, 1, value);
  if (early >= 0) return fuscoSuccess;
  return FUSCO_FAIL(fuscoRemoteError, kEngine,
                    "rank %d sent %s over the network bridge; the ranks are out of step", p.rank,
                    why.c_str());
}

void NetBridge::raiseWord(const Peer& p, int kind, uint32_t value) {
  std::atomic_thread_fence(std::memory_order_release);  // the landed rows before the word
  volatile uint32_t* word = waitWord(p, kind);
  if (seqAfter(value, *word)) *word = value;  // released words may be ahead already
}

// This rank's posts to the peer, and the rows each done post ships first, as far as the channel
// has slots.
fuscoResult_t NetBridge::pumpOut(Peer& p, bool* busy, bool* moved) {
  const PeerConn& pc = c_.conn(p.rank);
  for (int budget = c_.depth(); budget > 0; --budget) {
    const uint32_t ready = *postWord(p, 0), done = *postWord(p, 1);
    std::atomic_thread_fence(std::memory_order_acquire);  // the rows before the done post
    BridgeLedger::Step st = p.ledger.next(ready, done, c_.chunkBytes());
    if (st.kind == BridgeLedger::Kind::None) break;
    void* buf = nullptr;
    size_t cap = 0;
    FUSCO_CHECK(pc.ops->sendAcquire(pc.tc, p.rank, &buf, &cap));
    if (buf == nullptr) break;  // no credit: the next pump goes on
    if (st.kind == BridgeLedger::Kind::Slice) {
      st.bytes = std::min(st.bytes, cap);
      std::memcpy(buf, st.data, st.bytes);
      FUSCO_CHECK(pc.ops->sendPost(pc.tc, p.rank, kTagBridgeRows, st.bytes));
    } else {
      const PostWire w{st.kind == BridgeLedger::Kind::Ready ? 0u : 1u, st.value};
      std::memcpy(buf, &w, sizeof(w));
      FUSCO_CHECK(pc.ops->sendPost(pc.tc, p.rank, kTagBridgePost, sizeof(w)));
    }
    p.ledger.sent(st);
    *moved = true;
  }
  // Posted messages still in flight keep the thread polling too: they complete in the background.
  *busy = *busy || p.ledger.owes(*postWord(p, 0), *postWord(p, 1)) ||
          (pc.ops->sendsInFlight != nullptr && pc.ops->sendsInFlight(pc.tc, p.rank));
  return fuscoSuccess;
}

fuscoResult_t NetBridge::onMessage(Peer& p, uint32_t tag, const void* buf, size_t len,
                                   bool* handled) {
  *handled = tag == kTagBridgePost || tag == kTagBridgeRows;
  if (!*handled) return fuscoSuccess;
  std::string why;
  bool ok = true;
  if (tag == kTagBridgeRows) {
    ok = p.ledger.onSlice(buf, len, &why);
  } else {
    PostWire w{};
    if (len == sizeof(w)) std::memcpy(&w, buf, sizeof(w));
    bool early = false;  // kept until this rank registers the operation (expect)
    ok = len == sizeof(w) && w.kind <= 1 && (w.kind == 0 || p.ledger.onDone(w.value, &why, &early));
    if (ok && !early) {
      raiseWord(p, static_cast<int>(w.kind), w.value);
    } else if (!ok && why.empty()) {
      why = "a malformed post";
    }
  }
  if (ok) return fuscoSuccess;
  return FUSCO_FAIL(fuscoRemoteError, kEngine,
                    "rank %d sent %s over the network bridge; the ranks are out of step", p.rank,
                    why.c_str());
}

// Everything the peer sent that has arrived: bridge messages are handled, the engine's are kept.
fuscoResult_t NetBridge::pumpIn(Peer& p, bool* moved) {
  const PeerConn& pc = c_.conn(p.rank);
  for (;;) {
    const void* buf = nullptr;
    size_t len = 0;
    uint32_t tag = 0;
    FUSCO_CHECK(pc.ops->recvPoll(pc.tc, p.rank, &buf, &len, &tag));
    if (buf == nullptr) return fuscoSuccess;
    bool handled = false;
    FUSCO_CHECK(onMessage(p, tag, buf, len, &handled));
    if (!handled) p.kept.emplace_back(tag, std::string(static_cast<const char*>(buf), len));
    FUSCO_CHECK(pc.ops->recvRelease(pc.tc, p.rank));
    *moved = true;
  }
}

fuscoResult_t NetBridge::pump(bool* busy, bool* moved) {
  *busy = *moved = false;
  const int64_t now = nowNs();
  const bool look = now - lastLive_ >= paramLivenessMs() * 1000000LL;
  if (look) lastLive_ = now;
  for (Peer& p : peers_) {
    bool owes = false;
    FUSCO_CHECK(pumpOut(p, &owes, moved));
    FUSCO_CHECK(pumpIn(p, moved));
    *busy = *busy || owes;
    if (owes && look && c_.checkPeer(p.rank) != fuscoSuccess)
      return FUSCO_FAIL(fuscoRemoteError, kEngine,
                        "the network bridge still owed rank %d its posts or rows: %s", p.rank,
                        threadLastError().c_str());
  }
  return fuscoSuccess;
}

fuscoResult_t NetBridge::poll(int peer, const void** buf, size_t* len, uint32_t* tag) {
  Peer& p = peers_[index_[peer]];
  const PeerConn& pc = c_.conn(peer);
  for (;;) {
    if (!p.kept.empty()) {
      *tag = p.kept.front().first;
      *buf = p.kept.front().second.data();
      *len = p.kept.front().second.size();
      return fuscoSuccess;
    }
    FUSCO_CHECK(pc.ops->recvPoll(pc.tc, peer, buf, len, tag));
    if (*buf == nullptr) return fuscoSuccess;
    bool handled = false;
    FUSCO_CHECK(onMessage(p, *tag, *buf, *len, &handled));
    if (!handled) return fuscoSuccess;
    FUSCO_CHECK(pc.ops->recvRelease(pc.tc, peer));
  }
}

fuscoResult_t NetBridge::release(int peer) {
  Peer& p = peers_[index_[peer]];
  if (!p.kept.empty()) {
    p.kept.pop_front();
    return fuscoSuccess;
  }
  const PeerConn& pc = c_.conn(peer);
  return pc.ops->recvRelease(pc.tc, peer);
}

}  // namespace fusco
