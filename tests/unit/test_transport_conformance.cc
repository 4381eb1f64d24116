// The transport conformance suite: the contract in transport/transport.h, written once and
// run over every transport the build has (Transport/TransportConformance.*/Shm, /Ucx, /CudaIpc), as
// UCX's gtests run each uct test over every transport. Ranks are forked processes
// (harness/transport_group.h) that talk through the ops table only; a transport's descriptor
// (harness/transport_kinds.h) says how its ranks are laid out. Transport-specific cases (shm
// segments and arena, UCX scores) live in test_<name>_transport.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/liveness.h"
#include "core/result.h"
#include "harness/transport_group.h"
#include "harness/transport_kinds.h"
#include "harness/transport_traffic.h"

namespace fusco::test::transport {
// gtest prints a test's parameter with its name: the transport's, not its address.
void PrintTo(const TransportKind* k, std::ostream* os) { *os << k->name; }
}  // namespace fusco::test::transport

namespace {

using namespace fusco::test::transport;  // NOLINT(google-build-using-namespace)
using fusco::Deadline;
using fusco::nowNs;

constexpr size_t kSmallChunk = 4096;
constexpr size_t kChunk = 64 * 1024;  // big enough for UCX's rendezvous path on tcp
constexpr int kDepth = 3;
constexpr int64_t kPromptMs = 3000;   // a death noticed, a close after it: far below kTimeoutMs
constexpr int64_t kFlushedMs = 5000;  // a close that may flush for a bounded time first

// ---------------------------------------------------------------- the per-transport fixture

// Every transport this build has: the suite is instantiated once for each.
std::vector<const TransportKind*> builtTransports() {
  std::vector<const TransportKind*> kinds{&shmKind()};
#ifdef FUSCO_HAVE_UCX
  kinds.push_back(&ucxKind());
#endif
#ifdef FUSCO_HAVE_CUDA
  kinds.push_back(&cudaIpcKind());
#endif
  return kinds;
}

class TransportConformance : public ::testing::TestWithParam<const TransportKind*> {
 protected:
  void SetUp() override {
    bool mustRun = false;
    const std::string why = kindSkipReason(*GetParam(), &mustRun);
    if (mustRun) FAIL() << "FUSCO_TEST_REQUIRE_GPU=1 but " << why;
    if (!why.empty()) GTEST_SKIP() << why;
  }
  Options opts(int nranks, size_t chunk, int depth) const {
    Options o;
    o.kind = GetParam();
    o.nranks = nranks;
    o.chunkBytes = chunk;
    o.depth = depth;
    return o;
  }
};

INSTANTIATE_TEST_SUITE_P(Transport, TransportConformance, ::testing::ValuesIn(builtTransports()),
                         [](const ::testing::TestParamInfo<const TransportKind*>& i) {
                           return std::string(i.param->name);
                         });

// ---------------------------------------------------------------- bodies

// Rank 0 sends `count` messages to rank 1, where every third fills the slot and the others are
// empty; rank 1 checks each message's tag, length and bytes, in order.
int zeroLengthBody(RankEnv& e, uint32_t count) {
  const size_t chunk = e.ctx.chunkBytes;
  std::vector<uint8_t> full(chunk);
  for (size_t i = 0; i < chunk; ++i) full[i] = streamByte(0, 1, i);
  for (uint32_t i = 0; i < count; ++i) {
    const size_t len = i % 3 == 2 ? chunk : 0;
    if (e.rank == 0) {
      CHILD_CHECK(sendBytes(e, 1, 1000 + i, full.data(), len), "message %u", i);
      continue;
    }
    const void* in = nullptr;
    size_t got = 0;
    uint32_t tag = 0;
    CHILD_CHECK(waitMessage(e, 0, kTimeoutMs, &in, &got, &tag) == fuscoSuccess, "message %u", i);
    CHILD_CHECK(tag == 1000 + i && got == len, "message %u: tag %u len %zu", i, tag, got);
    CHILD_CHECK(memcmp(in, full.data(), len) == 0, "message %u's bytes", i);
    CHILD_CHECK(e.ops->recvRelease(e.tc, 0) == fuscoSuccess, "release %u", i);
  }
  return e.barrier() ? 0 : 1;
}

// Both ranks stream `total` bytes to each other at once, cut into slot-sized messages tagged with
// their index, and check the other's stream byte for byte.
int largeMessageBody(RankEnv& e, size_t total) {
  const int peer = 1 - e.rank;
  std::vector<uint8_t> out(total), want(total);
  for (size_t i = 0; i < total; ++i) out[i] = streamByte(e.rank, peer, i);
  for (size_t i = 0; i < total; ++i) want[i] = streamByte(peer, e.rank, i);
  size_t sentOff = 0, gotOff = 0;
  uint32_t sentMsgs = 0, gotMsgs = 0;
  Deadline d(kTimeoutMs);
  while (sentOff < total || gotOff < total) {
    CHILD_CHECK(!d.expired(), "sent %zu, received %zu of %zu bytes", sentOff, gotOff, total);
    void* buf = nullptr;
    size_t cap = 0;
    if (sentOff < total)
      CHILD_CHECK(e.ops->sendAcquire(e.tc, peer, &buf, &cap) == fuscoSuccess, "acquire");
    if (buf != nullptr) {
      size_t n = std::min(cap, total - sentOff);
      memcpy(buf, out.data() + sentOff, n);
      CHILD_CHECK(e.ops->sendPost(e.tc, peer, sentMsgs++, n) == fuscoSuccess, "post");
      sentOff += n;
    }
    const void* in = nullptr;
    size_t len = 0;
    uint32_t tag = 0;
    CHILD_CHECK(e.ops->recvPoll(e.tc, peer, &in, &len, &tag) == fuscoSuccess, "poll");
    if (in == nullptr) continue;
    const size_t n = std::min(e.ctx.chunkBytes, total - gotOff);
    CHILD_CHECK(tag == gotMsgs && len == n, "slice %u: tag %u, %zu bytes (want %zu)", gotMsgs, tag,
                len, n);
    CHILD_CHECK(memcmp(in, want.data() + gotOff, n) == 0, "slice %u's bytes", gotMsgs);
    CHILD_CHECK(e.ops->recvRelease(e.tc, peer) == fuscoSuccess, "release");
    gotOff += n;
    ++gotMsgs;
  }
  CHILD_CHECK(gotMsgs == (total + e.ctx.chunkBytes - 1) / e.ctx.chunkBytes, "%u slices", gotMsgs);
  return e.barrier() ? 0 : 1;
}

// The sender of a depth-3 channel: three slots, then none (for a while) until the receiver
// releases one, then one more, then none again.
int creditSender(RankEnv& e) {
  void* buf = nullptr;
  size_t cap = 0;
  for (uint32_t i = 0; i < 3; ++i) {
    CHILD_CHECK(waitSlot(e, 1, kTimeoutMs, &buf, &cap) == fuscoSuccess, "slot %u", i);
    CHILD_CHECK(e.ops->sendPost(e.tc, 1, 100 + i, i) == fuscoSuccess, "post %u", i);
  }
  Deadline hold(300);  // the receiver holds every message: no slot may appear
  while (!hold.expired()) {
    CHILD_CHECK(e.ops->sendAcquire(e.tc, 1, &buf, &cap) == fuscoSuccess, "acquire");
    CHILD_CHECK(buf == nullptr, "a 4th slot with 3 unreleased");
  }
  CHILD_CHECK(e.barrier(), "barrier A");  // the receiver releases one slot
  CHILD_CHECK(e.barrier(), "barrier B");
  CHILD_CHECK(waitSlot(e, 1, kTimeoutMs, &buf, &cap) == fuscoSuccess, "credit came back");
  CHILD_CHECK(e.ops->sendPost(e.tc, 1, 103, 3) == fuscoSuccess, "post");
  CHILD_CHECK(e.ops->sendAcquire(e.tc, 1, &buf, &cap) == fuscoSuccess, "acquire");
  CHILD_CHECK(buf == nullptr, "full again");
  CHILD_CHECK(e.barrier(), "barrier C");  // only now may the receiver drain
  return e.barrier() ? 0 : 1;
}

int creditReceiver(RankEnv& e) {
  const void* in = nullptr;
  const void* first = nullptr;
  size_t len = 0;
  uint32_t tag = 0;
  CHILD_CHECK(e.barrier(), "barrier A");
  // Polling does not consume: the same message twice, then release frees one credit.
  CHILD_CHECK(waitMessage(e, 0, kTimeoutMs, &first, &len, &tag) == fuscoSuccess, "message");
  CHILD_CHECK(e.ops->recvPoll(e.tc, 0, &in, &len, &tag) == fuscoSuccess && in == first,
              "poll again");
  CHILD_CHECK(tag == 100 && len == 0, "tag %u len %zu", tag, len);
  CHILD_CHECK(e.ops->recvRelease(e.tc, 0) == fuscoSuccess, "release");
  CHILD_CHECK(e.barrier(), "barrier B");
  CHILD_CHECK(e.barrier(), "barrier C");
  for (uint32_t i = 1; i < 4; ++i) {
    CHILD_CHECK(waitMessage(e, 0, kTimeoutMs, &in, &len, &tag) == fuscoSuccess, "message %u", i);
    CHILD_CHECK(tag == 100 + i && len == i, "message %u: tag %u len %zu", i, tag, len);
    CHILD_CHECK(e.ops->recvRelease(e.tc, 0) == fuscoSuccess, "release");
  }
  return e.barrier() ? 0 : 1;
}

// Rank 0 sends `count` messages as fast as credits allow while rank 1 starts late and reads
// slowly: rank 0 must find no slot at times, and every message arrives intact and in order.
int outrunBody(RankEnv& e, uint64_t count) {
  const size_t chunk = e.ctx.chunkBytes;
  Deadline d(kTimeoutMs);
  if (e.rank == 0) {
    uint64_t sent = 0, backoffs = 0;
    while (sent < count) {
      CHILD_CHECK(!d.expired(), "sent %llu of %llu", (unsigned long long)sent,
                  (unsigned long long)count);
      void* buf = nullptr;
      size_t cap = 0;
      CHILD_CHECK(e.ops->sendAcquire(e.tc, 1, &buf, &cap) == fuscoSuccess, "acquire");
      if (buf == nullptr) {
        ++backoffs;
        if (e.ops->progress != nullptr) e.ops->progress(e.tc);
        continue;
      }
      Msg m = message(0, 1, sent++, cap);
      fillPayload(static_cast<uint8_t*>(buf), m);
      CHILD_CHECK(e.ops->sendPost(e.tc, 1, m.tag, m.len) == fuscoSuccess, "post");
    }
    CHILD_CHECK(backoffs > 0, "the sender never ran out of credits");
    return e.barrier() ? 0 : 1;
  }
  usleep(50 * 1000);
  std::vector<uint8_t> expect(chunk);
  for (uint64_t i = 0; i < count; ++i) {
    const void* in = nullptr;
    size_t len = 0;
    uint32_t tag = 0;
    CHILD_CHECK(waitMessage(e, 0, kTimeoutMs, &in, &len, &tag) == fuscoSuccess, "message %llu",
                (unsigned long long)i);
    Msg m = message(0, 1, i, chunk);
    fillPayload(expect.data(), m);
    CHILD_CHECK(len == m.len && tag == m.tag && memcmp(in, expect.data(), len) == 0,
                "message %llu: len %zu tag %u", (unsigned long long)i, len, tag);
    CHILD_CHECK(e.ops->recvRelease(e.tc, 0) == fuscoSuccess, "release");
    if (i % 4 == 0) usleep(200);
  }
  return e.barrier() ? 0 : 1;
}

// Each rank misuses the channel to its peer and to ranks it has no channel to.
int misuseBody(RankEnv& e) {
  const int peer = 1 - e.rank;
  void* buf = nullptr;
  size_t cap = 0;
  const void* in = nullptr;
  size_t len = 0;
  uint32_t tag = 0;
  CHILD_CHECK(e.ops->sendPost(e.tc, peer, 1, 0) == fuscoInternalError, "post without a slot");
  CHILD_CHECK(e.barrier(), "barrier");
  CHILD_CHECK(e.ops->recvRelease(e.tc, peer) == fuscoInternalError, "release without a message");
  CHILD_CHECK(e.barrier(), "barrier");  // nobody posts before both checked the empty channel
  for (int bad : {e.rank, e.nranks, -1}) {
    CHILD_CHECK(e.ops->sendAcquire(e.tc, bad, &buf, &cap) == fuscoInternalError, "acquire %d", bad);
    CHILD_CHECK(e.ops->recvPoll(e.tc, bad, &in, &len, &tag) == fuscoInternalError, "poll %d", bad);
    CHILD_CHECK(e.ops->checkPeer(e.tc, bad) == fuscoInternalError, "checkPeer %d", bad);
  }
  CHILD_CHECK(waitSlot(e, peer, kTimeoutMs, &buf, &cap) == fuscoSuccess, "slot");
  CHILD_CHECK(e.ops->sendPost(e.tc, peer, 9, cap + 1) == fuscoInternalError, "oversized post");
  CHILD_CHECK(e.ops->sendPost(e.tc, peer, 9, cap) == fuscoSuccess, "the slot is still usable");
  CHILD_CHECK(waitMessage(e, peer, kTimeoutMs, &in, &len, &tag) == fuscoSuccess, "message");
  CHILD_CHECK(tag == 9 && len == cap, "tag %u len %zu", tag, len);
  CHILD_CHECK(e.ops->recvRelease(e.tc, peer) == fuscoSuccess, "release");
  return e.barrier() ? 0 : 1;
}

int sendsCompleteBody(RankEnv& e) {
  if (exchangeAll(e, 12) != 0) return 1;
  CHILD_CHECK(waitSendsComplete(e, kTimeoutMs), "sends still in flight after the exchange");
  CHILD_CHECK(e.barrier(), "barrier");
  for (int p : e.peers)
    CHILD_CHECK(e.ops->sendsInFlight == nullptr || !e.ops->sendsInFlight(e.tc, p),
                "a completed send to %d counts as in flight again", p);
  return e.barrier() ? 0 : 1;
}

constexpr int kVictim = 2;

// Ranks 0 and 1 survive rank 2, which the parent kills after the first barrier: their waits on it
// (for a message, for a slot it never credits back) end with an error naming it within kPromptMs,
// the pair between them still works, and close returns promptly.
int survivorBody(RankEnv& e) {
  void* buf = nullptr;
  size_t cap = 0;
  const void* in = nullptr;
  size_t len = 0;
  uint32_t tag = 0;
  uint32_t v = 0xfeed0000u + e.rank;
  if (e.rank == kVictim) {  // one message to each survivor, and it reads nothing
    for (int p : e.peers) CHILD_CHECK(sendBytes(e, p, 6, &v, sizeof(v)), "send to %d", p);
  } else {  // the victim's message, and its credits filled: these sends stay unreleased
    CHILD_CHECK(waitMessage(e, kVictim, kTimeoutMs, &in, &len, &tag) == fuscoSuccess, "message");
    CHILD_CHECK(tag == 6 && len == sizeof(v), "tag %u len %zu", tag, len);
    CHILD_CHECK(e.ops->recvRelease(e.tc, kVictim) == fuscoSuccess, "release");
    for (int i = 0; i < e.ctx.depth; ++i) {
      CHILD_CHECK(waitSlot(e, kVictim, kTimeoutMs, &buf, &cap) == fuscoSuccess, "slot %d", i);
      CHILD_CHECK(e.ops->sendPost(e.tc, kVictim, 7, cap) == fuscoSuccess, "post %d", i);
    }
  }
  CHILD_CHECK(e.barrier(), "barrier");  // the parent kills the victim now
  if (e.rank == kVictim)
    for (;;) pause();
  const std::string name = "rank " + std::to_string(kVictim);
  int64_t t0 = nowNs();
  fuscoResult_t r = waitMessage(e, kVictim, kTimeoutMs, &in, &len, &tag);
  int64_t ms = (nowNs() - t0) / 1000000;
  CHILD_CHECK(r == fuscoRemoteError, "waiting for a message gave %d after %lld ms", r,
              (long long)ms);
  CHILD_CHECK(ms < kPromptMs, "noticed the death after %lld ms", (long long)ms);
  CHILD_CHECK(fusco::threadLastError().find(name) != std::string::npos, "message does not name it");
  r = waitSlot(e, kVictim, kTimeoutMs, &buf, &cap);
  CHILD_CHECK(r == fuscoRemoteError, "waiting for a slot gave %d", r);
  const int other = 1 - e.rank;
  CHILD_CHECK(e.ops->checkPeer(e.tc, other) == fuscoSuccess, "healthy peer %d", other);
  CHILD_CHECK(sendBytes(e, other, 5, &v, sizeof(v)), "send to %d", other);
  CHILD_CHECK(waitMessage(e, other, kTimeoutMs, &in, &len, &tag) == fuscoSuccess, "from %d", other);
  CHILD_CHECK(tag == 5 && len == sizeof(v), "tag %u len %zu", tag, len);
  memcpy(&v, in, sizeof(v));
  CHILD_CHECK(v == 0xfeed0000u + other, "payload %x", v);
  CHILD_CHECK(e.ops->recvRelease(e.tc, other) == fuscoSuccess, "release");
  CHILD_CHECK(e.barrier(), "survivors' barrier");
  t0 = nowNs();
  e.ops->close(e.tc);
  e.tc = nullptr;
  ms = (nowNs() - t0) / 1000000;
  CHILD_CHECK(ms < kPromptMs, "close took %lld ms", (long long)ms);
  return 0;
}

int abortBody(RankEnv& e) {
  if (exchangeAll(e, 3) != 0) return 1;
  CHILD_CHECK(e.barrier(), "barrier");
  if (e.rank == 1) {
    e.ops->markAborted(e.tc, "bad expert id 77 on rank 1");
    e.ops->markAborted(e.tc, "second reason");  // idempotent: the first reason stays
  } else {
    int64_t ms = 0;
    fuscoResult_t r = waitForFailure(e, 1, kTimeoutMs, &ms);
    CHILD_CHECK(r == fuscoRemoteError, "checkPeer(1) gave %d after %lld ms", r, (long long)ms);
    const std::string msg = fusco::threadLastError();
    CHILD_CHECK(msg.find("rank 1") != std::string::npos &&
                    msg.find("aborted: bad expert id 77 on rank 1") != std::string::npos &&
                    msg.find("second reason") == std::string::npos,
                "message: %s", msg.c_str());
    CHILD_CHECK(fusco::processAlive(e.infos[1].pid, e.infos[1].startTime), "rank 1 lives");
    const int other = e.rank == 0 ? 2 : 0;
    CHILD_CHECK(e.ops->checkPeer(e.tc, other) == fuscoSuccess, "healthy peer %d", other);
  }
  return e.barrier() ? 0 : 1;
}

// Rank 0 posts a full channel of full slots and closes at once, before rank 1 touched the
// transport; rank 1 then gets every message intact and in order, or an error, never a hang.
// Both closes are prompt and give back every file descriptor the transport opened.
int closeInFlightBody(RankEnv& e) {
  const int peer = 1 - e.rank;
  if (e.rank == 0) {
    for (int i = 0; i < e.ctx.depth; ++i) {
      void* buf = nullptr;
      size_t cap = 0;
      CHILD_CHECK(waitSlot(e, peer, kTimeoutMs, &buf, &cap) == fuscoSuccess, "slot %d", i);
      Msg m = message(0, 1, 2, cap);  // a full slot
      fillPayload(static_cast<uint8_t*>(buf), m);
      CHILD_CHECK(e.ops->sendPost(e.tc, peer, 200 + i, m.len) == fuscoSuccess, "post %d", i);
    }
  }
  if (e.rank == 1) CHILD_CHECK(e.barrier(false), "barrier");  // untouched until rank 0 closed
  int64_t t0 = nowNs();
  if (e.rank == 1) {
    std::vector<uint8_t> expect(e.ctx.chunkBytes);
    Msg m = message(0, 1, 2, e.ctx.chunkBytes);
    fillPayload(expect.data(), m);
    for (int i = 0; i < e.ctx.depth; ++i) {
      const void* in = nullptr;
      size_t len = 0;
      uint32_t tag = 0;
      fuscoResult_t r = waitMessage(e, peer, kTimeoutMs, &in, &len, &tag);
      CHILD_CHECK(r == fuscoSuccess || r == fuscoRemoteError, "message %d: result %d", i, r);
      if (r != fuscoSuccess) break;
      CHILD_CHECK(tag == 200u + i && len == m.len && memcmp(in, expect.data(), len) == 0,
                  "message %d: tag %u len %zu", i, tag, len);
      CHILD_CHECK(e.ops->recvRelease(e.tc, peer) == fuscoSuccess, "release %d", i);
    }
    t0 = nowNs();
  }
  e.ops->close(e.tc);
  e.tc = nullptr;
  const int64_t ms = (nowNs() - t0) / 1000000;
  CHILD_CHECK(ms < kFlushedMs, "close took %lld ms", (long long)ms);
  CHILD_CHECK(openFdCount() == e.fdsBeforeSetup,
              "%d file descriptors open after close, %d before setup", openFdCount(),
              e.fdsBeforeSetup);
  if (e.rank == 0) CHILD_CHECK(e.barrier(), "barrier");
  return 0;
}

}  // namespace

