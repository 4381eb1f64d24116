// Validation of layout descriptors (fuscoLayoutCreate) and of the byte ranges of the all-to-all
// calls: pure host code, so it is unit-tested and fuzzed on its own (tests/fuzz/fuzz_layout.cc).
// The API layer turns a message into its error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fusco {

// Splits a concatenated row list (counts[0] rows for peer 0, then peer 1, ...) into per-peer
// lists, checking every index. `what` is "send" or "recv" (used in the message).
// Returns true when valid; otherwise false with *msg set, and *out holds n lists (partly filled).
// counts may be NULL (an error); rows may be NULL only when every count is 0.
bool splitLayoutRows(const size_t counts[], const int64_t* rows, int n, const char* what,
                     std::vector<std::vector<int64_t>>* out, std::string* msg);

// Checks that no receive row appears twice across all peers. false with *msg set otherwise.
bool checkUniqueRecvRows(const std::vector<std::vector<int64_t>>& recv, std::string* msg);

// Every row index of a layout side (`what`: "send" or "recv") times rowBytes (> 0) is a byte offset
// that fits: a wrapped one would name another row. false with *msg set otherwise.
bool checkLayoutRowExtent(const std::vector<std::vector<int64_t>>& lists, size_t rowBytes,
                          const char* what, std::string* msg);

// The row indices of one gather or scatter call (fuscoGatherSend / fuscoScatterRecv): none
// negative, for a receive (unique) none repeated, and each times rowBytes a byte offset that
// fits. fn names the call in *msg.
bool checkRowIndices(const int64_t* rows, size_t nrows, size_t rowBytes, bool unique,
                     const char* fn, std::string* msg);

// A byte range [begin, end) of a caller's buffer, for the overlap check of one call.
struct ByteRange {
  uintptr_t begin = 0, end = 0;
};

// Whether some send range overlaps some receive range (empty ranges overlap nothing). On true,
// *sendAt and *recvAt index one such pair. O((S + R) log R); the vectors may be in any order.
bool findSendRecvOverlap(const std::vector<ByteRange>& sends, const std::vector<ByteRange>& recvs,
                         size_t* sendAt, size_t* recvAt);

// fuscoAllToAll: sendbuff and recvbuff (bytes each) are one buffer (in place) or disjoint. false
// with *msg set when they partly overlap.
bool checkAllToAllOverlap(const void* sendbuff, const void* recvbuff, size_t bytes,
                          std::string* msg);

// fuscoAllToAllv over n ranks with elemBytes-byte elements: every count and displacement in bytes,
// and the sum of the counts of each side, fit without overflow, and no send block overlaps a
// receive block. false with *msg set otherwise. The four arrays hold n entries each.
bool checkAllToAllvSizes(int n, const void* sendbuff, const size_t sendcounts[],
                         const size_t sdispls[], const void* recvbuff, const size_t recvcounts[],
                         const size_t rdispls[], size_t elemBytes, std::string* msg);

}  // namespace fusco
