// The host gather/scatter copies (row_copy.h, the host twins of the copy kernels) against a plain
// memcpy of the same bytes: rows gathered by a random token index list into a slice, scattered
// back out with fan-out 1, and the memcpy of the same total.
#include <benchmark/benchmark.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "device/row_copy.h"

namespace {

constexpr size_t kRowBytes = 7168 * 2;  // hidden 7168 bf16
constexpr size_t kRows = 4096;

struct Buffers {
  std::vector<char> src, dst;
  std::vector<int64_t> idx;
  Buffers() : src(kRows * kRowBytes, 1), dst(kRows * kRowBytes, 2), idx(kRows) {
    std::iota(idx.begin(), idx.end(), 0);
    std::shuffle(idx.begin(), idx.end(), std::mt19937_64(7));
  }
};

void BM_Memcpy(benchmark::State& state) {
  Buffers b;
  for (auto _ : state) {
    memcpy(b.dst.data(), b.src.data(), b.src.size());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * b.src.size());
}
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond);

void BM_GatherRows(benchmark::State& state) {
  Buffers b;
  auto s = fusco::RowStream::indexed(b.src.data(), kRowBytes, b.idx.data(), kRows);
  const size_t slice = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    for (size_t off = 0; off < s.bytes(); off += slice)
      fusco::gatherBytes(s, off, std::min(slice, s.bytes() - off), b.dst.data() + off);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * s.bytes());
}
BENCHMARK(BM_GatherRows)->Arg(512 << 10)->Arg(4 << 20)->Unit(benchmark::kMillisecond);

void BM_ScatterRows(benchmark::State& state) {
  Buffers b;
  auto s = fusco::RowStream::indexed(b.dst.data(), kRowBytes, b.idx.data(), kRows);
  const size_t slice = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    for (size_t off = 0; off < s.bytes(); off += slice)
      fusco::scatterBytes(s, off, std::min(slice, s.bytes() - off), b.src.data() + off);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * s.bytes());
}
BENCHMARK(BM_ScatterRows)->Arg(512 << 10)->Arg(4 << 20)->Unit(benchmark::kMillisecond);

void BM_RowToRowCopy(benchmark::State& state) {
  Buffers b;
  auto src = fusco::RowStream::indexed(b.src.data(), kRowBytes, b.idx.data(), kRows);
  std::vector<int64_t> rev(b.idx.rbegin(), b.idx.rend());
  auto dst = fusco::RowStream::indexed(b.dst.data(), kRowBytes, rev.data(), kRows);
  for (auto _ : state) {
    fusco::streamCopy(src, 0, dst, 0, src.bytes());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * src.bytes());
}
BENCHMARK(BM_RowToRowCopy)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
