// libFuzzer target: layout descriptor validation (src/plan/layout_check.h), the checks
// fuscoLayoutCreate runs on the caller's counts and row lists. Input: nranks, then per peer a
// count, then rows (int16 or raw int64), for the send and the receive side.
#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "plan/layout_check.h"

using fusco::fuzz::Bytes;

namespace {

// Reads one side: counts (each bounded so the row array is backed by real memory) and rows.
void readSide(Bytes& in, int n, bool wide, std::vector<size_t>* counts,
              std::vector<int64_t>* rows) {
  counts->assign(n, 0);
  size_t total = 0;
  for (int p = 0; p < n; ++p) {
    (*counts)[p] = in.u8() % 17;
    total += (*counts)[p];
  }
  rows->resize(total);
  for (auto& r : *rows) r = wide ? static_cast<int64_t>(in.u64()) : static_cast<int16_t>(in.u16());
}

void checkSide(const std::vector<size_t>& counts, const std::vector<int64_t>& rows, int n,
               bool nullCounts, bool nullRows, std::vector<std::vector<int64_t>>* out) {
  std::string msg;
  bool ok = fusco::splitLayoutRows(nullCounts ? nullptr : counts.data(),
                                   nullRows ? nullptr : rows.data(), n, "send", out, &msg);
  FUZZ_CHECK(static_cast<int>(out->size()) == n);
  FUZZ_CHECK(ok == msg.empty());
  size_t total = 0;
  for (size_t c : counts) total += c;
  bool expectOk = !nullCounts && (total == 0 || !nullRows) &&
                  std::none_of(rows.begin(), rows.end(), [](int64_t r) { return r < 0; });
  FUZZ_CHECK(ok == expectOk);
  if (!ok) return;
  size_t at = 0;
  for (int p = 0; p < n; ++p) {
    FUZZ_CHECK((*out)[p].size() == counts[p]);
    for (size_t i = 0; i < counts[p]; ++i) FUZZ_CHECK((*out)[p][i] == rows[at + i]);
    at += counts[p];
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fusco::fuzz::quietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  const uint8_t flags = in.u8();
  const int n = 1 + in.u8() % 16;
  const bool wide = flags & 1;
  std::vector<size_t> sendCounts, recvCounts;
  std::vector<int64_t> sendRows, recvRows;
  readSide(in, n, wide, &sendCounts, &sendRows);
  readSide(in, n, wide, &recvCounts, &recvRows);
  std::vector<std::vector<int64_t>> sendOut, recvOut;
  checkSide(sendCounts, sendRows, n, flags & 2, flags & 4, &sendOut);
  checkSide(recvCounts, recvRows, n, flags & 8, flags & 16, &recvOut);
  std::string msg;
  bool unique = fusco::checkUniqueRecvRows(recvOut, &msg);
  std::set<int64_t> seen;
  bool expectUnique = true;
  for (const auto& v : recvOut)
    for (int64_t r : v) expectUnique = seen.insert(r).second && expectUnique;
  FUZZ_CHECK(unique == expectUnique);
  FUZZ_CHECK(unique == msg.empty());
  return 0;
}
