// libFuzzer target: the bootstrap wire format as the root parses it. The bytes are one
// connection's stream fed to HelloReader (src/core/bootstrap_hello.h: the exact code the root's
// rendezvous runs) in fuzzer-chosen pieces, then the rest decoded as a blob table (decodeTable,
// what a rank parses from the root) and as a unique id (decodeId). Properties: no crash, nothing
// allocated before the sender authenticated and its length passed the 64 MiB bound, a blob only
// ever as long as the header said.
#include <cstdio>
#include <string>
#include <vector>

#include "core/bootstrap_hello.h"
#include "core/bootstrap_wire.h"
#include "fuzz_common.h"

using namespace fusco::bootstrap_detail;  // NOLINT(google-build-using-namespace)
using fusco::fuzz::Bytes;

namespace {

// Seeds in tests/fuzz/corpus/fuzz_bootstrap_wire carry this secret, so they get past
// authentication; the fuzzer also finds it through comparison tracing.
constexpr uint64_t kSecret = 0x5eC2e7f055c0b00full;

void fuzzHello(const uint8_t* data, size_t size, uint8_t splitSeed) {
  HelloReader r(kSecret);
  size_t at = 0;
  uint32_t rng = splitSeed * 2654435761u + 1;
  while (!r.complete()) {
    size_t want = 0;
    void* dst = r.next(&want);
    FUZZ_CHECK(want > 0 && dst != nullptr);
    if (at == size) return;  // the peer went quiet: the root keeps waiting, then drops it
    rng = rng * 1103515245u + 12345u;
    size_t piece = 1 + (rng >> 16) % 40;  // like recv(): any split of the stream
    size_t got = std::min({want, piece, size - at});
    memcpy(dst, data + at, got);
    at += got;
    const bool wasHeader = r.inHeader();
    const char* why = nullptr;
    HelloReader::Step s = r.advance(got, &why);
    if (s == HelloReader::Step::Refused) {
      FUZZ_CHECK(why != nullptr && wasHeader);
      FUZZ_CHECK(r.blob().capacity() <= 64);  // refused before any blob was allocated
      return;
    }
    if (wasHeader && !r.inHeader()) {
      // Accepted: authenticated, and only then a bounded allocation.
      FUZZ_CHECK(fusco::wireGet64(data) == kHelloMagic && fusco::wireGet64(data + 8) == kSecret);
      FUZZ_CHECK(r.header().blobLen <= kMaxBlob);
      FUZZ_CHECK(r.blob().size() == r.header().blobLen);
    }
  }
  FUZZ_CHECK(at >= kHeaderBytes);
  FUZZ_CHECK(r.blob().size() == r.header().blobLen);
  FUZZ_CHECK(memcmp(r.blob().data(), data + kHeaderBytes, r.blob().size()) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fusco::fuzz::quietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  const uint8_t splitSeed = in.u8();
  const int nranks = 1 + in.u8() % 8;
  size_t n = 0;
  const uint8_t* rest = in.rest(&n);
  fuzzHello(rest, n, splitSeed);
  // Also a header checked directly (an attacker-controlled 32 bytes, any secret).
  if (n >= kHeaderBytes) {
    HelloHeader h;
    const char* why = checkHelloHeader(rest, kSecret, &h);
    FUZZ_CHECK(why != nullptr || h.blobLen <= kMaxBlob);
  }
  std::string table(reinterpret_cast<const char*>(rest), n);
  std::vector<std::string> blobs;
  if (decodeTable(table, nranks, &blobs)) {
    FUZZ_CHECK(static_cast<int>(blobs.size()) == nranks);
    size_t sum = nranks * 8;
    for (const auto& b : blobs) sum += b.size();
    FUZZ_CHECK(sum == table.size());
    FUZZ_CHECK(encodeTable(blobs) == table);
  }
  fuscoUniqueId id;
  memset(&id, 0, sizeof(id));
  memcpy(id.internal, rest, std::min(n, sizeof(id.internal)));
  IdFields f = decodeId(id);
  fuscoUniqueId again;
  encodeId(f, &again);
  FUZZ_CHECK(decodeId(again).secret == f.secret && decodeId(again).port == f.port);
  return 0;
}
