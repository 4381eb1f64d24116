// fuscoMoeDispatch and fuscoMoeCombine on host comms (CUDA comms: moe_device.cc): one engine
// operation for dispatch, two for combine (routing weights to the expert side, then one partial
// row per (token, rank) back); under NODE dedup each crosses nodes once per (token, node) through
// a forwarder (and a relay), the hops pipelined inside the same operation.
//
// Dispatch writes each row straight into its final expert-major rows: in the receiver's buffer
// when it can be mapped (the sender knows the receiver's fan rows from the plan), else through a
// staging slot that the receiver scatters. Combine computes each partial row at the expert rank
// directly into the slot (or the source's landing buffer), never into a buffer of its own.
#include <cstring>
#include <vector>

#include "api/api_internal.h"
#include "api/moe_device.h"
#include "api/moe_handle.h"
#include "core/fault.h"
#include "device/reduce.h"
#include "engine/engine.h"

using namespace fusco;

fuscoResult_t fusco::runMoeOp(fuscoComm_t comm, const char* name, const ArgCheck& a,
                              const std::vector<PeerWork>& work, bool agreed, void* stream, bool onDevice,
                              std::function<fuscoResult_t(const std::vector<const char*>&, void*)> pullRun) {
  Communicator& c = *comm->impl;
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
  if (a.status == fuscoSuccess) op.peers = work;
  return runOp(c, op);
}

void fusco::joinFailure(fuscoResult_t r, ArgCheck* a) {
  if (r == fuscoSuccess || a->status != fuscoSuccess) return;
  a->status = r;
  a->message = threadLastError();
}

char* fusco::joinScratch(Communicator& c, int slot, size_t bytes, ArgCheck* a) {
  char* p = nullptr;
  if (a->status != fuscoSuccess || bytes == 0) return nullptr;
  joinFailure(c.scratch(slot, bytes, &p), a);
  return a->status == fuscoSuccess ? p : nullptr;
}

namespace {


struct Traffic {
  size_t intraRows = 0, interRows = 0, intraBytes = 0, interBytes = 0;
  void add(const Communicator& c, int peer, size_t rows, size_t bytes) {
    if (peer == c.rank()) return;  // rows a rank keeps for itself are not traffic
    if (c.nodes().sameNode(c.rank(), peer)) intraRows += rows, intraBytes += bytes;
    else interRows += rows, interBytes += bytes;
  }
  // Every message this rank sends in an operation, as rows of rowBytes each.
  void addSends(const Communicator& c, const std::vector<PeerWork>& work, size_t rowBytes) {
    for (size_t p = 0; p < work.size(); ++p)
      for (const RowStream& s : work[p].sends) add(c, static_cast<int>(p), s.bytes() / rowBytes, s.bytes());
  }
};

size_t rowsToSend(const fuscoMoeHandle& h) {
  size_t n = 0;
  for (const auto& r : h.send.rows) n += r.size();
  return n;
}

bool nodeDedup(const fuscoMoeHandle& h) { return h.dedup == Dedup::Node; }

// The network side of NODE dedup's pair with remote rank p, in global segment order: fn(g, j) for
// every segment crossing between this rank's NIC and forwarder p; j is g's index in st.relayed
// when this rank relays g for a peer of its node, -1 when g is this rank's own.
template <typename Fn>
void forEachSegmentViaNic(const fuscoMoeHandle::NodeState& st, const NodeMap& nodes, int me, int p, Fn fn) {
  // A relay is a rank of its source's node, so only this node's ranks' segments (ascending rank,
  // hence in segment order, as st.relayed) can leave through this rank's NIC.
  size_t j = 0;
  for (int s : nodes.ranksOfNode[nodes.nodeOf[me]]) {
    const auto [first, last] = segmentsOf(st.segs, s);
    for (size_t i = first; i < last; ++i) {
      const NodeSegment& g = st.segs[i];
      if (g.relay != me) continue;
      if (g.forwarder == p) fn(g, s != me ? static_cast<ptrdiff_t>(j) : ptrdiff_t{-1});
      j += s != me;
    }
  }
}

// Writes bytes [off, off + len) of a stream of rows computed column-wise by columns(row, col0,
// ncols, dst). A cut on an element boundary computes just those columns; any other cut goes
// through one temporary row.
template <typename Columns>
void produceRows(size_t rowOut, size_t elem, size_t hidden, size_t off, size_t len, void* dst,
                 std::vector<char>* tmp, Columns columns) {
  char* d = static_cast<char*>(dst);
  for (size_t at = 0; at < len;) {
    size_t row = (off + at) / rowOut, inRow = (off + at) - row * rowOut;
    size_t n = std::min(rowOut - inRow, len - at);
    if (inRow % elem == 0 && n % elem == 0) {
      columns(row, inRow / elem, n / elem, d + at);
    } else {
      tmp->resize(rowOut);
      columns(row, 0, hidden, tmp->data());
      memcpy(d + at, tmp->data() + inRow, n);
    }
    at += n;
  }
}

// A relay's pass-through of a contiguous stream: whatever has landed may leave.
size_t landedBytes(const void* ctx) { return *static_cast<const size_t*>(ctx); }

// A forwarder's send of rows that land in the same operation: rows[i] of the staging area may
// be read once the bytes up to its end have landed (rows ascending).
struct LandedRows {
  const int64_t* rows = nullptr;
  size_t nrows = 0, rowBytes = 0;
  const size_t* landed = nullptr;
  mutable size_t ready = 0;

