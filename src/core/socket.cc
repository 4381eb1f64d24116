#include "core/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <vector>

#include "core/params.h"
#include "core/result.h"

namespace fusco {

namespace {

constexpr int kConnectRetrySleepMs = 20;

bool isPeerGone(int e) { return e == EPIPE || e == ECONNRESET || e == ENOTCONN; }

// How long one poll may sleep before the deadline and its abort flag are looked at again: the
// remaining time, rounded up so a sub-millisecond remainder still waits instead of spinning, and
// no longer than Deadline::kAbortPollMs when an abort can end the wait.
int pollSliceMs(const Deadline& d) {
  int64_t ms = d.remainingMs();
  if (ms <= 0) ms = 1;
  if (d.abortFlag() != nullptr && ms > Deadline::kAbortPollMs) ms = Deadline::kAbortPollMs;
  return static_cast<int>(ms);
}

// Wait for `events` on fd until the deadline. Returns Ok when ready, Timeout, Aborted, or Error.
IoStatus waitFd(int fd, short events, const Deadline& d, int* err) {
  for (;;) {
    if (d.aborted()) return IoStatus::Aborted;
    if (d.expired()) return IoStatus::Timeout;
    pollfd p{fd, events, 0};
    int rc = poll(&p, 1, pollSliceMs(d));
    if (rc > 0) return IoStatus::Ok;  // POLLERR/POLLHUP: the next send/recv reports it
    if (rc == 0) continue;            // loop re-checks the deadline
    if (errno == EINTR) continue;
    *err = errno;
    return IoStatus::Error;
  }
}

void encodeFrameHeader(const SocketFrame& f, unsigned char* h) {
  wirePut64(h, f.magic);
  wirePut32(h + 8, f.type);
  wirePut32(h + 12, f.code);
  wirePut64(h + 16, f.seq);
  wirePut64(h + 24, f.len);
}

// One slice of socketSendToAll to fds[i]: Ok when it moved bytes or the socket is full.
IoStatus sendSlice(int fd, const std::string& bytes, size_t* sent, int* err) {
  constexpr size_t kSlice = 256 << 10;
  const size_t n = std::min(kSlice, bytes.size() - *sent);
  ssize_t k = send(fd, bytes.data() + *sent, n, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (k > 0) *sent += static_cast<size_t>(k);
  if (k >= 0 || errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) return IoStatus::Ok;
  *err = errno;
  return isPeerGone(*err) ? IoStatus::Closed : IoStatus::Error;
}

void setNoDelay(int fd) {
  int one = 1;
  // Bootstrap messages are small request/response pairs: Nagle would add ~40 ms per round.
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

bool isLinkLocal6(const sockaddr_in6* a) { return IN6_IS_ADDR_LINKLOCAL(&a->sin6_addr); }

// Picks the first up interface that passes `accept`, IPv4 first (link-local IPv6 needs a scope id
// that a unique id cannot carry to another host, so it is skipped).
bool pickInterface(ifaddrs* list, bool (*accept)(const ifaddrs*, const std::string&),
                   const std::string& spec, SockAddr* out, std::string* name) {
  for (int family : {AF_INET, AF_INET6}) {
    for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != family) continue;
      if ((i->ifa_flags & IFF_UP) == 0) continue;
      if (family == AF_INET6 && isLinkLocal6(reinterpret_cast<sockaddr_in6*>(i->ifa_addr)))
        continue;
      if (!accept(i, spec)) continue;
      out->len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      memcpy(&out->ss, i->ifa_addr, out->len);
      out->setPort(0);
      *name = i->ifa_name;
      return true;
    }
  }
  return false;
}

bool acceptBySpec(const ifaddrs* i, const std::string& spec) {
  return socketIfnameMatches(spec, i->ifa_name);
}
bool acceptNonLoopback4(const ifaddrs* i, const std::string&) {
  return i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_LOOPBACK) == 0;
}

std::string listInterfaces(ifaddrs* list) {
  std::vector<std::string> names;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    int f = i->ifa_addr->sa_family;
    if (f != AF_INET && f != AF_INET6) continue;
    bool seen = false;
    for (const auto& n : names) seen = seen || n == i->ifa_name;
    if (!seen) names.push_back(i->ifa_name);
  }
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ",") + n;
  return s.empty() ? "(none)" : s;
}

}  // namespace

