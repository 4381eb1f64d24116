#include "core/liveness.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace fusco {

namespace {

// Reads /proc/<pid>/stat; returns false if it cannot. Fields after the command name (which may
// contain spaces and parentheses) start after the last ')'.
bool readStat(pid_t pid, char* state, uint64_t* start) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  char* p = strrchr(buf, ')');
  if (p == nullptr || p[1] == '\0') return false;
  p += 2;  // now at field 3 (state)
  *state = *p;
  // Field 22 is starttime: skip 19 more fields.
  int field = 3;
  while (*p && field < 22) {
    if (*p == ' ') ++field;
    ++p;
  }
  *start = strtoull(p, nullptr, 10);
  return true;
}

}  // namespace

uint64_t processStartTime(pid_t pid) {
  char st;
  uint64_t start = 0;
  return readStat(pid, &st, &start) ? start : 0;
}

bool processAlive(pid_t pid, uint64_t startTime) {
  char st = 0;
  uint64_t start = 0;
  if (readStat(pid, &st, &start)) {
    if (st == 'Z' || st == 'X' || st == 'x') return false;
    return startTime == 0 || start == startTime;
  }
  return !(kill(pid, 0) == -1 && errno == ESRCH);
}

}  // namespace fusco
