// Validation of fuscoMoeConfig_t, the versioned struct fuscoMoePlan takes (docs/STYLE.md, rule 7;
// docs/API.md, "Conventions"): what this rank can check on its own before the plan exchange.
#pragma once

#include "core/arg_check.h"
#include "fusco.h"

namespace fusco {

// Fails *a (first failure kept) when cfg is NULL, its size, magic or version do not match this
// library, dedup or balance is not one of their values, or numExperts / expertAlignment lie
// outside the supported ranges (plan/moe_plan.h, kMaxExperts and kMaxExpertAlignment).
void checkMoeConfig(const fuscoMoeConfig_t* cfg, ArgCheck* a);

}  // namespace fusco
