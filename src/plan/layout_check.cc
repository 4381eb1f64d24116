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
  std::sort(all.begin(), all.end());
  auto dup = std::adjacent_find(all.begin(), all.end());
  if (dup == all.end()) return true;
  *msg = format(
      "fuscoLayoutCreate: receive row %lld appears more than once (each receive row is written "
      "once)",
      static_cast<long long>(*dup));
  return false;
}

bool checkRowIndices(const int64_t* rows, size_t nrows, bool unique, const char* fn,
                     std::string* msg) {
  for (size_t i = 0; i < nrows; ++i) {
    if (rows[i] >= 0) continue;
    *msg = format("%s: rowIdx[%zu] = %lld is negative", fn, i, static_cast<long long>(rows[i]));
    return false;
  }
  if (!unique || nrows < 2) return true;
  std::vector<int64_t> sorted(rows, rows + nrows);
  std::sort(sorted.begin(), sorted.end());
  auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup == sorted.end()) return true;
  *msg = format("%s: receive row %lld appears more than once", fn, static_cast<long long>(*dup));
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

}  // namespace fusco
