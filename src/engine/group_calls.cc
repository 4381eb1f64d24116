// The point-to-point calls of a group (group_calls.h).
#include "engine/group_calls.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/checked_math.h"
#include "plan/layout_check.h"

namespace fusco {

GroupState& threadGroup() {
  thread_local GroupState group;
  return group;
}

void checkGroupRows(const int64_t* rows, size_t nrows, size_t rowBytes, bool unique,
                    bool deviceRows, const char* fn, ArgCheck* a) {
  std::string msg;
  size_t bytes = 0;
  if (nrows > 0 && rows == nullptr) return a->fail("%s: rowIdx is NULL with %zu rows", fn, nrows);
  if (rowBytes == 0) return a->fail("%s: rowBytes is 0", fn);
  if (!checkedMul(nrows, rowBytes, &bytes))
    return a->fail("%s: nrows %zu x rowBytes %zu overflows a byte size", fn, nrows, rowBytes);
  if (deviceRows) return;
  if (!checkRowIndices(rows, nrows, rowBytes, unique, fn, &msg)) a->fail("%s", msg.c_str());
}

// Each comm runs one engine operation, and an operation waits only for ranks of its own
// communicator; with one order for all, no two ranks can wait for each other on two communicators
// in opposite orders, however the calls were added (pointers and call order differ between
// ranks, tags do not). A comm that is not live sorts first (its operation fails at once).
std::vector<fuscoComm_t> groupComms(const std::vector<PendingCall>& calls,
                                    uint64_t (*tagOf)(fuscoComm_t)) {
  std::vector<std::pair<uint64_t, fuscoComm_t>> comms;
  for (const auto& c : calls) {
    if (std::any_of(comms.begin(), comms.end(), [&](const auto& x) { return x.second == c.comm; }))
      continue;
    comms.push_back({tagOf(c.comm), c.comm});
  }
  std::stable_sort(comms.begin(), comms.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<fuscoComm_t> out;
  for (const auto& x : comms) out.push_back(x.second);
  return out;
}

std::vector<P2pCall> groupCallsOf(const std::vector<PendingCall>& calls, fuscoComm_t comm,
                                  bool deviceRows, ArgCheck* a) {
  std::vector<P2pCall> mine;
  for (const auto& c : calls) {
    if (c.comm != comm) continue;
    if (!c.check.ok() && a->ok()) *a = c.check;
    mine.push_back(c.call);
  }
  const std::string overlap = a->ok() ? groupOverlap(mine, deviceRows) : "";
  if (!overlap.empty()) a->fail("%s", overlap.c_str());
  return mine;
}

}  // namespace fusco
