#include "gpu/gpu_moe.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "harness/data_gen.h"

namespace fusco::test::gpu {

namespace {

const char* resultText(fuscoResult_t r) { return fuscoGetErrorString(r); }

// What row i of rank r's recvX must hold, for messages.
std::string rowOrigin(const MoeRefProblem& p, const MoeRefDispatch& d, int r, size_t row) {
  for (int s = 0; s < p.nranks; ++s)
    for (size_t t = 0; t < p.numTokens[s]; ++t)
      for (int k = 0; k < p.topk; ++k)
        if (d.slotRow[s][t * p.topk + k] == static_cast<int64_t>(row) &&
            p.rankOfExpert(static_cast<int>(p.topkIdx[s][t * p.topk + k])) == r)
          return "token " + std::to_string(t) + " of rank " + std::to_string(s) + " for expert " +
                 std::to_string(p.topkIdx[s][t * p.topk + k]);
  return "a zero padding row";
}

std::string identifyRow(const uint8_t* row, size_t rowBytes, const Bytes2D& x) {
  if (findNotPoison(row, rowBytes) == SIZE_MAX) return "unwritten (all 0xA5 poison)";
  if (std::all_of(row, row + rowBytes, [](uint8_t b) { return b == 0; })) return "all zero";
  for (size_t s = 0; s < x.size(); ++s)
    for (size_t t = 0; (t + 1) * rowBytes <= x[s].size(); ++t)
      if (std::memcmp(row, x[s].data() + t * rowBytes, rowBytes) == 0)
        return "token " + std::to_string(t) + " of rank " + std::to_string(s);
  return "unknown bytes";
}

::testing::AssertionResult tailPoisoned(const std::vector<uint8_t>& all, size_t used,
                                        const char* what) {
  const size_t bad = findNotPoison(all.data() + used, all.size() - used);
  if (bad == SIZE_MAX) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << " was written past its end (byte " << used + bad
                                       << ", " << bad << " past the end)";
}

}  // namespace

MoeCase oneNodeCase(int nranks) {
  MoeCase c;
  c.nranks = nranks;
  c.localSize = nranks;
  return c;
}

MoeRankBufs moeRankBufs(fuscoComm_t comm, const CombineSetup& s, int rank, Mem recvKind) {
  const size_t rowBytes = s.hidden * dtypeSize(s.dt);
  MoeRankBufs b;
  b.x = toDevice(comm, s.x[rank]);
  b.recvX = poisonedBuf(comm, s.d.numRecvRows[rank] * rowBytes, recvKind);
  b.expertOut = toDevice(comm, s.expertOut[rank]);
  b.weights = toDevice(comm, s.weights[rank]);
  b.out = poisonedBuf(comm, s.p.numTokens[rank] * rowBytes);
  return b;
}

::testing::AssertionResult gpuPlan(fuscoComm_t comm, int rank, const MoeCase& c,
                                   const MoeRefProblem& p, const MoeRefDispatch& d, int dedup,
                                   int balance, cudaStream_t stream, fuscoMoeHandle_t* h) {
  fuscoMoeConfig_t m = moeConfig(c, dedup);
  m.balance = balance;
  DevBuf idx = toDevice(comm, p.topkIdx[rank]);
  fuscoMoeHandle_t handle = nullptr;
  fuscoResult_t r = fuscoMoePlan(&handle, comm, &m, static_cast<const int64_t*>(idx.get()),
                                 p.numTokens[rank], c.topk, stream);
  if (r != fuscoSuccess)
    return ::testing::AssertionFailure() << "fuscoMoePlan (device topkIdx) -> " << resultText(r)
                                         << ": " << fuscoGetLastError(comm);
  // The plan may still read topkIdx on the stream: keep it alive until the stream is done.
  cudaError_t e = cudaStreamSynchronize(stream);
  auto counts = e == cudaSuccess
                    ? recvCountsMatch(comm, handle, rank, d)
                    : ::testing::AssertionFailure() << streamSyncFailure(e, "fuscoMoePlan");
  if (!counts) {
    fuscoMoeHandleDestroy(handle);
    return counts;
  }
  *h = handle;
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult gpuReplan(fuscoComm_t comm, fuscoMoeHandle_t h, int rank,
                                     const MoeCase& c, const MoeRefProblem& p,
                                     const MoeRefDispatch& d, cudaStream_t stream) {
  DevBuf idx = toDevice(comm, p.topkIdx[rank]);
  fuscoResult_t r =
      fuscoMoeReplan(h, static_cast<const int64_t*>(idx.get()), p.numTokens[rank], c.topk, stream);
  if (r != fuscoSuccess)
    return ::testing::AssertionFailure() << "fuscoMoeReplan (device topkIdx) -> " << resultText(r)
                                         << ": " << fuscoGetLastError(comm);
  cudaError_t e = cudaStreamSynchronize(stream);  // topkIdx stays alive until the copy is done
  if (e != cudaSuccess)
    return ::testing::AssertionFailure() << streamSyncFailure(e, "fuscoMoeReplan");
  return recvCountsMatch(comm, h, rank, d);
}

::testing::AssertionResult recvCountsMatch(fuscoComm_t comm, fuscoMoeHandle_t h, int rank,
                                           const MoeRefDispatch& d) {
  const size_t nLocal = d.tokensPerLocalExpert[rank].size();
  std::vector<int64_t> perExpert(nLocal + 1, -7);
  size_t numRecv = 12345678;
  fuscoResult_t r = fuscoMoeGetRecvCounts(h, &numRecv, perExpert.data());
  if (r != fuscoSuccess)
    return ::testing::AssertionFailure()
           << "fuscoMoeGetRecvCounts -> " << resultText(r) << ": " << fuscoGetLastError(comm);
  auto fail = ::testing::AssertionFailure();
  bool bad = false;
  if (numRecv != d.numRecvRows[rank]) {
    fail << "numRecvRows " << numRecv << ", expected " << d.numRecvRows[rank] << "; ";
    bad = true;
  }
  if (perExpert[nLocal] != -7) {
    fail << "fuscoMoeGetRecvCounts wrote past numLocalExperts (" << nLocal << "); ";
    bad = true;
  }
  perExpert.resize(nLocal);
  if (perExpert != d.tokensPerLocalExpert[rank]) {
    fail << "tokensPerLocalExpert differs from the reference; ";
    bad = true;
  }
  return bad ? fail : ::testing::AssertionSuccess();
}

::testing::AssertionResult gpuDispatch(fuscoComm_t comm, fuscoMoeHandle_t h, int rank,
                                       const MoeRefProblem& p, const MoeRefDispatch& d,
                                       const Bytes2D& x, size_t rowBytes, Mem xKind, Mem recvKind,
                                       cudaStream_t stream, std::vector<uint8_t>* got) {
  const size_t n = d.numRecvRows[rank];
  const auto& mine = x[rank];
  DevBuf dx;
  if (!mine.empty()) {
    dx = DevBuf(comm, mine.size(), xKind);
    if (!dx.ok()) return ::testing::AssertionFailure() << "x allocation failed";
    dx.upload(mine);
  }
  DevBuf recv(comm, n * rowBytes + kTailBytes, recvKind);
  if (!recv.ok()) return ::testing::AssertionFailure() << "recvX allocation failed";
  recv.poison();
  fuscoResult_t r = fuscoMoeDispatch(h, dx.get(), rowBytes, n == 0 ? nullptr : recv.get(), stream);
  if (r != fuscoSuccess)
    return ::testing::AssertionFailure()
           << "fuscoMoeDispatch (x " << memName(xKind) << ", recvX " << memName(recvKind) << ") -> "
           << resultText(r) << ": " << fuscoGetLastError(comm);
  cudaError_t e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess)
    return ::testing::AssertionFailure() << streamSyncFailure(e, "fuscoMoeDispatch");
  std::vector<uint8_t> all = recv.download();
  auto tail = tailPoisoned(all, n * rowBytes, "recvX");
  const auto& want = d.recvX[rank];
  const bool same = want.empty() || std::memcmp(want.data(), all.data(), want.size()) == 0;
  if (got) got->assign(all.begin(), all.begin() + static_cast<ptrdiff_t>(n * rowBytes));
  if (same && tail) return ::testing::AssertionSuccess();
  auto fail = ::testing::AssertionFailure();
  fail << "rank " << rank << " recvX (x " << memName(xKind) << ", recvX " << memName(recvKind)
       << ")";
  if (!tail) fail << ": " << tail.message();
  int shown = 0;
  for (size_t i = 0; !same && i < n && shown < 3; ++i) {
    const uint8_t* w = want.data() + i * rowBytes;
    const uint8_t* g = all.data() + i * rowBytes;
    if (std::memcmp(w, g, rowBytes) == 0) continue;
    size_t j = 0;
    while (w[j] == g[j]) ++j;
    fail << "\n  row " << i << " should be " << rowOrigin(p, d, rank, i) << "; byte " << j
         << " expected " << hexBytes(w + j, 1) << " got " << hexBytes(g + j, 1)
         << "; the row holds " << identifyRow(g, rowBytes, x);
    ++shown;
  }
  return fail;
}

::testing::AssertionResult dispatchStatsMatch(fuscoMoeHandle_t h, const MoeRefProblem& p, int rank,
                                              int dedup, size_t rowBytes) {
  fuscoMoeStats_t st;
  std::memset(&st, 0x77, sizeof st);
  st.size = sizeof st;
  fuscoResult_t r = fuscoMoeGetStats(h, &st);
  if (r != fuscoSuccess)
    return ::testing::AssertionFailure() << "fuscoMoeGetStats -> " << resultText(r);
  const MoeRefSendStats ref = moeRefSendStats(p, rank);
  const bool none = dedup == FUSCO_DEDUP_NONE;
  const size_t intra = none ? ref.noneIntra : ref.rankIntra;
  const size_t inter = none ? ref.noneInter : ref.rankInter;
  if (st.dispatchRowsIntraNode == intra && st.dispatchRowsInterNode == inter &&
      st.dispatchBytesIntraNode == intra * rowBytes &&
      st.dispatchBytesInterNode == inter * rowBytes)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "rank " << rank << " dispatch stats (dedup " << dedupName(dedup) << "): rows intra "
         << st.dispatchRowsIntraNode << " inter " << st.dispatchRowsInterNode << ", bytes intra "
         << st.dispatchBytesIntraNode << " inter " << st.dispatchBytesInterNode
         << "; expected rows " << intra << " / " << inter << ", bytes " << intra * rowBytes << " / "
         << inter * rowBytes;
}

::testing::AssertionResult gpuCombine(fuscoComm_t comm, fuscoMoeHandle_t h, int rank,
                                      const CombineSetup& s, bool weighted, Mem inKind, Mem outKind,
                                      cudaStream_t stream, std::vector<uint8_t>* got) {
  const size_t es = dtypeSize(s.dt), rowOut = s.hidden * es;
  const size_t nTok = s.p.numTokens[rank];
  const auto& eo = s.expertOut[rank];
  DevBuf din;
  if (!eo.empty()) {
    din = DevBuf(comm, eo.size(), inKind);
    if (!din.ok()) return ::testing::AssertionFailure() << "expertOut allocation failed";
    din.upload(eo);
  }
  DevBuf w;
  if (weighted && nTok > 0) w = toDevice(comm, s.weights[rank]);
  DevBuf out(comm, nTok * rowOut + kTailBytes, outKind);
  if (!out.ok()) return ::testing::AssertionFailure() << "out allocation failed";
  out.poison();
  fuscoResult_t r =
      fuscoMoeCombine(h, din.get(), s.dt, s.hidden, static_cast<const float*>(w.get()),
                      nTok ? out.get() : nullptr, stream);
  const std::string what = std::string(dtypeName(s.dt)) +
                           (weighted ? ", weights" : ", NULL weights") + ", expertOut " +
                           memName(inKind) + ", out " + memName(outKind);
  if (r != fuscoSuccess)
    return ::testing::AssertionFailure() << "fuscoMoeCombine (" << what << ") -> " << resultText(r)
                                         << ": " << fuscoGetLastError(comm);
  cudaError_t e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess)
    return ::testing::AssertionFailure() << streamSyncFailure(e, "fuscoMoeCombine");
  std::vector<uint8_t> all = out.download();
  auto tail = tailPoisoned(all, nTok * rowOut, "out");
  std::vector<std::vector<float>> weights;
  if (weighted) weights = s.weights;
  const std::vector<uint8_t> want =
      moeRefCombine(s.p, s.d, s.expertOut, s.dt, s.hidden, weights)[rank];
  std::vector<uint8_t> mine(all.begin(), all.begin() + static_cast<ptrdiff_t>(nTok * rowOut));
  if (got) *got = mine;
  if (mine == want && tail) return ::testing::AssertionSuccess();
  auto fail = ::testing::AssertionFailure();
  fail << "rank " << rank << " combine out (" << what << ")";
  if (!tail) fail << ": " << tail.message();
  int shown = 0;
  for (size_t i = 0; i < want.size() / es && shown < 4; ++i) {
    if (std::memcmp(want.data() + i * es, mine.data() + i * es, es) == 0) continue;
    fail << "\n  token " << i / s.hidden << " element " << i % s.hidden << ": expected "
         << refToFloat(s.dt, want.data() + i * es) << " (" << hexBytes(want.data() + i * es, es)
         << ") got " << refToFloat(s.dt, mine.data() + i * es) << " ("
         << hexBytes(mine.data() + i * es, es) << ")";
    ++shown;
  }
  return fail;
}

size_t noneCombineBytes(const MoeRefProblem& p, int rank, size_t rowOutBytes) {
  size_t rows = 0;
  for (int s = 0; s < p.nranks; ++s) {
    if (s == rank) continue;
    for (int64_t e : p.topkIdx[s])
      if (e >= 0 && p.rankOfExpert(static_cast<int>(e)) == rank) ++rows;
  }
  return rows * rowOutBytes;
}

}  // namespace fusco::test::gpu
