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

// One rank's layer plan (fuscoMoePlan by steps): its send side with the count message, the
// receive layout from the count messages that arrive (countsIn) and the fan rows at the source
// from the bases that come back (basesIn). Carved from one buffer: first the tables the host
// fills (rankOf, localOf, msgOff, msgPos, basePos: tablesBytes), then the summary the host reads
// back in one copy (rowOff, slotOff, badSlot, totals, countsIn, tokensPerLocal, blockStart,
// padding: [summaryOffset, summaryOffset + summaryBytes)), then the rest.
struct LayerPlanDims {
  uint64_t numTokens = 0;
  uint32_t topk = 0, nranks = 0, numExperts = 0, numLocal = 0;
};
struct LayerPlan {
  gplan::SendArgs send;
  gplan::RecvArgs layout;
  gplan::FanArgs fan;
  int32_t* rankOf = nullptr;    // [numExperts]
  int32_t* localOf = nullptr;   // [numExperts]
  uint32_t* msgOff = nullptr;   // [nranks]
  uint32_t* msgPos = nullptr;   // [numExperts]
  uint32_t* basePos = nullptr;  // [numExperts]
  int64_t* basesIn = nullptr;   // [numExperts]
  size_t tablesBytes = 0, summaryOffset = 0, summaryBytes = 0;
};
// Carves *p (pointers into base; null base: measures only) and returns the bytes.
size_t carveLayerPlan(char* base, const LayerPlanDims& d, LayerPlan* p);

// Host twin: the same steps as loops over host memory (plan_twin.cc).
void hostPlanSend(const gplan::SendArgs& a);
void hostPlanTermRows(const gplan::SendArgs& a, const int64_t* remoteFan);
void hostPlanRecv(const gplan::RecvArgs& a);
void hostPlanLayout(const gplan::RecvArgs& a);
void hostPlanFan(const gplan::FanArgs& f, const gplan::SendArgs& a);

// Kernels on `stream` (a cudaStream_t) over device memory; RecvArgs' srcKStart and srcLocal are
// device arrays of device pointers (peers' lists mapped through CUDA IPC, or landed copies).
fuscoResult_t devicePlanSend(const gplan::SendArgs& a, void* stream);
fuscoResult_t devicePlanTermRows(const gplan::SendArgs& a, const int64_t* remoteFan, void* stream);
fuscoResult_t devicePlanRecv(const gplan::RecvArgs& a, void* stream);
fuscoResult_t devicePlanLayout(const gplan::RecvArgs& a, void* stream);
fuscoResult_t devicePlanFan(const gplan::FanArgs& f, const gplan::SendArgs& a, void* stream);

}  // namespace fusco
