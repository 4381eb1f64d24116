// The table of an operation's ring roles (chan_roles.h): one role per direction of a pair whose
// messages go through its channel, and the combine's reduce role (chan_reduce.h), written by the
// progress thread into the operation's parameter block and read by its ring step.
#pragma once

#include <cstdint>

#include "device/chan_steps.h"

namespace fusco {
namespace chan {

// One role (in the operation's parameter block; addresses are the stream's).
struct Role {
  uint32_t kind;     // RoleKind: kConsume, kProduce, kFeed or kReduce
  uint32_t peer;     // the other rank (a timeout names it)
  uint32_t ntasks;   // messages (DevCopyTask, one per message)
  uint32_t split;    // sub-rings
  uint64_t tasks;    // DevCopyTask[ntasks]: a send's sources, a receive's destinations
  uint64_t slots;    // the pair's first slot (in the consumer's area)
  uint64_t tails;    // uint64_t[split], in the consumer's area
  uint64_t heads;    // uint64_t[split], in the producer's area
  uint64_t cursors;  // ProducerCursor[split] or ConsumerCursor[split], this rank's own state
  uint64_t epoch;    // uint64_t, this rank's count of this direction's operations
  uint64_t slotBytes;
  uint32_t depth;
  uint32_t pad;
};

// What a role does. A feed is a consumer whose slots the reduce role reads in place
// (chan_reduce.h): it is started as a consumer and never stepped itself. The reduce role's
// `tasks` is its ReduceArgs and `ntasks` the comm's ranks; it comes after every feed.
enum RoleKind : uint32_t { kConsume = 0, kProduce = 1, kFeed = 2, kReduce = 3 };

// The roles of one operation: a count, then the roles.
struct RoleTable {
  uint32_t count;
  uint32_t pad[3];
};
FUSCO_HD inline Role* rolesOf(char* table) { return reinterpret_cast<Role*>(table + 16); }

FUSCO_HD inline Ring ringOf(const Role& r, uint32_t s) {
  Ring ring;
  ring.d = RingDims{r.split, r.depth, r.slotBytes};
  ring.slots = subRingSlots(reinterpret_cast<char*>(r.slots), ring.d, s);
  ring.tail = reinterpret_cast<uint64_t*>(r.tails) + s;
  ring.head = reinterpret_cast<uint64_t*>(r.heads) + s;
  return ring;
}

}  // namespace chan
}  // namespace fusco
