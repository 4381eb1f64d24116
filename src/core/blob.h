// Length-prefixed concatenation of byte strings: how one all-gathered record carries several
// parts (each transport's blob, each rail's address).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace fusco {

inline void appendBlob(std::string* out, const std::string& part) {
  uint64_t n = part.size();
  out->append(reinterpret_cast<const char*>(&n), sizeof(n));
  *out += part;
}

// Splits in[pos..] into exactly `count` parts; false if it is truncated or has trailing bytes.
inline bool splitBlobs(const std::string& in, size_t pos, size_t count,
                       std::vector<std::string>* parts) {
  parts->clear();
  for (size_t i = 0; i < count; ++i) {
    uint64_t n;
    if (pos > in.size() || in.size() - pos < sizeof(n)) return false;
    memcpy(&n, in.data() + pos, sizeof(n));
    pos += sizeof(n);
    if (in.size() - pos < n) return false;
    parts->push_back(in.substr(pos, n));
    pos += n;
  }
  return pos == in.size();
}

}  // namespace fusco
