// The network bridge of an enqueue-only communicator (engine_async.h) whose ranks span nodes
// (docs/DESIGN.md, "Peers on other nodes"). A stream cannot write a remote peer's flag words or
// buffers, so for each peer on another node:
//  - the pair's DeviceFlags are local words in memory the stream reaches (pinned host memory on a
//    CUDA comm): the stream posts "ready" and "done" into an outbox, and waits on words the
//    progress thread writes when the peer's posts arrive;
//  - the sender's copy kernel gathers the operation's rows into a local send area, and the
//    receiver's second copy scatters them from a local receive area into their final rows (both
//    areas in that memory: the staged network path);
//  - the progress thread (pump) passes each ready post on, and after each done post ships the
//    operation's send area through the pair's channel in slices, then the done; on the other side
//    it lands the slices in the receive area and then sets the done word the stream waits on.
// The bridge's messages share the channel with the engine's rounds. poll/release are the engine's
// view of a remote peer's channel: bridge messages are handled there, and engine messages the
// pump meets first are kept aside (copied) until the engine asks for them, so neither kind can
// hold the other up. Progress thread only, except flags() and remote().
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "exec/bridge_ledger.h"
#include "exec/bridge_link.h"
#include "transport/transport.h"

namespace fusco {

// The bridge's messages on a peer's channel, beside the engine's (engine_wire.h).
enum : uint32_t {
  kTagBridgePost = 0x42505331,  // a ready or done post
  kTagBridgeRows = 0x42525731   // a slice of an operation's rows
};

class NetBridge {
 public:
  struct Area {
    char* host = nullptr;    // where the progress thread reads or writes it
    char* mapped = nullptr;  // where the stream's kernels do
  };

  explicit NetBridge(BridgeLink& c) : c_(c) {}
  ~NetBridge();
  NetBridge(const NetBridge&) = delete;
  NetBridge& operator=(const NetBridge&) = delete;
  // The flag words of every peer on another node (none: the bridge has nothing to do).
  fuscoResult_t init();
  bool any() const { return !peers_.empty(); }
  bool remote(int peer) const {
    return peer >= 0 && static_cast<size_t>(peer) < index_.size() && index_[peer] >= 0;
  }
  void flags(int peer, DeviceFlags* out) const;

  // One operation with a remote peer: the area its rows to the peer are gathered into and the
  // area the peer's rows land in (grown as needed; an outgrown area is kept until the bridge goes,
  // since an earlier operation may still use it).
  // On the progress thread the areas are only handed out: growing them allocates pinned memory (a
  // CUDA setup call), which reserve does on the caller's thread before the operation's first wait
  // (in a setup window, when fits says they must grow); areas then fails if they are too small.
  fuscoResult_t areas(int peer, size_t sendBytes, size_t recvBytes, Area* send, Area* recv);
  bool fits(int peer, size_t sendBytes, size_t recvBytes) const;
  fuscoResult_t reserve(int peer, size_t sendBytes, size_t recvBytes);
  // Registers the operation (every operation the pair shares, in order, before its GO): ship
  // `send` after the stream's next done post, land the peer's next rows in `recv`.
  // posted: BridgeLedger::expect. A done the peer posted before this rank got here completes the
  // landing now (BridgeLedger::applyEarlyDone); fuscoRemoteError when it cannot.
  fuscoResult_t expect(int peer, const char* send, size_t sendBytes, char* recv, size_t recvBytes,
                       bool posted);

  // Moves what is due: posts and slices out, slices and posts in. *busy: this rank still owes a
  // peer something (the progress thread keeps polling); *moved: something went out or came in.
  // Every FUSCO_LIVENESS_MS it checks the peers it owes (a dead peer's channel takes nothing).
  fuscoResult_t pump(bool* busy, bool* moved);
  // The engine's view of a remote peer's channel (TransportOps::recvPoll / recvRelease).
  fuscoResult_t poll(int peer, const void** buf, size_t* len, uint32_t* tag);
  fuscoResult_t release(int peer);

 private:
  struct Buffer {
    char* host = nullptr;
    char* mapped = nullptr;
    size_t bytes = 0;
  };
  struct Peer {
    int rank = -1;
    char* wordsHost = nullptr;  // 2 x kDeviceFlagKinds words, 64 bytes apart: waits, then posts
    char* wordsDev = nullptr;
    Buffer send, recv;
    BridgeLedger ledger;
    std::deque<std::pair<uint32_t, std::string>> kept;  // engine messages met by the pump
  };
  volatile uint32_t* waitWord(const Peer& p, int kind) const;
  // The peer's post `kind` reached `value`: the word the stream waits on, after the landed rows.
  void raiseWord(const Peer& p, int kind, uint32_t value);
  volatile uint32_t* postWord(const Peer& p, int kind) const;
  fuscoResult_t grow(Buffer* b, size_t bytes);
  fuscoResult_t pumpOut(Peer& p, bool* busy, bool* moved);
  fuscoResult_t pumpIn(Peer& p, bool* moved);
  // A bridge message from the peer (tag, payload): *handled false when it is the engine's.
  fuscoResult_t onMessage(Peer& p, uint32_t tag, const void* buf, size_t len, bool* handled);

  BridgeLink& c_;
  std::vector<int> index_;  // per rank: its entry in peers_, -1 for ranks on this node
  std::vector<Peer> peers_;
  std::vector<char*> retired_;  // outgrown areas (host addresses), freed with the bridge
  int64_t lastLive_ = 0;        // the last look at the peers owed something
};

}  // namespace fusco
