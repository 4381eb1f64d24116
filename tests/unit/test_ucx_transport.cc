// The UCX transport across real processes over TCP on loopback: forked ranks (each its own
// virtual node) exchange setup blobs through pipes (via the parent), connect, and talk through
// the ops table only. Children report failures on stderr and through their exit code; every wait
// has a deadline. Built only with UCX.
#ifdef FUSCO_HAVE_UCX
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/liveness.h"
#include "core/result.h"
#include "core/topology.h"
#include "transport/transport.h"

namespace fusco {
extern const TransportOps kUcxTransport;
}

namespace {

using fusco::Deadline;
using fusco::kUcxTransport;
using fusco::nowNs;

constexpr int kTimeoutMs = 10000;
constexpr size_t kChunk = 64 * 1024;  // big enough for UCX's rendezvous path on tcp
constexpr int kDepth = 3;
int gRank = -1;

#define UCHECK(cond, ...)                                                                    \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      fprintf(stderr, "[ucx test rank %d] %s:%d: check failed: %s: ", gRank, __FILE__,       \
              __LINE__, #cond);                                                              \
      fprintf(stderr, __VA_ARGS__);                                                          \
      fprintf(stderr, " (last error: %s)\n", fusco::threadLastError().c_str());              \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

// ---------------------------------------------------------------- pipes

bool writeAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w, n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly n bytes before the deadline; false on EOF, error or timeout.
bool readAll(int fd, void* p, size_t n, const Deadline& d) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    int r = poll(&pf, 1, static_cast<int>(std::max<int64_t>(1, d.remainingMs())));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    ssize_t got = read(fd, c, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    c += got, n -= static_cast<size_t>(got);
  }
  return true;
}

bool sendStr(int fd, const std::string& s) {
  uint64_t n = s.size();
  return writeAll(fd, &n, sizeof(n)) && writeAll(fd, s.data(), s.size());
}

bool recvStr(int fd, std::string* s, const Deadline& d) {
  uint64_t n;
  if (!readAll(fd, &n, sizeof(n), d) || n > (64u << 20)) return false;
  s->resize(n);
  return readAll(fd, &(*s)[0], n, d);
}

// ---------------------------------------------------------------- rank environment

struct Env {
  int rank = 0;
  int nranks = 0;
  std::vector<fusco::PeerInfo> infos;
  fusco::NodeMap nodes;
  fusco::TransportContext ctx;
  std::vector<int> peers;
  fusco::TransportComm* tc = nullptr;
  int up = -1, down = -1;

  // Keeps stepping the transport while it waits, as the engine does: a message this rank posted
  // last may still need its sender's progress (UCX rendezvous) while a peer waits for it.
  bool barrier() {
    char b = 'B', g = 0;
    if (!writeAll(up, &b, 1)) return false;
    Deadline d(kTimeoutMs);
    while (!d.expired()) {
      pollfd pf{down, POLLIN, 0};
      int r = poll(&pf, 1, 1);
      if (r < 0 && errno != EINTR) return false;
      if (r > 0) return readAll(down, &g, 1, d) && g == 'G';
      if (tc != nullptr) kUcxTransport.progress(tc);
    }
    return false;
  }
};

using Body = std::function<int(Env&)>;

struct Options {
  int nranks = 2;
  int victim = -1;         // killed by the parent after the first barrier
  bool knownPids = true;   // false: peers' pids unknown, so only UCX can notice a death
};

int childMain(Env& e, const Options& o, const Body& body) {
  setenv("UCX_TLS", "tcp,self", 1);
  setenv("UCX_NET_DEVICES", "lo", 1);
  setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
  Deadline d(kTimeoutMs);
  std::string pids;
  UCHECK(recvStr(e.down, &pids, d), "pids from the parent");
  std::vector<std::string> hosts(e.nranks);
  e.infos.resize(e.nranks);
  for (int r = 0; r < e.nranks; ++r) {
    pid_t pid;
    memcpy(&pid, pids.data() + r * sizeof(pid), sizeof(pid));
    e.infos[r] = {fusco::localHostId(), o.knownPids ? pid : 0,
                  o.knownPids ? fusco::processStartTime(pid) : 0};
    hosts[r] = e.infos[r].hostId;
  }
  e.nodes = fusco::buildNodeMap(hosts, 1);  // one rank per virtual node
  e.ctx.rank = e.rank;
  e.ctx.nranks = e.nranks;
  e.ctx.nodes = &e.nodes;
  e.ctx.peers = &e.infos;
  e.ctx.chunkBytes = kChunk;
  e.ctx.depth = kDepth;
  e.ctx.timeoutMs = kTimeoutMs;
  e.ctx.commTag = 0xabcdef12345ULL;
  for (int p = 0; p < e.nranks; ++p)
    if (kUcxTransport.score(e.ctx, p) > 0) e.peers.push_back(p);
  UCHECK(static_cast<int>(e.peers.size()) == e.nranks - 1, "ucx scores %zu peers", e.peers.size());
  std::string blob;
  UCHECK(kUcxTransport.setup(e.ctx, e.peers, &e.tc, &blob) == fuscoSuccess, "setup");
  UCHECK(sendStr(e.up, blob), "blob to the parent");
  std::vector<std::string> blobs(e.nranks);
  for (auto& b : blobs) UCHECK(recvStr(e.down, &b, d), "blobs from the parent");
  UCHECK(kUcxTransport.connect(e.tc, blobs) == fuscoSuccess, "connect");
  int rc = body(e);
  kUcxTransport.close(e.tc);
  return rc;
}

