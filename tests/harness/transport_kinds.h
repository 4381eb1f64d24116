// The transports under test, one small descriptor each: the ops table, the memory type and node
// layout its ranks need, what a rank process does before setup, and why it cannot run here (if
// so). The conformance suite (tests/unit/test_transport_conformance.cc) is instantiated once per
// descriptor the build has; transport_group.h forks ranks for any of them.
#pragma once

#include <string>

#include "fusco.h"
#include "transport/transport.h"

namespace fusco::test::transport {

struct TransportKind {
  const char* name = "";  // test instance name: Shm, Ucx, CudaIpc
  const TransportOps* ops = nullptr;
  fuscoMemType_t memType = fuscoMemHost;
  int ranksPerNode = 0;                   // buildNodeMap's localSize: 0 by host (one node here),
                                          // 1 one virtual node per rank (every pair remote)
  void (*prepareChild)() = nullptr;       // in each rank process, before anything else
  std::string (*skipReason)() = nullptr;  // non-empty: the tests skip with it
  bool needsGpu = false;                  // FUSCO_TEST_REQUIRE_GPU=1 turns a skip into a failure
};

const TransportKind& shmKind();
#ifdef FUSCO_HAVE_UCX
// UCX over TCP on loopback (UCX_TLS=tcp,self, UCX_NET_DEVICES=lo), one rank per virtual node.
const TransportKind& ucxKind();
#endif
#ifdef FUSCO_HAVE_CUDA
// CUDA IPC between rank processes sharing device 0. Skips where no CUDA device is present; the
// question is asked in a forked child, so the test process never initialises CUDA and the ranks
// it forks start clean.
const TransportKind& cudaIpcKind();
#endif

// Empty when kind can run here, else why not (with FUSCO_TEST_REQUIRE_GPU=1 a GPU transport that
// cannot run is a failure: the caller checks requireFailure).
std::string kindSkipReason(const TransportKind& kind, bool* requireFailure);

}  // namespace fusco::test::transport
