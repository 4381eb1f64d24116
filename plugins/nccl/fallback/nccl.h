/* nccl.h for builds without the CUDA toolkit: NCCL 2.28's types and functions as the shim exports
 * them (plugins/nccl/nccl_abi.h). Where the toolkit is present, programs use its real nccl.h. */
#ifndef FUSCO_NCCL_FALLBACK_NCCL_H_
#define FUSCO_NCCL_FALLBACK_NCCL_H_
#include "../nccl_abi.h"
#endif
