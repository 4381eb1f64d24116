// Row streams and their host copy routines (the host twins of the gather/scatter kernels).
//
// A RowStream is a sequence of rows seen as one stream of bytes: row i of the stream lives at
// base + rows[i] * rowBytes (rows == nullptr: base + i * rowBytes, i.e. contiguous memory). The
// engine moves byte ranges of streams, so a slice may start or end inside a row.
//
// A stream may also fan out (receive side of MoE dispatch): row i is then written to every row
// fanRows[fanStart[i] .. fanStart[i+1]) of base, and read from the first of them.
//
// A send-side stream may instead be produced: its bytes are computed on demand by `produce`
// (combine computes each partial row straight into the slot or the peer's buffer, so the
// partials never exist as a buffer of their own). Produced streams are read-only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "fusco.h"

namespace fusco {

struct RowStream {
  char* base = nullptr;
  size_t rowBytes = 0;
  const int64_t* rows = nullptr;
  size_t nrows = 0;
  const uint32_t* fanStart = nullptr;  // [nrows + 1] when the stream fans out
  const int64_t* fanRows = nullptr;
  // Writes bytes [off, off + len) of the stream to dst.
  void (*produce)(const void* ctx, size_t off, size_t len, void* dst) = nullptr;
  const void* produceCtx = nullptr;
  // Bytes from base that the stream may touch (for a receiver offering its buffer to a peer that
  // knows the layout); 0: bytes() when contiguous, else unknown.
  size_t extent = 0;
  // Receive side: the sender was told this stream's layout (rows / fan-out) and may write the
  // final rows itself when it can map this buffer (one copy).
  bool layoutShared = false;
  // Send side of a forwarder: the bytes become readable progressively, as the rows they come
  // from land from another peer in the same operation. ready(readyCtx) says how many leading
  // bytes may be read now (monotone); nullptr: all of them.
  size_t (*ready)(const void* ctx) = nullptr;
  const void* readyCtx = nullptr;
  // Receive side: where the engine publishes how many leading bytes have landed so far (what a
  // forwarder's gates read); nullptr: not published.
  size_t* landed = nullptr;
  // Send side of a pull operation (engine.h's Op::pullRun): the rows go through the pair's channel
  // instead of being offered (the receiver cannot map this buffer).
  bool push = false;

  size_t bytes() const { return nrows * rowBytes; }
  bool contiguous() const { return rows == nullptr && fanStart == nullptr && produce == nullptr; }
  size_t extentBytes() const { return extent ? extent : (contiguous() ? bytes() : 0); }
  size_t readyBytes() const {
    return ready == nullptr ? bytes() : std::min(bytes(), ready(readyCtx));
  }
  static RowStream flat(const void* p, size_t bytes) {
    RowStream s;
    s.base = static_cast<char*>(const_cast<void*>(p));
    s.rowBytes = bytes;
    s.nrows = bytes ? 1 : 0;
    return s;
  }
  static RowStream indexed(const void* p, size_t rowBytes, const int64_t* rows, size_t nrows) {
    RowStream s;
    s.base = static_cast<char*>(const_cast<void*>(p));
    s.rowBytes = rowBytes;
    s.rows = rows;
    s.nrows = nrows;
    return s;
  }
  static RowStream produced(size_t rowBytes, size_t nrows,
                            void (*fn)(const void*, size_t, size_t, void*), const void* ctx) {
    RowStream s;
    s.rowBytes = rowBytes;
    s.nrows = nrows;
    s.produce = fn;
    s.produceCtx = ctx;
    return s;
  }
  static RowStream fanOut(void* p, size_t rowBytes, const uint32_t* fanStart,
                          const int64_t* fanRows, size_t nrows) {
    RowStream s;
    s.base = static_cast<char*>(p);
    s.rowBytes = rowBytes;
    s.fanStart = fanStart;
    s.fanRows = fanRows;
    s.nrows = nrows;
    return s;
  }
};

// Copies bytes [off, off + len) of the stream into dst (gather).
void gatherBytes(const RowStream& s, size_t off, size_t len, void* dst);
// Copies len bytes from src into bytes [off, off + len) of the stream (scatter, with fan-out).
void scatterBytes(const RowStream& s, size_t off, size_t len, const void* src);
// Copies bytes [srcOff, srcOff + len) of src into bytes [dstOff, dstOff + len) of dst: one pass,
// row pieces straight from source rows to destination rows.
void streamCopy(const RowStream& src, size_t srcOff, const RowStream& dst, size_t dstOff,
                size_t len);

}  // namespace fusco
