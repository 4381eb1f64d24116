// Layout descriptor validation (see layout_check.h).
#include "plan/layout_check.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>

#include "core/checked_math.h"

namespace fusco {

namespace {

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[512];  // the size ArgCheck uses, so messages are cut exactly as before
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

// Whether a row is listed more than once in rows (sorted in place); *dup: the smallest such.
bool findDuplicate(std::vector<int64_t>* rows, int64_t* dup) {
  std::sort(rows->begin(), rows->end());
  auto at = std::adjacent_find(rows->begin(), rows->end());
  if (at == rows->end()) return false;
  *dup = *at;
  return true;
}

// Whether the byte end of row `top` (the largest index, non-negative) fits in a size_t.
bool rowEndFits(int64_t top, size_t rowBytes) {
  size_t end = 0;
  return checkedEnd(static_cast<size_t>(top), 1, rowBytes, &end);
}

// One side of fuscoAllToAllv: every count and displacement in bytes, and their sum, without
// overflow; the byte ranges appended to *ranges.
bool checkVSide(int n, const void* buff, const size_t counts[], const size_t displs[], size_t es,
                const char* side, std::vector<ByteRange>* ranges, std::string* msg) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(buff);
  size_t total = 0;
  for (int p = 0; p < n; ++p) {
    size_t end = 0, bytes = 0;
    if (!checkedEnd(displs[p], counts[p], es, &end) || !checkedAdd(total, counts[p], &total) ||
        !checkedMul(total, es, &bytes) || end > UINTPTR_MAX - b) {
      *msg = format(
          "fuscoAllToAllv: %scounts[%d] = %zu at %sdispls[%d] = %zu of %zu-byte "
          "elements overflows a byte size (or the sum of the counts does)",
          side, p, counts[p], side, p, displs[p], es);
      return false;
    }
    ranges->push_back(ByteRange{b + displs[p] * es, b + end});
  }
  return true;
}

}  // namespace

bool splitLayoutRows(const size_t counts[], const int64_t* rows, int n, const char* what,
                     std::vector<std::vector<int64_t>>* out, std::string* msg) {
  out->assign(n > 0 ? n : 0, {});
  if (counts == nullptr) {
    *msg = format("fuscoLayoutCreate: %sCounts is NULL", what);
    return false;
  }
  size_t total = 0;
  for (int p = 0; p < n; ++p) {
    if (!checkedAdd(total, counts[p], &total) || total > SIZE_MAX / sizeof(int64_t)) {
      *msg = format(
          "fuscoLayoutCreate: the sum of %sCounts up to %sCounts[%d] = %zu overflows a "
          "size",
          what, what, p, counts[p]);
      return false;
    }
  }
  if (total > 0 && rows == nullptr) {
    *msg = format("fuscoLayoutCreate: %sRows is NULL with %zu rows", what, total);
    return false;
  }
  size_t at = 0;
  for (int p = 0; p < n; ++p) {
    (*out)[p].assign(rows + at, rows + at + counts[p]);
    for (size_t i = 0; i < counts[p]; ++i) {
      if (rows[at + i] < 0) {
        *msg = format("fuscoLayoutCreate: %sRows[%zu] (peer %d, row %zu) = %lld is negative", what,
                      at + i, p, i, static_cast<long long>(rows[at + i]));
        return false;
      }
    }
    at += counts[p];
  }
  return true;
}

bool checkUniqueRecvRows(const std::vector<std::vector<int64_t>>& recv, std::string* msg) {
  std::vector<int64_t> all;
  for (const auto& v : recv) all.insert(all.end(), v.begin(), v.end());
  int64_t dup = 0;
  if (!findDuplicate(&all, &dup)) return true;
  *msg = format(
      "fuscoLayoutCreate: receive row %lld appears more than once (each receive row is written "
      "once)",
      static_cast<long long>(dup));
  return false;
}

bool checkLayoutRowExtent(const std::vector<std::vector<int64_t>>& lists, size_t rowBytes,
                          const char* what, std::string* msg) {
  int64_t top = -1;
  for (const auto& l : lists)
    for (int64_t r : l) top = std::max(top, r);
  if (top < 0 || rowEndFits(top, rowBytes)) return true;
  *msg = format("fuscoLayoutCreate: %s row %lld x rowBytes %zu overflows a byte offset", what,
                static_cast<long long>(top), rowBytes);
  return false;
}

