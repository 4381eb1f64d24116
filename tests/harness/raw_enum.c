#include "harness/raw_enum.h"

fuscoResult_t fuscoTestAllToAllRawType(const void* sendbuff, void* recvbuff, size_t count,
                                       int datatype, fuscoComm_t comm) {
  return fuscoAllToAll(sendbuff, recvbuff, count, (fuscoDataType_t)datatype, comm, NULL);
}

fuscoResult_t fuscoTestCombineRawType(fuscoMoeHandle_t handle, const void* expertOut, int datatype,
                                      size_t hidden, void* out) {
  return fuscoMoeCombine(handle, expertOut, (fuscoDataType_t)datatype, hidden, NULL, out, NULL);
}

fuscoResult_t fuscoTestDataTypeSizeRaw(int datatype, size_t* bytes) {
  return fuscoDataTypeSize((fuscoDataType_t)datatype, bytes);
}
