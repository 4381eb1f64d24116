// Streams on hardware queues (T1, T6).
//
// CUDA programming guide, "Asynchronous Concurrent Execution" / "Streams": a stream is a sequence
// of commands that execute in order; different streams may run concurrently. "Implicit
// Synchronization" and the runtime API's "Stream synchronization behavior": the legacy default
// stream waits for all prior work of the blocking streams of the context, and they wait for it;
// cudaStreamNonBlocking streams do not synchronize with it. The hardware puts the streams' work
// on CUDA_DEVICE_MAX_CONNECTIONS work queues (default 8, read at context creation; the
// programming guide's environment variables): a command at the head of a queue that cannot start
// (a stream memory-operation wait, an event wait, a command whose same-stream predecessor still
// runs) holds every stream that shares the queue. A command that can start is handed to the
// multiprocessors and the queue moves on; a kernel starts once it has its multiprocessors (T7,
// twin_sms.cc), so one waiting for them holds its queue too. The twin does exactly that: one
// dispatcher thread per queue, and a thread per running kernel or copy.
#include <chrono>
#include <condition_variable>
#include <thread>

#include "twin_internal.h"

namespace twincuda {
namespace detail {
namespace {

struct Queue {
  int index = 0;
  std::deque<ItemPtr> items;
  std::condition_variable cv;
};

struct Context {
  std::mutex mu;
  std::condition_variable done;  // an item completed
  std::vector<std::unique_ptr<Queue>> queues;
  // Streams are never freed: a destroyed stream's handle stays invalid rather than reused.
  std::vector<std::unique_ptr<Stream>> streams;
  Stream* legacy = nullptr;
  int nextQueue = 0;
};

void dispatch(Context* c, Queue* q);

Context* context() {
  // Never destroyed: its threads run until the process ends, and exit must not join them.
  static Context* c = [] {
    Context* n = new Context;
    int conns = static_cast<int>(knob("CUDA_DEVICE_MAX_CONNECTIONS", 8));
    if (conns < 1) conns = 1;
    if (conns > 32) conns = 32;  // the hardware's range
    for (int i = 0; i < conns; ++i) {
      n->queues.push_back(std::make_unique<Queue>());
      n->queues.back()->index = i;
    }
    auto legacy = std::make_unique<Stream>();
    legacy->legacy = true;
    legacy->queue = n->nextQueue++ % conns;
    n->legacy = legacy.get();
    n->streams.push_back(std::move(legacy));
    for (auto& qu : n->queues) std::thread(dispatch, n, qu.get()).detach();
    return n;
  }();
  return c;
}

thread_local Stream* tPerThread = nullptr;

Stream* newStreamLocked(Context* c, unsigned flags) {
  auto s = std::make_unique<Stream>();
  s->id = static_cast<int>(c->streams.size());
  s->flags = flags;
  s->queue = c->nextQueue++ % static_cast<int>(c->queues.size());
  Stream* r = s.get();
  c->streams.push_back(std::move(s));
  return r;
}

bool afterDone(const Item& it) {
  for (const auto& a : it.after)
    if (a.first->completed.load() < a.second) return false;
  return true;
}

void completeLocked(Context* c, const ItemPtr& it) {
  Stream* s = it->stream;
  if (!s->pending.empty() && s->pending.front() == it) s->pending.pop_front();
  s->completed.fetch_add(1);
  c->done.notify_all();
  for (auto& q : c->queues) q->cv.notify_all();
}

// Runs an item's body with its accesses checked (T3); a miss leaves the body unrun.
void execute(const ItemPtr& it) {
  auto hold = holdMappings();
  if (!checkAccesses(it->accesses, it->desc)) return;
  if (it->run) it->run();
}

bool headBlocked(Context* c, Queue* q, std::unique_lock<std::mutex>& lk, const ItemPtr& it) {
  if (it->stream->running || !afterDone(*it)) return true;
  if (!it->ready || stickyError() != cudaSuccess) return false;
  lk.unlock();
  const bool r = it->ready();
  lk.lock();
  return !r || q->items.empty() || q->items.front() != it;
}

// T7: a kernel at the head takes its multiprocessors before it starts; until it can, it holds
// its queue. False while they are not free.
bool takeSms(Queue* q, std::unique_lock<std::mutex>& lk, const ItemPtr& it) {
  if (it->sms == 0 || stickyError() != cudaSuccess) return true;
  lk.unlock();
  SmHold h;
  const bool got = acquireSms(it->sms, it->cooperative, it->desc, &h);
  lk.lock();
  if (got && (q->items.empty() || q->items.front() != it)) {
    releaseSms(&h);
    return false;
  }
  if (!got && !it->waitingSms) noteSmWait();
  it->waitingSms = !got;
  it->smHold = h;
  return got;
}

void dispatch(Context* c, Queue* q) {
  std::unique_lock<std::mutex> lk(c->mu);
  int64_t backoffUs = 10;
  for (;;) {
    if (q->items.empty()) {
      q->cv.wait(lk);
      continue;
    }
    ItemPtr it = q->items.front();
    if (headBlocked(c, q, lk, it) || !takeSms(q, lk, it)) {
      // Waits on memory (or multiprocessors) another process releases cannot be notified: poll,
      // backing off to 1 ms.
      q->cv.wait_for(lk, std::chrono::microseconds(backoffUs));
      backoffUs = backoffUs < 1000 ? backoffUs * 2 : 1000;
      continue;
    }
    backoffUs = 10;
    q->items.pop_front();
    if (stickyError() != cudaSuccess) {  // a faulted context runs nothing more
      completeLocked(c, it);
      continue;
    }
    if (it->work) {
      it->stream->running = true;
      std::thread([c, it] {
        execute(it);
        releaseSms(&it->smHold);
        std::lock_guard<std::mutex> g(c->mu);
        it->stream->running = false;
        completeLocked(c, it);
      }).detach();
      continue;
    }
    lk.unlock();
    execute(it);
    releaseSms(&it->smHold);
    lk.lock();
    completeLocked(c, it);
  }
}

bool allIdleLocked(Context* c) {
  for (auto& s : c->streams)
    if (s->completed.load() != s->submitted.load()) return false;
  return true;
}

// T7: what a kernel waits for, when it waits for multiprocessors.
std::string smWait(const Item& it) {
  if (!it.waitingSms) return "";
  return (it.cooperative ? ", waiting for all " + std::to_string(it.sms) +
                               " multiprocessors (a cooperative grid is resident whole): "
                         : std::string(", waiting for a free multiprocessor: ")) +
         smHolders();
}

// What holds a stream: its oldest unfinished item, and the head of its queue when that is
// another stream's item (head-of-line blocking, T6).
std::string holderLocked(Context* c, Stream* s) {
  if (s == nullptr) {
    for (auto& x : c->streams)
      if (!x->pending.empty()) return holderLocked(c, x.get());
    return "nothing (idle)";
  }
  if (s->pending.empty()) return "nothing (idle)";
  std::string r = s->pending.front()->desc + " on " + streamName(s) + smWait(*s->pending.front());
  Queue* q = c->queues[s->queue].get();
  if (!q->items.empty() && q->items.front()->stream != s)
    r += ", behind " + q->items.front()->desc + " on " + streamName(q->items.front()->stream) +
         " at the head of hardware queue " + std::to_string(q->index) + smWait(*q->items.front());
  return r;
}

}  // namespace

std::mutex& contextMutex() { return context()->mu; }

std::string streamName(const Stream* s) {
  if (s->legacy) return "the legacy default stream";
  return "stream " + std::to_string(s->id) +
         (s->flags & cudaStreamNonBlocking ? " (non-blocking)" : "");
}

Stream* findStream(cudaStream_t h) {
  Context* c = context();
  if (h == nullptr || h == cudaStreamLegacy) return c->legacy;
  std::lock_guard<std::mutex> g(c->mu);
  if (h == cudaStreamPerThread) {
    // The per-thread default stream is a blocking stream of its own (runtime API, "Stream
    // synchronization behavior").
    if (tPerThread == nullptr) tPerThread = newStreamLocked(c, cudaStreamDefault);
    return tPerThread;
  }
  for (auto& s : c->streams)
    if (s.get() == reinterpret_cast<Stream*>(h)) return s->destroyed ? nullptr : s.get();
  return nullptr;
}

cudaError_t submitLocked(Stream* s, ItemPtr it) {
  Context* c = context();
  it->stream = s;
  if (s->capture != nullptr) {
    if (s->capture->invalidated) return cudaErrorStreamCaptureInvalidated;
    s->capture->items.push_back(std::move(it));
    return cudaSuccess;
  }
  if (it->prepare) it->prepare(*it);
  it->after.clear();
  if (s->legacy) {
    for (auto& x : c->streams)
      if (!x->legacy && !(x->flags & cudaStreamNonBlocking) && x->submitted > x->completed)
        it->after.emplace_back(x.get(), x->submitted.load());
  } else if (!(s->flags & cudaStreamNonBlocking) && c->legacy->submitted > c->legacy->completed) {
    it->after.emplace_back(c->legacy, c->legacy->submitted.load());
  }
  s->submitted.fetch_add(1);
  s->pending.push_back(it);
  Queue* q = c->queues[s->queue].get();
  q->items.push_back(std::move(it));
  q->cv.notify_all();
  return cudaSuccess;
}

cudaError_t submit(Stream* s, ItemPtr it) {
  std::lock_guard<std::mutex> g(context()->mu);
  return submitLocked(s, std::move(it));
}

cudaError_t waitFor(const char* call, Stream* holder, const std::function<bool()>& done) {
  Context* c = context();
  const int64_t limitMs = knob("FUSCO_TWIN_SYNC_LIMIT_MS", 10000);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(limitMs);
  std::unique_lock<std::mutex> lk(c->mu);
  while (!done()) {
    if (c->done.wait_until(lk, deadline) == std::cv_status::timeout && !done()) {
      // A GPU would wait for ever here: the H100 deadlock (docs/DESIGN.md, "The CUDA rules").
      Stream* s = holder;
      if (s == nullptr)
        for (auto& x : c->streams)
          if (!x->pending.empty()) {
            s = x.get();
            break;
          }
      report("%s waited for the stream %s for %lld ms (FUSCO_TWIN_SYNC_LIMIT_MS), held by %s", call,
             s ? streamName(s).c_str() : "(none)", static_cast<long long>(limitMs),
             holderLocked(c, s).c_str());
      noteSyncLimit();
      return fail(cudaErrorTimeout);
    }
  }
  const cudaError_t st = stickyError();
  return st == cudaSuccess ? st : fail(st);
}

cudaError_t waitIdle(const char* call) {
  Context* c = context();
  return waitFor(call, nullptr, [c] { return allIdleLocked(c); });
}

}  // namespace detail
}  // namespace twincuda

