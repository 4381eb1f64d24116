// The MoE calls' checks against a handle's plan (the sizes it bounds) and what the handle's
// queries copy out (moe.h). src/api/moe_api.cc checks the stream and device pointers around them.
#include <mutex>

#include "core/checked_math.h"
#include "core/datatype.h"
#include "core/result.h"
#include "moe/moe.h"

namespace fusco {

void moeCheckDispatch(const MoeHandle& h, const void* x, size_t rowBytes, void* recvX,
                      ArgCheck* a) {
  if (rowBytes == 0) a->fail("fuscoMoeDispatch: rowBytes is 0");
  size_t bytes = 0;
  const size_t recvRows = h.recvRowsBound();
  if (!checkedMul(recvRows, rowBytes, &bytes) || !checkedMul(h.numTokens, rowBytes, &bytes))
    a->fail(
        "fuscoMoeDispatch: rowBytes %zu x %zu received rows (or %zu tokens) overflows a byte "
        "size",
        rowBytes, recvRows, h.numTokens);
  const size_t sendRows = h.sendRowsBound();
  if (x == nullptr && sendRows > 0)
    a->fail("fuscoMoeDispatch: x is NULL with %zu rows to send", sendRows);
  if (recvX == nullptr && recvRows > 0)
    a->fail("fuscoMoeDispatch: recvX is NULL with %zu rows to receive", recvRows);
}

void moeCheckCombine(const MoeHandle& h, const void* expertOut, int dt, size_t hidden,
                     const void* out, ArgCheck* a) {
  if (dt != fuscoFloat32 && dt != fuscoBfloat16 && dt != fuscoFloat16)
    a->fail("fuscoMoeCombine: datatype %d is not fuscoFloat32, fuscoBfloat16 or fuscoFloat16", dt);
  if (hidden == 0) a->fail("fuscoMoeCombine: hidden is 0");
  size_t row = 0, bytes = 0;
  const size_t es = dataTypeSize(static_cast<fuscoDataType_t>(a->ok() ? dt : fuscoFloat32));
  const size_t recvRows = h.recvRowsBound();
  if (!checkedMul(hidden, es, &row) || !checkedMul(recvRows, row, &bytes) ||
      !checkedMul(h.numTokens, row, &bytes))
    a->fail(
        "fuscoMoeCombine: hidden %zu x %zu-byte elements x %zu rows (or %zu tokens) overflows "
        "a byte size",
        hidden, es, recvRows, h.numTokens);
  if (expertOut == nullptr && recvRows > 0)
    a->fail("fuscoMoeCombine: expertOut is NULL with %zu rows", recvRows);
  if (out == nullptr && h.numTokens > 0)
    a->fail("fuscoMoeCombine: out is NULL with %zu tokens", h.numTokens);
}

fuscoResult_t moeRecvCounts(MoeHandle& h, bool commLive, size_t* numRecvRows,
                            int64_t* tokensPerLocalExpert) {
  if (h.capacity != 0) {
    if (!commLive)
      return FUSCO_FAIL(fuscoInvalidUsage, kApi,
                        "fuscoMoeGetRecvCounts: the handle's communicator was destroyed");
    FUSCO_CHECK(moeWaitPlan(h));
  }
  const MoeRecvPlan& recv = h.recv;
  *numRecvRows = recv.numRecvRows;
  if (tokensPerLocalExpert != nullptr)
    for (size_t e = 0; e < recv.tokensPerLocalExpert.size(); ++e)
      tokensPerLocalExpert[e] = recv.tokensPerLocalExpert[e];
  return fuscoSuccess;
}

void moeCopyStats(MoeHandle& h, fuscoMoeStats_t* stats) {
  {
    std::lock_guard<std::mutex> lk(h.statsMu);
    *stats = h.stats;
  }
  stats->size = sizeof(fuscoMoeStats_t);
}

}  // namespace fusco
