// An operation's ring roles (docs/DESIGN.md, "Channels"), written once (FUSCO_HD) for the
// operation kernel and its twins: for every local peer whose messages are not in place, this rank
// produces its messages to that peer into the pair's ring, and consumes the peer's messages from
// the ring into their final rows. A role's items are its messages in order (a message's bytes are
// a byte stream that each side maps onto its own rows, so the two sides' row shapes may differ);
// the ring cuts them into slots. One executor steps every role in turn and never blocks, so the
// producers and consumers of both sides of every pair make progress together.
#pragma once

#include <cstdint>

#include "device/chan_reduce.h"
#include "device/chan_steps.h"
#include "device/chan_table.h"
#include "device/device_ops.h"
#include "device/op_steps.h"

namespace fusco {
namespace chan {

// The byte range [off, off + n) of a message, row by row: the task's rows in order (a row's
// bytes at rowAt(row)); each piece goes to visit(rowPointer + within, bytes, rowIndex).
template <class Visit>
FUSCO_HD inline void forEachRowPiece(const DevCopyTask& t, uint64_t off, uint64_t n,
                                     Visit&& visit) {
  while (n > 0) {
    const uint64_t row = off / t.rowBytes, within = off % t.rowBytes;
    const uint64_t rowEnd =
        (row + 1) * t.rowBytes < t.totalBytes ? (row + 1) * t.rowBytes : t.totalBytes;
    const uint64_t len = rowEnd - off < n ? rowEnd - off : n;
    visit(row, within, len);
    off += len;
    n -= len;
  }
}

// A send's messages as items: read copies a message's bytes out of its source rows. Copy is
// copy(to, from, n, userSide) -> bool: userSide names the caller's buffer (the twin checks it).
// With `to` null it only checks that `from` may be read, with `from` null that `to` may be
// written (the reduce role's rows): false when not.
template <class Copy>
struct SendItems {
  const DevCopyTask* tasks;
  Copy copy;
  FUSCO_HD uint64_t bytes(uint64_t i) const { return tasks[i].totalBytes; }
  FUSCO_HD void read(uint64_t i, uint64_t off, char* to, uint64_t n) const {
    const DevCopyTask& t = tasks[i];
    forEachRowPiece(t, off, n, [&](uint64_t row, uint64_t within, uint64_t len) {
      const char* s =
          t.src + (t.srcRows ? static_cast<uint64_t>(t.srcRows[row]) : row) * t.rowBytes;
      copy(to, s + within, len, false);
      to += len;
    });
  }
};

// A receive's messages as items: write copies a message's bytes into its destination rows (every
// row of a fan list).
template <class Copy>
struct RecvItems {
  const DevCopyTask* tasks;
  Copy copy;
  FUSCO_HD uint64_t bytes(uint64_t i) const { return tasks[i].totalBytes; }
  FUSCO_HD void write(uint64_t i, uint64_t off, const char* from, uint64_t n) const {
    const DevCopyTask& t = tasks[i];
    forEachRowPiece(t, off, n, [&](uint64_t row, uint64_t within, uint64_t len) {
      if (t.fanStart == nullptr) {
        const uint64_t at = t.dstRows ? static_cast<uint64_t>(t.dstRows[row]) : row;
        copy(t.dst + at * t.rowBytes + within, from, len, true);
      } else {
        for (uint32_t f = t.fanStart[row]; f < t.fanStart[row + 1]; ++f)
          copy(t.dst + static_cast<uint64_t>(t.fanRows[f]) * t.rowBytes + within, from, len, true);
      }
      from += len;
    });
  }
};

// Where one executor stands in an operation's ring step.
struct RolesState {
  bool started = false;
  op::Wait w{};
};

// A new operation's roles: each direction's epoch advances, and each sub-ring's cursor starts at
// its range of the messages (positions carry on); then the reduce role, which reads where its
// feeds start.
FUSCO_HD inline void startRoles(Role* roles, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    Role& r = roles[i];
    if (r.kind == kReduce) continue;
    uint64_t* epoch = reinterpret_cast<uint64_t*>(r.epoch);
    *epoch = *epoch + 1;
    for (uint32_t s = 0; s < r.split; ++s) {
      uint64_t b = 0, e = 0;
      splitRange(r.ntasks, r.split, s, &b, &e);
      if (r.kind == kProduce)
        startItems(reinterpret_cast<ProducerCursor*>(r.cursors)[s], b);
      else
        startItems(reinterpret_cast<ConsumerCursor*>(r.cursors)[s], b);
    }
  }
  for (uint32_t i = 0; i < n; ++i)
    if (roles[i].kind == kReduce) startReduce(roles[i], roles, roles[i].ntasks);
}

// One sub-ring of one role, up to its depth in slots: kProgress when a slot moved, else what
// stopped it (kFinished, kNoCredit, kNoData, kCorrupt).
template <class Copy>
FUSCO_HD inline StepStatus stepSubRing(const Role& r, uint32_t s, const Copy& copy) {
  uint64_t b = 0, e = 0;
  splitRange(r.ntasks, r.split, s, &b, &e);
  const Ring ring = ringOf(r, s);
  const uint64_t epoch = *reinterpret_cast<const uint64_t*>(r.epoch);
  const DevCopyTask* tasks = reinterpret_cast<const DevCopyTask*>(r.tasks);
  StepStatus last = kFinished;
  bool moved = false;
  for (uint32_t k = 0; k < r.depth; ++k) {
    if (r.kind == kProduce)
      last = produce(ring, reinterpret_cast<ProducerCursor*>(r.cursors)[s],
                     SendItems<Copy>{tasks, copy}, e, epoch);
    else
      last = consume(ring, reinterpret_cast<ConsumerCursor*>(r.cursors)[s],
                     RecvItems<Copy>{tasks, copy}, e, epoch);
    if (last != kProgress) break;
    moved = true;
  }
  return moved ? kProgress : last;
}

// Steps every role's sub-rings once. op::kReady when every role finished, op::kPending while one
// waits (the clock restarts whenever a slot moves; the abort word and the timeout end the wait,
// as a wait step's), op::kAborted / op::kTimedOut, or op::kTimedOut at once for a slot of another
// operation (reported with op::kPhaseSlot).
template <class Copy>
FUSCO_HD inline op::WaitStatus stepRoles(Role* roles, uint32_t n, RolesState& st,
                                         op::OpWords* words, uint64_t nowNs, uint64_t timeoutNs,
                                         const Copy& copy) {
  if (!st.started) {
    startRoles(roles, n);
    st.started = true;
  }
  bool done = true, moved = false;
  uint32_t waitingPeer = 0, waitingPhase = op::kPhaseTail;
  // The reduce role's access check (a twin's copy checks the caller's memory, chan_reduce.h).
  const auto check = [&copy](const void* p, uint64_t bytes, bool write) -> bool {
    return write ? copy(static_cast<char*>(const_cast<void*>(p)), nullptr, bytes, true)
                 : copy(nullptr, static_cast<const char*>(p), bytes, false);
  };
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t s = 0; s < (roles[i].kind == kReduce ? 1 : roles[i].split); ++s) {
      if (roles[i].kind == kFeed) continue;  // read in place by the reduce role
      uint32_t peer = roles[i].peer;
      const StepStatus r = roles[i].kind == kReduce
                               ? reduceStep(roles[i], roles, roles[i].ntasks, check, &peer)
                               : stepSubRing(roles[i], s, copy);
      if (r == kCorrupt) {
        op::reportTimeout(words, peer, op::kPhaseSlot);
        return op::kTimedOut;
      }
      if (r == kFinished) continue;
      done = false;
      moved = moved || r == kProgress;
      if (r != kProgress)
        waitingPeer = peer, waitingPhase = r == kNoCredit ? op::kPhaseHead : op::kPhaseTail;
    }
  if (done) return op::kReady;
  if (moved) {
    st.w = op::Wait{};
    return op::kPending;
  }
  // Nothing moved: the wait's rules (abort word, timeout without progress) on a value that
  // stays put until a slot moves.
  return op::pollPending(st.w, 0, words, nowNs, timeoutNs, waitingPeer, waitingPhase);
}

}  // namespace chan
}  // namespace fusco
