// Internal to the TCP bootstrap root (bootstrap_root.cc): the incremental reader of one rank's
// HELLO (bootstrap_wire.h has the format). It owns no socket: the root receives into next() and
// reports what arrived with advance(), so the exact parsing the root runs is also driven by a
// fuzzer (tests/fuzz/fuzz_bootstrap_wire.cc) with arbitrary bytes split at arbitrary points.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>

#include "core/bootstrap_wire.h"

namespace fusco::bootstrap_detail {

struct HelloHeader {
  int32_t nranks = 0;
  int32_t rank = 0;
  uint64_t blobLen = 0;
};

// Checks an assembled HELLO header: authenticates (magic, then secret, constant time) before
// believing any other field, then bounds the blob length. nullptr and *out filled when accepted;
// otherwise the reason for the refusal (a static string) and *out untouched.
inline const char* checkHelloHeader(const unsigned char* hdr, uint64_t secret, HelloHeader* out) {
  if (wireGet64(hdr) != kHelloMagic) return "bad magic";
  if (!secretEqual(wireGet64(hdr + 8), secret)) return "bad secret";
  uint64_t blobLen = wireGet64(hdr + 24);
  if (blobLen > kMaxBlob) return "blob length over the 64 MiB limit";
  out->nranks = static_cast<int32_t>(wireGet32(hdr + 16));
  out->rank = static_cast<int32_t>(wireGet32(hdr + 20));
  out->blobLen = blobLen;
  return nullptr;
}

// Reads one HELLO: the 32-byte header, then (only once the header was accepted) its blob. Nothing
// is allocated before the sender authenticated and its length passed the bound.
class HelloReader {
 public:
  enum class Step { More, Complete, Refused };

  bool inHeader() const { return hdrGot_ < kHeaderBytes; }
  bool complete() const { return !inHeader() && blobGot_ == hdr_.blobLen; }
  // Where the next received bytes go and how many are wanted (> 0 unless complete()).
  void* next(size_t* want) {
    if (inHeader()) {
      *want = kHeaderBytes - hdrGot_;
      return raw_ + hdrGot_;
    }
    *want = static_cast<size_t>(hdr_.blobLen - blobGot_);
    return *want == 0 ? nullptr : &blob_[blobGot_];
  }
  // `got` bytes (at most the last next()'s want) were written at next(). Refused: *why says why;
  // the reader must not be used further.
  Step advance(size_t got, const char** why) {
    if (inHeader()) {
      hdrGot_ += got;
      if (inHeader()) return Step::More;
      *why = checkHelloHeader(raw_, secret_, &hdr_);
      if (*why != nullptr) return Step::Refused;
      try {
        blob_.resize(hdr_.blobLen);
      } catch (const std::bad_alloc&) {
        *why = "out of memory for its blob";
        return Step::Refused;
      }
    } else {
      blobGot_ += got;
    }
    return complete() ? Step::Complete : Step::More;
  }
  const HelloHeader& header() const { return hdr_; }
  std::string& blob() { return blob_; }

  explicit HelloReader(uint64_t secret = 0) : secret_(secret) {}

 private:
  uint64_t secret_;
  unsigned char raw_[kHeaderBytes] = {};
  size_t hdrGot_ = 0;
  HelloHeader hdr_;
  std::string blob_;
  size_t blobGot_ = 0;
};

}  // namespace fusco::bootstrap_detail
