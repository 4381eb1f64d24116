#include "core/params.h"

#include <cstdlib>
#include <map>
#include <mutex>

namespace fusco {

namespace {

struct ParamDecl {
  const char* name;
  ParamType type;
  const char* defaultValue;
  const char* help;
};

// The one list of knobs. Keep each help to one line.
const ParamDecl kParams[] = {
    {"FUSCO_DEBUG", ParamType::String, "WARN", "log level: NONE, WARN, INFO or TRACE"},
    {"FUSCO_DEBUG_SUBSYS", ParamType::String, "ALL",
     "subsystems to log, comma separated (INIT,BOOT,PLAN,ENGINE,SHM,IPC,UCX,API,NET); ^ negates"},
    {"FUSCO_DEBUG_FILE", ParamType::String, "", "log to this file instead of stderr (%h host, %p pid)"},
    {"FUSCO_TIMEOUT_MS", ParamType::Int, "300000",
     "timeout of bootstrap and of every blocking wait, in milliseconds"},
    {"FUSCO_LOCAL_SIZE", ParamType::Int, "0",
     "ranks per node; > 0 splits one host into virtual nodes of this many ranks (0: by host)"},
    {"FUSCO_SOCKET_IFNAME", ParamType::String, "",
     "network interface (prefix) for the bootstrap socket; ^ excludes, = exact match"},
    {"FUSCO_NET_DEVICES", ParamType::String, "", "inter-node devices/rails, comma separated (empty: auto)"},
    {"FUSCO_CHUNK_BYTES", ParamType::Int, "0", "pipeline slice size in bytes (0: auto, 512 KiB)"},
    {"FUSCO_PIPELINE_DEPTH", ParamType::Int, "0", "slices in flight per peer (0: auto, 4)"},
    {"FUSCO_PLAN_TRACE", ParamType::Int, "0", "1: print one line per MoE plan (rows, bytes, dedup)"},
    {"FUSCO_BALANCE_SLACK", ParamType::Int, "64",
     "GREEDY balance: keep same-index rails within this many 1/1024 of the bound (no relay/split)"},
    {"FUSCO_SHM_ARENA_BYTES", ParamType::Int, "4294967296",
     "virtual size of each rank's shared arena for fuscoMemAlloc (pages are used on touch)"},
    {"FUSCO_SHM_DIRECT", ParamType::Int, "1",
     "1: write straight into a peer's arena buffer when it is one (one copy); 0: always stage"},
    {"FUSCO_CUDA_SMS", ParamType::Int, "0",
     "CUDA path: multiprocessors the copy and sum kernels may use (0: all), like DeepEP's num_sms"},
    {"FUSCO_LIVENESS_MS", ParamType::Int, "100",
     "how often a waiting rank checks that its peers are alive, in milliseconds"},
    {"FUSCO_SPIN_BEFORE_YIELD", ParamType::Int, "64",
     "polls of a wait loop before it yields the core to other processes"},
    {"FUSCO_FAULT", ParamType::String, "",
     "debug: inject faults, e.g. kill:dispatch:rank=2[:after=N][:ms=M]; ';' separates specs (core/fault.h)"},
};

struct Registry {
  std::mutex mu;
  bool loaded = false;
  std::map<std::string, std::string> overrides;
  std::map<std::string, ParamInfo> values;
};

Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

void loadLocked(Registry& r) {
  r.values.clear();
  for (const auto& d : kParams) {
    ParamInfo info{d.name, d.type, d.defaultValue, d.help, d.defaultValue, "default"};
    auto ov = r.overrides.find(d.name);
    const char* env = getenv(d.name);
    if (ov != r.overrides.end()) {
      info.value = ov->second;
      info.source = "override";
    } else if (env != nullptr && env[0] != '\0') {
      info.value = env;
      info.source = "env";
    }
    r.values[d.name] = info;
  }
  r.loaded = true;
}

const ParamInfo* findLocked(Registry& r, const char* name) {
  if (!r.loaded) loadLocked(r);
  auto it = r.values.find(name);
  return it == r.values.end() ? nullptr : &it->second;
}

}  // namespace

int64_t paramInt(const char* name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  const ParamInfo* p = findLocked(r, name);
  if (p == nullptr) return 0;
  char* end = nullptr;
  long long v = strtoll(p->value.c_str(), &end, 0);
  if (end == p->value.c_str()) v = strtoll(p->defaultValue, nullptr, 0);
  // Accept K/M/G suffixes for sizes.
  if (end && (*end == 'K' || *end == 'k')) v <<= 10;
  if (end && (*end == 'M' || *end == 'm')) v <<= 20;
  if (end && (*end == 'G' || *end == 'g')) v <<= 30;
  return v;
}

std::string paramString(const char* name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  const ParamInfo* p = findLocked(r, name);
  return p ? p->value : std::string();
}

void paramsReload() {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  loadLocked(r);
}

void paramSetOverride(const char* name, const std::string& value) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  r.overrides[name] = value;
  loadLocked(r);
}

void paramClearOverride(const char* name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  r.overrides.erase(name);
  loadLocked(r);
}

std::vector<ParamInfo> paramList() {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.loaded) loadLocked(r);
  std::vector<ParamInfo> out;
  for (const auto& d : kParams) out.push_back(r.values[d.name]);
  return out;
}

}  // namespace fusco
