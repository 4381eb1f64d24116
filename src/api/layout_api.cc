// Layout descriptors: validated once (counts pairwise, receive rows written at most once) by
// fuscoLayoutCreate, then run many times by fuscoShuffle. Rows are gathered straight from the
// send buffer and scattered straight into their final rows; no permuted copy is built.
#include <memory>

#include "api/api_internal.h"
#include "engine/layout_op.h"

using namespace fusco;

struct fuscoLayout {
  fuscoComm_t comm = nullptr;  // the comm handle it was made on (api_internal.h, liveCommOf)
  fusco::LayoutPlan plan;
};

extern "C" {

fuscoResult_t fuscoLayoutCreate(fuscoLayout_t* layout, fuscoComm_t comm, size_t rowBytes,
                                const size_t sendCounts[], const int64_t* sendRows,
                                const size_t recvCounts[], const int64_t* recvRows) {
  return guarded(comm, "fuscoLayoutCreate", CallKind::Collective, [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkComm(comm, "fuscoLayoutCreate"));
    int n = implOf(comm).nranks();
    std::unique_ptr<fuscoLayout> l(new fuscoLayout());
    l->comm = comm;
    LayoutPlan& plan = l->plan;
    plan.rowBytes = rowBytes;
    ArgCheck a;
    if (layout == nullptr) a.fail("fuscoLayoutCreate: layout is NULL");
    if (rowBytes == 0) a.fail("fuscoLayoutCreate: rowBytes is 0");
    plan.setRows(n, rowBytes, sendCounts, sendRows, recvCounts, recvRows, &a);
    FUSCO_CHECK(plan.create(implOf(comm), a));
    *layout = static_cast<fuscoLayout_t>(registerLive(LiveKind::Layout, l.get()));
    l.release();
    return fuscoSuccess;
  });
}

fuscoResult_t fuscoShuffle(const void* sendbuff, void* recvbuff, fuscoLayout_t layout,
                           void* stream) {
  fuscoComm_t comm = liveCommOf<fuscoLayout>(LiveKind::Layout, layout);
  return guarded(comm, "fuscoShuffle", CallKind::Collective, [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkObject(LiveKind::Layout, layout, "fuscoShuffle"));
    FUSCO_CHECK(checkOwnerComm(comm, layout, "fuscoShuffle"));
    FUSCO_CHECK(checkComm(comm, "fuscoShuffle"));
    ArgCheck a;
    checkStream(comm, stream, "fuscoShuffle", &a);
    checkDevicePtr(comm, sendbuff, "fuscoShuffle", "sendbuff", &a);
    checkDevicePtr(comm, recvbuff, "fuscoShuffle", "recvbuff", &a);
    LayoutPlan& plan = objectOf<fuscoLayout>(LiveKind::Layout, layout)->plan;
    const size_t sendTotal = plan.totalSendRows(), recvTotal = plan.totalRecvRows();
    if (sendTotal > 0 && sendbuff == nullptr)
      a.fail("fuscoShuffle: sendbuff is NULL with %zu rows to send", sendTotal);
    if (recvTotal > 0 && recvbuff == nullptr)
      a.fail("fuscoShuffle: recvbuff is NULL with %zu rows to receive", recvTotal);
    return plan.shuffle(implOf(comm), sendbuff, recvbuff, stream, a);
  });
}

fuscoResult_t fuscoLayoutDestroy(fuscoLayout_t layout) {
  return guarded(nullptr, "fuscoLayoutDestroy", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkObject(LiveKind::Layout, layout, "fuscoLayoutDestroy"));
    // Only the call that takes it out of the registry frees it: a second destroy fails above.
    auto* obj = static_cast<fuscoLayout*>(unregisterLive(LiveKind::Layout, layout));
    if (obj == nullptr)
      return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                        "fuscoLayoutDestroy: %p is not a live layout (destroyed or never created)",
                        static_cast<void*>(layout));
    delete obj;
    return fuscoSuccess;
  });
}

}  // extern "C"
