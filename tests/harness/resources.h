// What this process holds from the system, measured before and after many rounds so a test can
// bound growth: resident memory, open descriptors, fusco shared segments mapped, /dev/shm names.
#pragma once

#include <cstddef>
#include <string>

namespace fusco::test {

struct Resources {
  long rssKiB = 0;
  int fds = 0;
  int shmMaps = 0;      // mappings of fusco memfd segments ("/memfd:fusco-shm")
  size_t shmNames = 0;  // /dev/shm entries naming fusco (the library makes none)
};

Resources measureResources();

// After many rounds: prints the figures (when print; `tag` and `what` name the test and its
// rounds), then expects resident memory to grow by at most 8 MiB, descriptors by at most 2, the
// fusco shared segments mapped to be the same and no /dev/shm fusco entry to appear.
void expectBoundedGrowth(const char* tag, const std::string& what, bool print,
                         const Resources& before, const Resources& after);

}  // namespace fusco::test
