// Driver entry points handed out by cudaGetDriverEntryPointByVersion (runtime API, "Driver Entry
// Point Access"): cuStreamBatchMemOp and cuMemGetAddressRange, the two the library takes.
//
// cuStreamBatchMemOp (driver API, "Stream Memory Operations"): each operation is a stream item in
// the batch's order. A wait blocks its stream, and the hardware queue it is on, until the value
// holds (GEQ is the cyclic "(int32_t)(*addr - value) >= 0"); a write stores the value after every
// earlier write of the stream is visible, unless CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER. The
// address must be device-accessible memory; it is checked when the item runs and at each poll of a
// wait (T3), so memory taken away from a dead peer under a wait is an illegal address.
#include <cstring>

#include "twin_internal.h"

namespace twincuda {
namespace detail {
namespace {

CUresult toDriver(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return CUDA_SUCCESS;
    case cudaErrorInvalidValue:
      return CUDA_ERROR_INVALID_VALUE;
    case cudaErrorInvalidResourceHandle:
      return CUDA_ERROR_INVALID_HANDLE;
    case cudaErrorNotSupported:
      return CUDA_ERROR_NOT_SUPPORTED;
    default:
      return static_cast<CUresult>(e);  // 700, 900-909: the same numbers in both APIs
  }
}

bool waitHolds(unsigned flags, uint64_t cur, uint64_t want, bool is64) {
  switch (flags & 0xf) {
    case CU_STREAM_WAIT_VALUE_GEQ:
      return is64
                 ? static_cast<int64_t>(cur - want) >= 0
                 : static_cast<int32_t>(static_cast<uint32_t>(cur) - static_cast<uint32_t>(want)) >=
                       0;
    case CU_STREAM_WAIT_VALUE_EQ:
      return cur == want;
    case CU_STREAM_WAIT_VALUE_AND:
      return (cur & want) != 0;
    default:
      return is64 ? ~(cur | want) != 0 : static_cast<uint32_t>(~(cur | want)) != 0;
  }
}

const char* waitName(unsigned flags) {
  switch (flags & 0xf) {
    case CU_STREAM_WAIT_VALUE_GEQ:
      return "GEQ";
    case CU_STREAM_WAIT_VALUE_EQ:
      return "EQ";
    case CU_STREAM_WAIT_VALUE_AND:
      return "AND";
    default:
      return "NOR";
  }
}

ItemPtr waitOp(const CUstreamBatchMemOpParams& p, bool is64) {
  auto* addr = reinterpret_cast<void*>(p.waitValue.address);
  const uint64_t want = is64 ? p.waitValue.value64 : p.waitValue.value;
  const unsigned flags = p.waitValue.flags;
  auto it = std::make_shared<Item>();
  it->desc = std::string("cuStreamBatchMemOp wait-value-") + (is64 ? "64 " : "32 ") +
             waitName(flags) + " " + std::to_string(want) + " at " + fmtPtr(addr);
  const std::string desc = it->desc;
  it->ready = [addr, want, flags, is64, desc] {
    auto hold = holdMappings();
    if (!checkAccesses({Access{addr, is64 ? 8u : 4u, false, true}}, desc)) return true;
    const uint64_t cur = is64 ? __atomic_load_n(static_cast<uint64_t*>(addr), __ATOMIC_ACQUIRE)
                              : __atomic_load_n(static_cast<uint32_t*>(addr), __ATOMIC_ACQUIRE);
    return waitHolds(flags, cur, want, is64);
  };
  return it;
}

ItemPtr writeOp(const CUstreamBatchMemOpParams& p, bool is64) {
  auto* addr = reinterpret_cast<void*>(p.writeValue.address);
  const uint64_t v = is64 ? p.writeValue.value64 : p.writeValue.value;
  const int order = p.writeValue.flags & CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER ? __ATOMIC_RELAXED
                                                                                 : __ATOMIC_SEQ_CST;
  auto it = std::make_shared<Item>();
  it->desc = std::string("cuStreamBatchMemOp write-value-") + (is64 ? "64 " : "32 ") +
             std::to_string(v) + " at " + fmtPtr(addr);
  it->accesses = {Access{addr, is64 ? 8u : 4u, true, true}};
  it->run = [addr, v, order, is64] {
    if (is64)
      __atomic_store_n(static_cast<uint64_t*>(addr), v, order);
    else
      __atomic_store_n(static_cast<uint32_t*>(addr), static_cast<uint32_t>(v), order);
  };
  return it;
}

CUresult streamBatchMemOp(CUstream stream, unsigned int count, CUstreamBatchMemOpParams* ops,
                          unsigned int flags) {
  const cudaError_t s0 = enter();
  if (s0 != cudaSuccess) return toDriver(s0);
  // "count: The number of operations in the array. Must be less than 256."
  if (count == 0 || count >= 256 || ops == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Stream* s = findStream(reinterpret_cast<cudaStream_t>(stream));
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  std::vector<ItemPtr> items;
  for (unsigned i = 0; i < count; ++i) {
    const CUstreamBatchMemOpParams& p = ops[i];
    switch (p.operation) {
      case CU_STREAM_MEM_OP_WAIT_VALUE_32:
        items.push_back(waitOp(p, false));
        break;
      case CU_STREAM_MEM_OP_WAIT_VALUE_64:
        items.push_back(waitOp(p, true));
        break;
      case CU_STREAM_MEM_OP_WRITE_VALUE_32:
        items.push_back(writeOp(p, false));
        break;
      case CU_STREAM_MEM_OP_WRITE_VALUE_64:
        items.push_back(writeOp(p, true));
        break;
      case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
      case CU_STREAM_MEM_OP_BARRIER:
        break;  // CPU stores are visible in order already
      default:
        return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
  std::lock_guard<std::mutex> g(contextMutex());
  for (ItemPtr& it : items) {
    const cudaError_t e = submitLocked(s, std::move(it));
    if (e != cudaSuccess) return toDriver(fail(e));
  }
  return CUDA_SUCCESS;
}

CUresult memGetAddressRange(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  const cudaError_t s0 = enter();
  if (s0 != cudaSuccess) return toDriver(s0);
  void* base = nullptr;
  size_t bytes = 0;
  if (!allocationRange(reinterpret_cast<void*>(dptr), &base, &bytes)) return CUDA_ERROR_NOT_FOUND;
  // "If one of them is NULL, it is ignored."
  if (pbase) *pbase = reinterpret_cast<CUdeviceptr>(base);
  if (psize) *psize = bytes;
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace detail
}  // namespace twincuda

using namespace twincuda::detail;

extern "C" {

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* driverStatus) {
  if (symbol == nullptr || funcPtr == nullptr) return fail(cudaErrorInvalidValue);
  *funcPtr = nullptr;
  cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
  // Both take the _v2 ABI from CUDA 12.0 on (cuda.h maps the plain names to it).
  if (cudaVersion >= 12000 && std::strcmp(symbol, "cuStreamBatchMemOp") == 0) {
    *funcPtr = reinterpret_cast<void*>(&streamBatchMemOp);
    st = cudaDriverEntryPointSuccess;
  } else if (cudaVersion >= 3020 && std::strcmp(symbol, "cuMemGetAddressRange") == 0) {
    *funcPtr = reinterpret_cast<void*>(&memGetAddressRange);
    st = cudaDriverEntryPointSuccess;
  } else if (std::strcmp(symbol, "cuStreamBatchMemOp") == 0) {
    st = cudaDriverEntryPointVersionNotSufficent;
  }
  if (driverStatus) *driverStatus = st;
  (void)flags;
  return cudaSuccess;
}

}  // extern "C"
