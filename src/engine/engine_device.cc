#include "engine/engine_device.h"

#include <algorithm>

#include "core/cuda_guard.h"
#include "core/log.h"
#include "core/result.h"
#include "device/device_ops.h"
#include "engine/op_runner.h"
#include "exec/net_bridge.h"

namespace fusco {

namespace {

constexpr size_t kStagingAlign = 256;

size_t aligned(size_t bytes) { return (bytes + kStagingAlign - 1) / kStagingAlign * kStagingAlign; }

bool flat(const RowStream& s) { return s.rows == nullptr && s.fanStart == nullptr; }

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

size_t areaBytes(const std::vector<RowStream>& msgs);

fuscoResult_t reserveBridgeAreas(Communicator& c, const Op& op, const std::vector<bool>& involved) {
  NetBridge* bridge = c.bridge();
  if (bridge == nullptr) return fuscoSuccess;
  const size_t late = op.latePeerBound > 0 ? op.latePeerBound + 4 * kStagingAlign : 0;
  std::vector<std::pair<size_t, size_t>> want(c.nranks());
  bool grow = false;
  for (int p = 0; p < c.nranks(); ++p) {
    if (!involved[p] || !bridge->remote(p)) continue;
    want[p] = {std::max(areaBytes(op.peers[p].sends), late),
               std::max(areaBytes(op.peers[p].recvs), late)};
    grow = grow || !bridge->fits(p, want[p].first, want[p].second);
  }
  if (!grow) return fuscoSuccess;
  CudaSetupWindow w;
  FUSCO_CHECK(c.setupWindow(&w, "growing the network bridge's pinned areas"));
  for (int p = 0; p < c.nranks(); ++p)
    if (involved[p] && bridge->remote(p))
      FUSCO_CHECK(bridge->reserve(p, want[p].first, want[p].second));
  return fuscoSuccess;
}

fuscoResult_t deviceOffers(Communicator& c, const Op& op, const std::vector<bool>& involved,
                           std::vector<PairHeader>* mine, DeviceOffers* offers) {
  const int n = c.nranks();
  offers->ring.assign(n, {});
  for (int p = 0; p < n; ++p) {
    // A peer on another node: its rows land in the network bridge's area (deviceTasks).
    if (p == c.rank() || !involved[p] || (c.bridge() && c.bridge()->remote(p))) continue;
    PairHeader& h = (*mine)[p];
    offers->ring[p].assign(h.recvBytes.size(), false);
    for (size_t m = 0; m < h.recvBytes.size(); ++m) {
      if (h.recvTokens[m] != kStagedToken || h.recvBytes[m] == 0) continue;  // offered in place
      if (!c.channels().has(p))
        return FUSCO_FAIL(fuscoInternalError, kEngine, "%s: rank %d has no channel", op.name, p);
      h.recvTokens[m] = kRingToken;
      h.recvExtents[m] = h.recvBytes[m];
      offers->ring[p][m] = true;
    }
  }
  return fuscoSuccess;
}

namespace {

// A pull operation's message from p pushed through the pair's channel (its sender could not
// offer it): the reduce role reads it in place, so its task only sizes it.
DevCopyTask pushedMessage(const PairHeader& t, const RowStream& recv) {
  DevCopyTask m;
  m.rowBytes = recv.rowBytes;
  m.totalBytes = t.sendBytes[0];
  m.nrows = recv.rowBytes ? m.totalBytes / recv.rowBytes : 0;
  return m;
}

// A pull operation: the mapped buffer each peer offered for this rank to read, or the rows it
// pushes (its offer the staged token), and this rank's own pushes.
fuscoResult_t pullBases(Communicator& c, const Op& op, const std::vector<PairHeader>& theirs,
                        const std::vector<bool>& moves, DeviceTasks* out) {
  const int n = c.nranks(), me = c.rank();
  out->bases.assign(n, nullptr);
  out->ringSend.assign(n, {});
  out->ringRecv.assign(n, {});
  for (int p = 0; p < n; ++p) {
    if (!moves[p])
      continue;  // one message per pair and one offer per message: checked before the verdict
    if (p == me) {
      if (!op.peers[me].sends.empty()) out->bases[me] = op.peers[me].sends[0].base;
      continue;
    }
    const RowStream* mine = op.peers[p].sends.empty() ? nullptr : &op.peers[p].sends[0];
    if (mine != nullptr && mine->push && mine->bytes() > 0) {
      DevCopyTask t;
      FUSCO_CHECK(copyTask(*mine, RowStream::flat(nullptr, mine->bytes()), op.name, &t));
      out->ringSend[p].push_back(t);
    }
    const PairHeader& t = theirs[p];
    if (t.sendBytes.empty() || t.sendBytes[0] == 0) continue;
    if (!t.sendTokens.empty() && t.sendTokens[0] == kStagedToken) {
      if (!op.pullRun.sum.terms.termStart || op.peers[p].recvs.empty() || !c.channels().has(p))
        return FUSCO_FAIL(fuscoInternalError, kEngine,
                          "%s: rank %d pushes its rows, which this operation cannot sum", op.name,
                          p);
      out->ringRecv[p].push_back(pushedMessage(t, op.peers[p].recvs[0]));
      out->reduce = true;
      continue;
    }
    const PeerConn& pc = c.conn(p);
    void* base = t.sendTokens.empty() || pc.ops->peerPointer == nullptr
                     ? nullptr
                     : pc.ops->peerPointer(pc.tc, p, t.sendTokens[0], t.sendExtents[0]);
    if (base == nullptr)
      return FUSCO_FAIL(fuscoUnhandledCudaError, kEngine,
                        "%s: cannot map the buffer rank %d offered", op.name, p);
    out->bases[p] = static_cast<const char*>(base);
  }
  out->ready = true;
  return fuscoSuccess;
}

// Where message m to peer p lands: this rank's own receive stream, or the receiver's offer.
fuscoResult_t landing(Communicator& c, const Op& op, const std::vector<PairHeader>& theirs, int p,
                      size_t m, RowStream* dst) {
  const PeerWork& w = op.peers[p];
  if (p == c.rank()) {
    *dst = op.peers[p].recvs[m];
    return fuscoSuccess;
  }
  const uint64_t token = theirs[p].recvTokens[m], extent = theirs[p].recvExtents[m];
  const PeerConn& pc = c.conn(p);
  void* base = token == kStagedToken || pc.ops->peerPointer == nullptr
                   ? nullptr
                   : pc.ops->peerPointer(pc.tc, p, token, extent & ~kLayoutSharedBit);
  if (base == nullptr)
    return FUSCO_FAIL(fuscoUnhandledCudaError, kEngine,
                      "%s: cannot map the buffer rank %d offered for message %zu", op.name, p, m);
  if (extent & kLayoutSharedBit) {
    if (w.remoteDst.size() <= m)
      return FUSCO_FAIL(fuscoInternalError, kEngine,
                        "%s: rank %d shares a layout this rank does not know", op.name, p);
    *dst = w.remoteDst[m];
    dst->base = static_cast<char*>(base);
  } else {
    *dst = RowStream::flat(base, w.sends[m].bytes());
  }
  return fuscoSuccess;
}

}  // namespace

// Bytes of the messages in a network bridge's area, every message starting aligned.
size_t areaBytes(const std::vector<RowStream>& msgs) {
  size_t total = 0;
  for (const RowStream& s : msgs) total += aligned(s.bytes());
  return total;
}

// A peer on another node (net_bridge.h): its messages go through the bridge's areas, the sends
// gathered in message order, the receives scattered from where the peer's land.
fuscoResult_t bridgeTasks(Communicator& c, const Op& op, int p, DeviceTasks* out) {
  const PeerWork& w = op.peers[p];
  NetBridge::Area send, recv;
  FUSCO_CHECK(c.bridge()->areas(p, areaBytes(w.sends), areaBytes(w.recvs), &send, &recv));
  DeviceTasks::Bridged& b = out->bridged[p];
  b = {send.host, 0, recv.host, 0};
  for (const RowStream& src : w.sends) {
    if (src.bytes() == 0) continue;
    DevCopyTask t;
    FUSCO_CHECK(
        copyTask(src, RowStream::flat(send.mapped + b.sendBytes, src.bytes()), op.name, &t));
    out->a.push_back(t);
    b.sendBytes += aligned(src.bytes());
  }
  for (const RowStream& dst : w.recvs) {
    if (dst.bytes() == 0) continue;
    DevCopyTask t;
    FUSCO_CHECK(
        copyTask(RowStream::flat(recv.mapped + b.recvBytes, dst.bytes()), dst, op.name, &t));
    out->b.push_back(t);
    b.recvBytes += aligned(dst.bytes());
  }
  return fuscoSuccess;
}

fuscoResult_t deviceTasks(Communicator& c, const Op& op, const std::vector<PairHeader>& theirs,
                          const std::vector<bool>& moves, const DeviceOffers& offers,
                          DeviceTasks* out) {
  const int n = c.nranks(), me = c.rank();
  if (op.pullRun) return pullBases(c, op, theirs, moves, out);
  NetBridge* bridge = c.bridge();
  if (bridge != nullptr) out->bridged.assign(n, {});
  out->ringSend.assign(n, {});
  out->ringRecv.assign(n, {});
  // a: one pass over every message, source rows straight into the final rows, or into the ring.
  for (int p = 0; p < n; ++p) {
    if (!moves[p]) continue;
    if (bridge != nullptr && bridge->remote(p)) {
      FUSCO_CHECK(bridgeTasks(c, op, p, out));
      continue;
    }
    const PeerWork& w = op.peers[p];
    for (size_t m = 0; m < w.sends.size(); ++m) {
      const RowStream& src = w.sends[m];
      if (src.bytes() == 0) continue;
      DevCopyTask t;
      if (p != me && theirs[p].recvTokens[m] == kRingToken) {
        FUSCO_CHECK(copyTask(src, RowStream::flat(nullptr, src.bytes()), op.name, &t));
        out->ringSend[p].push_back(t);
        continue;
      }
      RowStream dst;
      FUSCO_CHECK(landing(c, op, theirs, p, m, &dst));
      FUSCO_CHECK(copyTask(src, dst, op.name, &t));
      out->a.push_back(t);
    }
  }
  // The messages that come through a channel, into their final rows.
  for (int p = 0; p < n; ++p) {
    if (p == me || !moves[p] || offers.ring.size() <= static_cast<size_t>(p)) continue;
    for (size_t m = 0; m < offers.ring[p].size(); ++m) {
      if (!offers.ring[p][m]) continue;
      const RowStream& dst = op.peers[p].recvs[m];
      DevCopyTask t;
      FUSCO_CHECK(copyTask(RowStream::flat(nullptr, dst.bytes()), dst, op.name, &t));
      out->ringRecv[p].push_back(t);
    }
  }
  out->ready = true;
  return fuscoSuccess;
}

}  // namespace fusco
