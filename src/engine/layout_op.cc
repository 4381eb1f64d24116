#include "engine/layout_op.h"

#include <algorithm>
#include <string>

#include "core/result.h"
#include "plan/layout_check.h"

namespace fusco {

namespace {

// Validation lives in plan/layout_check.h (pure, fuzzed); this adapts it to ArgCheck.
void splitRows(const size_t counts[], const int64_t* rows, int n, const char* what,
               std::vector<std::vector<int64_t>>* out, ArgCheck* a) {
  std::string msg;
  if (!splitLayoutRows(counts, rows, n, what, out, &msg)) a->fail("%s", msg.c_str());
}

}  // namespace

void LayoutPlan::setRows(int n, size_t bytes, const size_t sendCounts[], const int64_t* sendRowIdx,
                         const size_t recvCounts[], const int64_t* recvRowIdx, ArgCheck* a) {
  rowBytes = bytes;
  splitRows(sendCounts, sendRowIdx, n, "send", &sendRows, a);
  splitRows(recvCounts, recvRowIdx, n, "recv", &recvRows, a);
  std::string msg;
  if (a->ok() && rowBytes > 0 &&
      (!checkLayoutRowExtent(sendRows, rowBytes, "send", &msg) ||
       !checkLayoutRowExtent(recvRows, rowBytes, "recv", &msg)))
    a->fail("%s", msg.c_str());
  if (a->ok() && !checkUniqueRecvRows(recvRows, &msg)) a->fail("%s", msg.c_str());
}

size_t LayoutPlan::totalSendRows() const {
  size_t n = 0;
  for (const auto& v : sendRows) n += v.size();
  return n;
}

size_t LayoutPlan::totalRecvRows() const {
  size_t n = 0;
  for (const auto& v : recvRows) n += v.size();
  return n;
}

// Copies every row list to the device once (stream-ordered on the legacy stream; a shuffle's
// stream waits for it).
fuscoResult_t LayoutPlan::upload(int64_t timeoutMs) {
  const int n = static_cast<int>(sendRows.size());
  size_t total = 0;
  sendAt.assign(n, 0);
  recvAt.assign(n, 0);
  for (int p = 0; p < n; ++p) sendAt[p] = total, total += sendRows[p].size();
  for (int p = 0; p < n; ++p) recvAt[p] = total, total += recvRows[p].size();
  FUSCO_CHECK(deviceRows.reserve(total * sizeof(int64_t), timeoutMs));
  int64_t* h = reinterpret_cast<int64_t*>(deviceRows.host());
  for (int p = 0; p < n; ++p) {
    std::copy(sendRows[p].begin(), sendRows[p].end(), h + sendAt[p]);
    std::copy(recvRows[p].begin(), recvRows[p].end(), h + recvAt[p]);
  }
  return deviceRows.upload(total * sizeof(int64_t), nullptr);
}

Op LayoutPlan::op(const void* sendbuff, void* recvbuff, const char* name) const {
  const int n = static_cast<int>(sendRows.size());
  Op op(n);
  op.name = name;
  op.kind = OpKind::Shuffle;
  op.collective = true;
  const bool dev = !sendAt.empty();
  const int64_t* devRows = reinterpret_cast<const int64_t*>(deviceRows.device());
  for (int p = 0; p < n; ++p) {
    const int64_t* s = dev ? devRows + sendAt[p] : sendRows[p].data();
    const int64_t* r = dev ? devRows + recvAt[p] : recvRows[p].data();
    op.peers[p].sends.push_back(RowStream::indexed(sendbuff, rowBytes, s, sendRows[p].size()));
    op.peers[p].recvs.push_back(RowStream::indexed(recvbuff, rowBytes, r, recvRows[p].size()));
  }
  return op;
}

fuscoResult_t LayoutPlan::create(Communicator& c, const ArgCheck& a) {
  if (!a.ok()) {
    for (auto& v : sendRows) v.clear();
    for (auto& v : recvRows) v.clear();
  }
  Op check = op(nullptr, nullptr, "fuscoLayoutCreate");
  check.validateOnly = true;
  check.hostData = true;
  check.argStatus = a.status;
  check.argError = a.message;
  FUSCO_CHECK(runOp(c, check));
  if (c.memType() != fuscoMemCuda) return fuscoSuccess;
  FUSCO_CHECK(c.useDevice());
  return upload(c.timeoutMs());
}

fuscoResult_t LayoutPlan::shuffle(Communicator& c, const void* sendbuff, void* recvbuff,
                                  void* stream, const ArgCheck& a) {
  if (c.memType() == fuscoMemCuda) {
    FUSCO_CHECK(c.useDevice());
    FUSCO_CHECK(deviceRows.waitUploaded(stream));
  }
  Op run = op(sendbuff, recvbuff, "fuscoShuffle");
  run.stream = stream;
  if (!a.ok())
    for (auto& w : run.peers) w.sends.clear(), w.recvs.clear();
  run.argStatus = a.status;
  run.argError = a.message;
  return runOp(c, run);
}

}  // namespace fusco
