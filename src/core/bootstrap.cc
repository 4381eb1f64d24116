// TCP bootstrap (see bootstrap.h for the contract).
//
// Wire format, all integers little-endian:
//   id (128 bytes): magic "FUSCOBID" u64 | version u32 | family u16 (4/6) | port u16 | addr[16] |
//                   secret u64 | zero padding.
//   HELLO (rank -> root, 32 bytes + blob): magic "FUSCOHLO" u64 | secret u64 | nranks i32 |
//                   rank i32 | blobLen u64 | blob.
//   FRAME (every later message, 32 bytes + payload): magic "FUSCOMSG" u64 | type u32 |
//                   code u32 | seq u64 | len u64 | payload.
//   type TABLE (root -> rank): payload = nranks x u64 lengths, then the blobs back to back.
//   type GATHER (rank -> root): payload = the rank's blob. type ERROR: code + message text.
// The init exchange is sequence 0; the k-th collective after init is sequence k.
#include "core/bootstrap.h"

#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <set>

#include "core/clock.h"
#include "core/log.h"
#include "core/params.h"
#include "core/result.h"
#include "core/socket.h"

namespace fusco {

namespace {

constexpr uint64_t magic8(const char (&s)[9]) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[i]);
  return v;
}

constexpr uint64_t kIdMagic = magic8("FUSCOBID");
constexpr uint64_t kHelloMagic = magic8("FUSCOHLO");
constexpr uint64_t kFrameMagic = magic8("FUSCOMSG");
constexpr uint32_t kIdVersion = 1;
constexpr size_t kHeaderBytes = 32;  // HELLO and FRAME headers have the same size
constexpr uint64_t kMaxBlob = 64ull << 20;
constexpr uint64_t kMaxErrorText = 16384;
constexpr int kMaxRanks = 1 << 20;
constexpr int kListenBacklog = 16384;
constexpr int kMaxPending = 4096;  // half-open connections the root keeps reading at once
// After the first error the root waits this long for more ranks, so that ranks still on their
// way hear the error instead of timing out on a closed port.
constexpr int64_t kErrorGraceMs = 250;
constexpr int64_t kErrorSendMs = 500;

enum FrameType : uint32_t { kFrameTable = 1, kFrameGather = 2, kFrameError = 3 };

// ---------------------------------------------------------------- the unique id
struct IdFields {
  uint64_t magic = 0;
  uint32_t version = 0;
  uint16_t family = 0;  // 4 or 6
  uint16_t port = 0;
  unsigned char addr[16] = {};
  uint64_t secret = 0;
};

IdFields decodeId(const fuscoUniqueId& id) {
  const auto* p = reinterpret_cast<const unsigned char*>(id.internal);
  IdFields f;
  f.magic = wireGet64(p);
  f.version = wireGet32(p + 8);
  f.family = static_cast<uint16_t>(wireGet32(p + 12) & 0xffff);
  f.port = static_cast<uint16_t>(wireGet32(p + 12) >> 16);
  memcpy(f.addr, p + 16, 16);
  f.secret = wireGet64(p + 32);
  return f;
}

void encodeId(const IdFields& f, fuscoUniqueId* id) {
  memset(id->internal, 0, sizeof(id->internal));
  auto* p = reinterpret_cast<unsigned char*>(id->internal);
  wirePut64(p, f.magic);
  wirePut32(p + 8, f.version);
  wirePut32(p + 12, f.family | static_cast<uint32_t>(f.port) << 16);
  memcpy(p + 16, f.addr, 16);
  wirePut64(p + 32, f.secret);
}

SockAddr idSockAddr(const IdFields& f) {
  return sockAddrFromRaw(f.family == 6 ? AF_INET6 : AF_INET, f.addr, f.port);
}

// Constant time, so a peer guessing the secret learns nothing from how fast it is refused.
bool secretEqual(uint64_t a, uint64_t b) {
  volatile uint64_t diff = a ^ b;
  uint64_t d = diff;
  d |= d >> 32;
  d |= d >> 16;
  d |= d >> 8;
  return (d & 0xff) == 0;
}

// splitmix64 finalizer: the tag is public (it names shm segments), the secret must not be.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// ---------------------------------------------------------------- process-global listen table
// Keyed by secret. A forked child inherits both the table and the fds, so rank 0 may run there.
struct ListenTable {
  std::mutex mu;
  std::map<uint64_t, int> fds;  // secret -> listening fd
  std::set<uint64_t> used;      // secrets a communicator was built from in this process
};

