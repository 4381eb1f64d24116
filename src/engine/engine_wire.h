// Control messages of the engine (header and verdict rounds) and the channel tags.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace fusco {

enum : uint32_t {
  kTagHeader = 0x48445231,
  kTagVerdict = 0x56524431,
  kTagData = 0x44415431,
  kTagDirectDone = 0x44444e31
};  // the network bridge's own tags are in exec/net_bridge.h

constexpr uint64_t kStagedToken = ~0ull;
// A receive offer on a device operation: the message moves through the pair's channel
// (channels.h), not into an offered buffer.
constexpr uint64_t kRingToken = ~0ull - 1;
// Set in a recvExtents entry when the offer is for a shared layout (rows the sender knows), not
// for a contiguous buffer.
constexpr uint64_t kLayoutSharedBit = 1ull << 63;

struct PairHeader {
  OpKind kind = OpKind::Group;
  uint64_t call = 0;      // the sender's collective call number (Communicator::callSeq)
  uint64_t seq = 0;       // the pair's operation number (Communicator::nextPairSeq)
  int32_t status = 0;     // sender's own argument status
  uint32_t onStream = 0;  // 1: the sender enqueues the operation on its stream, 0: host data
  std::vector<uint64_t> sendBytes;    // what the sender of the header sends to the receiver
  std::vector<uint64_t> recvBytes;    // what it expects from the receiver
  std::vector<uint64_t> recvTokens;   // per expected message: direct-write token or kStagedToken
  std::vector<uint64_t> recvExtents;  // per expected message: bytes from the token's base it spans
  std::vector<uint64_t> sendTokens;   // pull operations: per message sent, the token of its buffer
  std::vector<uint64_t> sendExtents;  // and the bytes from that token's base the receiver may read
  std::vector<uint64_t> agree;  // first operation of a call: the values all ranks must agree on
};

struct Verdict {
  int32_t status = 0;    // fuscoSuccess or the error this rank found
  int32_t culprit = -1;  // rank whose arguments or counts were wrong
  std::string message;
};

// Encoded size must fit in one slot; encode fails (returns false) when it does not.
bool encodeHeader(const PairHeader& h, void* buf, size_t cap, size_t* len);
// The bytes encodeHeader writes for h (what a slot must hold).
size_t encodedHeaderBytes(const PairHeader& h);
bool decodeHeader(const void* buf, size_t len, PairHeader* h);
// Whether the two headers of a pair belong to the same operation of the same call. When they do
// not, the ranks are out of step (one left a call early) and *why names both call numbers and
// both operation numbers; peer is the rank that sent `theirs`.
bool pairInStep(const PairHeader& mine, const PairHeader& theirs, int peer, std::string* why);
// Whether the call values of a pair agree; when they do not, *why names the first value that
// differs and both ranks' values.
bool valuesAgree(const std::vector<AgreeValue>& mine, const std::vector<uint64_t>& theirs, int me,
                 int peer, std::string* why);

bool encodeVerdict(const Verdict& v, void* buf, size_t cap, size_t* len);
bool decodeVerdict(const void* buf, size_t len, Verdict* v);

}  // namespace fusco
