#include "device/row_copy.h"

#include <algorithm>
#include <cstring>

namespace fusco {

namespace {

// Address of the (first) copy of logical row i.
inline char* rowAddr(const RowStream& s, size_t i) {
  if (s.fanStart != nullptr)
    return s.base + static_cast<size_t>(s.fanRows[s.fanStart[i]]) * s.rowBytes;
  if (s.rows != nullptr) return s.base + static_cast<size_t>(s.rows[i]) * s.rowBytes;
  return s.base + i * s.rowBytes;
}

// Calls fn(row, inRow, n, at) for the pieces of bytes [off, off + len): logical row `row`, bytes
// [inRow, inRow + n) of it, which are bytes [at, at + n) of the range.
template <typename Fn>
void forPieces(const RowStream& s, size_t off, size_t len, Fn fn) {
  if (len == 0) return;
  const size_t rb = s.rowBytes;
  size_t row = off / rb, inRow = off - row * rb, at = 0;
  while (at < len) {
    size_t n = std::min(rb - inRow, len - at);
    fn(row, inRow, n, at);
    at += n;
    ++row;
    inRow = 0;
  }
}

}  // namespace

void gatherBytes(const RowStream& s, size_t off, size_t len, void* dst) {
  if (len == 0) return;  // buffers may be NULL then
  char* d = static_cast<char*>(dst);
  if (s.produce != nullptr) {
    if (len) s.produce(s.produceCtx, off, len, d);
    return;
  }
  if (s.contiguous()) {
    memcpy(d, s.base + off, len);
    return;
  }
  forPieces(s, off, len, [&](size_t row, size_t inRow, size_t n, size_t at) {
    memcpy(d + at, rowAddr(s, row) + inRow, n);
  });
}

void scatterBytes(const RowStream& s, size_t off, size_t len, const void* src) {
  if (len == 0) return;  // buffers may be NULL then
  const char* c = static_cast<const char*>(src);
  if (s.contiguous()) {
    memcpy(s.base + off, c, len);
    return;
  }
  if (s.fanStart == nullptr) {
    forPieces(s, off, len, [&](size_t row, size_t inRow, size_t n, size_t at) {
      memcpy(rowAddr(s, row) + inRow, c + at, n);
    });
    return;
  }
  forPieces(s, off, len, [&](size_t row, size_t inRow, size_t n, size_t at) {
    for (uint32_t f = s.fanStart[row]; f < s.fanStart[row + 1]; ++f)
      memcpy(s.base + static_cast<size_t>(s.fanRows[f]) * s.rowBytes + inRow, c + at, n);
  });
}

void streamCopy(const RowStream& src, size_t srcOff, const RowStream& dst, size_t dstOff,
                size_t len) {
  if (len == 0) return;
  if (dst.contiguous()) {
    gatherBytes(src, srcOff, len, dst.base + dstOff);
    return;
  }
  if (src.contiguous()) {
    scatterBytes(dst, dstOff, len, src.base + srcOff);
    return;
  }
  // Both sides indexed (or a produced source): walk the destination's pieces and gather each from
  // the source.
  forPieces(dst, dstOff, len, [&](size_t row, size_t inRow, size_t n, size_t at) {
    if (dst.fanStart == nullptr) {
      gatherBytes(src, srcOff + at, n, rowAddr(dst, row) + inRow);
      return;
    }
    for (uint32_t f = dst.fanStart[row]; f < dst.fanStart[row + 1]; ++f)
      gatherBytes(src, srcOff + at, n,
                  dst.base + static_cast<size_t>(dst.fanRows[f]) * dst.rowBytes + inRow);
  });
}

}  // namespace fusco
