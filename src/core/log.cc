#include "core/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "core/params.h"

namespace fusco {

namespace {

struct LogState {
  std::mutex mu;
  std::atomic<int> level{static_cast<int>(LogLevel::Warn)};
  std::atomic<uint32_t> mask{kAll};
  FILE* out = stderr;
  std::string outPath;
  char host[64] = "";
  std::atomic<int> rank{-1};
  std::atomic<bool> configured{false};
};

LogState& state() {
  static LogState* s = new LogState();  // never destroyed: usable from atexit handlers
  return *s;
}

struct SubsysName {
  const char* name;
  uint32_t bit;
};
const SubsysName kSubsysNames[] = {{"INIT", kInit},     {"BOOT", kBoot}, {"PLAN", kPlan},
                                   {"ENGINE", kEngine}, {"SHM", kShm},   {"IPC", kIpc},
                                   {"UCX", kUcx},       {"API", kApi},   {"NET", kNet},
                                   {"TIME", kTime},     {"ALL", kAll}};

const char* subsysName(Subsys s) {
  for (const auto& n : kSubsysNames)
    if (n.bit == s) return n.name;
  return "?";
}

uint32_t parseMask(const std::string& spec) {
  if (spec.empty()) return kAll;
  bool negate = spec[0] == '^';
  uint32_t mask = 0;
  size_t pos = negate ? 1 : 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    std::string tok = spec.substr(pos, comma - pos);
    for (const auto& n : kSubsysNames)
      if (strcasecmp(tok.c_str(), n.name) == 0) mask |= n.bit;
    pos = comma + 1;
  }
  return negate ? ~mask : mask;
}

// Every name of a FUSCO_DEBUG_SUBSYS list is a subsystem: a typo must not silently log nothing.
bool subsysListOk(const std::string& spec) {
  size_t pos = !spec.empty() && spec[0] == '^' ? 1 : 0;
  for (;;) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    const std::string tok = spec.substr(pos, comma - pos);
    bool known = false;
    for (const auto& n : kSubsysNames) known = known || strcasecmp(tok.c_str(), n.name) == 0;
    if (!known) return false;
    if (comma == spec.size()) return true;
    pos = comma + 1;
  }
}

std::string expandPath(const std::string& pattern, const char* host) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      char c = pattern[++i];
      if (c == 'h')
        out += host;
      else if (c == 'p')
        out += std::to_string(getpid());
      else if (c == '%')
        out += '%';
      else {
        out += '%';
        out += c;
      }
    } else {
      out += pattern[i];
    }
  }
  return out;
}

void configureLocked(LogState& s, LogLevel level, const std::string& subsys,
                     const std::string& file) {
  gethostname(s.host, sizeof(s.host) - 1);
  s.level = static_cast<int>(level);
  s.mask = parseMask(subsys);
  if (file.empty()) {
    if (s.out != stderr && s.out != nullptr) fclose(s.out);
    s.out = stderr;
    s.outPath.clear();
    return;
  }
  std::string path = expandPath(file, s.host);
  if (path == s.outPath) return;
  FILE* f = fopen(path.c_str(), "a");
  if (f == nullptr) return;  // keep logging to the previous destination
  setvbuf(f, nullptr, _IOLBF, 0);
  if (s.out != stderr && s.out != nullptr) fclose(s.out);
  s.out = f;
  s.outPath = path;
}

constexpr ParamChoice kLevelChoices[] = {{"NONE", static_cast<int64_t>(LogLevel::None)},
                                         {"OFF", static_cast<int64_t>(LogLevel::None)},
                                         {"WARN", static_cast<int64_t>(LogLevel::Warn)},
                                         {"INFO", static_cast<int64_t>(LogLevel::Info)},
                                         {"TRACE", static_cast<int64_t>(LogLevel::Trace)}};

}  // namespace

FUSCO_PARAM_CHOICE(DebugLevel, LogLevel, "FUSCO_DEBUG", "WARN", kLevelChoices,
                   "log level: NONE, WARN, INFO or TRACE");
FUSCO_PARAM_STRING_CHECKED(
    DebugSubsys, "FUSCO_DEBUG_SUBSYS", "ALL", subsysListOk,
    "a comma-separated list of INIT, BOOT, PLAN, ENGINE, SHM, IPC, UCX, API, NET, TIME or ALL, "
    "^ first to negate",
    "subsystems whose INFO and TRACE lines are logged, comma separated "
    "(INIT,BOOT,PLAN,ENGINE,SHM,IPC,UCX,API,NET,TIME,ALL); ^ negates; warnings are always logged");
FUSCO_PARAM_STRING(DebugFile, "FUSCO_DEBUG_FILE", "",
                   "log to this file instead of stderr (%h host, %p pid)");

void logConfigure() {
  // The parameters are read before the lock is taken: reading one may log a warning about its
  // value, which configures the log (from the value already resolved) on the way.
  const LogLevel level = paramDebugLevel();
  const std::string subsys = paramDebugSubsys();
  const std::string file = paramDebugFile();
  LogState& s = state();
  std::lock_guard<std::mutex> g(s.mu);
  configureLocked(s, level, subsys, file);
  s.configured.store(true, std::memory_order_release);
}

bool logEnabled(LogLevel level, Subsys sub) {
  LogState& s = state();
  if (!s.configured.load(std::memory_order_acquire)) logConfigure();
  // Warnings pass whatever the mask says (as NCCL's do): a dead peer is never logged only under
  // the subsystem a user thought of.
  return static_cast<int>(level) <= s.level.load(std::memory_order_relaxed) &&
         (level == LogLevel::Warn || (s.mask.load(std::memory_order_relaxed) & sub) != 0);
}

void logSetRank(int rank) { state().rank = rank; }

namespace {

void logWrite(LogLevel level, Subsys sub, const char* file, int line, const char* fmt, va_list ap) {
  LogState& s = state();
  if (!s.configured.load(std::memory_order_acquire)) logConfigure();
  char msg[1200];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  const char* lv = level == LogLevel::Warn ? "WARN" : level == LogLevel::Info ? "INFO" : "TRACE";
  const char* base = strrchr(file, '/');
  base = base ? base + 1 : file;
  char rankStr[24] = "";
  if (s.rank >= 0) snprintf(rankStr, sizeof(rankStr), " [%d]", s.rank.load());
  std::lock_guard<std::mutex> g(s.mu);
  fprintf(s.out, "%s:%d:%ld%s FUSCO %s %s %s:%d %s\n", s.host, getpid(),
          static_cast<long>(syscall(SYS_gettid)), rankStr, lv, subsysName(sub), base, line, msg);
  fflush(s.out);
}

}  // namespace

void logMessage(LogLevel level, Subsys sub, const char* file, int line, const char* fmt, ...) {
  if (!logEnabled(level, sub)) return;
  va_list ap;
  va_start(ap, fmt);
  logWrite(level, sub, file, line, fmt, ap);
  va_end(ap);
}

void logMessageForced(LogLevel level, Subsys sub, const char* file, int line, const char* fmt,
                      ...) {
  va_list ap;
  va_start(ap, fmt);
  logWrite(level, sub, file, line, fmt, ap);
  va_end(ap);
}

}  // namespace fusco
