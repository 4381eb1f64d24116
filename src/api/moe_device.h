// MoE dispatch and combine on fuscoMemCuda comms (moe_device.cc).
#pragma once

#include <vector>

#include "api/moe_handle.h"

namespace fusco {

// Builds the dispatch operation on device buffers (padding rows zeroed on the stream) and runs it.
fuscoResult_t deviceDispatch(fuscoMoeHandle& h, const void* x, size_t rowBytes, void* recvX, ArgCheck a,
                             void* stream, std::vector<PeerWork>* work);
// One pull operation: the source's sum kernel reads its rows in every rank's expert output.
// *work: the partial sums' operation (what this rank sent).
fuscoResult_t deviceCombine(fuscoMoeHandle& h, const void* expertOut, fuscoDataType_t dt, size_t hidden,
                            const float* topkWeights, void* out, ArgCheck a, void* stream,
                            std::vector<PeerWork>* work);

}  // namespace fusco
