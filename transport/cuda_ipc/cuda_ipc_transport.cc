// The CUDA IPC transport ("cuda_ipc"), for fuscoMemCuda communicators between ranks of one node.
//
// Control messages (the engine's header and verdict rounds) travel through an shm transport
// underneath, in host memory. Device memory is shared with CUDA IPC: every region a peer may write
// (fuscoMemAlloc memory, the communicator's scratch, fuscoCommRegister'ed buffers) is exported
// once into this rank's directory, a table in a small memfd page that local peers map; a token
// names (directory slot, offset), and a peer opens each slot's handle once and caches the mapping.
// The same page holds the completion flags (DeviceFlags) the CUDA path's streams wait on; it is
// registered with CUDA in every process that maps it, so streams read and write it directly.
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "core/blob.h"
#include "core/bootstrap.h"
#include "core/cuda_check.h"
#include "core/cuda_guard.h"
#include "core/log.h"
#include "core/result.h"
#include "transport/shm/shm_segment.h"
#include "transport/transport.h"

namespace fusco {

extern const TransportOps kShmTransport;

namespace {

constexpr uint64_t kPageMagic = 0x6673636f69706331ULL;  // "fscoipc1"
constexpr size_t kPage = 4096;
constexpr size_t kFlagStride = 64;       // one cache line per flag
constexpr uint32_t kMaxRegions = 16384;  // directory slots (never reused within a comm)
constexpr int kTokenShift = 44;          // token = slot << 44 | offset
constexpr uint64_t kOffsetMask = (1ull << kTokenShift) - 1;
constexpr size_t kIpcUnit = 2 << 20;
constexpr int kAckWords = 4;  // local ranks whose mappings a region records (256)

// What a rank publishes (after the shm transport's blob) so that peers can map its page.
struct IpcBlob {
  int32_t pid;
  int32_t fd;
  uint64_t bytes;
};

struct PageHeader {
  uint64_t magic;
  int32_t nranks;
  int32_t ownerRank;
  uint64_t flagsOffset;
  uint64_t dirOffset;
  uint64_t bytes;
};

// One exported region. bytes == 0: free (never written) or released.
struct DirEntry {
  cudaIpcMemHandle_t handle;
  std::atomic<uint64_t> bytes;      // 0 once the owner released the region
  std::atomic<uint64_t> published;  // 1 once handle and bytes are written
  // Bit l: the rank of local index l opened the region (written by that rank's process), so the
  // owner offers it in place to that rank only (ipcPeerMapped).
  std::atomic<uint64_t> mappedBy[kAckWords];
};

struct Page {
  ShmMapping map;
  void* flagsDev = nullptr;  // device address of the flags (registered), nullptr if not
  PageHeader* header() const { return reinterpret_cast<PageHeader*>(map.base); }
  uint8_t* flags() const { return map.base + header()->flagsOffset; }
  DirEntry* dir() const { return reinterpret_cast<DirEntry*>(map.base + header()->dirOffset); }
};

struct Region {
  uint32_t slot = 0;
  size_t bytes = 0;
  bool owned = false;     // allocated here (fuscoMemAlloc / scratch): freed on memFree
  int registrations = 0;  // fuscoCommRegister calls not yet deregistered
};

struct IpcPeer {
  bool mine = false;  // handed to this transport at setup: a rank of this node
  bool connected = false;
  PeerInfo info;
  Page page;
  std::map<uint32_t, void*> opened;  // slot -> mapping in this process, closed with the comm
  uint32_t scanned = 0;              // slots below this were looked at by mapRegions
};

struct IpcComm {
  int rank = 0, nranks = 0, device = 0;
  std::vector<int> localRank;  // [nranks] each rank's index on its node
  TransportComm* shm = nullptr;
  Page own;
  std::vector<IpcPeer> peers;
  // The regions and the directory: a CUDA comm's caller and its progress thread both use them.
  // Never held across a CUDA call that may wait for the device (cudaFree), whose streams may wait
  // for the progress thread.
  std::mutex mu;
  std::map<uintptr_t, Region> regions;  // base address -> region
  uint32_t nextSlot = 0;
  // Owned regions released by fuscoMemFree: peers may still map them (their mappings close with
  // their comms), so the memory is freed with this comm, never while a peer maps it.
  std::vector<void*> retired;
};

IpcComm* asIpc(TransportComm* tc) { return reinterpret_cast<IpcComm*>(tc); }

size_t flagsBytesFor(int nranks) {
  return (kDeviceFlagKinds * static_cast<size_t>(nranks) * kFlagStride + kPage - 1) / kPage * kPage;
}
size_t pageBytesFor(int nranks) {
  size_t dir = (kMaxRegions * sizeof(DirEntry) + kPage - 1) / kPage * kPage;
  return kPage + flagsBytesFor(nranks) + dir;
}

void unmapPage(Page* p) {
  if (p->flagsDev != nullptr) cudaHostUnregister(p->map.base + kPage);
  shmUnmap(&p->map);
  p->flagsDev = nullptr;
}

// Registers the flags of a mapped page with CUDA so streams can wait on them and write them.
fuscoResult_t registerFlags(Page* p, int nranks) {
  CudaSetupWindow w;  // init, on the caller's thread: once nothing of the process waits
  FUSCO_CHECK(w.open(paramTimeoutMs(), "registering the completion flags (cudaHostRegister)"));
  uint8_t* flags = p->map.base + kPage;
  const unsigned how = cudaHostRegisterMapped | cudaHostRegisterPortable;
  FUSCO_CUDACHECK(cudaHostRegister(flags, flagsBytesFor(nranks), how), kIpc);
  void* dev = nullptr;
  cudaError_t e = cudaHostGetDevicePointer(&dev, flags, 0);
  if (e != cudaSuccess) {
    cudaHostUnregister(flags);
    return FUSCO_CUDA_FAIL(e, kIpc, "cudaHostGetDevicePointer(completion flags)");
  }
  p->flagsDev = dev;
  return fuscoSuccess;
}

fuscoResult_t createPage(int rank, int nranks, Page* out) {
  Page p;
  FUSCO_CHECK(shmMemfdMap("fusco-ipc", pageBytesFor(nranks), &p.map));
  PageHeader* h = p.header();
  h->magic = kPageMagic;
  h->nranks = nranks;
  h->ownerRank = rank;
  h->flagsOffset = kPage;
  h->dirOffset = kPage + flagsBytesFor(nranks);
  h->bytes = p.map.bytes;
  fuscoResult_t r = registerFlags(&p, nranks);
  if (r != fuscoSuccess) {
    unmapPage(&p);
    return r;
  }
  *out = p;
  return fuscoSuccess;
}

fuscoResult_t openPeerPage(int peer, int nranks, int32_t pid, int32_t fd, uint64_t bytes,
                           Page* out) {
  if (bytes != pageBytesFor(nranks))
    return FUSCO_FAIL(fuscoRemoteError, kIpc,
                      "cuda_ipc: rank %d published a %llu-byte directory page", peer,
                      static_cast<unsigned long long>(bytes));
  Page p;
  FUSCO_CHECK(shmMapPeerFd(peer, pid, fd, bytes, &p.map));
  // Every offset used later (dir(), flags()) is read from the peer's page: check them all.
  const PageHeader* h = p.header();
  if (h->magic != kPageMagic || h->nranks != nranks || h->ownerRank != peer ||
      h->flagsOffset != kPage || h->dirOffset != kPage + flagsBytesFor(nranks) ||
      h->bytes != bytes) {
    unmapPage(&p);
    return FUSCO_FAIL(fuscoRemoteError, kIpc,
                      "cuda_ipc: the directory page of rank %d is not for this communicator", peer);
  }
  fuscoResult_t r = registerFlags(&p, nranks);
  if (r != fuscoSuccess) {
    unmapPage(&p);
    return r;
  }
  *out = p;
  return fuscoSuccess;
}

// Exports [base, base+bytes) (the start of a CUDA allocation) into a new directory slot, with
// `registrations` fuscoCommRegister calls counted already.
fuscoResult_t exportRegion(IpcComm* c, void* base, size_t bytes, bool owned, int registrations) {
  if (c->nextSlot >= kMaxRegions)
    return FUSCO_FAIL(fuscoSystemError, kIpc,
                      "cuda_ipc: more than %u regions exported by one communicator", kMaxRegions);
  cudaIpcMemHandle_t h;
  FUSCO_CUDACHECK(cudaIpcGetMemHandle(&h, base), kIpc);
  const uint32_t slot = c->nextSlot;
  try {  // the caller still owns base on failure (ipcMemAlloc frees it)
    c->regions[reinterpret_cast<uintptr_t>(base)] = Region{slot, bytes, owned, registrations};
  } catch (const std::bad_alloc&) {
    return FUSCO_FAIL(fuscoSystemError, kIpc, "cuda_ipc: out of host memory exporting %zu bytes",
                      bytes);
  }
  ++c->nextSlot;
  DirEntry& e = c->own.dir()[slot];  // published last: peers never see a slot this rank lost
  e.handle = h;
  e.bytes = bytes;
  e.published.store(1, std::memory_order_release);
  return fuscoSuccess;
}

// Peers see the slot released; their mappings of it stay until their comms close.
void unexport(IpcComm* c, std::map<uintptr_t, Region>::iterator it) {
  c->own.dir()[it->second.slot].bytes.store(0, std::memory_order_release);
  c->regions.erase(it);
}

int ipcScore(const TransportContext& ctx, int peer) {
  if (ctx.memType != fuscoMemCuda || ctx.peers == nullptr || peer == ctx.rank) return -1;
  if (peer < 0 || peer >= static_cast<int>(ctx.peers->size()) || ctx.rank < 0 ||
      ctx.rank >= static_cast<int>(ctx.peers->size()))
    return -1;
  if ((*ctx.peers)[peer].hostId != (*ctx.peers)[ctx.rank].hostId) return -1;
  if (ctx.nodes != nullptr && !ctx.nodes->sameNode(ctx.rank, peer)) return -1;
  return 10;
}

void ipcClose(TransportComm* tc);

fuscoResult_t ipcSetupInto(IpcComm* c, const TransportContext& ctx, const std::vector<int>& peers,
                           std::string* blob) {
  FUSCO_CUDACHECK(cudaGetDevice(&c->device), kIpc);
  c->rank = ctx.rank;
  c->nranks = ctx.nranks;
  c->peers.resize(ctx.nranks);
  c->localRank.resize(ctx.nranks);
  for (int r = 0; r < ctx.nranks; ++r) {
    c->peers[r].info = (*ctx.peers)[r];
    c->localRank[r] = ctx.nodes != nullptr ? ctx.nodes->localRankOf[r] : r;
  }
  for (int r : peers)
    if (r >= 0 && r < ctx.nranks) c->peers[r].mine = true;
  TransportContext hostCtx = ctx;
  hostCtx.memType = fuscoMemHost;
  std::string shmBlob;
  FUSCO_CHECK(kShmTransport.setup(hostCtx, peers, &c->shm, &shmBlob));
  FUSCO_CHECK(createPage(ctx.rank, ctx.nranks, &c->own));
  const IpcBlob me = {static_cast<int32_t>(getpid()), c->own.map.fd, c->own.map.bytes};
  blob->clear();
  appendBlob(blob, shmBlob);
  appendBlob(blob, std::string(reinterpret_cast<const char*>(&me), sizeof(me)));
  FUSCO_INFO(kIpc, "cuda_ipc: rank %d on device %d, %zu local peers", ctx.rank, c->device,
             peers.size());
  return fuscoSuccess;
}

fuscoResult_t ipcSetup(const TransportContext& ctx, const std::vector<int>& peers,
                       TransportComm** tc, std::string* blob) {
  *tc = nullptr;
  IpcComm* c = new (std::nothrow) IpcComm;
  if (c == nullptr) return FUSCO_FAIL(fuscoSystemError, kIpc, "cuda_ipc setup: out of memory");
  fuscoResult_t r;
  try {
    r = ipcSetupInto(c, ctx, peers, blob);
  } catch (const std::exception& e) {
    r = FUSCO_FAIL(fuscoSystemError, kIpc, "cuda_ipc setup: %s", e.what());
  }
  if (r != fuscoSuccess) {
    ipcClose(reinterpret_cast<TransportComm*>(c));  // frees whatever the setup got to
    return r;
  }
  *tc = reinterpret_cast<TransportComm*>(c);
  return fuscoSuccess;
}

fuscoResult_t ipcConnectInto(IpcComm* c, const std::vector<std::string>& blobs) {
  std::vector<std::string> shmBlobs(blobs.size());
  std::vector<IpcBlob> pages(blobs.size());
  std::vector<std::string> parts;
  for (size_t r = 0; r < blobs.size(); ++r) {
    if (blobs[r].empty()) continue;
    if (!splitBlobs(blobs[r], 0, 2, &parts) || parts[1].size() != sizeof(IpcBlob))
      return FUSCO_FAIL(fuscoRemoteError, kIpc, "cuda_ipc: rank %zu published a malformed blob", r);
    shmBlobs[r] = parts[0];
    memcpy(&pages[r], parts[1].data(), sizeof(IpcBlob));
  }
  FUSCO_CHECK(kShmTransport.connect(c->shm, shmBlobs));
  for (size_t r = 0; r < blobs.size(); ++r) {
    IpcPeer& p = c->peers[r];
    // Only this node's ranks: other nodes publish pages too (their own cuda_ipc), and local
    // indices repeat on every node, so mapping theirs would mark this rank's regions mapped by a
    // rank of another node (docs/DESIGN.md, "The third rule": class D).
    if (blobs[r].empty() || static_cast<int>(r) == c->rank || !p.mine || p.connected) continue;
    if (p.info.pid != 0 && pages[r].pid != p.info.pid)
      return FUSCO_FAIL(fuscoRemoteError, kIpc,
                        "cuda_ipc: rank %zu published a page of pid %d, not of its pid %d", r,
                        pages[r].pid, static_cast<int>(p.info.pid));
    const IpcBlob& b = pages[r];
    FUSCO_CHECK(openPeerPage(static_cast<int>(r), c->nranks, b.pid, b.fd, b.bytes, &p.page));
    p.connected = true;
  }
  return fuscoSuccess;
}

fuscoResult_t ipcConnect(TransportComm* tc, const std::vector<std::string>& blobs) {
  IpcComm* c = asIpc(tc);
  if (c == nullptr || static_cast<int>(blobs.size()) != c->nranks)
    return FUSCO_FAIL(fuscoInternalError, kIpc, "cuda_ipc connect: %zu blobs for %d ranks",
                      blobs.size(), c ? c->nranks : -1);
  try {
    return ipcConnectInto(c, blobs);
  } catch (const std::exception& e) {
    return FUSCO_FAIL(fuscoSystemError, kIpc, "cuda_ipc connect: %s", e.what());
  }
}

fuscoResult_t ipcSendAcquire(TransportComm* tc, int peer, void** buf, size_t* cap) {
  return kShmTransport.sendAcquire(asIpc(tc)->shm, peer, buf, cap);
}
fuscoResult_t ipcSendPost(TransportComm* tc, int peer, uint32_t tag, size_t len) {
  return kShmTransport.sendPost(asIpc(tc)->shm, peer, tag, len);
}
fuscoResult_t ipcRecvPoll(TransportComm* tc, int peer, const void** buf, size_t* len,
                          uint32_t* tag) {
  return kShmTransport.recvPoll(asIpc(tc)->shm, peer, buf, len, tag);
}
fuscoResult_t ipcRecvRelease(TransportComm* tc, int peer) {
  return kShmTransport.recvRelease(asIpc(tc)->shm, peer);
}

fuscoResult_t ipcMemAlloc(TransportComm* tc, size_t bytes, void** ptr) {
  IpcComm* c = asIpc(tc);
  void* p = nullptr;
  // Whole 2 MiB units: the runtime packs smaller allocations into shared units, and a peer cannot
  // open two IPC handles of one unit ("resource already mapped").
  bytes = (bytes + kIpcUnit - 1) / kIpcUnit * kIpcUnit;
  FUSCO_CHECK(cudaGuardSetup("cudaMalloc (cuda_ipc)"));
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return FUSCO_FAIL(fuscoSystemError, kIpc, "cuda_ipc: cudaMalloc of %zu bytes failed: %s", bytes,
                      cudaGetErrorString(e));
  }
  fuscoResult_t r;
  {
    std::lock_guard<std::mutex> g(c->mu);
    r = exportRegion(c, p, bytes, true, 0);
  }
  if (r != fuscoSuccess) {
    cudaFree(p);
    return r;
  }
  *ptr = p;
  return fuscoSuccess;
}

// Unexported at once; the memory itself is freed with the comm (IpcComm::retired): CUDA leaves
// freeing memory that another process still maps undefined, and a peer's mapping closes only
// where nothing can wait for the device.
fuscoResult_t ipcMemFree(TransportComm* tc, void* ptr) {
  IpcComm* c = asIpc(tc);
  std::lock_guard<std::mutex> g(c->mu);
  auto it = c->regions.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == c->regions.end() || !it->second.owned)
    return FUSCO_FAIL(fuscoInvalidArgument, kIpc,
                      "cuda_ipc: %p is not device memory of this communicator", ptr);
  c->retired.push_back(ptr);
  unexport(c, it);
  return fuscoSuccess;
}

