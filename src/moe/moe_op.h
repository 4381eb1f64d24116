// The engine operations a MoE call runs, and the rule that keeps the two hops of NODE dedup free
// of deadlock: every message says what it waits for (its kind), and an operation whose messages
// are queued so that a gate could wait on a message stuck behind it is refused before it runs.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/arg_check.h"
#include "core/result.h"
#include "engine/communicator.h"
#include "engine/engine.h"

namespace fusco {

// What a message waits for before it may leave (RowStream::ready). Each kind has a stage (0:
// waits for nothing; s > 0: waits for landings of messages of lower bound) and a bound: the
// highest stage a message of this kind may be queued behind on its pair (messages of a pair
// leave in order). With every gated kind's stage above the bound of what it waits for, messages
// complete stage by stage and no gate can wait on itself (kindRules(), checked at compile time).
enum class MsgKind : uint8_t {
  Plain,       // rows of the caller's buffers, partials computed on demand, handoffs to a relay
  NetOwn,      // this rank's own rows to a forwarder; may queue behind relayed rows of that pair
  NetRelayed,  // rows a peer of this node handed this rank, passed on to a forwarder as they land
  FanOut,      // a forwarder's rows to the ranks of its node, each sent once it has landed
  NodeSum,     // combine: a forwarder's node sum, sent once the node's partials have landed
  SumPass,     // combine: a relay passing node sums on to their source as they land
  Count
};

struct MsgKindRule {
  uint8_t stage;
  uint8_t bound;
  uint32_t awaits;  // bit k: waits for landings of messages of kind k
};
const MsgKindRule& kindRule(MsgKind k);
const char* kindName(MsgKind k);

// One operation's per-peer work with the kind of every send (parallel to peers[p].sends).
struct MoeWork {
  std::vector<PeerWork> peers;
  std::vector<std::vector<MsgKind>> kinds;
  explicit MoeWork(int nranks) : peers(nranks), kinds(nranks) {}
  RowStream& send(int p, MsgKind k, const RowStream& s) {
    peers[p].sends.push_back(s);
    kinds[p].push_back(k);
    return peers[p].sends.back();
  }
  // A send whose rows land at known places in p's buffer (PeerWork::remoteDst), written there
  // directly when p's buffer can be mapped; earlier sends without one get an empty entry.
  void sendDirect(int p, MsgKind k, const RowStream& s, const RowStream& dst) {
    send(p, k, s);
    std::vector<RowStream>& rd = peers[p].remoteDst;
    rd.resize(peers[p].sends.size() - 1);
    rd.push_back(dst);
  }
};

// fuscoInternalError (with the op, peer and message) when a pair queues a message behind one of
// a stage above its kind's bound, or a message's gate does not match its kind.
fuscoResult_t checkGateOrder(const MoeWork& w, const char* name);

// One collective engine operation of a MoE call: work[p] is what this rank sends to and receives
// from rank p. A rank whose own arguments failed (`a`) still takes part so nobody waits for it.
// agreed: every rank already validated this call in an earlier operation (no verdict round).
// onDevice: the buffers are device memory of a fuscoMemCuda comm and move on `stream`; otherwise
// they are host memory (also on a CUDA comm: the planner's own exchanges). pullRun: a pull
// operation on the device (engine.h's Op::pullRun).
// late / after / latePeerBound: sizes known only once earlier stream work ran, the outcome, and
// the most a late-sized operation moves in each direction of a pair (engine.h's Op::late,
// Op::after, Op::latePeerBound).
using PullRun = decltype(Op::pullRun);
using LateSizes = decltype(Op::late);
fuscoResult_t runMoeOp(Communicator& c, const char* name, const ArgCheck& a,
                       const std::vector<PeerWork>& work, bool agreed = false,
                       void* stream = nullptr, bool onDevice = false, PullRun pullRun = nullptr,
                       LateSizes late = nullptr, std::function<void(bool)> after = nullptr,
                       size_t latePeerBound = 0);
// The same for host work with message kinds: the gate order is checked first.
fuscoResult_t runMoeWork(Communicator& c, const char* name, const ArgCheck& a, const MoeWork& work,
                         bool agreed = false);

// A local step that failed before a collective operation (scratch, device set-up): recorded as
// this rank's error in *a, so the rank still joins the operation and its peers fail at once with
// its message instead of waiting for the timeout.
void joinFailure(fuscoResult_t r, ArgCheck* a);
// The comm's scratch slot for one step, or nullptr (bytes 0, *a already failed, or the failure
// recorded in *a as above).
char* joinScratch(Communicator& c, int slot, size_t bytes, ArgCheck* a);

// Above any list size or row count a plan reaches: a peer announcing more is malformed.
constexpr uint64_t kMaxPlanWords = uint64_t{1} << 34;

// A plan-time exchange of plain host buffers: sends[p] to rank p, recvs[p] from it.
fuscoResult_t exchange(Communicator& c, const char* name, const ArgCheck& a,
                       const std::vector<RowStream>& sends, const std::vector<RowStream>& recvs);
// An exchange of int32 word lists over the comm (sizes, then words): out[p] to rank p, in[p] from
// it (in's lists are resized, keeping their storage). fuscoRemoteError if a peer announces more
// than kMaxPlanWords.
fuscoResult_t exchangeWords(Communicator& c, const char* name, const ArgCheck& a,
                            const std::vector<std::vector<int32_t>>& out,
                            std::vector<std::vector<int32_t>>* in);

}  // namespace fusco
