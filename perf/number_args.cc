#include "number_args.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace fusco {
namespace perf {

bool parseName(const char* v, const char* const* names, int n, int* out) {
  for (int i = 0; v != nullptr && i < n; ++i)
    if (strcmp(v, names[i]) == 0) return (*out = i), true;
  return false;
}

bool parseInt(const char* s, int* out) {
  if (s == nullptr || *s == '\0') return false;
  char* end = nullptr;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < -2147483647L || v > 2147483647L) return false;
  *out = static_cast<int>(v);
  return true;
}

bool parseSize(const char* s, size_t* out) {
  if (s == nullptr || *s < '0' || *s > '9') return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0) return false;
  int shift = 0;
  switch (*end) {
    case 'K':
    case 'k':
      shift = 10;
      ++end;
      break;
    case 'M':
    case 'm':
      shift = 20;
      ++end;
      break;
    case 'G':
    case 'g':
      shift = 30;
      ++end;
      break;
    default:
      break;
  }
  if (*end == 'B' || *end == 'b') ++end;
  if (*end != '\0' || (shift > 0 && v > (~0ULL >> shift))) return false;
  *out = static_cast<size_t>(v << shift);
  return true;
}

}  // namespace perf
}  // namespace fusco
