#include "launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "stop_signals.h"

#ifdef FUSCO_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only: the C++ bindings need libmpi_cxx
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace fusco {
namespace perf {

namespace {

using Clock = std::chrono::steady_clock;

const char* envOr(const char* name, const char* dflt) {
  const char* v = getenv(name);
  return (v != nullptr && v[0] != '\0') ? v : dflt;
}

bool envInt(const char* name, int* out) {
  const char* v = envOr(name, nullptr);
  return v != nullptr && parseInt(v, out);
}

int effectiveTimeoutMs(const LaunchOptions& opts) {
  if (opts.timeoutMs > 0) return opts.timeoutMs;
  int t = 0;
  if (envInt("FUSCO_TIMEOUT_MS", &t) && t > 0) return t;
  return 300000;
}

int64_t msLeft(Clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
}

std::string errnoText(const char* what) { return std::string(what) + ": " + strerror(errno); }

// ------------------------------------------------------------------ mode 1: fork -np N

struct Child {
  pid_t pid;
  int rank;
  bool done;
};

std::string describeStatus(int rank, int status) {
  char buf[96];
  if (WIFSIGNALED(status)) {
    snprintf(buf, sizeof(buf), "rank %d killed by signal %d (%s)", rank, WTERMSIG(status),
             strsignal(WTERMSIG(status)));
  } else {
    snprintf(buf, sizeof(buf), "rank %d exited with status %d", rank, WEXITSTATUS(status));
  }
  return buf;
}

// How long ranks that were passed a stop signal get to end before they are killed.
const int kStopGraceMs = 5000;

// Reaps the ranks that ended; *reaped: whether any did. Each failure is reported, except a rank
// killed by the signal the launcher passed on (stopSig, 0: none). Returns how many failed.
int reapEnded(std::vector<Child>& kids, size_t* left, int stopSig, bool* reaped) {
  int failures = 0;
  for (auto& k : kids) {
    if (k.done) continue;
    int status = 0;
    pid_t r = waitpid(k.pid, &status, WNOHANG);
    if (r == 0 || (r < 0 && errno == EINTR)) continue;
    k.done = true;
    --*left;
    *reaped = true;
    if (r >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    ++failures;
    if (stopSig != 0 && r >= 0 && WIFSIGNALED(status) && WTERMSIG(status) == stopSig) continue;
    fprintf(stderr, "# launcher: %s\n",
            r < 0 ? errnoText("waitpid").c_str() : describeStatus(k.rank, status).c_str());
  }
  return failures;
}

// Waits for every child. Once one fails the others get failGraceMs to notice (fusco reports a
// dead peer within its timeout), then they are killed so the launcher never hangs. A stop signal
// that this process holds (stop_signals.h) is passed on to the ranks as SIGTERM, so none outlives
// the launcher; the caller returns 128 + that signal.
int waitChildren(std::vector<Child>& kids, int failGraceMs) {
  int failures = 0;
  size_t left = kids.size();
  Clock::time_point killAt = Clock::time_point::max();
  int stopSig = 0;  // the stop signal noted, once passed on
  while (left > 0) {
    if (stopSig == 0 && (stopSig = stopSignalCaught()) != 0) {
      fprintf(stderr, "# launcher: got signal %d (%s): sending SIGTERM to the ranks\n", stopSig,
              strsignal(stopSig));
      for (auto& k : kids)
        if (!k.done) kill(k.pid, SIGTERM);  // not reaped yet: the pid is still that rank's
      killAt = std::min(killAt, Clock::now() + std::chrono::milliseconds(kStopGraceMs));
    }
    bool reaped = false;
    const int failed = reapEnded(kids, &left, stopSig == 0 ? 0 : SIGTERM, &reaped);
    if (failed > 0 && failures == 0 && stopSig == 0)
      killAt = Clock::now() + std::chrono::milliseconds(failGraceMs);
    failures += failed;
    if (left > 0 && Clock::now() >= killAt) {
      for (auto& k : kids) {
        if (k.done) continue;
        fprintf(stderr, "# launcher: rank %d still running %d ms after %s: killing it\n", k.rank,
                stopSig != 0 ? kStopGraceMs : failGraceMs, stopSig != 0 ? "SIGTERM" : "a failure");
        kill(k.pid, SIGKILL);
      }
      killAt = Clock::time_point::max();
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return failures == 0 ? 0 : 1;
}

// Runs rank r of a forked launch in this (child) process; returns its exit status.
int runForkedRank(const LaunchOptions& opts, int r, const fuscoUniqueId& id, const RankBody& body) {
  stopSignalsInChild();  // a rank ends on a stop signal as any process does
  Launch l;
  l.rank = r;
  l.nranks = opts.np;
  l.id = id;
  l.forked = true;
  l.mode = "fork";
  l.launcher = "-np";
  int rc = body(l);
  fflush(stdout);
  fflush(stderr);
  return rc;  // the child leaves through main like any process
}

// Reads exactly n bytes from a pipe; false on EOF or error.
bool readAll(int fd, void* buf, size_t n) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t k = read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// What rank 0 tells the parent through a pipe before it runs the body.
struct IdMessage {
  int32_t status;  // fuscoResult_t of fuscoGetUniqueId
  fuscoUniqueId id;
};

// Rank 0 is forked first and makes the unique id itself, so the id's root (its listening socket)
// lives in rank 0 only (fuscoGetUniqueId: the root runs in the calling process); the parent never
// holds it and needs nothing beyond the public API. Rank 0 hands the id back through a pipe, then
// the parent forks ranks 1..np-1 with it. *isRank: this process is a forked rank (it returns
// through here too).
int forkRanks(const LaunchOptions& opts, const RankBody& body, bool* isRank) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    fprintf(stderr, "# launcher: %s\n", errnoText("pipe").c_str());
    return 2;
  }
  // Buffered output would be written once per child otherwise.
  fflush(stdout);
  fflush(stderr);
  std::vector<Child> kids;
  pid_t pid = fork();
  if (pid == 0) {
    *isRank = true;
    stopSignalsInChild();
    close(fds[0]);
    IdMessage msg{};
    msg.status = fuscoGetUniqueId(&msg.id);
    if (msg.status != fuscoSuccess)
      fprintf(stderr, "# launcher: rank 0: fuscoGetUniqueId failed: %s: %s\n",
              fuscoGetErrorString(static_cast<fuscoResult_t>(msg.status)),
              fuscoGetLastError(nullptr));
    const bool sent = write(fds[1], &msg, sizeof(msg)) == static_cast<ssize_t>(sizeof(msg));
    close(fds[1]);
    if (!sent || msg.status != fuscoSuccess) return 2;
    return runForkedRank(opts, 0, msg.id, body);
  }
  close(fds[1]);
  if (pid < 0) {
    fprintf(stderr, "# launcher: %s (rank 0 of %d)\n", errnoText("fork").c_str(), opts.np);
    close(fds[0]);
    return 2;
  }
  kids.push_back(Child{pid, 0, false});
  IdMessage msg{};
  const bool got = readAll(fds[0], &msg, sizeof(msg));  // EOF: rank 0 ended without an id
  close(fds[0]);
  if (!got || msg.status != fuscoSuccess) {
    if (!got) fprintf(stderr, "# launcher: rank 0 ended before it sent the unique id\n");
    waitChildren(kids, 0);
    return 2;
  }
  // A stop signal meanwhile: no more ranks; waitChildren stops the ones there are.
  for (int r = 1; r < opts.np && stopSignalCaught() == 0; ++r) {
    pid = fork();
    if (pid == 0) return (*isRank = true), runForkedRank(opts, r, msg.id, body);
    if (pid < 0) {
      fprintf(stderr, "# launcher: %s (rank %d of %d)\n", errnoText("fork").c_str(), r, opts.np);
      for (auto& k : kids) kill(k.pid, SIGKILL);
      waitChildren(kids, 0);
      return 2;
    }
    kids.push_back(Child{pid, r, false});
  }
  return waitChildren(kids, opts.failGraceMs);
}

// forkRanks with the stop signals held in this process (stop_signals.h): one sent to it alone
// (a scheduler's, Popen.terminate()'s SIGTERM) would otherwise end it and leave the ranks running.
// Returns 128 + the signal when one came.
int runForked(const LaunchOptions& opts, const RankBody& body) {
  holdStopSignals();
  bool isRank = false;
  const int rc = forkRanks(opts, body, &isRank);
  if (isRank) return rc;  // its signals are its own (stopSignalsInChild)
  const int sig = releaseStopSignals();
  return sig != 0 ? 128 + sig : rc;
}

// ------------------------------------------------------------------ mode 3: id over TCP

// Request: magic, rank, nranks. Reply: magic, nranks, id.
const char kMagic[8] = {'F', 'U', 'S', 'C', 'O', 'I', 'D', '1'};
struct IdRequest {
  char magic[8];
  int32_t rank;
  int32_t nranks;
};
struct IdReply {
  char magic[8];
  int32_t nranks;
  int32_t pad;
  fuscoUniqueId id;
};

// Moves exactly n bytes before the deadline; false with *err on error, EOF or timeout.
bool ioFull(int fd, void* buf, size_t n, bool send, Clock::time_point deadline, std::string* err) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    int64_t left = msLeft(deadline);
    if (left <= 0) {
      *err = send ? "send timed out" : "receive timed out";
      return false;
    }
    pollfd pfd{fd, static_cast<short>(send ? POLLOUT : POLLIN), 0};
    int pr = poll(&pfd, 1, static_cast<int>(left));
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) {
      *err = errnoText("poll");
      return false;
    }
    if (pr == 0) continue;
    ssize_t k = send ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0) {
      *err = errnoText(send ? "send" : "recv");
      return false;
    }
    if (k == 0) {
      *err = "connection closed by peer";
      return false;
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Listening socket on every address (IPv6 dual stack, else IPv4) at port; -1 with *err.
int listenAny(int port, int backlog, std::string* err) {
  int one = 1, zero = 0;
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && listen(fd, backlog) == 0) {
      return fd;
    }
    close(fd);
  }
  fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = errnoText("socket");
    return -1;
  }
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, backlog) != 0) {
    *err = errnoText("bind/listen") + " on port " + std::to_string(port) +
           " (choose another with FUSCO_ID_PORT)";
    close(fd);
    return -1;
  }
  return fd;
}