  static size_t bytesReady(const void* ctx) {
    const LandedRows& g = *static_cast<const LandedRows*>(ctx);
    while (g.ready < g.nrows && static_cast<size_t>(g.rows[g.ready] + 1) * g.rowBytes <= *g.landed) ++g.ready;
    return g.ready * g.rowBytes;
  }
};

// Produces bytes of the partial rows for one source: row i = weighted sum (k order) of the
// expert outputs of fan rows of row rowBase + i from src.
struct PartialSource {
  const fuscoMoeHandle* h;
  int src;
  size_t rowBase;
  const char* expertOut;
  fuscoDataType_t dt;
  size_t hidden, rowOut, elem;
  mutable std::vector<const void*> ptrs;
  mutable std::vector<char> tmp;

  void columns(size_t row, size_t col0, size_t ncols, void* dst) const {
    uint32_t b = h->recv.fanStart[src][rowBase + row], e = h->recv.fanStart[src][rowBase + row + 1];
    ptrs.clear();
    for (uint32_t f = b; f < e; ++f)
      ptrs.push_back(expertOut + h->recv.fanRows[src][f] * rowOut + col0 * elem);
    weightedSumRows(dt, ncols, ptrs.data(), h->recvWeights[src].data() + b, e - b, dst);
  }

  static void produce(const void* ctx, size_t off, size_t len, void* dst) {
    const PartialSource& p = *static_cast<const PartialSource*>(ctx);
    produceRows(p.rowOut, p.elem, p.hidden, off, len, dst, &p.tmp,
                [&](size_t row, size_t c0, size_t nc, void* d) { p.columns(row, c0, nc, d); });
  }
};

// out = the fixed tree's sum of rows (one level). A single term needs no arithmetic.
void sumLevel(fuscoDataType_t dt, size_t hidden, const std::vector<const void*>& rows, void* out) {
  if (rows.size() == 1) canonicalCopyRow(dt, hidden, rows[0], out);
  else sumRows(dt, hidden, rows.data(), rows.size(), out);
}

// Source side: out[t] = sum over nodes (ascending) of sum over the node's ranks (ascending) of
// the token's partial from that rank. In NONE mode the partial is formed here from the raw rows.
// Under NODE dedup the sums of other nodes arrive made (nodeLanding[N]: one row per token of
// h.node.send.nodeTokens[N]).
void finalSum(fuscoMoeHandle& h, const Communicator& c, fuscoDataType_t dt, size_t rowOut, size_t hidden,
              const float* weights, const std::vector<char*>& landing,
              const std::vector<char*>* nodeLanding, void* out) {
  const NodeMap& nodes = c.nodes();
  int n = h.shape.nranks;
  std::vector<size_t> cursor(n, 0), nodeCursor(nodes.numNodes, 0);
  std::vector<char> rankScratch(n * rowOut), nodeScratch(nodes.numNodes * rowOut);
  std::vector<const void*> rankPtrs, nodePtrs, rowPtrs;
  std::vector<float> w;
  for (size_t t = 0; t < h.numTokens; ++t) {
    nodePtrs.clear();
    for (int node = 0; node < nodes.numNodes; ++node) {
      if (nodeLanding != nullptr && node != nodes.nodeOf[c.rank()]) {
        const auto& tokens = h.node.send.nodeTokens[node];
        size_t& cur = nodeCursor[node];
        if (cur < tokens.size() && tokens[cur] == static_cast<int64_t>(t))
          nodePtrs.push_back((*nodeLanding)[node] + cur++ * rowOut);
        continue;
      }
      rankPtrs.clear();
      for (int r : nodes.ranksOfNode[node]) {
        const auto& rows = h.send.rows[r];
        size_t& cur = cursor[r];
        if (cur >= rows.size() || rows[cur] != static_cast<int64_t>(t)) continue;
        if (h.dedup != Dedup::None) {
          rankPtrs.push_back(landing[r] + cur * rowOut);
          ++cur;
          continue;
        }
        rowPtrs.clear();
        w.clear();
        for (; cur < rows.size() && rows[cur] == static_cast<int64_t>(t); ++cur) {
          rowPtrs.push_back(landing[r] + cur * rowOut);
          uint8_t k = h.send.kSlots[r][h.send.kStart[r][cur]];
          w.push_back(weights ? weights[t * h.topk + k] : 1.0f);
        }
        char* dst = rankScratch.data() + r * rowOut;
        weightedSumRows(dt, hidden, rowPtrs.data(), w.data(), rowPtrs.size(), dst);
        rankPtrs.push_back(dst);
      }
      if (rankPtrs.empty()) continue;
      // One node: the node level's sum goes straight to out; the final level (a single term,
      // round(0 + x)) then only turns -0 into +0, in place.
      char* dst = nodes.numNodes == 1 ? static_cast<char*>(out) + t * rowOut
                                      : nodeScratch.data() + node * rowOut;
      sumLevel(dt, hidden, rankPtrs, dst);
      nodePtrs.push_back(dst);
    }
    char* o = static_cast<char*>(out) + t * rowOut;
    if (nodePtrs.empty()) memset(o, 0, rowOut);
    else if (nodePtrs.size() == 1 && nodePtrs[0] == o) canonicalCopyRow(dt, hidden, o, o);
    else sumLevel(dt, hidden, nodePtrs, o);
  }
}

// Routing weights to the expert side (ones when the caller passes none, so every rank ships the
// same shape of message whatever its peers passed).
fuscoResult_t shipWeights(fuscoMoeHandle& h, const float* topkWeights, const ArgCheck& a) {
  Communicator& c = *h.comm->impl;
  int n = c.nranks();
  std::vector<float> ones;
  const float* w = topkWeights;
  if (w == nullptr) {
    ones.assign(h.numTokens * h.topk, 1.0f);
    w = ones.data();
  }
  std::vector<PeerWork> work(n);
  h.recvWeights.resize(n);
  for (int p = 0; p < n && a.status == fuscoSuccess; ++p) {
    work[p].sends.push_back(RowStream::indexed(w, sizeof(float), h.weightIdx[p].data(), h.weightIdx[p].size()));
    h.recvWeights[p].resize(h.recv.fanRows[p].size());
    work[p].recvs.push_back(RowStream::flat(h.recvWeights[p].data(), h.recvWeights[p].size() * sizeof(float)));
  }
  return runMoeOp(h.comm, "fuscoMoeCombine (weights)", a, work);
}

fuscoResult_t combineNode(fuscoMoeHandle& h, const void* expertOut, fuscoDataType_t dt, size_t hidden,
                          const float* topkWeights, void* out, ArgCheck a, std::vector<PeerWork>* work);

// Combine on a host comm; *work: the partial rows' operation (what this rank sent).
fuscoResult_t combine(fuscoMoeHandle& h, const void* expertOut, fuscoDataType_t dt, size_t hidden,
                      const float* topkWeights, void* out, ArgCheck a, std::vector<PeerWork>* workOut) {
  if (nodeDedup(h)) return combineNode(h, expertOut, dt, hidden, topkWeights, out, a, workOut);
  Communicator& c = *h.comm->impl;
  int n = c.nranks();
  const size_t elem = dataTypeSize(dt), rowOut = hidden * elem;
  if (h.dedup != Dedup::None) FUSCO_CHECK(shipWeights(h, topkWeights, a));
  // Landing rows for what comes back, in the communicator's scratch (peers write it directly).
  std::vector<char*> landing(n, nullptr);
  size_t total = 0;
  for (int p = 0; p < n; ++p) total += h.send.rows[p].size() * rowOut;
  char* base = joinScratch(c, kLandingScratch, total, &a);
  std::vector<PartialSource> sources(n);
  std::vector<PeerWork>& work = *workOut;
  size_t at = 0;
  for (int p = 0; p < n && a.status == fuscoSuccess; ++p) {
    size_t back = h.recv.rowsFrom(p);
    if (h.dedup != Dedup::None) {
      sources[p] = PartialSource{&h, p, 0, static_cast<const char*>(expertOut), dt, hidden, rowOut, elem, {}, {}};
      work[p].sends.push_back(RowStream::produced(rowOut, back, &PartialSource::produce, &sources[p]));
    } else {
      work[p].sends.push_back(RowStream::indexed(expertOut, rowOut, h.recv.fanRows[p].data(), back));
    }
    landing[p] = base + at;
    size_t bytes = h.send.rows[p].size() * rowOut;
    work[p].recvs.push_back(RowStream::flat(landing[p], bytes));
    at += bytes;
  }
  // After the weights exchange every rank knows the call is valid everywhere.
  FUSCO_CHECK(runMoeOp(h.comm, "fuscoMoeCombine", a, work, h.dedup != Dedup::None));
  finalSum(h, c, dt, rowOut, hidden, topkWeights, landing, nullptr, out);
  return fuscoSuccess;
}

// A forwarder's row for one segment: row i = the fixed tree's node level, the sum over the local
// ranks (ascending) of their partials for that token, each read once it has landed.
struct NodeSumSource {
  const NodeFwdSeg* f = nullptr;
  const char* const* part = nullptr;  // [localSize] partial landing rows per local rank
  const size_t* landed = nullptr;     // [localSize] bytes landed per local rank
  fuscoDataType_t dt = fuscoFloat32;
  size_t hidden = 0, rowOut = 0, elem = 0, nrows = 0;
  mutable size_t ready = 0;
  mutable std::vector<const void*> ptrs;
  mutable std::vector<char> tmp;

