// RDMA NIC discovery for the UCX transport's automatic rails (FUSCO_NET_DEVICES empty): which
// verbs devices have an active port (libibverbs), where each sits (PCI bus id and NUMA node, from
// hwloc), and which of them a rank should open. Both libraries are optional at build time
// (FUSCO_HAVE_IBVERBS, FUSCO_HAVE_HWLOC); without libibverbs nothing is found and UCX chooses.
// Nothing here throws or aborts: a failure is logged (kUcx, TRACE) and reads as "not found".
// Host-only and free of UCX headers, so the choice is testable on its own.
#pragma once

#include <string>
#include <vector>

namespace fusco::ucx {

struct NicInfo {
  std::string name;      // UCX device name "<verbs device>:<port>", e.g. "mlx5_0:1"
  std::string pciBusId;  // "0000:17:00.0"; "" when unknown
  int numa = -1;         // OS index of the nearest NUMA node; -1 when unknown
};

// [out] every ACTIVE port of every verbs device, sorted by name, with its locality attached when
// hwloc is available. Empty without libibverbs, without RDMA hardware, or on any error.
std::vector<NicInfo> discoverNics();

// [in,out] nics: pciBusId and numa filled from a topology: topologyXml "" loads this system,
// anything else is an hwloc XML document (tests). NICs the topology does not know keep "" / -1.
// Returns false (nics untouched) without hwloc or when the topology cannot be loaded.
bool attachLocality(std::vector<NicInfo>* nics, const std::string& topologyXml);

// The NUMA node holding every CPU of cpuList (hwloc list syntax, "0-3,8"), in topologyXml ("":
// this system); -1 when they span several nodes, on error, or without hwloc.
int numaNodeOfCpus(const std::string& topologyXml, const std::string& cpuList);

// The NUMA node this process is bound to (hwloc's view of its CPU binding); -1 when unbound
// across nodes, unknown, or without hwloc.
int currentNumaNode();

// The devices rank localRank (of localSize on its node) should open, deterministic in its
// arguments. With n NICs the rank's primary NIC is number localRank * n / localSize of the NICs
// sorted by name (8 ranks on 8 NICs: one each; 8 on 4: two per NIC). When myNuma >= 0 and some
// NIC is on that node, only those NICs are used: the primary stays if it is one of them, else
// the rank takes local NIC localRank % (number of local NICs). railsPerRank > 1 adds the next
// NICs of the same set (wrapping, never the same NIC twice). Empty nics: empty (UCX chooses).
std::vector<std::string> chooseRails(const std::vector<NicInfo>& nics, int localRank, int localSize,
                                     int myNuma, int railsPerRank = 1);

// Whether a UCX_TLS value leaves UCX a verbs transport to run on the chosen devices (null or
// empty: UCX's default, yes; "^..." exclusions: yes; otherwise a listed all/ib/rc/ud/dc*).
bool tlsAllowsRdma(const char* tls);

// The automatic rail choice of one rank: devices to open (empty: one rail of UCX's own choice),
// the NUMA node used (-1: unknown, or not looked up because UCX chooses), and why, for the
// setup's INFO line.
struct AutoRails {
  std::vector<std::string> devices;
  int numa = -1;
  std::string why;
};

// Honours the user's UCX configuration: with UCX_NET_DEVICES set, or a UCX_TLS without verbs
// transports, UCX chooses. Otherwise discoverNics() (once per process) and chooseRails().
AutoRails pickAutoRails(int localRank, int localSize, int railsPerRank = 1);

// "a,b,c"; "auto" for an empty list or an empty name (UCX's own choice).
std::string joinDevices(const std::vector<std::string>& devices);
// Splits a comma list (UCX_NET_DEVICES, FUSCO_NET_DEVICES, UCX_TLS) into trimmed, non-empty
// entries.
std::vector<std::string> parseDevices(const std::string& list);

}  // namespace fusco::ucx
