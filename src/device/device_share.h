// How the ranks of a communicator share GPUs, learnt at init from the device identities every rank
// gives (host code, every build): how many ranks use each device, the multiprocessors each one's
// kernels may take, and what to say about the hardware queues.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusco {

// What a CUDA comm says at init about CUDA_DEVICE_MAX_CONNECTIONS (its text, NULL when unset):
// with fewer hardware queues than fusco's waits need, a call waiting for a late peer holds the
// queue the caller's other streams share (docs/DESIGN.md, "The CUDA rules"); "" when nothing.
std::string connectionsWarning(const char* maxConnections);
// How many ranks hold the device identity ids[rank] (itself included); an empty identity (unknown)
// is counted as not shared.
int ranksSharingDevice(const std::vector<std::string>& ids, int rank);
// The multiprocessors each rank's kernels may take on a device: its count divided by the ranks
// sharing it, at least 1 (sms: the device's count).
int64_t sharedSms(int64_t sms, int ranks);
// The multiprocessors a rank's kernels may take: the share of `sms` for `ranks` ranks on the
// device, capped at `budget` when it is > 0.
int64_t budgetSms(int64_t sms, int ranks, int64_t budget);

}  // namespace fusco
