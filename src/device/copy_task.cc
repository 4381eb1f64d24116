// The copy kernel's host twin (device_ops.h, hostCopyTask): what the enqueue-only engine's host
// twin of the stream runs, and the twin CUDA runtime's launcher of the copy kernels.
#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "core/result.h"
#include "device/device_ops.h"

namespace fusco {

fuscoResult_t copyBatchesTookAll(const std::vector<DevCopyTask>& tasks, size_t at, size_t slots) {
  for (; at < tasks.size(); ++at)
    if (copyTaskMoves(tasks[at]))
      return FUSCO_FAIL(fuscoInternalError, kEngine,
                        "%zu copy tasks do not fit the %zu batches reserved for them", tasks.size(),
                        slots);
  return fuscoSuccess;
}

namespace {

// A copy in pieces of 1 MiB, the beat raised after each: a large row keeps showing progress.
void copyBeating(char* d, const char* s, uint64_t len, volatile uint32_t* beat) {
  constexpr uint64_t kPiece = uint64_t{1} << 20;
  for (uint64_t at = 0; at < len; at += kPiece) {
    std::memcpy(d + at, s + at, std::min(kPiece, len - at));
    if (beat != nullptr) *beat = *beat + 1;
  }
}

bool allowed(const CopyRangeCheck* check, const void* p, uint64_t bytes, bool write) {
  return check == nullptr || (*check)(p, bytes, write);
}

}  // namespace

bool hostCopyTask(const DevCopyTask& t, volatile uint32_t* beat, const CopyRangeCheck* check) {
  for (uint64_t i = 0; i < t.nrows; ++i) {
    const uint64_t off = i * t.rowBytes;
    if (off >= t.totalBytes) break;
    const uint64_t len = std::min<uint64_t>(t.rowBytes, t.totalBytes - off);
    const char* s = t.src + (t.srcRows ? static_cast<uint64_t>(t.srcRows[i]) * t.rowBytes : off);
    if (!allowed(check, s, len, false)) return false;
    if (t.fanStart == nullptr) {
      char* d = t.dst + (t.dstRows ? static_cast<uint64_t>(t.dstRows[i]) * t.rowBytes : off);
      if (!allowed(check, d, len, true)) return false;
      copyBeating(d, s, len, beat);
      continue;
    }
    for (uint32_t f = t.fanStart[i]; f < t.fanStart[i + 1]; ++f) {
      char* d = t.dst + static_cast<uint64_t>(t.fanRows[f]) * t.rowBytes;
      if (!allowed(check, d, len, true)) return false;
      copyBeating(d, s, len, beat);
    }
  }
  return true;
}

}  // namespace fusco
