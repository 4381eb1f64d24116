// Layout descriptors: validated once (counts pairwise, receive rows written at most once) by
// fuscoLayoutCreate, then run many times by fuscoShuffle. Rows are gathered straight from the
// send buffer and scattered straight into their final rows; no permuted copy is built.
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <vector>

#include "api/api_internal.h"
#include "device/cuda_rt.h"
#include "engine/engine.h"
#include "plan/layout_check.h"

using namespace fusco;

struct fuscoLayout {
  fuscoComm_t comm = nullptr;
  size_t rowBytes = 0;
  std::vector<std::vector<int64_t>> sendRows;  // [nranks]
  std::vector<std::vector<int64_t>> recvRows;  // [nranks]
  // fuscoMemCuda comms: the same rows on the device, send rows of every peer then receive rows.
  fusco::DeviceBuffer deviceRows;
  std::vector<size_t> sendAt, recvAt;  // [nranks] offsets (in rows) into deviceRows
};

namespace {

// Validation lives in plan/layout_check.h (pure, fuzzed); this adapts it to ArgCheck.
void splitRows(const size_t counts[], const int64_t* rows, int n, const char* what,
               std::vector<std::vector<int64_t>>* out, ArgCheck* a) {
  std::string msg;
  if (!splitLayoutRows(counts, rows, n, what, out, &msg)) a->fail("%s", msg.c_str());
}

// Copies every row list to the device once (stream-ordered on the legacy stream; a shuffle's
// stream waits for it).
fuscoResult_t uploadRows(fuscoLayout* l) {
  const int n = static_cast<int>(l->sendRows.size());
  size_t total = 0;
  l->sendAt.assign(n, 0);
  l->recvAt.assign(n, 0);
  for (int p = 0; p < n; ++p) l->sendAt[p] = total, total += l->sendRows[p].size();
  for (int p = 0; p < n; ++p) l->recvAt[p] = total, total += l->recvRows[p].size();
  FUSCO_CHECK(l->deviceRows.reserve(total * sizeof(int64_t)));
  int64_t* h = reinterpret_cast<int64_t*>(l->deviceRows.host());
  for (int p = 0; p < n; ++p) {
    std::copy(l->sendRows[p].begin(), l->sendRows[p].end(), h + l->sendAt[p]);
    std::copy(l->recvRows[p].begin(), l->recvRows[p].end(), h + l->recvAt[p]);
  }
  return l->deviceRows.upload(total * sizeof(int64_t), nullptr);
}

Op layoutOp(const fuscoLayout& l, const void* sendbuff, void* recvbuff, const char* name) {
  int n = static_cast<int>(l.sendRows.size());
  Op op(n);
  op.name = name;
  op.kind = OpKind::Shuffle;
  op.collective = true;
  const bool dev = !l.sendAt.empty();
  const int64_t* devRows = reinterpret_cast<const int64_t*>(l.deviceRows.device());
  for (int p = 0; p < n; ++p) {
    const int64_t* s = dev ? devRows + l.sendAt[p] : l.sendRows[p].data();
    const int64_t* r = dev ? devRows + l.recvAt[p] : l.recvRows[p].data();
    op.peers[p].sends.push_back(RowStream::indexed(sendbuff, l.rowBytes, s, l.sendRows[p].size()));
    op.peers[p].recvs.push_back(RowStream::indexed(recvbuff, l.rowBytes, r, l.recvRows[p].size()));
  }
  return op;
}

}  // namespace

extern "C" {

fuscoResult_t fuscoLayoutCreate(fuscoLayout_t* layout, fuscoComm_t comm, size_t rowBytes,
                                const size_t sendCounts[], const int64_t* sendRows,
                                const size_t recvCounts[], const int64_t* recvRows) {
  return guarded(comm, "fuscoLayoutCreate", [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkComm(comm, "fuscoLayoutCreate"));
    int n = comm->impl->nranks();
    std::unique_ptr<fuscoLayout> l(new fuscoLayout());
    l->comm = comm;
    l->rowBytes = rowBytes;
    ArgCheck a;
    if (layout == nullptr) a.fail("fuscoLayoutCreate: layout is NULL");
    if (rowBytes == 0) a.fail("fuscoLayoutCreate: rowBytes is 0");
    splitRows(sendCounts, sendRows, n, "send", &l->sendRows, &a);
    splitRows(recvCounts, recvRows, n, "recv", &l->recvRows, &a);
    if (a.status == fuscoSuccess) {
      std::string msg;
      if (!checkUniqueRecvRows(l->recvRows, &msg)) a.fail("%s", msg.c_str());
    }
    if (a.status != fuscoSuccess) {
      for (auto& v : l->sendRows) v.clear();
      for (auto& v : l->recvRows) v.clear();
    }
    Op op = layoutOp(*l, nullptr, nullptr, "fuscoLayoutCreate");
    op.validateOnly = true;
    op.hostData = true;
    op.argStatus = a.status;
    op.argError = a.message;
    FUSCO_CHECK(runOp(*comm->impl, op));
    if (isCudaComm(comm)) {
      FUSCO_CHECK(comm->impl->useDevice());
      FUSCO_CHECK(uploadRows(l.get()));
    }
    *layout = l.release();
    return fuscoSuccess;
  });
}

fuscoResult_t fuscoShuffle(const void* sendbuff, void* recvbuff, fuscoLayout_t layout, void* stream) {
  fuscoComm_t comm = layout ? layout->comm : nullptr;
  return guarded(comm, "fuscoShuffle", [&]() -> fuscoResult_t {
    if (layout == nullptr) return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoShuffle: layout is NULL");
    FUSCO_CHECK(checkComm(comm, "fuscoShuffle"));
    ArgCheck a;
    if (comm->impl->memType() == fuscoMemHost && stream != nullptr)
      a.fail("fuscoShuffle: stream must be NULL for a host-memory communicator");
    checkDevicePtr(comm, sendbuff, "fuscoShuffle", "sendbuff", &a);
    checkDevicePtr(comm, recvbuff, "fuscoShuffle", "recvbuff", &a);
    if (isCudaComm(comm)) {
      FUSCO_CHECK(comm->impl->useDevice());
      FUSCO_CHECK(layout->deviceRows.waitUploaded(stream));
    }
    size_t sendRowsTotal = 0, recvRowsTotal = 0;
    for (const auto& v : layout->sendRows) sendRowsTotal += v.size();
    for (const auto& v : layout->recvRows) recvRowsTotal += v.size();
    if (sendRowsTotal > 0 && sendbuff == nullptr) a.fail("fuscoShuffle: sendbuff is NULL with %zu rows to send", sendRowsTotal);
    if (recvRowsTotal > 0 && recvbuff == nullptr) a.fail("fuscoShuffle: recvbuff is NULL with %zu rows to receive", recvRowsTotal);
    Op op = layoutOp(*layout, sendbuff, recvbuff, "fuscoShuffle");
    op.stream = stream;
    if (a.status != fuscoSuccess)
      for (auto& w : op.peers) w.sends.clear(), w.recvs.clear();
    op.argStatus = a.status;
    op.argError = a.message;
    return runOp(*comm->impl, op);
  });
}

fuscoResult_t fuscoLayoutDestroy(fuscoLayout_t layout) {
  return guarded(nullptr, "fuscoLayoutDestroy", [&]() -> fuscoResult_t {
    if (layout == nullptr) return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoLayoutDestroy: layout is NULL");
    delete layout;
    return fuscoSuccess;
  });
}

}  // extern "C"
