// How a perf binary's rank processes start and agree on one fuscoUniqueId.
//
// Shared by every perf binary (alltoall_perf, moe_perf, ...). Modes, tried in this order:
//   1. `-np N` (LaunchOptions::np > 0): rank 0 is forked first and gets the unique id (so the
//      id's root lives in rank 0, never in this process), hands it back through a pipe, and this
//      process forks ranks 1..N-1 with it and waits; the parent's result is non-zero if any rank
//      failed (a crash, a non-zero exit, or a rank still running long after another failed).
//      While the ranks run this process holds SIGINT, SIGTERM, SIGHUP and SIGPIPE
//      (stop_signals.h): one sent to it alone is passed on to every rank as SIGTERM, and once
//      they are gone the result is 128 + the signal. The ranks take the default actions.
//   2. mpirun (OMPI_COMM_WORLD_RANK/SIZE or PMI_RANK/PMI_SIZE) in a build with MPI: MPI_Init,
//      rank 0 gets the id and MPI_Bcasts it; MPI_Finalize after the body.
//   3. torchrun (RANK/WORLD_SIZE), srun (SLURM_PROCID/SLURM_NTASKS) or mpirun without MPI: rank 0
//      gets the id and serves it over TCP at MASTER_ADDR:FUSCO_ID_PORT (default MASTER_PORT+1,
//      MASTER_PORT default 29500); the others connect with retries until the timeout. MASTER_ADDR
//      (read by ranks > 0) may be left unset only when every rank runs on one host (127.0.0.1).
//   4. none of the above: one rank in this process (same as -np 1 without the fork).
// Nothing here calls exit(); errors come back as a message for main to print. Only the public API
// (fusco.h) is used, so a perf binary links libfusco.so like any application.
#pragma once

#include <functional>
#include <string>

#include "fusco.h"
#include "number_args.h"

namespace fusco {
namespace perf {

struct LaunchOptions {
  int np = 0;               // > 0: fork this many local ranks (mode 1)
  int timeoutMs = 0;        // TCP id exchange; 0: FUSCO_TIMEOUT_MS or 300000
  int failGraceMs = 30000;  // after one forked rank fails, how long the others may still run
};

struct Launch {
  int rank = 0;
  int nranks = 1;
  fuscoUniqueId id{};
  bool forked = false;   // this rank was forked by the launcher (-np)
  bool mpi = false;      // MPI_Init was called (MPI_COMM_WORLD usable by the body)
  std::string mode;      // "fork", "mpi", "tcp" or "single"
  std::string launcher;  // what started us: "-np", "mpirun", "srun", "torchrun", "none"
};

// The body a rank runs; its return value is the rank's exit status (0: success).
using RankBody = std::function<int(const Launch&)>;

// Starts the ranks (see the modes above) and runs body in each one.
// Returns the status this process should exit with: the body's in a rank, the combined one in the
// parent of forked ranks. A launch error (bad environment, id exchange failed) is printed to
// stderr with the rank and returns 2.
int launchRanks(const LaunchOptions& opts, const RankBody& body);

// The launcher found in the environment ("mpirun", "srun", "torchrun"), or nullptr when none is
// (mode 1 or 4 would run). Used by binaries that re-launch themselves under mpirun.
const char* launcherInEnvironment();

}  // namespace perf
}  // namespace fusco
