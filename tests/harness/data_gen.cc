#include "harness/data_gen.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

namespace fusco::test {

uint64_t mix64(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

namespace {

uint64_t streamKey(uint64_t seed, int src, int dst) {
  return mix64(seed ^ mix64((static_cast<uint64_t>(static_cast<uint32_t>(src)) << 32) |
                            static_cast<uint32_t>(dst)));
}

inline uint8_t fixByte(uint8_t b) {
  if (b == 0) return 0x5A;
  if (b == kPoison) return 0xFF;
  return b;
}

inline uint8_t byteOf(uint64_t key, size_t offset) {
  uint64_t w = mix64(key + (offset >> 3));
  return fixByte(static_cast<uint8_t>(w >> (8 * (offset & 7))));
}

}  // namespace

uint8_t payloadByte(uint64_t seed, int src, int dst, size_t offset) {
  return byteOf(streamKey(seed, src, dst), offset);
}

void fillPayload(void* buf, uint64_t seed, int src, int dst, size_t firstByte, size_t bytes) {
  uint8_t* p = static_cast<uint8_t*>(buf);
  const uint64_t key = streamKey(seed, src, dst);
  size_t i = 0;
  // Head up to a word boundary, then whole words, then the tail.
  while (i < bytes && ((firstByte + i) & 7) != 0) {
    p[i] = byteOf(key, firstByte + i);
    ++i;
  }
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w = mix64(key + ((firstByte + i) >> 3));
    for (int k = 0; k < 8; ++k) p[i + k] = fixByte(static_cast<uint8_t>(w >> (8 * k)));
  }
  for (; i < bytes; ++i) p[i] = byteOf(key, firstByte + i);
}

size_t findPayloadMismatch(const void* buf, uint64_t seed, int src, int dst, size_t firstByte,
                           size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(buf);
  const uint64_t key = streamKey(seed, src, dst);
  uint8_t tmp[4096];
  for (size_t done = 0; done < bytes;) {
    size_t n = std::min(sizeof(tmp), bytes - done);
    size_t i = 0;
    for (; i < n; ++i) tmp[i] = byteOf(key, firstByte + done + i);
    if (memcmp(tmp, p + done, n) != 0) {
      for (i = 0; i < n; ++i)
        if (tmp[i] != p[done + i]) return done + i;
    }
    done += n;
  }
  return SIZE_MAX;
}

void poison(void* buf, size_t bytes) {
  if (bytes > 0) memset(buf, kPoison, bytes);
}

size_t findNotPoison(const void* buf, size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(buf);
  for (size_t i = 0; i < bytes; ++i)
    if (p[i] != kPoison) return i;
  return SIZE_MAX;
}

std::string hexBytes(const void* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  const uint8_t* b = static_cast<const uint8_t*>(p);
  std::string s;
  for (size_t i = 0; i < n && i < 16; ++i) {
    s += digits[b[i] >> 4];
    s += digits[b[i] & 15];
  }
  if (n > 16) s += "...";
  return s;
}

std::string identifyElement(const void* elem, size_t esize, uint64_t seed, int nranks,
                            size_t maxElems) {
  const uint8_t* e = static_cast<const uint8_t*>(elem);
  if (findNotPoison(elem, esize) == SIZE_MAX) return "poison (never written)";
  if (esize < 2) return "unknown (1-byte elements are not traceable)";
  std::vector<uint8_t> tmp(esize);
  // Bounded work: this runs once per failing check.
  size_t budget = 1u << 22;
  for (int s = 0; s < nranks; ++s) {
    for (int d = 0; d < nranks; ++d) {
      for (size_t i = 0; i < maxElems && budget > 0; ++i, --budget) {
        fillPayload(tmp.data(), seed, s, d, i * esize, esize);
        if (memcmp(tmp.data(), e, esize) == 0) {
          std::ostringstream os;
          os << "(src " << s << " -> dst " << d << ", element " << i << ")";
          return os.str();
        }
      }
    }
  }
  return "unknown";
}

::testing::AssertionResult payloadMatches(const void* buf, size_t esize, size_t count,
                                          uint64_t seed, int src, int dst, size_t firstElem,
                                          int nranks, const std::string& what) {
  size_t bad = findPayloadMismatch(buf, seed, src, dst, firstElem * esize, count * esize);
  if (bad == SIZE_MAX) return ::testing::AssertionSuccess();
  size_t elem = bad / esize;
  const uint8_t* actual = static_cast<const uint8_t*>(buf) + elem * esize;
  std::vector<uint8_t> expected(esize);
  fillPayload(expected.data(), seed, src, dst, (firstElem + elem) * esize, esize);
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    if (findPayloadMismatch(static_cast<const uint8_t*>(buf) + i * esize, seed, src, dst,
                            (firstElem + i) * esize, esize) != SIZE_MAX)
      ++wrong;
  }
  return ::testing::AssertionFailure()
         << what << ": data from rank " << src << " to rank " << dst << ", element "
         << firstElem + elem << " (of " << count << " checked, " << wrong << " wrong): expected "
         << hexBytes(expected.data(), esize) << " got " << hexBytes(actual, esize) << " = "
         << identifyElement(actual, esize, seed, nranks, firstElem + count + 64);
}

