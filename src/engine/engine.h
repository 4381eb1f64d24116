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

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "core/arg_check.h"
#include "device/device_ops.h"
#include "device/row_copy.h"
#include "engine/communicator.h"
#include "fusco.h"

namespace fusco {

enum class OpKind : uint32_t { AllToAll = 1, AllToAllv = 2, Group = 3, Shuffle = 4, Moe = 5 };

// A pull operation's sum (Op::pullRun): when a peer pushes its rows instead of offering its
// buffer, the operation's ring step computes it itself, reading those rows in the pair's channel
// (device/chan_reduce.h). `terms` as the reading kernel gets them (its bases unused); termSeq:
// each term's slot in this rank's packed slot order (rank r's rows after its lower peers' message
// rows). terms.termStart null: no such sum (every peer must offer).
struct PullSum {
  DevFinalSum terms;
  const uint32_t* termSeq = nullptr;
  uint64_t hidden = 0;
  fuscoDataType_t dt = fuscoFloat32;
};

// A pull operation's reading: run enqueues this rank's reading kernel (see Op::pullRun), sum says
// what it computes.
struct PullRead {
  using Run =
      std::function<fuscoResult_t(const char* const* bases, const uint32_t* basesAligned, void*)>;
  PullRead() = default;
  PullRead(std::nullptr_t) {}  // NOLINT(google-explicit-constructor): "no pull", as for a function
  PullRead(Run r, const PullSum& s) : run(std::move(r)), sum(s) {}
  PullRead& operator=(std::nullptr_t) {
    run = nullptr;
    sum = PullSum{};
    return *this;
  }
  explicit operator bool() const { return static_cast<bool>(run); }
  fuscoResult_t operator()(const char* const* bases, const uint32_t* aligned, void* s) const {
    return run(bases, aligned, s);
  }
  Run run;
  PullSum sum;
};

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
  // A send stream marked `push` (row_copy.h) is not offered: its rows go through the pair's
  // channel, and the receiver's ring step computes pullRun.sum itself (the word is then 0).
  PullRead pullRun;

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