// base is the start of a CUDA allocation (the communicator resolves it). A fuscoMemAlloc region is
// exported already; a caller's allocation is exported on its first registration and released
// with its last.
fuscoResult_t ipcMemRegister(TransportComm* tc, void* base, size_t bytes) {
  IpcComm* c = asIpc(tc);
  std::lock_guard<std::mutex> g(c->mu);
  auto it = c->regions.find(reinterpret_cast<uintptr_t>(base));
  if (it != c->regions.end()) {
    ++it->second.registrations;
    return fuscoSuccess;
  }
  return exportRegion(c, base, bytes, false, 1);
}

fuscoResult_t ipcMemDeregister(TransportComm* tc, void* base) {
  IpcComm* c = asIpc(tc);
  std::lock_guard<std::mutex> g(c->mu);
  auto it = c->regions.find(reinterpret_cast<uintptr_t>(base));
  if (it == c->regions.end() || it->second.registrations == 0)
    return FUSCO_FAIL(fuscoInternalError, kIpc, "cuda_ipc: %p is not a registered allocation",
                      base);
  if (--it->second.registrations == 0 && !it->second.owned) unexport(c, it);
  return fuscoSuccess;
}

bool ipcRegionToken(TransportComm* tc, const void* ptr, size_t bytes, uint64_t* token) {
  IpcComm* c = asIpc(tc);
  if (c == nullptr) return false;
  std::lock_guard<std::mutex> g(c->mu);
  if (c->regions.empty()) return false;
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto it = c->regions.upper_bound(p);
  if (it == c->regions.begin()) return false;
  --it;
  uint64_t off = p - it->first;
  if (off > it->second.bytes || bytes > it->second.bytes - off || off > kOffsetMask) return false;
  *token = (static_cast<uint64_t>(it->second.slot) << kTokenShift) | off;
  return true;
}

