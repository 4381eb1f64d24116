// Layout descriptors as engine operations: the row lists of a fuscoLayout_t (validated once,
// pairwise, when it is created) and the operation that gathers rows straight from the send
// buffer and scatters them straight into their final rows, with no permuted copy.
#pragma once

#include <cstdint>
#include <vector>

#include "core/arg_check.h"
#include "device/cuda_rt.h"
#include "engine/communicator.h"
#include "engine/engine.h"

namespace fusco {

struct LayoutPlan {
  size_t rowBytes = 0;
  std::vector<std::vector<int64_t>> sendRows;  // [nranks]
  std::vector<std::vector<int64_t>> recvRows;  // [nranks]
  // fuscoMemCuda comms: the same rows on the device, send rows of every peer then receive rows.
  DeviceBuffer deviceRows;
  std::vector<size_t> sendAt, recvAt;  // [nranks] offsets (in rows) into deviceRows

  // fuscoLayoutCreate's lists: split per peer and checked (plan/layout_check.h) into *a.
  void setRows(int n, size_t rowBytes, const size_t sendCounts[], const int64_t* sendRowIdx,
               const size_t recvCounts[], const int64_t* recvRowIdx, ArgCheck* a);
  size_t totalSendRows() const;
  size_t totalRecvRows() const;
  // The collective check of fuscoLayoutCreate (counts agree pairwise; a rank whose own lists
  // failed, `a`, still joins), then on a CUDA comm one upload of the rows to the device.
  fuscoResult_t create(Communicator& c, const ArgCheck& a);
  // One fuscoShuffle: the rows move, stream-ordered on a CUDA comm.
  fuscoResult_t shuffle(Communicator& c, const void* sendbuff, void* recvbuff, void* stream,
                        const ArgCheck& a);

 private:
  fuscoResult_t upload(int64_t timeoutMs);
  Op op(const void* sendbuff, void* recvbuff, const char* name) const;
};

}  // namespace fusco
