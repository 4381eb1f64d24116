// RDMA NIC discovery (libibverbs) and locality (hwloc) for the UCX transport's automatic rails,
// and the pure choice of which NICs a rank opens. See ucx_nics.h.
#include "transport/ucx/ucx_nics.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "core/log.h"

#ifdef FUSCO_HAVE_IBVERBS
#include <infiniband/verbs.h>
#endif
#ifdef FUSCO_HAVE_HWLOC
#include <hwloc.h>
// The OS-device type attribute used below is the hwloc 2.x one; other series: no locality.
#if HWLOC_API_VERSION >= 0x00020000 && HWLOC_API_VERSION < 0x00030000
#define FUSCO_NICS_HWLOC 1
#endif
#endif

namespace fusco::ucx {

namespace {

#ifdef FUSCO_HAVE_IBVERBS
// Appends "<dev>:<port>" for every ACTIVE port of one device.
void activePorts(ibv_device* dev, std::vector<NicInfo>* out) {
  const char* name = ibv_get_device_name(dev);
  if (name == nullptr) return;
  // Closed on every way out, a std::bad_alloc from the strings below included.
  std::unique_ptr<ibv_context, int (*)(ibv_context*)> guard(ibv_open_device(dev), ibv_close_device);
  ibv_context* ctx = guard.get();
  if (ctx == nullptr) {
    FUSCO_TRACE(kUcx, "ucx nics: cannot open %s: %s", name, strerror(errno));
    return;
  }
  ibv_device_attr attr{};
  if (ibv_query_device(ctx, &attr) != 0) {
    FUSCO_TRACE(kUcx, "ucx nics: cannot query %s", name);
    return;
  }
  for (int port = 1; port <= attr.phys_port_cnt; ++port) {
    ibv_port_attr pa{};
    if (ibv_query_port(ctx, static_cast<uint8_t>(port), &pa) != 0) continue;
    FUSCO_TRACE(kUcx, "ucx nics: %s:%d state %s", name, port, ibv_port_state_str(pa.state));
    if (pa.state != IBV_PORT_ACTIVE) continue;
    NicInfo n;
    n.name = std::string(name) + ":" + std::to_string(port);
    out->push_back(n);
  }
}

std::vector<NicInfo> verbsPorts() {
  std::vector<NicInfo> out;
  int num = 0;
  std::unique_ptr<ibv_device*, void (*)(ibv_device**)> list(ibv_get_device_list(&num),
                                                            ibv_free_device_list);
  if (list == nullptr) {
    FUSCO_TRACE(kUcx, "ucx nics: no verbs device list: %s", strerror(errno));
    return out;
  }
  for (int i = 0; i < num; ++i) activePorts(list.get()[i], &out);
  return out;
}
#endif

#ifdef FUSCO_NICS_HWLOC
// An hwloc topology that frees itself; I/O objects kept when io is set.
struct Topology {
  hwloc_topology_t t = nullptr;
  bool loaded = false;

