// The network data path of a fuscoMemCuda communicator (docs/DESIGN.md, "Peers on other nodes"),
// chosen at init from FUSCO_NET_GDR and what UCX reports:
//  - staged: device rows are gathered into pinned host memory that UCX sends from, and scattered
//    from pinned host memory they land in (the path this version moves rows on);
//  - GPUDirect (UCX sending straight from and into device memory) needs UCX built with CUDA
//    support on every rail (ucp_context_query: UCP_ATTR_FIELD_MEMORY_TYPES has
//    UCS_MEMORY_TYPE_CUDA) and a GPUDirect data path, which this version does not have, so
//    FUSCO_NET_GDR=1 fails init with the reason.
#pragma once

#include <string>

#include "fusco.h"

namespace fusco {
namespace ucx {

struct UcxComm;

// FUSCO_NET_GDR: "auto", "0" or "1".
std::string paramNetGdr();

// The path for `setting` when `cudaRails` of `rails` report CUDA memory: fuscoSuccess and *path
// (a line for the INFO log), or the failure with its message (a bad setting: fuscoInvalidArgument;
// 1 where GPUDirect is impossible: fuscoInvalidUsage).
fuscoResult_t chooseNetPath(const std::string& setting, size_t cudaRails, size_t rails,
                            std::string* path);

// Whether the rail's UCX context reports CUDA memory support.
bool railHasCudaMemory(const UcxComm* c, size_t rail);

}  // namespace ucx
}  // namespace fusco
