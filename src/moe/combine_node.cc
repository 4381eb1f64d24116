// Combine under NODE dedup, mirroring dispatch: every rank returns its partials for forwarded
// rows to their forwarder; a forwarder sends one node sum per (token, segment) back across the
// network, to the segment's relay, as soon as its partials have landed; a relay passes node sums
// on to their source as they land; the source adds the nodes (combine_sum.cc). Message kinds
// (moe_op.h) state what each message waits for; the operation is checked before it runs.
#include <vector>

#include "core/datatype.h"
#include "device/reduce.h"
#include "moe/moe_exec.h"
#include "moe/node_streams.h"
#include "moe/partial_rows.h"

namespace fusco {

namespace {

// A forwarder's row for one segment: row i = the fixed tree's node level, the sum over the local
// ranks (ascending) of their partials for that token, each read once it has landed.
struct NodeSumSource {
  const NodeFwdSeg* f = nullptr;
  const char* const* part = nullptr;  // [localSize] partial landing rows per local rank
  const size_t* landed = nullptr;     // [localSize] bytes landed per local rank
  RowShape shape;
  size_t nrows = 0;
  mutable size_t ready = 0;
  mutable std::vector<const void*> ptrs;
  mutable std::vector<char> tmp;

  static size_t bytesReady(const void* ctx) {
    const NodeSumSource& g = *static_cast<const NodeSumSource*>(ctx);
    const size_t rowOut = g.shape.rowOut;
    for (; g.ready < g.nrows; ++g.ready)
      for (uint32_t j = g.f->termStart[g.ready]; j < g.f->termStart[g.ready + 1]; ++j)
        if (g.landed[g.f->termLr[j]] < (g.f->termIdx[j] + 1) * rowOut) return g.ready * rowOut;
    return g.ready * rowOut;
  }
  void columns(size_t row, size_t col0, size_t ncols, void* dst) const {
    ptrs.clear();
    for (uint32_t j = f->termStart[row]; j < f->termStart[row + 1]; ++j)
      ptrs.push_back(part[f->termLr[j]] + f->termIdx[j] * shape.rowOut + col0 * shape.elem);
    if (ptrs.size() == 1)
      canonicalCopyRow(shape.dt, ncols, ptrs[0], dst);
    else
      sumRows(shape.dt, ncols, ptrs.data(), ptrs.size(), dst);
  }
  static void produce(const void* ctx, size_t off, size_t len, void* dst) {
    const NodeSumSource& p = *static_cast<const NodeSumSource*>(ctx);
    produceRows(p.shape.rowOut, p.shape.elem, p.shape.hidden, off, len, dst, &p.tmp,
                [&](size_t row, size_t c0, size_t nc, void* d) { p.columns(row, c0, nc, d); });
  }
};

// The landing areas of one NODE combine and the sources and gates of its messages. Streams point
// into this object: it lives until the operation returns.
class NodeCombine {
 public:
  NodeCombine(MoeHandle& h, const char* expertOut, const RowShape& shape)
      : h_(h),
        st_(h.node),
        nodes_(h.comm->nodes()),
        me_(h.comm->rank()),
        eo_(expertOut),
        shape_(shape) {
    const int n = h.shape.nranks;
    nf_ = st_.fwd.size(), ls_ = nodes_.ranksOfNode[nodes_.nodeOf[me_]].size();
    nr_ = st_.relayed.size();
    landing_.assign(n, nullptr), nodeLanding_.assign(nodes_.numNodes, nullptr);
    part_.assign(nf_ * ls_, nullptr), relaySums_.assign(nr_, nullptr);
    landed_.assign(nf_ * ls_, 0), relayLanded_.assign(nr_, 0);
    sums_.resize(nf_);
    size_t numSources = n;
    for (int p = 0; p < n; ++p) numSources += st_.inFrom[p].size();
    sources_.reserve(numSources);  // streams point into it
  }

  // One scratch area: RANK landing rows (this node), node sums (other nodes), partials to add,
  // node sums passing through as a relay.
  void carve(ArgCheck* a);
  void addLocalPair(int p, MoeWork* work);
  void addNetworkPair(int p, MoeWork* work);
  const std::vector<char*>& landing() const { return landing_; }
  const std::vector<char*>& nodeLanding() const { return nodeLanding_; }

 private:
  size_t rows(size_t n) const { return n * shape_.rowOut; }
  void addNodeSum(int p, size_t k, MoeWork* work);

