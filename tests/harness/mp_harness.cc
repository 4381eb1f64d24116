#include "harness/mp_harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>

#include "core/bootstrap.h"
#include "core/cuda_guard.h"
#include "core/params.h"
#include "harness/stack_dump.h"

namespace fusco::test {

namespace {

// Thrown by initComm (and only caught by runRanks' child) to end a rank's body after a fatal
// failure, the way ASSERT_* ends a test function.
struct RankAbort {};

// Each failure travels as a 4-byte length and the text, written under one lock so messages from
// several threads do not interleave. Only the first kMaxSent are sent so a rank that fails on
// every element cannot flood the parent; the rest are counted.
constexpr int kMaxSent = 30;
std::mutex gSendMu;
int gFailures = 0;  // failures seen in this rank process (under gSendMu)

bool writeAll(int fd, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

void sendText(int fd, const std::string& text) {
  uint32_t len = static_cast<uint32_t>(text.size());
  std::string frame(reinterpret_cast<const char*>(&len), sizeof(len));
  frame += text;
  writeAll(fd, frame.data(), frame.size());
}

// Installed in a rank process: every gtest failure goes straight into the pipe, so failures
// recorded before a crash still reach the parent. Two are installed: one for all threads (the
// global reporter) and one for the main thread, which wins over any per-thread reporter the
// parent had installed when it forked (e.g. EXPECT_NONFATAL_FAILURE around runRanks).
class PipeReporter : public ::testing::ScopedFakeTestPartResultReporter {
 public:
  PipeReporter(int fd, InterceptMode mode)
      : ScopedFakeTestPartResultReporter(mode, &unused_), fd_(fd) {}
  void ReportTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;  // successes and skips carry nothing the parent needs
    std::ostringstream os;
    os << (r.file_name() ? r.file_name() : "?") << ":" << r.line_number() << ": " << r.message();
    std::lock_guard<std::mutex> g(gSendMu);
    if (++gFailures > kMaxSent) return;
    sendText(fd_, os.str());
  }

 private:
  ::testing::TestPartResultArray unused_;
  int fd_;
};

void sendLocked(int fd, const std::string& text) {
  std::lock_guard<std::mutex> g(gSendMu);
  sendText(fd, text);
}

// FUSCO_TEST_NETNS: the network namespace ("node") of each rank, see mp_harness.h.
struct NetnsPlan {
  bool active = false;
  std::vector<std::string> names;  // as listed
  std::vector<int> fdOf;           // per rank: open fd of /var/run/netns/<name>
  std::vector<int> fds;            // distinct open fds (closed by the parent after the fork)
  std::string error;
};

// Rank r of n runs in list[r] while the list covers every rank, else in contiguous blocks.
size_t netnsSlot(int r, int n, size_t len) {
  return static_cast<size_t>(n) <= len ? static_cast<size_t>(r)
                                       : static_cast<size_t>(r) * len / static_cast<size_t>(n);
}

NetnsPlan planNetns(int n) {
  NetnsPlan p;
  const char* spec = getenv("FUSCO_TEST_NETNS");
  if (spec == nullptr || *spec == '\0') return p;
  p.active = true;
  std::string s = spec;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    if (comma > pos) p.names.push_back(s.substr(pos, comma - pos));
    pos = comma + 1;
  }
  if (p.names.empty()) {
    p.error = std::string("FUSCO_TEST_NETNS='") + spec + "' names no namespace";
    return p;
  }
  const size_t len = p.names.size();
  std::vector<std::pair<std::string, int>> opened;
  for (int r = 0; r < n; ++r) {
    const std::string& name = p.names[netnsSlot(r, n, len)];
    int fd = -1;
    for (const auto& o : opened)
      if (o.first == name) fd = o.second;
    if (fd < 0) {
      std::string path = name.find('/') == std::string::npos ? "/var/run/netns/" + name : name;
      fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        p.error = "FUSCO_TEST_NETNS: cannot open " + path + ": " + strerror(errno) +
                  " (create the namespaces with tests/netns/netns.sh)";
        for (const auto& o : opened) close(o.second);
        p.fdOf.clear();
        return p;
      }
      opened.emplace_back(name, fd);
      p.fds.push_back(fd);
    }
    p.fdOf.push_back(fd);
  }
  return p;
}

void closeNetns(NetnsPlan& p) {
  for (int fd : p.fds) close(fd);
  p.fds.clear();
}

struct Child {
  pid_t pid = -1;
  int fd = -1;      // read end of this rank's failure pipe
  std::string buf;  // bytes read so far
  bool done = false;
  bool timedOut = false;
  int status = 0;
};

