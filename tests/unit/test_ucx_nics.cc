// Automatic UCX rails: the pure choice of NICs per rank (synthetic NIC lists), the NIC locality
// lookup on a synthetic hwloc topology (XML, two packages with one NUMA node and one NIC each),
// and discovery on this host, which has no RDMA hardware in CI. Built only with UCX.
#ifdef FUSCO_HAVE_UCX
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "core/topology.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_comm.h"
#include "transport/ucx/ucx_nics.h"

namespace fusco {
extern const TransportOps kUcxTransport;
}

namespace {

using fusco::ucx::chooseRails;
using fusco::ucx::NicInfo;

// n NICs mlx5_0:1 .. mlx5_<n-1>:1; the first half on NUMA 0, the rest on NUMA 1 when split.
std::vector<NicInfo> nics(int n, bool split = false) {
  std::vector<NicInfo> v;
  for (int i = 0; i < n; ++i) {
    NicInfo x;
    x.name = "mlx5_" + std::to_string(i) + ":1";
    x.numa = split ? (i < n / 2 ? 0 : 1) : -1;
    v.push_back(x);
  }
  return v;
}

using Rails = std::vector<std::string>;

bool hostHasRdmaDevices() {
  struct stat st;
  return stat("/sys/class/infiniband", &st) == 0;
}

// Sets (value != nullptr) or unsets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

TEST(UcxNics, EightRanksOnEightNicsGetOneNicEach) {
  for (int r = 0; r < 8; ++r)
    EXPECT_EQ(chooseRails(nics(8), r, 8, -1), Rails{"mlx5_" + std::to_string(r) + ":1"});
}

TEST(UcxNics, EightRanksOnFourNicsShareEachNicByTwo) {
  for (int r = 0; r < 8; ++r)
    EXPECT_EQ(chooseRails(nics(4), r, 8, -1), Rails{"mlx5_" + std::to_string(r / 2) + ":1"});
}

TEST(UcxNics, TwoRanksOnEightNicsAreSpreadApart) {
  EXPECT_EQ(chooseRails(nics(8), 0, 2, -1), Rails{"mlx5_0:1"});
  EXPECT_EQ(chooseRails(nics(8), 1, 2, -1), Rails{"mlx5_4:1"});
}

TEST(UcxNics, SingleRankNodeTakesTheFirstNic) {
  EXPECT_EQ(chooseRails(nics(4), 0, 1, -1), Rails{"mlx5_0:1"});
}

TEST(UcxNics, RankKeepsItsNicWhenItIsOnItsNumaNode) {
  // Ranks 0-3 on NUMA 0, 4-7 on NUMA 1, like the NICs: the blocked choice is already local.
  for (int r = 0; r < 8; ++r)
    EXPECT_EQ(chooseRails(nics(8, true), r, 8, r < 4 ? 0 : 1),
              Rails{"mlx5_" + std::to_string(r) + ":1"});
}

TEST(UcxNics, RankPrefersNicsOnItsNumaNode) {
  // Rank 1 runs on NUMA 1: its blocked choice (mlx5_1, NUMA 0) is remote, so it takes a NIC of
  // NUMA 1 (mlx5_4..7), round-robin by local rank.
  EXPECT_EQ(chooseRails(nics(8, true), 1, 8, 1), Rails{"mlx5_5:1"});
  EXPECT_EQ(chooseRails(nics(8, true), 6, 8, 0), Rails{"mlx5_2:1"});
  // Two NICs, one per node, four ranks per node: every rank stays on its node's NIC.
  for (int r = 0; r < 8; ++r)
    EXPECT_EQ(chooseRails(nics(2, true), r, 8, r % 2),
              Rails{"mlx5_" + std::to_string(r % 2) + ":1"});
}

TEST(UcxNics, NumaNodeWithoutNicsFallsBackToEveryNic) {
  EXPECT_EQ(chooseRails(nics(4, true), 3, 4, 5), Rails{"mlx5_3:1"});
  EXPECT_EQ(chooseRails(nics(4, false), 2, 4, 0), Rails{"mlx5_2:1"});  // NIC NUMA unknown
}

TEST(UcxNics, TwoRailsPerRankAreTwoDistinctNeighbouringNics) {
  EXPECT_EQ(chooseRails(nics(8), 0, 8, -1, 2), (Rails{"mlx5_0:1", "mlx5_1:1"}));
  EXPECT_EQ(chooseRails(nics(8), 7, 8, -1, 2), (Rails{"mlx5_7:1", "mlx5_0:1"}));
  // Within the NUMA-local set: rank 3 (NUMA 0) wraps to the first NIC of NUMA 0.
  EXPECT_EQ(chooseRails(nics(8, true), 3, 8, 0, 2), (Rails{"mlx5_3:1", "mlx5_0:1"}));
}

TEST(UcxNics, MoreRailsThanNicsUsesEachNicOnce) {
  Rails r = chooseRails(nics(3), 1, 2, -1, 8);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(std::set<std::string>(r.begin(), r.end()).size(), 3u);
}

TEST(UcxNics, EmptyNicListGivesNoRailsSoUcxChooses) {
  EXPECT_TRUE(chooseRails({}, 0, 8, -1).empty());
  EXPECT_TRUE(chooseRails({}, 3, 8, 1, 2).empty());
}

TEST(UcxNics, ChoiceIsDeterministicAndIgnoresInputOrder) {
  std::vector<NicInfo> shuffled = nics(8, true);
  std::reverse(shuffled.begin(), shuffled.end());
  std::swap(shuffled[1], shuffled[5]);
  for (int r = 0; r < 8; ++r)
    for (int numa : {-1, 0, 1}) {
      Rails a = chooseRails(nics(8, true), r, 8, numa, 2);
      EXPECT_EQ(a, chooseRails(nics(8, true), r, 8, numa, 2));
      EXPECT_EQ(a, chooseRails(shuffled, r, 8, numa, 2));
    }
}

TEST(UcxNics, OutOfRangeArgumentsAreClamped) {
  EXPECT_EQ(chooseRails(nics(4), 9, 8, -1), Rails{"mlx5_3:1"});
  EXPECT_EQ(chooseRails(nics(4), -1, 8, -1), Rails{"mlx5_0:1"});
  EXPECT_EQ(chooseRails(nics(4), 0, 0, -1, 0), Rails{"mlx5_0:1"});
}

TEST(UcxNics, TlsWithoutVerbsTransportLeavesChoiceToUcx) {
  EXPECT_TRUE(fusco::ucx::tlsAllowsRdma(nullptr));
  EXPECT_TRUE(fusco::ucx::tlsAllowsRdma(""));
  EXPECT_TRUE(fusco::ucx::tlsAllowsRdma("rc,sm,self"));
  EXPECT_TRUE(fusco::ucx::tlsAllowsRdma("dc_x,self"));
  EXPECT_TRUE(fusco::ucx::tlsAllowsRdma("all"));
  EXPECT_TRUE(fusco::ucx::tlsAllowsRdma("^tcp"));
  EXPECT_FALSE(fusco::ucx::tlsAllowsRdma("tcp,self"));
  EXPECT_FALSE(fusco::ucx::tlsAllowsRdma("sm,self"));
}

TEST(UcxNics, DiscoverReturnsEmptyListOnHostWithoutRdmaHardware) {
  std::vector<NicInfo> found = fusco::ucx::discoverNics();
  if (hostHasRdmaDevices()) {
    for (const NicInfo& n : found) EXPECT_NE(n.name.find(':'), std::string::npos) << n.name;
    GTEST_SKIP() << "this host has RDMA devices: " << found.size() << " active port(s)";
  }
  EXPECT_TRUE(found.empty());
}

TEST(UcxNics, AutoRailsOnHostWithoutRdmaHardwareLeaveChoiceToUcx) {
  ScopedEnv dev("UCX_NET_DEVICES", nullptr), tls("UCX_TLS", nullptr);
  fusco::ucx::AutoRails a = fusco::ucx::pickAutoRails(0, 1);
  if (hostHasRdmaDevices()) GTEST_SKIP() << "this host has RDMA devices";
  EXPECT_TRUE(a.devices.empty());
  EXPECT_NE(a.why.find("no RDMA NIC found"), std::string::npos) << a.why;
}

TEST(UcxNics, UserUcxNetDevicesIsHonouredWithoutDiscovery) {
  ScopedEnv dev("UCX_NET_DEVICES", "lo");
  fusco::ucx::AutoRails a = fusco::ucx::pickAutoRails(3, 8);
  EXPECT_TRUE(a.devices.empty());
  EXPECT_NE(a.why.find("UCX_NET_DEVICES=lo"), std::string::npos) << a.why;
  ScopedEnv unset("UCX_NET_DEVICES", nullptr), tls("UCX_TLS", "tcp,self");
  a = fusco::ucx::pickAutoRails(3, 8);
  EXPECT_TRUE(a.devices.empty());
  EXPECT_NE(a.why.find("UCX_TLS=tcp,self"), std::string::npos) << a.why;
}

TEST(UcxNics, JoinDevicesNamesUcxOwnChoiceAuto) {
  EXPECT_EQ(fusco::ucx::joinDevices({}), "auto");
  EXPECT_EQ(fusco::ucx::joinDevices({""}), "auto");
  EXPECT_EQ(fusco::ucx::joinDevices({"mlx5_0:1", "mlx5_1:1"}), "mlx5_0:1,mlx5_1:1");
}

// Setup alone (no peer connects): with no devices given and no RDMA NIC, one rail of UCX's own
// choice, as before automatic rails. The rank's INFO line says why.
TEST(UcxNics, SetupWithoutDevicesOnHostWithoutRdmaOpensOneUcxChosenRail) {
  if (hostHasRdmaDevices()) GTEST_SKIP() << "this host has RDMA devices";
  ScopedEnv dev("UCX_NET_DEVICES", nullptr), tls("UCX_TLS", nullptr);
  std::vector<fusco::PeerInfo> infos(2);
  infos[0].hostId = "a";
  infos[1].hostId = "b";
  fusco::NodeMap nodes = fusco::buildNodeMap({"a", "b"}, 0);
  fusco::TransportContext ctx;
  ctx.rank = 0;
  ctx.nranks = 2;
  ctx.nodes = &nodes;
  ctx.peers = &infos;
  ctx.commTag = 42;
  ctx.timeoutMs = 2000;
  fusco::TransportComm* tc = nullptr;
  std::string blob;
  ASSERT_EQ(fusco::kUcxTransport.setup(ctx, {1}, &tc, &blob), fuscoSuccess);
  const fusco::ucx::UcxComm* c = fusco::ucx::asUcx(tc);
  ASSERT_EQ(c->rails.size(), 1u);
  EXPECT_EQ(c->rails[0].device, "");
  EXPECT_FALSE(blob.empty());
  fusco::kUcxTransport.close(tc);
}

#ifdef FUSCO_HAVE_HWLOC
// Two packages, each with one NUMA node, two PUs and one Mellanox NIC behind a host bridge.
std::string packageXml(int i) {
  std::string cpus = i == 0 ? "0x00000003" : "0x0000000c";
  std::string node = i == 0 ? "0x00000001" : "0x00000002";
  std::string bus = i == 0 ? "17" : "b3";
  std::string s = std::to_string(i);
  std::string pu0 = std::to_string(2 * i), pu1 = std::to_string(2 * i + 1);
  std::string pu0set = i == 0 ? "0x00000001" : "0x00000004";
  std::string pu1set = i == 0 ? "0x00000002" : "0x00000008";
  auto sets = [&](const std::string& c) {
    return " cpuset=\"" + c + "\" complete_cpuset=\"" + c + "\" nodeset=\"" + node +
           "\" complete_nodeset=\"" + node + "\"";
  };
  return "<object type=\"Package\" os_index=\"" + s + "\"" + sets(cpus) + " gp_index=\"" +
         std::to_string(10 + 10 * i) + "\">\n" + "<object type=\"NUMANode\" os_index=\"" + s +
         "\"" + sets(cpus) + " gp_index=\"" + std::to_string(11 + 10 * i) +
         "\" local_memory=\"1073741824\"/>\n" + "<object type=\"PU\" os_index=\"" + pu0 + "\"" +
         sets(pu0set) + " gp_index=\"" + std::to_string(12 + 10 * i) + "\"/>\n" +
         "<object type=\"PU\" os_index=\"" + pu1 + "\"" + sets(pu1set) + " gp_index=\"" +
         std::to_string(13 + 10 * i) + "\"/>\n" + "<object type=\"Bridge\" gp_index=\"" +
         std::to_string(14 + 10 * i) + "\" bridge_type=\"0-1\" depth=\"0\" bridge_pci=\"0000:[" +
         bus + "-" + bus + "]\">\n" + "<object type=\"PCIDev\" gp_index=\"" +
         std::to_string(15 + 10 * i) + "\" pci_busid=\"0000:" + bus +
         ":00.0\" pci_type=\"0207 [15b3:1017] [15b3:0007] 00\"" +
         " pci_link_speed=\"0.000000\">\n" + "<object type=\"OSDev\" gp_index=\"" +
         std::to_string(16 + 10 * i) + "\" name=\"mlx5_" + s + "\"" +
         " osdev_type=\"3\"/>\n</object>\n</object>\n</object>\n";
}

std::string topologyXml() {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
         "<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
         "<topology version=\"2.0\">\n"
         "<object type=\"Machine\" os_index=\"0\" cpuset=\"0x0000000f\" "
         "complete_cpuset=\"0x0000000f\""
         " allowed_cpuset=\"0x0000000f\" nodeset=\"0x00000003\" complete_nodeset=\"0x00000003\""
         " allowed_nodeset=\"0x00000003\" gp_index=\"1\">\n" +
         packageXml(0) + packageXml(1) + "</object>\n</topology>\n";
}

TEST(UcxNics, TopologyGivesEachNicItsPciBusIdAndNumaNode) {
  std::vector<NicInfo> v(3);
  v[0].name = "mlx5_1:1";
  v[1].name = "mlx5_0:2";
  v[2].name = "mlx5_9:1";  // not in the topology
  ASSERT_TRUE(fusco::ucx::attachLocality(&v, topologyXml()));
  EXPECT_EQ(v[0].pciBusId, "0000:b3:00.0");
  EXPECT_EQ(v[0].numa, 1);
  EXPECT_EQ(v[1].pciBusId, "0000:17:00.0");
  EXPECT_EQ(v[1].numa, 0);
  EXPECT_EQ(v[2].pciBusId, "");
  EXPECT_EQ(v[2].numa, -1);
}

TEST(UcxNics, CpusOfOneNumaNodeNameItAndCpusAcrossNodesDoNot) {
  EXPECT_EQ(fusco::ucx::numaNodeOfCpus(topologyXml(), "0-1"), 0);
  EXPECT_EQ(fusco::ucx::numaNodeOfCpus(topologyXml(), "3"), 1);
  EXPECT_EQ(fusco::ucx::numaNodeOfCpus(topologyXml(), "1-2"), -1);
  EXPECT_EQ(fusco::ucx::numaNodeOfCpus(topologyXml(), ""), -1);
}

TEST(UcxNics, UnreadableTopologyLeavesNicsUntouched) {
  std::vector<NicInfo> v(1);
  v[0].name = "mlx5_0:1";
  EXPECT_FALSE(fusco::ucx::attachLocality(&v, "<not a topology"));
  EXPECT_EQ(v[0].numa, -1);
  EXPECT_EQ(fusco::ucx::numaNodeOfCpus("<not a topology", "0"), -1);
}
#endif  // FUSCO_HAVE_HWLOC

}  // namespace
#endif  // FUSCO_HAVE_UCX
