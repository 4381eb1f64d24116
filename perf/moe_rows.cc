#include "moe_rows.h"

#include <random>

#include "perf_rng.h"
#include "row_reduce.h"

namespace fusco {
namespace perf {

void makeWeights(uint64_t seed, int rank, size_t n, std::vector<float>* w) {
  std::mt19937_64 rng(mix64(seed ^ 0x5eedULL ^ (static_cast<uint64_t>(rank) << 40)));
  std::uniform_real_distribution<float> d(0.05f, 1.0f);
  w->resize(n);
  for (float& v : *w) v = d(rng);
}

void fillRows(fuscoDataType_t dt, size_t hidden, size_t tokens, uint64_t seed, int rank, void* x) {
  const uint64_t base = mix64(seed ^ (static_cast<uint64_t>(rank) << 48) ^ 0xa11ULL);
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t j = 0; j < hidden; ++j) {
      // 24 random bits -> [-1, 1): exact in fp32, rounded in bf16 / fp16.
      uint64_t h = mix64(base + t * hidden + j);
      float f = static_cast<float>(static_cast<int32_t>(h >> 40) - (1 << 23)) / (1 << 23);
      size_t i = t * hidden + j;
      if (dt == fuscoFloat32) {
        static_cast<float*>(x)[i] = f;
      } else if (dt == fuscoBfloat16) {
        static_cast<uint16_t*>(x)[i] = floatToBf16(f);
      } else {
        static_cast<uint16_t*>(x)[i] = floatToHalf(f);
      }
    }
  }
}

float loadElement(fuscoDataType_t dt, const void* row, size_t j) {
  if (dt == fuscoFloat32) return static_cast<const float*>(row)[j];
  uint16_t h = static_cast<const uint16_t*>(row)[j];
  return dt == fuscoBfloat16 ? bf16ToFloat(h) : halfToFloat(h);
}

}  // namespace perf
}  // namespace fusco
