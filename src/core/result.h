// Result codes, the per-thread last-error message and the check macros every layer uses.
// An error is logged once, where it is detected (with file:line), and stored as the thread's
// last error; callers only propagate the code.
#pragma once

#include <cerrno>
#include <string>

#include "core/log.h"
#include "fusco.h"

namespace fusco {

const char* resultName(fuscoResult_t r);

// Thread-local message of the most recent failure (set by setError / FUSCO_FAIL).
const std::string& threadLastError();
void clearThreadLastError();
// Sets the thread's last error without logging (a message carried over from another thread).
void setThreadLastError(const std::string& msg);

// Records msg as the thread's last error and logs it at WARN. Returns r for `return` chaining.
fuscoResult_t setError(fuscoResult_t r, Subsys s, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

}  // namespace fusco

// Fail with a formatted message: logs WARN with file:line, sets the thread's last error.
#define FUSCO_FAIL(res, subsys, ...) \
  ::fusco::setError((res), (subsys), __FILE__, __LINE__, __VA_ARGS__)

// Propagate a non-success result without logging again.
#define FUSCO_CHECK(call)                          \
  do {                                             \
    fuscoResult_t fusco_r_ = (call);               \
    if (fusco_r_ != fuscoSuccess) return fusco_r_; \
  } while (0)

// Propagate into a cleanup label: `res` must be a fuscoResult_t in scope.
#define FUSCO_CHECK_GOTO(call, res, label) \
  do {                                     \
    (res) = (call);                        \
    if ((res) != fuscoSuccess) goto label; \
  } while (0)

// Retry a syscall on EINTR; on failure log errno and return fuscoSystemError.
#define FUSCO_SYSCHECK(call, subsys, what)                                                 \
  do {                                                                                     \
    long fusco_rc_;                                                                        \
    do {                                                                                   \
      fusco_rc_ = (long)(call);                                                            \
    } while (fusco_rc_ == -1 && errno == EINTR);                                           \
    if (fusco_rc_ == -1)                                                                   \
      return FUSCO_FAIL(fuscoSystemError, subsys, "%s failed: %s", what, strerror(errno)); \
  } while (0)