ListenTable& listenTable() {
  static ListenTable* t = new ListenTable();  // never destroyed: usable from atexit handlers
  return *t;
}

// ---------------------------------------------------------------- frames
IoStatus sendFrame(int fd, uint32_t type, uint32_t code, uint64_t seq, const std::string& payload,
                   const Deadline& d, int* err) {
  return socketSendFrame(fd, SocketFrame{kFrameMagic, type, code, seq, payload.size()}, payload, d,
                         err);
}

// One message for a failed send/recv with `who` ("rank 2", "root 10.0.0.1:4242").
fuscoResult_t ioFail(IoStatus s, int err, const std::string& who, const char* what,
                     int64_t timeoutMs, std::string* msgOut = nullptr) {
  char buf[512];
  fuscoResult_t r;
  if (s == IoStatus::Closed) {
    r = fuscoRemoteError;
    snprintf(buf, sizeof(buf), "bootstrap: %s closed its connection (while %s)", who.c_str(), what);
  } else if (s == IoStatus::Timeout) {
    r = fuscoTimeout;
    snprintf(buf, sizeof(buf), "bootstrap: %s did not respond within %lld ms (while %s)",
             who.c_str(), static_cast<long long>(timeoutMs), what);
  } else {
    r = fuscoSystemError;
    snprintf(buf, sizeof(buf), "bootstrap: socket error with %s while %s: %s", who.c_str(), what,
             strerror(err));
  }
  if (msgOut != nullptr) {
    *msgOut = buf;
    return r;
  }
  return FUSCO_FAIL(r, kBoot, "%s", buf);
}

std::string encodeTable(const std::vector<std::string>& blobs) {
  std::string t(blobs.size() * 8, '\0');
  for (size_t i = 0; i < blobs.size(); ++i)
    wirePut64(reinterpret_cast<unsigned char*>(&t[i * 8]), blobs[i].size());
  for (const auto& b : blobs) t += b;
  return t;
}

bool decodeTable(const std::string& t, int nranks, std::vector<std::string>* out) {
  size_t n = static_cast<size_t>(nranks);
  if (t.size() < n * 8) return false;
  std::vector<std::string> blobs(n);
  size_t off = n * 8;
  for (size_t i = 0; i < n; ++i) {
    uint64_t len = wireGet64(reinterpret_cast<const unsigned char*>(&t[i * 8]));
    if (len > kMaxBlob || len > t.size() - off) return false;
    blobs[i].assign(t, off, len);
    off += len;
  }
  if (off != t.size()) return false;
  out->swap(blobs);
  return true;
}

uint64_t tableCap(int nranks) { return static_cast<uint64_t>(nranks) * (8 + kMaxBlob); }

// Non-root ranks wait a little longer than the root so that the root's error normally arrives
// before their own timeout fires.
int64_t peerTimeoutMs(int64_t t) { return t + std::min<int64_t>(2000, 200 + t / 10); }

// Reads the root's reply (TABLE with seq, or ERROR) on a non-root rank.
fuscoResult_t recvReply(int fd, uint64_t seq, int nranks, const std::string& root,
                        const Deadline& d, const char* what, std::vector<std::string>* all) {
  SocketFrame h;
  int err = 0;
  IoStatus s = socketRecvFrameHeader(fd, &h, d, &err);
  if (s != IoStatus::Ok) return ioFail(s, err, root, what, d.timeoutMs());
  if (h.magic != kFrameMagic)
    return FUSCO_FAIL(fuscoInternalError, kBoot, "bootstrap: bad message magic from %s while %s",
                      root.c_str(), what);
  std::string payload;
  if (h.type == kFrameError) {
    if (h.len > kMaxErrorText)
      return FUSCO_FAIL(fuscoInternalError, kBoot, "bootstrap: oversized error from %s",
                        root.c_str());
    s = socketRecvString(fd, h.len, &payload, d, &err);
    if (s != IoStatus::Ok) return ioFail(s, err, root, what, d.timeoutMs());
    fuscoResult_t code = static_cast<fuscoResult_t>(h.code);
    if (h.code == 0 || h.code >= fuscoNumResults) code = fuscoInternalError;
    return FUSCO_FAIL(code, kBoot, "%s", payload.c_str());
  }
  if (h.type != kFrameTable || h.len > tableCap(nranks))
    return FUSCO_FAIL(fuscoInternalError, kBoot,
                      "bootstrap: unexpected message (type %u, %llu bytes) from %s while %s",
                      h.type, static_cast<unsigned long long>(h.len), root.c_str(), what);
  if (h.seq != seq)
    return FUSCO_FAIL(fuscoInternalError, kBoot,
                      "bootstrap: %s sent sequence %llu, expected %llu (while %s)", root.c_str(),
                      static_cast<unsigned long long>(h.seq), static_cast<unsigned long long>(seq),
                      what);
  s = socketRecvString(fd, h.len, &payload, d, &err);
  if (s != IoStatus::Ok) return ioFail(s, err, root, what, d.timeoutMs());
  if (!decodeTable(payload, nranks, all))
    return FUSCO_FAIL(fuscoInternalError, kBoot, "bootstrap: malformed blob table from %s",
                      root.c_str());
  return fuscoSuccess;
}

}  // namespace

