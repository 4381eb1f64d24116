// Compile-time proof that nccl_abi_types.h (used where the toolkit is absent) matches the real
// NCCL header: every enum value, struct size and field offset. Built only when nccl.h is found;
// the shim's own sources then compile against the real header, whose declarations already check
// every exported signature (nccl_abi.h).
#include <limits.h>
#include <nccl.h>
// The fallback's initializer, kept before the real one is redefined below.
static const ncclConfig_t kRealInit = NCCL_CONFIG_INITIALIZER;
#undef NCCL_CONFIG_INITIALIZER
#include <stddef.h>

#include <type_traits>

namespace own {
#undef FUSCO_NCCL_ABI_TYPES_H_
// The macros nccl.h defined are redefined identically (a different value would be an error).
#include "nccl_abi_types.h"
}  // namespace own

#define SAME_VALUE(v) \
  static_assert(static_cast<long long>(::v) == static_cast<long long>(own::v), #v)
SAME_VALUE(ncclSuccess);
SAME_VALUE(ncclUnhandledCudaError);
SAME_VALUE(ncclSystemError);
SAME_VALUE(ncclInternalError);
SAME_VALUE(ncclInvalidArgument);
SAME_VALUE(ncclInvalidUsage);
SAME_VALUE(ncclRemoteError);
SAME_VALUE(ncclInProgress);
SAME_VALUE(ncclNumResults);
SAME_VALUE(ncclSum);
SAME_VALUE(ncclProd);
SAME_VALUE(ncclMax);
SAME_VALUE(ncclMin);
SAME_VALUE(ncclAvg);
SAME_VALUE(ncclNumOps);
SAME_VALUE(ncclMaxRedOp);
SAME_VALUE(ncclInt8);
SAME_VALUE(ncclChar);
SAME_VALUE(ncclUint8);
SAME_VALUE(ncclInt32);
SAME_VALUE(ncclInt);
SAME_VALUE(ncclUint32);
SAME_VALUE(ncclInt64);
SAME_VALUE(ncclUint64);
SAME_VALUE(ncclFloat16);
SAME_VALUE(ncclHalf);
SAME_VALUE(ncclFloat32);
SAME_VALUE(ncclFloat);
SAME_VALUE(ncclFloat64);
SAME_VALUE(ncclDouble);
SAME_VALUE(ncclBfloat16);
SAME_VALUE(ncclFloat8e4m3);
SAME_VALUE(ncclFloat8e5m2);
SAME_VALUE(ncclNumTypes);
SAME_VALUE(ncclScalarDevice);
SAME_VALUE(ncclScalarHostImmediate);

#define SAME_SIZE(t) \
  static_assert(sizeof(::t) == sizeof(own::t) && alignof(::t) == alignof(own::t), #t)
SAME_SIZE(ncclResult_t);
SAME_SIZE(ncclDataType_t);
SAME_SIZE(ncclRedOp_t);
SAME_SIZE(ncclScalarResidence_t);
SAME_SIZE(ncclUniqueId);
SAME_SIZE(ncclConfig_t);
SAME_SIZE(ncclSimInfo_t);
SAME_SIZE(ncclComm_t);
SAME_SIZE(ncclWindow_t);
static_assert(std::is_same<::cudaStream_t, own::cudaStream_t>::value, "cudaStream_t");

#define SAME_FIELD(t, f)                                                        \
  static_assert(offsetof(::t, f) == offsetof(own::t, f) &&                      \
                    std::is_same<decltype(::t::f), decltype(own::t::f)>::value, \
                #t "." #f)
SAME_FIELD(ncclConfig_t, size);
SAME_FIELD(ncclConfig_t, magic);
SAME_FIELD(ncclConfig_t, version);
SAME_FIELD(ncclConfig_t, blocking);
SAME_FIELD(ncclConfig_t, cgaClusterSize);
SAME_FIELD(ncclConfig_t, minCTAs);
SAME_FIELD(ncclConfig_t, maxCTAs);
SAME_FIELD(ncclConfig_t, netName);
SAME_FIELD(ncclConfig_t, splitShare);
SAME_FIELD(ncclConfig_t, trafficClass);
SAME_FIELD(ncclConfig_t, commName);
SAME_FIELD(ncclConfig_t, collnetEnable);
SAME_FIELD(ncclConfig_t, CTAPolicy);
SAME_FIELD(ncclConfig_t, shrinkShare);
SAME_FIELD(ncclConfig_t, nvlsCTAs);
SAME_FIELD(ncclConfig_t, nChannelsPerNetPeer);
SAME_FIELD(ncclConfig_t, nvlinkCentricSched);
SAME_FIELD(ncclSimInfo_t, size);
SAME_FIELD(ncclSimInfo_t, magic);
SAME_FIELD(ncclSimInfo_t, version);
SAME_FIELD(ncclSimInfo_t, estimatedTime);

// The fallback's config initializer fills every field as the real one does.
constexpr own::ncclConfig_t kOwnInit = NCCL_CONFIG_INITIALIZER;
static_assert(sizeof(kOwnInit) == sizeof(kRealInit) && kOwnInit.magic == 0xcafebeef &&
                  kOwnInit.version == NCCL_VERSION(2, 28, 9) &&
                  kOwnInit.nvlinkCentricSched == INT_MIN,
              "NCCL_CONFIG_INITIALIZER");

static_assert(NCCL_VERSION_CODE == 22809 && NCCL_UNIQUE_ID_BYTES == 128, "NCCL 2.28.9");
