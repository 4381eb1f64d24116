// Dispatch under NODE dedup: one engine operation with both hops. The ranks of this node get
// their rows as under RANK. Rows for another node cross the network once per (token, node), to
// the segment's forwarder (through a relay, a peer of this node, when the balancer moved the
// segment to that peer's NIC); the forwarder fans them out to the ranks of its node as they
// land. Every message's kind (moe_op.h) states what it waits for, and the operation is checked
// to be free of waiting cycles before it runs.
#include <vector>

#include "moe/moe_exec.h"
#include "moe/node_streams.h"

namespace fusco {

namespace {

// The staging rows of one NODE dispatch and the gates that let each message leave as it lands.
// Streams point into this object: it lives until the operation returns.
class NodeDispatch {
 public:
  NodeDispatch(MoeHandle& h, const void* x, size_t rowBytes, void* recvX)
      : h_(h),
        st_(h.node),
        nodes_(h.comm->nodes()),
        me_(h.comm->rank()),
        x_(x),
        rowBytes_(rowBytes),
        recvX_(recvX) {
    nf_ = st_.fwd.size();
    ls_ = nodes_.ranksOfNode[nodes_.nodeOf[me_]].size();
    landed_.assign(nf_, 0);
    relayLanded_.assign(st_.relayed.size(), 0);
    gates_.resize(nf_ * ls_);
  }

  // Staging: per forwarded segment, then per segment relayed for a peer (st.relayed).
  void carveStaging(ArgCheck* a) {
    size_t total = 0;
    for (const NodeFwdSeg& f : st_.fwd) total += segBytes(f.seg);
    for (size_t i : st_.relayed) total += segBytes(i);
    char* at = joinScratch(*h_.comm, kStagingScratch, total, a);
    staging_.assign(nf_, nullptr);
    relayRows_.assign(st_.relayed.size(), nullptr);
    if (at == nullptr) return;
    for (size_t k = 0; k < nf_; ++k) staging_[k] = at, at += segBytes(st_.fwd[k].seg);
    for (size_t j = 0; j < st_.relayed.size(); ++j)
      relayRows_[j] = at, at += segBytes(st_.relayed[j]);
  }

  // A rank of this node: RANK rows and handoffs to it as a relay (they wait for nothing), then the
  // forwarded rows, each leaving once it has landed; receives of what it relays or forwards here.
  void addLocalPair(int p, MoeWork* work) {
    addRankDispatch(h_, p, x_, rowBytes_, recvX_, work);
    for (size_t i : st_.send.segs) {
      const NodeSegment& g = st_.segs[i];
      if (g.relay == p && p != me_) work->send(p, MsgKind::Plain, ownRows(g));
    }
    for (size_t k = 0; k < nf_; ++k) addFanOut(p, k, work);
    PeerWork& w = work->peers[p];
    for (size_t j = 0; j < st_.relayed.size(); ++j) {
      const NodeSegment& g = st_.segs[st_.relayed[j]];
      if (g.src != p) continue;
      RowStream r = RowStream::flat(relayRows_[j], g.rows * rowBytes_);
      r.landed = &relayLanded_[j];
      w.recvs.push_back(r);
    }
    for (const NodeInSeg& e : st_.inFrom[p]) {
      const int src = st_.segs[e.seg].src;
      RowStream r = RowStream::fanOut(recvX_, rowBytes_, h_.recv.fanStart[src].data() + e.rowOffset,
                                      h_.recv.fanRows[src].data(), e.rows);
      r.layoutShared = true;  // the forwarder was told these fan rows
      r.extent = h_.recv.numRecvRows * rowBytes_;
      w.recvs.push_back(r);
    }
  }

  // A forwarder on another node: the segments leaving through this rank's NIC in segment order
  // (its own rows from x, relayed rows as they land), and the segments it forwards arriving.
  void addNetworkPair(int p, MoeWork* work) {
    forEachSegmentViaNic(st_, nodes_, me_, p, [&](const NodeSegment& g, ptrdiff_t j) {
      if (j < 0)
        work->send(p, MsgKind::NetOwn, ownRows(g));
      else
        work->send(
            p, MsgKind::NetRelayed,
            gatedOnLanded(RowStream::flat(relayRows_[j], g.rows * rowBytes_), &relayLanded_[j]));
    });
    for (size_t k = 0; k < nf_; ++k) {
      const NodeSegment& g = st_.segs[st_.fwd[k].seg];
      if (g.relay != p) continue;
      RowStream r = RowStream::flat(staging_[k], g.rows * rowBytes_);
      r.landed = &landed_[k];
      work->peers[p].recvs.push_back(r);
    }
  }

 private:
  size_t segBytes(size_t seg) const { return st_.segs[seg].rows * rowBytes_; }

  RowStream ownRows(const NodeSegment& g) const {
    return RowStream::indexed(x_, rowBytes_, st_.send.nodeTokens[g.node].data() + g.pos0, g.rows);
  }

  // Forwarded segment k's rows for local rank p, gated on their landing; written straight into
  // p's recvX when it can be mapped (p's fan rows for them were exchanged at plan time).
  void addFanOut(int p, size_t k, MoeWork* work) {
    const int lr = nodes_.localRankOf[p];
    const auto& rows = st_.fwd[k].rowsTo[lr];
    LandedRows& g = gates_[k * ls_ + lr];
    g = LandedRows{rows.data(), rows.size(), rowBytes_, &landed_[k], 0};
    RowStream s = RowStream::indexed(staging_[k], rowBytes_, rows.data(), rows.size());
    s.ready = &LandedRows::bytesReady;
    s.readyCtx = &g;
    const auto& fs = st_.fwdFanStart[k * ls_ + lr];
    if (p == me_ || fs.size() != rows.size() + 1) {
      work->send(p, MsgKind::FanOut, s);
      return;
    }
    work->sendDirect(p, MsgKind::FanOut, s,
                     RowStream::fanOut(nullptr, rowBytes_, fs.data(),
                                       st_.fwdFanRows[k * ls_ + lr].data(), rows.size()));
  }

  MoeHandle& h_;
  const MoeHandle::NodeState& st_;
  const NodeMap& nodes_;
  const int me_;
  const void* x_;
  const size_t rowBytes_;
  void* recvX_;
  size_t nf_ = 0, ls_ = 0;
  std::vector<char*> staging_, relayRows_;
  std::vector<size_t> landed_, relayLanded_;
  std::vector<LandedRows> gates_;
};

}  // namespace

fuscoResult_t hostDispatchNode(MoeHandle& h, const void* x, size_t rowBytes, void* recvX,
                               ArgCheck a, MoeWork* work) {
  NodeDispatch d(h, x, rowBytes, recvX);
  d.carveStaging(&a);
  const NodeMap& nodes = h.comm->nodes();
  for (int p = 0; p < h.shape.nranks && a.ok(); ++p) {
    if (nodes.sameNode(p, h.comm->rank()))
      d.addLocalPair(p, work);
    else
      d.addNetworkPair(p, work);
  }
  if (a.ok()) zeroPaddingRows(h, rowBytes, recvX);
  return runMoeWork(*h.comm, "fuscoMoeDispatch", a, *work);
}

}  // namespace fusco
