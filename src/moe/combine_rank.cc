// Combine with dedup NONE or RANK: the routing weights go to the expert side (one operation),
// each expert rank computes one partial row per (token, rank) directly into the slot it leaves
// from and sends it back (a second operation), and the source sums the partials in the fixed
// order of docs/API.md (combine_sum.cc). Under NONE the raw expert rows come back and the source
// forms the partials.
#include <vector>

#include "core/datatype.h"
#include "moe/moe_exec.h"
#include "moe/partial_rows.h"

namespace fusco {

// Routing weights to the expert side (ones when the caller passes none, so every rank ships the
// same shape of message whatever its peers passed).
fuscoResult_t shipWeights(MoeHandle& h, const float* topkWeights, const ArgCheck& a) {
  const int n = h.comm->nranks();
  std::vector<float> ones;
  const float* w = topkWeights;
  if (w == nullptr) {
    ones.assign(h.numTokens * h.topk, 1.0f);
    w = ones.data();
  }
  std::vector<PeerWork> work(n);
  h.recvWeights.resize(n);
  for (int p = 0; p < n && a.ok(); ++p) {
    work[p].sends.push_back(
        RowStream::indexed(w, sizeof(float), h.weightIdx[p].data(), h.weightIdx[p].size()));
    h.recvWeights[p].resize(h.recv.fanRows[p].size());
    work[p].recvs.push_back(
        RowStream::flat(h.recvWeights[p].data(), h.recvWeights[p].size() * sizeof(float)));
  }
  return runMoeOp(*h.comm, "fuscoMoeCombine (weights)", a, work);
}

fuscoResult_t hostCombine(MoeHandle& h, const void* expertOut, fuscoDataType_t dt, size_t hidden,
                          const float* topkWeights, void* out, ArgCheck a, MoeWork* work) {
  if (h.dedup == Dedup::Node)
    return hostCombineNode(h, expertOut, dt, hidden, topkWeights, out, a, work);
  Communicator& c = *h.comm;
  const int n = c.nranks();
  const RowShape shape{dt, hidden, hidden * dataTypeSize(dt), dataTypeSize(dt)};
  if (h.dedup != Dedup::None) FUSCO_CHECK(shipWeights(h, topkWeights, a));
  // Landing rows for what comes back, in the communicator's scratch (peers write it directly).
  std::vector<char*> landing(n, nullptr);
  size_t total = 0;
  for (int p = 0; p < n; ++p) total += h.send.rows[p].size() * shape.rowOut;
  char* at = joinScratch(c, kLandingScratch, total, &a);
  std::vector<PartialSource> sources(n);
  const char* eo = static_cast<const char*>(expertOut);
  for (int p = 0; p < n && a.ok(); ++p) {
    const size_t back = h.recv.rowsFrom(p);
    if (h.dedup != Dedup::None) {
      sources[p] = PartialSource{&h, p, 0, eo, shape, {}, {}};
      work->send(p, MsgKind::Plain, sources[p].stream(back));
    } else {
      work->send(p, MsgKind::Plain,
                 RowStream::indexed(expertOut, shape.rowOut, h.recv.fanRows[p].data(), back));
    }
    landing[p] = at;
    const size_t bytes = h.send.rows[p].size() * shape.rowOut;
    work->peers[p].recvs.push_back(RowStream::flat(landing[p], bytes));
    at += bytes;
  }
  // After the weights exchange every rank knows the call is valid everywhere.
  FUSCO_CHECK(runMoeWork(c, "fuscoMoeCombine", a, *work, h.dedup != Dedup::None));
  finalSum(h, SumInputs{dt, shape.rowOut, hidden, topkWeights, &landing, nullptr}, out);
  return fuscoSuccess;
}

}  // namespace fusco
