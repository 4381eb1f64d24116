#include "transport/ucx/ucx_gdr.h"

#include "core/params.h"
#include "core/result.h"
#include "transport/ucx/ucx_comm.h"

namespace fusco {
namespace ucx {

// A choice, so a value other than these is warned about and replaced by auto, like every knob.
constexpr ParamChoice kGdrChoices[] = {{"auto", -1}, {"0", 0}, {"1", 1}};
FUSCO_PARAM_CHOICE(NetGdrChoice, int, "FUSCO_NET_GDR", "auto", kGdrChoices,
                   "CUDA comms across nodes: auto, 0 (rows staged through pinned host memory) or "
                   "1 (GPUDirect RDMA; fails init where it is impossible)");

std::string paramNetGdr() {
  const int v = paramNetGdrChoice();
  return v < 0 ? "auto" : std::to_string(v);
}

fuscoResult_t chooseNetPath(const std::string& setting, size_t cudaRails, size_t rails,
                            std::string* path) {
  if (setting != "auto" && setting != "0" && setting != "1")
    return FUSCO_FAIL(fuscoInvalidArgument, kInit, "FUSCO_NET_GDR=%s: expected auto, 0 or 1",
                      setting.c_str());
  const bool ucxCuda = rails > 0 && cudaRails == rails;
  const std::string ucxSays =
      ucxCuda ? "UCX reports CUDA memory on every rail"
              : "UCX reports no CUDA memory on " + std::to_string(rails - cudaRails) + " of " +
                    std::to_string(rails) + " rail(s) (built without CUDA transports?)";
  if (setting == "1") {
    const std::string why =
        ucxCuda ? ucxSays +
                      ", but this version of fusco moves device rows across nodes only "
                      "through pinned host staging (no GPUDirect data path)"
                : ucxSays;
    return FUSCO_FAIL(fuscoInvalidUsage, kInit, "FUSCO_NET_GDR=1: GPUDirect is impossible here: %s",
                      why.c_str());
  }
  *path = "staged through pinned host memory (" +
          (setting == "0" ? std::string("FUSCO_NET_GDR=0") : ucxSays) + ")";
  return fuscoSuccess;
}

bool railHasCudaMemory(const UcxComm* c, size_t rail) {
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(c->rails[rail].context, &attr) != UCS_OK) return false;
  return (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

}  // namespace ucx
}  // namespace fusco
