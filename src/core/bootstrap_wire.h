// Internal to the TCP bootstrap (bootstrap.cc, bootstrap_root.cc): the wire format, its constants,
// the unique id's fields and the frame helpers both sides of the rendezvous use. Not part of any
// other layer's interface.
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
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/log.h"
#include "core/result.h"
#include "core/socket.h"
#include "fusco.h"

namespace fusco::bootstrap_detail {

constexpr uint64_t magic8(const char (&s)[9]) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[i]);
  return v;
}

inline constexpr uint64_t kIdMagic = magic8("FUSCOBID");
inline constexpr uint64_t kHelloMagic = magic8("FUSCOHLO");
inline constexpr uint64_t kFrameMagic = magic8("FUSCOMSG");
inline constexpr uint32_t kIdVersion = 1;
inline constexpr size_t kHeaderBytes = 32;  // HELLO and FRAME headers have the same size
inline constexpr uint64_t kMaxBlob = 64ull << 20;
inline constexpr uint64_t kMaxErrorText = 16384;
inline constexpr int kMaxRanks = 1 << 20;
inline constexpr int kListenBacklog = 16384;
inline constexpr int kMaxPending = 4096;  // half-open connections the root keeps reading at once
// After the first error the root waits this long for more ranks, so that ranks still on their
// way hear the error instead of timing out on a closed port.
inline constexpr int64_t kErrorGraceMs = 250;
inline constexpr int64_t kErrorSendMs = 500;

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

inline IdFields decodeId(const fuscoUniqueId& id) {
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

inline void encodeId(const IdFields& f, fuscoUniqueId* id) {
  memset(id->internal, 0, sizeof(id->internal));
  auto* p = reinterpret_cast<unsigned char*>(id->internal);
  wirePut64(p, f.magic);
  wirePut32(p + 8, f.version);
  wirePut32(p + 12, f.family | static_cast<uint32_t>(f.port) << 16);
  memcpy(p + 16, f.addr, 16);
  wirePut64(p + 32, f.secret);
}

inline SockAddr idSockAddr(const IdFields& f) {
  return sockAddrFromRaw(f.family == 6 ? AF_INET6 : AF_INET, f.addr, f.port);
}

// Constant time, so a peer guessing the secret learns nothing from how fast it is refused.
inline bool secretEqual(uint64_t a, uint64_t b) {
  volatile uint64_t diff = a ^ b;
  uint64_t d = diff;
  d |= d >> 32;
  d |= d >> 16;
  d |= d >> 8;
  return (d & 0xff) == 0;
}

// splitmix64 finalizer: the tag is public (it names shm segments), the secret must not be.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// ---------------------------------------------------------------- process-global listen table
// Keyed by secret. A forked child inherits both the table and the fds, so rank 0 may run there.
struct ListenTable {
  std::mutex mu;
  std::map<uint64_t, int> fds;              // secret -> listening fd
  std::set<std::pair<uint64_t, int>> used;  // (secret, rank) this process joined as
};

// The process-global table (defined in bootstrap_root.cc). Never destroyed: usable from atexit
// handlers.
ListenTable& listenTable();

// ---------------------------------------------------------------- frames
inline IoStatus sendFrame(int fd, uint32_t type, uint32_t code, uint64_t seq,
                          const std::string& payload, const Deadline& d, int* err) {
  return socketSendFrame(fd, SocketFrame{kFrameMagic, type, code, seq, payload.size()}, payload, d,
                         err);
}

// One message for a failed send/recv with `who` ("rank 2", "root 10.0.0.1:4242").
inline fuscoResult_t ioFail(IoStatus s, int err, const std::string& who, const char* what,
                            int64_t timeoutMs, std::string* msgOut = nullptr) {
  char buf[512];
  fuscoResult_t r;
  if (s == IoStatus::Closed) {
    r = fuscoRemoteError;
    snprintf(buf, sizeof(buf), "bootstrap: %s closed its connection (while %s)", who.c_str(), what);
  } else if (s == IoStatus::Timeout) {
    r = fuscoTimeout;
    snprintf(buf, sizeof(buf),
             "bootstrap: %s did not respond within %lld ms without progress (while %s)",
             who.c_str(), static_cast<long long>(timeoutMs), what);
  } else if (s == IoStatus::Aborted) {
    r = fuscoInvalidUsage;
    snprintf(buf, sizeof(buf),
             "bootstrap: aborted (fuscoCommAbort) while waiting for %s (while %s)", who.c_str(),
             what);
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

inline std::string encodeTable(const std::vector<std::string>& blobs) {
  std::string t(blobs.size() * 8, '\0');
  for (size_t i = 0; i < blobs.size(); ++i)
    wirePut64(reinterpret_cast<unsigned char*>(&t[i * 8]), blobs[i].size());
  for (const auto& b : blobs) t += b;
  return t;
}

inline bool decodeTable(const std::string& t, int nranks, std::vector<std::string>* out) {
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

inline uint64_t tableCap(int nranks) { return static_cast<uint64_t>(nranks) * (8 + kMaxBlob); }

// Non-root ranks wait a little longer than the root so that the root's error normally arrives
// before their own timeout fires.
inline int64_t peerTimeoutMs(int64_t t) { return t + std::min<int64_t>(2000, 200 + t / 10); }

// ---------------------------------------------------------------- root side (bootstrap_root.cc)
// Marks the id used by this process as `rank` (an id serves exactly one communicator); false when
// it already was, so the call reuses an id. idUsed only asks.
bool markIdUsed(uint64_t secret, int rank);
bool idUsed(uint64_t secret, int rank);
// The message every rank of a reused id reports.
std::string reusedIdMessage(const std::string& addr);

// Takes this process's listening socket for the id, or binds the id's address when the id was
// made by another process, and marks the id used as rank 0. For an id this process already used
// as rank 0 it binds the address again where it can and sets *reused: the caller then tells
// every rank that arrives that the id was used (refuseReusedId).
fuscoResult_t takeListenFd(const IdFields& f, const std::string& addr, int* fd, bool* reused);
// Answers every rank that says hello on listenFd (until all arrived, or a short grace after the
// last arrival) with the reused-id error, and returns it.
fuscoResult_t refuseReusedId(int listenFd, int nranks, uint64_t secret, const std::string& addr,
                             int64_t timeoutMs);

// Root side of init for nranks > 1: accepts connections on listenFd, authenticates HELLOs, detects
// bad ranks, and either distributes the blob table or sends everybody the first error.
// [out] fds: one connected socket per rank (-1 for rank 0); blobs: every rank's blob.
fuscoResult_t runRootRendezvous(int listenFd, int nranks, uint64_t secret, const std::string& addr,
                                int64_t timeoutMs, const std::string& myBlob, std::vector<int>* fds,
                                std::vector<std::string>* blobs);

}  // namespace fusco::bootstrap_detail
