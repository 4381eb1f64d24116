// The source side of combine: every token's output is the fixed tree of docs/API.md, a sum over
// nodes (ascending) of sums over each node's ranks (ascending) of the token's partial from that
// rank. Under NONE the partial is formed here from the raw rows; under NODE dedup the sums of
// other nodes arrive made.
#include <cstring>
#include <vector>

#include "device/reduce.h"
#include "moe/moe_exec.h"

namespace fusco {

namespace {

// out = the fixed tree's sum of rows (one level). A single term needs no arithmetic.
void sumLevel(fuscoDataType_t dt, size_t hidden, const std::vector<const void*>& rows, void* out) {
  if (rows.size() == 1)
    canonicalCopyRow(dt, hidden, rows[0], out);
  else
    sumRows(dt, hidden, rows.data(), rows.size(), out);
}

// Walks the landed rows token by token (each rank's rows ascend by token, one cursor per rank).
class TokenSums {
 public:
  TokenSums(const MoeHandle& h, const SumInputs& in)
      : h_(h),
        in_(in),
        nodes_(h.comm->nodes()),
        cursor_(h.shape.nranks, 0),
        nodeCursor_(nodes_.numNodes, 0),
        rankScratch_(h.shape.nranks * in.rowOut),
        nodeScratch_(nodes_.numNodes * in.rowOut) {}

  void token(size_t t, char* o) {
    nodePtrs_.clear();
    for (int node = 0; node < nodes_.numNodes; ++node) {
      if (in_.nodeLanding != nullptr && node != nodes_.nodeOf[h_.comm->rank()]) {
        madeNodeSum(t, node);
        continue;
      }
      if (!rankSums(t, node)) continue;
      // One node: the node level's sum goes straight to out; the final level (a single term,
      // round(0 + x)) then only turns -0 into +0, in place.
      char* dst = nodes_.numNodes == 1 ? o : nodeScratch_.data() + node * in_.rowOut;
      sumLevel(in_.dt, in_.hidden, rankPtrs_, dst);
      nodePtrs_.push_back(dst);
    }
    if (nodePtrs_.empty())
      memset(o, 0, in_.rowOut);
    else if (nodePtrs_.size() == 1 && nodePtrs_[0] == o)
      canonicalCopyRow(in_.dt, in_.hidden, o, o);
    else
      sumLevel(in_.dt, in_.hidden, nodePtrs_, o);
  }

 private:
  // NODE dedup: another node's sum for token t, if that node holds any of its experts.
  void madeNodeSum(size_t t, int node) {
    const auto& tokens = h_.node.send.nodeTokens[node];
    size_t& cur = nodeCursor_[node];
    if (cur < tokens.size() && tokens[cur] == static_cast<int64_t>(t))
      nodePtrs_.push_back((*in_.nodeLanding)[node] + cur++ * in_.rowOut);
  }

  // The partials of token t from the ranks of `node` into rankPtrs_; false if none.
  bool rankSums(size_t t, int node) {
    rankPtrs_.clear();
    for (int r : nodes_.ranksOfNode[node]) {
      const auto& rows = h_.send.rows[r];
      size_t& cur = cursor_[r];
      if (cur >= rows.size() || rows[cur] != static_cast<int64_t>(t)) continue;
      if (h_.dedup != Dedup::None) {
        rankPtrs_.push_back((*in_.landing)[r] + cur++ * in_.rowOut);
        continue;
      }
      rowPtrs_.clear();
      w_.clear();
      for (; cur < rows.size() && rows[cur] == static_cast<int64_t>(t); ++cur) {
        rowPtrs_.push_back((*in_.landing)[r] + cur * in_.rowOut);
        const uint8_t k = h_.send.kSlots[r][h_.send.kStart[r][cur]];
        w_.push_back(in_.weights ? in_.weights[t * h_.topk + k] : 1.0f);
      }
      char* dst = rankScratch_.data() + r * in_.rowOut;
      weightedSumRows(in_.dt, in_.hidden, rowPtrs_.data(), w_.data(), rowPtrs_.size(), dst);
      rankPtrs_.push_back(dst);
    }
    return !rankPtrs_.empty();
  }

  const MoeHandle& h_;
  const SumInputs& in_;
  const NodeMap& nodes_;
  std::vector<size_t> cursor_, nodeCursor_;
  std::vector<char> rankScratch_, nodeScratch_;
  std::vector<const void*> rankPtrs_, nodePtrs_, rowPtrs_;
  std::vector<float> w_;
};

}  // namespace

void finalSum(const MoeHandle& h, const SumInputs& in, void* out) {
  TokenSums sums(h, in);
  for (size_t t = 0; t < h.numTokens; ++t) sums.token(t, static_cast<char*>(out) + t * in.rowOut);
}

}  // namespace fusco