[[noreturn]] void runChild(int rank, int n, const fuscoUniqueId& id, int wfd, pid_t parent,
                           const std::function<void(const RankCtx&)>& body, const MpOptions& opt,
                           NetnsPlan& netns) {
  // Die with the test process (a killed ctest must not leave ranks behind).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Let the harness's debugger read this rank's stacks at a timeout (Yama's ptrace_scope 1).
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  if (getppid() != parent) _exit(97);
  if (netns.active) {
    // This rank's node: enter its network namespace before anything opens a socket.
    if (setns(netns.fdOf[rank], CLONE_NEWNET) != 0) {
      sendText(wfd, std::string("setns into FUSCO_TEST_NETNS namespace ") +
                        netns.names[netnsSlot(rank, n, netns.names.size())] +
                        " failed: " + strerror(errno));
      _exit(4);
    }
    closeNetns(netns);
    // Like `ip netns exec`: a private mount namespace with /sys remounted, so /sys/class/net shows
    // this namespace's devices (UCX's tcp transport finds its interfaces there). /dev/shm stays the
    // same tmpfs, so same-node ranks still share memory.
    const char* step = nullptr;
    if (unshare(CLONE_NEWNS) != 0)
      step = "unshare(CLONE_NEWNS)";
    else if (mount("", "/", nullptr, MS_SLAVE | MS_REC, nullptr) != 0)
      step = "mount / rslave";
    else if (umount2("/sys", MNT_DETACH) != 0 && errno != EINVAL)
      step = "umount /sys";
    else if (mount("sysfs", "/sys", "sysfs", 0, nullptr) != 0)
      step = "mount sysfs on /sys";
    if (step != nullptr) {
      sendText(wfd, std::string("FUSCO_TEST_NETNS: ") + step + " failed: " + strerror(errno));
      _exit(4);
    }
  }
  signal(SIGPIPE, SIG_DFL);
  for (const auto& kv : opt.env) setenv(kv.first.c_str(), kv.second.c_str(), 1);
  fusco::paramsReload();
  if (netns.active && std::none_of(opt.env.begin(), opt.env.end(),
                                   [](const auto& kv) { return kv.first == "FUSCO_LOCAL_SIZE"; })) {
    // Nodes come from the namespaces: the library ignores an inherited FUSCO_LOCAL_SIZE (it stays
    // in the environment for layout-dependent expectations, checked against the namespaces).
    fusco::paramSetOverride("FUSCO_LOCAL_SIZE", "0");
  }
  // Only rank 0 may keep the inherited listening socket; a stray copy elsewhere would keep a dead
  // root's port accepting connections.
  if (rank != 0) fusco::bootstrapReleaseId(id);
  int code = 0;
  {
    PipeReporter allThreads(wfd,
                            ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS);
    PipeReporter mainThread(
        wfd, ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD);
    RankCtx ctx{rank, n, id};
    try {
      body(ctx);
    } catch (const RankAbort&) {
      // the fatal failure is already reported
    } catch (const std::exception& e) {
      sendLocked(wfd, std::string("uncaught exception: ") + e.what());
      code = 3;
    } catch (...) {
      sendLocked(wfd, "uncaught non-standard exception");
      code = 3;
    }
    // The CUDA rules (docs/DESIGN.md): any setup call the guard refused fails the test, also when
    // the library recovered from it.
    std::string misplaced;
    const uint64_t refused = fusco::cudaGuardViolations(&misplaced);
    if (refused != 0)
      ADD_FAILURE() << "rank " << rank << ": the CUDA guard refused " << refused
                    << " setup call(s) made while an operation was in flight; the last: "
                    << misplaced;
    std::lock_guard<std::mutex> g(gSendMu);
    if (gFailures > kMaxSent)
      sendText(wfd, std::to_string(gFailures - kMaxSent) + " more failures not shown");
  }
  close(wfd);
  _exit(code);
}

// Moves whatever the pipe holds into c.buf; closes the fd at end of file.
void drain(Child& c) {
  char tmp[65536];
  while (c.fd >= 0) {
    ssize_t r = read(c.fd, tmp, sizeof(tmp));
    if (r > 0) {
      c.buf.append(tmp, static_cast<size_t>(r));
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close(c.fd);
    c.fd = -1;
  }
}

std::vector<std::string> parseMessages(const std::string& buf) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos + sizeof(uint32_t) <= buf.size()) {
    uint32_t len;
    memcpy(&len, buf.data() + pos, sizeof(len));
    pos += sizeof(len);
    if (pos + len > buf.size()) {
      out.push_back(buf.substr(pos) + " [truncated: the rank died while reporting]");
      return out;
    }
    out.push_back(buf.substr(pos, len));
    pos += len;
  }
  return out;
}

std::string describeStatus(int status) {
  std::ostringstream os;
  if (WIFEXITED(status)) {
    os << "exited with status " << WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    os << "was killed by signal " << sig << " (" << strsignal(sig) << ")";
  } else {
    os << "ended with wait status " << status;
  }
  return os.str();
}