  MoeHandle& h_;
  const MoeHandle::NodeState& st_;
  const NodeMap& nodes_;
  const int me_;
  const char* eo_;
  const RowShape shape_;
  size_t nf_ = 0, ls_ = 0, nr_ = 0;
  std::vector<char*> landing_, nodeLanding_, part_, relaySums_;
  std::vector<size_t> landed_, relayLanded_;
  std::vector<NodeSumSource> sums_;
  std::vector<PartialSource> sources_;
};

void NodeCombine::carve(ArgCheck* a) {
  const int n = h_.shape.nranks;
  size_t total = 0;
  for (int p = 0; p < n; ++p)
    if (nodes_.sameNode(p, me_)) total += rows(h_.send.rows[p].size());
  for (const auto& tokens : st_.send.nodeTokens) total += rows(tokens.size());
  for (const NodeFwdSeg& f : st_.fwd)
    for (const auto& r : f.rowsTo) total += rows(r.size());
  for (size_t i : st_.relayed) total += rows(st_.segs[i].rows);
  char* at = joinScratch(*h_.comm, kLandingScratch, total, a);
  if (at == nullptr) return;
  auto take = [&at](size_t bytes) {
    char* p = at;
    at += bytes;
    return p;
  };
  for (int p = 0; p < n; ++p)
    if (nodes_.sameNode(p, me_)) landing_[p] = take(rows(h_.send.rows[p].size()));
  for (int node = 0; node < nodes_.numNodes; ++node)
    nodeLanding_[node] = take(rows(st_.send.nodeTokens[node].size()));
  for (size_t k = 0; k < nf_; ++k)
    for (size_t lr = 0; lr < ls_; ++lr)
      part_[k * ls_ + lr] = take(rows(st_.fwd[k].rowsTo[lr].size()));
  for (size_t j = 0; j < nr_; ++j) relaySums_[j] = take(rows(st_.segs[st_.relayed[j]].rows));
}

// A rank of this node: its partials (RANK rows, then rows it had forwarded to p), then the node
// sums this rank relays back to p, each as it lands; receives of p's partials and relayed sums.
void NodeCombine::addLocalPair(int p, MoeWork* work) {
  sources_.push_back(PartialSource{&h_, p, 0, eo_, shape_, {}, {}});
  work->send(p, MsgKind::Plain, sources_.back().stream(h_.recv.rowsFrom(p)));
  for (const NodeInSeg& e : st_.inFrom[p]) {
    sources_.push_back(PartialSource{&h_, st_.segs[e.seg].src, e.rowOffset, eo_, shape_, {}, {}});
    work->send(p, MsgKind::Plain, sources_.back().stream(e.rows));
  }
  for (size_t j = 0; j < nr_; ++j) {
    const NodeSegment& g = st_.segs[st_.relayed[j]];
    if (g.src == p)
      work->send(p, MsgKind::SumPass,
                 gatedOnLanded(RowStream::flat(relaySums_[j], rows(g.rows)), &relayLanded_[j]));
  }
  PeerWork& w = work->peers[p];
  w.recvs.push_back(RowStream::flat(landing_[p], rows(h_.send.rows[p].size())));
  const int lr = nodes_.localRankOf[p];
  for (size_t k = 0; k < nf_; ++k) {
    RowStream r = RowStream::flat(part_[k * ls_ + lr], rows(st_.fwd[k].rowsTo[lr].size()));
    r.landed = &landed_[k * ls_ + lr];
    w.recvs.push_back(r);
  }
  for (size_t i : st_.send.segs) {  // this rank's node sums, relayed by p
    const NodeSegment& g = st_.segs[i];
    if (g.relay == p && p != me_)
      w.recvs.push_back(RowStream::flat(nodeLanding_[g.node] + rows(g.pos0), rows(g.rows)));
  }
}

// Forwarded segment k's node sums to its relay p, each row once its partials have landed.
void NodeCombine::addNodeSum(int p, size_t k, MoeWork* work) {
  const NodeSegment& g = st_.segs[st_.fwd[k].seg];
  NodeSumSource& ns = sums_[k];
  ns.f = &st_.fwd[k];
  ns.part = part_.data() + k * ls_;
  ns.landed = landed_.data() + k * ls_;
  ns.shape = shape_;
  ns.nrows = g.rows;
  RowStream s = RowStream::produced(shape_.rowOut, g.rows, &NodeSumSource::produce, &ns);
  s.ready = &NodeSumSource::bytesReady;
  s.readyCtx = &ns;
  work->send(p, MsgKind::NodeSum, s);
}

// A rank on another node: the node sums of segments it relays to this rank, and the node sums
// returning through this rank's NIC (its own, or relayed on to a peer of this node).
void NodeCombine::addNetworkPair(int p, MoeWork* work) {
  for (size_t k = 0; k < nf_; ++k)
    if (st_.segs[st_.fwd[k].seg].relay == p) addNodeSum(p, k, work);
  forEachSegmentViaNic(st_, nodes_, me_, p, [&](const NodeSegment& g, ptrdiff_t j) {
    char* dst = j >= 0 ? relaySums_[j] : nodeLanding_[g.node] + rows(g.pos0);
    RowStream r = RowStream::flat(dst, rows(g.rows));
    if (j >= 0) r.landed = &relayLanded_[j];
    work->peers[p].recvs.push_back(r);
  });
}

}  // namespace

fuscoResult_t hostCombineNode(MoeHandle& h, const void* expertOut, fuscoDataType_t dt,
                              size_t hidden, const float* topkWeights, void* out, ArgCheck a,
                              MoeWork* work) {
  const RowShape shape{dt, hidden, hidden * dataTypeSize(dt), dataTypeSize(dt)};
  FUSCO_CHECK(shipWeights(h, topkWeights, a));
  NodeCombine nc(h, static_cast<const char*>(expertOut), shape);
  nc.carve(&a);
  for (int p = 0; p < h.shape.nranks && a.ok(); ++p) {
    if (h.comm->nodes().sameNode(p, h.comm->rank()))
      nc.addLocalPair(p, work);
    else
      nc.addNetworkPair(p, work);
  }
  FUSCO_CHECK(runMoeWork(*h.comm, "fuscoMoeCombine", a, *work, true));
  finalSum(h, SumInputs{dt, shape.rowOut, hidden, topkWeights, &nc.landing(), &nc.nodeLanding()},
           out);
  return fuscoSuccess;
}

}  // namespace fusco