// Rank 0: hands the id to every other rank once (a rank that asks twice is answered again).
bool serveId(int port, int nranks, const fuscoUniqueId& id, int timeoutMs, std::string* err) {
  int lfd = listenAny(port, nranks < 4096 ? nranks : 4096, err);
  if (lfd < 0) return false;
  Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
  std::set<int> served;
  IdReply reply{};
  memcpy(reply.magic, kMagic, sizeof(kMagic));
  reply.nranks = nranks;
  reply.id = id;
  while (static_cast<int>(served.size()) < nranks - 1) {
    int64_t left = msLeft(deadline);
    if (left <= 0) {
      *err = "timed out after " + std::to_string(timeoutMs) + " ms with " +
             std::to_string(served.size()) + " of " + std::to_string(nranks - 1) +
             " ranks served on port " + std::to_string(port);
      close(lfd);
      return false;
    }
    pollfd pfd{lfd, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left)) <= 0) continue;
    int cfd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (cfd < 0) continue;
    // A stray connection gets a few seconds, never the whole budget.
    Clock::time_point connDeadline = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    IdRequest req{};
    std::string ioErr;
    if (ioFull(cfd, &req, sizeof(req), false, connDeadline, &ioErr) &&
        memcmp(req.magic, kMagic, sizeof(kMagic)) == 0 && req.rank > 0 && req.rank < nranks &&
        ioFull(cfd, &reply, sizeof(reply), true, connDeadline, &ioErr)) {
      served.insert(req.rank);
    }
    close(cfd);
  }
  close(lfd);
  return true;
}

