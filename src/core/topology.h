// Groups ranks into nodes: by host identity, or by a fixed local size (virtual nodes).
#pragma once

#include <string>
#include <vector>

namespace fusco {

struct NodeMap {
  int nranks = 0;
  int numNodes = 0;
  std::vector<int> nodeOf;                    // [nranks]
  std::vector<int> localRankOf;               // [nranks]
  std::vector<std::vector<int>> ranksOfNode;  // [numNodes], ascending ranks

  bool sameNode(int a, int b) const { return nodeOf[a] == nodeOf[b]; }
  int localSize(int node) const { return static_cast<int>(ranksOfNode[node].size()); }
};

// localSize > 0: node = rank / localSize. Otherwise ranks with equal hostIds share a node; nodes
// are numbered in order of their lowest rank.
NodeMap buildNodeMap(const std::vector<std::string>& hostIds, int localSize);

// This process's host identity: hostname, boot id and network namespace, so that ranks in
// different network namespaces (test hosts) are different nodes.
std::string localHostId();

}  // namespace fusco
