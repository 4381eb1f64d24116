// A communicator's memory (communicator.h): peer-writable allocations, registrations, scratch and
// the buffers of captured operations, and the CUDA setup calls they need. On an enqueue-only comm
// every such call runs where nothing can be waiting (docs/DESIGN.md, "The CUDA rules"): in a setup
// window on the caller's thread; on the progress thread the guard refuses it.
#include <algorithm>
#include <cstdlib>

#include "core/cuda_guard.h"
#include "core/log.h"
#include "core/result.h"
#include "device/cuda_rt.h"
#include "device/kernel_load.h"
#include "engine/communicator.h"

namespace fusco {

fuscoResult_t Communicator::setupWindow(CudaSetupWindow* w, const char* what) {
  if (!exec_.progress() || exec_.progress()->onThread())
    return fuscoSuccess;  // there the guard decides
  return w->open(timeoutMs(), what);
}

fuscoResult_t Communicator::guardSetup(const char* what) const {
  return exec_.progress() ? cudaGuardSetup(what) : fuscoSuccess;
}

// Every kernel loaded before anything of this process can wait (kernel_load.h).
fuscoResult_t Communicator::loadKernels() {
  CudaSetupWindow w;
  FUSCO_CHECK(w.open(timeoutMs(), "loading the library's kernels"));
  return deviceLoadKernels(device_);
}

// The queue's and the bridge's pinned memory: local setup calls, no exchange with the peers.
fuscoResult_t Communicator::startStreams() {
  CudaSetupWindow w;
  FUSCO_CHECK(w.open(timeoutMs(), "making a communicator's stream queue and network bridge"));
  FUSCO_CHECK(startBridge());
  return startAsync();
}

fuscoResult_t Communicator::mapPeerRegions() {
  bool any = false;
  for (auto& t : transports_)
    any = any || (t.first->regionsToMap != nullptr && t.first->regionsToMap(t.second));
  if (!any) return fuscoSuccess;
  CudaSetupWindow w;
  FUSCO_CHECK(setupWindow(&w, "mapping the peers' new buffers"));
  // A captured call maps here too: opening a peer's buffer is no stream work, so the caller's
  // capture neither records nor forbids it.
  CudaRelaxedCapture relaxed;
  for (auto& t : transports_)
    if (t.first->mapRegions != nullptr) FUSCO_CHECK(t.first->mapRegions(t.second));
  return fuscoSuccess;
}

fuscoResult_t Communicator::scratchOn(int slot, size_t bytes, void* stream, char** ptr) {
  bool capturing = false;
  if (memType() == fuscoMemCuda) FUSCO_CHECK(cudaStreamCapturing(stream, &capturing));
  return capturing ? graphBuffer(bytes, ptr) : scratch(slot, bytes, ptr);
}

fuscoResult_t Communicator::graphBuffer(size_t bytes, char** ptr) {
  CudaSetupWindow w;  // before memMu_: a window waits for the progress thread, which takes it
  FUSCO_CHECK(setupWindow(&w, "a captured call's buffer"));
  std::lock_guard<std::recursive_mutex> g(memMu_);
  CudaRelaxedCapture relaxed;  // the caller's stream may be capturing
  void* p = nullptr;
  FUSCO_CHECK(memAlloc(std::max<size_t>(bytes, 1), &p));
  graphBuffers_.push_back(p);
  *ptr = static_cast<char*>(p);
  return fuscoSuccess;
}

fuscoResult_t Communicator::scratch(int slot, size_t bytes, char** ptr) {
  std::unique_lock<std::recursive_mutex> g(memMu_);
  auto& sc = scratch_[slot];
  CudaSetupWindow w;
  if ((sc.second < bytes || sc.first == nullptr) && exec_.progress() &&
      !exec_.progress()->onThread()) {
    // Growing allocates: a setup window first, then memMu_ again (lock order: window, memMu_).
    g.unlock();
    FUSCO_CHECK(setupWindow(&w, "growing the communicator's scratch"));
    g.lock();
  }
  if (sc.second < bytes || sc.first == nullptr) {
    // On a CUDA comm enqueued work may still use the old buffer, and freeing device memory waits
    // for the device, whose streams may wait for this comm's progress thread: it is kept until
    // the comm goes.
    if (sc.first != nullptr && exec_.progress()) retiredScratch_.push_back(sc.first);
    if (sc.first != nullptr && !exec_.progress()) FUSCO_CHECK(memFree(sc.first));
    sc = {nullptr, 0};
    size_t grow = std::max(bytes, bytes + bytes / 4);  // headroom for the next, larger call
    void* p = nullptr;
    FUSCO_CHECK(memAlloc(grow, &p));
    sc = {p, grow};
  }
  *ptr = static_cast<char*>(sc.first);
  return fuscoSuccess;
}

fuscoResult_t Communicator::useDevice() const {
  return device_ < 0 ? fuscoSuccess : cudaSetCurrent(device_);
}

// A transport exports whole CUDA allocations (what IPC shares), so it is given the allocation that
// holds [ptr, ptr + bytes).
fuscoResult_t Communicator::memRegister(void* ptr, size_t bytes) {
  if (device_ < 0) return fuscoSuccess;
  CudaSetupWindow w;
  FUSCO_CHECK(setupWindow(&w, "fuscoCommRegister"));
  FUSCO_CHECK(guardSetup("fuscoCommRegister"));
  FUSCO_CHECK(useDevice());
  void* base = nullptr;
  size_t size = 0;
  if (!cudaIsDevicePointer(ptr) || cudaAllocationRange(ptr, &base, &size) != fuscoSuccess)
    return FUSCO_FAIL(fuscoInvalidArgument, kApi, "fuscoCommRegister: %p is not CUDA device memory",
                      ptr);
  if (static_cast<char*>(ptr) + bytes > static_cast<char*>(base) + size)
    return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                      "fuscoCommRegister: [%p, +%zu) runs past its CUDA allocation", ptr, bytes);
  for (auto& t : transports_)
    if (t.first->memRegister) FUSCO_CHECK(t.first->memRegister(t.second, base, size));
  return fuscoSuccess;
}

