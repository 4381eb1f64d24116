// What only the shared-memory transport has, across real processes: scores by host, the memfd
// segment and its arena, region tokens and peer pointers into the arena, and liveness through
// /proc (a killed, an unreaped and an exited peer). The channel itself (order, credits, sizes,
// death, abort, close) is checked for every transport by test_transport_conformance.cc.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/liveness.h"
#include "core/params.h"
#include "core/result.h"
#include "core/topology.h"
#include "harness/transport_group.h"
#include "transport/transport.h"

namespace fusco {
extern const TransportOps kShmTransport;
}

namespace {

using fusco::Deadline;
using fusco::kShmTransport;
using fusco::PeerInfo;
using fusco::TransportComm;
using fusco::TransportContext;
using fusco::test::transport::buildEnv;
using fusco::test::transport::Group;
using fusco::test::transport::kTimeoutMs;
using fusco::test::transport::Options;
using fusco::test::transport::RankEnv;
using fusco::test::transport::runChildren;
using fusco::test::transport::WatchedChild;

// ---------------------------------------------------------------- in-process helpers

struct LocalRank {
  std::vector<PeerInfo> infos;
  fusco::NodeMap nodes;
  TransportContext ctx;
  TransportComm* tc = nullptr;
  std::string blob;

  fuscoResult_t open() {
    infos = {{fusco::localHostId(), getpid(), fusco::processStartTime(getpid())}};
    nodes = fusco::buildNodeMap({infos[0].hostId}, 0);
    ctx.rank = 0;
    ctx.nranks = 1;
    ctx.nodes = &nodes;
    ctx.peers = &infos;
    ctx.chunkBytes = 4096;
    ctx.depth = 2;
    ctx.commTag = 7;
    fuscoResult_t r = kShmTransport.setup(ctx, {}, &tc, &blob);
    if (r != fuscoSuccess) return r;
    return kShmTransport.connect(tc, {blob});
  }
  ~LocalRank() { kShmTransport.close(tc); }
};

std::set<std::string> listDir(const char* dir) {
  std::set<std::string> out;
  if (DIR* d = opendir(dir)) {
    while (dirent* ent = readdir(d)) out.insert(ent->d_name);
    closedir(d);
  }
  return out;
}

// The fds of this process that are fusco memfd segments.
std::vector<int> fuscoMemfds() {
  std::vector<int> fds;
  for (const std::string& name : listDir("/proc/self/fd")) {
    char link[256] = {0};
    std::string path = "/proc/self/fd/" + name;
    ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
    if (n > 0 && strstr(link, "memfd:fusco-shm") != nullptr) fds.push_back(atoi(name.c_str()));
  }
  return fds;
}

// Small arenas for the tests, through the environment so that nothing outlives the test.
class ShmTransport : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* old = getenv("FUSCO_SHM_ARENA_BYTES");
    hadOld_ = old != nullptr;
    if (hadOld_) old_ = old;
    setArena("16M");
  }
  void TearDown() override {
    if (hadOld_)
      setenv("FUSCO_SHM_ARENA_BYTES", old_.c_str(), 1);
    else
      unsetenv("FUSCO_SHM_ARENA_BYTES");
    fusco::paramsReload();
  }
  // nullptr: the default (4 GiB, sparse).
  static void setArena(const char* v) {
    if (v != nullptr)
      setenv("FUSCO_SHM_ARENA_BYTES", v, 1);
    else
      unsetenv("FUSCO_SHM_ARENA_BYTES");
    fusco::paramsReload();
  }

 private:
  bool hadOld_ = false;
  std::string old_;
};

}  // namespace

// ---------------------------------------------------------------- tests

TEST_F(ShmTransport, ScoresSameHostPeersAndNeverSelf) {
  std::vector<PeerInfo> infos = {
      {"hostA", 1, 0}, {"hostA", 2, 0}, {"hostA", 3, 0}, {"hostB", 4, 0}};
  fusco::NodeMap byHost = fusco::buildNodeMap({"hostA", "hostA", "hostA", "hostB"}, 0);
  fusco::NodeMap virt = fusco::buildNodeMap({"hostA", "hostA", "hostA", "hostB"}, 2);
  TransportContext ctx;
  ctx.rank = 1;
  ctx.nranks = 4;
  ctx.peers = &infos;
  ctx.nodes = &byHost;
  EXPECT_EQ(kShmTransport.score(ctx, 0), 10);
  EXPECT_EQ(kShmTransport.score(ctx, 2), 10);
  EXPECT_LT(kShmTransport.score(ctx, 1), 0);  // self: the engine copies
  EXPECT_LT(kShmTransport.score(ctx, 3), 0);  // another host
  ctx.nodes = &virt;                          // rank 2 is on another virtual node, same host
  EXPECT_EQ(kShmTransport.score(ctx, 0), 10);
  EXPECT_EQ(kShmTransport.score(ctx, 2), 1);
  ctx.memType = fuscoMemCuda;
  EXPECT_LT(kShmTransport.score(ctx, 0), 0);
  EXPECT_STREQ(kShmTransport.name, "shm");
}

