// Calls that pass an arbitrary int where the API takes a fuscoDataType_t, as a C caller may.
// They live in a C file: in C++ even forming an out-of-range enum value is undefined.
#pragma once

#include "fusco.h"

#ifdef __cplusplus
extern "C" {
#endif

fuscoResult_t fuscoTestAllToAllRawType(const void* sendbuff, void* recvbuff, size_t count,
                                       int datatype, fuscoComm_t comm);
fuscoResult_t fuscoTestCombineRawType(fuscoMoeHandle_t handle, const void* expertOut, int datatype,
                                      size_t hidden, void* out);
fuscoResult_t fuscoTestDataTypeSizeRaw(int datatype, size_t* bytes);

#ifdef __cplusplus
}
#endif
