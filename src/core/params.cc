#include "core/params.h"

#include <strings.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "core/log.h"

namespace fusco {

namespace {

// Bumped by every reload and override change: a cached value of an older generation is stale.
std::atomic<uint64_t> gGeneration{1};

// The dynamic state of one registered parameter (guarded by Registry::mu).
struct Entry {
  ParamDesc* d = nullptr;
  std::string defaultText;
  uint64_t generation = 0;  // generation the fields below were resolved at
  std::string text;         // the value in force as text
  std::string source = "default";
  bool valid = true;
  std::string rejected;
  std::string warned;  // the last rejected text warned about: each bad text is warned about once
  int64_t value = 0;   // Int and Choice
};

struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<Entry>> entries;
  std::map<std::string, std::string> overrides;
  std::vector<std::string> warnings;  // to log once the lock is released
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: usable from atexit handlers
  return *r;
}

// Decimal, or hexadecimal with 0x; a leading zero before more digits is refused rather than read
// as octal ("010" would be 8): the text is ambiguous, so it is warned about like any bad value.
bool leadingZero(const char* p) {
  while (isspace(static_cast<unsigned char>(*p))) ++p;
  if (*p == '+' || *p == '-') ++p;
  return p[0] == '0' && isdigit(static_cast<unsigned char>(p[1]));
}

bool parseInt(const std::string& s, int64_t* out) {
  const char* p = s.c_str();
  if (leadingZero(p)) return false;
  char* end = nullptr;
  errno = 0;
  long long v = strtoll(p, &end, 0);
  if (end == p || errno == ERANGE) return false;
  int shift = 0;
  switch (*end) {
    case 'k':
    case 'K':
      shift = 10;
      ++end;
      break;
    case 'm':
    case 'M':
      shift = 20;
      ++end;
      break;
    case 'g':
    case 'G':
      shift = 30;
      ++end;
      break;
    default:
      break;
  }
  while (isspace(static_cast<unsigned char>(*end))) ++end;
  if (*end != '\0') return false;
  if (v > (INT64_MAX >> shift) || v < (INT64_MIN >> shift)) return false;
  *out = static_cast<int64_t>(v) * (int64_t{1} << shift);
  return true;
}

bool parseChoice(const ParamDesc& d, const std::string& s, int64_t* out) {
  for (size_t i = 0; i < d.numChoices; ++i) {
    if (strcasecmp(s.c_str(), d.choices[i].name) == 0) {
      *out = d.choices[i].value;
      return true;
    }
  }
  return false;
}

std::string acceptedText(const ParamDesc& d) {
  switch (d.type) {
    case ParamType::Int:
      if (d.max == INT64_MAX) return "an integer >= " + std::to_string(d.min);
      return "an integer in [" + std::to_string(d.min) + ", " + std::to_string(d.max) + "]";
    case ParamType::Choice: {
      std::string s = "one of ";
      for (size_t i = 0; i < d.numChoices; ++i)
        s += (i ? ", " : "") + std::string(d.choices[i].name);
      return s;
    }
    case ParamType::String:
      if (d.textAccepted != nullptr) return d.textAccepted;
      break;
  }
  return "any text";
}

// Parses `text` for d: false when it is not accepted.
bool parseValue(const ParamDesc& d, const std::string& text, int64_t* value) {
  if (d.type == ParamType::String) return d.textOk == nullptr || d.textOk(text);
  if (d.type == ParamType::Choice) return parseChoice(d, text, value);
  return parseInt(text, value) && *value >= d.min && *value <= d.max;
}

Entry& registerLocked(Registry& r, ParamDesc* d) {
  int slot = d->slot.load(std::memory_order_relaxed);
  if (slot >= 0) return *r.entries[slot];
  auto e = std::make_unique<Entry>();
  e->d = d;
  e->defaultText = d->type == ParamType::Int ? std::to_string(d->defaultInt) : d->defaultText;
  r.entries.push_back(std::move(e));
  d->slot.store(static_cast<int>(r.entries.size() - 1), std::memory_order_relaxed);
  return *r.entries.back();
}

// Reads the override or the environment into e for generation `gen`; queues a warning for a
// rejected text not warned about before.
void resolveLocked(Registry& r, Entry& e, uint64_t gen) {
  const ParamDesc& d = *e.d;
  std::string given;
  e.source = "default";
  auto ov = r.overrides.find(d.name);
  const char* env = getenv(d.name);
  if (ov != r.overrides.end()) {
    given = ov->second;
    e.source = "override";
  } else if (env != nullptr && env[0] != '\0') {
    given = env;
    e.source = "env";
  }
  e.valid = true;
  e.rejected.clear();
  e.text = e.defaultText;
  int64_t fallback = d.defaultInt;
  if (d.type == ParamType::Choice) parseChoice(d, e.defaultText, &fallback);
  e.value = fallback;
  if (e.source == "default") e.warned.clear();  // a text rejected again later is warned about again
  // An empty override of a number or choice means its default, as an unset variable does.
  if (e.source != "default" && (d.type == ParamType::String || !given.empty())) {
    int64_t v = 0;
    if (parseValue(d, given, &v)) {
      e.warned.clear();
      e.text = given;
      e.value = d.type == ParamType::String ? 0 : v;
    } else {
      e.valid = false;
      e.rejected = given;
      if (e.warned != given) {
        e.warned = given;
        r.warnings.push_back(std::string(d.name) + "=\"" + given + "\" from the " +
                             (e.source == "env" ? "environment" : "override") + " is not " +
                             acceptedText(d) + "; using the default " + e.defaultText);
      }
    }
  }
  e.generation = gen;
  e.d->cached.store(e.value, std::memory_order_relaxed);
  e.d->generation.store(gen, std::memory_order_release);
}

Entry& currentLocked(Registry& r, ParamDesc* d) {
  Entry& e = registerLocked(r, d);
  const uint64_t gen = gGeneration.load(std::memory_order_acquire);
  if (e.generation != gen) resolveLocked(r, e, gen);
  return e;
}

Entry* findLocked(Registry& r, const char* name) {
  for (auto& e : r.entries)
    if (strcmp(e->d->name, name) == 0) return &currentLocked(r, e->d);
  return nullptr;
}

void reloadLocked(Registry& r) {
  const uint64_t gen = gGeneration.fetch_add(1, std::memory_order_acq_rel) + 1;
  for (auto& e : r.entries) resolveLocked(r, *e, gen);
}

// Logs the queued warnings outside the lock: logging reads FUSCO_DEBUG* through this registry.
// A warning queued while this thread is already logging one is logged by that outer call.
void flushWarnings() {
  static thread_local bool flushing = false;
  if (flushing) return;
  flushing = true;
  Registry& r = registry();
  for (;;) {
    std::string msg;
    {
      std::lock_guard<std::mutex> g(r.mu);
      if (r.warnings.empty()) break;
      msg = std::move(r.warnings.front());
      r.warnings.erase(r.warnings.begin());
    }
    FUSCO_WARN(kInit, "%s", msg.c_str());
  }
  flushing = false;
}

}  // namespace

