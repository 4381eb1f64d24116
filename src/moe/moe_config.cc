// fuscoMoeConfig_t validation (see moe_config.h).
#include "moe/moe_config.h"

#include "plan/moe_plan.h"

namespace fusco {

void checkMoeConfig(const fuscoMoeConfig_t* cfg, ArgCheck* a) {
  if (cfg == nullptr) return a->fail("fuscoMoePlan: config is NULL");
  if (cfg->size != sizeof(fuscoMoeConfig_t) || cfg->magic != FUSCO_MOE_CONFIG_MAGIC ||
      cfg->version != FUSCO_MOE_CONFIG_VERSION)
    return a->fail(
        "fuscoMoePlan: config has size %zu, magic 0x%x, version %u; expected %zu, 0x%x, %u "
        "(initialize it with FUSCO_MOE_CONFIG_INITIALIZER)",
        cfg->size, cfg->magic, cfg->version, sizeof(fuscoMoeConfig_t), FUSCO_MOE_CONFIG_MAGIC,
        FUSCO_MOE_CONFIG_VERSION);
  if (cfg->dedup < FUSCO_DEDUP_AUTO || cfg->dedup > FUSCO_DEDUP_NODE)
    a->fail("fuscoMoePlan: config.dedup %d is not a FUSCO_DEDUP_* value", cfg->dedup);
  if (cfg->balance < FUSCO_BALANCE_AUTO || cfg->balance > FUSCO_BALANCE_GREEDY)
    a->fail("fuscoMoePlan: config.balance %d is not a FUSCO_BALANCE_* value", cfg->balance);
  if (cfg->numExperts < 1 || cfg->numExperts > kMaxExperts)
    a->fail("fuscoMoePlan: config.numExperts %d outside the supported range [1, %d]",
            cfg->numExperts, kMaxExperts);
  if (cfg->expertAlignment < 0 || cfg->expertAlignment > kMaxExpertAlignment)
    a->fail(
        "fuscoMoePlan: config.expertAlignment %d outside the supported range [0, %d] (0 or 1: "
        "no padding)",
        cfg->expertAlignment, kMaxExpertAlignment);
}

}  // namespace fusco
