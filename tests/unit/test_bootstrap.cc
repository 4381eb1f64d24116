// TCP bootstrap: ranks run as threads of this process (the listen table is process-global, so
// rank 0's thread finds the socket fuscoGetUniqueId opened), with short timeouts.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/bootstrap.h"
#include "core/log.h"
#include "core/params.h"
#include "core/result.h"
#include "core/socket.h"

namespace {

using fusco::Bootstrap;

struct RankOut {
  fuscoResult_t r = fuscoInternalError;
  std::string err;
  std::vector<std::string> blobs;
  std::unique_ptr<Bootstrap> b;
  int64_t ms = 0;
};

struct RankArgs {
  int nranks;
  int rank;
};

int64_t msSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               t0)
      .count();
}

std::string blobOf(int rank) {
  // Different sizes, one of them empty, so the table encoding is exercised.
  return std::string(static_cast<size_t>(rank) * 777 % 5000, static_cast<char>('a' + rank % 26));
}

// Runs Bootstrap::init for each (nranks, rank) in its own thread and waits for all of them.
std::vector<RankOut> runInit(const fuscoUniqueId& id, const std::vector<RankArgs>& ranks,
                             int64_t timeoutMs) {
  std::vector<RankOut> out(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      fusco::clearThreadLastError();
      auto t0 = std::chrono::steady_clock::now();
      out[i].r = Bootstrap::init(id, ranks[i].nranks, ranks[i].rank, timeoutMs,
                                 blobOf(ranks[i].rank), &out[i].b, &out[i].blobs);
      out[i].ms = msSince(t0);
      out[i].err = fusco::threadLastError();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

std::vector<RankArgs> allRanks(int n) {
  std::vector<RankArgs> v;
  for (int r = 0; r < n; ++r) v.push_back({n, r});
  return v;
}

fuscoUniqueId newId() {
  fuscoUniqueId id;
  EXPECT_EQ(fusco::bootstrapCreateId(&id), fuscoSuccess);
  return id;
}

// Runs fn(rank, bootstrap) on every rank concurrently; returns the results.
std::vector<fuscoResult_t> onAll(std::vector<RankOut>& ranks,
                                 const std::function<fuscoResult_t(int, Bootstrap*)>& fn) {
  std::vector<fuscoResult_t> res(ranks.size(), fuscoInternalError);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i)
    threads.emplace_back([&, i] { res[i] = fn(static_cast<int>(i), ranks[i].b.get()); });
  for (auto& t : threads) t.join();
  return res;
}

// The id's root address, read from the documented id layout (family u16 at 12, port u16 at 14,
// IPv4 address at 16).
sockaddr_in idAddr(const fuscoUniqueId& id) {
  const auto* p = reinterpret_cast<const unsigned char*>(id.internal);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(p[14] | (p[15] << 8)));
  memcpy(&a.sin_addr, p + 16, 4);
  return a;
}