ParamRegistrar::ParamRegistrar(ParamDesc* d) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  registerLocked(r, d);
}

int64_t paramReadInt(ParamDesc& d) {
  if (d.generation.load(std::memory_order_acquire) == gGeneration.load(std::memory_order_acquire))
    return d.cached.load(std::memory_order_relaxed);
  Registry& r = registry();
  int64_t v;
  {
    std::lock_guard<std::mutex> g(r.mu);
    v = currentLocked(r, &d).value;
  }
  flushWarnings();
  return v;
}

std::string paramReadString(ParamDesc& d) {
  Registry& r = registry();
  std::string v;
  {
    std::lock_guard<std::mutex> g(r.mu);
    v = currentLocked(r, &d).text;
  }
  flushWarnings();
  return v;
}

void paramsReload() {
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> g(r.mu);
    reloadLocked(r);
  }
  flushWarnings();
}

void paramSetOverride(const char* name, const std::string& value) {
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> g(r.mu);
    r.overrides[name] = value;
    reloadLocked(r);
  }
  flushWarnings();
}

void paramClearOverride(const char* name) {
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> g(r.mu);
    r.overrides.erase(name);
    reloadLocked(r);
  }
  flushWarnings();
}

std::vector<ParamInfo> paramList() {
  Registry& r = registry();
  std::vector<ParamInfo> out;
  {
    std::lock_guard<std::mutex> g(r.mu);
    for (auto& p : r.entries) {
      Entry& e = currentLocked(r, p->d);
      out.push_back(ParamInfo{e.d->name, e.d->type, e.defaultText.c_str(), e.d->help, e.text,
                              e.source, e.valid, e.rejected, acceptedText(*e.d)});
    }
  }
  flushWarnings();
  std::sort(out.begin(), out.end(),
            [](const ParamInfo& a, const ParamInfo& b) { return strcmp(a.name, b.name) < 0; });
  return out;
}

int64_t paramIntByName(const char* name) {
  Registry& r = registry();
  int64_t v = 0;
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (Entry* e = findLocked(r, name)) v = e->value;
  }
  flushWarnings();
  return v;
}

std::string paramStringByName(const char* name) {
  Registry& r = registry();
  std::string v;
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (Entry* e = findLocked(r, name)) v = e->text;
  }
  flushWarnings();
  return v;
}

}  // namespace fusco
