// Small TCP helpers for the bootstrap: pick the interface, listen, connect with retry, and move
// bytes with a Deadline. Every socket is CLOEXEC (a forked-and-exec'd child must not keep a
// rank's connection alive) and non-blocking (every wait is a poll() bounded by a deadline).
// These helpers report what happened (IoStatus + errno) without logging: the caller knows which
// rank the socket belongs to and writes the one message that names it.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/clock.h"
#include "fusco.h"

namespace fusco {

// An IPv4 or IPv6 socket address.
struct SockAddr {
  sockaddr_storage ss{};
  socklen_t len = 0;

  int family() const { return ss.ss_family; }
  uint16_t port() const;        // host byte order
  void setPort(uint16_t port);  // host byte order
};

// Address from/to raw bytes (4 for IPv4, 16 for IPv6), as carried in a unique id.
SockAddr sockAddrFromRaw(int family, const unsigned char* raw, uint16_t port);
void sockAddrToRaw(const SockAddr& a, unsigned char raw[16]);

// "ip:port" ("[ip]:port" for IPv6).
std::string sockAddrToString(const SockAddr& a);

// Does interface `name` pass the FUSCO_SOCKET_IFNAME-style filter `spec`? Comma-separated
// prefixes; a leading '^' excludes the listed names instead; a following '=' makes the names exact
// (e.g. "^=docker0"). An empty spec passes everything.
bool socketIfnameMatches(const std::string& spec, const std::string& name);

// Chooses the bootstrap address from FUSCO_SOCKET_IFNAME (if set: the first up interface that
// matches, IPv4 preferred), else the first up non-loopback IPv4 interface, else 127.0.0.1.
// [out] addr (port 0), ifName. fuscoInvalidUsage when FUSCO_SOCKET_IFNAME matches nothing.
fuscoResult_t socketFindInterface(SockAddr* addr, std::string* ifName);

// Binds addr (port 0: an ephemeral port) and listens. [out] fd (non-blocking), bound (with the
// port). reuseAddr lets a process re-bind a port another process is done with. Logs on failure.
fuscoResult_t socketListen(const SockAddr& addr, int backlog, bool reuseAddr, int* fd,
                           SockAddr* bound);

// Aborted: the deadline's abort flag was raised (fuscoCommAbort) while the call waited.
enum class IoStatus { Ok, Closed, Timeout, Error, Aborted };
const char* ioStatusName(IoStatus s);

// Connects to addr, retrying refused/reset/timed-out attempts with a short sleep until the
// deadline (the listener may not be up yet). [out] fd (non-blocking, TCP_NODELAY), err (errno).
IoStatus socketConnect(const SockAddr& addr, const Deadline& d, int* fd, int* err);

// Accepts one pending connection from a non-blocking listener. Returns Ok with *fd set,
// Timeout when none is pending (EAGAIN), Error otherwise (err = errno).
IoStatus socketAccept(int listenFd, int* fd, SockAddr* peer, int* err);

// Sends/receives exactly n bytes before the deadline, which restarts whenever bytes move (a timeout
// is time without progress). Closed: the peer closed (EOF, EPIPE or ECONNRESET); Timeout: the
// deadline passed first; Aborted: its abort flag was raised; Error: another errno in *err.
IoStatus socketSendAll(int fd, const void* buf, size_t n, const Deadline& d, int* err);
IoStatus socketRecvAll(int fd, void* buf, size_t n, const Deadline& d, int* err);

// Receives exactly len bytes into *out (resized; a failed allocation is Error with ENOMEM). The
// caller checks len against its cap first: it may come from a peer.
IoStatus socketRecvString(int fd, uint64_t len, std::string* out, const Deadline& d, int* err);

// Reads what is available without waiting (0 bytes on EAGAIN). [out] got. Closed on EOF.
IoStatus socketRecvSome(int fd, void* buf, size_t n, size_t* got, int* err);

// A 32-byte typed message header: magic u64 | type u32 | code u32 | seq u64 | len u64
// (little-endian), followed by len payload bytes. The magic and types belong to the caller.
struct SocketFrame {
  uint64_t magic = 0;
  uint32_t type = 0;
  uint32_t code = 0;
  uint64_t seq = 0;
  uint64_t len = 0;
};
constexpr size_t kSocketFrameBytes = 32;
// Sends h (its len must be payload.size()) and the payload.
IoStatus socketSendFrame(int fd, const SocketFrame& h, const std::string& payload,
                         const Deadline& d, int* err);
// The header and payload of a frame as the bytes sent (for socketSendToAll).
std::string socketFrameBytes(const SocketFrame& f, const std::string& payload);
// Receives a header only; the caller checks magic and len before reading the payload.
IoStatus socketRecvFrameHeader(int fd, SocketFrame* h, const Deadline& d, int* err);

// Little-endian encoding for wire headers (independent of the host's byte order).
inline void wirePut32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline void wirePut64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline uint32_t wireGet32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline uint64_t wireGet64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Sends the same bytes to every fd of fds (-1: skipped), interleaved in slices so that every
// receiver sees its bytes arrive while the others are served: each receiver's timeout counts time
// without progress, and one that waits behind all the others would otherwise see none. On a
// failure *bad is the index of the fd that failed (-1: none, a timeout or an abort).
IoStatus socketSendToAll(const std::vector<int>& fds, const std::string& bytes, const Deadline& d,
                         int* bad, int* err);

// Closes fd if open and sets it to -1.
void socketClose(int* fd);

}  // namespace fusco
