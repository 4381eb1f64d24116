#include "engine/engine_async.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "core/clock.h"
#include "core/cuda_guard.h"
#include "core/log.h"
#include "core/params.h"
#include "core/result.h"
#include "device/cuda_enqueue.h"
#include "device/device_ops.h"
#include "engine/engine_device.h"
#include "engine/op_launch.h"
#include "engine/op_runner.h"
#include "exec/net_bridge.h"

namespace fusco {

namespace {

// One operation between the caller and the progress thread.
struct Pending {
  explicit Pending(Op&& o) : op(std::move(o)) {}
  Op op;
  uint64_t index = 0;
  ParamBlock block;
  ParamLayout layout;
  std::vector<bool> involved;                  // the pairs that post and wait for both flags
  fuscoResult_t enqueueStatus = fuscoSuccess;  // what the caller was told
  // FUSCO_DEBUG_SUBSYS=TIME: when the caller began and ended enqueueing it, and when the progress
  // thread took it up (nowNs; 0 when not traced).
  int64_t enqueueNs = 0, enqueuedNs = 0, takenNs = 0;
};

// One INFO line per operation under FUSCO_DEBUG_SUBSYS=TIME: the caller's time to enqueue it,
// how long it waited for the progress thread (busy with earlier operations, or asleep), and how
// long resolving it took there (its header and verdict rounds with the peers, its parameters).
void traceTimes(const Pending& pd, fuscoResult_t r) {
  const int64_t done = nowNs();
  FUSCO_INFO(kTime,
             "%s (call #%llu, operation %llu): enqueued in %.1f us on the caller; taken up %.1f us "
             "later; resolved in %.1f us (%s)",
             pd.op.name, static_cast<unsigned long long>(pd.op.call),
             static_cast<unsigned long long>(pd.index), (pd.enqueuedNs - pd.enqueueNs) / 1e3,
             (pd.takenNs - pd.enqueuedNs) / 1e3, (done - pd.takenNs) / 1e3,
             r == fuscoSuccess ? "ok" : fuscoGetErrorString(r));
}

// Every operation a remote pair shares is registered with the network bridge before its GO, with
// the rows it moves (none when the pair did not agree, or the operation failed). A peer that is
// out of step breaks the comm, as a wrong message from it does.
void expectBridged(Communicator& c, const Pending& pd, const DeviceTasks& t) {
  NetBridge* bridge = c.bridge();
  if (bridge == nullptr) return;
  for (size_t p = 0; p < pd.involved.size(); ++p) {
    if (!pd.involved[p] || !bridge->remote(static_cast<int>(p))) continue;
    DeviceTasks::Bridged b;
    if (t.ready && p < t.bridged.size()) b = t.bridged[p];
    // A captured operation (refused across nodes) posts its graph words, never the bridge's.
    if (bridge->expect(static_cast<int>(p), b.send, b.sendBytes, b.recv, b.recvBytes,
                       !pd.op.captured) == fuscoSuccess)
      continue;
    const std::string why = threadLastError();
    c.markBroken(fuscoRemoteError, why);
    c.progress()->release(fuscoRemoteError, why);
    return;
  }
}

// The progress thread's part: the rounds, then the parameters, then GO.
fuscoResult_t writeParams(Communicator& c, const Pending& pd, const DeviceTasks& t) {
  const ParamLayout& l = pd.layout;
  char* host = pd.block.host;
  StreamOps& ops = *c.streamOps();
  FUSCO_CHECK(ops.fillBatches(t.a, host + l.offA, l.slotsA));
  FUSCO_CHECK(ops.fillBatches(t.b, host + l.offB, l.slotsB));
  if (pd.op.pullRun) {
    bool aligned = true;
    for (size_t p = 0; p < t.bases.size(); ++p) {
      const uintptr_t base = reinterpret_cast<uintptr_t>(t.bases[p]);
      std::memcpy(host + l.offBases + p * sizeof(base), &base, sizeof(base));
      aligned = aligned && (reinterpret_cast<uintptr_t>(t.bases[p]) & 15) == 0;
    }
    // 0 (never resolved, or summed by the ring step): the reading kernel skips.
    const uint32_t word = t.reduce ? 0 : aligned ? 1 : 2;
    std::memcpy(host + l.offAligned, &word, sizeof(word));
  }
  return writeRoles(c, pd.op, l, pd.block, t);
}

void resolve(Communicator& c, Pending& pd) {
  DeviceQueue& q = *c.deviceQueue();
  if (pd.enqueueNs != 0) pd.takenNs = nowNs();
  c.progress()->setDoing(std::string("resolving ") + pd.op.name +
                         " (its headers exchanged with the peers, its landing places, its "
                         "parameters)");
  fuscoResult_t r = fuscoSuccess;
  bool validation = false;
  if (c.brokenResult() != fuscoSuccess) {
    r = c.brokenResult();  // the streams were released when it broke
  } else if (!pd.op.firstInCall && pd.op.callSerial == c.asyncFailedCall()) {
    // An earlier operation of this call failed validation on every rank: every rank skips it.
    r = fuscoInvalidArgument;
    expectBridged(c, pd, DeviceTasks{});
  } else {
    bool written = true;
    DeviceTasks t;
    r = runGuarded(c, pd.op, &validation, [&](OpRunner& runner) {
      if (pd.op.late) FUSCO_CHECK(pd.op.late(pd.op));  // sizes earlier stream work decided
      fuscoResult_t v = runner.resolve(&t);
      // Pairs that agreed move their data even when another pair of the operation did not.
      fuscoResult_t w = t.ready ? writeParams(c, pd, t) : fuscoSuccess;
      written = w == fuscoSuccess;
      return written ? v : w;
    });
    validation = validation && written;
    if (r == fuscoSuccess || validation) expectBridged(c, pd, written ? t : DeviceTasks{});
    if (r != fuscoSuccess) {
      const std::string why = threadLastError();
      if (validation) {
        c.setAsyncFailedCall(pd.op.callSerial);
        // A rank whose own check failed was told by its call already.
        if (pd.enqueueStatus == fuscoSuccess) c.setAsyncError(fuscoInvalidArgument, why, r);
      } else {
        c.markBroken(r, why);
        c.progress()->release(r, why);
      }
    }
  }
  if (pd.op.after) pd.op.after(r == fuscoSuccess);
  q.go(pd.index);
  if (pd.enqueueNs != 0) traceTimes(pd, r);
}

// What the network bridge cannot carry to a peer on another node: a replay of a captured
// operation (invisible to the progress thread that ships the rows) and a pull operation (its
// reading kernel maps the peer's buffer). Both sides of such a pair refuse alike.
void refuseBridged(Communicator& c, const std::vector<bool>& involved, Op* op) {
  if (c.bridge() == nullptr || op->argStatus != fuscoSuccess || (!op->captured && !op->pullRun))
    return;
  for (size_t p = 0; p < involved.size(); ++p) {
    if (!involved[p] || !c.bridge()->remote(static_cast<int>(p))) continue;
    op->argStatus = fuscoInvalidUsage;
    // Both sides of the pair run the push skeleton, with no tasks, so their flags stay paired.
    const bool pull = static_cast<bool>(op->pullRun);
    op->pullRun = nullptr;
    op->argError = std::string(op->name) + ": rank " + std::to_string(p) +
                   " is on another node, and " +
                   (!pull ? "calls with peers on other nodes cannot be captured into a "
                            "CUDA graph (the progress thread ships their rows)"
                          : "this call reads its peers' buffers in place, which a peer on "
                            "another node cannot offer");
    return;
  }
}

// Everything an operation may need that a CUDA call which can wait for the device provides, done
// on the caller's thread before the operation's first wait: the peers' new buffers mapped, and
// room in the network bridge's areas. Messages not written in place go through the channels,
// mapped at init: nothing is staged.
fuscoResult_t setupBeforeWaits(Communicator& c, const std::vector<bool>& involved, Op* op) {
  FUSCO_CHECK(c.mapPeerRegions());
  if (op->argStatus == fuscoSuccess) FUSCO_CHECK(reserveBridgeAreas(c, *op, involved));
  return fuscoSuccess;
}

}  // namespace

fuscoResult_t enqueueDeviceOp(Communicator& c, Op& op, bool* agreedFailure) {
  *agreedFailure = false;
  const int64_t start = logEnabled(LogLevel::Info, kTime) ? nowNs() : 0;
  const int n = c.nranks(), me = c.rank();
  FUSCO_CHECK(c.useDevice());
  FUSCO_CHECK(c.streamOps()->capturing(op.stream, &op.captured));
  if (op.captured) c.noteCapture();
  // A call captured on one rank and run eagerly on another cannot pair its flags: the ranks agree.
  if (op.firstInCall) op.agree.push_back({"capture into a CUDA graph", op.captured ? 1u : 0u});
  std::vector<bool> involved(n, false);
  size_t tasksA = 0, tasksB = 0;
  int peers = 0;
  for (int p = 0; p < n; ++p) {
    involved[p] = p != me && (op.collective || !op.peers[p].empty());
    if (p == me || involved[p]) tasksA += op.peers[p].sends.size();
    if (involved[p]) tasksB += op.peers[p].recvs.size();
    peers += involved[p] ? 1 : 0;
  }
  refuseBridged(c, involved, &op);
  FUSCO_CHECK(setupBeforeWaits(c, involved, &op));
  auto pd = std::make_shared<Pending>(std::move(op));
  pd->involved = involved;
  Op& o = pd->op;
  pd->layout = layoutFor(*c.streamOps(), o, n, peers, tasksA, tasksB);
  pd->index = c.deviceQueue()->nextIndex();
  if (o.captured) {
    FUSCO_CHECK(c.deviceQueue()->graphParams(pd->layout.bytes, &pd->block));
  } else {
    FUSCO_CHECK(c.deviceQueue()->reserve(
        pd->layout.bytes, pd->index, c.timeoutMs(),
        [&c] { return c.brokenResult() != fuscoSuccess; }, &pd->block));
  }
  PairFlags f;
  FUSCO_CHECK(f.init(c, involved, o));
  FUSCO_CHECK(enqueueStream(c, o, f, pd->index, pd->layout, pd->block));
  const fuscoResult_t status = pd->enqueueStatus = o.argStatus;
  const std::string error = o.argError;
  if (start != 0) pd->enqueueNs = start, pd->enqueuedNs = nowNs();
  c.progress()->post([&c, pd] { resolve(c, *pd); }, pd->op.name);
  if (status == fuscoSuccess) return fuscoSuccess;
  // The peers learn this rank's failure from its header and skip the call with it.
  *agreedFailure = true;
  return FUSCO_FAIL(status, kApi, "%s", error.c_str());
}

}  // namespace fusco
