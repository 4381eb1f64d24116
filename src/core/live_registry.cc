// The live-object registry (see live_registry.h).
#include "core/live_registry.h"

#include <map>
#include <mutex>

namespace fusco {

namespace {

constexpr int kKinds = 5;

struct Registry {
  std::mutex mu;
  std::map<const void*, void*> live[kKinds];  // handle -> object, one map per kind
  uintptr_t nextSerial = 1;
};

// Never destroyed: entry points may run from other threads' exit paths or static destructors.
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

std::map<const void*, void*>& liveOf(Registry& r, LiveKind kind) {
  return r.live[static_cast<int>(kind)];
}

// 16-byte steps above a base per kind that no allocation uses: a handle shows its kind in a
// debugger, and the serial leaves 2^36 handles before the bases could meet.
const void* handleFor(LiveKind kind, uintptr_t serial) {
  const uintptr_t base = uintptr_t{0xf5c1} + static_cast<uintptr_t>(kind);
  return reinterpret_cast<const void*>(base << 40 | serial << 4);
}

}  // namespace

void* registerLive(LiveKind kind, void* obj) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  const void* h = handleFor(kind, r.nextSerial++);
  liveOf(r, kind)[h] = obj;
  return const_cast<void*>(h);
}

void* mintHandle(LiveKind kind) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  return const_cast<void*>(handleFor(kind, r.nextSerial++));
}

void* unregisterLive(LiveKind kind, const void* handle) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = liveOf(r, kind).find(handle);
  if (it == liveOf(r, kind).end()) return nullptr;
  void* obj = it->second;
  liveOf(r, kind).erase(it);
  return obj;
}

void* liveObject(LiveKind kind, const void* handle) {
  if (handle == nullptr) return nullptr;
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = liveOf(r, kind).find(handle);
  return it == liveOf(r, kind).end() ? nullptr : it->second;
}

bool whileLive(LiveKind kind, const void* handle, void (*fn)(void* obj, void* arg), void* arg) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  auto it = liveOf(r, kind).find(handle);
  if (it == liveOf(r, kind).end()) return false;
  fn(it->second, arg);
  return true;
}

}  // namespace fusco
