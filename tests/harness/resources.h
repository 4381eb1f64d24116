// What this process holds from the system, measured before and after many rounds so a test can
// bound growth: resident memory, open descriptors, fusco shared segments mapped, /dev/shm names.
#pragma once

#include <cstddef>

namespace fusco::test {

struct Resources {
  long rssKiB = 0;
  int fds = 0;
  int shmMaps = 0;      // mappings of fusco memfd segments ("/memfd:fusco-shm")
  size_t shmNames = 0;  // /dev/shm entries naming fusco (the library makes none)
};

Resources measureResources();

}  // namespace fusco::test
