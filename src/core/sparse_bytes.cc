// SparseBytes (sparse_bytes.h): MAP_NORESERVE anonymous mappings.
#include "core/sparse_bytes.h"

#include <sys/mman.h>

namespace fusco {

SparseBytes::~SparseBytes() {
  if (p_ != nullptr) munmap(p_, bytes_);
}

bool SparseBytes::reserve(size_t bytes) {
  if (bytes <= bytes_) return true;
  if (p_ != nullptr) munmap(p_, bytes_);
  p_ = nullptr;
  bytes_ = 0;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  p_ = p;
  bytes_ = bytes;
  return true;
}

}  // namespace fusco
