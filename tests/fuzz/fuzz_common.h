// Shared by the libFuzzer targets: a reader that turns the fuzzer's bytes into values (zeros once
// the input runs out), and quiet logging (every rejected input would otherwise print a warning).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace fusco::fuzz {

class Bytes {
 public:
  Bytes(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  size_t left() const { return n_ - at_; }
  uint8_t u8() { return at_ < n_ ? d_[at_++] : 0; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | u8() << 8); }
  uint32_t u32() { return u16() | static_cast<uint32_t>(u16()) << 16; }
  uint64_t u64() { return u32() | static_cast<uint64_t>(u32()) << 32; }
  const uint8_t* rest(size_t* n) {
    *n = left();
    const uint8_t* p = d_ + at_;
    at_ = n_;
    return p;
  }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t at_ = 0;
};

inline void quietLogs() { setenv("FUSCO_DEBUG", "NONE", 1); }

// A property the code under test promised; a violation is a finding like a crash.
#define FUZZ_CHECK(cond)                                                               \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      fprintf(stderr, "%s:%d: fuzz property failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                         \
    }                                                                                  \
  } while (0)

}  // namespace fusco::fuzz