// A region its owner unexported (deregistered, then maybe freed): opening it may fail, and nothing
// of it is read any more.
bool released(const IpcPeer& p, uint32_t slot) {
  return p.page.dir()[slot].bytes.load(std::memory_order_acquire) == 0;
}

// Opens slot `slot` of peer p (setup face: a CUDA IPC open may wait for the device) and records
// the mapping in the peer's directory.
void* openSlot(const IpcComm* c, IpcPeer& p, int peer, uint32_t slot) {
  if (cudaGuardSetup("cudaIpcOpenMemHandle (a peer's buffer)") != fuscoSuccess) return nullptr;
  void* m = nullptr;
  cudaError_t err =
      cudaIpcOpenMemHandle(&m, p.page.dir()[slot].handle, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (released(p, slot)) return nullptr;  // its owner released it while this rank looked
    FUSCO_WARN(kIpc, "cuda_ipc: cannot open region %u of rank %d: %s", slot, peer,
               cudaGetErrorString(err));
    return nullptr;
  }
  try {
    p.opened.emplace(slot, m);
  } catch (const std::bad_alloc&) {  // out of host memory: close the mapping again
    cudaIpcCloseMemHandle(m);
    FUSCO_WARN(kIpc, "cuda_ipc: out of host memory opening region %u of rank %d", slot, peer);
    return nullptr;
  }
  const int me = c->localRank[c->rank];
  if (me < 64 * kAckWords)
    p.page.dir()[slot].mappedBy[me / 64].fetch_or(1ull << (me % 64), std::memory_order_release);
  return m;
}

