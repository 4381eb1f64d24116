// TCP bootstrap (see bootstrap.h for the contract): the unique id functions, Bootstrap::init (the
// non-root side, and the glue that hands rank 0 to the root rendezvous) and the collectives, a star
// through the root. The wire format and the shared helpers are in bootstrap_wire.h; the root's
// side of init and the listen table are in bootstrap_root.cc.
#include "core/bootstrap.h"

#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>

#include "core/bootstrap_wire.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/params.h"
#include "core/result.h"
#include "core/socket.h"

namespace fusco {

using namespace bootstrap_detail;  // NOLINT(google-build-using-namespace): bootstrap's internals

namespace {

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

// After the root sent its error frames: half-close every connection and read what ranks still
// send (bounded), so closing the sockets later cannot reset a connection whose peer has not yet
// read the error frame (a reset may discard it, and that rank would only see a closed socket).
void drainAfterError(const std::vector<int>& fds) {
  std::vector<pollfd> open;
  for (int fd : fds) {
    if (fd < 0) continue;
    shutdown(fd, SHUT_WR);
    open.push_back(pollfd{fd, POLLIN, 0});
  }
  Deadline d(kErrorSendMs);
  char sink[4096];
  while (!open.empty() && !d.expired()) {
    if (poll(open.data(), open.size(), static_cast<int>(std::max<int64_t>(1, d.remainingMs()))) <=
        0)
      break;
    for (size_t i = 0; i < open.size();) {
      ssize_t n = open[i].revents ? recv(open[i].fd, sink, sizeof(sink), MSG_DONTWAIT) : 1;
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        open[i] = open.back();
        open.pop_back();
      } else {
        ++i;
      }
    }
  }
}

// A send to the root failed: the root may already have said why it gave up. Returns true (and
// the root's error) if an ERROR frame is waiting.
bool pendingRootError(int fd, fuscoResult_t* r) {
  Deadline d(200);
  SocketFrame h;
  int err = 0;
  std::string payload;
  if (socketRecvFrameHeader(fd, &h, d, &err) != IoStatus::Ok || h.magic != kFrameMagic ||
      h.type != kFrameError || h.len > kMaxErrorText)
    return false;
  if (socketRecvString(fd, h.len, &payload, d, &err) != IoStatus::Ok) return false;
  fuscoResult_t code = static_cast<fuscoResult_t>(h.code);
  if (h.code == 0 || h.code >= fuscoNumResults) code = fuscoInternalError;
  *r = FUSCO_FAIL(code, kBoot, "%s", payload.c_str());
  return true;
}

}  // namespace

FUSCO_PARAM_INT(TimeoutMs, "FUSCO_TIMEOUT_MS", 300000, 1, INT32_MAX,
                "timeout of bootstrap and of every blocking wait, in milliseconds");

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
  // SO_REUSEADDR: the connections accepted on it inherit it, so once they are closed (TIME_WAIT)
  // the id's address can be bound again, by a root in another process or to refuse a reused id.
  FUSCO_CHECK(socketListen(addr, kListenBacklog, true, &fd, &bound));
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
  bool reused = false;
  FUSCO_CHECK(takeListenFd(f, addr, &lfd, &reused));
  std::vector<int> fds(1, -1);
  std::vector<std::string> blobs(1, myBlob);
  fuscoResult_t r = fuscoSuccess;
  if (reused) {
    r = refuseReusedId(lfd, nranks, f.secret, addr, timeoutMs);
  } else if (nranks > 1) {
    FUSCO_INFO(kBoot, "bootstrap: root %s waiting for %d ranks (timeout %lld ms)", addr.c_str(),
               nranks - 1, static_cast<long long>(timeoutMs));
    r = runRootRendezvous(lfd, nranks, f.secret, addr, timeoutMs, myBlob, &fds, &blobs);
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
  // This process joined a communicator with this id as this rank before: the root refuses the id
  // too, but this rank knows at once. (Marked only once joined: a rank given twice in one process
  // is the root's to report.)
  if (!badRank && idUsed(f.secret, rank))
    return FUSCO_FAIL(fuscoInvalidUsage, kBoot, "%s", reusedIdMessage(addr).c_str());
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
  markIdUsed(f.secret, rank);
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
  if (timeoutMs <= 0) timeoutMs = paramTimeoutMs();
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
  Deadline d(b->timeoutMs_, b->abort_);
  std::vector<std::string> blobs(b->nranks_);
  blobs[0] = mine;
  fuscoResult_t r = fuscoSuccess;
  std::string msg;
  int bad = -1;
  bool tableSent = false;
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
    // Every rank gets the table at once, slice by slice (socketSendToAll), so none of them waits
    // without progress while the others are served.
    const std::string table = encodeTable(blobs);
    const std::string wire =
        socketFrameBytes(SocketFrame{kFrameMagic, kFrameTable, 0, b->seq_, table.size()}, table);
    int err = 0;
    tableSent = true;
    IoStatus s = socketSendToAll(b->peerFds_, wire, Deadline(b->timeoutMs_, b->abort_), &bad, &err);
    if (s != IoStatus::Ok)
      r = ioFail(s, err, bad >= 0 ? "rank " + std::to_string(bad) : std::string("the ranks"),
                 "sending allGather results", b->timeoutMs_, &msg);
  }
  if (r == fuscoSuccess) {
    all->swap(blobs);
    return fuscoSuccess;
  }
  // An abort here is this rank's own: its peers learn that rank 0 aborted, not that they did, and
  // the abort is not held up by draining what they send (they see the sockets close at worst).
  const std::string local = msg;
  const bool aborted = b->abort_ != nullptr && b->abort_->load();
  if (aborted) {
    msg = "bootstrap: rank 0 aborted the communicator (fuscoCommAbort) during a collective";
    r = fuscoRemoteError;
  }
  // Tell everybody else, so they fail now with the same story instead of timing out. Once the
  // table was on its way, a frame would land inside it: the peers see the connection close.
  Deadline errD(aborted ? Deadline::kAbortPollMs : kErrorSendMs);
  for (int p = 1; p < b->nranks_ && !tableSent; ++p) {
    int err = 0;
    if (p != bad) sendFrame(b->peerFds_[p], kFrameError, r, b->seq_, msg, errD, &err);
  }
  if (!aborted) drainAfterError(b->peerFds_);
  if (local != msg) return FUSCO_FAIL(fuscoInvalidUsage, kBoot, "%s", local.c_str());
  return FUSCO_FAIL(r, kBoot, "%s", msg.c_str());
}

fuscoResult_t BootstrapAccess::peerGather(Bootstrap* b, const std::string& mine,
                                          std::vector<std::string>* all) {
  Deadline d(peerTimeoutMs(b->timeoutMs_), b->abort_);
  std::string root = "root " + b->rootAddr_ + " (rank 0)";
  int err = 0;
  IoStatus s = sendFrame(b->rootFd_, kFrameGather, 0, b->seq_, mine, d, &err);
  if (s != IoStatus::Ok) {
    fuscoResult_t pending;
    if (pendingRootError(b->rootFd_, &pending)) return pending;
    return ioFail(s, err, root, "sending allGather data", d.timeoutMs());
  }
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