FUSCO_PARAM_STRING(
    SocketIfname, "FUSCO_SOCKET_IFNAME", "",
    "network interface (prefix) for the bootstrap socket; ^ excludes, = exact match");

uint16_t SockAddr::port() const {
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

void SockAddr::setPort(uint16_t port) {
  if (ss.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(port);
  if (ss.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(port);
}

SockAddr sockAddrFromRaw(int family, const unsigned char* raw, uint16_t port) {
  SockAddr a;
  if (family == AF_INET6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&a.ss);
    s6->sin6_family = AF_INET6;
    memcpy(&s6->sin6_addr, raw, 16);
    a.len = sizeof(sockaddr_in6);
  } else {
    auto* s4 = reinterpret_cast<sockaddr_in*>(&a.ss);
    s4->sin_family = AF_INET;
    memcpy(&s4->sin_addr, raw, 4);
    a.len = sizeof(sockaddr_in);
  }
  a.setPort(port);
  return a;
}

void sockAddrToRaw(const SockAddr& a, unsigned char raw[16]) {
  memset(raw, 0, 16);
  if (a.family() == AF_INET6)
    memcpy(raw, &reinterpret_cast<const sockaddr_in6*>(&a.ss)->sin6_addr, 16);
  else if (a.family() == AF_INET)
    memcpy(raw, &reinterpret_cast<const sockaddr_in*>(&a.ss)->sin_addr, 4);
}

std::string sockAddrToString(const SockAddr& a) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (a.family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&a.ss)->sin_addr, ip, sizeof(ip));
    return std::string(ip) + ":" + std::to_string(a.port());
  }
  if (a.family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&a.ss)->sin6_addr, ip, sizeof(ip));
    return "[" + std::string(ip) + "]:" + std::to_string(a.port());
  }
  return "?";
}

bool socketIfnameMatches(const std::string& spec, const std::string& name) {
  if (spec.empty()) return true;
  size_t pos = 0;
  bool exclude = false, exact = false;
  if (pos < spec.size() && spec[pos] == '^') exclude = true, ++pos;
  if (pos < spec.size() && spec[pos] == '=') exact = true, ++pos;
  bool listed = false;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    std::string tok = spec.substr(pos, comma - pos);
    if (!tok.empty()) {
      bool m = exact ? name == tok : name.compare(0, tok.size(), tok) == 0;
      if (m) listed = true;
    }
    pos = comma + 1;
  }
  return exclude ? !listed : listed;
}

fuscoResult_t socketFindInterface(SockAddr* addr, std::string* ifName) {
  std::string spec = paramSocketIfname();
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0)
    return FUSCO_FAIL(fuscoSystemError, kBoot, "getifaddrs failed: %s", strerror(errno));
  bool found;
  if (!spec.empty()) {
    found = pickInterface(list, acceptBySpec, spec, addr, ifName);
    if (!found) {
      std::string all = listInterfaces(list);
      freeifaddrs(list);
      return FUSCO_FAIL(fuscoInvalidUsage, kBoot,
                        "bootstrap: no up interface with an address matches FUSCO_SOCKET_IFNAME=%s "
                        "(interfaces: %s)",
                        spec.c_str(), all.c_str());
    }
  } else {
    found = pickInterface(list, acceptNonLoopback4, spec, addr, ifName);
  }
  freeifaddrs(list);
  if (!found) {
    // A single host without a configured network still works over loopback.
    sockaddr_in lo{};
    lo.sin_family = AF_INET;
    lo.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    memcpy(&addr->ss, &lo, sizeof(lo));
    addr->len = sizeof(lo);
    *ifName = "lo";
  }
  std::string ip = sockAddrToString(*addr);
  ip = ip.substr(0, ip.rfind(':'));  // the port is not chosen yet
  FUSCO_INFO(kBoot, "bootstrap: using interface %s address %s (FUSCO_SOCKET_IFNAME=%s)",
             ifName->c_str(), ip.c_str(), spec.empty() ? "<unset>" : spec.c_str());
  return fuscoSuccess;
}

