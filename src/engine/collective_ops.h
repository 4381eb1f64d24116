// The engine operations of the NCCL-shaped calls: all-to-all, all-to-all-v and a group of
// point-to-point calls on one communicator. The api layer checks arguments and runs these.
#pragma once

#include <cstddef>
#include <vector>

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

}  // namespace fusco