::testing::AssertionResult isPoisoned(const void* buf, size_t bytes, const std::string& what) {
  size_t bad = findNotPoison(buf, bytes);
  if (bad == SIZE_MAX) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": byte " << bad << " of " << bytes
         << " was overwritten (expected poison a5, got "
         << hexBytes(static_cast<const uint8_t*>(buf) + bad, 1) << ")";
}

size_t dtypeSize(fuscoDataType_t t) {
  switch (t) {
    case fuscoInt8:
    case fuscoUint8:
    case fuscoFloat8e4m3:
    case fuscoFloat8e5m2:
      return 1;
    case fuscoFloat16:
    case fuscoBfloat16:
      return 2;
    case fuscoInt32:
    case fuscoUint32:
    case fuscoFloat32:
      return 4;
    case fuscoInt64:
    case fuscoUint64:
    case fuscoFloat64:
      return 8;
    default:
      return 0;
  }
}

const char* dtypeName(fuscoDataType_t t) {
  switch (t) {
    case fuscoInt8:
      return "int8";
    case fuscoUint8:
      return "uint8";
    case fuscoInt32:
      return "int32";
    case fuscoUint32:
      return "uint32";
    case fuscoInt64:
      return "int64";
    case fuscoUint64:
      return "uint64";
    case fuscoFloat16:
      return "float16";
    case fuscoFloat32:
      return "float32";
    case fuscoFloat64:
      return "float64";
    case fuscoBfloat16:
      return "bfloat16";
    case fuscoFloat8e4m3:
      return "float8e4m3";
    case fuscoFloat8e5m2:
      return "float8e5m2";
    default:
      return "invalid";
  }
}

std::vector<size_t> randomCountMatrix(uint64_t seed, int n, size_t maxCount, int zeroPercent) {
  std::mt19937_64 rng(mix64(seed ^ 0xc0117u));
  std::vector<size_t> c(static_cast<size_t>(n) * n);
  for (auto& x : c) {
    x = static_cast<size_t>(rng() % (maxCount + 1));
    if (static_cast<int>(rng() % 100) < zeroPercent) x = 0;
  }
  return c;
}

A2avLayout uniformLayout(int n, int rank, size_t count, size_t esize, uint64_t seed) {
  return makeA2avLayout(uniformCountMatrix(n, count), n, rank, esize, seed, false);
}

std::vector<size_t> uniformCountMatrix(int n, size_t count) {
  return std::vector<size_t>(static_cast<size_t>(n) * n, count);
}

namespace {

// Places blocks of the given sizes: in peer order and contiguous, or in a random order with random
// gaps (including before the first block and after the last).
void placeBlocks(const std::vector<size_t>& sizes, bool gaps, std::mt19937_64& rng,
                 std::vector<size_t>* displs, size_t* total) {
  const size_t n = sizes.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (gaps) std::shuffle(order.begin(), order.end(), rng);
  displs->assign(n, 0);
  size_t pos = 0;
  for (size_t k = 0; k < n; ++k) {
    if (gaps) pos += rng() % 5;
    (*displs)[order[k]] = pos;
    pos += sizes[order[k]];
  }
  if (gaps) pos += 1 + rng() % 4;
  *total = pos;
}

}  // namespace

