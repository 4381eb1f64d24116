// Layout descriptor validation (see layout_check.h).
#include "plan/layout_check.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>

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
  for (int p = 0; p < n; ++p) total += counts[p];
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

}  // namespace fusco
