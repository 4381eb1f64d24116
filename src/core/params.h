// One registry for every knob: each is declared once in params.cc (environment name, type,
// default, one-line help) and read through these functions. `fusco_info` prints them all.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusco {

enum class ParamType { Int, String };

struct ParamInfo {
  const char* name;
  ParamType type;
  const char* defaultValue;
  const char* help;
  std::string value;   // current value as text
  std::string source;  // "default", "env" or "override"
};

// Current value of a parameter (environment read on first use and after paramsReload()).
int64_t paramInt(const char* name);
std::string paramString(const char* name);
// Re-reads the environment (communicator init calls it so forked ranks see their own env).
void paramsReload();
// Sets a value for this process, winning over the environment (tests and tools).
void paramSetOverride(const char* name, const std::string& value);
// Drops that value again: the parameter reads the environment or its default.
void paramClearOverride(const char* name);
// Every declared parameter with its current value and where it came from.
std::vector<ParamInfo> paramList();

}  // namespace fusco