bool checkRowIndices(const int64_t* rows, size_t nrows, size_t rowBytes, bool unique,
                     const char* fn, std::string* msg) {
  int64_t top = 0;
  for (size_t i = 0; i < nrows; ++i) {
    top = std::max(top, rows[i]);
    if (rows[i] >= 0) continue;
    *msg = format("%s: rowIdx[%zu] = %lld is negative", fn, i, static_cast<long long>(rows[i]));
    return false;
  }
  std::vector<int64_t> sorted(rows, rows + (unique ? nrows : 0));
  int64_t dup = 0;
  if (findDuplicate(&sorted, &dup)) {
    *msg = format("%s: receive row %lld appears more than once", fn, static_cast<long long>(dup));
    return false;
  }
  if (nrows == 0 || rowEndFits(top, rowBytes)) return true;
  *msg = format("%s: row %lld x rowBytes %zu overflows a byte offset", fn,
                static_cast<long long>(top), rowBytes);
  return false;
}

bool findSendRecvOverlap(const std::vector<ByteRange>& sends, const std::vector<ByteRange>& recvs,
                         size_t* sendAt, size_t* recvAt) {
  // Receive ranges by start; reach[i] is the one reaching furthest among the first i + 1, so a
  // send range [b, e) overlaps something iff the furthest-reaching range starting before e ends
  // after b.
  std::vector<size_t> order;
  for (size_t i = 0; i < recvs.size(); ++i)
    if (recvs[i].end > recvs[i].begin) order.push_back(i);
  std::sort(order.begin(), order.end(),
            [&](size_t x, size_t y) { return recvs[x].begin < recvs[y].begin; });
  std::vector<size_t> reach(order.size());
  for (size_t i = 0; i < order.size(); ++i)
    reach[i] = i > 0 && recvs[reach[i - 1]].end >= recvs[order[i]].end ? reach[i - 1] : order[i];
  for (size_t s = 0; s < sends.size(); ++s) {
    const ByteRange& r = sends[s];
    if (r.end <= r.begin) continue;
    const size_t before = std::partition_point(order.begin(), order.end(),
                                               [&](size_t x) { return recvs[x].begin < r.end; }) -
                          order.begin();
    if (before == 0 || recvs[reach[before - 1]].end <= r.begin) continue;
    *sendAt = s;
    *recvAt = reach[before - 1];
    return true;
  }
  return false;
}

bool checkAllToAllOverlap(const void* sendbuff, const void* recvbuff, size_t bytes,
                          std::string* msg) {
  const uintptr_t s = reinterpret_cast<uintptr_t>(sendbuff),
                  r = reinterpret_cast<uintptr_t>(recvbuff);
  if (s == r || s >= r + bytes || r >= s + bytes) return true;
  *msg = format(
      "fuscoAllToAll: sendbuff %p and recvbuff %p overlap over %zu bytes each; pass the same "
      "pointer for an in-place all-to-all, or separate buffers",
      sendbuff, recvbuff, bytes);
  return false;
}

bool checkAllToAllvSizes(int n, const void* sendbuff, const size_t sendcounts[],
                         const size_t sdispls[], const void* recvbuff, const size_t recvcounts[],
                         const size_t rdispls[], size_t elemBytes, std::string* msg) {
  std::vector<ByteRange> sends, recvs;
  if (!checkVSide(n, sendbuff, sendcounts, sdispls, elemBytes, "send", &sends, msg) ||
      !checkVSide(n, recvbuff, recvcounts, rdispls, elemBytes, "recv", &recvs, msg))
    return false;
  size_t si = 0, ri = 0;
  if (!findSendRecvOverlap(sends, recvs, &si, &ri)) return true;
  *msg = format(
      "fuscoAllToAllv: the send block for rank %zu overlaps the receive block from rank %zu "
      "(send and receive ranges of one call must not overlap; fuscoAllToAll supports "
      "sendbuff == recvbuff)",
      si, ri);
  return false;
}

}  // namespace fusco
