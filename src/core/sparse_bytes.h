// Anonymous host memory reserved without being committed: a page costs memory only once it is
// written, so lists sized for a bound far above what they hold (a capacity plan's receive lists)
// cost what they hold.
#pragma once

#include <cstddef>

namespace fusco {

// Not copyable; unmapped when destroyed.
class SparseBytes {
 public:
  SparseBytes() = default;
  ~SparseBytes();
  SparseBytes(const SparseBytes&) = delete;
  SparseBytes& operator=(const SparseBytes&) = delete;
  // Room for at least bytes (contents not kept when it grows); false when the address space or
  // the system refuses it.
  bool reserve(size_t bytes);
  char* data() const { return static_cast<char*>(p_); }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace fusco