bool ipcPeerMapped(TransportComm* tc, int peer, uint64_t token) {
  IpcComm* c = asIpc(tc);
  const uint32_t slot = static_cast<uint32_t>(token >> kTokenShift);
  if (c == nullptr || peer < 0 || peer >= c->nranks || slot >= kMaxRegions) return false;
  const int l = c->localRank[peer];
  if (l >= 64 * kAckWords) return false;
  return (c->own.dir()[slot].mappedBy[l / 64].load(std::memory_order_acquire) >> (l % 64)) & 1;
}

// Slots are published in order and never reused: what a peer published since the last look
// starts at `scanned`.
bool ipcRegionsToMap(TransportComm* tc) {
  IpcComm* c = asIpc(tc);
  if (c == nullptr) return false;
  for (const IpcPeer& p : c->peers)
    if (p.connected && p.scanned < kMaxRegions &&
        p.page.dir()[p.scanned].published.load(std::memory_order_acquire) != 0)
      return true;
  return false;
}

fuscoResult_t ipcMapRegions(TransportComm* tc) {
  IpcComm* c = asIpc(tc);
  for (int r = 0; r < c->nranks; ++r) {
    IpcPeer& p = c->peers[r];
    if (!p.connected) continue;
    for (; p.scanned < kMaxRegions; ++p.scanned) {
      const DirEntry& e = p.page.dir()[p.scanned];
      if (e.published.load(std::memory_order_acquire) == 0) break;
      if (e.bytes == 0 || p.opened.count(p.scanned) != 0) continue;  // released already
      if (openSlot(c, p, r, p.scanned) == nullptr && !released(p, p.scanned))
        return FUSCO_FAIL(fuscoUnhandledCudaError, kIpc,
                          "cuda_ipc: cannot map region %u of rank %d: %s", p.scanned, r,
                          threadLastError().c_str());
    }
  }
  return fuscoSuccess;
}

