// The engine: runs one operation (a set of messages to and from peers) on a communicator.
//
// Every operation starts with a header round: each rank tells each involved peer what it will
// send and expects to receive, and whether its own arguments were valid, so mismatches are found
// by both sides of a pair before any byte moves. Collective operations add a verdict round so
// that every rank learns whether the call failed anywhere; then either everybody moves data or
// nobody does, and the communicator stays usable. Data moves in slices through each peer's
// transport channel (gathered straight from the source rows into the slot, scattered straight
// from the slot into the final rows), or, when the receiver's buffer is memory its peer can map,
// straight from source rows into the final rows (one copy).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/arg_check.h"
#include "device/row_copy.h"
#include "engine/communicator.h"
#include "fusco.h"

namespace fusco {

enum class OpKind : uint32_t { AllToAll = 1, AllToAllv = 2, Group = 3, Shuffle = 4, Moe = 5 };

// What one rank sends to and receives from one peer, in order.
struct PeerWork {
  std::vector<RowStream> sends;
  std::vector<RowStream> recvs;
  // Optional, parallel to sends: where each message lands in the peer's receive buffer (base
  // ignored: offsets from the peer's base), for peers whose receive stream has layoutShared.
  std::vector<RowStream> remoteDst;
  bool empty() const { return sends.empty() && recvs.empty(); }
};

struct Op {
  const char* name = "";
  OpKind kind = OpKind::Group;
  bool collective = false;    // every rank takes part (verdict round, all peers)
  bool validateOnly = false;  // check counts pairwise and agree; move no data
  // Every rank already agreed, earlier in the same API call, that the arguments are valid: a
  // collective skips its verdict round (pairs are still checked from the headers).
  bool agreed = false;
  fuscoResult_t argStatus = fuscoSuccess;  // this rank's own argument check
  std::string argError;                    // its message
  std::vector<PeerWork> peers;             // [nranks]; peers[rank] are copies to self
  // fuscoMemCuda comms: the caller's cudaStream_t; the data moves on the GPU, stream-ordered, and
  // the call returns once it is enqueued. hostData: the streams are host memory even on a CUDA
  // comm (the planner's own exchanges), moved by the host as on a host comm.
  void* stream = nullptr;
  bool hostData = false;
  // fuscoMemCuda comms, a pull operation: every message is read by its receiver instead of written
  // by its sender. A sender offers the buffer of each send stream (base, extentBytes(); it must be
  // mappable by its peers) and says on its stream when it is ready; once every sender did,
  // pullRun enqueues this rank's reading kernel with one base per peer (the mapped buffer of that
  // peer's message to this rank, this rank's own for itself; nullptr: no message). The operation
  // ends on the stream when every receiver is done reading this rank's buffers.
  // It is enqueued before the peers are known: `bases` (device-visible, one per peer) and
  // `basesAligned` (a word: 1 when every base is 16-byte aligned, 2 when not, 0 when the operation
  // did not resolve and the kernel must read nothing) are filled before the kernel runs.
  std::function<fuscoResult_t(const char* const* bases, const uint32_t* basesAligned, void* stream)>
      pullRun;

  // An operation whose sizes are known only once earlier stream work has run (a capacity plan's
  // lists, docs/DESIGN.md "Planning on the GPU"): `late` runs before the operation resolves (on
  // the progress thread for an enqueued operation, at once otherwise). It may set the streams'
  // sizes and addresses (never their number) and this rank's argStatus / argError, which fail the
  // operation alike on every rank like any argument check; another result breaks the comm.
  // `after` runs once the operation resolved, with whether it moves its data on every rank.
  std::function<fuscoResult_t(Op&)> late;
  std::function<void(bool)> after;

  // The call this operation belongs to, taken when it is run or enqueued (a CUDA comm's progress
  // thread runs it after the caller went on): its number, whether it is the call's first
  // operation (which carries the call's agreement values), those values, and an injected
  // corrupt-header fault (FUSCO_FAULT).
  uint64_t call = 0;
  uint64_t callSerial = 0;  // every call of the comm, collective or not (Communicator::callSerial)
  bool firstInCall = false;
  std::vector<AgreeValue> agree;
  bool corruptHeaders = false;
  // Enqueued while its stream was being captured into a CUDA graph: its parameters are its own
  // (engine_async.h).
  bool captured = false;
  // An operation sized late (late): the most each direction of a pair can move, so the caller
  // grows a remote peer's bridge areas before the first wait as for any other operation.
  size_t latePeerBound = 0;

  explicit Op(int nranks) : peers(nranks) {}
};

// Runs op on comm. Returns fuscoSuccess only if the operation completed on this rank (and, for a
// collective, validated on every rank). Failures after validation break the communicator.
fuscoResult_t runOp(Communicator& comm, Op& op);
// Same, with this rank's own argument check in the op (argStatus, argError): a rank whose check
// failed still runs the header exchange, so its peers get its message instead of waiting.
fuscoResult_t runOp(Communicator& comm, Op& op, const ArgCheck& a);

}  // namespace fusco
