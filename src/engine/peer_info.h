// The per-rank record all-gathered at bootstrap: host identity and process identity.
#pragma once

#include <string>

#include "transport/transport.h"

namespace fusco {

std::string encodePeerInfo(const PeerInfo& info);
bool decodePeerInfo(const std::string& blob, PeerInfo* info);
PeerInfo localPeerInfo();

}  // namespace fusco