// Forks the ranks, relays pids, blobs and barriers, kills the victim after the first barrier and
// expects every other rank to exit 0.
void runRanks(const Options& o, const Body& body) {
  std::vector<pid_t> pids(o.nranks, -1);
  std::vector<int> up(o.nranks, -1), down(o.nranks, -1);
  for (int r = 0; r < o.nranks; ++r) {
    int u[2], dn[2];
    ASSERT_EQ(pipe(u), 0);
    ASSERT_EQ(pipe(dn), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(u[0]);
      close(dn[1]);
      for (int q = 0; q < r; ++q) close(up[q]), close(down[q]);
      gRank = r;
      Env e;
      e.rank = r;
      e.nranks = o.nranks;
      e.up = u[1];
      e.down = dn[0];
      _exit(childMain(e, o, body));
    }
    close(u[1]);
    close(dn[0]);
    pids[r] = pid, up[r] = u[0], down[r] = dn[1];
  }
  std::string pidBytes(reinterpret_cast<const char*>(pids.data()), pids.size() * sizeof(pid_t));
  for (int r = 0; r < o.nranks; ++r) sendStr(down[r], pidBytes);
  Deadline d(3 * kTimeoutMs);
  std::vector<std::string> blobs(o.nranks);
  bool ok = true;
  for (int r = 0; r < o.nranks && ok; ++r) ok = recvStr(up[r], &blobs[r], d);
  for (int r = 0; r < o.nranks && ok; ++r)
    for (auto& b : blobs) ok = ok && sendStr(down[r], b);
  EXPECT_TRUE(ok) << "blob exchange failed";
  std::vector<bool> live(o.nranks, ok);
  for (int round = 0; ok; ++round) {
    int waiting = 0;
    char c;
    for (int r = 0; r < o.nranks; ++r)
      if (live[r] && !(live[r] = readAll(up[r], &c, 1, d) && c == 'B')) continue;
    for (int r = 0; r < o.nranks; ++r) waiting += live[r];
    if (waiting == 0) break;
    for (int r = 0; r < o.nranks; ++r) {
      char g = 'G';
      if (live[r]) writeAll(down[r], &g, 1);
    }
    if (round == 0 && o.victim >= 0) {
      kill(pids[o.victim], SIGKILL);
      live[o.victim] = false;
    }
  }
  for (int r = 0; r < o.nranks; ++r) close(up[r]), close(down[r]);
  for (int r = 0; r < o.nranks; ++r) {
    int st = 0;
    Deadline w(kTimeoutMs);
    while (waitpid(pids[r], &st, WNOHANG) == 0) {
      if (w.expired()) {
        kill(pids[r], SIGKILL);
        waitpid(pids[r], &st, 0);
        break;
      }
      usleep(1000);
    }
    if (r == o.victim) continue;
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "rank " << r << " failed (status " << st << ")";
  }
}

// ---------------------------------------------------------------- message content

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

struct Msg {
  uint32_t tag;
  size_t len;
  uint64_t seed;
};

Msg message(int src, int dst, uint64_t idx) {
  uint64_t h = mix(0x5eedULL ^ (uint64_t(src) << 48) ^ (uint64_t(dst) << 32) ^ idx);
  size_t lens[] = {0, 1, kChunk, kChunk - 1, 8};
  size_t len = idx % 7 < 5 ? lens[idx % 7] : static_cast<size_t>(h % (kChunk + 1));
  return {static_cast<uint32_t>(h >> 32), len, mix(h)};
}

void fillPayload(uint8_t* p, const Msg& m) {
  uint64_t s = m.seed;
  for (size_t i = 0; i < m.len; ++i) {
    if (i % 8 == 0) s = mix(s);
    p[i] = static_cast<uint8_t>(s >> (8 * (i % 8)));
  }
}