fuscoResult_t socketListen(const SockAddr& addr, int backlog, bool reuseAddr, int* fd,
                           SockAddr* bound) {
  int s = socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) return FUSCO_FAIL(fuscoSystemError, kBoot, "socket() failed: %s", strerror(errno));
  int one = 1;
  if (reuseAddr) setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(s, reinterpret_cast<const sockaddr*>(&addr.ss), addr.len) != 0) {
    int e = errno;
    close(s);
    return FUSCO_FAIL(fuscoSystemError, kBoot, "bootstrap: bind to %s failed: %s",
                      sockAddrToString(addr).c_str(), strerror(e));
  }
  if (listen(s, backlog) != 0) {
    int e = errno;
    close(s);
    return FUSCO_FAIL(fuscoSystemError, kBoot, "bootstrap: listen on %s failed: %s",
                      sockAddrToString(addr).c_str(), strerror(e));
  }
  bound->len = sizeof(bound->ss);
  if (getsockname(s, reinterpret_cast<sockaddr*>(&bound->ss), &bound->len) != 0) {
    int e = errno;
    close(s);
    return FUSCO_FAIL(fuscoSystemError, kBoot, "getsockname failed: %s", strerror(e));
  }
  *fd = s;
  return fuscoSuccess;
}

const char* ioStatusName(IoStatus s) {
  switch (s) {
    case IoStatus::Ok:
      return "ok";
    case IoStatus::Closed:
      return "connection closed";
    case IoStatus::Timeout:
      return "timed out";
    case IoStatus::Aborted:
      return "aborted";
    default:
      return "error";
  }
}

IoStatus socketConnect(const SockAddr& addr, const Deadline& d, int* fd, int* err) {
  *fd = -1;
  for (;;) {
    int s = socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0) {
      *err = errno;
      return IoStatus::Error;
    }
    int e = 0;
    if (connect(s, reinterpret_cast<const sockaddr*>(&addr.ss), addr.len) != 0) e = errno;
    if (e == EINPROGRESS || e == EINTR) {
      IoStatus w = waitFd(s, POLLOUT, d, err);
      if (w != IoStatus::Ok) {
        close(s);
        return w;
      }
      socklen_t l = sizeof(e);
      if (getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &l) != 0) e = errno;
    }
    if (e == 0) {
      setNoDelay(s);
      *fd = s;
      return IoStatus::Ok;
    }
    close(s);
    // The root may not be listening yet, or its backlog is momentarily full: try again.
    bool retry = e == ECONNREFUSED || e == ETIMEDOUT || e == ECONNRESET || e == EAGAIN;
    if (!retry) {
      *err = e;
      return IoStatus::Error;
    }
    if (d.expired()) {
      *err = e;
      return IoStatus::Timeout;
    }
    int64_t ms = d.remainingMs();
    usleep(static_cast<useconds_t>((ms < kConnectRetrySleepMs ? ms : kConnectRetrySleepMs) * 1000));
  }
}

IoStatus socketAccept(int listenFd, int* fd, SockAddr* peer, int* err) {
  for (;;) {
    peer->len = sizeof(peer->ss);
    int s = accept4(listenFd, reinterpret_cast<sockaddr*>(&peer->ss), &peer->len,
                    SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (s >= 0) {
      setNoDelay(s);
      *fd = s;
      return IoStatus::Ok;
    }
    if (errno == EINTR) continue;
    // A connection that was reset while queued is not an error of the listener.
    if (errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return IoStatus::Timeout;
    *err = errno;
    return IoStatus::Error;
  }
}

IoStatus socketSendAll(int fd, const void* buf, size_t n, const Deadline& d, int* err) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      d.progressed();
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      IoStatus w = waitFd(fd, POLLOUT, d, err);
      if (w != IoStatus::Ok) return w;
      continue;
    }
    *err = k < 0 ? errno : EPIPE;
    return isPeerGone(*err) ? IoStatus::Closed : IoStatus::Error;
  }
  return IoStatus::Ok;
}

