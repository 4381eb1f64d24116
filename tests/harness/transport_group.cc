// Process groups for the transport tests (see transport_group.h).
#include "harness/transport_group.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "core/liveness.h"

namespace fusco::test::transport {

int gRank = -1;

namespace {

// ---------------------------------------------------------------- pipe helpers with deadlines

bool readFull(int fd, void* buf, size_t n, const Deadline& d) {
  auto p = static_cast<char*>(buf);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    int rc = poll(&pfd, 1, static_cast<int>(d.remainingMs()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return false;
    ssize_t got = read(fd, p, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool writeFull(int fd, const void* buf, size_t n) {
  auto p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t put = write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

bool writeString(int fd, const std::string& s) {
  uint32_t n = static_cast<uint32_t>(s.size());
  return writeFull(fd, &n, sizeof(n)) && writeFull(fd, s.data(), n);
}

bool readString(int fd, std::string* s, const Deadline& d) {
  uint32_t n = 0;
  if (!readFull(fd, &n, sizeof(n), d) || n > (1u << 20)) return false;
  s->assign(n, '\0');
  return readFull(fd, &(*s)[0], n, d);
}

}  // namespace

// ---------------------------------------------------------------- one rank's view

bool RankEnv::barrier(bool step) {
  Deadline d(kTimeoutMs);
  char b = 'B', g = 0;
  if (!writeFull(toParent, &b, 1)) return false;
  if (!step || ops == nullptr || ops->progress == nullptr || tc == nullptr)
    return readFull(fromParent, &g, 1, d) && g == 'G';
  while (!d.expired()) {
    pollfd pf{fromParent, POLLIN, 0};
    int r = poll(&pf, 1, 1);
    if (r < 0 && errno != EINTR) return false;
    if (r > 0) return readFull(fromParent, &g, 1, d) && g == 'G';
    ops->progress(tc);
  }
  return false;
}

int openFdCount() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* ent = readdir(d))
      if (ent->d_name[0] != '.') ++n;
    closedir(d);
    --n;  // the directory's own descriptor
  }
  return n;
}

void buildEnv(RankEnv* e, int rank, const std::vector<pid_t>& pids, const Options& o) {
  e->rank = rank;
  e->nranks = static_cast<int>(pids.size());
  e->ops = o.kind->ops;
  std::string host = localHostId();
  std::vector<std::string> hosts(e->nranks, host);
  e->infos.resize(e->nranks);
  for (int r = 0; r < e->nranks; ++r) {
    pid_t pid = o.knownPids ? pids[r] : 0;
    e->infos[r] = {host, pid, pid != 0 ? processStartTime(pid) : 0};
  }
  e->nodes = buildNodeMap(hosts, o.kind->ranksPerNode);
  e->ctx.rank = rank;
  e->ctx.nranks = e->nranks;
  e->ctx.nodes = &e->nodes;
  e->ctx.peers = &e->infos;
  e->ctx.memType = o.kind->memType;
  e->ctx.chunkBytes = o.chunkBytes;
  e->ctx.depth = o.depth;
  e->ctx.timeoutMs = kTimeoutMs;
  e->ctx.commTag = 0xc0ffee;
  e->peers.clear();
  for (int p = 0; p < e->nranks; ++p)
    if (e->ops->score(e->ctx, p) > 0) e->peers.push_back(p);
}

// ---------------------------------------------------------------- the process group

bool Group::start(const Options& o, const Body& body) {
  signal(SIGPIPE, SIG_IGN);
  opts_ = o;
  int first = o.parentIsRank0 ? 1 : 0;
  pids_.assign(o.nranks, getpid());
  std::vector<std::array<int, 4>> fds;
  for (int r = first; r < o.nranks; ++r) {
    int up[2], down[2];
    if (pipe(up) != 0 || pipe(down) != 0) return false;
    fds.push_back({up[0], up[1], down[0], down[1]});
  }
  for (int r = first; r < o.nranks; ++r) {
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
      for (size_t i = 0; i < fds.size(); ++i)
        for (int k = 0; k < 4; ++k)
          if (!(static_cast<int>(i) == r - first && (k == 1 || k == 2))) close(fds[i][k]);
      _exit(childMain(r, fds[r - first][1], fds[r - first][2], body));
    }
    pids_[r] = pid;
  }
  for (auto& f : fds) {
    close(f[1]);
    close(f[2]);
    up_.push_back(f[0]);
    down_.push_back(f[3]);
  }
  for (int fd : down_)
    if (!writeFull(fd, pids_.data(), sizeof(pid_t) * pids_.size())) return false;
  return true;
}

bool Group::exchangeBlobs(const std::string& ownBlob, std::vector<std::string>* blobs) {
  Deadline d(kTimeoutMs);
  blobs->assign(opts_.nranks, "");
  int first = opts_.parentIsRank0 ? 1 : 0;
  if (first == 1) (*blobs)[0] = ownBlob;
  for (size_t i = 0; i < up_.size(); ++i)
    if (!readString(up_[i], &(*blobs)[first + i], d)) return false;
  if (opts_.exitAfterSetup) return true;
  for (int fd : down_)
    for (const auto& b : *blobs)
      if (!writeString(fd, b)) return false;
  return true;
}

bool Group::barrier() {
  Deadline d(kTimeoutMs);
  for (int fd : up_) {
    char b = 0;
    if (!readFull(fd, &b, 1, d) || b != 'B') {
      closeDown();  // releases the others with an error instead of a hang
      return false;
    }
  }
  for (int fd : down_) {
    char g = 'G';
    if (!writeFull(fd, &g, 1)) return false;
  }
  return true;
}

std::vector<int> Group::finish() {
  Deadline d(kTimeoutMs);
  const int first = opts_.parentIsRank0 ? 1 : 0;
  std::vector<bool> live(up_.size(), true);
  for (int round = 0; !up_.empty() && !d.expired(); ++round) {
    size_t nLive = 0, nEof = 0;
    for (size_t i = 0; i < up_.size(); ++i) {
      if (!live[i]) continue;
      ++nLive;
      char b = 0;
      if (!readFull(up_[i], &b, 1, d) || b != 'B') live[i] = false, ++nEof;
    }
    if (nEof == nLive) break;
    if (nEof > 0) {  // one left while the others wait: release them with an error, not a hang
      closeDown();
      break;
    }
    for (size_t i = 0; i < down_.size(); ++i) {
      char g = 'G';
      if (live[i]) writeFull(down_[i], &g, 1);
    }
    // Round 0 is the post-connect barrier, round 1 the body's first.
    if (round == 1 && opts_.victim >= first) {
      kill(pids_[opts_.victim], SIGKILL);
      live[opts_.victim - first] = false;
    }
  }
  closeDown();
  return reap(d);
}

bool Group::waitZombie(int rank) {
  Deadline d(kTimeoutMs);
  while (!d.expired()) {
    siginfo_t si{};
    if (waitid(P_PID, pids_[rank], &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid != 0)
      return true;
    usleep(1000);
  }
  return false;
}

int Group::reapOne(int rank) {
  Deadline d(kTimeoutMs);
  while (!d.expired()) {
    int st = 0;
    pid_t r = waitpid(pids_[rank], &st, WNOHANG);
    if (r == pids_[rank]) {
      reaped_.insert(rank);
      return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    if (r < 0) return -1;
    usleep(1000);
  }
  return -1;
}

void Group::closeDown() {
  for (int fd : down_) close(fd);
  down_.clear();
}

std::vector<int> Group::reap(const Deadline& d) {
  std::vector<int> status(opts_.nranks, 0);
  int first = opts_.parentIsRank0 ? 1 : 0;
  for (int r = first; r < opts_.nranks; ++r) {
    if (reaped_.count(r)) continue;
    int st = 0;
    pid_t got = 0;
    while ((got = waitpid(pids_[r], &st, WNOHANG)) == 0 && !d.expired()) usleep(1000);
    if (got != pids_[r]) {
      fprintf(stderr, "[transport test] rank %d (pid %d) did not finish in time; killing it\n", r,
              static_cast<int>(pids_[r]));
      kill(pids_[r], SIGKILL);
      waitpid(pids_[r], &st, 0);
      status[r] = -1;
    } else {
      status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    reaped_.insert(r);
  }
  for (int fd : up_) close(fd);
  up_.clear();
  return status;
}

void Group::killAll() {
  closeDown();
  for (int fd : up_) close(fd);
  up_.clear();
  int first = opts_.parentIsRank0 ? 1 : 0;
  for (int r = first; r < static_cast<int>(pids_.size()); ++r) {
    if (reaped_.count(r)) continue;
    kill(pids_[r], SIGKILL);
    waitpid(pids_[r], nullptr, 0);
    reaped_.insert(r);
  }
}

int Group::childMain(int rank, int toParent, int fromParent, const Body& body) {
  gRank = rank;
  if (opts_.kind->prepareChild != nullptr) opts_.kind->prepareChild();
  Deadline d(kTimeoutMs);
  std::vector<pid_t> pids(opts_.nranks);
  CHILD_CHECK(readFull(fromParent, pids.data(), sizeof(pid_t) * pids.size(), d), "no pid list");
  RankEnv e;
  e.toParent = toParent;
  e.fromParent = fromParent;
  buildEnv(&e, rank, pids, opts_);
  e.fdsBeforeSetup = openFdCount();
  std::string blob;
  CHILD_CHECK(e.ops->setup(e.ctx, e.peers, &e.tc, &blob) == fuscoSuccess, "%s setup", e.ops->name);
  CHILD_CHECK(writeString(toParent, blob), "sending blob");
  if (opts_.exitAfterSetup) return 0;  // exits with the segment never connected
  std::vector<std::string> blobs(opts_.nranks);
  for (auto& b : blobs) CHILD_CHECK(readString(fromParent, &b, d), "receiving blobs");
  int rc = childRun(e, body, blobs);
  e.ops->close(e.tc);
  return rc;
}

int Group::childRun(RankEnv& e, const Body& body, const std::vector<std::string>& blobs) {
  CHILD_CHECK(e.ops->connect(e.tc, blobs) == fuscoSuccess, "%s connect", e.ops->name);
  CHILD_CHECK(e.barrier(), "post-connect barrier");
  try {
    return body(e);
  } catch (...) {
    fprintf(stderr, "[transport test rank %d] exception in body\n", e.rank);
  }
  return 1;
}

void runChildren(const Options& o, const Body& body) {
  Group g;
  ASSERT_TRUE(g.start(o, body));
  std::vector<std::string> blobs;
  ASSERT_TRUE(g.exchangeBlobs("", &blobs));
  std::vector<int> st = g.finish();
  for (int r = 0; r < o.nranks; ++r) {
    if (r == o.victim) continue;
    EXPECT_EQ(st[r], 0) << "rank " << r << " failed (see stderr)";
  }
}

// ---------------------------------------------------------------- the parent as rank 0

bool WatchedChild::start(const Body& body) {
  o.nranks = 2;
  o.parentIsRank0 = true;
  if (!g.start(o, body)) return false;
  buildEnv(&self, 0, g.pids(), o);
  std::string blob;
  std::vector<std::string> blobs;
  const TransportOps* ops = o.kind->ops;
  return ops->setup(self.ctx, self.peers, &self.tc, &blob) == fuscoSuccess &&
         g.exchangeBlobs(blob, &blobs) && ops->connect(self.tc, blobs) == fuscoSuccess &&
         g.barrier();
}

fuscoResult_t WatchedChild::waitForFailure() {
  Deadline d(kTimeoutMs);
  fuscoResult_t r = fuscoSuccess;
  while ((r = o.kind->ops->checkPeer(self.tc, 1)) == fuscoSuccess && !d.expired()) usleep(1000);
  return r;
}

WatchedChild::~WatchedChild() { o.kind->ops->close(self.tc); }

}  // namespace fusco::test::transport
