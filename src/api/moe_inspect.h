// What a MoE handle's plan holds, for tests below the public API (tests/mp/test_moe_replan.cc
// checks that fuscoMoeReplan reuses a handle's storage).
#pragma once

#include <vector>

#include "fusco.h"
#include "moe/moe_handle.h"

namespace fusco {

// MoeHandle::storage() of a live handle (false, *out untouched, for any other pointer). Calls on
// the handle must not run meanwhile (it counts as its communicator).
bool moeHandleStorage(fuscoMoeHandle_t handle, std::vector<ListStorage>* out);
// What the handle's last plan by the planner's steps cost the host (MoeHandle::PlanRounds); false
// for any other pointer, or a plan by the host planner.
bool moeHandlePlanRounds(fuscoMoeHandle_t handle, MoeHandle::PlanRounds* out);

}  // namespace fusco