// The progress thread's view: a region is normally opened by ipcMapRegions before the operation
// that uses it; opening it here is a setup call inside an operation, which the guard refuses.
void* ipcPeerPointer(TransportComm* tc, int peer, uint64_t token, size_t bytes) {
  IpcComm* c = asIpc(tc);
  if (c == nullptr || peer < 0 || peer >= c->nranks || !c->peers[peer].connected) return nullptr;
  IpcPeer& p = c->peers[peer];
  const uint32_t slot = static_cast<uint32_t>(token >> kTokenShift);
  const uint64_t off = token & kOffsetMask;
  if (slot >= kMaxRegions) return nullptr;
  const DirEntry& e = p.page.dir()[slot];
  if (e.published.load(std::memory_order_acquire) == 0 || off > e.bytes || bytes > e.bytes - off)
    return nullptr;
  auto it = p.opened.find(slot);
  void* m = it != p.opened.end() ? it->second : openSlot(c, p, peer, slot);
  return m == nullptr ? nullptr : static_cast<char*>(m) + off;
}

fuscoResult_t ipcDeviceFlags(TransportComm* tc, int peer, DeviceFlags* out) {
  IpcComm* c = asIpc(tc);
  if (c == nullptr || peer < 0 || peer >= c->nranks || !c->peers[peer].connected)
    return FUSCO_FAIL(fuscoInternalError, kIpc, "cuda_ipc: rank %d is not connected", peer);
  const Page& peerPage = c->peers[peer].page;
  for (int kind = 0; kind < kDeviceFlagKinds; ++kind) {
    size_t mine = (static_cast<size_t>(kind) * c->nranks + peer) * kFlagStride;
    size_t theirs = (static_cast<size_t>(kind) * c->nranks + c->rank) * kFlagStride;
    out->hostWait[kind] = reinterpret_cast<volatile uint32_t*>(c->own.flags() + mine);
    out->devWait[kind] = static_cast<char*>(c->own.flagsDev) + mine;
    out->devPost[kind] = static_cast<char*>(peerPage.flagsDev) + theirs;
  }
  return fuscoSuccess;
}

