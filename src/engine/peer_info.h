// The per-rank record all-gathered at bootstrap: host identity, process identity and the ranks per
// node this rank was given (fuscoConfig_t.localSize, else FUSCO_LOCAL_SIZE; 0: by host), which
// every rank must agree on.
#pragma once

#include <string>
#include <vector>

#include "transport/transport.h"

namespace fusco {

std::string encodePeerInfo(const PeerInfo& info, int localSize);
bool decodePeerInfo(const std::string& blob, PeerInfo* info, int* localSize);
PeerInfo localPeerInfo();

}  // namespace fusco