int rawConnect(const fuscoUniqueId& id) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = idAddr(id);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void putLe(unsigned char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

// A HELLO header as the wire format defines it: "FUSCOHLO", secret, nranks, rank, blobLen.
std::string helloHeader(uint64_t secret, int nranks, int rank, uint64_t blobLen) {
  unsigned char h[32];
  memcpy(h, "FUSCOHLO", 8);
  putLe(h + 8, secret, 8);
  putLe(h + 16, static_cast<uint32_t>(nranks), 4);
  putLe(h + 20, static_cast<uint32_t>(rank), 4);
  putLe(h + 24, blobLen, 8);
  return std::string(reinterpret_cast<char*>(h), 32);
}

uint64_t idSecret(const fuscoUniqueId& id) {
  uint64_t s = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(id.internal);
  for (int i = 7; i >= 0; --i) s = (s << 8) | p[32 + i];
  return s;
}

void sendStr(int fd, const std::string& s) {
  ASSERT_EQ(send(fd, s.data(), s.size(), MSG_NOSIGNAL), static_cast<ssize_t>(s.size()));
}

// Redirects the library log to a file for the lifetime of the object.
class LogCapture {
 public:
  LogCapture() {
    char tmpl[] = "/tmp/fusco_boot_log_XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd >= 0) close(fd);
    path_ = tmpl;
    fusco::paramSetOverride("FUSCO_DEBUG_FILE", path_);
    fusco::logConfigure();
  }
  ~LogCapture() {
    fusco::paramClearOverride("FUSCO_DEBUG_FILE");
    fusco::logConfigure();
    unlink(path_.c_str());
  }
  std::string text() const {
    std::ifstream f(path_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

 private:
  std::string path_;
};

void expectAllGatherWorks(int n) {
  SCOPED_TRACE("nranks=" + std::to_string(n));
  fuscoUniqueId id = newId();
  auto ranks = runInit(id, allRanks(n), 3000);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(ranks[r].r, fuscoSuccess) << "rank " << r << ": " << ranks[r].err;
    ASSERT_EQ(static_cast<int>(ranks[r].blobs.size()), n);
    for (int p = 0; p < n; ++p) EXPECT_EQ(ranks[r].blobs[p], blobOf(p)) << r << " sees " << p;
    EXPECT_EQ(ranks[r].b->rank(), r);
    EXPECT_EQ(ranks[r].b->nranks(), n);
  }
  // A second allGather with other sizes, then a barrier, on the kept connections.
  std::vector<std::vector<std::string>> got(n);
  auto res = onAll(ranks, [&](int r, Bootstrap* b) {
    return b->allGather(std::string(static_cast<size_t>(n - r) * 100, 'x'), &got[r]);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(res[r], fuscoSuccess) << "rank " << r;
    ASSERT_EQ(static_cast<int>(got[r].size()), n);
    for (int p = 0; p < n; ++p) EXPECT_EQ(got[r][p].size(), static_cast<size_t>(n - p) * 100);
  }
  res = onAll(ranks, [](int, Bootstrap* b) { return b->barrier(); });
  for (int r = 0; r < n; ++r) EXPECT_EQ(res[r], fuscoSuccess) << "rank " << r;
}

TEST(Bootstrap, AllGatherDifferentSizeBlobsOn1To8Ranks) {
  for (int n : {1, 2, 5, 8}) expectAllGatherWorks(n);
}

TEST(Bootstrap, LargeBlobsAreGathered) {
  fuscoUniqueId id = newId();
  auto ranks = runInit(id, allRanks(3), 5000);
  for (auto& r : ranks) ASSERT_EQ(r.r, fuscoSuccess) << r.err;
  std::vector<std::vector<std::string>> got(3);
  auto res = onAll(ranks, [&](int r, Bootstrap* b) {
    return b->allGather(std::string((2u << 20) + r, static_cast<char>('0' + r)), &got[r]);
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(res[r], fuscoSuccess);
    for (int p = 0; p < 3; ++p) EXPECT_EQ(got[r][p], std::string((2u << 20) + p, '0' + p));
  }
}

TEST(Bootstrap, WrongSecretIsRefusedAndLogged) {
  LogCapture log;
  fuscoUniqueId id = newId();
  int fd = rawConnect(id);
  ASSERT_GE(fd, 0);
  sendStr(fd, helloHeader(idSecret(id) ^ 1, 3, 1, 0));
  auto ranks = runInit(id, allRanks(3), 3000);
  for (auto& r : ranks) EXPECT_EQ(r.r, fuscoSuccess) << r.err;
  close(fd);
  std::string text = log.text();
  EXPECT_NE(text.find("refused bootstrap connection from"), std::string::npos) << text;
  EXPECT_NE(text.find("bad secret"), std::string::npos) << text;
}

TEST(Bootstrap, GarbageTruncatedAndOversizedHellosAreRefused) {
  LogCapture log;
  fuscoUniqueId id = newId();
  std::vector<int> fds;
  for (int i = 0; i < 5; ++i) {
    fds.push_back(rawConnect(id));
    ASSERT_GE(fds.back(), 0);
  }
  sendStr(fds[0], std::string(64, '\xab'));                           // garbage
  sendStr(fds[1], helloHeader(idSecret(id), 4, 1, 0).substr(0, 10));  // truncated header...
  shutdown(fds[1], SHUT_WR);                                          // ...then EOF
  sendStr(fds[2], helloHeader(idSecret(id), 4, 2, 1ull << 40));       // absurd blob length
  sendStr(fds[3], helloHeader(0, 4, 3, 1ull << 62));                  // absurd and wrong secret
  // fds[4] says nothing at all and stays open.
  auto ranks = runInit(id, allRanks(4), 3000);
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(ranks[r].r, fuscoSuccess) << "rank " << r << ": " << ranks[r].err;
    for (int p = 0; p < 4; ++p) EXPECT_EQ(ranks[r].blobs[p], blobOf(p));
  }
  for (int fd : fds) close(fd);
  std::string text = log.text();
  EXPECT_NE(text.find("bad magic"), std::string::npos) << text;
  EXPECT_NE(text.find("closed before a complete hello"), std::string::npos) << text;
  EXPECT_NE(text.find("64 MiB limit"), std::string::npos) << text;
  EXPECT_NE(text.find("bad secret"), std::string::npos) << text;
}

TEST(Bootstrap, NranksMismatchFailsEveryRankPromptly) {
  fuscoUniqueId id = newId();
  auto ranks = runInit(id, {{4, 0}, {4, 1}, {5, 2}, {4, 3}}, 3000);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ranks[r].r, fuscoInvalidUsage) << "rank " << r << ": " << ranks[r].err;
    EXPECT_NE(ranks[r].err.find("rank 2 says nranks=5"), std::string::npos) << ranks[r].err;
    EXPECT_NE(ranks[r].err.find("nranks=4"), std::string::npos) << ranks[r].err;
    EXPECT_LT(ranks[r].ms, 1500) << "rank " << r;
  }
}

TEST(Bootstrap, RootNranksMismatchFailsEveryRankPromptly) {
  fuscoUniqueId id = newId();
  auto ranks = runInit(id, {{5, 0}, {4, 1}, {4, 2}, {4, 3}}, 3000);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ranks[r].r, fuscoInvalidUsage) << "rank " << r << ": " << ranks[r].err;
    EXPECT_LT(ranks[r].ms, 1500) << "rank " << r;
  }
}

