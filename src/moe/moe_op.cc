#include "moe/moe_op.h"

#include <algorithm>

namespace fusco {

namespace {

constexpr uint32_t bit(MsgKind k) { return uint32_t{1} << static_cast<int>(k); }

constexpr MsgKindRule kRules[] = {
    {0, 0, 0},                                                // Plain
    {0, 1, 0},                                                // NetOwn
    {1, 1, bit(MsgKind::Plain)},                              // NetRelayed
    {2, 2, bit(MsgKind::NetOwn) | bit(MsgKind::NetRelayed)},  // FanOut
    {1, 1, bit(MsgKind::Plain)},                              // NodeSum
    {2, 2, bit(MsgKind::NodeSum)},                            // SumPass
};
constexpr const char* kNames[] = {"plain",          "own network rows", "relayed network rows",
                                  "forwarded rows", "node sums",        "relayed node sums"};
constexpr int kKinds = static_cast<int>(MsgKind::Count);
static_assert(sizeof(kRules) / sizeof(kRules[0]) == kKinds, "one rule per kind");
static_assert(sizeof(kNames) / sizeof(kNames[0]) == kKinds, "one name per kind");

// Every kind that waits has a stage above the bound of each kind it waits for, and no kind may
// be queued behind a stage above its own bound only to wait for itself: the stages order the
// messages, so no cycle of waits exists.
constexpr bool rulesAreAcyclic() {
  for (int k = 0; k < kKinds; ++k) {
    const MsgKindRule& r = kRules[k];
    if (r.bound < r.stage) return false;
    if ((r.stage == 0) != (r.awaits == 0)) return false;
    for (int j = 0; j < kKinds; ++j)
      if ((r.awaits >> j & 1) && kRules[j].bound >= r.stage) return false;
  }
  return true;
}
static_assert(rulesAreAcyclic(), "a gated message kind could wait on a message queued behind it");

}  // namespace

const MsgKindRule& kindRule(MsgKind k) { return kRules[static_cast<int>(k)]; }
const char* kindName(MsgKind k) { return kNames[static_cast<int>(k)]; }

fuscoResult_t checkGateOrder(const MoeWork& w, const char* name) {
  for (size_t p = 0; p < w.peers.size(); ++p) {
    const auto& sends = w.peers[p].sends;
    if (w.kinds[p].size() != sends.size())
      return FUSCO_FAIL(fuscoInternalError, kEngine, "%s: %zu sends to rank %zu but %zu kinds",
                        name, sends.size(), p, w.kinds[p].size());
    uint8_t ahead = 0;  // the highest stage queued so far on this pair
    for (size_t i = 0; i < sends.size(); ++i) {
      const MsgKind k = w.kinds[p][i];
      const MsgKindRule& r = kindRule(k);
      ahead = std::max(ahead, r.stage);
      if ((sends[i].ready != nullptr) != (r.stage > 0))
        return FUSCO_FAIL(fuscoInternalError, kEngine,
                          "%s: message %zu to rank %zu (%s) %s a gate, against its kind", name, i,
                          p, kindName(k), sends[i].ready ? "has" : "lacks");
      if (ahead > r.bound)
        return FUSCO_FAIL(fuscoInternalError, kEngine,
                          "%s: message %zu to rank %zu (%s) is queued behind a stage-%d message; "
                          "a gate could wait on it (deadlock)",
                          name, i, p, kindName(k), ahead);
    }
  }
  return fuscoSuccess;
}

fuscoResult_t runMoeOp(Communicator& c, const char* name, const ArgCheck& a,
                       const std::vector<PeerWork>& work, bool agreed, void* stream, bool onDevice,
                       PullRun pullRun, LateSizes late, std::function<void(bool)> after,
                       size_t latePeerBound) {
  Op op(c.nranks());
  op.stream = stream;
  op.hostData = !onDevice;
  op.name = name;
  op.kind = OpKind::Moe;
  op.collective = true;
  op.argStatus = a.status;
  op.argError = a.message;
  op.agreed = agreed;
  op.pullRun = std::move(pullRun);
  op.late = std::move(late);
  op.after = std::move(after);
  op.latePeerBound = latePeerBound;
  if (a.ok()) op.peers = work;
  return runOp(c, op);
}

fuscoResult_t runMoeWork(Communicator& c, const char* name, const ArgCheck& a, const MoeWork& work,
                         bool agreed) {
  ArgCheck checked = a;
  // A broken rule is a bug of this rank's schedule: it still joins, so peers fail at once.
  if (checked.ok()) joinFailure(checkGateOrder(work, name), &checked);
  return runMoeOp(c, name, checked, work.peers, agreed);
}

void joinFailure(fuscoResult_t r, ArgCheck* a) {
  if (r == fuscoSuccess || !a->ok()) return;
  a->status = r;
  a->message = threadLastError();
}

char* joinScratch(Communicator& c, int slot, size_t bytes, ArgCheck* a) {
  char* p = nullptr;
  if (!a->ok() || bytes == 0) return nullptr;
  joinFailure(c.scratch(slot, bytes, &p), a);
  return a->ok() ? p : nullptr;
}

fuscoResult_t exchange(Communicator& c, const char* name, const ArgCheck& a,
                       const std::vector<RowStream>& sends, const std::vector<RowStream>& recvs) {
  std::vector<PeerWork> work(sends.size());
  for (size_t p = 0; p < work.size(); ++p) {
    work[p].sends.push_back(sends[p]);
    work[p].recvs.push_back(recvs[p]);
  }
  return runMoeOp(c, name, a, work);
}

// Sizes first, then the words themselves.
fuscoResult_t exchangeWords(Communicator& c, const char* name, const ArgCheck& a,
                            const std::vector<std::vector<int32_t>>& out,
                            std::vector<std::vector<int32_t>>* in) {
  int n = c.nranks();
  std::vector<uint64_t> mySizes(n, 0), theirSizes(n, 0);
  std::vector<RowStream> s(n), r(n);
  for (int p = 0; p < n && a.ok(); ++p) {
    mySizes[p] = out[p].size();
    s[p] = RowStream::flat(&mySizes[p], sizeof(uint64_t));
    r[p] = RowStream::flat(&theirSizes[p], sizeof(uint64_t));
  }
  FUSCO_CHECK(exchange(c, name, a, s, r));
  in->resize(n);  // the lists keep their storage (a replanned handle's)
  // A peer that announced too many words fails this rank's part of the second exchange, which it
  // still joins, so every rank fails the same call with the reason.
  ArgCheck b = a;
  for (int p = 0; p < n; ++p) {
    if (theirSizes[p] > kMaxPlanWords) {
      (*in)[p].clear();
      if (b.ok())
        joinFailure(FUSCO_FAIL(fuscoRemoteError, kPlan, "%s: rank %d announced %llu words", name, p,
                               static_cast<unsigned long long>(theirSizes[p])),
                    &b);
      continue;
    }
    (*in)[p].resize(theirSizes[p]);
    s[p] = RowStream::flat(out[p].data(), out[p].size() * sizeof(int32_t));
    r[p] = RowStream::flat((*in)[p].data(), theirSizes[p] * sizeof(int32_t));
  }
  return exchange(c, name, b, s, r);
}

}  // namespace fusco
