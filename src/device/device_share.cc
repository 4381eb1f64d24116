// device_share.h: the arithmetic of shared devices and the queue warning.
#include "device/device_share.h"

#include <cstdlib>

namespace fusco {

int ranksSharingDevice(const std::vector<std::string>& ids, int rank) {
  if (rank < 0 || static_cast<size_t>(rank) >= ids.size() || ids[rank].empty()) return 1;
  int n = 0;
  for (const std::string& id : ids) n += id == ids[rank] ? 1 : 0;
  return n;
}

std::string connectionsWarning(const char* maxConnections) {
  if (maxConnections == nullptr || *maxConnections == '\0') return "";
  char* end = nullptr;
  const long n = std::strtol(maxConnections, &end, 10);
  if (end == maxConnections || *end != '\0' || n >= 4) return "";
  return "CUDA_DEVICE_MAX_CONNECTIONS=" + std::string(maxConnections) +
         ": an operation waits for its peers inside its one kernel, but a MoE combine that reads "
         "its peers' buffers runs its reading kernel between two launches of its operation, and "
         "that kernel heads its hardware queue while the first launch waits; with so few queues, "
         "a combine waiting for a late peer also holds back the work the caller puts on its other "
         "streams until the peer comes (within the timeout)";
}

int64_t sharedSms(int64_t sms, int ranks) {
  const int64_t share = ranks > 1 ? sms / ranks : sms;
  return share > 0 ? share : 1;
}

int64_t budgetSms(int64_t sms, int ranks, int64_t budget) {
  const int64_t share = sharedSms(sms, ranks);
  return budget > 0 && budget < share ? budget : share;
}

}  // namespace fusco