// Every rank sends `count` messages to every peer and checks every message it receives.
int exchangeAll(Env& e, uint64_t count) {
  std::vector<uint64_t> sent(e.nranks, 0), got(e.nranks, 0);
  std::vector<uint8_t> expect(kChunk);
  Deadline d(kTimeoutMs);
  size_t done = 0, want = 2 * e.peers.size();
  while (done < want) {
    UCHECK(!d.expired(), "timed out");
    done = 0;
    for (int p : e.peers) {
      void* buf = nullptr;
      size_t cap = 0;
      if (sent[p] < count)
        UCHECK(kUcxTransport.sendAcquire(e.tc, p, &buf, &cap) == fuscoSuccess, "acquire");
      if (buf != nullptr) {
        UCHECK(cap == kChunk, "capacity %zu", cap);
        Msg m = message(e.rank, p, sent[p]);
        fillPayload(static_cast<uint8_t*>(buf), m);
        UCHECK(kUcxTransport.sendPost(e.tc, p, m.tag, m.len) == fuscoSuccess, "post");
        ++sent[p];
      }
      const void* in = nullptr;
      size_t len = 0;
      uint32_t tag = 0;
      UCHECK(kUcxTransport.recvPoll(e.tc, p, &in, &len, &tag) == fuscoSuccess, "poll");
      if (in != nullptr) {
        UCHECK(got[p] < count, "extra message from %d", p);
        Msg m = message(p, e.rank, got[p]);
        UCHECK(len == m.len && tag == m.tag, "message %llu from %d: len %zu tag %u, want %zu %u",
               (unsigned long long)got[p], p, len, tag, m.len, m.tag);
        fillPayload(expect.data(), m);
        UCHECK(memcmp(in, expect.data(), len) == 0, "payload %llu from %d differs",
               (unsigned long long)got[p], p);
        UCHECK(kUcxTransport.recvRelease(e.tc, p) == fuscoSuccess, "release");
        ++got[p];
      }
      done += (sent[p] == count) + (got[p] == count);
    }
  }
  return 0;
}

// Polls checkPeer(peer) until it fails; returns its result and the time it took.
fuscoResult_t waitForFailure(Env& e, int peer, int64_t* ms) {
  int64_t t0 = nowNs();
  Deadline d(kTimeoutMs);
  fuscoResult_t r;
  while ((r = kUcxTransport.checkPeer(e.tc, peer)) == fuscoSuccess && !d.expired()) usleep(1000);
  *ms = (nowNs() - t0) / 1000000;
  return r;
}

TEST(UcxTransport, TwoRanksExchangeOrderedMessagesBothWays) {
  runRanks({2}, [](Env& e) { return exchangeAll(e, 40); });
}

TEST(UcxTransport, FourRanksExchangeBetweenEveryPair) {
  runRanks({4}, [](Env& e) { return exchangeAll(e, 25); });
}

TEST(UcxTransport, SenderNeverHasMoreThanDepthUnreleased) {
  runRanks({2}, [](Env& e) {
    if (e.rank == 0) {
      for (int i = 0; i < kDepth; ++i) {
        void* buf = nullptr;
        size_t cap;
        Deadline d(kTimeoutMs);
        while (buf == nullptr && !d.expired())
          UCHECK(kUcxTransport.sendAcquire(e.tc, 1, &buf, &cap) == fuscoSuccess, "acquire");
        UCHECK(buf != nullptr, "slot %d", i);
        UCHECK(kUcxTransport.sendPost(e.tc, 1, 100 + i, 1) == fuscoSuccess, "post");
      }
      Deadline d(300);  // the receiver holds every message: no slot may appear
      while (!d.expired()) {
        void* buf = nullptr;
        size_t cap;
        UCHECK(kUcxTransport.sendAcquire(e.tc, 1, &buf, &cap) == fuscoSuccess, "acquire");
        UCHECK(buf == nullptr, "a slot beyond depth %d", kDepth);
      }
      UCHECK(e.barrier(), "barrier");  // receiver releases one now
      void* buf = nullptr;
      size_t cap;
      Deadline w(kTimeoutMs);
      while (buf == nullptr && !w.expired())
        UCHECK(kUcxTransport.sendAcquire(e.tc, 1, &buf, &cap) == fuscoSuccess, "acquire");
      UCHECK(buf != nullptr, "no slot after a release");
      UCHECK(kUcxTransport.sendPost(e.tc, 1, 200, 0) == fuscoSuccess, "post");
      return e.barrier() ? 0 : 1;
    }
    const void* in = nullptr;
    size_t len;
    uint32_t tag;
    Deadline d(kTimeoutMs);
    while (in == nullptr && !d.expired())
      UCHECK(kUcxTransport.recvPoll(e.tc, 0, &in, &len, &tag) == fuscoSuccess, "poll");
    UCHECK(in != nullptr && tag == 100, "first message (tag %u)", tag);
    UCHECK(e.barrier(), "barrier");
    UCHECK(kUcxTransport.recvRelease(e.tc, 0) == fuscoSuccess, "release");
    for (uint32_t want : {101u, 102u, 200u}) {
      in = nullptr;
      while (in == nullptr && !d.expired())
        UCHECK(kUcxTransport.recvPoll(e.tc, 0, &in, &len, &tag) == fuscoSuccess, "poll");
      UCHECK(in != nullptr && tag == want, "tag %u, want %u", tag, want);
      UCHECK(kUcxTransport.recvRelease(e.tc, 0) == fuscoSuccess, "release");
    }
    return e.barrier() ? 0 : 1;
  });
}