// ---------------------------------------------------------------- id functions
fuscoResult_t bootstrapCreateId(fuscoUniqueId* id) {
  if (id == nullptr) return FUSCO_FAIL(fuscoInvalidArgument, kBoot, "fuscoGetUniqueId: id is NULL");
  SockAddr addr;
  std::string ifName;
  FUSCO_CHECK(socketFindInterface(&addr, &ifName));
  uint64_t secret = 0;
  ssize_t got;
  do {
    got = getrandom(&secret, sizeof(secret), 0);
  } while (got < 0 && errno == EINTR);
  if (got != static_cast<ssize_t>(sizeof(secret)))
    return FUSCO_FAIL(fuscoSystemError, kBoot, "getrandom failed: %s", strerror(errno));
  int fd = -1;
  SockAddr bound;
  FUSCO_CHECK(socketListen(addr, kListenBacklog, false, &fd, &bound));
  IdFields f;
  f.magic = kIdMagic;
  f.version = kIdVersion;
  f.family = bound.family() == AF_INET6 ? 6 : 4;
  f.port = bound.port();
  sockAddrToRaw(bound, f.addr);
  f.secret = secret;
  {
    ListenTable& t = listenTable();
    std::lock_guard<std::mutex> g(t.mu);
    t.fds[secret] = fd;
  }
  encodeId(f, id);
  FUSCO_INFO(kBoot, "bootstrap: unique id root %s on interface %s", sockAddrToString(bound).c_str(),
             ifName.c_str());
  return fuscoSuccess;
}

fuscoResult_t bootstrapCheckId(const fuscoUniqueId& id) {
  IdFields f = decodeId(id);
  if (f.magic != kIdMagic)
    return FUSCO_FAIL(fuscoInvalidArgument, kBoot,
                      "bootstrap: unique id has bad magic 0x%016llx (not made by fuscoGetUniqueId)",
                      static_cast<unsigned long long>(f.magic));
  if (f.version != kIdVersion)
    return FUSCO_FAIL(fuscoInvalidArgument, kBoot,
                      "bootstrap: unique id has version %u, this library speaks version %u",
                      f.version, kIdVersion);
  if ((f.family != 4 && f.family != 6) || f.port == 0)
    return FUSCO_FAIL(fuscoInvalidArgument, kBoot,
                      "bootstrap: unique id has a bad address (family %u, port %u)", f.family,
                      f.port);
  return fuscoSuccess;
}

void bootstrapReleaseId(const fuscoUniqueId& id) {
  IdFields f = decodeId(id);
  if (f.magic != kIdMagic) return;
  ListenTable& t = listenTable();
  std::lock_guard<std::mutex> g(t.mu);
  auto it = t.fds.find(f.secret);
  if (it == t.fds.end()) return;
  close(it->second);
  t.fds.erase(it);
}

std::string bootstrapIdAddress(const fuscoUniqueId& id) {
  return sockAddrToString(idSockAddr(decodeId(id)));
}

// ---------------------------------------------------------------- root rendezvous
namespace {

// A connection the root accepted but whose HELLO is not complete yet.
struct PendingConn {
  int fd = -1;
  std::string peer;
  unsigned char hdr[kHeaderBytes] = {};
  size_t hdrGot = 0;
  int32_t nranks = 0;
  int32_t rank = 0;
  uint64_t blobLen = 0;
  std::string blob;
  size_t blobGot = 0;
};

// Root side of init: accepts connections, authenticates HELLOs, detects bad ranks, and either
// distributes the blob table or sends everybody the first error.
class RootRendezvous {
 public:
  RootRendezvous(int listenFd, int nranks, uint64_t secret, std::string addr, int64_t timeoutMs)
      : listenFd_(listenFd),
        nranks_(nranks),
        secret_(secret),
        addr_(std::move(addr)),
        timeoutMs_(timeoutMs),
        fdOf_(nranks, -1),
        blobs_(nranks) {}
  ~RootRendezvous() {
    for (auto& c : pending_) socketClose(&c.fd);
    for (int& fd : fdOf_) socketClose(&fd);
    for (int& fd : extraFds_) socketClose(&fd);
  }
  // [out] fds: one connected socket per rank (-1 for rank 0); blobs: every rank's blob.
  fuscoResult_t run(const std::string& myBlob, std::vector<int>* fds,
                    std::vector<std::string>* blobs);

