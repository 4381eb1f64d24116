// The live-object registry (see live_registry.h).
#include "core/live_registry.h"

#include <map>
#include <mutex>

namespace fusco {

namespace {

constexpr int kKinds = 4;

struct Registry {
  std::mutex mu;
  std::map<const void*, uint64_t> live[kKinds];  // object -> serial, one map per kind
  uint64_t nextSerial = 1;
};

// Never destroyed: entry points may run from other threads' exit paths or static destructors.
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

std::map<const void*, uint64_t>& liveOf(Registry& r, LiveKind kind) {
  return r.live[static_cast<int>(kind)];
}

}  // namespace

uint64_t registerLive(LiveKind kind, const void* obj) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  return liveOf(r, kind)[obj] = r.nextSerial++;
}

bool unregisterLive(LiveKind kind, const void* obj) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  return liveOf(r, kind).erase(obj) != 0;
}

bool isLive(LiveKind kind, const void* obj) { return liveSerial(kind, obj) != 0; }

uint64_t liveSerial(LiveKind kind, const void* obj) {
  if (obj == nullptr) return 0;
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = liveOf(r, kind).find(obj);
  return it == liveOf(r, kind).end() ? 0 : it->second;
}

bool whileLive(LiveKind kind, const void* obj, void (*fn)(void* arg), void* arg) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  if (liveOf(r, kind).count(obj) == 0) return false;
  fn(arg);
  return true;
}

}  // namespace fusco
