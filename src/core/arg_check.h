// An argument problem found on this rank during a collective call. It is recorded in the engine
// operation and reported after the call's first exchange, so peers learn about it instead of
// waiting for this rank (docs/API.md, "Errors in collective calls").
#pragma once

#include <cstdarg>
#include <cstdio>
#include <string>

#include "fusco.h"

namespace fusco {

struct ArgCheck {
  fuscoResult_t status = fuscoSuccess;
  std::string message;
  // Records the first failure only: later checks cannot overwrite the message a peer will see.
  void fail(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    if (status != fuscoSuccess) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    status = fuscoInvalidArgument;
    message = buf;
  }
  bool ok() const { return status == fuscoSuccess; }
};

}  // namespace fusco
