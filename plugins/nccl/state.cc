// The shim's process state: which mode is active, the real NCCL behind it, the logger, errors and
// the communicator records.
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <map>

#include "shim.h"

namespace fnccl {
namespace {

int parseLevel(const char* v) {
  if (v == nullptr || *v == '\0') return 1;
  if (strcasecmp(v, "NONE") == 0) return 0;
  if (strcasecmp(v, "INFO") == 0) return 2;
  if (strcasecmp(v, "TRACE") == 0) return 3;
  return 1;
}

void loadReal(void* handle, RealNccl* r) {
#define FUSCO_NCCL_LOOKUP(ret, name, params, args) \
  r->name = reinterpret_cast<ret(*) params>(dlsym(handle, "nccl" #name));
  FUSCO_NCCL_FUNCS(FUSCO_NCCL_LOOKUP)
#undef FUSCO_NCCL_LOOKUP
}

// Whether a library handle is this shim or a copy of it: the real NCCL does not depend on fusco.
bool isShim(void* handle) {
  void* own = reinterpret_cast<void*>(&ncclGetVersion);
  return dlsym(handle, "ncclGetVersion") == own || dlsym(handle, "fuscoGetVersion") != nullptr;
}

// FUSCO_NCCL_LIBRARY: load the named library in a scope of its own (RTLD_LOCAL) that prefers its
// own symbols (RTLD_DEEPBIND), so none of its calls resolve into the shim.
void openNamed(Global* g, const char* path) {
  g->realPath = path;
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (h == nullptr) {
    g->mode = Mode::Broken;
    g->brokenWhy = std::string("FUSCO_NCCL_LIBRARY=") + path + " cannot be loaded: " + dlerror();
    return;
  }
  if (isShim(h)) {
    g->mode = Mode::Broken;
    g->brokenWhy = std::string("FUSCO_NCCL_LIBRARY=") + path +
                   " is libfusco_nccl itself, not a real NCCL: refusing to forward to itself";
    return;
  }
  loadReal(h, &g->real);
  g->mode = Mode::Interposer;
}

void decide(Global* g) {
  g->logLevel = parseLevel(getenv("FUSCO_DEBUG"));
  const char* mem = getenv("FUSCO_NCCL_MEM");
  g->memType = (mem != nullptr && strcasecmp(mem, "host") == 0) ? fuscoMemHost : fuscoMemCuda;
  // Like every knob: a value it does not know is warned about and replaced by the default.
  if (mem != nullptr && *mem != '\0' && strcasecmp(mem, "host") != 0 &&
      strcasecmp(mem, "device") != 0)
    logAt(1, "FUSCO_NCCL_MEM=%s is not host or device: using device (the default)", mem);
  const char* mode = getenv("FUSCO_NCCL_MODE");
  if (mode != nullptr && strcasecmp(mode, "standalone") == 0) return;
  const char* path = getenv("FUSCO_NCCL_LIBRARY");
  if (path != nullptr && *path != '\0') return openNamed(g, path);
  // LD_PRELOAD: the real NCCL comes after the shim in the global scope.
  void* next = dlsym(RTLD_NEXT, "ncclGetVersion");
  if (next != nullptr && next != reinterpret_cast<void*>(&ncclGetVersion)) {
    Dl_info info;
    g->realPath = dladdr(next, &info) && info.dli_fname ? info.dli_fname : "(RTLD_NEXT)";
    loadReal(RTLD_NEXT, &g->real);
    g->mode = Mode::Interposer;
    return;
  }
  if (mode != nullptr && strcasecmp(mode, "interpose") == 0) {
    g->mode = Mode::Broken;
    g->brokenWhy =
        "FUSCO_NCCL_MODE=interpose but no real NCCL is loaded after the shim: set "
        "FUSCO_NCCL_LIBRARY to the real libnccl.so.2";
  }
}

thread_local std::string tLastError;
std::mutex gSideMu;
std::map<ncclComm_t, Comm*>* gSide = nullptr;
// The live standalone handles. Never destroyed: a handle may be used at process exit.
std::mutex gLiveMu;
std::map<ncclComm_t, CommRef>* gLive = new std::map<ncclComm_t, CommRef>();

}  // namespace

const Global& global() {
  static Global g;
  static std::once_flag once;
  std::call_once(once, [] {
    decide(&g);
    if (g.mode == Mode::Interposer)
      FNCCL_INFO(
          "interposer mode over %s: fusco serves ncclAlltoAll and all-to-all-shaped "
          "send/recv groups, everything else goes to the real NCCL",
          g.realPath.c_str());
    else if (g.mode == Mode::Broken)
      FNCCL_WARN("%s", g.brokenWhy.c_str());
  });
  return g;
}

void logAt(int level, const char* fmt, ...) {
  static const int kLevel = parseLevel(getenv("FUSCO_DEBUG"));
  if (level > kLevel) return;
  char host[64] = "?";
  gethostname(host, sizeof(host) - 1);
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s:%d:%ld FUSCO NCCL %s %s\n", host, static_cast<int>(getpid()),
          static_cast<long>(syscall(SYS_gettid)), level <= 1 ? "WARN" : "INFO", msg);
}

ncclResult_t fail(Comm* c, ncclResult_t r, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  tLastError = msg;
  if (c != nullptr) {
    std::lock_guard<std::mutex> lock(c->mu);
    c->lastError = msg;
  }
  return r;
}

ncclResult_t fromFusco(Comm* c, fuscoResult_t r, const char* call) {
  if (r == fuscoSuccess) return ncclSuccess;
  ncclResult_t n = r == fuscoTimeout ? ncclRemoteError : static_cast<ncclResult_t>(r);
  fail(c, n, "%s: %s", call, fuscoGetLastError(c != nullptr ? c->fc : nullptr));
  if (c != nullptr && n == ncclRemoteError) c->asyncError = ncclRemoteError;
  return n;
}

const char* threadLastError() { return tLastError.c_str(); }
void clearThreadLastError() { tLastError.clear(); }

ncclComm_t registerComm(CommRef c) {
  // 16-byte steps from a base no allocation uses (the handle is opaque and never dereferenced).
  static std::atomic<uintptr_t> next{0};
  const uintptr_t serial = ++next;
  ncclComm_t h = reinterpret_cast<ncclComm_t>(uintptr_t{0xf5c0} << 32 | serial << 4);
  c->handle = h;
  std::lock_guard<std::mutex> lock(gLiveMu);
  (*gLive)[h] = std::move(c);
  return h;
}

CommRef liveComm(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(gLiveMu);
  auto it = gLive->find(comm);
  return it != gLive->end() ? it->second : nullptr;
}

CommRef unregisterComm(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(gLiveMu);
  auto it = gLive->find(comm);
  if (it == gLive->end()) return nullptr;
  CommRef c = std::move(it->second);
  gLive->erase(it);
  return c;
}

ncclResult_t checkComm(ncclComm_t comm, const char* call, CommRef* out) {
  if (comm == nullptr) return fail(nullptr, ncclInvalidArgument, "%s: comm is NULL", call);
  *out = liveComm(comm);
  if (*out == nullptr)
    return fail(nullptr, ncclInvalidArgument,
                "%s: comm %p is not a live communicator (destroyed or aborted already, or never "
                "made)",
                call, static_cast<void*>(comm));
  return ncclSuccess;
}

Comm* sideRecord(ncclComm_t real, bool create) {
  std::lock_guard<std::mutex> lock(gSideMu);
  if (gSide == nullptr) gSide = new std::map<ncclComm_t, Comm*>();
  auto it = gSide->find(real);
  if (it != gSide->end()) return it->second;
  if (!create) return nullptr;
  Comm* c = new Comm();
  c->real = real;
  (*gSide)[real] = c;
  return c;
}

void dropSideRecord(ncclComm_t real) {
  Comm* c = nullptr;
  {
    std::lock_guard<std::mutex> lock(gSideMu);
    if (gSide == nullptr) return;
    auto it = gSide->find(real);
    if (it == gSide->end()) return;
    c = it->second;
    gSide->erase(it);
  }
  if (c->fc != nullptr) fuscoCommDestroy(c->fc);
  delete c;
}

void logServed(Comm* c) {
  if (c->logged) return;
  c->logged = true;
  const Global& g = global();
  const char* mem = c->memType == fuscoMemHost ? "host memory" : "device memory";
  if (g.mode == Mode::Interposer)
    FNCCL_INFO(
        "comm %p rank %d/%d: interposer mode over %s (%s); fusco serves ncclAlltoAll and "
        "send/recv groups that reach every peer; every other call goes to the real NCCL",
        static_cast<void*>(c->real), c->rank, c->nranks, g.realPath.c_str(), mem);
  else
    FNCCL_INFO(
        "comm %p rank %d/%d: standalone mode (%s); fusco serves ncclAlltoAll, "
        "ncclSend/ncclRecv (grouped or not), ncclMemAlloc/ncclCommRegister and comm "
        "init/split/finalize/abort/destroy; other collectives return ncclInvalidUsage",
        static_cast<void*>(c->handle), c->rank, c->nranks, mem);
}

// toFusco and fromFusco cast: fusco.h numbers its datatypes and results as nccl.h does.
static_assert(ncclInt8 == static_cast<int>(fuscoInt8) &&
                  ncclUint8 == static_cast<int>(fuscoUint8) &&
                  ncclInt32 == static_cast<int>(fuscoInt32) &&
                  ncclUint32 == static_cast<int>(fuscoUint32) &&
                  ncclInt64 == static_cast<int>(fuscoInt64) &&
                  ncclUint64 == static_cast<int>(fuscoUint64) &&
                  ncclFloat16 == static_cast<int>(fuscoFloat16) &&
                  ncclFloat32 == static_cast<int>(fuscoFloat32) &&
                  ncclFloat64 == static_cast<int>(fuscoFloat64) &&
                  ncclBfloat16 == static_cast<int>(fuscoBfloat16) &&
                  ncclFloat8e4m3 == static_cast<int>(fuscoFloat8e4m3) &&
                  ncclFloat8e5m2 == static_cast<int>(fuscoFloat8e5m2) &&
                  ncclNumTypes == static_cast<int>(fuscoNumTypes),
              "fusco.h's datatypes are nccl.h's");
static_assert(ncclSuccess == static_cast<int>(fuscoSuccess) &&
                  ncclUnhandledCudaError == static_cast<int>(fuscoUnhandledCudaError) &&
                  ncclSystemError == static_cast<int>(fuscoSystemError) &&
                  ncclInternalError == static_cast<int>(fuscoInternalError) &&
                  ncclInvalidArgument == static_cast<int>(fuscoInvalidArgument) &&
                  ncclInvalidUsage == static_cast<int>(fuscoInvalidUsage) &&
                  ncclRemoteError == static_cast<int>(fuscoRemoteError) &&
                  ncclInProgress == static_cast<int>(fuscoInProgress),
              "fusco.h's results are nccl.h's (fuscoTimeout is mapped to ncclRemoteError)");

fuscoDataType_t toFusco(ncclDataType_t t) { return static_cast<fuscoDataType_t>(t); }
fuscoMemType_t commMemType() { return global().memType; }

fuscoConfig_t fuscoConfigFor(fuscoMemType_t mem, int device) {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.memType = mem;
  cfg.cudaDevice = device;
  return cfg;
}

GroupState& group() {
  thread_local GroupState g;
  return g;
}

ncclResult_t noteGroupError(ncclResult_t r) {
  GroupState& g = group();
  if (r == ncclSuccess || g.depth == 0 || g.sticky != ncclSuccess) return r;
  g.sticky = r;
  g.stickyMsg = tLastError;
  return r;
}

}  // namespace fnccl

namespace fnccl {
namespace {
thread_local int tInReal = 0;
}
bool inReal() { return tInReal > 0; }
RealScope::RealScope() { ++tInReal; }
RealScope::~RealScope() { --tInReal; }

ncclResult_t brokenCall(const char* call) {
  return fail(nullptr, ncclInvalidUsage, "%s: %s", call, global().brokenWhy.c_str());
}

ncclResult_t missingReal(const char* call) {
  return fail(nullptr, ncclInvalidUsage, "%s: the real NCCL (%s) does not export it", call,
              global().realPath.c_str());
}
}  // namespace fnccl
