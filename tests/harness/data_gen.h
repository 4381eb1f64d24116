// Seeded payloads and their checkers, shared by the data tests.
//
// Every payload byte is a function of (seed, source rank, destination rank, byte offset), so any
// rank can regenerate what every other rank sent (the sequential reference) without exchanging
// anything, and a wrong element can be traced back to the (src, dst, index) it came from.
// Payload bytes are never 0 and never the poison byte, so an unwritten slot cannot pass as data.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fusco.h"

namespace fusco::test {

constexpr uint8_t kPoison = 0xA5;  // output buffers are filled with this before a call
constexpr uint8_t kFiller = 0x3C;  // send-buffer gaps: bytes that must never be sent

uint64_t mix64(uint64_t x);

// Byte `offset` of the payload rank src sends to rank dst (element i of size e covers bytes
// [i*e, (i+1)*e)). Never 0, never kPoison.
uint8_t payloadByte(uint64_t seed, int src, int dst, size_t offset);
// Writes payload bytes [firstByte, firstByte + bytes) of (src -> dst) to buf.
void fillPayload(void* buf, uint64_t seed, int src, int dst, size_t firstByte, size_t bytes);
// First byte in [0, bytes) of buf that differs from the payload starting at firstByte, or SIZE_MAX.
size_t findPayloadMismatch(const void* buf, uint64_t seed, int src, int dst, size_t firstByte,
                           size_t bytes);

void poison(void* buf, size_t bytes);
// First byte that is not kPoison, or SIZE_MAX.
size_t findNotPoison(const void* buf, size_t bytes);
std::string hexBytes(const void* p, size_t n);
// Best guess of where an element's bytes came from: "(src s -> dst d, element i)" or "unknown".
// Searches every (src, dst) pair and elements [0, maxElems).
std::string identifyElement(const void* elem, size_t esize, uint64_t seed, int nranks,
                            size_t maxElems);

// Checks count elements of (src -> dst) payload starting at element firstElem. On a mismatch the
// message names what, the rank pair, the element index, expected and actual bytes and a guess of
// where the actual bytes came from.
::testing::AssertionResult payloadMatches(const void* buf, size_t esize, size_t count,
                                          uint64_t seed, int src, int dst, size_t firstElem,
                                          int nranks, const std::string& what);
::testing::AssertionResult isPoisoned(const void* buf, size_t bytes, const std::string& what);

size_t dtypeSize(fuscoDataType_t t);
const char* dtypeName(fuscoDataType_t t);

// Per-(src, dst) element counts, counts[s * n + d], identical on every rank for the same seed.
// Each count is uniform in [0, maxCount]; with probability zeroPercent/100 it is forced to 0.
std::vector<size_t> randomCountMatrix(uint64_t seed, int n, size_t maxCount, int zeroPercent);
std::vector<size_t> uniformCountMatrix(int n, size_t count);

// One rank's view of an all-to-all(v): counts and displacements in elements and buffer sizes.
struct A2avLayout {
  int nranks = 0;
  int rank = 0;
  size_t esize = 1;
  std::vector<size_t> sendcounts, sdispls, recvcounts, rdispls;
  size_t sendElems = 0;  // sendbuff size, gaps included
  size_t recvElems = 0;  // recvbuff size, gaps included
};
// From a count matrix (same on every rank). gaps: random gaps between blocks and blocks placed in a
// random peer order (seeded per rank); otherwise block j at j-th position, contiguous.
A2avLayout makeA2avLayout(const std::vector<size_t>& counts, int n, int rank, size_t esize,
                          uint64_t seed, bool gaps);
// count elements of esize bytes to and from every peer, blocks back to back (no gaps).
A2avLayout uniformLayout(int n, int rank, size_t count, size_t esize, uint64_t seed = 0);
// Fills the send blocks with payload (rank -> peer) and the gaps with kFiller.
void fillSend(const A2avLayout& l, void* sendbuff, uint64_t seed);
// Poisons the whole receive buffer.
void poisonRecv(const A2avLayout& l, void* recvbuff);
// Every block from every peer bit-exact and every gap byte still kPoison.
::testing::AssertionResult checkRecv(const A2avLayout& l, const void* recvbuff, uint64_t seed);

// Runs fuscoAllToAllv with layout l on comm (fresh buffers: send filled, recv poisoned) and
// checks every block and gap. l.esize must be the size of datatype.
::testing::AssertionResult allToAllvRoundTrip(fuscoComm_t comm, const A2avLayout& l,
                                              fuscoDataType_t datatype, uint64_t seed);

// A per-test seed: fixed base mixed with the test name so cases differ but runs repeat.
uint64_t testSeed(uint64_t salt = 0);

// gtest parameter names for rank counts: "2ranks", "4ranks", ...
std::string ranksName(const ::testing::TestParamInfo<int>& i);

}  // namespace fusco::test