  static size_t bytesReady(const void* ctx) {
    const NodeSumSource& g = *static_cast<const NodeSumSource*>(ctx);
    for (; g.ready < g.nrows; ++g.ready)
      for (uint32_t j = g.f->termStart[g.ready]; j < g.f->termStart[g.ready + 1]; ++j)
        if (g.landed[g.f->termLr[j]] < (g.f->termIdx[j] + 1) * g.rowOut) return g.ready * g.rowOut;
    return g.ready * g.rowOut;
  }
  void columns(size_t row, size_t col0, size_t ncols, void* dst) const {
    ptrs.clear();
    for (uint32_t j = f->termStart[row]; j < f->termStart[row + 1]; ++j)
      ptrs.push_back(part[f->termLr[j]] + f->termIdx[j] * rowOut + col0 * elem);
    if (ptrs.size() == 1) canonicalCopyRow(dt, ncols, ptrs[0], dst);
    else sumRows(dt, ncols, ptrs.data(), ptrs.size(), dst);
  }
  static void produce(const void* ctx, size_t off, size_t len, void* dst) {
    const NodeSumSource& p = *static_cast<const NodeSumSource*>(ctx);
    produceRows(p.rowOut, p.elem, p.hidden, off, len, dst, &p.tmp,
                [&](size_t row, size_t c0, size_t nc, void* d) { p.columns(row, c0, nc, d); });
  }
};

// Combine under NODE dedup, mirroring dispatch: every rank returns its partials for forwarded
// rows to their forwarder; a forwarder sends one node sum per (token, segment) back across the
// network, to the segment's relay, as soon as its partials have landed; a relay passes node sums
// on to their source as they land; the source adds the nodes.
fuscoResult_t combineNode(fuscoMoeHandle& h, const void* expertOut, fuscoDataType_t dt, size_t hidden,
                          const float* topkWeights, void* out, ArgCheck a, std::vector<PeerWork>* workOut) {
  Communicator& c = *h.comm->impl;
  const NodeMap& nodes = c.nodes();
  const int n = c.nranks(), me = c.rank(), myNode = nodes.nodeOf[me];
  const auto& st = h.node;
  const size_t elem = dataTypeSize(dt), rowOut = hidden * elem;
  const size_t nf = st.fwd.size(), ls = nodes.ranksOfNode[myNode].size(), nr = st.relayed.size();
  FUSCO_CHECK(shipWeights(h, topkWeights, a));
  // One scratch area: RANK landing rows (this node), node sums (other nodes), partials to add,
  // node sums passing through as a relay.
  size_t total = 0;
  for (int p = 0; p < n; ++p)
    if (nodes.sameNode(p, me)) total += h.send.rows[p].size() * rowOut;
  for (int node = 0; node < nodes.numNodes; ++node) total += st.send.nodeTokens[node].size() * rowOut;
  for (const NodeFwdSeg& f : st.fwd)
    for (const auto& rows : f.rowsTo) total += rows.size() * rowOut;
  for (size_t i : st.relayed) total += st.segs[i].rows * rowOut;
  char* base = joinScratch(c, kLandingScratch, total, &a);
  size_t at = 0;
  auto carve = [&](size_t bytes) { char* p = base + at; at += bytes; return p; };
  std::vector<char*> landing(n, nullptr), nodeLanding(nodes.numNodes, nullptr), part(nf * ls, nullptr);
  std::vector<char*> relaySums(nr, nullptr);
  std::vector<size_t> landed(nf * ls, 0), relayLanded(nr, 0);
  std::vector<NodeSumSource> sums(nf);
  std::vector<PartialSource> sources;
  size_t numSources = n;
  for (int p = 0; p < n; ++p) numSources += st.inFrom[p].size();
  sources.reserve(numSources);  // streams point into it
  std::vector<PeerWork>& work = *workOut;
  for (int p = 0; p < n && base != nullptr; ++p)
    if (nodes.sameNode(p, me)) landing[p] = carve(h.send.rows[p].size() * rowOut);
  for (int node = 0; node < nodes.numNodes && base != nullptr; ++node)
    nodeLanding[node] = carve(st.send.nodeTokens[node].size() * rowOut);
  for (size_t k = 0; k < nf && base != nullptr; ++k)
    for (size_t lr = 0; lr < ls; ++lr) part[k * ls + lr] = carve(st.fwd[k].rowsTo[lr].size() * rowOut);
  for (size_t j = 0; j < nr && base != nullptr; ++j) relaySums[j] = carve(st.segs[st.relayed[j]].rows * rowOut);
  const char* eo = static_cast<const char*>(expertOut);
  for (int p = 0; p < n && a.status == fuscoSuccess; ++p) {
    auto& w = work[p];
    if (nodes.sameNode(p, me)) {
      sources.push_back(PartialSource{&h, p, 0, eo, dt, hidden, rowOut, elem, {}, {}});
      w.sends.push_back(RowStream::produced(rowOut, h.recv.rowsFrom(p), &PartialSource::produce, &sources.back()));
      for (const NodeInSeg& e : st.inFrom[p]) {
        sources.push_back(PartialSource{&h, st.segs[e.seg].src, e.rowOffset, eo, dt, hidden, rowOut, elem, {}, {}});
        w.sends.push_back(RowStream::produced(rowOut, e.rows, &PartialSource::produce, &sources.back()));
      }
      for (size_t j = 0; j < nr; ++j) {  // node sums relayed back to p
        const NodeSegment& g = st.segs[st.relayed[j]];
        if (g.src != p) continue;
        RowStream s = RowStream::flat(relaySums[j], g.rows * rowOut);
        s.ready = &landedBytes;
        s.readyCtx = &relayLanded[j];
        w.sends.push_back(s);
      }
      w.recvs.push_back(RowStream::flat(landing[p], h.send.rows[p].size() * rowOut));
      const int lr = nodes.localRankOf[p];
      for (size_t k = 0; k < nf; ++k) {
        RowStream r = RowStream::flat(part[k * ls + lr], st.fwd[k].rowsTo[lr].size() * rowOut);
        r.landed = &landed[k * ls + lr];
        w.recvs.push_back(r);
      }
      for (size_t i : st.send.segs) {  // this rank's node sums, relayed by p
        const NodeSegment& g = st.segs[i];
        if (g.relay == p && p != me)
          w.recvs.push_back(RowStream::flat(nodeLanding[g.node] + g.pos0 * rowOut, g.rows * rowOut));
      }
      continue;
    }
    for (size_t k = 0; k < nf; ++k) {
      const NodeSegment& g = st.segs[st.fwd[k].seg];
      if (g.relay != p) continue;
      NodeSumSource& ns = sums[k];
      ns.f = &st.fwd[k];
      ns.part = part.data() + k * ls;
      ns.landed = landed.data() + k * ls;
      ns.dt = dt, ns.hidden = hidden, ns.rowOut = rowOut, ns.elem = elem, ns.nrows = g.rows;
      RowStream s = RowStream::produced(rowOut, g.rows, &NodeSumSource::produce, &ns);
      s.ready = &NodeSumSource::bytesReady;
      s.readyCtx = &ns;
      w.sends.push_back(s);
    }
    forEachSegmentViaNic(st, c.nodes(), me, p, [&](const NodeSegment& g, ptrdiff_t j) {  // returning node sums
      RowStream r = RowStream::flat(j >= 0 ? relaySums[j] : nodeLanding[g.node] + g.pos0 * rowOut, g.rows * rowOut);
      if (j >= 0) r.landed = &relayLanded[j];
      w.recvs.push_back(r);
    });
  }
  FUSCO_CHECK(runMoeOp(h.comm, "fuscoMoeCombine", a, work, true));
  finalSum(h, c, dt, rowOut, hidden, topkWeights, landing, &nodeLanding, out);
  return fuscoSuccess;
}

// Dispatch on a host comm: rows by token index, written straight into the receivers' final rows
// when their buffer is mappable (the plan told each source the receiver's fan rows), else staged.
// The direct (RANK) message of dispatch between this rank and p.
void addRankDispatch(const fuscoMoeHandle& h, int p, const void* x, size_t rowBytes, void* recvX, PeerWork* w) {
  const size_t rows = h.send.rows[p].size();
  w->sends.push_back(RowStream::indexed(x, rowBytes, h.send.rows[p].data(), rows));
  w->remoteDst.push_back(RowStream::fanOut(nullptr, rowBytes, h.send.kStart[p].data(), h.remoteFanRows[p].data(), rows));
  RowStream r = RowStream::fanOut(recvX, rowBytes, h.recv.fanStart[p].data(), h.recv.fanRows[p].data(),
                                  h.recv.rowsFrom(p));
  r.layoutShared = true;
  r.extent = h.recv.numRecvRows * rowBytes;
  w->recvs.push_back(r);
}

// NODE dedup: ranks of this node as under RANK, then (per pair, in segment order) the rows this
// rank forwards, each sent as soon as it has landed, and the rows it hands a relay; across the
// network, the rows of every segment this rank relays (its own, read from x, and those a peer
// handed it, passed on as they land) to their forwarders, landing in staging rows.
fuscoResult_t hostDispatchNode(fuscoMoeHandle& h, const void* x, size_t rowBytes, void* recvX,
                               ArgCheck a, std::vector<PeerWork>* work) {
  Communicator& c = *h.comm->impl;
  const NodeMap& nodes = c.nodes();
  const int n = h.shape.nranks, me = c.rank();
  const auto& st = h.node;
  const size_t nf = st.fwd.size(), ls = nodes.ranksOfNode[nodes.nodeOf[me]].size();
  // Staging: per forwarded segment, then per segment relayed for a peer (st.relayed).
  std::vector<char*> staging(nf, nullptr), relayRows(st.relayed.size(), nullptr);
  size_t total = 0;
  for (const NodeFwdSeg& f : st.fwd) total += st.segs[f.seg].rows * rowBytes;
  for (size_t i : st.relayed) total += st.segs[i].rows * rowBytes;
  char* base = joinScratch(c, kStagingScratch, total, &a);
  size_t at = 0;
  for (size_t k = 0; k < nf && base != nullptr; at += st.segs[st.fwd[k].seg].rows * rowBytes, ++k) staging[k] = base + at;
  for (size_t j = 0; j < st.relayed.size() && base != nullptr; at += st.segs[st.relayed[j]].rows * rowBytes, ++j)
    relayRows[j] = base + at;
  std::vector<size_t> landed(nf, 0), relayLanded(st.relayed.size(), 0);
  std::vector<LandedRows> gates(nf * ls);
  for (int p = 0; p < n && a.status == fuscoSuccess; ++p) {
    auto& w = (*work)[p];
    if (nodes.sameNode(p, me)) {
      // Per pair, messages that wait for nothing come first, so a gated message never holds
      // up one that some other rank's gate waits for (no cycle across the two hops).
      addRankDispatch(h, p, x, rowBytes, recvX, &w);
      for (size_t i : st.send.segs) {  // rows p relays for this rank
        const NodeSegment& g = st.segs[i];
        if (g.relay == p && p != me)
          w.sends.push_back(RowStream::indexed(x, rowBytes, st.send.nodeTokens[g.node].data() + g.pos0, g.rows));
      }
      const int lr = nodes.localRankOf[p];
      for (size_t k = 0; k < nf; ++k) {
        const auto& rows = st.fwd[k].rowsTo[lr];
        LandedRows& g = gates[k * ls + lr];
        g = LandedRows{rows.data(), rows.size(), rowBytes, &landed[k], 0};
        RowStream s = RowStream::indexed(staging[k], rowBytes, rows.data(), rows.size());
        s.ready = &LandedRows::bytesReady;
        s.readyCtx = &g;
        w.sends.push_back(s);
        // Where those rows land in p's recvX: written there directly when p's buffer is mappable.
        while (w.remoteDst.size() + 1 < w.sends.size()) w.remoteDst.push_back(RowStream());
        const auto& fs = st.fwdFanStart[k * ls + lr];
        if (p != me && fs.size() == rows.size() + 1)
          w.remoteDst.push_back(RowStream::fanOut(nullptr, rowBytes, fs.data(), st.fwdFanRows[k * ls + lr].data(), rows.size()));
      }
      for (size_t j = 0; j < st.relayed.size(); ++j) {  // rows this rank relays for p
        if (st.segs[st.relayed[j]].src != p) continue;
        RowStream r = RowStream::flat(relayRows[j], st.segs[st.relayed[j]].rows * rowBytes);
        r.landed = &relayLanded[j];
        w.recvs.push_back(r);
      }
      for (const NodeInSeg& e : st.inFrom[p]) {
        const int src = st.segs[e.seg].src;
        RowStream r = RowStream::fanOut(recvX, rowBytes, h.recv.fanStart[src].data() + e.rowOffset,
                                        h.recv.fanRows[src].data(), e.rows);
        r.layoutShared = true;  // the forwarder was told these fan rows
        r.extent = h.recv.numRecvRows * rowBytes;
        w.recvs.push_back(r);
      }
      continue;
    }
    forEachSegmentViaNic(st, c.nodes(), me, p, [&](const NodeSegment& g, ptrdiff_t j) {  // leaving rows
      if (j < 0) {
        w.sends.push_back(RowStream::indexed(x, rowBytes, st.send.nodeTokens[g.node].data() + g.pos0, g.rows));
        return;
      }
      RowStream s = RowStream::flat(relayRows[j], g.rows * rowBytes);
      s.ready = &landedBytes;
      s.readyCtx = &relayLanded[j];
      w.sends.push_back(s);
    });
    for (size_t k = 0; k < nf; ++k) {
      const NodeSegment& g = st.segs[st.fwd[k].seg];
      if (g.relay != p) continue;
      RowStream r = RowStream::flat(staging[k], g.rows * rowBytes);
      r.landed = &landed[k];
      w.recvs.push_back(r);
    }
  }
  if (a.status == fuscoSuccess)
    for (int64_t row : h.recv.paddingRows) memset(static_cast<char*>(recvX) + row * rowBytes, 0, rowBytes);
  return runMoeOp(h.comm, "fuscoMoeDispatch", a, *work);
}

fuscoResult_t hostDispatch(fuscoMoeHandle& h, const void* x, size_t rowBytes, void* recvX, const ArgCheck& a,
                           std::vector<PeerWork>* work) {
  if (nodeDedup(h)) return hostDispatchNode(h, x, rowBytes, recvX, a, work);
  const int n = h.shape.nranks;
  for (int p = 0; p < n && a.status == fuscoSuccess; ++p) addRankDispatch(h, p, x, rowBytes, recvX, &(*work)[p]);
  if (a.status == fuscoSuccess)
    for (int64_t row : h.recv.paddingRows) memset(static_cast<char*>(recvX) + row * rowBytes, 0, rowBytes);
  return runMoeOp(h.comm, "fuscoMoeDispatch", a, *work);
}

}  // namespace

