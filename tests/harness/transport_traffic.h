// Traffic for the transport tests: seeded message contents that name their source, destination
// and index, an all-pairs exchange driven the way the engine drives a transport (interleaved,
// non-blocking), and waits modelled on the engine's loop: poll, step the transport, check the
// peer's liveness, give up at a deadline.
#pragma once

#include <cstddef>
#include <cstdint>

#include "harness/transport_group.h"

namespace fusco::test::transport {

struct Msg {
  uint32_t tag;
  size_t len;
  uint64_t seed;
};

// Message idx from src to dst: lengths cycle through 0, 1, chunk, chunk - 1, 8 and random sizes.
Msg message(int src, int dst, uint64_t idx, size_t chunk);
// Writes m's payload (m.len bytes derived from m.seed).
void fillPayload(uint8_t* p, const Msg& m);
// Byte i of a long stream from src to dst (for messages cut into many slots).
uint8_t streamByte(int src, int dst, size_t i);

// Every rank sends `count` messages (message(...)) to every peer and checks every message it
// receives (length, tag, payload, order), all interleaved and non-blocking. 0 on success.
int exchangeAll(RankEnv& e, uint64_t count);

// Waits up to ms for a slot to peer (sendAcquire). fuscoSuccess with *buf set, checkPeer's error
// once the peer failed, or fuscoTimeout.
fuscoResult_t waitSlot(RankEnv& e, int peer, int64_t ms, void** buf, size_t* cap);
// Waits up to ms for the next message from peer (recvPoll), as waitSlot.
fuscoResult_t waitMessage(RankEnv& e, int peer, int64_t ms, const void** buf, size_t* len,
                          uint32_t* tag);
// Acquires (waiting), fills with `len` bytes from src and posts; false on any failure.
bool sendBytes(RankEnv& e, int peer, uint32_t tag, const void* src, size_t len);
// Steps the transport until no send to any peer is in flight (sendsInFlight); false at ms.
bool waitSendsComplete(RankEnv& e, int64_t ms);
// Polls checkPeer(peer) (stepping the transport) until it fails or ms pass; *tookMs the time.
fuscoResult_t waitForFailure(RankEnv& e, int peer, int64_t ms, int64_t* tookMs);

}  // namespace fusco::test::transport
