#include "harness/stack_dump.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace fusco::test {

namespace {

constexpr size_t kMaxBytes = 512 * 1024;  // per process: room for a hundred threads' stacks
constexpr double kDefaultTimeoutSec = 20.0;

double monoSec() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

bool isExecutable(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
}

std::string onPath(const std::string& name) {
  const char* path = getenv("PATH");
  if (path == nullptr) return "";
  const std::string s = path;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t colon = s.find(':', pos);
    if (colon == std::string::npos) colon = s.size();
    const std::string dir = s.substr(pos, colon - pos);
    if (!dir.empty() && isExecutable(dir + "/" + name)) return dir + "/" + name;
    pos = colon + 1;
  }
  return "";
}

// The debugger's full path for a tool name; empty when it is not installed.
std::string debuggerPath(const std::string& tool) {
  std::string p = onPath(tool);
  if (p.empty() && tool == "cuda-gdb" && isExecutable("/usr/local/cuda/bin/cuda-gdb"))
    p = "/usr/local/cuda/bin/cuda-gdb";
  return p;
}

std::string readSmall(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string trimEnd(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Each thread's name, state, wchan and kernel stack (the stack is readable by root only).
std::string procStacks(pid_t pid) {
  const std::string base = "/proc/" + std::to_string(pid);
  DIR* d = opendir((base + "/task").c_str());
  if (d == nullptr) return "cannot read " + base + "/task: " + strerror(errno) + "\n";
  std::vector<long> tids;
  while (dirent* e = readdir(d))
    if (e->d_name[0] >= '0' && e->d_name[0] <= '9') tids.push_back(atol(e->d_name));
  closedir(d);
  std::sort(tids.begin(), tids.end());
  std::ostringstream os;
  for (long tid : tids) {
    const std::string t = base + "/task/" + std::to_string(tid);
    const std::string stat = readSmall(t + "/stat");
    const size_t rp = stat.rfind(')');  // the state follows the name's closing parenthesis
    const char state = rp != std::string::npos && rp + 2 < stat.size() ? stat[rp + 2] : '?';
    os << "thread " << tid << " (" << trimEnd(readSmall(t + "/comm")) << ") state " << state
       << " wchan " << trimEnd(readSmall(t + "/wchan")) << "\n";
    std::istringstream ks(trimEnd(readSmall(t + "/stack")));
    std::string line;
    while (std::getline(ks, line)) os << "    " << line << "\n";
  }
  return os.str();
}

struct Debugger {
  pid_t pid = -1;  // the debugger process (leader of its own process group)
  int fd = -1;     // its stdout and stderr
  std::string out;
  bool timedOut = false;
};

// Starts `dbg -batch -nx -p target -ex "thread apply all bt"`; pid -1 when it cannot.
Debugger spawn(const std::string& dbg, pid_t target) {
  Debugger d;
  const std::string p = std::to_string(target);  // made before fork: the child only execs
  int fds[2];
  if (pipe(fds) != 0) return d;
  fflush(stdout);
  fflush(stderr);
  d.pid = fork();
  if (d.pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int in = open("/dev/null", O_RDONLY);
    if (in >= 0) dup2(in, 0);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    execl(dbg.c_str(), dbg.c_str(), "-batch", "-nx", "-p", p.c_str(), "-ex", "set pagination off",
          "-ex", "thread apply all bt", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  if (d.pid < 0) {
    close(fds[0]);
    return d;
  }
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  d.fd = fds[0];
  return d;
}

void drainInto(Debugger& d) {
  char buf[16384];
  while (d.fd >= 0) {
    ssize_t r = read(d.fd, buf, sizeof buf);
    if (r > 0) {
      if (d.out.size() < kMaxBytes) d.out.append(buf, static_cast<size_t>(r));
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close(d.fd);
    d.fd = -1;
  }
}

// Reads every debugger's output until each closes it or the deadline passes; then ends them all.
void collect(std::vector<Debugger>& ds, double deadline) {
  for (;;) {
    std::vector<pollfd> pfds;
    for (auto& d : ds)
      if (d.fd >= 0) pfds.push_back(pollfd{d.fd, POLLIN, 0});
    if (pfds.empty() || monoSec() > deadline) break;
    poll(pfds.data(), pfds.size(), 100);
    for (auto& d : ds) drainInto(d);
  }
  for (auto& d : ds) {
    if (d.pid <= 0) continue;
    if (d.fd >= 0) {  // still talking at the deadline: a hung debugger
      d.timedOut = true;
      kill(-d.pid, SIGKILL);
      kill(d.pid, SIGKILL);
      close(d.fd);
      d.fd = -1;
    }
    int status = 0;
    // Output closed: the debugger exits right after; a stray one is killed after 2 s.
    const double until = monoSec() + 2.0;
    while (waitpid(d.pid, &status, WNOHANG) == 0) {
      if (monoSec() > until) {
        kill(-d.pid, SIGKILL);
        kill(d.pid, SIGKILL);
        waitpid(d.pid, &status, 0);
        break;
      }
      usleep(10000);
    }
  }
}

// A debugger's output holds a stack when it shows at least one frame ("#0 ").
bool hasFrames(const std::string& out) {
  return out.rfind("#0 ", 0) == 0 || out.find("\n#0 ") != std::string::npos;
}

}  // namespace

std::string stackToolName() {
  const char* v = getenv("FUSCO_TEST_STACK_TOOL");
  if (v != nullptr && *v != '\0') return v;
  if (!debuggerPath("cuda-gdb").empty()) return "cuda-gdb";
  if (!debuggerPath("gdb").empty()) return "gdb";
  return "proc";
}

double stackTimeoutSec() {
  const char* v = getenv("FUSCO_TEST_STACK_TIMEOUT_SEC");
  const double t = v != nullptr ? atof(v) : 0.0;
  return t > 0 ? t : kDefaultTimeoutSec;
}

std::vector<std::string> threadStacks(const std::vector<pid_t>& pids, double timeoutSec) {
  const std::string tool = stackToolName();
  std::vector<std::string> out(pids.size());
  if (tool == "none") return out;
  const std::string dbg = tool == "proc" ? "" : debuggerPath(tool);
  std::vector<Debugger> ds(pids.size());
  if (!dbg.empty()) {
    for (size_t i = 0; i < pids.size(); ++i) ds[i] = spawn(dbg, pids[i]);
    collect(ds, monoSec() + timeoutSec);
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    const Debugger& d = ds[i];
    if (!dbg.empty() && hasFrames(d.out) && !d.timedOut) {
      out[i] = d.out;
      continue;
    }
    std::string why;
    if (tool != "proc" && dbg.empty())
      why = "(" + tool + " is not installed; /proc instead)\n";
    else if (d.pid < 0 && !dbg.empty())
      why = "(" + dbg + " could not be started; /proc instead)\n";
    else if (d.timedOut)
      why = "(" + dbg + " did not finish within " + std::to_string(static_cast<int>(timeoutSec)) +
            " s and was killed; what it printed, then /proc)\n" + d.out + "\n";
    else if (!dbg.empty())
      why = "(" + dbg + " printed no stack; what it printed, then /proc)\n" + d.out + "\n";
    out[i] = why + procStacks(pids[i]);
  }
  return out;
}

void printThreadStacks(const std::vector<pid_t>& pids, const std::vector<std::string>& labels) {
  const std::string tool = stackToolName();
  if (pids.empty() || tool == "none") return;
  const std::vector<std::string> stacks = threadStacks(pids, stackTimeoutSec());
  for (size_t i = 0; i < pids.size(); ++i) {
    const std::string label = i < labels.size() ? labels[i] : "process";
    fprintf(stderr, "=== stacks of %s (pid %d, %s) ===\n%s=== end of the stacks of %s ===\n",
            label.c_str(), static_cast<int>(pids[i]), tool.c_str(), stacks[i].c_str(),
            label.c_str());
  }
  fflush(stderr);
}

}  // namespace fusco::test
