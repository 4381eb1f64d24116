// [netns] sanity: under FUSCO_TEST_NETNS (ranks in network namespaces made by
// tests/netns/netns.sh) ranks in different namespaces really are different nodes, peers on the
// same node use shm, peers on the other node use ucx, and each rank's inter-node data leaves on
// its own rail (fr<localRank % rails>). Skipped where FUSCO_TEST_NETNS is not set.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "api/api_internal.h"
#include "engine/communicator.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::initComm;
using fusco::test::MpOptions;
using fusco::test::RankCtx;
using fusco::test::runRanks;

std::vector<std::string> splitList(const char* s) {
  std::vector<std::string> out;
  std::stringstream ss(s != nullptr ? s : "");
  std::string tok;
  while (std::getline(ss, tok, ','))
    if (!tok.empty()) out.push_back(tok);
  return out;
}

// Transmitted bytes of device dev in this process's network namespace (/proc/net is per netns).
uint64_t txBytes(const std::string& dev) {
  std::ifstream f("/proc/net/dev");
  std::string line;
  while (std::getline(f, line)) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != dev) continue;
    std::istringstream is(line.substr(colon + 1));
    uint64_t v[9] = {0};
    for (uint64_t& x : v) is >> x;  // rx: bytes packets errs drop fifo frame compressed mcast; tx
    return v[8];
  }
  return 0;
}

TEST(Netns, RanksAreNodesAndCrossNodePeersUseUcx) {
  const char* spec = getenv("FUSCO_TEST_NETNS");
  if (spec == nullptr || *spec == '\0')
    GTEST_SKIP()
        << "FUSCO_TEST_NETNS is not set (run through ctest -L netns / tests/netns/netns.sh)";
  const std::vector<std::string> list = splitList(spec);
  const std::vector<std::string> rails = splitList(getenv("FUSCO_NET_DEVICES"));
  const int n = std::min(4, static_cast<int>(list.size()));  // 2 nodes x 2 ranks in [netns]
  ASSERT_GE(n, 2);
  // Expected node of each rank: namespaces numbered in order of first appearance.
  std::map<std::string, int> nodeOfNs;
  std::vector<int> node(n), localRank(n), localSize(n);
  std::map<int, int> count;
  for (int r = 0; r < n; ++r) {
    auto it = nodeOfNs.emplace(list[r], static_cast<int>(nodeOfNs.size())).first;
    node[r] = it->second;
    localRank[r] = count[node[r]]++;
  }
  for (int r = 0; r < n; ++r) localSize[r] = count[node[r]];
  const int numNodes = static_cast<int>(nodeOfNs.size());
  ASSERT_GE(numNodes, 2) << "FUSCO_TEST_NETNS=" << spec << " names one namespace";
  struct stat parentNs {};
  ASSERT_EQ(stat("/proc/self/ns/net", &parentNs), 0);

  MpOptions opt;
  opt.timeoutSec = 120;
  runRanks(
      n,
      [&](const RankCtx& ctx) {
        const int r = ctx.rank;
        // The process really runs in its namespace (not the test binary's).
        struct stat mine {
        }, want{};
        ASSERT_EQ(stat("/proc/self/ns/net", &mine), 0);
        ASSERT_EQ(stat(("/var/run/netns/" + list[r]).c_str(), &want), 0);
        EXPECT_EQ(mine.st_ino, want.st_ino) << "rank " << r << " is not in namespace " << list[r];
        EXPECT_NE(mine.st_ino, parentNs.st_ino);

        fuscoComm_t comm = initComm(ctx);
        int nd = -1, nn = -1, lr = -1, ls = -1;
        FUSCO_ASSERT_OK(comm, fuscoCommNodeInfo(comm, &nd, &nn, &lr, &ls));
        EXPECT_EQ(nn, numNodes);
        EXPECT_EQ(nd, node[r]);
        EXPECT_EQ(lr, localRank[r]);
        EXPECT_EQ(ls, localSize[r]);

        // Transport of each peer: shm on the node, ucx across nodes.
        const fusco::Communicator& impl = fusco::implOf(comm);
        for (int p = 0; p < n; ++p) {
          if (p == r) continue;
          const fusco::PeerConn& c = impl.conn(p);
          ASSERT_NE(c.ops, nullptr) << "rank " << r << " has no transport to " << p;
          EXPECT_STREQ(c.ops->name, node[p] == node[r] ? "shm" : "ucx")
              << "rank " << r << " -> rank " << p << " (nodes " << node[r] << ", " << node[p]
              << ")";
        }

        // Data crosses: an alltoall, bit-exact, and this rank's inter-node bytes leave on its rail.
        const size_t per = 1 << 20;  // bytes per peer
        std::vector<uint8_t> send(per * n), recv(per * n, 0xEE);
        for (int p = 0; p < n; ++p)
          for (size_t i = 0; i < per; ++i)
            send[p * per + i] = static_cast<uint8_t>(r * 31 + p * 7 + i);
        const std::string dev =
            rails.empty() ? "fr0" : rails[static_cast<size_t>(localRank[r]) % rails.size()];
        const uint64_t tx0 = txBytes(dev);
        FUSCO_ASSERT_OK(comm,
                        fuscoAllToAll(send.data(), recv.data(), per, fuscoUint8, comm, nullptr));
        // A second (tiny) alltoall as a barrier: once it completes every peer has received all
        // of this rank's first one, so those bytes have left the device.
        std::vector<uint8_t> s1(n, 1), r1(n, 0);
        FUSCO_ASSERT_OK(comm, fuscoAllToAll(s1.data(), r1.data(), 1, fuscoUint8, comm, nullptr));
        const uint64_t tx1 = txBytes(dev);
        for (int p = 0; p < n; ++p) {
          size_t bad = 0;
          for (size_t i = 0; i < per; ++i)
            if (recv[p * per + i] != static_cast<uint8_t>(p * 31 + r * 7 + i)) ++bad;
          EXPECT_EQ(bad, 0u) << "rank " << r << ": block from rank " << p;
        }
        int remote = 0;
        for (int p = 0; p < n; ++p) remote += node[p] != node[r];
        EXPECT_GE(tx1 - tx0, static_cast<uint64_t>(remote) * per)
            << "rank " << r << " (local rank " << localRank[r] << ") sent less than its " << remote
            << " x " << per << " inter-node bytes on " << dev;
        FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
      },
      opt);
}

}  // namespace