// Where each rank still running at the timeout waits, before it is killed (harness/stack_dump.h).
void printLateRankStacks(const std::vector<Child>& kids, int timeoutSec) {
  const int n = static_cast<int>(kids.size());
  std::vector<pid_t> late;
  std::vector<std::string> labels;
  for (int r = 0; r < n; ++r)
    if (!kids[r].done) {
      late.push_back(kids[r].pid);
      labels.push_back("rank " + std::to_string(r) + " of " + std::to_string(n) +
                       ", not finished within " + std::to_string(timeoutSec) + " s");
    }
  printThreadStacks(late, labels);
}

// MpOptions.timeoutSec, cut to FUSCO_TEST_RANK_TIMEOUT_SEC when that is set and smaller (a run of
// many tests with its own per-test limit leaves room for the stacks this way).
int rankTimeoutSec(const MpOptions& opt) {
  const char* v = getenv("FUSCO_TEST_RANK_TIMEOUT_SEC");
  const int cap = v != nullptr ? atoi(v) : 0;
  return cap > 0 ? std::min(opt.timeoutSec, cap) : opt.timeoutSec;
}

}  // namespace

double nowSec() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

bool namesRank(const std::string& msg, int r) {
  std::regex re(
      "(rank|peer)(\\(s\\))?s?\\s*[#=:]?\\s*([0-9]+\\s*,\\s*)*" + std::to_string(r) + "(?![0-9])",
      std::regex::icase);
  return std::regex_search(msg, re);
}

