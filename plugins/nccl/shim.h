// libfusco_nccl internals: NCCL's C ABI served by fusco (standalone) or forwarded to a real NCCL
// with fusco serving the all-to-all-shaped work (interposer). Only fusco's public API is used.
// README.md, "Use it in place of NCCL", describes the modes and the environment.
#ifndef FUSCO_NCCL_SHIM_H_
#define FUSCO_NCCL_SHIM_H_

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fusco.h"
#include "nccl_abi.h"

namespace fnccl {

enum class Mode { Standalone, Interposer, Broken };

// The real NCCL's entry points (interposer mode), looked up once from the library dlopen()ed in
// a scope of its own, so its calls never resolve back into the shim.
struct RealNccl {
#define FUSCO_NCCL_POINTER(ret, name, params, args) ret(*name) params = nullptr;
  FUSCO_NCCL_FUNCS(FUSCO_NCCL_POINTER)
#undef FUSCO_NCCL_POINTER
};

struct Global {
  Mode mode = Mode::Standalone;
  RealNccl real;
  std::string realPath;    // where the real library came from (for messages and logs)
  std::string brokenWhy;   // Mode::Broken: why no call can be served
  fuscoMemType_t memType;  // FUSCO_NCCL_MEM
  int logLevel = 1;        // 0 NONE, 1 WARN, 2 INFO, 3 TRACE (FUSCO_DEBUG)
};
// Decides the mode on first use (thread-safe) and returns it.
const Global& global();

// The shim's own logger, honouring FUSCO_DEBUG like the library does.
void logAt(int level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
#define FNCCL_WARN(...) ::fnccl::logAt(1, __VA_ARGS__)
#define FNCCL_INFO(...) ::fnccl::logAt(2, __VA_ARGS__)

// A communicator the shim knows. Standalone: the ncclComm_t handed out points to it. Interposer:
// the handle is the real NCCL's, and this side record (looked up by it) holds the fusco
// communicator made lazily for the all-to-all-shaped calls.
struct Comm {
  ncclComm_t handle = nullptr;  // standalone: the handle handed out (registerComm)
  fuscoComm_t fc = nullptr;
  ncclComm_t real = nullptr;  // interposer: the real communicator
  int rank = -1, nranks = 0;
  int cudaDevice = -1;
  fuscoMemType_t memType = fuscoMemHost;
  ncclResult_t asyncError = ncclSuccess;
  bool logged = false;
  std::mutex mu;  // the last error may be read from any thread
  std::string lastError;
};
// A reference that keeps a record in memory: a call holds one from its handle check to its return,
// and a group holds one per call until its end, so a communicator destroyed or aborted meanwhile
// (from this thread or another) is never freed under them.
using CommRef = std::shared_ptr<Comm>;

// Every entry point records its failure here: per thread, and on the communicator when there is
// one (ncclGetLastError reads either).
ncclResult_t fail(Comm* c, ncclResult_t r, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
// Maps a fusco result to NCCL's (same values; fuscoTimeout, which NCCL lacks, is a remote error),
// copying fusco's message to the shim's last error and a broken comm's state to its async error.
ncclResult_t fromFusco(Comm* c, fuscoResult_t r, const char* call);
const char* threadLastError();
void clearThreadLastError();

// Standalone handles, guarded by a live registry (as fusco guards its own, docs/API.md
// "Conventions"): a handle is live from registerComm until unregisterComm. A handle is a number,
// never reused and never dereferenced: a destroyed, aborted or foreign handle is only looked up,
// and a communicator made later is never taken for a destroyed one.
ncclComm_t registerComm(CommRef c);
// The record of a live handle, else nullptr.
CommRef liveComm(ncclComm_t comm);
// Removes a live handle (destroy, abort) and returns its record; nullptr when it was not live.
CommRef unregisterComm(ncclComm_t comm);
// NULL or not live is ncclInvalidArgument (message recorded).
ncclResult_t checkComm(ncclComm_t comm, const char* call, CommRef* out);
// Interposer side records, keyed by the real handle.
Comm* sideRecord(ncclComm_t real, bool create);
void dropSideRecord(ncclComm_t real);
// Logs once per communicator which mode is active and what fusco serves.
void logServed(Comm* c);

fuscoDataType_t toFusco(ncclDataType_t t);
fuscoMemType_t commMemType();
// The fusco config for a new communicator of this process.
fuscoConfig_t fuscoConfigFor(fuscoMemType_t mem, int device);

// The CUDA runtime, found at run time (the shim links no CUDA): the calling thread's device, and
// device allocations for ncclMemAlloc and the interposer's unique-id broadcast.
struct CudaRt {
  int (*getDevice)(int*) = nullptr;
  int (*malloc)(void**, size_t) = nullptr;
  int (*free)(void*) = nullptr;
  int (*memcpy)(void*, const void*, size_t, int) = nullptr;
  int (*streamSynchronize)(cudaStream_t) = nullptr;
};
const CudaRt* cudaRt();  // NULL when no CUDA runtime can be loaded
int currentDevice();     // -1 without a runtime

// Groups (per thread). Standalone: fusco's group is opened with the NCCL one, send/recv go
// straight into it, and collectives called inside wait for the group's end. Interposer: every
// call inside is held until the end, then served by fusco or replayed on the real NCCL.
struct GroupOp {
  enum Kind { Send, Recv, AllToAll, Other } kind;
  ncclComm_t comm;
  int peer;
  const void* sbuf;
  void* rbuf;
  size_t count;
  ncclDataType_t type;
  cudaStream_t stream;
  std::function<ncclResult_t()> replay;  // interposer: the call as made, on the real NCCL
  CommRef ref;                           // standalone: comm's record when the call was made
};
struct GroupState {
  int depth = 0;
  bool realOpen = false;  // interposer: a real ncclGroupStart was issued inside this group
  ncclResult_t sticky = ncclSuccess;  // standalone: the first error of a call inside the group
  std::string stickyMsg;
  std::vector<GroupOp> ops;
};
GroupState& group();
// Standalone: a call that fails inside a group makes the group fail; ncclGroupEnd returns the
// group's first error with its message, as NCCL's does. Returns r.
ncclResult_t noteGroupError(ncclResult_t r);

// Interposer mode: fusco serves the ops if they are all-to-all shaped (see interpose.cc).
ncclResult_t interposeGroupEnd(GroupState& g);
ncclResult_t interposeAllToAll(const void* s, void* r, size_t count, ncclDataType_t t,
                               ncclComm_t comm, cudaStream_t stream);
ncclResult_t interposeSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                            ncclConfig_t* config);
// Interposer: calls the real NCCL must run now (comm init) open a real group once inside a group.
void openRealGroup();

// Standalone split over the parent fusco communicator (split.cc). refused: the caller's own check
// of the other arguments (the config); a refused rank still joins the exchanges, in no new
// communicator, and returns that error.
ncclResult_t standaloneSplit(Comm* parent, int color, int key, ncclComm_t* newcomm,
                             ncclResult_t refused);
ncclResult_t standaloneInit(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank,
                            const ncclConfig_t* config, const char* call);

// Forwarding to the real NCCL. A call made while the shim is inside the real library (the real
// NCCL calling its own exported functions, which an LD_PRELOADed shim intercepts) goes straight
// back to it, so the shim never re-enters its own logic.
bool inReal();
struct RealScope {
  RealScope();
  ~RealScope();
};
ncclResult_t brokenCall(const char* call);
ncclResult_t missingReal(const char* call);
template <typename F, typename... A>
ncclResult_t callReal(F fn, const char* call, A... a) {
  if (fn == nullptr) return missingReal(call);
  RealScope scope;
  return fn(a...);
}

}  // namespace fnccl

// Every entry point that the interposer forwards whole starts with this.
#define FNCCL_FORWARD(name, ...)                                                    \
  do {                                                                              \
    const ::fnccl::Global& g_ = ::fnccl::global();                                  \
    if (g_.mode == ::fnccl::Mode::Broken) return ::fnccl::brokenCall("nccl" #name); \
    if (g_.mode == ::fnccl::Mode::Interposer)                                       \
      return ::fnccl::callReal(g_.real.name, "nccl" #name, ##__VA_ARGS__);          \
  } while (0)
// Entry points with interposer logic of their own start with this: a broken setup fails, and a
// call from inside the real library goes back to it.
#define FNCCL_PASSTHROUGH(name, ...)                                                \
  do {                                                                              \
    const ::fnccl::Global& g_ = ::fnccl::global();                                  \
    if (g_.mode == ::fnccl::Mode::Broken) return ::fnccl::brokenCall("nccl" #name); \
    if (g_.mode == ::fnccl::Mode::Interposer && ::fnccl::inReal())                  \
      return ::fnccl::callReal(g_.real.name, "nccl" #name, ##__VA_ARGS__);          \
  } while (0)

#endif  // FUSCO_NCCL_SHIM_H_
