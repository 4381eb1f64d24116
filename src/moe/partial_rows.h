// Rows that combine computes on demand, while the engine sends them: the expert rank's partial
// sums (per (token, rank): the weighted sum of its expert outputs, k order), produced straight
// into the slot they leave from.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "device/reduce.h"
#include "moe/moe_handle.h"

namespace fusco {

// Writes bytes [off, off + len) of a stream of rows computed column-wise by columns(row, col0,
// ncols, dst). A cut on an element boundary computes just those columns; any other cut goes
// through one temporary row.
template <typename Columns>
void produceRows(size_t rowOut, size_t elem, size_t hidden, size_t off, size_t len, void* dst,
                 std::vector<char>* tmp, Columns columns) {
  char* d = static_cast<char*>(dst);
  for (size_t at = 0; at < len;) {
    size_t row = (off + at) / rowOut, inRow = (off + at) - row * rowOut;
    size_t n = std::min(rowOut - inRow, len - at);
    if (inRow % elem == 0 && n % elem == 0) {
      columns(row, inRow / elem, n / elem, d + at);
    } else {
      tmp->resize(rowOut);
      columns(row, 0, hidden, tmp->data());
      memcpy(d + at, tmp->data() + inRow, n);
    }
    at += n;
  }
}

// The geometry of combine's rows: datatype, hidden size, bytes per row and per element.
struct RowShape {
  fuscoDataType_t dt = fuscoFloat32;
  size_t hidden = 0, rowOut = 0, elem = 0;
};

// Produces bytes of the partial rows for one source: row i = weighted sum (k order) of the
// expert outputs of fan rows of row rowBase + i from src.
struct PartialSource {
  const MoeHandle* h;
  int src;
  size_t rowBase;
  const char* expertOut;
  RowShape shape;
  mutable std::vector<const void*> ptrs;
  mutable std::vector<char> tmp;

  void columns(size_t row, size_t col0, size_t ncols, void* dst) const {
    const uint32_t b = h->recv.fanStart[src][rowBase + row];
    const uint32_t e = h->recv.fanStart[src][rowBase + row + 1];
    ptrs.clear();
    for (uint32_t f = b; f < e; ++f)
      ptrs.push_back(expertOut + h->recv.fanRows[src][f] * shape.rowOut + col0 * shape.elem);
    weightedSumRows(shape.dt, ncols, ptrs.data(), h->recvWeights[src].data() + b, e - b, dst);
  }

  static void produce(const void* ctx, size_t off, size_t len, void* dst) {
    const PartialSource& p = *static_cast<const PartialSource*>(ctx);
    produceRows(p.shape.rowOut, p.shape.elem, p.shape.hidden, off, len, dst, &p.tmp,
                [&](size_t row, size_t c0, size_t nc, void* d) { p.columns(row, c0, nc, d); });
  }

  RowStream stream(size_t rows) const {
    return RowStream::produced(shape.rowOut, rows, &PartialSource::produce, this);
  }
};

}  // namespace fusco