// One attempt to connect to host:port with a bounded wait; -1 with *err.
int connectOnce(const char* host, int port, int waitMs, std::string* err) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int gai = getaddrinfo(host, service.c_str(), &hints, &res);
  if (gai != 0) {
    *err = std::string("cannot resolve ") + host + ": " + gai_strerror(gai);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int rc = connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd pfd{fd, POLLOUT, 0};
      int soErr = ETIMEDOUT;
      socklen_t len = sizeof(soErr);
      if (poll(&pfd, 1, waitMs) == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &soErr, &len);
      errno = soErr;
      rc = soErr == 0 ? 0 : -1;
    }
    if (rc != 0) {
      *err = errnoText("connect");
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  return fd;
}

// Ranks > 0: ask rank 0 for the id, retrying until the deadline (rank 0 may start later).
bool fetchId(const char* host, int port, int rank, int nranks, int timeoutMs, fuscoUniqueId* id,
             std::string* err) {
  Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
  std::string last = "no attempt";
  while (msLeft(deadline) > 0) {
    int fd = connectOnce(host, port, 1000, &last);
    if (fd >= 0) {
      IdRequest req{};
      memcpy(req.magic, kMagic, sizeof(kMagic));
      req.rank = rank;
      req.nranks = nranks;
      IdReply reply{};
      bool ok = ioFull(fd, &req, sizeof(req), true, deadline, &last) &&
                ioFull(fd, &reply, sizeof(reply), false, deadline, &last);
      close(fd);
      if (ok && memcmp(reply.magic, kMagic, sizeof(kMagic)) != 0) {
        last = "the server is not a fusco launcher";
      } else if (ok && reply.nranks != nranks) {
        *err = "rank 0 at " + std::string(host) + ":" + std::to_string(port) + " runs " +
               std::to_string(reply.nranks) + " ranks, this rank expects " +
               std::to_string(nranks) + " (another job on that port?)";
        return false;
      } else if (ok) {
        *id = reply.id;
        return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  *err = "could not get the unique id from rank 0 at " + std::string(host) + ":" +
         std::to_string(port) + " within " + std::to_string(timeoutMs) +
         " ms (last error: " + last +
         "); is MASTER_ADDR rank 0's host and FUSCO_ID_PORT reachable?";
  return false;
}

// ------------------------------------------------------------------ environment detection

struct EnvLaunch {
  const char* launcher = nullptr;  // nullptr: no launcher in the environment
  int rank = 0;
  int nranks = 1;
  bool singleHost = false;  // the launcher says every rank is on this host
};

bool detectEnv(EnvLaunch* e, std::string* err) {
  struct Var {
    const char* launcher;
    const char* rank;
    const char* size;
    const char* localSize;  // equal to size: one host
  };
  const Var vars[] = {
      {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"mpirun", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS"},
      // Before srun: `srun torchrun ...` sets both, and torchrun's ranks are the processes.
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"},
      {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE"},
  };
  for (const Var& v : vars) {
    if (getenv(v.rank) == nullptr || getenv(v.size) == nullptr) continue;
    if (!envInt(v.rank, &e->rank) || !envInt(v.size, &e->nranks) || e->nranks < 1 || e->rank < 0 ||
        e->rank >= e->nranks) {
      *err = std::string("bad ") + v.rank + "/" + v.size + " in the environment (" +
             envOr(v.rank, "") + "/" + envOr(v.size, "") + ")";
      return false;
    }
    int local = 0;
    e->singleHost = envInt(v.localSize, &local) && local == e->nranks;
    int nodes = 0;
    if (envInt("SLURM_NNODES", &nodes) && nodes == 1) e->singleHost = true;
    e->launcher = v.launcher;
    return true;
  }
  return true;
}

int runTcp(const EnvLaunch& e, const LaunchOptions& opts, const RankBody& body) {
  Launch l;
  l.rank = e.rank;
  l.nranks = e.nranks;
  l.mode = "tcp";
  l.launcher = e.launcher;
  int timeoutMs = effectiveTimeoutMs(opts);
  const char* host = envOr("MASTER_ADDR", nullptr);
  if (host == nullptr && e.rank > 0 && !e.singleHost) {  // rank 0 serves on every address
    fprintf(stderr,
            "# launcher: rank %d: MASTER_ADDR is not set; export it to rank 0's host name or "
            "address (srun: export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" "
            "| head -n1))\n",
            e.rank);
    return 2;
  }
  if (host == nullptr) host = "127.0.0.1";
  int port = 0, masterPort = 29500;
  if (!envInt("FUSCO_ID_PORT", &port)) {
    if (getenv("MASTER_PORT") != nullptr && !envInt("MASTER_PORT", &masterPort)) {
      fprintf(stderr, "# launcher: rank %d: bad MASTER_PORT '%s'\n", e.rank,
              envOr("MASTER_PORT", ""));
      return 2;
    }
    port = masterPort + 1;
  }
  if (port <= 0 || port > 65535) {
    fprintf(stderr, "# launcher: rank %d: id port %d out of range\n", e.rank, port);
    return 2;
  }
  std::string err;
  if (e.rank == 0) {
    fuscoResult_t res = fuscoGetUniqueId(&l.id);
    if (res != fuscoSuccess) {
      fprintf(stderr, "# launcher: rank 0: fuscoGetUniqueId failed: %s: %s\n",
              fuscoGetErrorString(res), fuscoGetLastError(nullptr));
      return 2;
    }
    if (e.nranks > 1 && !serveId(port, e.nranks, l.id, timeoutMs, &err)) {
      fprintf(stderr, "# launcher: rank 0: serving the unique id failed: %s\n", err.c_str());
      return 2;
    }
  } else if (!fetchId(host, port, e.rank, e.nranks, timeoutMs, &l.id, &err)) {
    fprintf(stderr, "# launcher: rank %d: %s\n", e.rank, err.c_str());
    return 2;
  }
  return body(l);
}

#ifdef FUSCO_HAVE_MPI
int runMpi(const EnvLaunch& e, const RankBody& body) {
  MPI_Init(nullptr, nullptr);
  Launch l;
  l.mode = "mpi";
  l.launcher = e.launcher;
  l.mpi = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &l.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &l.nranks);
  struct {
    int32_t status;
    fuscoUniqueId id;
  } msg{};
  if (l.rank == 0) {
    fuscoResult_t res = fuscoGetUniqueId(&msg.id);
    msg.status = res;
    if (res != fuscoSuccess) {
      fprintf(stderr, "# launcher: rank 0: fuscoGetUniqueId failed: %s: %s\n",
              fuscoGetErrorString(res), fuscoGetLastError(nullptr));
    }
  }
  MPI_Bcast(&msg, sizeof(msg), MPI_BYTE, 0, MPI_COMM_WORLD);
  int rc = 2;
  if (msg.status == fuscoSuccess) {
    l.id = msg.id;
    rc = body(l);
  }
  MPI_Finalize();
  return rc;
}
#endif

}  // namespace

const char* launcherInEnvironment() {
  EnvLaunch e;
  std::string err;
  if (!detectEnv(&e, &err)) return "unknown";  // malformed: launchRanks reports it
  return e.launcher;
}

int launchRanks(const LaunchOptions& opts, const RankBody& body) {
  EnvLaunch e;
  std::string err;
  if (!detectEnv(&e, &err)) {
    fprintf(stderr, "# launcher: %s\n", err.c_str());
    return 2;
  }
  if (opts.np > 0) {
    if (e.launcher != nullptr && e.nranks > 1) {
      fprintf(stderr, "# launcher: -np %d given under %s with %d ranks: use one or the other\n",
              opts.np, e.launcher, e.nranks);
      return 2;
    }
    return runForked(opts, body);
  }
  if (e.launcher == nullptr) {
    Launch l;
    l.mode = "single";
    l.launcher = "none";
    fuscoResult_t res = fuscoGetUniqueId(&l.id);
    if (res != fuscoSuccess) {
      fprintf(stderr, "# launcher: fuscoGetUniqueId failed: %s: %s\n", fuscoGetErrorString(res),
              fuscoGetLastError(nullptr));
      return 2;
    }
    return body(l);
  }
#ifdef FUSCO_HAVE_MPI
  if (strcmp(e.launcher, "mpirun") == 0) return runMpi(e, body);
#endif
  return runTcp(e, opts, body);
}

}  // namespace perf
}  // namespace fusco