TEST(Bootstrap, MissingRankTimesOutNamingIt) {
  fuscoUniqueId id = newId();
  auto ranks = runInit(id, {{4, 0}, {4, 1}, {4, 3}}, 1000);
  for (auto& r : ranks) {
    EXPECT_EQ(r.r, fuscoTimeout) << r.err;
    EXPECT_NE(r.err.find("rank 2 of 4 did not connect to root"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("within 1000 ms"), std::string::npos) << r.err;
    EXPECT_GE(r.ms, 900);
    EXPECT_LT(r.ms, 2500);
  }
}

TEST(Bootstrap, RankOutOfRangeIsInvalidArgumentForItAndFailsTheRest) {
  fuscoUniqueId id = newId();
  auto ranks = runInit(id, {{3, 0}, {3, 1}, {3, 7}}, 3000);
  EXPECT_EQ(ranks[2].r, fuscoInvalidArgument) << ranks[2].err;
  EXPECT_NE(ranks[2].err.find("rank 7 is out of range"), std::string::npos) << ranks[2].err;
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(ranks[i].r, fuscoInvalidUsage) << ranks[i].err;
    EXPECT_NE(ranks[i].err.find("rank 7"), std::string::npos) << ranks[i].err;
    EXPECT_LT(ranks[i].ms, 1500);
  }
}

TEST(Bootstrap, DuplicateRankIsInvalidUsageForEveryone) {
  fuscoUniqueId id = newId();
  auto ranks = runInit(id, {{3, 0}, {3, 1}, {3, 1}}, 3000);
  for (auto& r : ranks) {
    EXPECT_EQ(r.r, fuscoInvalidUsage) << r.err;
    EXPECT_NE(r.err.find("rank 1 joined twice"), std::string::npos) << r.err;
    EXPECT_LT(r.ms, 1500);
  }
}

TEST(Bootstrap, IdWithBadMagicOrVersionIsInvalidArgument) {
  fuscoUniqueId id = newId();
  EXPECT_EQ(fusco::bootstrapCheckId(id), fuscoSuccess);
  fuscoUniqueId bad = id;
  bad.internal[0] ^= 0x5a;
  fusco::clearThreadLastError();
  EXPECT_EQ(fusco::bootstrapCheckId(bad), fuscoInvalidArgument);
  EXPECT_NE(fusco::threadLastError().find("magic"), std::string::npos);
  std::unique_ptr<Bootstrap> b;
  std::vector<std::string> all;
  EXPECT_EQ(Bootstrap::init(bad, 1, 0, 1000, "", &b, &all), fuscoInvalidArgument);
  EXPECT_EQ(b, nullptr);
  fuscoUniqueId zero;
  memset(&zero, 0, sizeof(zero));
  EXPECT_EQ(fusco::bootstrapCheckId(zero), fuscoInvalidArgument);
  fuscoUniqueId badVersion = id;
  badVersion.internal[8] = 99;
  EXPECT_EQ(fusco::bootstrapCheckId(badVersion), fuscoInvalidArgument);
  EXPECT_NE(fusco::threadLastError().find("version"), std::string::npos);
  fusco::bootstrapReleaseId(id);
}

