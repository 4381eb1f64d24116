// The part of a plan by the steps (plan_layer.h) that reads only the handle and its summary on
// the host: a capacity plan runs it on the progress thread (engine.h's Op::late) once the summary
// has come back; a plan with sizes runs it on the caller's thread after its one read back.
#pragma once

#include <vector>

#include "core/arg_check.h"
#include "engine/engine.h"
#include "moe/moe_handle.h"

namespace fusco {

// Each reads the plan `v` (h.stepsView() on the caller's thread; a capacity plan's own copy on the
// progress thread).
//
// The sizes the summary gives (h.sizes), after checking the count messages that arrived
// (fuscoRemoteError naming the source) and the receive rows against h.capacity. *badSource: the
// first source whose count message says its routing is invalid (-1: none; its sizes are not
// read, and that source's own check fails the call).
void checkSummary(MoeHandle& h, const PlanView& v, ArgCheck* b, int* badSource);
// The last operation's work: each source's kStart and fan rows for each destination, into the
// receive lists at v.fanStart / fanRows (sets the offsets h.steps.rowOffFrom and entryOff).
void fanListsWork(MoeHandle& h, const PlanView& v, std::vector<PeerWork>* work);
// The receive counts on the host and the lists where the comm's paths read them.
void finishLists(MoeHandle& h, const PlanView& v);
// The host copy of the routing the plan was made from (topkIdx in host memory; nothing when it is
// the handle's own copy already).
void keepRouting(const int64_t* topkIdx, MoeHandle* h);
// FUSCO_PLAN_TRACE's line for a plan made by the steps.
void traceSizes(const MoeHandle& h);

}  // namespace fusco
