// fuscoMoePlan by the GPU planner's steps (plan_layer.cc; docs/DESIGN.md, "Planning on the GPU").
#pragma once

#include "core/arg_check.h"
#include "engine/communicator.h"
#include "fusco.h"
#include "moe/moe_handle.h"

namespace fusco {

// Whether fuscoMoePlan plans by the steps (FUSCO_PLAN): by default on CUDA comms; never under
// NODE dedup (the host planner's forwarding plan).
bool planBySteps(const Communicator& c, Dedup dedup);

// fuscoMoePlan's (or fuscoMoeReplan's) collective part by the steps into *h, for the config the
// handle keeps (h->shape, dedup; h->comm, numTokens, topk and capacity set), with the same lists,
// results and errors as the host planner. topkIdx is read only when a is ok.
fuscoResult_t planMoeSteps(const int64_t* topkIdx, void* stream, ArgCheck a, MoeHandle* h);

}  // namespace fusco