TEST(Bootstrap, StaleIdCannotStartASecondCommunicator) {
  fuscoUniqueId id = newId();
  {
    auto ranks = runInit(id, allRanks(2), 1000);
    for (auto& r : ranks) ASSERT_EQ(r.r, fuscoSuccess) << r.err;
  }
  auto t0 = std::chrono::steady_clock::now();
  auto again = runInit(id, allRanks(2), 1000);
  EXPECT_EQ(again[0].r, fuscoInvalidUsage) << again[0].err;
  EXPECT_NE(again[0].err.find("already used"), std::string::npos) << again[0].err;
  EXPECT_NE(again[1].r, fuscoSuccess);
  EXPECT_EQ(again[1].b, nullptr);
  EXPECT_LT(msSince(t0), 2500);
}

TEST(Bootstrap, ReusedIdFailsEveryRankOfThisProcessAtOnce) {
  fuscoUniqueId id = newId();
  {
    auto ranks = runInit(id, allRanks(3), 5000);
    for (auto& r : ranks) ASSERT_EQ(r.r, fuscoSuccess) << r.err;
  }
  auto again = runInit(id, allRanks(3), 5000);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(again[r].r, fuscoInvalidUsage) << "rank " << r << ": " << again[r].err;
    EXPECT_NE(again[r].err.find("already used"), std::string::npos) << again[r].err;
    EXPECT_LT(again[r].ms, 1500) << "rank " << r << " waited for the timeout (5000 ms)";
  }
}

// A rank of another process that comes with an id this process already used as rank 0 gets the
// root's answer instead of waiting for the timeout.
TEST(Bootstrap, ReusedIdIsRefusedToARankThatArrives) {
  fuscoUniqueId id = newId();
  {
    auto ranks = runInit(id, allRanks(2), 3000);
    for (auto& r : ranks) ASSERT_EQ(r.r, fuscoSuccess) << r.err;
  }
  usleep(200 * 1000);  // the first communicator's connections finish closing (the port is free)
  RankOut root;
  std::thread t([&] {
    root.r = Bootstrap::init(id, 2, 0, 5000, blobOf(0), &root.b, &root.blobs);
    root.err = fusco::threadLastError();
  });
  int fd = -1;
  for (int i = 0; i < 200 && fd < 0; ++i) {
    fd = rawConnect(id);
    if (fd < 0) usleep(5000);
  }
  std::string reply;
  if (fd >= 0) {
    sendStr(fd, helloHeader(idSecret(id), 2, 1, 0));
    timeval tv{3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[4096];
    for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) reply.append(buf, n);
    close(fd);
  }
  t.join();
  EXPECT_EQ(root.r, fuscoInvalidUsage) << root.err;
  EXPECT_NE(root.err.find("already used"), std::string::npos) << root.err;
  ASSERT_GE(fd, 0) << "the root never listened for the reused id";
  EXPECT_NE(reply.find("already used"), std::string::npos)
      << "the root's reply: " << reply.size() << " bytes";
}

TEST(Bootstrap, CommTagEqualOnAllRanksAndDiffersBetweenIds) {
  fuscoUniqueId id1 = newId(), id2 = newId();
  auto a = runInit(id1, allRanks(3), 3000);
  auto b = runInit(id2, allRanks(3), 3000);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(a[r].r, fuscoSuccess) << a[r].err;
    ASSERT_EQ(b[r].r, fuscoSuccess) << b[r].err;
    EXPECT_EQ(a[r].b->commTag(), a[0].b->commTag());
    EXPECT_EQ(b[r].b->commTag(), b[0].b->commTag());
  }
  EXPECT_NE(a[0].b->commTag(), b[0].b->commTag());
  EXPECT_NE(a[0].b->commTag(), idSecret(id1));
}

