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
// What a CUDA comm says at init about CUDA_DEVICE_MAX_CONNECTIONS (its text, NULL when unset):
// with fewer hardware queues than fusco's waits need, a call waiting for a late peer holds the
// queue the caller's other streams share (docs/DESIGN.md, "The CUDA rules"); "" when nothing.
std::string connectionsWarning(const char* maxConnections);
// How many ranks hold the device identity ids[rank] (itself included); an empty identity (unknown)
// is counted as not shared.
int ranksSharingDevice(const std::vector<std::string>& ids, int rank);

}  // namespace fusco
