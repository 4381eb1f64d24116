// Multi-process test harness: forks N rank processes that share one fuscoUniqueId, runs a body in
// each and reports every rank's gtest failures back in the parent (as "rank r: ...").
//
// Why processes and not threads: fusco ranks are processes in production (one per GPU), the shm
// transport maps memory between processes, and a fault test must be able to SIGKILL one rank.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fusco.h"

namespace fusco::test {

struct RankCtx {
  int rank;
  int nranks;
  fuscoUniqueId id;
};

struct MpOptions {
  // The parent prints every thread's stack of each rank still running after this many seconds
  // (harness/stack_dump.h), kills them and fails. FUSCO_TEST_RANK_TIMEOUT_SEC, when set and
  // smaller, cuts it (gpu-check does, so that a hang's stacks come before its per-test limit).
  int timeoutSec = 60;
  std::vector<std::pair<std::string, std::string>> env;  // set in each child before body
  std::vector<int> mayDie;  // ranks allowed to exit abnormally (fault tests)
};

// Forks n rank processes; each runs body(ctx). Gtest assertion failures inside a rank are sent to
// the parent through a pipe as they happen; the parent re-reports each as
// ADD_FAILURE() << "rank r: " << text. A rank that crashes, exits non-zero or times out is a
// failure naming it (unless in mayDie). Children end with _exit and never return into gtest.
// Afterwards the parent checks that /dev/shm holds no new entry whose name contains "fusco".
//
// Namespaced hosts ([netns] tests, tests/netns/netns.sh): when the environment variable
// FUSCO_TEST_NETNS holds a comma list of network namespace names (e.g.
// "fusco-n0,fusco-n0,fusco-n1,fusco-n1"; a name without '/' means /var/run/netns/<name>), each
// rank process setns()es into its namespace first thing after the fork, so ranks in different
// namespaces are different nodes (the host identity includes the network namespace). Rank r of n
// goes to list[r] when the list has at least n names, else to list[r * L / n] (L names: contiguous
// blocks in list order). Each rank also gets a private mount namespace with /sys remounted (as
// `ip netns exec` does) so /sys/class/net lists its namespace's devices (UCX's tcp transport looks
// there); /dev/shm is shared as before. FUSCO_SOCKET_IFNAME defaults to "fr0" (the
// first rail) in that mode, and the parent makes the unique id while briefly inside rank 0's
// namespace, so the id carries rank 0's rail address (10.77.0.1) and its listening socket lives
// there; the parent itself stays in its own namespace. A name that cannot be opened is a failure.
// FUSCO_LOCAL_SIZE, if also set, must describe the same layout (ranks r, r' share a namespace iff
// r/L == r'/L; checked, a mismatch fails the test): tests whose expected results depend on the
// node layout read it, while in the ranks the library's FUSCO_LOCAL_SIZE parameter is overridden
// to 0 (unless MpOptions.env sets it), so the library's nodes come from the namespaces alone.
void runRanks(int n, const std::function<void(const RankCtx&)>& body, const MpOptions& opt = {});

// Inits a host comm for ctx (fuscoCommInitRankConfig when config is non-NULL). On failure it
// records a fatal failure naming the result and last error and ends the rank's body (like ASSERT_*:
// the harness unwinds the body with an internal exception), so callers may use the result directly.
fuscoComm_t initComm(const RankCtx& ctx, const fuscoConfig_t* config = nullptr);

// Seconds since an arbitrary point (steady clock), for "returns promptly" assertions.
double nowSec();

// True when msg names rank r the way the library's messages do: "rank 3", "peer #3",
// "rank=3", "ranks 1, 3" (case-insensitive; 3 is not matched inside 13 or 30).
bool namesRank(const std::string& msg, int r);

// Names of /dev/shm entries whose name contains "fusco" (sorted).
std::vector<std::string> fuscoShmEntries();

}  // namespace fusco::test

// Check a fusco call and print the result name and the comm's last error on failure.
#define FUSCO_EXPECT_OK(comm, call)                                                               \
  do {                                                                                            \
    fuscoResult_t fusco_t_r_ = (call);                                                            \
    EXPECT_EQ(fusco_t_r_, fuscoSuccess)                                                           \
        << #call << " -> " << fuscoGetErrorString(fusco_t_r_) << ": " << fuscoGetLastError(comm); \
  } while (0)
#define FUSCO_ASSERT_OK(comm, call)                                                               \
  do {                                                                                            \
    fuscoResult_t fusco_t_r_ = (call);                                                            \
    ASSERT_EQ(fusco_t_r_, fuscoSuccess)                                                           \
        << #call << " -> " << fuscoGetErrorString(fusco_t_r_) << ": " << fuscoGetLastError(comm); \
  } while (0)
