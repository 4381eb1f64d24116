#include "harness/resources.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "harness/mp_harness.h"

namespace fusco::test {

Resources measureResources() {
  Resources r;
  long pages = 0, resident = 0;
  if (FILE* f = fopen("/proc/self/statm", "r")) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
  }
  r.rssKiB = resident * (sysconf(_SC_PAGESIZE) / 1024);
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++r.fds;
    closedir(d);
    --r.fds;  // the directory's own fd
  }
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find("fusco-shm") != std::string::npos) ++r.shmMaps;
  r.shmNames = fuscoShmEntries().size();
  return r;
}

void expectBoundedGrowth(const char* tag, const std::string& what, bool print,
                         const Resources& before, const Resources& after) {
  if (print)
    printf(
        "[%s] rank 0: %s; RSS %ld -> %ld KiB, fds %d -> %d, fusco shm mappings %d -> %d, "
        "/dev/shm fusco entries %zu -> %zu\n",
        tag, what.c_str(), before.rssKiB, after.rssKiB, before.fds, after.fds, before.shmMaps,
        after.shmMaps, before.shmNames, after.shmNames);
  fflush(stdout);  // rank processes end with _exit
  EXPECT_LE(after.rssKiB - before.rssKiB, 8 * 1024) << "resident memory grew (KiB)";
  EXPECT_LE(after.fds - before.fds, 2) << "open file descriptors grew";
  EXPECT_EQ(after.shmMaps, before.shmMaps) << "fusco shared-memory mappings were left behind";
  EXPECT_LE(after.shmNames, before.shmNames) << "/dev/shm fusco entries appeared";
}

}  // namespace fusco::test
