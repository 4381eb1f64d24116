// Traffic for the transport tests (see transport_traffic.h).
#include "harness/transport_traffic.h"

#include <sched.h>

#include <cstring>
#include <vector>

namespace fusco::test::transport {

namespace {

constexpr uint64_t kSeed = 0x5eed1234abcdULL;
constexpr int64_t kLivenessNs = 1000000;  // checkPeer at most once a millisecond, as the engine

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The engine's wait: `step` until it reports done, stepping the transport and checking the peer
// when nothing moves; checkPeer's error, or fuscoTimeout at ms.
template <typename Step>
fuscoResult_t waitFor(RankEnv& e, int peer, int64_t ms, Step step) {
  Deadline d(ms);
  int64_t lastLive = nowNs();
  for (;;) {
    bool done = false;
    fuscoResult_t r = step(&done);
    if (r != fuscoSuccess || done) return r;
    if (e.ops->progress != nullptr) e.ops->progress(e.tc);
    if (nowNs() - lastLive >= kLivenessNs) {
      lastLive = nowNs();
      if ((r = e.ops->checkPeer(e.tc, peer)) != fuscoSuccess) return r;
    }
    if (d.expired()) return fuscoTimeout;
    sched_yield();
  }
}

}  // namespace

Msg message(int src, int dst, uint64_t idx, size_t chunk) {
  uint64_t h = mix(kSeed ^ (uint64_t(src) << 48) ^ (uint64_t(dst) << 32) ^ idx);
  size_t lens[] = {0, 1, chunk, chunk - 1, 8};
  size_t len = idx % 7 < 5 ? lens[idx % 7] : static_cast<size_t>(h % (chunk + 1));
  return {static_cast<uint32_t>(h >> 32), len, mix(h)};
}

void fillPayload(uint8_t* p, const Msg& m) {
  uint64_t s = m.seed;
  for (size_t i = 0; i < m.len; ++i) {
    if (i % 8 == 0) s = mix(s);
    p[i] = static_cast<uint8_t>(s >> (8 * (i % 8)));
  }
}

uint8_t streamByte(int src, int dst, size_t i) {
  return static_cast<uint8_t>(
      mix(kSeed ^ (uint64_t(src) << 56) ^ (uint64_t(dst) << 48) ^ (i / 8)) >> (8 * (i % 8)));
}

// One round over the peers: post the next message where a slot is free, check the next message
// where one arrived. *progress when anything moved.
static int exchangeRound(RankEnv& e, uint64_t count, std::vector<uint64_t>& sent,
                         std::vector<uint64_t>& got, std::vector<uint8_t>& expect, bool* progress) {
  for (int p : e.peers) {
    void* buf = nullptr;
    size_t cap = 0;
    if (sent[p] < count)
      CHILD_CHECK(e.ops->sendAcquire(e.tc, p, &buf, &cap) == fuscoSuccess, "acquire");
    if (buf != nullptr) {
      CHILD_CHECK(cap == e.ctx.chunkBytes, "capacity %zu", cap);
      Msg m = message(e.rank, p, sent[p], cap);
      fillPayload(static_cast<uint8_t*>(buf), m);
      CHILD_CHECK(e.ops->sendPost(e.tc, p, m.tag, m.len) == fuscoSuccess, "post");
      ++sent[p];
      *progress = true;
    }
    const void* in = nullptr;
    size_t len = 0;
    uint32_t tag = 0;
    CHILD_CHECK(e.ops->recvPoll(e.tc, p, &in, &len, &tag) == fuscoSuccess, "poll");
    if (in == nullptr) continue;
    CHILD_CHECK(got[p] < count, "extra message from %d", p);
    Msg m = message(p, e.rank, got[p], e.ctx.chunkBytes);
    CHILD_CHECK(len == m.len && tag == m.tag, "message %llu from %d: len %zu tag %u, want %zu %u",
                (unsigned long long)got[p], p, len, tag, m.len, m.tag);
    fillPayload(expect.data(), m);
    CHILD_CHECK(memcmp(in, expect.data(), len) == 0, "payload %llu from %d differs",
                (unsigned long long)got[p], p);
    CHILD_CHECK(e.ops->recvRelease(e.tc, p) == fuscoSuccess, "release");
    ++got[p];
    *progress = true;
  }
  return 0;
}

int exchangeAll(RankEnv& e, uint64_t count) {
  std::vector<uint64_t> sent(e.nranks, 0), got(e.nranks, 0);
  std::vector<uint8_t> expect(e.ctx.chunkBytes);
  Deadline d(kTimeoutMs);
  for (;;) {
    size_t done = 0;
    for (int p : e.peers) done += (sent[p] == count) + (got[p] == count);
    if (done == 2 * e.peers.size()) return 0;
    CHILD_CHECK(!d.expired(), "timed out: sent/received not complete");
    bool progress = false;
    if (exchangeRound(e, count, sent, got, expect, &progress) != 0) return 1;
    if (!progress) sched_yield();
  }
}

fuscoResult_t waitSlot(RankEnv& e, int peer, int64_t ms, void** buf, size_t* cap) {
  *buf = nullptr;
  return waitFor(e, peer, ms, [&](bool* done) {
    fuscoResult_t r = e.ops->sendAcquire(e.tc, peer, buf, cap);
    *done = *buf != nullptr;
    return r;
  });
}

fuscoResult_t waitMessage(RankEnv& e, int peer, int64_t ms, const void** buf, size_t* len,
                          uint32_t* tag) {
  *buf = nullptr;
  return waitFor(e, peer, ms, [&](bool* done) {
    fuscoResult_t r = e.ops->recvPoll(e.tc, peer, buf, len, tag);
    *done = *buf != nullptr;
    return r;
  });
}

bool sendBytes(RankEnv& e, int peer, uint32_t tag, const void* src, size_t len) {
  void* buf = nullptr;
  size_t cap = 0;
  if (waitSlot(e, peer, kTimeoutMs, &buf, &cap) != fuscoSuccess || len > cap) return false;
  if (len > 0) memcpy(buf, src, len);
  return e.ops->sendPost(e.tc, peer, tag, len) == fuscoSuccess;
}

bool waitSendsComplete(RankEnv& e, int64_t ms) {
  if (e.ops->sendsInFlight == nullptr) return true;
  Deadline d(ms);
  for (;;) {
    bool any = false;
    for (int p : e.peers) any = any || e.ops->sendsInFlight(e.tc, p);
    if (!any) return true;
    if (d.expired()) return false;
    if (e.ops->progress != nullptr) e.ops->progress(e.tc);
    sched_yield();
  }
}

fuscoResult_t waitForFailure(RankEnv& e, int peer, int64_t ms, int64_t* tookMs) {
  int64_t t0 = nowNs();
  Deadline d(ms);
  fuscoResult_t r;
  while ((r = e.ops->checkPeer(e.tc, peer)) == fuscoSuccess && !d.expired()) {
    if (e.ops->progress != nullptr) e.ops->progress(e.tc);
    usleep(1000);
  }
  *tookMs = (nowNs() - t0) / 1000000;
  return r;
}

}  // namespace fusco::test::transport
