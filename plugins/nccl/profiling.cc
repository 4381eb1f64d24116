// NCCL exports every function twice: ncclX, which a profiling tool may intercept, and pncclX,
// the implementation such a tool calls on to. Here pncclX runs the shim's ncclX.
#include "shim.h"

extern "C" {
#define FUSCO_NCCL_PROFILING_TWIN(ret, name, params, args) \
  ret pnccl##name params { return nccl##name args; }
FUSCO_NCCL_FUNCS(FUSCO_NCCL_PROFILING_TWIN)
#undef FUSCO_NCCL_PROFILING_TWIN
}
