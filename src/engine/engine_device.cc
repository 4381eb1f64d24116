#include "engine/engine_device.h"

#include <algorithm>

#include "core/log.h"
#include "core/result.h"
#include "device/cuda_rt.h"
#include "device/device_ops.h"

namespace fusco {

namespace {

constexpr size_t kStagingAlign = 256;

bool flat(const RowStream& s) { return s.rows == nullptr && s.fanStart == nullptr; }

uint64_t total(const std::vector<uint64_t>& v) {
  uint64_t n = 0;
  for (uint64_t b : v) n += b;
  return n;
}

// One copy from stream s to stream d (same bytes); a flat side takes the other side's rows.
fuscoResult_t copyTask(const RowStream& s, const RowStream& d, const char* opName, DevCopyTask* t) {
  t->src = s.base;
  t->srcRows = s.rows;
  t->dst = d.base;
  t->dstRows = d.rows;
  t->fanStart = d.fanStart;
  t->fanRows = d.fanRows;
  t->totalBytes = s.bytes();
  if (flat(s) && flat(d)) {
    *t = flatCopyTask(s.base, d.base, s.bytes());
  } else if (flat(s)) {
    t->rowBytes = d.rowBytes;
    t->nrows = d.nrows;
  } else if (flat(d) || s.rowBytes == d.rowBytes) {
    t->rowBytes = s.rowBytes;
    t->nrows = s.nrows;
  } else {
    return FUSCO_FAIL(fuscoInvalidUsage, kEngine,
                      "%s: rows of %zu bytes cannot land in rows of %zu bytes on the GPU", opName,
                      s.rowBytes, d.rowBytes);
  }
  if (t->rowBytes * t->nrows < t->totalBytes && !(flat(s) && flat(d)))
    return FUSCO_FAIL(fuscoInternalError, kEngine,
                      "%s: a device copy of %llu bytes does not match its rows", opName,
                      static_cast<unsigned long long>(t->totalBytes));
  return fuscoSuccess;
}

}  // namespace

fuscoResult_t deviceOffers(Communicator& c, const Op& op, const std::vector<bool>& involved,
                           std::vector<PairHeader>* mine, DeviceOffers* offers) {
  const int n = c.nranks();
  offers->stagedAt.assign(n, {});
  size_t staged = 0;
  for (int p = 0; p < n; ++p) {
    if (p == c.rank() || !involved[p]) continue;
    PairHeader& h = (*mine)[p];
    offers->stagedAt[p].assign(h.recvBytes.size(), -1);
    for (size_t m = 0; m < h.recvBytes.size(); ++m) {
      if (h.recvTokens[m] != kStagedToken || h.recvBytes[m] == 0) continue;  // offered in place
      offers->stagedAt[p][m] = static_cast<int64_t>(staged);
      staged += (h.recvBytes[m] + kStagingAlign - 1) / kStagingAlign * kStagingAlign;
    }
  }
  if (staged == 0) return fuscoSuccess;
  FUSCO_CHECK(c.scratch(kDeviceStagingScratch, staged, &offers->staging));
  for (int p = 0; p < n; ++p) {
    for (size_t m = 0; m < offers->stagedAt[p].size(); ++m) {
      const int64_t at = offers->stagedAt[p][m];
      if (at < 0) continue;
      PairHeader& h = (*mine)[p];
      h.recvExtents[m] = h.recvBytes[m];  // the sender writes the bytes contiguously
      if (!c.regionToken(p, offers->staging + at, h.recvBytes[m], &h.recvTokens[m]))
        return FUSCO_FAIL(fuscoInternalError, kEngine,
                          "%s: the staging area is not reachable by rank %d", op.name, p);
    }
  }
  return fuscoSuccess;
}

namespace {

// The flags of every pair of a device operation: which pairs move data each way, and this
// operation's sequence number for each.
struct PairFlags {
  std::vector<DeviceFlags> flags;
  std::vector<uint32_t> sendSeq, recvSeq;
  std::vector<bool> sends, recvs;