 private:
  bool done() const;
  void acceptNew();
  bool readPending(PendingConn& c);  // false: the connection is finished (dropped or handed over)
  bool checkHeader(PendingConn& c);
  void onHello(PendingConn& c);
  void refuse(PendingConn& c, const char* why);
  void recordError(fuscoResult_t r, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
  fuscoResult_t failAll();
  std::string missingRanks() const;

  int listenFd_;
  int nranks_;
  uint64_t secret_;
  std::string addr_;
  int64_t timeoutMs_;
  std::vector<PendingConn> pending_;
  std::vector<int> fdOf_;           // [nranks] socket of each valid rank
  std::vector<std::string> blobs_;  // [nranks]
  std::vector<int> extraFds_;       // authenticated but invalid ranks: they only get the ERROR
  int valid_ = 0;                   // valid HELLOs
  int arrived_ = 0;                 // authenticated HELLOs, valid or not
  int64_t lastArrivalNs_ = 0;
  fuscoResult_t err_ = fuscoSuccess;
  std::string errMsg_;
};

void RootRendezvous::recordError(fuscoResult_t r, const char* fmt, ...) {
  if (err_ != fuscoSuccess) return;  // the first error is the one everybody reports
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  err_ = r;
  errMsg_ = buf;
}

bool RootRendezvous::done() const {
  if (err_ == fuscoSuccess) return valid_ == nranks_ - 1;
  return arrived_ >= nranks_ - 1 || nowNs() - lastArrivalNs_ >= kErrorGraceMs * 1000000LL;
}

void RootRendezvous::refuse(PendingConn& c, const char* why) {
  FUSCO_WARN(kBoot, "refused bootstrap connection from %s: %s", c.peer.c_str(), why);
  socketClose(&c.fd);
}

void RootRendezvous::acceptNew() {
  for (;;) {
    PendingConn c;
    SockAddr peer;
    int err = 0;
    IoStatus s = socketAccept(listenFd_, &c.fd, &peer, &err);
    if (s == IoStatus::Timeout) return;  // nothing more queued
    if (s != IoStatus::Ok) {
      FUSCO_WARN(kBoot, "bootstrap: accept on %s failed: %s", addr_.c_str(), strerror(err));
      return;
    }
    c.peer = sockAddrToString(peer);
    if (pending_.size() >= static_cast<size_t>(kMaxPending)) {
      refuse(c, "too many connections without a complete hello");
      continue;
    }
    pending_.push_back(std::move(c));
  }
}

// Authenticates before believing any other field; false: refused and closed.
bool RootRendezvous::checkHeader(PendingConn& c) {
  if (wireGet64(c.hdr) != kHelloMagic) {
    refuse(c, "bad magic");
    return false;
  }
  if (!secretEqual(wireGet64(c.hdr + 8), secret_)) {
    refuse(c, "bad secret");
    return false;
  }
  c.nranks = static_cast<int32_t>(wireGet32(c.hdr + 16));
  c.rank = static_cast<int32_t>(wireGet32(c.hdr + 20));
  c.blobLen = wireGet64(c.hdr + 24);
  if (c.blobLen > kMaxBlob) {
    refuse(c, "blob length over the 64 MiB limit");
    return false;
  }
  try {
    c.blob.resize(c.blobLen);
  } catch (const std::bad_alloc&) {
    refuse(c, "out of memory for its blob");
    return false;
  }
  return true;
}

bool RootRendezvous::readPending(PendingConn& c) {
  for (;;) {
    bool inHeader = c.hdrGot < kHeaderBytes;
    if (!inHeader && c.blobGot == c.blobLen) {
      onHello(c);
      return false;
    }
    void* dst = inHeader ? static_cast<void*>(c.hdr + c.hdrGot) : &c.blob[c.blobGot];
    size_t want = inHeader ? kHeaderBytes - c.hdrGot : c.blobLen - c.blobGot;
    size_t got = 0;
    int err = 0;
    IoStatus s = socketRecvSome(c.fd, dst, want, &got, &err);
    if (s != IoStatus::Ok) {
      refuse(c, inHeader ? "closed before a complete hello header"
                         : "closed in the middle of its blob");
      return false;
    }
    if (got == 0) return true;  // wait for more
    if (inHeader) {
      c.hdrGot += got;
      if (c.hdrGot == kHeaderBytes && !checkHeader(c)) return false;
    } else {
      c.blobGot += got;
    }
  }
}

void RootRendezvous::onHello(PendingConn& c) {
  ++arrived_;
  lastArrivalNs_ = nowNs();
  int fd = c.fd;
  c.fd = -1;  // handed over to fdOf_ or extraFds_
  if (c.nranks != nranks_) {
    recordError(fuscoInvalidUsage, "bootstrap: rank %d says nranks=%d but root %s has nranks=%d",
                c.rank, c.nranks, addr_.c_str(), nranks_);
  } else if (c.rank < 0 || c.rank >= nranks_) {
    recordError(fuscoInvalidUsage, "bootstrap: rank %d is out of range [0,%d) (from %s)", c.rank,
                nranks_, c.peer.c_str());
  } else if (c.rank == 0 || fdOf_[c.rank] >= 0) {
    recordError(fuscoInvalidUsage, "bootstrap: rank %d joined twice (again from %s)", c.rank,
                c.peer.c_str());
  } else {
    fdOf_[c.rank] = fd;
    blobs_[c.rank].swap(c.blob);
    ++valid_;
    FUSCO_TRACE(kBoot, "bootstrap: rank %d connected from %s", c.rank, c.peer.c_str());
    return;
  }
  extraFds_.push_back(fd);
}

std::string RootRendezvous::missingRanks() const {
  std::string s;
  int n = 0;
  for (int r = 1; r < nranks_; ++r) {
    if (fdOf_[r] >= 0) continue;
    if (n++ > 0) s += ",";
    if (n > 32) {  // keep the message readable for a large job
      s += "...";
      break;
    }
    s += std::to_string(r);
  }
  return (n == 1 ? "rank " : "ranks ") + s;
}

fuscoResult_t RootRendezvous::failAll() {
  Deadline d(kErrorSendMs);
  std::vector<int*> all;
  for (int& fd : fdOf_) all.push_back(&fd);
  for (int& fd : extraFds_) all.push_back(&fd);
  for (int* fd : all) {
    if (*fd < 0) continue;
    int err = 0;
    sendFrame(*fd, kFrameError, static_cast<uint32_t>(err_), 0, errMsg_, d, &err);
    // Half-close first so the ERROR is delivered before the FIN, never lost to an RST.
    shutdown(*fd, SHUT_WR);
    socketClose(fd);
  }
  return FUSCO_FAIL(err_, kBoot, "%s", errMsg_.c_str());
}

fuscoResult_t RootRendezvous::run(const std::string& myBlob, std::vector<int>* fds,
                                  std::vector<std::string>* blobs) {
  Deadline d(timeoutMs_);
  int64_t start = nowNs();
  std::vector<pollfd> pfds;
  while (!done() && !d.expired()) {
    pfds.assign(1, pollfd{listenFd_, POLLIN, 0});
    for (const auto& c : pending_) pfds.push_back(pollfd{c.fd, POLLIN, 0});
    int64_t waitMs = std::max<int64_t>(1, std::min<int64_t>(d.remainingMs(), kErrorGraceMs));
    int rc = poll(pfds.data(), pfds.size(), static_cast<int>(waitMs));
    if (rc < 0 && errno != EINTR)
      return FUSCO_FAIL(fuscoSystemError, kBoot, "bootstrap: poll failed: %s", strerror(errno));
    if (rc <= 0) continue;
    // Pending connections first (indices match pfds), newest last so erasing keeps indices.
    for (size_t i = pending_.size(); i-- > 0;) {
      if (pfds[i + 1].revents == 0) continue;
      if (!readPending(pending_[i])) pending_.erase(pending_.begin() + static_cast<long>(i));
    }
    if (pfds[0].revents != 0) acceptNew();
  }
  for (auto& c : pending_) refuse(c, "no complete hello before the rendezvous ended");
  pending_.clear();
  if (err_ == fuscoSuccess && valid_ < nranks_ - 1)
    recordError(fuscoTimeout, "bootstrap: %s of %d did not connect to root %s within %lld ms",
                missingRanks().c_str(), nranks_, addr_.c_str(), static_cast<long long>(timeoutMs_));
  if (err_ != fuscoSuccess) return failAll();
  blobs_[0] = myBlob;
  std::string table = encodeTable(blobs_);
  Deadline sendD(timeoutMs_);
  for (int r = 1; r < nranks_; ++r) {
    int err = 0;
    IoStatus s = sendFrame(fdOf_[r], kFrameTable, 0, 0, table, sendD, &err);
    if (s == IoStatus::Ok) continue;
    socketClose(&fdOf_[r]);
    ioFail(s, err, "rank " + std::to_string(r), "sending the blob table", timeoutMs_, &errMsg_);
    err_ = s == IoStatus::Closed    ? fuscoRemoteError
           : s == IoStatus::Timeout ? fuscoTimeout
                                    : fuscoSystemError;
    return failAll();
  }
  FUSCO_INFO(kBoot, "bootstrap: root %s: %d ranks connected in %lld ms", addr_.c_str(), nranks_,
             static_cast<long long>((nowNs() - start) / 1000000));
  fds->swap(fdOf_);
  blobs->swap(blobs_);
  return fuscoSuccess;
}

// Takes this process's listening socket for the id, or binds the id's address when the id was
// made by another process. Marks the id used: an id serves exactly one communicator.
fuscoResult_t takeListenFd(const IdFields& f, const std::string& addr, int* fd) {
  {
    ListenTable& t = listenTable();
    std::lock_guard<std::mutex> g(t.mu);
    if (t.used.count(f.secret) != 0)
      return FUSCO_FAIL(fuscoInvalidUsage, kBoot,
                        "bootstrap: unique id %s was already used for a communicator; call "
                        "fuscoGetUniqueId once per communicator",
                        addr.c_str());
    t.used.insert(f.secret);
    auto it = t.fds.find(f.secret);
    if (it != t.fds.end()) {
      *fd = it->second;
      t.fds.erase(it);
      FUSCO_INFO(kBoot, "bootstrap: root uses the listening socket of id %s", addr.c_str());
      return fuscoSuccess;
    }
  }
  SockAddr bound;
  FUSCO_CHECK(socketListen(idSockAddr(f), kListenBacklog, true, fd, &bound));
  FUSCO_INFO(kBoot, "bootstrap: root bound %s itself (id made by another process)", addr.c_str());
  return fuscoSuccess;
}

}  // namespace

// ---------------------------------------------------------------- Bootstrap
struct BootstrapAccess {
  static std::unique_ptr<Bootstrap> make(int rank, int nranks, int64_t timeoutMs, const IdFields& f,
                                         const std::string& addr) {
    std::unique_ptr<Bootstrap> b(new (std::nothrow) Bootstrap(rank, nranks, timeoutMs));
    if (b) {
      b->secret_ = f.secret;
      b->tag_ = mix64(f.secret ^ 0x6675736361746167ull);
      b->rootAddr_ = addr;
    }
    return b;
  }
  static fuscoResult_t rootInit(const IdFields& f, const std::string& addr, int nranks,
                                int64_t timeoutMs, const std::string& myBlob,
                                std::unique_ptr<Bootstrap>* out, std::vector<std::string>* all);
  static fuscoResult_t peerInit(const IdFields& f, const std::string& addr, int nranks, int rank,
                                int64_t timeoutMs, const std::string& myBlob,
                                std::unique_ptr<Bootstrap>* out, std::vector<std::string>* all);
  static fuscoResult_t rootGather(Bootstrap* b, const std::string& mine,
                                  std::vector<std::string>* all);
  static fuscoResult_t peerGather(Bootstrap* b, const std::string& mine,
                                  std::vector<std::string>* all);
};

fuscoResult_t BootstrapAccess::rootInit(const IdFields& f, const std::string& addr, int nranks,
                                        int64_t timeoutMs, const std::string& myBlob,
                                        std::unique_ptr<Bootstrap>* out,
                                        std::vector<std::string>* all) {
  int lfd = -1;
  FUSCO_CHECK(takeListenFd(f, addr, &lfd));
  std::vector<int> fds(1, -1);
  std::vector<std::string> blobs(1, myBlob);
  fuscoResult_t r = fuscoSuccess;
  if (nranks > 1) {
    FUSCO_INFO(kBoot, "bootstrap: root %s waiting for %d ranks (timeout %lld ms)", addr.c_str(),
               nranks - 1, static_cast<long long>(timeoutMs));
    RootRendezvous rv(lfd, nranks, f.secret, addr, timeoutMs);
    r = rv.run(myBlob, &fds, &blobs);
  }
  // Success or not, the id is spent: close the port so a stale id cannot reach anyone.
  socketClose(&lfd);
  if (r != fuscoSuccess) return r;
  std::unique_ptr<Bootstrap> b = make(0, nranks, timeoutMs, f, addr);
  if (!b) {
    for (int& fd : fds) socketClose(&fd);
    return FUSCO_FAIL(fuscoSystemError, kBoot, "bootstrap: out of memory");
  }
  b->peerFds_.swap(fds);
  *out = std::move(b);
  all->swap(blobs);
  return fuscoSuccess;
}

fuscoResult_t BootstrapAccess::peerInit(const IdFields& f, const std::string& addr, int nranks,
                                        int rank, int64_t timeoutMs, const std::string& myBlob,
                                        std::unique_ptr<Bootstrap>* out,
                                        std::vector<std::string>* all) {
  bool badRank = nranks <= 0 || nranks > kMaxRanks || rank < 0 || rank >= nranks;
  Deadline d(peerTimeoutMs(timeoutMs));
  std::string root = "root " + addr;
  int fd = -1, err = 0;
  IoStatus s = socketConnect(idSockAddr(f), d, &fd, &err);
  if (s == IoStatus::Ok) {
    unsigned char h[kHeaderBytes];
    wirePut64(h, kHelloMagic);
    wirePut64(h + 8, f.secret);
    wirePut32(h + 16, static_cast<uint32_t>(nranks));
    wirePut32(h + 20, static_cast<uint32_t>(rank));
    wirePut64(h + 24, myBlob.size());
    s = socketSendAll(fd, h, sizeof(h), d, &err);
    if (s == IoStatus::Ok && !myBlob.empty())
      s = socketSendAll(fd, myBlob.data(), myBlob.size(), d, &err);
  }
  if (badRank) {
    // The HELLO (if it got through) lets the root fail everybody at once; this rank's own error
    // is about its arguments.
    socketClose(&fd);
    if (nranks <= 0 || nranks > kMaxRanks)
      return FUSCO_FAIL(fuscoInvalidArgument, kBoot, "bootstrap: nranks %d out of range [1,%d]",
                        nranks, kMaxRanks);
    return FUSCO_FAIL(fuscoInvalidArgument, kBoot, "bootstrap: rank %d is out of range [0,%d)",
                      rank, nranks);
  }
  std::vector<std::string> blobs;
  fuscoResult_t r;
  if (s != IoStatus::Ok)
    r = ioFail(s, err, root, fd < 0 ? "connecting" : "sending hello", d.timeoutMs());
  else
    r = recvReply(fd, 0, nranks, root, d, "waiting for the other ranks", &blobs);
  std::unique_ptr<Bootstrap> b;
  if (r == fuscoSuccess && !(b = make(rank, nranks, timeoutMs, f, addr)))
    r = FUSCO_FAIL(fuscoSystemError, kBoot, "bootstrap: out of memory");
  if (r != fuscoSuccess) {
    socketClose(&fd);
    return r;
  }
  b->rootFd_ = fd;
  FUSCO_INFO(kBoot, "bootstrap: rank %d of %d connected to root %s", rank, nranks, addr.c_str());
  *out = std::move(b);
  all->swap(blobs);
  return fuscoSuccess;
}

fuscoResult_t Bootstrap::init(const fuscoUniqueId& id, int nranks, int rank, int64_t timeoutMs,
                              const std::string& myBlob, std::unique_ptr<Bootstrap>* out,
                              std::vector<std::string>* allBlobs) {
  if (out == nullptr || allBlobs == nullptr)
    return FUSCO_FAIL(fuscoInvalidArgument, kBoot, "bootstrap: init with NULL output");
  FUSCO_CHECK(bootstrapCheckId(id));
  if (timeoutMs <= 0) timeoutMs = paramInt("FUSCO_TIMEOUT_MS");
  if (timeoutMs <= 0) timeoutMs = 300000;
  if (myBlob.size() > kMaxBlob)
    return FUSCO_FAIL(fuscoInvalidArgument, kBoot,
                      "bootstrap: blob of %zu bytes over the %llu limit", myBlob.size(),
                      static_cast<unsigned long long>(kMaxBlob));
  IdFields f = decodeId(id);
  std::string addr = sockAddrToString(idSockAddr(f));
  bool validRoot = rank == 0 && nranks >= 1 && nranks <= kMaxRanks;
  if (validRoot)
    return BootstrapAccess::rootInit(f, addr, nranks, timeoutMs, myBlob, out, allBlobs);
  return BootstrapAccess::peerInit(f, addr, nranks, rank, timeoutMs, myBlob, out, allBlobs);
}

Bootstrap::~Bootstrap() {
  socketClose(&rootFd_);
  for (int& fd : peerFds_) socketClose(&fd);
}

// ---------------------------------------------------------------- collectives (star via root)
fuscoResult_t BootstrapAccess::rootGather(Bootstrap* b, const std::string& mine,
                                          std::vector<std::string>* all) {
  Deadline d(b->timeoutMs_);
  std::vector<std::string> blobs(b->nranks_);
  blobs[0] = mine;
  fuscoResult_t r = fuscoSuccess;
  std::string msg;
  int bad = -1;
  for (int p = 1; p < b->nranks_ && r == fuscoSuccess; ++p) {
    std::string who = "rank " + std::to_string(p);
    SocketFrame h;
    int err = 0;
    IoStatus s = socketRecvFrameHeader(b->peerFds_[p], &h, d, &err);
    if (s == IoStatus::Ok &&
        (h.magic != kFrameMagic || h.type != kFrameGather || h.len > kMaxBlob)) {
      r = fuscoInternalError;
      msg = "bootstrap: " + who + " sent a malformed allGather message";
    } else if (s == IoStatus::Ok && h.seq != b->seq_) {
      r = fuscoInternalError;
      msg = "bootstrap: " + who + " sent sequence " + std::to_string(h.seq) + ", expected " +
            std::to_string(b->seq_);
    } else if (s == IoStatus::Ok) {
      s = socketRecvString(b->peerFds_[p], h.len, &blobs[p], d, &err);
    }
    if (r == fuscoSuccess && s != IoStatus::Ok)
      r = ioFail(s, err, who, "in allGather", b->timeoutMs_, &msg);
    if (r != fuscoSuccess) bad = p;
  }
  if (r == fuscoSuccess) {
    std::string table = encodeTable(blobs);
    Deadline sendD(b->timeoutMs_);
    for (int p = 1; p < b->nranks_ && r == fuscoSuccess; ++p) {
      int err = 0;
      IoStatus s = sendFrame(b->peerFds_[p], kFrameTable, 0, b->seq_, table, sendD, &err);
      if (s != IoStatus::Ok) {
        r = ioFail(s, err, "rank " + std::to_string(p), "sending allGather results", b->timeoutMs_,
                   &msg);
        bad = p;
      }
    }
  }
  if (r == fuscoSuccess) {
    all->swap(blobs);
    return fuscoSuccess;
  }
  // Tell everybody else, so they fail now with the same story instead of timing out.
  Deadline errD(kErrorSendMs);
  for (int p = 1; p < b->nranks_; ++p) {
    int err = 0;
    if (p != bad) sendFrame(b->peerFds_[p], kFrameError, r, b->seq_, msg, errD, &err);
  }
  return FUSCO_FAIL(r, kBoot, "%s", msg.c_str());
}

fuscoResult_t BootstrapAccess::peerGather(Bootstrap* b, const std::string& mine,
                                          std::vector<std::string>* all) {
  Deadline d(peerTimeoutMs(b->timeoutMs_));
  std::string root = "root " + b->rootAddr_ + " (rank 0)";
  int err = 0;
  IoStatus s = sendFrame(b->rootFd_, kFrameGather, 0, b->seq_, mine, d, &err);
  if (s != IoStatus::Ok) return ioFail(s, err, root, "sending allGather data", d.timeoutMs());
  return recvReply(b->rootFd_, b->seq_, b->nranks_, root, d, "in allGather", all);
}

fuscoResult_t Bootstrap::allGather(const std::string& mine, std::vector<std::string>* all) {
  if (all == nullptr)
    return FUSCO_FAIL(fuscoInvalidArgument, kBoot, "bootstrap: allGather with NULL output");
  if (broken_ != fuscoSuccess)
    return FUSCO_FAIL(broken_, kBoot,
                      "bootstrap: rank %d: an earlier bootstrap collective failed, the bootstrap "
                      "connections are unusable",
                      rank_);
  if (mine.size() > kMaxBlob)
    return FUSCO_FAIL(fuscoInvalidArgument, kBoot,
                      "bootstrap: allGather blob of %zu bytes over the 64 MiB limit", mine.size());
  ++seq_;
  fuscoResult_t r = fuscoSuccess;
  if (nranks_ == 1) {
    all->assign(1, mine);
  } else if (rank_ == 0) {
    r = BootstrapAccess::rootGather(this, mine, all);
  } else {
    r = BootstrapAccess::peerGather(this, mine, all);
  }
  if (r != fuscoSuccess) broken_ = r;
  return r;
}

fuscoResult_t Bootstrap::barrier() {
  std::vector<std::string> unused;
  return allGather(std::string(), &unused);
}

}  // namespace fusco
