#include "core/result.h"

#include <cstdarg>
#include <cstdio>

namespace fusco {

namespace {
thread_local std::string tLastError;
}

const char* resultName(fuscoResult_t r) {
  switch (r) {
    case fuscoSuccess:
      return "no error";
    case fuscoUnhandledCudaError:
      return "unhandled cuda error (run with FUSCO_DEBUG=INFO for details)";
    case fuscoSystemError:
      return "unhandled system error (run with FUSCO_DEBUG=INFO for details)";
    case fuscoInternalError:
      return "internal error - please report this issue to the fusco developers";
    case fuscoInvalidArgument:
      return "invalid argument (run with FUSCO_DEBUG=WARN for details)";
    case fuscoInvalidUsage:
      return "invalid usage (run with FUSCO_DEBUG=WARN for details)";
    case fuscoRemoteError:
      return "remote process exited or there was a network error";
    case fuscoInProgress:
      return "FUSCO operation in progress";
    case fuscoTimeout:
      return "operation timed out";
    default:
      return "unknown result code";
  }
}

const std::string& threadLastError() { return tLastError; }
void clearThreadLastError() { tLastError.clear(); }
void setThreadLastError(const std::string& msg) { tLastError = msg; }

fuscoResult_t setError(fuscoResult_t r, Subsys s, const char* file, int line, const char* fmt,
                       ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  tLastError = buf;
  logMessage(LogLevel::Warn, s, file, line, "%s", buf);
  return r;
}

}  // namespace fusco
