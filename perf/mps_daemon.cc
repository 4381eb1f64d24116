#include "mps_daemon.h"

#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "cuda_mem.h"
#include "number_args.h"
#include "stop_signals.h"

extern char** environ;

namespace fusco {
namespace perf {

namespace {

using Clock = std::chrono::steady_clock;

const char kControl[] = "nvidia-cuda-mps-control";
const int kToolTimeoutMs = 20000;  // each nvidia-cuda-mps-control call, and each wait after it

const char* envText(const char* name) {
  const char* v = getenv(name);
  return v != nullptr && v[0] != '\0' ? v : nullptr;
}

bool exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

std::string errnoText(const std::string& what) { return what + ": " + strerror(errno); }

// The directory an MPS client of this environment looks for its daemon in.
std::string pipeDirInUse() {
  const char* dir = envText("CUDA_MPS_PIPE_DIRECTORY");
  return dir != nullptr ? dir : "/tmp/nvidia-mps";
}

// The first executable `name` in PATH, or "".
std::string findOnPath(const char* name) {
  const char* path = envText("PATH");
  std::string list = path != nullptr ? path : "";
  size_t b = 0;
  while (b <= list.size()) {
    size_t e = list.find(':', b);
    if (e == std::string::npos) e = list.size();
    std::string dir = e > b ? list.substr(b, e - b) : ".";  // an empty entry is the cwd
    std::string file = dir + "/" + name;
    struct stat st;
    if (stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(file.c_str(), X_OK) == 0)
      return file;
    b = e + 1;
  }
  return "";
}

// FUSCO_PERF_FAKE_DEVICES=N (test hook): N >= 1, else -1 (unset or not a count).
int fakeDevices() {
  const char* v = envText("FUSCO_PERF_FAKE_DEVICES");
  int n = 0;
  return v != nullptr && parseInt(v, &n) && n >= 1 ? n : -1;
}

// Whether a daemon listens on the control socket. The file alone says nothing: a daemon that
// crashed leaves its socket behind, and connect() to it (or to any file that is no socket) is
// refused. Non-blocking, so a probe never waits on a listener whose backlog is full (EAGAIN),
// which is a daemon all the same.
bool socketAnswers(const std::string& path) {
  sockaddr_un a{};
  if (path.size() >= sizeof(a.sun_path)) return false;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  a.sun_family = AF_UNIX;
  memcpy(a.sun_path, path.c_str(), path.size());
  const bool up = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 || errno == EAGAIN;
  close(fd);
  return up;
}

// Polls until done() holds or the deadline passes; returns done()'s last answer.
template <typename Done>
bool waitUntil(Clock::time_point deadline, Done done, int pollMs = 10) {
  while (!done()) {
    if (Clock::now() >= deadline) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(pollMs));
  }
  return true;
}

// Waits for pid at most timeoutMs (then kills it); its exit status, or -1 with *err.
int waitTimed(pid_t pid, int timeoutMs, std::string* err) {
  int status = 0;
  pid_t r = 0;
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
  const bool ended = waitUntil(deadline, [&] {
    r = waitpid(pid, &status, WNOHANG);
    return r == pid || (r < 0 && errno != EINTR);
  });
  if (!ended) {
    kill(pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    *err = "no answer within " + std::to_string(timeoutMs / 1000) + " s";
    return -1;
  }
  if (r < 0) return (*err = errnoText("waitpid")), -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  *err = std::string("killed by signal ") + strsignal(WTERMSIG(status));
  return -1;
}

void closeBoth(int fds[2]) {
  for (int i = 0; i < 2; ++i)
    if (fds[i] >= 0) close(fds[i]);
}

// Runs `tool [arg]` with input on its stdin (nullptr: /dev/null) and its stdout and stderr
// appended to out (a daemon that keeps them open then holds no pipe of ours); waits at most
// kToolTimeoutMs. Returns its exit status, or -1 with *err.
int runTool(const std::string& tool, const char* arg, const char* input, const std::string& out,
            std::string* err) {
  int in[2] = {-1, -1};
  // The input fits in the pipe's buffer, so it is written before the tool starts.
  if (input != nullptr && (pipe2(in, O_CLOEXEC) != 0 || write(in[1], input, strlen(input)) !=
                                                            static_cast<ssize_t>(strlen(input)))) {
    *err = errnoText("pipe");
    closeBoth(in);
    return -1;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (input != nullptr)
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  else
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  char* argv[] = {const_cast<char*>(tool.c_str()), const_cast<char*>(arg), nullptr};
  fflush(stdout);
  fflush(stderr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, tool.c_str(), &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  closeBoth(in);
  if (rc != 0) {
    *err = std::string("cannot start ") + tool + ": " + strerror(rc);
    return -1;
  }
  return waitTimed(pid, kToolTimeoutMs, err);
}

// What the tool wrote (its last line), for an error message.
std::string toolSaid(const std::string& out) {
  FILE* f = fopen(out.c_str(), "r");
  if (f == nullptr) return "";
  std::string last;
  char buf[512];
  while (fgets(buf, sizeof(buf), f) != nullptr) {
    std::string s = buf;
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    if (!s.empty()) last = s;
  }
  fclose(f);
  return last.empty() ? "" : " (it said: " + last + ")";
}

int removeEntry(const char* path, const struct stat*, int, struct FTW*) {
  remove(path);
  return 0;  // best effort: go on with the rest
}

void removeTree(const std::string& dir) {
  nftw(dir.c_str(), removeEntry, 16, FTW_DEPTH | FTW_PHYS);
}

// Sets CUDA_MPS_* to the private folder's, keeping what was there for restoreEnv.
void pointEnvAt(MpsRun* run) {
  const char* p = getenv("CUDA_MPS_PIPE_DIRECTORY");
  const char* l = getenv("CUDA_MPS_LOG_DIRECTORY");
  run->hadPipe = p != nullptr, run->oldPipe = p != nullptr ? p : "";
  run->hadLog = l != nullptr, run->oldLog = l != nullptr ? l : "";
  setenv("CUDA_MPS_PIPE_DIRECTORY", (run->folder + "/pipe").c_str(), 1);
  setenv("CUDA_MPS_LOG_DIRECTORY", (run->folder + "/log").c_str(), 1);
}

void restoreEnv(const MpsRun& run) {
  if (run.hadPipe)
    setenv("CUDA_MPS_PIPE_DIRECTORY", run.oldPipe.c_str(), 1);
  else
    unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  if (run.hadLog)
    setenv("CUDA_MPS_LOG_DIRECTORY", run.oldLog.c_str(), 1);
  else
    unsetenv("CUDA_MPS_LOG_DIRECTORY");
}

// Runs `control -d` (CUDA_MPS_* already point at folder); the daemon is up once its control
// socket is there, at most kToolTimeoutMs after the start. False with *err.
bool launchDaemon(const std::string& control, const std::string& folder, std::string* err) {
  const std::string out = folder + "/log/mps-control.out";
  const std::string socket = folder + "/pipe/control";
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(kToolTimeoutMs);
  const int rc = runTool(control, "-d", nullptr, out, err);
  if (rc > 0) *err = control + " -d exited with status " + std::to_string(rc);
  const bool up = rc == 0 && waitUntil(deadline, [&] { return exists(socket); });
  if (rc == 0 && !up) {
    *err = "no " + socket + " within " + std::to_string(kToolTimeoutMs / 1000) + " s";
    std::string ignored;  // a daemon half up would outlive its folder: ask it to go
    runTool(control, nullptr, "quit\n", out, &ignored);
  }
  if (!up) *err += toolSaid(out);
  return up;
}

// Makes the private folder (pipe/, log/), points the environment at it and starts the daemon.
// False with *err (folder removed, environment restored).
bool startPrivate(const std::string& control, MpsRun* run, std::string* err) {
  char folder[] = "/tmp/fusco-mps.XXXXXX";  // short: the daemon's socket paths live below it
  if (mkdtemp(folder) == nullptr) return (*err = errnoText("mkdtemp /tmp/fusco-mps.XXXXXX")), false;
  run->folder = folder;
  bool ok = mkdir((run->folder + "/pipe").c_str(), 0700) == 0 &&
            mkdir((run->folder + "/log").c_str(), 0700) == 0;
  if (!ok) *err = errnoText("mkdir " + run->folder + "/pipe, /log");
  if (ok) {
    pointEnvAt(run);
    ok = launchDaemon(control, run->folder, err);
    if (!ok) restoreEnv(*run);
  }
  if (ok) {
    run->kind = "private", run->control = control, run->owner = getpid();
    return true;
  }
  removeTree(run->folder);
  run->folder.clear();
  return false;
}

// Why the run gets no daemon of its own ("": one is due). fake: the test hook's device count.
std::string noDaemonReason(const MpsRequest& req, bool cuda, int fake) {
  if (req.mode == MpsMode::Off) return "--mps off";
  if (req.np <= 0) return "ranks not forked by -np";
  if (!cuda) return "host memory";
  if (req.mode == MpsMode::On) return "";
  std::string why;
  int devices = fake >= 1 ? fake : visibleDeviceCount(&why);
  if (devices < 1) devices = 1;  // no answer: the ranks would share whatever there is
  if (req.np > devices) return "";
  return std::to_string(req.np) + " ranks on " + std::to_string(devices) +
         " devices: none shares a GPU";
}

}  // namespace

bool parseMpsMode(const char* v, MpsMode* out) {
  const char* const names[] = {"auto", "on", "off"};
  const MpsMode modes[] = {MpsMode::Auto, MpsMode::On, MpsMode::Off};
  int i = 0;
  return parseName(v, names, 3, &i) && ((*out = modes[i]), true);
}

bool mpsSetUp(const MpsRequest& req, MpsRun* run, std::string* err) {
  *run = MpsRun();
  const int fake = fakeDevices();
  const bool cuda = req.cudaMem || fake >= 1;
  const std::string hook =
      fake >= 1 ? " [test hook FUSCO_PERF_FAKE_DEVICES=" + std::to_string(fake) + "]" : "";
  const std::string pipe = pipeDirInUse();
  // A daemon that answers there already: its clients are ours whatever --mps says.
  if (cuda && socketAnswers(pipe + "/control")) {
    run->kind = "external";
    run->line = "MPS: already running (" + pipe + ")" +
                (req.mode == MpsMode::Off ? ": --mps off cannot keep the ranks off it" : "") + hook;
    return true;
  }
  std::string why = noDaemonReason(req, cuda, fake);
  const bool shared = why.empty();
  if (shared) {
    const std::string control = findOnPath(kControl);
    if (control.empty()) why = std::string(kControl) + " not found on PATH";
    if (!control.empty() && startPrivate(control, run, &why)) {
      run->line = "MPS: private daemon for this run (" + run->folder + ", " + control +
                  " -d), the ranks are its clients" + hook;
      return true;
    }
  }
  if (req.mode == MpsMode::On) {
    *err = "--mps on: no MPS daemon for this run: " + why;
    return false;
  }
  run->line = "MPS: off (" + why + ")" + (shared ? ", ranks time-slice the GPU" : "") + hook;
  return true;
}

bool mpsTearDown(MpsRun* run, std::string* err) {
  if (strcmp(run->kind, "private") != 0 || run->owner != getpid()) return true;
  const std::string out = run->folder + "/log/mps-control.out";
  const std::string socket = run->folder + "/pipe/control";
  const int rc = runTool(run->control, nullptr, "quit\n", out, err);
  if (rc > 0) *err = "`quit` to " + run->control + ": exit status " + std::to_string(rc);
  // quit returns before the daemon is gone: wait until nothing answers on its socket (each try
  // is a connection the daemon sees, hence the slower polling).
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(kToolTimeoutMs);
  auto silent = [&] { return !socketAnswers(socket); };
  const bool gone = rc == 0 && waitUntil(deadline, silent, 100);
  if (rc == 0 && !gone) *err = "the daemon still answers on " + socket + " after `quit`";
  if (!gone) *err += toolSaid(out) + "; the daemon may still be running";
  restoreEnv(*run);
  removeTree(run->folder);
  run->kind = "off", run->owner = 0;
  return gone;
}

int startMps(const char* prog, const MpsRequest& req, MpsRun* run) {
  // Held (stop_signals.h) from before the private folder is made until stopMps: a signal while
  // the daemon starts or runs would end this process and leave the folder in /tmp, and the daemon
  // once it is up. One noted during the start stops the run once the start is over.
  holdStopSignals();
  std::string err;
  const bool ok = mpsSetUp(req, run, &err);
  if (!ok) fprintf(stderr, "%s: %s\n", prog, err.c_str());
  if (ok && req.np > 0) printf("%s\n", run->line.c_str());  // launcher-started ranks: each would
  fflush(stdout);
  if (ok && strcmp(run->kind, "private") == 0)  // 128 + the signal, the daemon stopped
    return stopSignalCaught() != 0 ? stopMps(prog, run, 0) : 0;
  const int sig = releaseStopSignals();  // no daemon to stop: nothing more to hold them for
  return sig != 0 ? 128 + sig : ok ? 0 : 2;
}

int stopMps(const char* prog, MpsRun* run, int status) {
  if (strcmp(run->kind, "private") != 0 || run->owner != getpid()) return status;
  const std::string folder = run->folder;
  std::string err;
  if (!mpsTearDown(run, &err))
    fprintf(stderr, "%s: stopping the private MPS daemon (%s): %s\n", prog, folder.c_str(),
            err.c_str());
  const int sig = releaseStopSignals();
  return sig != 0 ? 128 + sig : status;
}

std::string mpsHeaderText(const char* kind) {
  if (strcmp(kind, "off") == 0) return kind;
  return std::string(kind) + " (pipe " + pipeDirInUse() + ")";
}

}  // namespace perf
}  // namespace fusco
