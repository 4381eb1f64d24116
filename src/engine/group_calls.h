// The point-to-point calls of a group (fuscoGroupStart / fuscoGroupEnd): collected per thread
// until the outermost fuscoGroupEnd, then one engine operation per communicator, the
// communicators in an order every rank agrees on (src/api/alltoall_api.cc runs them).
#pragma once

#include <cstdint>
#include <vector>

#include "core/arg_check.h"
#include "engine/collective_ops.h"
#include "fusco.h"

namespace fusco {

struct PendingCall {
  fuscoComm_t comm;
  P2pCall call;
  ArgCheck check;
};

struct GroupState {
  int depth = 0;
  std::vector<PendingCall> calls;
};
// This thread's group.
GroupState& threadGroup();

// fuscoGatherSend's and fuscoScatterRecv's row indices, into *a. A host comm's are checked
// (plan/layout_check.h); a CUDA comm's live on the device (reading them would stall the caller's
// stream), so only their presence is checked (deviceRows; also for a comm that is not live).
void checkGroupRows(const int64_t* rows, size_t nrows, size_t rowBytes, bool unique,
                    bool deviceRows, const char* fn, ArgCheck* a);

// The communicators of a group, each once, in an order every rank agrees on: by their tag
// (tagOf, the same on every rank of a communicator; 0 for a comm that is not live).
std::vector<fuscoComm_t> groupComms(const std::vector<PendingCall>& calls,
                                    uint64_t (*tagOf)(fuscoComm_t));
// comm's calls among calls, in call order; *a gets the first failed check among them, else the
// overlap of a send and a receive range (groupOverlap).
std::vector<P2pCall> groupCallsOf(const std::vector<PendingCall>& calls, fuscoComm_t comm,
                                  bool deviceRows, ArgCheck* a);

}  // namespace fusco
