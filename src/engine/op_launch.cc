#include "engine/op_launch.h"

#include <algorithm>
#include <cstring>

#include "core/result.h"
#include "device/chan_reduce.h"
#include "device/op_program.h"
#include "engine/communicator.h"
#include "exec/progress.h"
#include "exec/stream_ops.h"

namespace fusco {

namespace {

// A bound on one operation's steps with k involved peers: GO; per handshake a barrier, k posts,
// k waits and (captured) a barrier and k clears; the copies and the ring step; the consumed word
// after a barrier.
size_t stepBound(int k) { return 10 + 6 * static_cast<size_t>(k); }

// Writes an operation's steps into its block (host side); addresses are the stream's.
class ProgramWriter {
 public:
  ProgramWriter(char* host, size_t room) : steps_(op::stepsOf(host)), room_(room) {}
  fuscoResult_t wait(void* word, uint32_t value, int peer, uint32_t phase) {
    return put({op::kStepWait, value, static_cast<uint32_t>(peer), phase, addr(word), 0, 0});
  }
  fuscoResult_t barrier() {
    if (barriers_ == op::kBarriers)
      return FUSCO_FAIL(fuscoInternalError, kEngine, "an operation needs more than %u barriers",
                        op::kBarriers);
    return put({op::kStepBarrier, 0, barriers_++, 0, 0, 0, 0});
  }
  fuscoResult_t post(void* word, uint32_t value, bool always = false) {
    return put({op::kStepPost, value, 0, 0, addr(word), 0, always ? 1u : 0u});
  }
  fuscoResult_t copy(char* batches, size_t slots) {
    if (slots == 0) return fuscoSuccess;
    return put({op::kStepCopy, static_cast<uint32_t>(slots), 0, 0, addr(batches), 0, 0});
  }
  fuscoResult_t rings(char* table) { return put({op::kStepRings, 0, 0, 0, addr(table), 0, 0}); }
  uint32_t count() const { return count_; }

 private:
  static uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }
  fuscoResult_t put(const op::Step& s) {
    if (count_ == room_)
      return FUSCO_FAIL(fuscoInternalError, kEngine, "an operation needs more than %zu steps",
                        room_);
    steps_[count_++] = s;
    return fuscoSuccess;
  }
  op::Step* steps_;
  size_t room_;
  uint32_t count_ = 0;
  uint32_t barriers_ = 0;
};

// One handshake of kind `kind`: this rank posts to every involved peer, then waits for each
// peer's post (watched by the progress thread, which counts it for the guard); a captured
// operation's waiter clears its semaphores once every block passed them.
fuscoResult_t handshake(Communicator& c, const PairFlags& f, ProgramWriter& w, int kind,
                        bool postAsSender, uint32_t phase, const char* what) {
  const int word = f.word(kind);
  FUSCO_CHECK(w.barrier());
  for (size_t p = 0; p < f.involved.size(); ++p) {
    if (!f.involved[p]) continue;
    const uint32_t v = f.graph ? 1 : postAsSender ? f.sendSeq[p] : f.recvSeq[p];
    FUSCO_CHECK(w.post(f.flags[p].devPost[word], v));
  }
  for (size_t p = 0; p < f.involved.size(); ++p) {
    if (!f.involved[p]) continue;
    const uint32_t v = f.graph ? 1 : postAsSender ? f.recvSeq[p] : f.sendSeq[p];
    FUSCO_CHECK(w.wait(f.flags[p].devWait[word], v, static_cast<int>(p), phase));
    if (!f.graph) c.progress()->add(static_cast<int>(p), f.flags[p].hostWait[kind], v, what);
  }
  if (!f.graph) return fuscoSuccess;
  FUSCO_CHECK(w.barrier());
  for (size_t p = 0; p < f.involved.size(); ++p)
    if (f.involved[p]) FUSCO_CHECK(w.post(f.flags[p].devWait[word], 0));
  return fuscoSuccess;
}

}  // namespace

