// --mps auto|on|off: a private MPS daemon for the ranks a perf binary forks (-np N) onto one GPU.
//
// Ranks that share a GPU time-slice it unless an MPS daemon serves them; the figures differ a lot
// between the two, so the binary says which one ran (a line on stdout before the ranks start, the
// header, the JSON lines' "mps": "private", "external" or "off").
//   auto: a daemon for this run when the ranks use CUDA memory, are forked by -np, outnumber the
//         visible devices, nvidia-cuda-mps-control is on PATH and no daemon serves this
//         environment yet (then that one is used: "external"); else time-sliced, and the line
//         says why. A daemon serves when one answers on $CUDA_MPS_PIPE_DIRECTORY/control
//         (default /tmp/nvidia-mps): a socket file that refuses connections is a crashed one's.
//   on:   the same without the "outnumber the devices" test, and no daemon is an error (exit 2).
//   off:  never starts one (one already serving is still reported: the ranks are its clients
//         whatever --mps says).
// The private daemon lives in a mkdtemp folder under /tmp (socket paths must stay short) with
// pipe/ and log/; CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY are set in this process's
// environment, so ranks forked afterwards are its clients. The process that started it stops it
// (`quit` to nvidia-cuda-mps-control) and removes the folder.
//
// The device count comes from cuda_mem.h's probe (CUDA stays out of this process). Test hook:
// FUSCO_PERF_FAKE_DEVICES=N makes the decision see N devices and CUDA memory while the ranks keep
// the memory they were given (so a CPU-only machine can drive it with --mem host).
//
// Nothing here calls exit(); errors come back as messages.
#pragma once

#include <sys/types.h>

#include <string>

namespace fusco {
namespace perf {

enum class MpsMode { Auto, On, Off };

// "auto", "on" or "off"; false (and *out untouched) on anything else.
bool parseMpsMode(const char* v, MpsMode* out);

// What a run asks for.
struct MpsRequest {
  MpsMode mode = MpsMode::Auto;
  int np = 0;            // ranks forked by -np (0: started by a launcher, or one rank)
  bool cudaMem = false;  // the ranks use CUDA memory (--mem resolved)
};

// What a run got. Copied into forked ranks with the rest of the process.
struct MpsRun {
  const char* kind = "off";  // "private", "external" or "off"
  std::string line;          // "MPS: ...", for stdout (empty when the ranks are not forked)
  std::string folder;        // private: the mkdtemp folder
  std::string control;       // private: the nvidia-cuda-mps-control that started it
  pid_t owner = 0;           // private: the process that started it (the only one to stop it)
  bool hadPipe = false, hadLog = false;  // the environment's CUDA_MPS_* before the start
  std::string oldPipe, oldLog;
};

// Decides (see above) and starts a private daemon where one is due. False with *err when
// --mps on ends without a daemon.
bool mpsSetUp(const MpsRequest& req, MpsRun* run, std::string* err);

// Stops a private daemon and removes its folder; nothing for "external" / "off" or in a forked
// rank. False with *err when it did not go cleanly (the folder is removed all the same).
bool mpsTearDown(MpsRun* run, std::string* err);

// For main: mpsSetUp, then the line on stdout or `prog: error` on stderr. Returns 0 to run, 2, or
// 128 + a stop signal that came during the start (stop_signals.h; a private daemon is then
// stopped and its folder removed before this returns).
int startMps(const char* prog, const MpsRequest& req, MpsRun* run);
// For main, after launchRanks (status: its result): mpsTearDown, a warning on stderr when it
// failed. While a private daemon runs, SIGINT, SIGTERM, SIGHUP and SIGPIPE do not end this process
// at once (stop_signals.h): it stops the daemon first. Returns the status to exit with: status, or
// 128 + signal.
int stopMps(const char* prog, MpsRun* run, int status);

// For the header (rank 0): the kind and the pipe directory this rank sees, e.g.
// "private (pipe /tmp/fusco-mps.Ab12Cd/pipe)" or "off".
std::string mpsHeaderText(const char* kind);

}  // namespace perf
}  // namespace fusco