IoStatus socketRecvSome(int fd, void* buf, size_t n, size_t* got, int* err) {
  *got = 0;
  for (;;) {
    ssize_t k = recv(fd, buf, n, 0);
    if (k > 0) {
      *got = static_cast<size_t>(k);
      return IoStatus::Ok;
    }
    if (k == 0) return n == 0 ? IoStatus::Ok : IoStatus::Closed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return IoStatus::Ok;
    *err = errno;
    return isPeerGone(*err) ? IoStatus::Closed : IoStatus::Error;
  }
}

IoStatus socketRecvAll(int fd, void* buf, size_t n, const Deadline& d, int* err) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    size_t got = 0;
    IoStatus s = socketRecvSome(fd, p, n, &got, err);
    if (s != IoStatus::Ok) return s;
    if (got == 0) {
      IoStatus w = waitFd(fd, POLLIN, d, err);
      if (w != IoStatus::Ok) return w;
      continue;
    }
    p += got;
    n -= got;
    d.progressed();
  }
  return IoStatus::Ok;
}

IoStatus socketRecvString(int fd, uint64_t len, std::string* out, const Deadline& d, int* err) {
  try {
    out->resize(len);
  } catch (const std::exception&) {  // bad_alloc or length_error
    *err = ENOMEM;
    return IoStatus::Error;
  }
  return len == 0 ? IoStatus::Ok : socketRecvAll(fd, &(*out)[0], len, d, err);
}

IoStatus socketSendFrame(int fd, const SocketFrame& f, const std::string& payload,
                         const Deadline& d, int* err) {
  unsigned char h[kSocketFrameBytes];
  encodeFrameHeader(f, h);
  IoStatus s = socketSendAll(fd, h, sizeof(h), d, err);
  if (s != IoStatus::Ok || payload.empty()) return s;
  return socketSendAll(fd, payload.data(), payload.size(), d, err);
}

IoStatus socketRecvFrameHeader(int fd, SocketFrame* f, const Deadline& d, int* err) {
  unsigned char h[kSocketFrameBytes];
  IoStatus s = socketRecvAll(fd, h, sizeof(h), d, err);
  if (s != IoStatus::Ok) return s;
  f->magic = wireGet64(h);
  f->type = wireGet32(h + 8);
  f->code = wireGet32(h + 12);
  f->seq = wireGet64(h + 16);
  f->len = wireGet64(h + 24);
  return IoStatus::Ok;
}

std::string socketFrameBytes(const SocketFrame& f, const std::string& payload) {
  std::string out(kSocketFrameBytes, '\0');
  encodeFrameHeader(f, reinterpret_cast<unsigned char*>(&out[0]));
  return out + payload;
}

IoStatus socketSendToAll(const std::vector<int>& fds, const std::string& bytes, const Deadline& d,
                         int* bad, int* err) {
  *bad = -1;
  std::vector<size_t> sent(fds.size(), 0);
  std::vector<pollfd> waiting;
  for (;;) {
    waiting.clear();
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i] < 0 || sent[i] == bytes.size()) continue;
      const size_t before = sent[i];
      const IoStatus s = sendSlice(fds[i], bytes, &sent[i], err);
      if (s != IoStatus::Ok) {
        *bad = static_cast<int>(i);
        return s;
      }
      if (sent[i] != before) d.progressed();
      if (sent[i] < bytes.size()) waiting.push_back(pollfd{fds[i], POLLOUT, 0});
    }
    if (waiting.empty()) return IoStatus::Ok;
    if (d.aborted()) return IoStatus::Aborted;
    if (d.expired()) return IoStatus::Timeout;
    if (poll(waiting.data(), waiting.size(), pollSliceMs(d)) < 0 && errno != EINTR) {
      *err = errno;
      return IoStatus::Error;
    }
  }
}

void socketClose(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

}  // namespace fusco
