// Events (CUDA runtime API, "Event Management"; programming guide, "Events").
//
// cudaEventRecord captures the stream's work at the call; the event completes when that work has.
// cudaEventQuery and cudaStreamWaitEvent refer to the most recent record at their call, and an
// event never recorded is complete. Under stream capture a record and a wait on it become graph
// nodes; waiting in a capture on an event recorded outside it is cudaErrorStreamCaptureIsolation
// ("dependency created on uncaptured work in another stream").
#include <set>

#include "twin_internal.h"

namespace twincuda {
namespace detail {
namespace {

struct Record {
  std::atomic<bool> done{false};
  int64_t ns = 0;
};

struct Event {
  unsigned flags = 0;
  bool destroyed = false;
  // Guarded by the context's mutex.
  std::shared_ptr<Record> last;
  Stream* lastStream = nullptr;
  uint64_t captureId = 0;  // the capture its last record belongs to (0: none)
};

// Events are never freed: a replayed graph may still name a destroyed one's handle.
std::set<Event*>& events() {
  static auto* s = new std::set<Event*>;
  return *s;
}

Event* findEventLocked(cudaEvent_t h) {
  auto it = events().find(reinterpret_cast<Event*>(h));
  return it == events().end() || (*it)->destroyed ? nullptr : *it;
}

std::string eventName(const Event* ev) { return "event " + fmtPtr(ev); }

ItemPtr recordItem(Event* ev) {
  auto it = std::make_shared<Item>();
  it->desc = "cudaEventRecord(" + eventName(ev) + ")";
  it->prepare = [ev](Item& self) {
    auto r = std::make_shared<Record>();
    ev->last = r;
    ev->lastStream = self.stream;
    ev->captureId = 0;
    self.run = [r] {
      r->ns = nowNs();
      r->done.store(true);
    };
  };
  return it;
}

ItemPtr waitItem(Event* ev) {
  auto it = std::make_shared<Item>();
  it->desc = "cudaStreamWaitEvent(" + eventName(ev) + ")";
  it->prepare = [ev](Item& self) {
    std::shared_ptr<Record> r = ev->last;
    if (ev->lastStream) self.desc += " recorded on " + streamName(ev->lastStream);
    if (r) self.ready = [r] { return r->done.load(); };
  };
  return it;
}

}  // namespace
}  // namespace detail
}  // namespace twincuda

using namespace twincuda::detail;

extern "C" {

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  TWIN_ENTER();
  const unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (event == nullptr || (flags & ~known) != 0) return fail(cudaErrorInvalidValue);
  auto* ev = new Event;
  ev->flags = flags;
  std::lock_guard<std::mutex> g(contextMutex());
  events().insert(ev);
  *event = reinterpret_cast<cudaEvent_t>(ev);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  TWIN_ENTER();
  std::lock_guard<std::mutex> g(contextMutex());
  Event* ev = findEventLocked(event);
  if (ev == nullptr) return fail(cudaErrorInvalidResourceHandle);
  ev->destroyed = true;  // pending records still complete: items hold their records
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  TWIN_ENTER();
  Stream* s = findStream(stream);
  std::lock_guard<std::mutex> g(contextMutex());
  Event* ev = findEventLocked(event);
  if (s == nullptr || ev == nullptr) return fail(cudaErrorInvalidResourceHandle);
  const cudaError_t e = submitLocked(s, recordItem(ev));
  if (e == cudaSuccess && s->capture != nullptr) {
    ev->captureId = s->capture->id;
    ev->lastStream = s;
  }
  return fail(e);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  TWIN_ENTER();
  Stream* s = findStream(stream);
  std::lock_guard<std::mutex> g(contextMutex());
  Event* ev = findEventLocked(event);
  if (s == nullptr || ev == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (flags != cudaEventWaitDefault) return fail(cudaErrorInvalidValue);
  if (s->capture != nullptr) {
    if (ev->captureId == s->capture->id) return fail(submitLocked(s, waitItem(ev)));
    if (ev->last == nullptr) return cudaSuccess;  // never recorded: nothing to wait for
    s->capture->invalidated = true;
    return fail(cudaErrorStreamCaptureIsolation);
  }
  if (ev->captureId != 0) {
    // A wait on a captured event joins the waiting stream to the capture (cross-stream capture).
    // The twin records one stream per capture; it says so rather than order wrongly.
    report(
        "cudaStreamWaitEvent: %s joins another stream's capture (cross-stream capture is "
        "not modelled by the twin)",
        streamName(s).c_str());
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  return fail(submitLocked(s, waitItem(ev)));
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  TWIN_ENTER();
  std::lock_guard<std::mutex> g(contextMutex());
  Event* ev = findEventLocked(event);
  if (ev == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (ev->captureId != 0) return fail(cudaErrorStreamCaptureUnsupported);
  return ev->last == nullptr || ev->last->done.load() ? cudaSuccess : fail(cudaErrorNotReady);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  TWIN_ENTER();
  std::shared_ptr<Record> r;
  Stream* on = nullptr;
  {
    std::lock_guard<std::mutex> g(contextMutex());
    Event* ev = findEventLocked(event);
    if (ev == nullptr) return fail(cudaErrorInvalidResourceHandle);
    if (ev->captureId != 0) return fail(cudaErrorStreamCaptureUnsupported);
    r = ev->last;
    on = ev->lastStream;
  }
  if (r == nullptr) return cudaSuccess;
  return waitFor("cudaEventSynchronize", on, [r] { return r->done.load(); });
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  TWIN_ENTER();
  if (ms == nullptr) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> g(contextMutex());
  Event* a = findEventLocked(start);
  Event* b = findEventLocked(end);
  if (a == nullptr || b == nullptr) return fail(cudaErrorInvalidResourceHandle);
  // "If either event was created with the cudaEventDisableTiming flag, then this function will
  // return cudaErrorInvalidResourceHandle"; either not yet recorded: the same.
  if ((a->flags | b->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
  if (a->last == nullptr || b->last == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (!a->last->done.load() || !b->last->done.load()) return fail(cudaErrorNotReady);
  *ms = static_cast<float>(b->last->ns - a->last->ns) / 1e6f;
  return cudaSuccess;
}

}  // extern "C"