A2avLayout makeA2avLayout(const std::vector<size_t>& counts, int n, int rank, size_t esize,
                          uint64_t seed, bool gaps) {
  A2avLayout l;
  l.nranks = n;
  l.rank = rank;
  l.esize = esize;
  l.sendcounts.resize(n);
  l.recvcounts.resize(n);
  for (int p = 0; p < n; ++p) {
    l.sendcounts[p] = counts[static_cast<size_t>(rank) * n + p];
    l.recvcounts[p] = counts[static_cast<size_t>(p) * n + rank];
  }
  std::mt19937_64 rng(mix64(seed ^ (0x9a95ull + static_cast<uint64_t>(rank) * 7919)));
  placeBlocks(l.sendcounts, gaps, rng, &l.sdispls, &l.sendElems);
  placeBlocks(l.recvcounts, gaps, rng, &l.rdispls, &l.recvElems);
  return l;
}

void fillSend(const A2avLayout& l, void* sendbuff, uint64_t seed) {
  uint8_t* p = static_cast<uint8_t*>(sendbuff);
  if (l.sendElems > 0) memset(p, kFiller, l.sendElems * l.esize);
  for (int peer = 0; peer < l.nranks; ++peer)
    fillPayload(p + l.sdispls[peer] * l.esize, seed, l.rank, peer, 0, l.sendcounts[peer] * l.esize);
}

void poisonRecv(const A2avLayout& l, void* recvbuff) { poison(recvbuff, l.recvElems * l.esize); }

::testing::AssertionResult checkRecv(const A2avLayout& l, const void* recvbuff, uint64_t seed) {
  const uint8_t* p = static_cast<const uint8_t*>(recvbuff);
  std::vector<char> covered(l.recvElems, 0);
  for (int peer = 0; peer < l.nranks; ++peer) {
    auto r = payloadMatches(
        p + l.rdispls[peer] * l.esize, l.esize, l.recvcounts[peer], seed, peer, l.rank, 0, l.nranks,
        "rank " + std::to_string(l.rank) + " recv block from peer " + std::to_string(peer));
    if (!r) return r;
    for (size_t i = 0; i < l.recvcounts[peer]; ++i) covered[l.rdispls[peer] + i] = 1;
  }
  for (size_t e = 0; e < l.recvElems; ++e) {
    if (covered[e]) continue;
    auto r =
        isPoisoned(p + e * l.esize, l.esize,
                   "rank " + std::to_string(l.rank) + " recv gap element " + std::to_string(e));
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult allToAllvRoundTrip(fuscoComm_t comm, const A2avLayout& l,
                                              fuscoDataType_t datatype, uint64_t seed) {
  std::vector<uint8_t> send(std::max<size_t>(1, l.sendElems * l.esize));
  std::vector<uint8_t> recv(std::max<size_t>(1, l.recvElems * l.esize));
  fillSend(l, send.data(), seed);
  poisonRecv(l, recv.data());
  fuscoResult_t r = fuscoAllToAllv(send.data(), l.sendcounts.data(), l.sdispls.data(), recv.data(),
                                   l.recvcounts.data(), l.rdispls.data(), datatype, comm, nullptr);
  if (r != fuscoSuccess)
    return ::testing::AssertionFailure()
           << "rank " << l.rank << ": fuscoAllToAllv -> " << fuscoGetErrorString(r) << ": "
           << fuscoGetLastError(comm);
  return checkRecv(l, recv.data(), seed);
}

std::string ranksName(const ::testing::TestParamInfo<int>& i) {
  return std::to_string(i.param) + "ranks";
}

uint64_t testSeed(uint64_t salt) {
  uint64_t h = 0xf05c0ull ^ salt;
  const ::testing::TestInfo* ti = ::testing::UnitTest::GetInstance()->current_test_info();
  if (ti != nullptr) {
    for (const char* c = ti->test_suite_name(); *c; ++c) h = mix64(h ^ static_cast<uint8_t>(*c));
    for (const char* c = ti->name(); *c; ++c) h = mix64(h ^ static_cast<uint8_t>(*c));
  }
  return h;
}

}  // namespace fusco::test
