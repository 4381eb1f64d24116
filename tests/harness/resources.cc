#include "harness/resources.h"

#include <dirent.h>
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

}  // namespace fusco::test