ParamLayout layoutFor(StreamOps& ops, const Op& op, int n, int involvedPeers, size_t tasksA,
                      size_t tasksB) {
  ParamLayout l;
  const size_t batch = ops.batchBytes();
  if (!op.pullRun) {
    l.slotsA = ops.batchSlots(tasksA);
    l.slotsB = ops.batchSlots(tasksB);
  }
  l.steps = stepBound(involvedPeers);
  l.offA = kParamHeader + l.steps * sizeof(op::Step);
  l.offB = l.offA + l.slotsA * batch;
  l.offBases = l.offB + l.slotsB * batch;
  l.offAligned = l.offBases + (op.pullRun ? n * sizeof(char*) : 0);
  l.offRings = l.offAligned + 16;
  // A pull operation's pushes, the feeds pushed to it and its reduce role (chan_reduce.h).
  l.roles = 2 * static_cast<size_t>(involvedPeers) + (op.pullRun ? 1 : 0);
  l.ringTasks = tasksA + tasksB;
  l.offReduce = l.offRings + sizeof(chan::RoleTable) + l.roles * sizeof(chan::Role) +
                l.ringTasks * sizeof(DevCopyTask);
  l.offReduce = (l.offReduce + 15) / 16 * 16;
  // The reduce role's arguments, then per rank its first packed slot, feed state and feed role.
  l.offSeqBase = l.offReduce + sizeof(chan::ReduceArgs);
  l.offFeeds = l.offSeqBase + n * sizeof(uint64_t);
  l.offFeedOf = l.offFeeds + n * sizeof(chan::FeedState);
  l.bytes = op.pullRun ? l.offFeedOf + n * sizeof(int32_t) : l.offReduce;
  return l;
}

namespace {

// A pull operation's reduce role: the sum it computes (op.pullRun.sum), the bases the progress
// thread wrote, each rank's first packed slot and the feeds' roles (feedOf).
chan::Role reduceRole(const Op& op, const ParamLayout& l, const ParamBlock& b,
                      const std::vector<int32_t>& feedOf) {
  const size_t n = feedOf.size();
  auto* seqBase = reinterpret_cast<uint64_t*>(b.host + l.offSeqBase);
  uint64_t rows = 0;
  for (size_t q = 0; q < n; ++q) {
    seqBase[q] = rows;
    if (!op.peers[q].recvs.empty()) rows += op.peers[q].recvs[0].nrows;
  }
  std::memcpy(b.host + l.offFeedOf, feedOf.data(), n * sizeof(int32_t));
  const DevFinalSum& f = op.pullRun.sum.terms;
  auto at = [](const void* p) { return reinterpret_cast<uint64_t>(p); };
  chan::ReduceArgs a{};
  a.termStart = at(f.termStart), a.termRank = at(f.termRank), a.termRow = at(f.termRow);
  a.termSeq = at(op.pullRun.sum.termSeq), a.termWeight = at(f.termWeight);
  a.termLast = at(f.termLast), a.weights = at(f.weights), a.out = at(f.out);
  a.bases = at(b.mapped + l.offBases), a.seqBase = at(b.mapped + l.offSeqBase);
  a.feedOf = at(b.mapped + l.offFeedOf), a.feeds = at(b.mapped + l.offFeeds);
  a.ntokens = f.ntokens, a.hidden = op.pullRun.sum.hidden;
  a.dt = static_cast<uint32_t>(op.pullRun.sum.dt);
  std::memcpy(b.host + l.offReduce, &a, sizeof(a));
  chan::Role r{};
  r.kind = chan::kReduce;
  r.ntasks = static_cast<uint32_t>(n);
  r.tasks = at(b.mapped + l.offReduce);
  return r;
}

}  // namespace

fuscoResult_t writeRoles(Communicator& c, const Op& op, const ParamLayout& l, const ParamBlock& b,
                         const DeviceTasks& t) {
  char* table = b.host + l.offRings;
  const size_t tasksAt = l.offRings + sizeof(chan::RoleTable) + l.roles * sizeof(chan::Role);
  auto* tasksHost = reinterpret_cast<DevCopyTask*>(b.host + tasksAt);
  auto* tasksMapped = reinterpret_cast<const DevCopyTask*>(b.mapped + tasksAt);
  chan::Role* roles = chan::rolesOf(table);
  uint32_t count = 0;
  size_t used = 0;
  // A pull operation's messages from its peers are feeds, read in place by its reduce role.
  std::vector<int32_t> feedOf(c.nranks(), -1);
  for (size_t p = 0; p < t.ringSend.size(); ++p)
    for (const bool send : {true, false}) {
      const std::vector<DevCopyTask>& list = send ? t.ringSend[p] : t.ringRecv[p];
      if (list.empty()) continue;
      if (count + 1 + (t.reduce ? 1 : 0) > l.roles || used + list.size() > l.ringTasks)
        return FUSCO_FAIL(fuscoInternalError, kEngine, "%s: more ring roles than reserved",
                          op.name);
      std::copy(list.begin(), list.end(), tasksHost + used);
      chan::Role r = c.channels().role(static_cast<int>(p), send, tasksMapped + used,
                                       static_cast<uint32_t>(list.size()));
      if (op.pullRun && !send) r.kind = chan::kFeed, feedOf[p] = static_cast<int32_t>(count);
      roles[count++] = r;
      used += list.size();
    }
  if (t.reduce) roles[count++] = reduceRole(op, l, b, feedOf);
  reinterpret_cast<chan::RoleTable*>(table)->count = count;
  return fuscoSuccess;
}

