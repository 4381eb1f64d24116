// The engine operations of the NCCL-shaped calls: all-to-all, all-to-all-v and a group of
// point-to-point calls on one communicator, with the work they need beyond the transfers (the
// copy of an in-place send side, the overlap search of a group). The api layer checks arguments
// and runs these.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/arg_check.h"
#include "engine/engine.h"

namespace fusco {

// Block p of sendbuff goes to rank p and lands in block p of recvbuff (blockBytes each).
// withData false: the operation with no messages, for a rank whose own arguments failed and
// still joins the call (nothing else is read then).
Op allToAllOp(int nranks, const void* sendbuff, void* recvbuff, size_t blockBytes, void* stream,
              bool withData);
// Counts and displacements in elements of elemBytes, as in MPI_Alltoallv.
Op allToAllvOp(int nranks, const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
               void* recvbuff, const size_t recvcounts[], const size_t rdispls[], size_t elemBytes,
               void* stream, bool withData);

// An in-place fuscoAllToAll reads its send side from a copy taken before any byte moves: block j
// of the buffer is overwritten by rank j's data while rank j may not have read it yet.
struct InPlaceCopy {
  std::unique_ptr<char[]> host;
};
// The copy of an in-place call's send side (`bytes` at buff) to send from: in host memory, held
// by *copy, or on a CUDA comm in the comm's scratch, copied on stream. On failure returns buff,
// with fuscoSystemError and the reason in *a (the call still joins its peers).
const void* copyInPlaceSendSide(Communicator& comm, const void* buff, size_t bytes, void* stream,
                                InPlaceCopy* copy, ArgCheck* a);

// One point-to-point call of a group: rows to send to, or receive from, `peer`.
struct P2pCall {
  bool send;
  int peer;
  RowStream data;
  void* stream;
};
// The calls of one group on one communicator, in call order per peer; the group runs on the
// first call's stream (one stream per group, as in NCCL). Calls with a peer out of range are
// left out (their own check already failed).
Op groupOp(int nranks, const std::vector<P2pCall>& calls);
// Within one group on one comm, a send range that overlaps a receive range has no defined result
// (the receive may land before the send has read it): the message naming one such pair of calls,
// or "" when none overlap. deviceRows: row lists live on the device (a CUDA comm) and are not
// read, so only contiguous calls are compared.
std::string groupOverlap(const std::vector<P2pCall>& calls, bool deviceRows);

}  // namespace fusco