// ---------------------------------------------------------------- the suite

TEST_P(TransportConformance, MessagesArriveInOrder) {
  runChildren(opts(2, kSmallChunk, 2), [](RankEnv& e) { return exchangeAll(e, 5000); });
}

TEST_P(TransportConformance, MessagesOfEveryLengthArriveIntactBetweenEveryPair) {
  runChildren(opts(4, kChunk, kDepth), [](RankEnv& e) {
    CHILD_CHECK(e.peers.size() == 3u, "peers %zu", e.peers.size());
    return exchangeAll(e, 60);
  });
}

TEST_P(TransportConformance, ZeroLengthMessagesKeepTheirTagsAndOrder) {
  runChildren(opts(2, kSmallChunk, kDepth), [](RankEnv& e) { return zeroLengthBody(e, 30); });
}

TEST_P(TransportConformance, LargeMessageArrivesWholeInManySlices) {
  runChildren(opts(2, kChunk, kDepth),
              [](RankEnv& e) { return largeMessageBody(e, 64 * kChunk + 123); });
}

TEST_P(TransportConformance, SenderGetsAtMostDepthUnreleasedSlots) {
  runChildren(opts(2, kSmallChunk, 3),
              [](RankEnv& e) { return e.rank == 0 ? creditSender(e) : creditReceiver(e); });
}

TEST_P(TransportConformance, SenderThatOutrunsTheReceiverBacksOffAndLosesNothing) {
  runChildren(opts(2, kSmallChunk, 2), [](RankEnv& e) { return outrunBody(e, 300); });
}

TEST_P(TransportConformance, MisuseIsAnInternalError) {
  runChildren(opts(2, kSmallChunk, kDepth), misuseBody);
}

TEST_P(TransportConformance, SendsCompleteLocallyOnceTheReceiverHasThem) {
  runChildren(opts(2, kChunk, kDepth), sendsCompleteBody);
}

TEST_P(TransportConformance, PeerThatDiesEndsTheSurvivorsWaitsWithAnError) {
  Options o = opts(3, kChunk, kDepth);
  o.victim = kVictim;
  runChildren(o, survivorBody);
}

TEST_P(TransportConformance, AbortReasonTravelsToPeers) {
  runChildren(opts(3, kSmallChunk, kDepth), abortBody);
}

TEST_P(TransportConformance, CloseWithSendsInFlightNeitherHangsNorLeaks) {
  GetParam()->ops->close(nullptr);  // close takes nullptr (and touches no device for it)
  runChildren(opts(2, kChunk, kDepth), closeInFlightBody);
}