TEST(Bootstrap, ClosedPeerIsRemoteErrorNamingTheRank) {
  fuscoUniqueId id = newId();
  auto ranks = runInit(id, allRanks(3), 2000);
  for (auto& r : ranks) ASSERT_EQ(r.r, fuscoSuccess) << r.err;
  ranks[2].b.reset();  // rank 2 goes away
  std::vector<std::string> errs(2);
  std::vector<int64_t> ms(2);
  std::vector<fuscoResult_t> res(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      std::vector<std::string> all;
      auto t0 = std::chrono::steady_clock::now();
      res[r] = ranks[r].b->barrier();
      ms[r] = msSince(t0);
      errs[r] = fusco::threadLastError();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(res[r], fuscoRemoteError) << errs[r];
    EXPECT_NE(errs[r].find("rank 2 closed its connection"), std::string::npos) << errs[r];
    EXPECT_LT(ms[r], 1000);
  }
  // The star is out of step now: later calls fail at once instead of waiting.
  EXPECT_EQ(ranks[1].b->barrier(), fuscoRemoteError);
}

TEST(Bootstrap, ReleasedIdRefusesConnections) {
  fuscoUniqueId id = newId();
  int fd = rawConnect(id);
  ASSERT_GE(fd, 0);
  close(fd);
  fusco::bootstrapReleaseId(id);
  EXPECT_EQ(rawConnect(id), -1);
}

TEST(Bootstrap, RootInForkedChildUsesTheInheritedSocket) {
  fuscoUniqueId id = newId();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::unique_ptr<Bootstrap> b;
    std::vector<std::string> all;
    fuscoResult_t r = Bootstrap::init(id, 2, 0, 3000, "child", &b, &all);
    if (r == fuscoSuccess) r = b->barrier();
    _exit(r == fuscoSuccess && all.size() == 2 && all[1] == "parent" ? 0 : 1);
  }
  fusco::bootstrapReleaseId(id);  // the parent is only a launcher for the root
  std::unique_ptr<Bootstrap> b;
  std::vector<std::string> all;
  ASSERT_EQ(Bootstrap::init(id, 2, 1, 3000, "parent", &b, &all), fuscoSuccess);
  EXPECT_EQ(all[0], "child");
  EXPECT_EQ(b->barrier(), fuscoSuccess);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(Socket, IfnameFilterFollowsNcclSemantics) {
  using fusco::socketIfnameMatches;
  EXPECT_TRUE(socketIfnameMatches("", "eth0"));
  EXPECT_TRUE(socketIfnameMatches("eth", "eth0"));
  EXPECT_TRUE(socketIfnameMatches("ib,eth", "eth1"));
  EXPECT_FALSE(socketIfnameMatches("ib", "eth0"));
  EXPECT_FALSE(socketIfnameMatches("^eth", "eth0"));
  EXPECT_TRUE(socketIfnameMatches("^docker,lo", "eth0"));
  EXPECT_FALSE(socketIfnameMatches("^docker,lo", "lo"));
  EXPECT_TRUE(socketIfnameMatches("=eth0", "eth0"));
  EXPECT_FALSE(socketIfnameMatches("=eth", "eth0"));
  EXPECT_FALSE(socketIfnameMatches("^=eth0", "eth0"));
  EXPECT_TRUE(socketIfnameMatches("^=eth", "eth0"));
}

TEST(Socket, IfnameSelectsTheNamedInterfaceOrFailsClearly) {
  fusco::SockAddr a;
  std::string name;
  fusco::paramSetOverride("FUSCO_SOCKET_IFNAME", "=lo");
  EXPECT_EQ(fusco::socketFindInterface(&a, &name), fuscoSuccess);
  EXPECT_EQ(name, "lo");
  fusco::paramSetOverride("FUSCO_SOCKET_IFNAME", "nosuchif");
  EXPECT_EQ(fusco::socketFindInterface(&a, &name), fuscoInvalidUsage);
  EXPECT_NE(fusco::threadLastError().find("nosuchif"), std::string::npos);
  fusco::paramClearOverride("FUSCO_SOCKET_IFNAME");
  EXPECT_EQ(fusco::socketFindInterface(&a, &name), fuscoSuccess);
}

}  // namespace