  Topology(const std::string& xml, bool io) {
    if (hwloc_topology_init(&t) != 0) {
      t = nullptr;
      return;
    }
    if (io) hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (!xml.empty() &&
        hwloc_topology_set_xmlbuffer(t, xml.c_str(), static_cast<int>(xml.size()) + 1) != 0)
      return;
    loaded = hwloc_topology_load(t) == 0;
  }
  ~Topology() {
    if (t != nullptr) hwloc_topology_destroy(t);
  }
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;
};

// The OS index of the single NUMA node in nodeset; -1 for none or several.
int singleNode(hwloc_const_nodeset_t nodeset) {
  if (nodeset == nullptr || hwloc_bitmap_weight(nodeset) != 1) return -1;
  return hwloc_bitmap_first(nodeset);
}

// The NUMA node nearest to an I/O object: that of its first non-I/O ancestor (a package, group
// or the machine; the machine spans every node, so -1 on multi-node hosts with no finer info).
int ioNuma(hwloc_topology_t t, hwloc_obj_t obj) {
  hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(t, obj);
  return a != nullptr ? singleNode(a->nodeset) : -1;
}

std::string pciBusId(hwloc_obj_t obj) {
  for (hwloc_obj_t p = obj; p != nullptr; p = p->parent) {
    if (p->type != HWLOC_OBJ_PCI_DEVICE) continue;
    char b[32];
    snprintf(b, sizeof(b), "%04x:%02x:%02x.%01x", p->attr->pcidev.domain, p->attr->pcidev.bus,
             p->attr->pcidev.dev, p->attr->pcidev.func);
    return b;
  }
  return "";
}

// OPENFABRICS OS device named dev ("mlx5_0"), or nullptr.
hwloc_obj_t openFabricsDevice(hwloc_topology_t t, const std::string& dev) {
  for (hwloc_obj_t o = hwloc_get_next_osdev(t, nullptr); o != nullptr;
       o = hwloc_get_next_osdev(t, o))
    if (o->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS && o->name != nullptr && dev == o->name)
      return o;
  return nullptr;
}
#endif

}  // namespace

bool attachLocality(std::vector<NicInfo>* nics, const std::string& topologyXml) {
#ifdef FUSCO_NICS_HWLOC
  Topology topo(topologyXml, true);
  if (!topo.loaded) {
    FUSCO_TRACE(kUcx, "ucx nics: hwloc cannot load the %s topology",
                topologyXml.empty() ? "system" : "given");
    return false;
  }
  for (NicInfo& n : *nics) {
    hwloc_obj_t o = openFabricsDevice(topo.t, n.name.substr(0, n.name.rfind(':')));
    if (o == nullptr) continue;
    n.pciBusId = pciBusId(o);
    n.numa = ioNuma(topo.t, o);
  }
  return true;
#else
  (void)nics;
  (void)topologyXml;
  return false;
#endif
}

int numaNodeOfCpus(const std::string& topologyXml, const std::string& cpuList) {
#ifdef FUSCO_NICS_HWLOC
  Topology topo(topologyXml, false);
  hwloc_bitmap_t cpus = hwloc_bitmap_alloc();
  hwloc_bitmap_t nodes = hwloc_bitmap_alloc();
  int numa = -1;
  if (topo.loaded && cpus != nullptr && nodes != nullptr &&
      hwloc_bitmap_list_sscanf(cpus, cpuList.c_str()) == 0 && !hwloc_bitmap_iszero(cpus)) {
    hwloc_cpuset_to_nodeset(topo.t, cpus, nodes);
    numa = singleNode(nodes);
  }
  hwloc_bitmap_free(cpus);
  hwloc_bitmap_free(nodes);
  return numa;
#else
  (void)topologyXml;
  (void)cpuList;
  return -1;
#endif
}

int currentNumaNode() {
#ifdef FUSCO_NICS_HWLOC
  Topology topo("", false);
  if (!topo.loaded) return -1;
  hwloc_bitmap_t cpus = hwloc_bitmap_alloc();
  int numa = -1;
  hwloc_bitmap_t nodes = hwloc_bitmap_alloc();
  // An unbound process has every CPU, so -1 on multi-node hosts.
  if (cpus != nullptr && nodes != nullptr && hwloc_get_cpubind(topo.t, cpus, 0) == 0) {
    hwloc_cpuset_to_nodeset(topo.t, cpus, nodes);
    numa = singleNode(nodes);
  }
  hwloc_bitmap_free(nodes);
  hwloc_bitmap_free(cpus);
  return numa;
#else
  return -1;
#endif
}

std::vector<NicInfo> discoverNics() {
  std::vector<NicInfo> nics;
#ifdef FUSCO_HAVE_IBVERBS
  try {
    nics = verbsPorts();
    std::sort(nics.begin(), nics.end(),
              [](const NicInfo& a, const NicInfo& b) { return a.name < b.name; });
    if (!nics.empty()) attachLocality(&nics, "");
    for (const NicInfo& n : nics)
      FUSCO_TRACE(kUcx, "ucx nics: %s pci %s NUMA %d", n.name.c_str(),
                  n.pciBusId.empty() ? "?" : n.pciBusId.c_str(), n.numa);
  } catch (const std::exception& e) {
    FUSCO_INFO(kUcx, "ucx nics: discovery failed (%s); UCX chooses", e.what());
    nics.clear();
  } catch (...) {
    FUSCO_INFO(kUcx, "ucx nics: discovery failed; UCX chooses");
    nics.clear();
  }
#else
  FUSCO_TRACE(kUcx, "ucx nics: built without libibverbs, no discovery");
#endif
  return nics;
}

std::vector<std::string> chooseRails(const std::vector<NicInfo>& nics, int localRank, int localSize,
                                     int myNuma, int railsPerRank) {
  std::vector<std::string> out;
  if (nics.empty()) return out;
  if (localSize < 1) localSize = 1;
  localRank = std::min(std::max(localRank, 0), localSize - 1);
  std::vector<NicInfo> all(nics);
  std::sort(all.begin(), all.end(),
            [](const NicInfo& a, const NicInfo& b) { return a.name < b.name; });
  all.erase(std::unique(all.begin(), all.end(),
                        [](const NicInfo& a, const NicInfo& b) { return a.name == b.name; }),
            all.end());
  size_t n = all.size();
  size_t primary = static_cast<size_t>(localRank) * n / static_cast<size_t>(localSize);
  std::vector<size_t> set;  // indices into `all` this rank may use
  if (myNuma >= 0)
    for (size_t i = 0; i < n; ++i)
      if (all[i].numa == myNuma) set.push_back(i);
  size_t start = 0;
  if (set.empty()) {
    for (size_t i = 0; i < n; ++i) set.push_back(i);
    start = primary;
  } else {
    auto it = std::find(set.begin(), set.end(), primary);
    start = it != set.end() ? static_cast<size_t>(it - set.begin())
                            : static_cast<size_t>(localRank) % set.size();
  }
  size_t k = std::min(set.size(), static_cast<size_t>(std::max(railsPerRank, 1)));
  for (size_t i = 0; i < k; ++i) out.push_back(all[set[(start + i) % set.size()]].name);
  return out;
}

bool tlsAllowsRdma(const char* tls) {
  if (tls == nullptr || tls[0] == '\0' || tls[0] == '^') return true;
  for (const std::string& t : parseDevices(tls))  // the same comma list as UCX_NET_DEVICES
    if (t == "all" || t == "ib" || t.rfind("rc", 0) == 0 || t.rfind("ud", 0) == 0 ||
        t.rfind("dc", 0) == 0)
      return true;
  return false;
}

AutoRails pickAutoRails(int localRank, int localSize, int railsPerRank) {
  AutoRails a;
  try {
    const char* dev = getenv("UCX_NET_DEVICES");
    const char* tls = getenv("UCX_TLS");
    if (dev != nullptr && dev[0] != '\0') {
      a.why = std::string("UCX_NET_DEVICES=") + dev + " is set; UCX chooses";
      return a;
    }
    if (!tlsAllowsRdma(tls)) {
      a.why = std::string("UCX_TLS=") + tls + " has no verbs transport; UCX chooses";
      return a;
    }
    // The NICs of a host do not change while a process runs: look once.
    static const std::vector<NicInfo> nics = discoverNics();
    a.numa = currentNumaNode();
    a.devices = chooseRails(nics, localRank, localSize, a.numa, railsPerRank);
    a.why = nics.empty() ? "no RDMA NIC found; UCX chooses"
                         : "auto: " + std::to_string(nics.size()) + " RDMA NIC port(s) found";
  } catch (...) {  // e.g. out of memory: fall back to UCX's choice
    a = AutoRails{};
    a.why = "NIC discovery failed; UCX chooses";
  }
  return a;
}

std::string joinDevices(const std::vector<std::string>& devices) {
  if (devices.empty()) return "auto";
  std::string s;
  for (const std::string& d : devices) s += (s.empty() ? "" : ",") + (d.empty() ? "auto" : d);
  return s;
}

std::vector<std::string> parseDevices(const std::string& list) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string d = list.substr(pos, end - pos);
    size_t b = d.find_first_not_of(" \t"), e = d.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(d.substr(b, e - b + 1));
    pos = end + 1;
  }
  return out;
}

}  // namespace fusco::ucx
