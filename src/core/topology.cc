#include "core/topology.h"

#include <unistd.h>

#include <climits>
#include <fstream>
#include <map>

namespace fusco {

NodeMap buildNodeMap(const std::vector<std::string>& hostIds, int localSize) {
  NodeMap m;
  m.nranks = static_cast<int>(hostIds.size());
  m.nodeOf.assign(m.nranks, 0);
  m.localRankOf.assign(m.nranks, 0);
  if (localSize > 0) {
    for (int r = 0; r < m.nranks; ++r) m.nodeOf[r] = r / localSize;
  } else {
    std::map<std::string, int> ids;
    for (int r = 0; r < m.nranks; ++r) {
      auto it = ids.find(hostIds[r]);
      if (it == ids.end()) it = ids.emplace(hostIds[r], static_cast<int>(ids.size())).first;
      m.nodeOf[r] = it->second;
    }
  }
  m.numNodes = 0;
  for (int r = 0; r < m.nranks; ++r) m.numNodes = std::max(m.numNodes, m.nodeOf[r] + 1);
  m.ranksOfNode.assign(m.numNodes, {});
  for (int r = 0; r < m.nranks; ++r) {
    m.localRankOf[r] = static_cast<int>(m.ranksOfNode[m.nodeOf[r]].size());
    m.ranksOfNode[m.nodeOf[r]].push_back(r);
  }
  return m;
}

std::string localHostId() {
  char host[HOST_NAME_MAX + 1] = {0};
  gethostname(host, HOST_NAME_MAX);
  std::string id = host;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string bootId;
  if (boot >> bootId) id += "/" + bootId;
  char ns[128] = {0};
  ssize_t n = readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
  if (n > 0) id += "/" + std::string(ns, n);
  return id;
}

}  // namespace fusco
