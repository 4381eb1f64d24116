// Stream capture and graphs (CUDA programming guide, "CUDA Graphs" / "Creating a Graph Using
// Stream Capture"; runtime API, cudaStreamBeginCapture and cudaThreadExchangeStreamCaptureMode).
//
// A capturing stream records its items, with their arguments, instead of running them; a graph
// launch replays them on a stream, so a replay reads the buffers' contents at its own time (new
// input values), never those of the capture. The capture modes decide which "potentially unsafe
// API calls" (cudaMalloc, synchronous copies, synchronization, ...) a thread may make during a
// capture: Global (the default) forbids them while this thread has an ongoing non-relaxed capture
// or any other thread has a Global one; ThreadLocal only for this thread's captures; Relaxed never.
// A forbidden call fails with cudaErrorStreamCaptureUnsupported and invalidates the capture.
//
// Not modelled: a capture fanned out into other streams through events (cross-stream capture).
// Each capture is one stream, so a graph is a chain of its items.
#include <set>

#include "twin_internal.h"

namespace twincuda {
namespace detail {
namespace {

struct Graph {
  std::vector<ItemPtr> items;
};

// Guarded by the context's mutex.
std::vector<Capture*>& captures() {
  static auto* v = new std::vector<Capture*>;
  return *v;
}
std::set<Graph*>& graphs() {
  static auto* s = new std::set<Graph*>;
  return *s;
}
std::set<Graph*>& execs() {
  static auto* s = new std::set<Graph*>;
  return *s;
}
uint64_t gNextCapture = 1;
thread_local cudaStreamCaptureMode tMode = cudaStreamCaptureModeGlobal;

const char* modeName(cudaStreamCaptureMode m) {
  switch (m) {
    case cudaStreamCaptureModeGlobal:
      return "global";
    case cudaStreamCaptureModeThreadLocal:
      return "thread-local";
    default:
      return "relaxed";
  }
}

Graph* findIn(std::set<Graph*>& set, const void* h) {
  auto it = set.find(static_cast<Graph*>(const_cast<void*>(h)));
  return it == set.end() ? nullptr : *it;
}

}  // namespace

cudaError_t captureGuard(const char* call) {
  std::lock_guard<std::mutex> g(contextMutex());
  if (tMode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  const std::thread::id me = std::this_thread::get_id();
  Capture* hit = nullptr;
  for (Capture* c : captures()) {
    const bool mine = c->owner == me && c->mode != cudaStreamCaptureModeRelaxed;
    const bool global = tMode == cudaStreamCaptureModeGlobal && c->owner != me &&
                        c->mode == cudaStreamCaptureModeGlobal;
    if (mine || global) {
      c->invalidated = true;
      hit = c;
    }
  }
  if (hit == nullptr) return cudaSuccess;
  report(
      "%s is not permitted while %s captures in %s mode (this thread's capture mode: %s); "
      "the capture is invalidated",
      call, streamName(hit->origin).c_str(), modeName(hit->mode), modeName(tMode));
  return fail(cudaErrorStreamCaptureUnsupported);
}

}  // namespace detail
}  // namespace twincuda

using namespace twincuda::detail;

extern "C" {

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  TWIN_ENTER();
  if (mode == nullptr || *mode < cudaStreamCaptureModeGlobal ||
      *mode > cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue);
  std::swap(*mode, tMode);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  TWIN_ENTER();
  Stream* s = findStream(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (mode < cudaStreamCaptureModeGlobal || mode > cudaStreamCaptureModeRelaxed)
    return fail(cudaErrorInvalidValue);
  // The legacy stream cannot be captured (programming guide: "Cross-stream Dependencies and
  // Events"; capture of the NULL stream is unsupported).
  if (s->legacy) return fail(cudaErrorStreamCaptureUnsupported);
  std::lock_guard<std::mutex> g(contextMutex());
  if (s->capture != nullptr) return fail(cudaErrorIllegalState);
  auto* c = new Capture;
  c->mode = mode;
  c->owner = std::this_thread::get_id();
  c->origin = s;
  c->id = gNextCapture++;
  captures().push_back(c);
  s->capture = c;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  TWIN_ENTER();
  if (pGraph == nullptr) return fail(cudaErrorInvalidValue);
  Stream* s = findStream(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> g(contextMutex());
  Capture* c = s->capture;
  if (c == nullptr) return fail(cudaErrorIllegalState);
  if (c->origin != s) return fail(cudaErrorStreamCaptureUnmatched);
  if (c->mode != cudaStreamCaptureModeRelaxed && c->owner != std::this_thread::get_id())
    return fail(cudaErrorStreamCaptureWrongThread);
  s->capture = nullptr;
  auto& v = captures();
  v.erase(std::find(v.begin(), v.end(), c));
  std::unique_ptr<Capture> done(c);
  *pGraph = nullptr;
  // "If the capture was invalidated, due to a violation of the rules of stream capture, then a
  // NULL graph will be returned."
  if (c->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  auto* gr = new Graph;
  gr->items = std::move(c->items);
  graphs().insert(gr);
  *pGraph = reinterpret_cast<cudaGraph_t>(gr);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* pCaptureStatus) {
  TWIN_ENTER();
  if (pCaptureStatus == nullptr) return fail(cudaErrorInvalidValue);
  Stream* s = findStream(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> g(contextMutex());
  if (s->capture == nullptr)
    *pCaptureStatus = cudaStreamCaptureStatusNone;
  else
    *pCaptureStatus = s->capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                              : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
                                 unsigned long long flags) {
  TWIN_ENTER();
  if (pGraphExec == nullptr) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> g(contextMutex());
  Graph* gr = findIn(graphs(), graph);
  if (gr == nullptr) return fail(cudaErrorInvalidValue);
  auto* ex =
      new Graph(*gr);  // an executable graph is a snapshot: later graph edits do not reach it
  execs().insert(ex);
  *pGraphExec = reinterpret_cast<cudaGraphExec_t>(ex);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  TWIN_ENTER();
  Stream* s = findStream(stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> g(contextMutex());
  Graph* ex = findIn(execs(), graphExec);
  if (ex == nullptr) return fail(cudaErrorInvalidValue);
  for (const ItemPtr& t : ex->items) {
    auto copy = std::make_shared<Item>(*t);  // a fresh item: its event records are its own
    const cudaError_t e = submitLocked(s, std::move(copy));
    if (e != cudaSuccess) return fail(e);
  }
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  TWIN_ENTER();
  std::lock_guard<std::mutex> g(contextMutex());
  Graph* ex = findIn(execs(), graphExec);
  if (ex == nullptr) return fail(cudaErrorInvalidValue);
  execs().erase(ex);
  delete ex;  // launched copies hold their own items
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  TWIN_ENTER();
  std::lock_guard<std::mutex> g(contextMutex());
  Graph* gr = findIn(graphs(), graph);
  if (gr == nullptr) return fail(cudaErrorInvalidValue);
  graphs().erase(gr);
  delete gr;
  return cudaSuccess;
}

}  // extern "C"