extern "C" {

fuscoResult_t fuscoMoeDispatch(fuscoMoeHandle_t handle, const void* x, size_t rowBytes, void* recvX,
                               void* stream) {
  fuscoComm_t comm = handle ? handle->comm : nullptr;
  return guarded(comm, "fuscoMoeDispatch", [&]() -> fuscoResult_t {
    if (handle == nullptr) return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoMoeDispatch: handle is NULL");
    FUSCO_CHECK(checkComm(comm, "fuscoMoeDispatch"));
    Communicator& c = *comm->impl;
    FUSCO_CHECK(faultPoint(FaultPhase::Dispatch, c.rank(), [&](const char* w) { c.markBroken(fuscoRemoteError, w); }));
    fuscoMoeHandle& h = *handle;
    ArgCheck a;
    if (c.memType() == fuscoMemHost && stream != nullptr)
      a.fail("fuscoMoeDispatch: stream must be NULL for a host-memory communicator");
    if (rowBytes == 0) a.fail("fuscoMoeDispatch: rowBytes is 0");
    if (x == nullptr && rowsToSend(h) > 0) a.fail("fuscoMoeDispatch: x is NULL with %zu rows to send", rowsToSend(h));
    if (recvX == nullptr && h.recv.numRecvRows > 0)
      a.fail("fuscoMoeDispatch: recvX is NULL with %zu rows to receive", h.recv.numRecvRows);
    checkDevicePtr(comm, x, "fuscoMoeDispatch", "x", &a);
    checkDevicePtr(comm, recvX, "fuscoMoeDispatch", "recvX", &a);
    int n = c.nranks();
    std::vector<PeerWork> work(n);
    if (isCudaComm(comm)) {
      FUSCO_CHECK(deviceDispatch(h, x, rowBytes, recvX, a, stream, &work));
    } else {
      FUSCO_CHECK(hostDispatch(h, x, rowBytes, recvX, a, &work));
    }
    Traffic traffic;  // what this rank put on each path: the messages of the operation it ran
    traffic.addSends(c, work, rowBytes);
    h.stats.dispatchRowsIntraNode = traffic.intraRows;
    h.stats.dispatchRowsInterNode = traffic.interRows;
    h.stats.dispatchBytesIntraNode = traffic.intraBytes;
    h.stats.dispatchBytesInterNode = traffic.interBytes;
    return fuscoSuccess;
  });
}

fuscoResult_t fuscoMoeCombine(fuscoMoeHandle_t handle, const void* expertOut, fuscoDataType_t datatype,
                              size_t hidden, const float* topkWeights, void* out, void* stream) {
  fuscoComm_t comm = handle ? handle->comm : nullptr;
  return guarded(comm, "fuscoMoeCombine", [&]() -> fuscoResult_t {
    if (handle == nullptr) return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoMoeCombine: handle is NULL");
    FUSCO_CHECK(checkComm(comm, "fuscoMoeCombine"));
    FUSCO_CHECK(faultPoint(FaultPhase::Combine, comm->impl->rank(), [&](const char* w) { comm->impl->markBroken(fuscoRemoteError, w); }));
    fuscoMoeHandle& h = *handle;
    ArgCheck a;
    if (comm->impl->memType() == fuscoMemHost && stream != nullptr)
      a.fail("fuscoMoeCombine: stream must be NULL for a host-memory communicator");
    const int dt = rawEnum(datatype);
    if (dt != fuscoFloat32 && dt != fuscoBfloat16 && dt != fuscoFloat16)
      a.fail("fuscoMoeCombine: datatype %d is not fuscoFloat32, fuscoBfloat16 or fuscoFloat16", dt);
    if (hidden == 0) a.fail("fuscoMoeCombine: hidden is 0");
    if (expertOut == nullptr && h.recv.numRecvRows > 0)
      a.fail("fuscoMoeCombine: expertOut is NULL with %zu rows", h.recv.numRecvRows);
    if (out == nullptr && h.numTokens > 0) a.fail("fuscoMoeCombine: out is NULL with %zu tokens", h.numTokens);
    checkDevicePtr(comm, expertOut, "fuscoMoeCombine", "expertOut", &a);
    checkDevicePtr(comm, topkWeights, "fuscoMoeCombine", "topkWeights", &a);
    checkDevicePtr(comm, out, "fuscoMoeCombine", "out", &a);
    // Only a validated value is used as the enum (any int is legal from C).
    const fuscoDataType_t type = a.status == fuscoSuccess ? static_cast<fuscoDataType_t>(dt) : fuscoFloat32;
    std::vector<PeerWork> work(comm->impl->nranks());
    if (isCudaComm(comm)) FUSCO_CHECK(deviceCombine(h, expertOut, type, hidden, topkWeights, out, a, stream, &work));
    else FUSCO_CHECK(combine(h, expertOut, type, hidden, topkWeights, out, a, &work));
    // What this rank put on each path: the routing weights (RANK, host path), then the rows it
    // sent back (on the GPU: the rows its peers read from it).
    Traffic traffic;
    for (int p = 0; p < comm->impl->nranks() && h.dedup != Dedup::None && !isCudaComm(comm); ++p)
      traffic.add(*comm->impl, p, 0, h.weightIdx[p].size() * sizeof(float));
    traffic.addSends(*comm->impl, work, hidden * dataTypeSize(type));
    h.stats.combineBytesIntraNode = traffic.intraBytes;
    h.stats.combineBytesInterNode = traffic.interBytes;
    return fuscoSuccess;
  });
}

}  // extern "C"
