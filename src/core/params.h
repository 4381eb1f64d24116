// Typed parameters, declared in the file that uses them (as NCCL_PARAM):
//
//   FUSCO_PARAM_INT(TimeoutMs, "FUSCO_TIMEOUT_MS", 300000, 1, INT32_MAX, "one-line help");
//
// defines `int64_t paramTimeoutMs()` in the enclosing namespace: the value from an override, the
// environment or the default, cached until the next paramsReload(). Each declaration registers
// itself, so `fusco_info` lists every knob with its value, default, source and validity. A value
// that is not a number, lies outside [min, max] or is not one of the choices is rejected: the
// default is used and one WARN names the variable, the text, what is accepted and the value used.
// A parameter read in several files is declared in one and its accessor in that file's header.
//
// Accessors are thread-safe and cheap (an integer read is two atomic loads once cached); they may
// be called during static initialization of other files.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace fusco {

enum class ParamType { Int, String, Choice };

// One accepted spelling of a choice parameter and the value it stands for (case-insensitive).
struct ParamChoice {
  const char* name;
  int64_t value;
};

// The static part of a declaration. Constant-initialized (no constructor runs), so an accessor
// called before its file's dynamic initializers still finds it; the atomics cache integer values.
struct ParamDesc {
  constexpr ParamDesc(const char* n, ParamType t, int64_t defInt, const char* defText, int64_t mn,
                      int64_t mx, const ParamChoice* ch, size_t nch, const char* h,
                      bool (*ok)(const std::string&) = nullptr, const char* okText = nullptr)
      : name(n),
        type(t),
        defaultInt(defInt),
        defaultText(defText),
        min(mn),
        max(mx),
        choices(ch),
        numChoices(nch),
        help(h),
        textOk(ok),
        textAccepted(okText) {}
  const char* name;
  ParamType type;
  int64_t defaultInt;       // Int
  const char* defaultText;  // String and Choice
  int64_t min, max;         // Int: accepted range, inclusive
  const ParamChoice* choices;
  size_t numChoices;
  const char* help;
  bool (*textOk)(const std::string&);   // String: the texts accepted (nullptr: every text)
  const char* textAccepted;             // String: what textOk accepts, for the warning
  std::atomic<uint64_t> generation{0};  // params generation `cached` belongs to (0: none)
  std::atomic<int64_t> cached{0};       // Int and Choice: the value in force
  std::atomic<int> slot{-1};            // index in the registry once registered
};

// Registers a declaration (the macros' static registrar object does this at load time).
struct ParamRegistrar {
  explicit ParamRegistrar(ParamDesc* d);
};

// Accessor bodies: the value in force (Int, Choice) or its text (String).
int64_t paramReadInt(ParamDesc& d);
std::string paramReadString(ParamDesc& d);

struct ParamInfo {
  const char* name;
  ParamType type;
  const char* defaultValue;  // the default as text
  const char* help;
  std::string value;   // the value in force as text (the default when the given text was rejected)
  std::string source;  // where the given text came from: "default", "env" or "override"
  bool valid = true;   // false: `rejected` was given but is not accepted
  std::string rejected;  // the text that was given and rejected
  std::string accepted;  // what the parameter accepts, e.g. "an integer in [1, 2147483647]"
};

// Re-reads the environment (communicator init calls it so forked ranks see their own env).
void paramsReload();
// Sets a value for this process, winning over the environment (tests and tools).
void paramSetOverride(const char* name, const std::string& value);
// Drops that value again: the parameter reads the environment or its default.
void paramClearOverride(const char* name);
// Every registered parameter, sorted by name, with its current value and where it came from.
std::vector<ParamInfo> paramList();
// The value in force of a parameter named at run time (tests and tools; library code calls the
// typed accessor). An unknown name reads as 0 or "".
int64_t paramIntByName(const char* name);
std::string paramStringByName(const char* name);

}  // namespace fusco

// Integer parameter in [min, max] (K, M and G suffixes multiply by 2^10, 2^20, 2^30).
#define FUSCO_PARAM_INT(Name, env, def, min, max, help)                                \
  static_assert((def) >= (min) && (def) <= (max), env ": default outside [min, max]"); \
  static ::fusco::ParamDesc paramDesc##Name{                                           \
      env, ::fusco::ParamType::Int, (def), "", (min), (max), nullptr, 0, help};        \
  static ::fusco::ParamRegistrar paramRegistrar##Name{&paramDesc##Name};               \
  int64_t param##Name() { return ::fusco::paramReadInt(paramDesc##Name); }

// String parameter; every text is accepted.
#define FUSCO_PARAM_STRING(Name, env, def, help)                         \
  static ::fusco::ParamDesc paramDesc##Name{                             \
      env, ::fusco::ParamType::String, 0, def, 0, 0, nullptr, 0, help};  \
  static ::fusco::ParamRegistrar paramRegistrar##Name{&paramDesc##Name}; \
  std::string param##Name() { return ::fusco::paramReadString(paramDesc##Name); }

// String parameter whose text the function `ok` (bool(const std::string&)) must accept; `accepted`
// says what it accepts. A rejected text is warned about and the default used, as for numbers.
#define FUSCO_PARAM_STRING_CHECKED(Name, env, def, ok, accepted, help)                \
  static ::fusco::ParamDesc paramDesc##Name{                                          \
      env, ::fusco::ParamType::String, 0, def, 0, 0, nullptr, 0, help, ok, accepted}; \
  static ::fusco::ParamRegistrar paramRegistrar##Name{&paramDesc##Name};              \
  std::string param##Name() { return ::fusco::paramReadString(paramDesc##Name); }

// Choice parameter: one of the names in `choices` (a ParamChoice array, case-insensitive), read as
// the value of type `Type` that the name stands for. `def` is one of the names.
#define FUSCO_PARAM_CHOICE(Name, Type, env, def, choices, help)                              \
  static ::fusco::ParamDesc paramDesc##Name{env,     ::fusco::ParamType::Choice,             \
                                            0,       def,                                    \
                                            0,       0,                                      \
                                            choices, sizeof(choices) / sizeof((choices)[0]), \
                                            help};                                           \
  static ::fusco::ParamRegistrar paramRegistrar##Name{&paramDesc##Name};                     \
  Type param##Name() { return static_cast<Type>(::fusco::paramReadInt(paramDesc##Name)); }
