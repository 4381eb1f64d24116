// compute-sanitizer over a small 2-rank MoE dispatch + combine on a CUDA comm
// (fusco_gpu_sanitizer_moe, sanitizer_moe_main.cc): memcheck (out-of-bounds and misaligned device
// accesses, CUDA API errors) and racecheck (shared-memory hazards in the library's kernels) must
// report nothing, in every rank process, and the program's own checks must pass. Skips where there
// is no GPU or no compute-sanitizer (PATH, then the CUDA toolkit's bin folder).
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include "gpu/gpu_harness.h"
#include "harness/mp_harness.h"

namespace {

using fusco::test::nowSec;

constexpr double kRunSec = 270.0;  // under the ctest TIMEOUT of 300 s

bool isExecutable(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
}

// compute-sanitizer from PATH, else from the toolkit this was built with; empty if neither.
std::string findSanitizer() {
  if (const char* path = getenv("PATH")) {
    std::string s = path;
    size_t pos = 0;
    while (pos <= s.size()) {
      size_t colon = s.find(':', pos);
      if (colon == std::string::npos) colon = s.size();
      std::string dir = s.substr(pos, colon - pos);
      if (!dir.empty() && isExecutable(dir + "/compute-sanitizer"))
        return dir + "/compute-sanitizer";
      pos = colon + 1;
    }
  }
  const std::string toolkit = std::string(FUSCO_CUDA_BIN_DIR) + "/compute-sanitizer";
  if (isExecutable(toolkit)) return toolkit;
  return "";
}

// The program beside this test binary (the build folder and gpu-check's bundle both keep them
// together, so the bundle carries no build path).
std::string sanitizerProgram() {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return FUSCO_GPU_SANITIZER_PROGRAM;
  self[n] = '\0';
  std::string dir = self;
  dir.resize(dir.rfind('/') + 1);
  return dir + FUSCO_GPU_SANITIZER_PROGRAM;
}

struct RunResult {
  int status = -1;  // wait status
  bool timedOut = false;
  std::string output;  // stdout and stderr together
};

// Runs argv with stdout+stderr captured, killing it (and its process group) after kRunSec.
RunResult runCapture(const std::vector<std::string>& argv) {
  RunResult res;
  int fds[2];
  if (pipe(fds) != 0) {
    res.output = std::string("pipe: ") + strerror(errno);
    return res;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    fprintf(stderr, "execv %s: %s\n", args[0], strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    res.output = std::string("fork: ") + strerror(errno);
    return res;
  }
  const double deadline = nowSec() + kRunSec;
  for (;;) {
    pollfd pf{fds[0], POLLIN, 0};
    int n = poll(&pf, 1, 200);
    if (n > 0) {
      char buf[4096];
      ssize_t r = read(fds[0], buf, sizeof buf);
      if (r > 0) {
        res.output.append(buf, static_cast<size_t>(r));
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      break;  // EOF: every writer (the tool and the ranks) is gone
    }
    if (nowSec() > deadline) {
      res.timedOut = true;
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      break;
    }
  }
  close(fds[0]);
  waitpid(pid, &res.status, 0);
  return res;
}

void runUnder(const std::string& tool) {
  FUSCO_GPU_REQUIRE();
  const std::string sanitizer = findSanitizer();
  if (sanitizer.empty())
    GTEST_SKIP() << "compute-sanitizer is neither on PATH nor in " << FUSCO_CUDA_BIN_DIR;
  const std::string program = sanitizerProgram();
  const std::vector<std::string> argv = {sanitizer, "--tool",
                                         tool,      "--target-processes",
                                         "all",     "--error-exitcode",
                                         "86",      "--print-limit",
                                         "20",      program,
                                         "2"};
  RunResult r = runCapture(argv);
  const std::string cmd = sanitizer + " --tool " + tool + " ... " + program;
  ASSERT_FALSE(r.timedOut) << cmd << " did not finish in " << kRunSec << " s; output:\n"
                           << r.output;
  EXPECT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0)
      << cmd << " exited with wait status " << r.status
      << (WIFEXITED(r.status) && WEXITSTATUS(r.status) == 86 ? " (the tool found errors)" : "")
      << "; output:\n"
      << r.output;
  EXPECT_NE(r.output.find("fusco_gpu_sanitizer_moe: OK"), std::string::npos)
      << "the program's own checks did not pass; output:\n"
      << r.output;
  // Every process's summary (the parent's and each rank's) must be clean.
  static const std::regex dirty("(ERROR|RACECHECK) SUMMARY: [1-9]");
  EXPECT_FALSE(std::regex_search(r.output, dirty)) << cmd << " reported errors:\n" << r.output;
  const size_t keep = 3000;  // the summaries, for the log
  printf("%s\n", r.output.size() > keep ? r.output.substr(r.output.size() - keep).c_str()
                                        : r.output.c_str());
}

TEST(GpuSanitizer, MemcheckIsCleanOnTwoRankMoeDispatchAndCombine) { runUnder("memcheck"); }

TEST(GpuSanitizer, RacecheckIsCleanOnTwoRankMoeDispatchAndCombine) { runUnder("racecheck"); }

}  // namespace
