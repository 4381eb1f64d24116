// moe_perf --ll on: the untimed first call of each form (moe_perf_ll.h). They build the expert
// outputs both paths combine, and with -c 1 check the low-latency path against the normal one on
// host copies: rows per expert and their bytes, then each combine's out bit for bit.
//
// The expert is a function of a row and its global expert g: every element times +-2^(g % 4)
// (negative for odd g / 4), exact in bf16, so rows combined from the wrong expert or slot change
// out while both paths still compute the same bits.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstring>

#include "moe_perf_ll.h"
#include "row_reduce.h"

namespace fusco {
namespace perf {

namespace {

float expertFactor(int globalExpert) {
  const float f = static_cast<float>(1 << (globalExpert % 4));
  return (globalExpert / 4) % 2 ? -f : f;
}

}  // namespace

void LlBench::expertRow(int localExpert, const char* in, char* out) const {
  const float f = expertFactor(l_.rank * localExperts_ + localExpert);
  const uint16_t* src = reinterpret_cast<const uint16_t*>(in);
  uint16_t* dst = reinterpret_cast<uint16_t*>(out);
  for (size_t j = 0; j < o_.hidden; ++j) dst[j] = floatToBf16(bf16ToFloat(src[j]) * f);
}

bool LlBench::prepare(int64_t* wrong) {
  *wrong = 0;
  if (!prepareNormal(wrong)) return false;
  for (int row : {kLlBf16, kLlHook, kLlFp8})  // bf16 first: it builds the low-latency expertOut
    if (active_[row] && !prepareLl(row, wrong)) return false;
  fuscoResult_t async = fuscoSuccess;
  return ok(fuscoCommGetAsyncError(space_->comm(), &async), "fuscoCommGetAsyncError") &&
         ok(async, "the first calls (asynchronous error)");
}

// The normal dispatch, its expertOut from recvX, its combine; recvX_ and out_ keep host copies.
bool LlBench::prepareNormal(int64_t* wrong) {
  const size_t rb = rowBytes_, bytes = recvRows_ * rb, outBytes = o_.tokens * rb;
  void* s = space_->stream();
  recvX_.assign(bytes + 1, 0);
  out_.assign(outBytes + 1, 0);
  if (!ok(fuscoMoeDispatch(handle_, dX_, rb, dRecvX_, s), "fuscoMoeDispatch") ||
      !spaceOk(space_->sync("fuscoMoeDispatch") && space_->copy(recvX_.data(), dRecvX_, bytes),
               "recvX to host"))
    return false;
  std::vector<char> expert(bytes + 1);
  size_t row = 0;
  for (int e = 0; e < localExperts_; ++e)
    for (int64_t i = 0; i < perExpert_[e] && row < recvRows_; ++i, ++row)
      expertRow(e, &recvX_[row * rb], &expert[row * rb]);
  if (!spaceOk(space_->copy(dExpertOut_, expert.data(), bytes), "expertOut to the space") ||
      !ok(fuscoMoeCombine(handle_, dExpertOut_, fuscoBfloat16, o_.hidden, dWeights_, dOut_, s),
          "fuscoMoeCombine") ||
      !spaceOk(space_->sync("fuscoMoeCombine") && space_->copy(out_.data(), dOut_, outBytes),
               "out to host"))
    return false;
  if (o_.check) *wrong += checkNormalOut();
  return true;
}

// One low-latency dispatch of row's form and its combine. ll-bf16 writes the low-latency
// expertOut from its recvX (the other forms combine the same one: the same routing lands the same
// rows in the same places); -c 1 compares the counts, the bf16 rows and out with the normal path.
bool LlBench::prepareLl(int row, int64_t* wrong) {
  const size_t rb = rowBytes_, outBytes = o_.tokens * rb;
  llOut_.assign(outBytes + 1, 0);
  if (!spaceOk(space_->fill(dLlOut_, 0xA5, outBytes), "out fill") || !llDispatch(row) ||
      !spaceOk(space_->sync("fuscoLowLatencyDispatch"), "fuscoLowLatencyDispatch"))
    return false;
  const fuscoLowLatencyDispatch_t& d = dispatched_[row];
  std::vector<int> count(localExperts_);
  if (!spaceOk(space_->copy(count.data(), d.recvCount, count.size() * sizeof(int)),
               "recvCount to host"))
    return false;
  int64_t bad = 0;
  for (int e = 0; e < localExperts_; ++e) {
    if (count[e] == perExpert_[e]) continue;
    if (bad++ < 3)
      fprintf(stderr,
              "# rank %d: %s: local expert %d received %d rows, fuscoMoeDispatch %" PRId64 "\n",
              l_.rank, kLlRowNames[row], e, count[e], perExpert_[e]);
  }
  const bool rowsWanted = row == kLlBf16 || (row == kLlHook && o_.check);
  if (bad == 0 && rowsWanted && !llRows(row, o_.check ? &bad : nullptr)) return false;
  if (!llCombine(row, dLlOut_) || !spaceOk(space_->sync("fuscoLowLatencyCombine") &&
                                               space_->copy(llOut_.data(), dLlOut_, outBytes),
                                           "out to host"))
    return false;
  if (o_.check) *wrong += bad + compareOut(row);
  return true;
}

// Row's bf16 recvX rows (the counts equal the plan's): -c 1 counts into *bad those that differ
// from the normal recvX's row of the same (local expert, row); ll-bf16 also writes its expert
// outputs, in recvX's layout, into the low-latency expertOut.
bool LlBench::llRows(int row, int64_t* bad) {
  const size_t rb = rowBytes_;
  const char* recv = static_cast<const char*>(dispatched_[row].recvX);
  std::vector<char> rows(cap_ * rb + 1), expert(cap_ * rb + 1);
  size_t first = 0;  // the expert's first row in the normal recvX
  for (int e = 0; e < localExperts_; first += static_cast<size_t>(perExpert_[e]), ++e) {
    const size_t n = std::min(static_cast<size_t>(perExpert_[e]), cap_), from = e * cap_ * rb;
    if (!spaceOk(space_->copy(rows.data(), recv + from, n * rb), "recvX to host")) return false;
    for (size_t i = 0; bad != nullptr && i < n; ++i) {
      if (memcmp(&rows[i * rb], &recvX_[(first + i) * rb], rb) == 0) continue;
      if ((*bad)++ < 3)
        fprintf(stderr, "# rank %d: %s: local expert %d row %zu differs from fuscoMoeDispatch's\n",
                l_.rank, kLlRowNames[row], e, i);
    }
    if (row != kLlBf16) continue;
    for (size_t i = 0; i < n; ++i) expertRow(e, &rows[i * rb], &expert[i * rb]);
    if (!spaceOk(space_->copy(dLlExpertOut_ + from, expert.data(), n * rb), "expertOut to space"))
      return false;
  }
  return true;
}

// Elements of the low-latency out (llOut_) whose bits differ from the normal out's.
int64_t LlBench::compareOut(int row) const {
  const uint16_t* got = reinterpret_cast<const uint16_t*>(llOut_.data());
  const uint16_t* want = reinterpret_cast<const uint16_t*>(out_.data());
  int64_t wrong = 0;
  for (size_t i = 0; i < o_.tokens * o_.hidden; ++i) {
    if (got[i] == want[i]) continue;
    if (wrong++ < 3)
      fprintf(stderr,
              "# rank %d: %s: LOW-LATENCY MISMATCH: out token %zu element %zu is 0x%04x, "
              "fuscoMoeCombine's 0x%04x\n",
              l_.rank, kLlRowNames[row], i / o_.hidden, i % o_.hidden, got[i], want[i]);
  }
  if (wrong > 0)
    fprintf(stderr,
            "# rank %d: %s: %" PRId64 " of %zu out elements differ from fuscoMoeCombine's\n",
            l_.rank, kLlRowNames[row], wrong, o_.tokens * o_.hidden);
  return wrong;
}

// The normal out against the exact weighted sum of the expert outputs, within the combine tree's
// roundings (three levels, each rounded to bf16: 4 roundings of the terms' magnitude).
int64_t LlBench::checkNormalOut() const {
  const double eps = dtypeEps(fuscoBfloat16);
  int64_t wrong = 0;
  for (size_t t = 0; t < o_.tokens; ++t) {
    const char* xr = &x_[t * rowBytes_];
    for (size_t j = 0; j < o_.hidden; ++j) {
      double want = 0, mag = 0;
      for (int k = 0; k < o_.topk; ++k) {
        const int64_t e = topkIdx_[t * o_.topk + k];
        if (e < 0) continue;
        const double term = static_cast<double>(weights_[t * o_.topk + k]) *
                            expertFactor(static_cast<int>(e)) * loadElement(fuscoBfloat16, xr, j);
        want += term, mag += std::fabs(term);
      }
      const double got = loadElement(fuscoBfloat16, &out_[t * rowBytes_], j);
      if (std::fabs(got - want) <= 4 * eps * mag + 1e-6) continue;
      if (wrong++ < 3)
        fprintf(stderr, "# rank %d: normal combine token %zu element %zu: got %g want %g\n",
                l_.rank, t, j, got, want);
    }
  }
  return wrong;
}

}  // namespace perf
}  // namespace fusco