fuscoResult_t Communicator::memDeregister(void* ptr) {
  if (device_ < 0) return fuscoSuccess;
  CudaSetupWindow w;
  FUSCO_CHECK(setupWindow(&w, "fuscoCommDeregister"));
  FUSCO_CHECK(guardSetup("fuscoCommDeregister"));
  FUSCO_CHECK(useDevice());
  void* base = nullptr;
  size_t size = 0;
  FUSCO_CHECK(cudaAllocationRange(ptr, &base, &size));
  for (auto& t : transports_)
    if (t.first->memDeregister) FUSCO_CHECK(t.first->memDeregister(t.second, base));
  return fuscoSuccess;
}

fuscoResult_t Communicator::memAlloc(size_t bytes, void** ptr) {
  CudaSetupWindow w;
  FUSCO_CHECK(setupWindow(&w, "allocating memory peers can write"));
  FUSCO_CHECK(guardSetup("allocating memory peers can write (cudaMalloc)"));
  std::lock_guard<std::recursive_mutex> g(memMu_);
  FUSCO_CHECK(useDevice());  // device memory of a CUDA comm lands on the comm's device
  for (auto& t : transports_)
    if (t.first->memAlloc) return t.first->memAlloc(t.second, bytes, ptr);
  if (device_ >= 0) {
    FUSCO_CHECK(cudaAllocDevice(bytes, ptr));
    deviceAllocs_[*ptr] = bytes;
    return fuscoSuccess;
  }
  // No peer can map memory of this rank (a single rank, or only remote peers): plain memory.
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes ? bytes : 1) != 0)
    return FUSCO_FAIL(fuscoSystemError, kApi, "out of memory allocating %zu bytes", bytes);
  plainAllocs_[p] = bytes;
  *ptr = p;
  return fuscoSuccess;
}

fuscoResult_t Communicator::memFree(void* ptr) {
  CudaSetupWindow w;
  FUSCO_CHECK(setupWindow(&w, "freeing memory peers can write"));
  FUSCO_CHECK(guardSetup("freeing memory peers can write (cudaFree)"));
  {
    std::lock_guard<std::recursive_mutex> g(memMu_);
    auto dit = deviceAllocs_.find(ptr);
    if (dit != deviceAllocs_.end()) {
      deviceAllocs_.erase(dit);
      return cudaFreeDevice(ptr);  // a one-rank comm: no peer, no progress thread waits on it
    }
    auto it = plainAllocs_.find(ptr);
    if (it != plainAllocs_.end()) {
      free(ptr);
      plainAllocs_.erase(it);
      return fuscoSuccess;
    }
  }
  // Not under memMu_: freeing device memory waits for the device, whose streams may wait for the
  // progress thread, which takes memMu_ (the transports lock their own state).
  for (auto& t : transports_)
    if (t.first->memFree) return t.first->memFree(t.second, ptr);
  return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                    "fuscoMemFree: %p was not allocated by fuscoMemAlloc on this comm", ptr);
}

bool Communicator::offerToken(int peer, const void* ptr, size_t bytes, uint64_t* token) const {
  if (!regionToken(peer, ptr, bytes, token)) return false;
  const PeerConn& c = conns_[peer];
  return c.ops->peerMapped == nullptr || c.ops->peerMapped(c.tc, peer, *token);
}

bool Communicator::regionToken(int peer, const void* ptr, size_t bytes, uint64_t* token) const {
  const PeerConn& c = conns_[peer];
  if (c.ops == nullptr || c.ops->regionToken == nullptr) return false;
  return c.ops->regionToken(c.tc, ptr, bytes, token);
}

}  // namespace fusco