std::vector<std::string> fuscoShmEntries() {
  std::vector<std::string> out;
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (strstr(e->d_name, "fusco") != nullptr) out.emplace_back(e->d_name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

void runRanks(int n, const std::function<void(const RankCtx&)>& body, const MpOptions& opt) {
  ASSERT_GE(n, 1) << "runRanks needs at least one rank";
  const std::vector<std::string> shmBefore = fuscoShmEntries();
  NetnsPlan netns = planNetns(n);
  ASSERT_TRUE(netns.error.empty()) << netns.error;
  if (netns.active) {
    // FUSCO_LOCAL_SIZE=L next to FUSCO_TEST_NETNS states the layout the namespaces give (ranks r
    // and r' share one iff r/L == r'/L), for tests whose expectations read it; it must agree, and
    // the ranks do not pass it to the library (nodes come from the namespaces).
    const char* ls = getenv("FUSCO_LOCAL_SIZE");
    const int L = ls != nullptr ? atoi(ls) : 0;
    for (int a = 0; L > 0 && a < n; ++a)
      for (int b = 0; b < n; ++b)
        if ((netns.fdOf[a] == netns.fdOf[b]) != (a / L == b / L)) {
          closeNetns(netns);
          FAIL() << "FUSCO_TEST_NETNS=" << getenv("FUSCO_TEST_NETNS") << " puts ranks " << a
                 << " and " << b << " of " << n << (a / L == b / L ? " on different" : " on one")
                 << " node(s), but FUSCO_LOCAL_SIZE=" << L << " says otherwise";
        }
  }
  fuscoUniqueId id;
  memset(&id, 0, sizeof(id));
  fuscoResult_t idRes;
  if (netns.active) {
    // Ranks bootstrap over the first rail; the parent (and any later id a rank makes) as well.
    setenv("FUSCO_SOCKET_IFNAME", "fr0", 0);
    fusco::paramsReload();
    // The id's listening socket must live in rank 0's namespace and carry its rail address: make
    // it there and come back (a socket stays in the namespace it was created in).
    int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (home < 0 || setns(netns.fdOf[0], CLONE_NEWNET) != 0) {
      int e = errno;
      if (home >= 0) close(home);
      closeNetns(netns);
      FAIL() << "FUSCO_TEST_NETNS: cannot enter rank 0's namespace: " << strerror(e);
    }
    idRes = fuscoGetUniqueId(&id);
    if (setns(home, CLONE_NEWNET) != 0) {
      // Staying in the wrong namespace would confuse every later test: stop here.
      fprintf(stderr, "mp_harness: setns back to the original namespace failed: %s\n",
              strerror(errno));
      abort();
    }
    close(home);
  } else {
    idRes = fuscoGetUniqueId(&id);
  }
  if (idRes != fuscoSuccess) closeNetns(netns);
  ASSERT_EQ(idRes, fuscoSuccess) << "fuscoGetUniqueId: " << fuscoGetErrorString(idRes) << ": "
                                 << fuscoGetLastError(nullptr);

  fflush(stdout);
  fflush(stderr);
  const pid_t parent = getpid();
  std::vector<Child> kids(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    int fds[2];
    if (pipe(fds) != 0) {
      ADD_FAILURE() << "pipe: " << strerror(errno);
      for (int k = 0; k < r; ++k) kill(kids[k].pid, SIGKILL);
      n = r;
      kids.resize(static_cast<size_t>(r));
      break;
    }
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      for (int k = 0; k < r; ++k) close(kids[k].fd);
      runChild(r, n, id, fds[1], parent, body, opt, netns);
    }
    close(fds[1]);
    if (pid < 0) {
      ADD_FAILURE() << "fork of rank " << r << ": " << strerror(errno);
      close(fds[0]);
      for (int k = 0; k < r; ++k) kill(kids[k].pid, SIGKILL);
      n = r;
      kids.resize(static_cast<size_t>(r));
      break;
    }
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    kids[r].pid = pid;
    kids[r].fd = fds[0];
  }
  fusco::bootstrapReleaseId(id);
  closeNetns(netns);

  const int timeoutSec = rankTimeoutSec(opt);
  const double deadline = nowSec() + timeoutSec;
  int running = n;
  while (running > 0) {
    std::vector<pollfd> pfds;
    for (auto& c : kids)
      if (c.fd >= 0) pfds.push_back(pollfd{c.fd, POLLIN, 0});
    if (!pfds.empty()) {
      poll(pfds.data(), pfds.size(), 20);
    } else {
      usleep(20000);
    }
    for (auto& c : kids) drain(c);
    for (auto& c : kids) {
      if (c.done) continue;
      pid_t w = waitpid(c.pid, &c.status, WNOHANG);
      if (w == c.pid || (w < 0 && errno == ECHILD)) {
        c.done = true;
        --running;
      }
    }
    if (running > 0 && nowSec() > deadline) {
      printLateRankStacks(kids, timeoutSec);
      for (auto& c : kids) {
        if (c.done) continue;
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &c.status, 0);
        c.timedOut = true;
        c.done = true;
        --running;
      }
    }
  }
  for (auto& c : kids) {
    drain(c);
    if (c.fd >= 0) close(c.fd);
    c.fd = -1;
  }

  for (int r = 0; r < n; ++r) {
    const Child& c = kids[r];
    for (const std::string& m : parseMessages(c.buf)) ADD_FAILURE() << "rank " << r << ": " << m;
    bool mayDie = std::find(opt.mayDie.begin(), opt.mayDie.end(), r) != opt.mayDie.end();
    if (c.timedOut) {
      ADD_FAILURE() << "rank " << r << " did not finish within " << timeoutSec
                    << " s and was killed (hang?); its threads' stacks are printed above";
    } else if (!mayDie && !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)) {
      ADD_FAILURE() << "rank " << r << " " << describeStatus(c.status);
    }
  }

  // Every segment must be gone once every rank has exited, even after a crash.
  const std::vector<std::string> shmAfter = fuscoShmEntries();
  std::vector<std::string> leaked;
  std::set_difference(shmAfter.begin(), shmAfter.end(), shmBefore.begin(), shmBefore.end(),
                      std::back_inserter(leaked));
  // The harness's own self-test leaves an entry on purpose; one of another test process (ctest -j)
  // is not this test's leak, and removing it would fail that self-test instead.
  const std::string mine = "fusco-harness-selftest-" + std::to_string(getpid());
  leaked.erase(std::remove_if(leaked.begin(), leaked.end(),
                              [&](const std::string& s) {
                                return s.rfind("fusco-harness-selftest-", 0) == 0 && s != mine;
                              }),
               leaked.end());
  if (!leaked.empty()) {
    std::ostringstream os;
    for (const auto& s : leaked) {
      os << " /dev/shm/" << s;
      unlink(("/dev/shm/" + s).c_str());  // so the next test is not blamed
    }
    ADD_FAILURE() << leaked.size() << " shared memory entries left behind:" << os.str();
  }
}

fuscoComm_t initComm(const RankCtx& ctx, const fuscoConfig_t* config) {
  fuscoComm_t comm = nullptr;
  fuscoResult_t r = config != nullptr
                        ? fuscoCommInitRankConfig(&comm, ctx.nranks, ctx.id, ctx.rank, config)
                        : fuscoCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank);
  if (r != fuscoSuccess || comm == nullptr) {
    GTEST_MESSAGE_AT_(__FILE__, __LINE__,
                      (std::string("fuscoCommInitRank(nranks=") + std::to_string(ctx.nranks) +
                       ", rank=" + std::to_string(ctx.rank) +
                       ") failed: " + fuscoGetErrorString(r) + ": " + fuscoGetLastError(nullptr))
                          .c_str(),
                      ::testing::TestPartResult::kFatalFailure);
    throw RankAbort{};
  }
  return comm;
}

}  // namespace fusco::test
