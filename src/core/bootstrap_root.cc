// Root side of the TCP bootstrap (see bootstrap.h for the contract, bootstrap_wire.h for the wire
// format): the process-global listen table that keeps each unique id's listening socket, and the
// rendezvous in which rank 0 accepts, authenticates and answers every other rank.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>

#include "core/bootstrap_hello.h"
#include "core/bootstrap_wire.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/result.h"
#include "core/socket.h"

namespace fusco::bootstrap_detail {

ListenTable& listenTable() {
  static ListenTable* t = new ListenTable();  // never destroyed: usable from atexit handlers
  return *t;
}

// ---------------------------------------------------------------- root rendezvous
namespace {

// A connection the root accepted but whose HELLO is not complete yet.
struct PendingConn {
  int fd = -1;
  std::string peer;
  HelloReader hello;
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
  // The rendezvous fails from the start with this error: it only answers the ranks that arrive.
  void presetError(fuscoResult_t r, const std::string& msg) {
    err_ = r;
    errMsg_ = msg;
    lastArrivalNs_ = nowNs();
  }
  // [out] fds: one connected socket per rank (-1 for rank 0); blobs: every rank's blob.
  fuscoResult_t run(const std::string& myBlob, std::vector<int>* fds,
                    std::vector<std::string>* blobs);

 private:
  bool done() const;
  void acceptNew();
  bool readPending(PendingConn& c);  // false: the connection is finished (dropped or handed over)
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
    c.hello = HelloReader(secret_);
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

// The HELLO is parsed by HelloReader (bootstrap_hello.h), which authenticates before believing
// any other field and allocates the blob only after its length passed the bound.
bool RootRendezvous::readPending(PendingConn& c) {
  for (;;) {
    if (c.hello.complete()) {
      onHello(c);
      return false;
    }
    size_t want = 0;
    void* dst = c.hello.next(&want);
    size_t got = 0;
    int err = 0;
    IoStatus s = socketRecvSome(c.fd, dst, want, &got, &err);
    if (s != IoStatus::Ok) {
      refuse(c, c.hello.inHeader() ? "closed before a complete hello header"
                                   : "closed in the middle of its blob");
      return false;
    }
    if (got == 0) return true;  // wait for more
    const char* why = nullptr;
    if (c.hello.advance(got, &why) == HelloReader::Step::Refused) {
      refuse(c, why);
      return false;
    }
  }
}

void RootRendezvous::onHello(PendingConn& c) {
  ++arrived_;
  lastArrivalNs_ = nowNs();
  int fd = c.fd;
  c.fd = -1;  // handed over to fdOf_ or extraFds_
  const HelloHeader& h = c.hello.header();
  if (h.nranks != nranks_) {
    recordError(fuscoInvalidUsage, "bootstrap: rank %d says nranks=%d but root %s has nranks=%d",
                h.rank, h.nranks, addr_.c_str(), nranks_);
  } else if (h.rank < 0 || h.rank >= nranks_) {
    recordError(fuscoInvalidUsage, "bootstrap: rank %d is out of range [0,%d) (from %s)", h.rank,
                nranks_, c.peer.c_str());
  } else if (h.rank == 0 || fdOf_[h.rank] >= 0) {
    recordError(fuscoInvalidUsage, "bootstrap: rank %d joined twice (again from %s)", h.rank,
                c.peer.c_str());
  } else {
    fdOf_[h.rank] = fd;
    blobs_[h.rank].swap(c.hello.blob());
    ++valid_;
    FUSCO_TRACE(kBoot, "bootstrap: rank %d connected from %s", h.rank, c.peer.c_str());
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

}  // namespace

bool markIdUsed(uint64_t secret, int rank) {
  ListenTable& t = listenTable();
  std::lock_guard<std::mutex> g(t.mu);
  return t.used.insert({secret, rank}).second;
}

bool idUsed(uint64_t secret, int rank) {
  ListenTable& t = listenTable();
  std::lock_guard<std::mutex> g(t.mu);
  return t.used.count({secret, rank}) != 0;
}

std::string reusedIdMessage(const std::string& addr) {
  return "bootstrap: unique id " + addr +
         " was already used for a communicator; call fuscoGetUniqueId once per communicator";
}

fuscoResult_t takeListenFd(const IdFields& f, const std::string& addr, int* fd, bool* reused) {
  *reused = !markIdUsed(f.secret, 0);
  if (!*reused) {
    ListenTable& t = listenTable();
    std::lock_guard<std::mutex> g(t.mu);
    auto it = t.fds.find(f.secret);
    if (it != t.fds.end()) {
      *fd = it->second;
      t.fds.erase(it);
      FUSCO_INFO(kBoot, "bootstrap: root uses the listening socket of id %s", addr.c_str());
      return fuscoSuccess;
    }
  }
  SockAddr bound;
  fuscoResult_t r = socketListen(idSockAddr(f), kListenBacklog, true, fd, &bound);
  if (*reused && r != fuscoSuccess)  // nobody can be told: this rank at least is
    return FUSCO_FAIL(fuscoInvalidUsage, kBoot, "%s", reusedIdMessage(addr).c_str());
  FUSCO_CHECK(r);
  FUSCO_INFO(kBoot, "bootstrap: root bound %s itself (%s)", addr.c_str(),
             *reused ? "to refuse a reused id" : "id made by another process");
  return fuscoSuccess;
}

fuscoResult_t refuseReusedId(int listenFd, int nranks, uint64_t secret, const std::string& addr,
                             int64_t timeoutMs) {
  RootRendezvous rv(listenFd, nranks, secret, addr, timeoutMs);
  rv.presetError(fuscoInvalidUsage, reusedIdMessage(addr));
  std::vector<int> fds;
  std::vector<std::string> blobs;
  return rv.run(std::string(), &fds, &blobs);
}

fuscoResult_t runRootRendezvous(int listenFd, int nranks, uint64_t secret, const std::string& addr,
                                int64_t timeoutMs, const std::string& myBlob, std::vector<int>* fds,
                                std::vector<std::string>* blobs) {
  RootRendezvous rv(listenFd, nranks, secret, addr, timeoutMs);
  return rv.run(myBlob, fds, blobs);
}

}  // namespace fusco::bootstrap_detail
