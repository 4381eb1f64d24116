// Layout descriptors: validated once (counts pairwise, receive rows written at most once) by
// fuscoLayoutCreate, then run many times by fuscoShuffle. Rows are gathered straight from the
// send buffer and scattered straight into their final rows; no permuted copy is built.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "api/api_internal.h"
#include "core/checked_math.h"
#include "engine/layout_op.h"
#include "plan/layout_check.h"

using namespace fusco;

struct fuscoLayout {
  fuscoComm_t comm = nullptr;
  uint64_t commSerial = 0;  // the comm's registration (api_internal.h, liveCommOf)
  fusco::LayoutPlan plan;
};

namespace {

// Validation lives in plan/layout_check.h (pure, fuzzed); this adapts it to ArgCheck.
void splitRows(const size_t counts[], const int64_t* rows, int n, const char* what,
               std::vector<std::vector<int64_t>>* out, ArgCheck* a) {
  std::string msg;
  if (!splitLayoutRows(counts, rows, n, what, out, &msg)) a->fail("%s", msg.c_str());
}

// Every row index times rowBytes must be a byte offset that fits: a wrapped one would name
// another row.
void checkRowExtent(const std::vector<std::vector<int64_t>>& lists, size_t rowBytes,
                    const char* what, ArgCheck* a) {
  int64_t top = -1;
  for (const auto& l : lists)
    for (int64_t r : l) top = std::max(top, r);
  size_t end = 0;
  if (top >= 0 && !checkedEnd(static_cast<size_t>(top), 1, rowBytes, &end))
    a->fail("fuscoLayoutCreate: %s row %lld x rowBytes %zu overflows a byte offset", what,
            static_cast<long long>(top), rowBytes);
}

}  // namespace

extern "C" {

fuscoResult_t fuscoLayoutCreate(fuscoLayout_t* layout, fuscoComm_t comm, size_t rowBytes,
                                const size_t sendCounts[], const int64_t* sendRows,
                                const size_t recvCounts[], const int64_t* recvRows) {
  return guarded(comm, "fuscoLayoutCreate", CallKind::Collective, [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkComm(comm, "fuscoLayoutCreate"));
    int n = comm->impl->nranks();
    std::unique_ptr<fuscoLayout> l(new fuscoLayout());
    l->comm = comm;
    l->commSerial = commSerial(comm);
    LayoutPlan& plan = l->plan;
    plan.rowBytes = rowBytes;
    ArgCheck a;
    if (layout == nullptr) a.fail("fuscoLayoutCreate: layout is NULL");
    if (rowBytes == 0) a.fail("fuscoLayoutCreate: rowBytes is 0");
    splitRows(sendCounts, sendRows, n, "send", &plan.sendRows, &a);
    splitRows(recvCounts, recvRows, n, "recv", &plan.recvRows, &a);
    if (a.ok() && rowBytes > 0) checkRowExtent(plan.sendRows, rowBytes, "send", &a);
    if (a.ok() && rowBytes > 0) checkRowExtent(plan.recvRows, rowBytes, "recv", &a);
    std::string msg;
    if (a.ok() && !checkUniqueRecvRows(plan.recvRows, &msg)) a.fail("%s", msg.c_str());
    FUSCO_CHECK(plan.create(*comm->impl, a));
    registerObject(ObjectKind::Layout, l.get());
    *layout = l.release();
    return fuscoSuccess;
  });
}

fuscoResult_t fuscoShuffle(const void* sendbuff, void* recvbuff, fuscoLayout_t layout,
                           void* stream) {
  fuscoComm_t comm = liveCommOf(ObjectKind::Layout, layout);
  return guarded(comm, "fuscoShuffle", CallKind::Collective, [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkObject(ObjectKind::Layout, layout, "fuscoShuffle"));
    FUSCO_CHECK(checkOwnerComm(comm, layout, "fuscoShuffle"));
    FUSCO_CHECK(checkComm(comm, "fuscoShuffle"));
    ArgCheck a;
    checkStream(comm, stream, "fuscoShuffle", &a);
    checkDevicePtr(comm, sendbuff, "fuscoShuffle", "sendbuff", &a);
    checkDevicePtr(comm, recvbuff, "fuscoShuffle", "recvbuff", &a);
    LayoutPlan& plan = layout->plan;
    const size_t sendTotal = plan.totalSendRows(), recvTotal = plan.totalRecvRows();
    if (sendTotal > 0 && sendbuff == nullptr)
      a.fail("fuscoShuffle: sendbuff is NULL with %zu rows to send", sendTotal);
    if (recvTotal > 0 && recvbuff == nullptr)
      a.fail("fuscoShuffle: recvbuff is NULL with %zu rows to receive", recvTotal);
    return plan.shuffle(*comm->impl, sendbuff, recvbuff, stream, a);
  });
}

fuscoResult_t fuscoLayoutDestroy(fuscoLayout_t layout) {
  return guarded(nullptr, "fuscoLayoutDestroy", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkObject(ObjectKind::Layout, layout, "fuscoLayoutDestroy"));
    // Only the call that takes it out of the registry frees it: a second destroy fails above.
    if (!unregisterObject(ObjectKind::Layout, layout))
      return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                        "fuscoLayoutDestroy: %p is not a live layout (destroyed or never created)",
                        static_cast<void*>(layout));
    delete layout;
    return fuscoSuccess;
  });
}

}  // extern "C"