fuscoResult_t PairFlags::init(Communicator& c, const std::vector<bool>& inv, const Op& op) {
  const int n = c.nranks();
  involved = inv;
  graph = op.captured;
  pull = static_cast<bool>(op.pullRun);
  flags.assign(n, {});
  sendSeq.assign(n, 0), recvSeq.assign(n, 0);
  for (int p = 0; p < n; ++p) {
    if (!involved[p]) continue;
    FUSCO_CHECK(c.deviceFlags(p, &flags[p]));
    sendSeq[p] = c.nextDeviceSendSeq(p);
    recvSeq[p] = c.nextDeviceRecvSeq(p);
  }
  return fuscoSuccess;
}

int PairFlags::word(int kind) const {
  if (!graph) return kind;
  const bool first = pull ? kind == 1 : kind == 0;
  return first ? 2 : 3;
}

fuscoResult_t enqueueStream(Communicator& c, Op& op, const PairFlags& f, uint64_t index,
                            const ParamLayout& l, const ParamBlock& b) {
  DeviceQueue& q = *c.deviceQueue();
  StreamOps& ops = *c.streamOps();
  op::Header* h = op::headerOf(b.host);
  h->words = reinterpret_cast<uint64_t>(q.wordsDev());
  // The progress thread breaks the comm first, on a timeout that counts every sign of progress;
  // the kernel's own bound covers a progress thread that cannot.
  h->timeoutNs = static_cast<uint64_t>(c.timeoutMs()) * 2000000ull;
  h->failWord = op.pullRun ? reinterpret_cast<uint64_t>(b.mapped + l.offAligned) : 0;
  ProgramWriter w(b.host, l.steps);
  // From here on nothing of this thread may wait for the device (docs/DESIGN.md, "The CUDA
  // rules"): the guard counts GO before the stream holds it.
  c.progress()->add(-1, q.goHost(), static_cast<uint32_t>(index), "the call's peers to agree");
  FUSCO_CHECK(w.wait(q.goDev(), static_cast<uint32_t>(index), c.rank(), op::kPhaseGo));
  uint32_t firstLaunch = 0;
  if (op.pullRun) {
    FUSCO_CHECK(handshake(c, f, w, 1, true, op::kPhaseReady, "its buffer to be ready"));
    // Rows pushed instead of offered, and the sum over them (chan_reduce.h), if any.
    FUSCO_CHECK(w.rings(b.mapped + l.offRings));
    firstLaunch = w.count();
    FUSCO_CHECK(handshake(c, f, w, 0, false, op::kPhaseDone, "it to finish reading"));
  } else {
    FUSCO_CHECK(handshake(c, f, w, 0, false, op::kPhaseReady, "its buffers to be free"));
    FUSCO_CHECK(w.copy(b.mapped + l.offA, l.slotsA));
    FUSCO_CHECK(w.rings(b.mapped + l.offRings));
    FUSCO_CHECK(handshake(c, f, w, 1, true, op::kPhaseDone, "its data"));
    FUSCO_CHECK(w.copy(b.mapped + l.offB, l.slotsB));
  }
  // A captured operation's parameters are its own: nothing to hand back to the ring.
  if (!op.captured) {
    FUSCO_CHECK(w.barrier());
    FUSCO_CHECK(w.post(b.mapped, 1, true));
  }
  h->steps = w.count();
  if (!op.pullRun) return ops.launchOp(op.stream, b.mapped, 0, w.count());
  FUSCO_CHECK(ops.launchOp(op.stream, b.mapped, 0, firstLaunch));
  FUSCO_CHECK(op.pullRun(reinterpret_cast<const char* const*>(b.mapped + l.offBases),
                         reinterpret_cast<const uint32_t*>(b.mapped + l.offAligned), op.stream));
  return ops.launchOp(op.stream, b.mapped, firstLaunch, w.count() - firstLaunch);
}

}  // namespace fusco