fuscoResult_t ipcCheckPeer(TransportComm* tc, int peer) {
  return kShmTransport.checkPeer(asIpc(tc)->shm, peer);
}
void ipcMarkAborted(TransportComm* tc, const char* reason) {
  if (tc != nullptr) kShmTransport.markAborted(asIpc(tc)->shm, reason);
}

void ipcClose(TransportComm* tc) {
  IpcComm* c = asIpc(tc);
  if (c == nullptr) return;
  for (IpcPeer& p : c->peers) {
    for (auto& [slot, m] : p.opened) cudaIpcCloseMemHandle(m);
    unmapPage(&p.page);
  }
  for (auto& [base, reg] : c->regions)
    if (reg.owned) cudaFree(reinterpret_cast<void*>(base));
  for (void* p : c->retired) cudaFree(p);
  unmapPage(&c->own);
  kShmTransport.close(c->shm);
  cudaGetLastError();  // a peer that died may leave errors behind; they are not this comm's
  delete c;
}

}  // namespace

extern const TransportOps kCudaIpcTransport;
const TransportOps kCudaIpcTransport = {
    "cuda_ipc",        // name
    ipcScore,          // score
    ipcSetup,          // setup
    ipcConnect,        // connect
    ipcSendAcquire,    // sendAcquire
    ipcSendPost,       // sendPost
    ipcRecvPoll,       // recvPoll
    ipcRecvRelease,    // recvRelease
    ipcMemAlloc,       // memAlloc
    ipcMemFree,        // memFree
    ipcRegionToken,    // regionToken
    ipcPeerPointer,    // peerPointer
    ipcMemRegister,    // memRegister
    ipcMemDeregister,  // memDeregister
    ipcDeviceFlags,    // deviceFlags
    ipcCheckPeer,      // checkPeer
    ipcMarkAborted,    // markAborted
    ipcClose,          // close
    nullptr,           // progress
    nullptr,           // sendsInFlight (a post is complete once copied)
    ipcRegionsToMap,   // regionsToMap
    ipcMapRegions,     // mapRegions
    ipcPeerMapped,     // peerMapped
};

}  // namespace fusco
