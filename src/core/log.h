// NCCL-style logging: a level (FUSCO_DEBUG), a subsystem mask (FUSCO_DEBUG_SUBSYS, '^' negates)
// and a destination (FUSCO_DEBUG_FILE, %h host, %p pid). Lines start with host:pid:tid.
#pragma once

#include <cstdint>

namespace fusco {

enum class LogLevel : int { None = 0, Warn = 1, Info = 2, Trace = 3 };

enum Subsys : uint32_t {
  kInit = 1u << 0,
  kBoot = 1u << 1,
  kPlan = 1u << 2,
  kEngine = 1u << 3,
  kShm = 1u << 4,
  kIpc = 1u << 5,
  kUcx = 1u << 6,
  kApi = 1u << 7,
  kNet = 1u << 8,
  // Per-operation timing of enqueued operations (INFO): where an operation's time goes on the host.
  kTime = 1u << 9,
  kAll = 0xffffffffu,
};

// Re-reads FUSCO_DEBUG* (called at communicator init; the first log call configures too).
void logConfigure();
bool logEnabled(LogLevel level, Subsys s);
void logMessage(LogLevel level, Subsys s, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
// Writes the line whatever the level and subsystem mask: a line another knob asked for (one plan
// per line with FUSCO_PLAN_TRACE=1), in the log's format and destination.
void logMessageForced(LogLevel level, Subsys s, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
// Sets the rank shown in log lines of this process (-1: none).
void logSetRank(int rank);

}  // namespace fusco

#define FUSCO_LOG(level, subsys, ...)                                          \
  do {                                                                         \
    if (::fusco::logEnabled((level), (subsys)))                                \
      ::fusco::logMessage((level), (subsys), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
// A line at `level` that the level and the subsystem mask do not filter (see logMessageForced).
#define FUSCO_LOG_ALWAYS(level, subsys, ...) \
  ::fusco::logMessageForced((level), (subsys), __FILE__, __LINE__, __VA_ARGS__)
#define FUSCO_INFO(subsys, ...) FUSCO_LOG(::fusco::LogLevel::Info, subsys, __VA_ARGS__)
#define FUSCO_TRACE(subsys, ...) FUSCO_LOG(::fusco::LogLevel::Trace, subsys, __VA_ARGS__)
#define FUSCO_WARN(subsys, ...) FUSCO_LOG(::fusco::LogLevel::Warn, subsys, __VA_ARGS__)