TEST_F(ShmTransport, SegmentIsOwnerOnlyMemfdAndLeavesNothingInDevShm) {
  setArena(nullptr);  // the default 4 GiB arena costs only the pages touched
  std::set<std::string> before = listDir("/dev/shm");
  std::vector<int> fdsBefore = fuscoMemfds();
  {
    LocalRank r;
    ASSERT_EQ(r.open(), fuscoSuccess) << fusco::threadLastError();
    std::vector<int> fds = fuscoMemfds();
    ASSERT_EQ(fds.size(), fdsBefore.size() + 1);
    struct stat st;
    ASSERT_EQ(fstat(fds.back(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_GE(static_cast<uint64_t>(st.st_size), 4ull << 30);          // header + the 4 GiB arena
    EXPECT_LE(static_cast<uint64_t>(st.st_blocks) * 512, 1ull << 20);  // sparse: little used
    void* p = nullptr;
    ASSERT_EQ(kShmTransport.memAlloc(r.tc, 3ull << 30, &p), fuscoSuccess);
    ASSERT_EQ(kShmTransport.memFree(r.tc, p), fuscoSuccess);
    for (const std::string& name : listDir("/dev/shm")) {
      EXPECT_TRUE(before.count(name) || name.find("fusco") == std::string::npos) << name;
    }
  }
  EXPECT_EQ(fuscoMemfds().size(), fdsBefore.size());  // close released the segment
  kShmTransport.close(nullptr);                       // and close tolerates nullptr
}

TEST_F(ShmTransport, ArenaIsFirstFitCoalescesAndReportsExhaustion) {
  setArena("1M");
  LocalRank r;
  ASSERT_EQ(r.open(), fuscoSuccess) << fusco::threadLastError();
  TransportComm* tc = r.tc;
  void *a = nullptr, *b = nullptr, *c = nullptr, *d = nullptr;
  ASSERT_EQ(kShmTransport.memAlloc(tc, 100, &a), fuscoSuccess);
  ASSERT_EQ(kShmTransport.memAlloc(tc, 300, &b), fuscoSuccess);
  ASSERT_EQ(kShmTransport.memAlloc(tc, 4096, &c), fuscoSuccess);
  for (void* p : {a, b, c}) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
  memset(c, 0xab, 4096);  // the memory is usable
  ASSERT_EQ(kShmTransport.memFree(tc, b), fuscoSuccess);
  ASSERT_EQ(kShmTransport.memAlloc(tc, 200, &d), fuscoSuccess);
  EXPECT_EQ(d, b);  // first fit reuses the hole
  EXPECT_EQ(kShmTransport.memFree(tc, d), fuscoSuccess);
  EXPECT_EQ(kShmTransport.memFree(tc, d), fuscoInvalidArgument);  // double free
  int onStack = 0;
  EXPECT_EQ(kShmTransport.memFree(tc, &onStack), fuscoInvalidArgument);
  EXPECT_EQ(kShmTransport.memFree(tc, static_cast<char*>(c) + 256), fuscoInvalidArgument);
  ASSERT_EQ(kShmTransport.memFree(tc, a), fuscoSuccess);
  ASSERT_EQ(kShmTransport.memFree(tc, c), fuscoSuccess);
  // Everything was freed in an order that needs merging on both sides: the whole arena is one
  // block again.
  void* all = nullptr;
  ASSERT_EQ(kShmTransport.memAlloc(tc, 1 << 20, &all), fuscoSuccess) << fusco::threadLastError();
  EXPECT_EQ(all, a);
  void* more = nullptr;
  EXPECT_EQ(kShmTransport.memAlloc(tc, 1, &more), fuscoSystemError);
  EXPECT_NE(fusco::threadLastError().find("shared arena exhausted: asked 1 bytes, largest free 0"),
            std::string::npos)
      << fusco::threadLastError();
  EXPECT_NE(fusco::threadLastError().find("FUSCO_SHM_ARENA_BYTES"), std::string::npos);
  ASSERT_EQ(kShmTransport.memFree(tc, all), fuscoSuccess);
  EXPECT_EQ(kShmTransport.memAlloc(tc, (1 << 20) + 1, &more), fuscoSystemError);
}

TEST_F(ShmTransport, RegionTokenCoversExactlyTheArena) {
  setArena("1M");
  LocalRank r;
  ASSERT_EQ(r.open(), fuscoSuccess) << fusco::threadLastError();
  void *a = nullptr, *b = nullptr;
  ASSERT_EQ(kShmTransport.memAlloc(r.tc, 1000, &a), fuscoSuccess);
  ASSERT_EQ(kShmTransport.memAlloc(r.tc, 1000, &b), fuscoSuccess);
  uint64_t ta = ~0ull, tb = ~0ull, tmid = ~0ull, tend = 0;
  ASSERT_TRUE(kShmTransport.regionToken(r.tc, a, 1000, &ta));
  ASSERT_TRUE(kShmTransport.regionToken(r.tc, b, 1000, &tb));
  EXPECT_EQ(tb - ta, static_cast<uint64_t>(static_cast<char*>(b) - static_cast<char*>(a)));
  // Inside an allocation (not at its start) and across two allocations: still the arena.
  ASSERT_TRUE(kShmTransport.regionToken(r.tc, static_cast<char*>(a) + 10, 1500, &tmid));
  EXPECT_EQ(tmid, ta + 10);
  EXPECT_TRUE(
      kShmTransport.regionToken(r.tc, static_cast<char*>(a) - ta + (1 << 20) - 8, 8, &tend));
  int onStack = 0;
  uint64_t t;
  EXPECT_FALSE(kShmTransport.regionToken(r.tc, &onStack, sizeof(onStack), &t));
  EXPECT_FALSE(kShmTransport.regionToken(r.tc, static_cast<char*>(a) - ta + (1 << 20) - 8, 9, &t));
  EXPECT_FALSE(kShmTransport.regionToken(r.tc, static_cast<char*>(a) - ta - 1, 2, &t));
  EXPECT_FALSE(kShmTransport.regionToken(nullptr, a, 1, &t));
  EXPECT_EQ(kShmTransport.peerPointer(r.tc, 0, 0, 1), nullptr);  // self is never an shm peer
}

// Each rank allocates a buffer, sends its token to every peer; each peer writes its own stripe
// through peerPointer and then says "done"; the owner sees every stripe in its own memory.
TEST_F(ShmTransport, PeersWriteIntoEachOthersArenaThroughPeerPointer) {
  Options o;
  o.nranks = 3;
  runChildren(o, [](RankEnv& e) {
    const size_t stripe = 10000;
    void* mine = nullptr;
    CHILD_CHECK(kShmTransport.memAlloc(e.tc, stripe * e.nranks, &mine) == fuscoSuccess, "alloc");
    memset(mine, 0, stripe * e.nranks);
    uint64_t token = 0;
    CHILD_CHECK(kShmTransport.regionToken(e.tc, mine, stripe * e.nranks, &token), "token");
    Deadline d(kTimeoutMs);
    auto sendU64 = [&](int p, uint64_t v) {
      void* buf = nullptr;
      size_t cap = 0;
      while (buf == nullptr && !d.expired()) {
        if (kShmTransport.sendAcquire(e.tc, p, &buf, &cap) != fuscoSuccess) return false;
      }
      if (buf == nullptr) return false;
      memcpy(buf, &v, sizeof(v));
      return kShmTransport.sendPost(e.tc, p, 7, sizeof(v)) == fuscoSuccess;
    };
    auto recvU64 = [&](int p, uint64_t* v) {
      const void* in = nullptr;
      size_t len = 0;
      uint32_t tag = 0;
      while (in == nullptr && !d.expired()) {
        if (kShmTransport.recvPoll(e.tc, p, &in, &len, &tag) != fuscoSuccess) return false;
        if (in == nullptr) sched_yield();
      }
      if (in == nullptr || len != sizeof(*v) || tag != 7) return false;
      memcpy(v, in, sizeof(*v));
      return kShmTransport.recvRelease(e.tc, p) == fuscoSuccess;
    };
    for (int p : e.peers) CHILD_CHECK(sendU64(p, token), "send token to %d", p);
    for (int p : e.peers) {
      uint64_t t = 0;
      CHILD_CHECK(recvU64(p, &t), "token from %d", p);
      auto dst = static_cast<uint8_t*>(kShmTransport.peerPointer(e.tc, p, t, stripe * e.nranks));
      CHILD_CHECK(dst != nullptr, "peerPointer(%d)", p);
      CHILD_CHECK(kShmTransport.peerPointer(e.tc, p, 16u << 20, 1) == nullptr, "out of bounds");
      for (size_t i = 0; i < stripe; ++i)
        dst[e.rank * stripe + i] = static_cast<uint8_t>(e.rank + 1 + i);
      CHILD_CHECK(sendU64(p, 1), "done to %d", p);
    }
    for (int p : e.peers) {
      uint64_t doneFlag = 0;
      CHILD_CHECK(recvU64(p, &doneFlag) && doneFlag == 1, "done from %d", p);
      const uint8_t* s = static_cast<const uint8_t*>(mine) + p * stripe;
      for (size_t i = 0; i < stripe; ++i)
        CHILD_CHECK(s[i] == static_cast<uint8_t>(p + 1 + i), "byte %zu of rank %d's stripe", i, p);
    }
    CHILD_CHECK(kShmTransport.memFree(e.tc, mine) == fuscoSuccess, "free");
    return 0;
  });
}

TEST_F(ShmTransport, CheckPeerReportsKilledPeerBeforeAndAfterReaping) {
  WatchedChild w;
  ASSERT_TRUE(w.start([](RankEnv& e) { return e.barrier() ? 0 : 1; }));  // blocks until killed
  EXPECT_EQ(kShmTransport.checkPeer(w.self.tc, 1), fuscoSuccess) << fusco::threadLastError();
  ASSERT_EQ(kill(w.g.pid(1), SIGKILL), 0);
  ASSERT_TRUE(w.g.waitZombie(1));  // dead but not reaped: /proc still lists it (state Z)
  EXPECT_EQ(w.waitForFailure(), fuscoRemoteError);
  std::string msg = fusco::threadLastError();
  EXPECT_NE(msg.find("rank 1 (pid " + std::to_string(w.g.pid(1))), std::string::npos) << msg;
  EXPECT_NE(msg.find("died"), std::string::npos) << msg;
  EXPECT_EQ(w.g.reapOne(1), -1);
  EXPECT_EQ(kShmTransport.checkPeer(w.self.tc, 1), fuscoRemoteError);
  // The dead peer's ring and arena stay mapped: using them must not crash.
  void* buf = nullptr;
  size_t cap = 0;
  EXPECT_EQ(kShmTransport.sendAcquire(w.self.tc, 1, &buf, &cap), fuscoSuccess);
}

TEST_F(ShmTransport, CheckPeerCountsUnreapedZombieAsDead) {
  WatchedChild w;
  ASSERT_TRUE(w.start([](RankEnv&) { return 0; }));  // exits right after connecting
  ASSERT_TRUE(w.g.waitZombie(1));
  EXPECT_EQ(kShmTransport.checkPeer(w.self.tc, 1), fuscoRemoteError);
  EXPECT_NE(fusco::threadLastError().find("died"), std::string::npos) << fusco::threadLastError();
  EXPECT_EQ(w.g.reapOne(1), 0);
}

TEST_F(ShmTransport, ConnectToExitedPeerIsSystemErrorNamingIt) {
  Options o;
  o.nranks = 2;
  o.parentIsRank0 = true;
  o.exitAfterSetup = true;
  Group g;
  ASSERT_TRUE(g.start(o, [](RankEnv&) { return 0; }));
  RankEnv self;
  buildEnv(&self, 0, g.pids(), o);
  std::string blob;
  std::vector<std::string> blobs;
  ASSERT_EQ(kShmTransport.setup(self.ctx, self.peers, &self.tc, &blob), fuscoSuccess);
  ASSERT_TRUE(g.exchangeBlobs(blob, &blobs));
  EXPECT_EQ(g.reapOne(1), 0);  // gone, and its segment with it
  EXPECT_EQ(kShmTransport.connect(self.tc, blobs), fuscoSystemError);
  std::string msg = fusco::threadLastError();
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file"), std::string::npos) << msg;
  kShmTransport.markAborted(self.tc, "test");
  kShmTransport.close(self.tc);  // after a failed connect, with the peer dead
}