int survivorBody(Env& e, int victim) {
  if (exchangeAll(e, 5) != 0) return 1;
  UCHECK(e.barrier(), "barrier");  // the parent kills the victim now
  if (e.rank == victim) pause();
  int64_t ms;
  fuscoResult_t r = waitForFailure(e, victim, &ms);
  UCHECK(r == fuscoRemoteError, "checkPeer(%d) gave %d after %lld ms", victim, r, (long long)ms);
  UCHECK(ms < 3000, "noticed the death after %lld ms", (long long)ms);
  UCHECK(fusco::threadLastError().find("rank " + std::to_string(victim)) != std::string::npos,
         "message does not name the rank");
  int64_t t0 = nowNs();
  kUcxTransport.close(e.tc);
  e.tc = nullptr;
  UCHECK((nowNs() - t0) / 1000000 < 3000, "close took %lld ms", (long long)((nowNs() - t0) / 1000000));
  return 0;
}

TEST(UcxTransport, KilledPeerIsReportedAndCloseReturns) {
  runRanks({3, 2, true}, [](Env& e) { return survivorBody(e, 2); });
}

TEST(UcxTransport, KilledPeerIsNoticedByUcxAlone) {
  runRanks({3, 1, false}, [](Env& e) { return survivorBody(e, 1); });
}

TEST(UcxTransport, AbortReasonTravelsToPeers) {
  runRanks({3}, [](Env& e) {
    if (exchangeAll(e, 3) != 0) return 1;
    UCHECK(e.barrier(), "barrier");
    if (e.rank == 1) {
      kUcxTransport.markAborted(e.tc, "bad expert id 77 on rank 1");
      kUcxTransport.markAborted(e.tc, "second reason");  // the first stays
    } else {
      int64_t ms;
      fuscoResult_t r = waitForFailure(e, 1, &ms);
      UCHECK(r == fuscoRemoteError, "checkPeer(1) gave %d", r);
      const std::string& msg = fusco::threadLastError();
      UCHECK(msg.find("rank 1") != std::string::npos &&
                 msg.find("aborted: bad expert id 77 on rank 1") != std::string::npos,
             "message: %s", msg.c_str());
      int other = e.rank == 0 ? 2 : 0;
      UCHECK(kUcxTransport.checkPeer(e.tc, other) == fuscoSuccess, "healthy peer %d", other);
    }
    return e.barrier() ? 0 : 1;
  });
}

TEST(UcxTransport, ScoresOnlyPeersOnOtherNodes) {
  std::vector<std::string> hosts = {"h/a", "h/a", "h/a", "h/a"};
  fusco::NodeMap nodes = fusco::buildNodeMap(hosts, 2);
  std::vector<fusco::PeerInfo> infos(4);
  fusco::TransportContext ctx;
  ctx.rank = 0;
  ctx.nranks = 4;
  ctx.nodes = &nodes;
  ctx.peers = &infos;
  EXPECT_LT(kUcxTransport.score(ctx, 0), 0);
  EXPECT_LT(kUcxTransport.score(ctx, 1), 0);
  EXPECT_GT(kUcxTransport.score(ctx, 2), 1);
  ctx.memType = fuscoMemCuda;
  EXPECT_LT(kUcxTransport.score(ctx, 2), 0);
  EXPECT_EQ(kUcxTransport.memAlloc, nullptr);
  EXPECT_EQ(kUcxTransport.peerPointer, nullptr);
}

}  // namespace
#endif  // FUSCO_HAVE_UCX
