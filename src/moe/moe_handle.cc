// MoeHandle::storage (moe_handle.h): where every list of a plan keeps its elements.
#include "moe/moe_handle.h"

namespace fusco {

namespace {

struct StorageList {
  std::vector<ListStorage>* out;

  template <typename T>
  void add(const std::string& name, const std::vector<T>& v) {
    out->push_back(ListStorage{name, v.data(), v.capacity() * sizeof(T)});
  }
  // The outer list and each inner one, as name[i].
  template <typename T>
  void addEach(const std::string& name, const std::vector<std::vector<T>>& v) {
    add(name, v);
    for (size_t i = 0; i < v.size(); ++i) add(name + "[" + std::to_string(i) + "]", v[i]);
  }
};

void addNodeState(const MoeHandle::NodeState& st, StorageList* l) {
  l->addEach("node.plan.routes", st.plan.routes);
  l->add("node.segs", st.segs);
  l->addEach("node.send.nodeTokens", st.send.nodeTokens);
  l->add("node.send.segs", st.send.segs);
  l->addEach("node.send.fwdMeta", st.send.fwdMeta);
  l->add("node.send.scratch.tokenRow", st.send.scratch.tokenRow);
  l->add("node.send.scratch.blockSize", st.send.scratch.blockSize);
  l->add("node.send.scratch.blockAt", st.send.scratch.blockAt);
  l->add("node.send.scratch.segStart", st.send.scratch.segStart);
  l->add("node.fwd", st.fwd);
  for (size_t k = 0; k < st.fwd.size(); ++k) {
    const std::string f = "node.fwd[" + std::to_string(k) + "].";
    l->addEach(f + "rowsTo", st.fwd[k].rowsTo);
    l->addEach(f + "meta", st.fwd[k].meta);
    l->add(f + "termStart", st.fwd[k].termStart);
    l->add(f + "termLr", st.fwd[k].termLr);
    l->add(f + "termIdx", st.fwd[k].termIdx);
  }
  l->addEach("node.inFrom", st.inFrom);
  l->add("node.relayed", st.relayed);
  l->addEach("node.fwdFanStart", st.fwdFanStart);
  l->addEach("node.fwdFanRows", st.fwdFanRows);
}

}  // namespace

std::vector<ListStorage> MoeHandle::storage() const {
  std::vector<ListStorage> out;
  StorageList l{&out};
  l.add("topkIdx", topkIdx);
  l.addEach("send.rows", send.rows);
  l.addEach("send.meta", send.meta);
  l.addEach("send.kStart", send.kStart);
  l.addEach("send.kSlots", send.kSlots);
  l.add("send.scratch", send.scratch);
  l.add("recv.blockStart", recv.blockStart);
  l.add("recv.padding", recv.padding);
  l.addEach("recv.fanStart", recv.fanStart);
  l.addEach("recv.fanRows", recv.fanRows);
  l.addEach("weightIdx", weightIdx);
  l.addEach("remoteFanRows", remoteFanRows);
  l.addEach("recvWeights", recvWeights);
  l.addEach("scratch.metaFrom", scratch.metaFrom);
  l.addEach("scratch.wordsOut", scratch.wordsOut);
  l.addEach("scratch.blocksOut", scratch.blocksOut);
  l.addEach("scratch.blocksIn", scratch.blocksIn);
  l.addEach("scratch.fanOut", scratch.fanOut);
  l.addEach("scratch.fanIn", scratch.fanIn);
  addNodeState(node, &l);
  l.add("dev.terms.start", dev.terms.start);
  l.add("dev.terms.rank", dev.terms.rank);
  l.add("dev.terms.row", dev.terms.row);
  l.add("dev.terms.weight", dev.terms.weight);
  l.add("dev.terms.last", dev.terms.last);
  out.push_back(ListStorage{"devBuffer.host", devBuffer.hostBase(), devBuffer.capacity()});
  out.push_back(ListStorage{"devBuffer.device", devBuffer.device(), devBuffer.capacity()});
  return out;
}

}  // namespace fusco