using namespace twincuda::detail;

namespace {
// Synchronizing or querying a capturing stream is illegal and invalidates the capture (runtime
// API, stream capture). Called with the context's mutex held.
cudaError_t refuseWhileCapturing(Stream* s) {
  s->capture->invalidated = true;
  return fail(cudaErrorStreamCaptureUnsupported);
}
}  // namespace

extern "C" {

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  TWIN_ENTER();
  if (pStream == nullptr || (flags & ~cudaStreamNonBlocking) != 0)
    return fail(cudaErrorInvalidValue);
  Context* c = context();
  std::lock_guard<std::mutex> g(c->mu);
  *pStream = reinterpret_cast<cudaStream_t>(newStreamLocked(c, flags));
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
  return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  TWIN_ENTER();
  Stream* s = findStream(stream);
  if (s == nullptr || s->legacy || stream == cudaStreamPerThread)
    return fail(cudaErrorInvalidResourceHandle);
  // "the function will return immediately and the resources associated with stream will be
  // released automatically once the device has completed all work in stream" (runtime API).
  std::lock_guard<std::mutex> g(context()->mu);
  s->destroyed = true;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  TWIN_ENTER();
  Stream* s = findStream(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  {
    std::lock_guard<std::mutex> g(contextMutex());
    if (s->capture != nullptr) return refuseWhileCapturing(s);
  }
  const uint64_t target = s->submitted.load();
  return waitFor("cudaStreamSynchronize", s, [s, target] { return s->completed.load() >= target; });
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  TWIN_ENTER();
  Stream* s = findStream(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> g(contextMutex());
  if (s->capture != nullptr) return refuseWhileCapturing(s);
  return s->completed.load() == s->submitted.load() ? cudaSuccess : fail(cudaErrorNotReady);
}

cudaError_t cudaDeviceSynchronize(void) {
  TWIN_ENTER();
  const cudaError_t g = captureGuard("cudaDeviceSynchronize");
  if (g != cudaSuccess) return g;
  return waitIdle("cudaDeviceSynchronize");
}

}  // extern "C"