  fuscoResult_t init(Communicator& c, const std::vector<PairHeader>& mine,
                     const std::vector<bool>& moves) {
    const int n = c.nranks();
    flags.assign(n, {});
    sendSeq.assign(n, 0), recvSeq.assign(n, 0);
    sends.assign(n, false), recvs.assign(n, false);
    for (int p = 0; p < n; ++p) {
      if (p == c.rank() || !moves[p]) continue;
      sends[p] = total(mine[p].sendBytes) > 0;
      recvs[p] = total(mine[p].recvBytes) > 0;
      if (sends[p] || recvs[p]) FUSCO_CHECK(c.deviceFlags(p, &flags[p]));
      if (sends[p]) sendSeq[p] = c.nextDeviceSendSeq(p);
      if (recvs[p]) recvSeq[p] = c.nextDeviceRecvSeq(p);
    }
    return fuscoSuccess;
  }
  // Stream-ordered: writes flag `kind` to every peer this rank receives from (toSenders) or
  // sends to (otherwise)...
  fuscoResult_t post(void* s, int kind, bool toSenders) const {
    const auto& who = toSenders ? recvs : sends;
    const auto& seq = toSenders ? recvSeq : sendSeq;
    for (size_t p = 0; p < who.size(); ++p)
      if (who[p]) FUSCO_CHECK(cudaStreamWriteFlag(s, flags[p].devPost[kind], seq[p]));
    return fuscoSuccess;
  }
  // ... and waits for flag `kind` from them, each wait watched on the host (DeviceWatch).
  fuscoResult_t await(Communicator& c, void* s, int kind, bool fromSenders,
                      const char* what) const {
    const auto& who = fromSenders ? recvs : sends;
    const auto& seq = fromSenders ? recvSeq : sendSeq;
    for (size_t p = 0; p < who.size(); ++p) {
      if (!who[p]) continue;
      FUSCO_CHECK(cudaStreamWaitFlag(s, flags[p].devWait[kind], seq[p]));
      c.watch()->add(static_cast<int>(p), flags[p].hostWait[kind], seq[p], what);
    }
    return fuscoSuccess;
  }
};

// A pull operation (Op::pullRun): senders say "ready" (flag 1), receivers read with one kernel
// and say "done reading" (flag 0); a sender's stream goes on once every receiver is done.
fuscoResult_t devicePullPhase(Communicator& c, const Op& op, const std::vector<PairHeader>& mine,
                              const std::vector<PairHeader>& theirs,
                              const std::vector<bool>& moves) {
  const int n = c.nranks(), me = c.rank();
  void* s = op.stream;
  PairFlags f;
  FUSCO_CHECK(f.init(c, mine, moves));
  std::vector<const char*> bases(n, nullptr);
  // A failure here still walks every flag round (without reading), so no peer waits on this rank.
  fuscoResult_t r = fuscoSuccess;
  for (int p = 0; p < n && r == fuscoSuccess; ++p) {
    if (!moves[p])
      continue;  // one message per pair and one offer per message: checked before the verdict
    if (p == me) {
      if (!op.peers[me].sends.empty()) bases[me] = op.peers[me].sends[0].base;
      continue;
    }
    if (!f.recvs[p]) continue;
    const PairHeader& t = theirs[p];
    const PeerConn& pc = c.conn(p);
    void* base =
        t.sendTokens.empty() || t.sendTokens[0] == kStagedToken || pc.ops->peerPointer == nullptr
            ? nullptr
            : pc.ops->peerPointer(pc.tc, p, t.sendTokens[0], t.sendExtents[0]);
    if (base == nullptr)
      r = FUSCO_FAIL(fuscoUnhandledCudaError, kEngine, "%s: cannot map the buffer rank %d offered",
                     op.name, p);
    bases[p] = static_cast<const char*>(base);
  }
  FUSCO_CHECK(f.post(s, 1, false));  // "ready" to every reader
  FUSCO_CHECK(f.await(c, s, 1, true, "its buffer to be ready"));
  if (r == fuscoSuccess) r = op.pullRun(bases, s);
  // A mapping or read failure still walks the last round, so the owners do not wait for the
  // watchdog; its error (logged where it was detected) stays the thread's last one.
  FUSCO_CHECK(f.post(s, 0, true));  // "done reading" to every owner
  FUSCO_CHECK(f.await(c, s, 0, false, "it to finish reading"));
  return r;
}

}  // namespace

fuscoResult_t deviceDataPhase(Communicator& c, const Op& op, const std::vector<PairHeader>& mine,
                              const std::vector<PairHeader>& theirs, const std::vector<bool>& moves,
                              const DeviceOffers& offers) {
  const int n = c.nranks(), me = c.rank();
  void* s = op.stream;
  FUSCO_CHECK(c.useDevice());
  if (op.pullRun) return devicePullPhase(c, op, mine, theirs, moves);
  PairFlags f;
  FUSCO_CHECK(f.init(c, mine, moves));
  // 1. Tell each sender that this rank's buffers may be written, then wait until each receiver
  //    said so.
  FUSCO_CHECK(f.post(s, 0, true));
  FUSCO_CHECK(f.await(c, s, 0, false, "its buffers to be free"));
  // 2. One pass over every message: source rows straight into the final (or staged) rows.
  std::vector<DevCopyTask> copies;
  for (int p = 0; p < n; ++p) {
    if (!moves[p]) continue;
    const PeerWork& w = op.peers[p];
    for (size_t m = 0; m < w.sends.size(); ++m) {
      const RowStream& src = w.sends[m];
      if (src.bytes() == 0) continue;
      RowStream dst;
      if (p == me) {
        dst = op.peers[me].recvs[m];
      } else {
        const uint64_t token = theirs[p].recvTokens[m], extent = theirs[p].recvExtents[m];
        const PeerConn& pc = c.conn(p);
        void* base = token == kStagedToken || pc.ops->peerPointer == nullptr
                         ? nullptr
                         : pc.ops->peerPointer(pc.tc, p, token, extent & ~kLayoutSharedBit);
        if (base == nullptr)
          return FUSCO_FAIL(fuscoUnhandledCudaError, kEngine,
                            "%s: cannot map the buffer rank %d offered for message %zu", op.name, p,
                            m);
        if (extent & kLayoutSharedBit) {
          if (w.remoteDst.size() <= m)
            return FUSCO_FAIL(fuscoInternalError, kEngine,
                              "%s: rank %d shares a layout this rank does not know", op.name, p);
          dst = w.remoteDst[m];
          dst.base = static_cast<char*>(base);
        } else {
          dst = RowStream::flat(base, src.bytes());
        }
      }
      DevCopyTask t;
      FUSCO_CHECK(copyTask(src, dst, op.name, &t));
      copies.push_back(t);
    }
  }
  FUSCO_CHECK(deviceCopy(copies, s));
  // 3. Tell each receiver its data is in place; wait for every sender's data.
  FUSCO_CHECK(f.post(s, 1, false));
  FUSCO_CHECK(f.await(c, s, 1, true, "its data"));
  // 4. Staged messages: from the staging area into the final rows.
  copies.clear();
  for (int p = 0; p < n; ++p) {
    if (p == me || !moves[p] || offers.stagedAt.size() <= static_cast<size_t>(p)) continue;
    for (size_t m = 0; m < offers.stagedAt[p].size(); ++m) {
      if (offers.stagedAt[p][m] < 0) continue;
      const RowStream& dst = op.peers[p].recvs[m];
      DevCopyTask t;
      FUSCO_CHECK(copyTask(RowStream::flat(offers.staging + offers.stagedAt[p][m], dst.bytes()),
                           dst, op.name, &t));
      copies.push_back(t);
    }
  }
  return deviceCopy(copies, s);
}

}  // namespace fusco
