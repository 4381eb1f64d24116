// The GPU planner's entry points (plan_steps.h): the layout of its arrays in one buffer, the host
// twin of its steps, and the kernels. No CUDA headers here; without the CUDA toolkit in the
// build the kernel launchers return fuscoInvalidUsage and the twin still works.
#pragma once

#include <cstddef>
#include <cstdint>

#include "device/plan_steps.h"
#include "fusco.h"

namespace fusco {

// Carves the work and output arrays of a send-side plan out of one buffer at base (nullptr:
// measures only), each 16-byte aligned; the caller sets the routing fields. Returns the bytes.
// Sized for the worst case of numTokens x topk valid slots, so no count is needed first.
size_t carvePlanSend(char* base, uint64_t numTokens, uint32_t topk, uint32_t nranks,
                     gplan::SendArgs* a);
// The same for the receive side, sized for at most maxEntries (row, expert) entries in maxRows
// rows from all sources; the caller sets nranks, numLocal, align and the sources' lists. The
// counting chunk is chosen so the (expert, chunk) table stays bounded.
size_t carvePlanRecv(char* base, uint32_t nranks, uint32_t numLocal, uint64_t maxEntries,
                     uint64_t maxRows, gplan::RecvArgs* a);

// Host twin: the same steps as loops over host memory (plan_twin.cc).
void hostPlanSend(const gplan::SendArgs& a);
void hostPlanTermRows(const gplan::SendArgs& a, const int64_t* remoteFan);
void hostPlanRecv(const gplan::RecvArgs& a);

// Kernels on `stream` (a cudaStream_t) over device memory; RecvArgs' srcKStart and srcLocal are
// device arrays of device pointers (peers' lists mapped through CUDA IPC, or landed copies).
fuscoResult_t devicePlanSend(const gplan::SendArgs& a, void* stream);
fuscoResult_t devicePlanTermRows(const gplan::SendArgs& a, const int64_t* remoteFan, void* stream);
fuscoResult_t devicePlanRecv(const gplan::RecvArgs& a, void* stream);

}  // namespace fusco
