// The bookkeeping of one remote pair of the network bridge (net_bridge.h), without a transport or
// a stream, so every rule of it is tested on its own:
//  - what this rank still owes the peer: a "ready" post to pass on, and for each "done" post of its
//    stream the rows of that operation (a shipment), cut into slices of at most one channel slot,
//    then the "done" itself;
//  - where the peer's rows land: one landing per operation, filled slice by slice in order and
//    complete exactly when the peer's "done" for it arrives.
// Posts are 32-bit counters that only grow (they wrap); a shipment or landing is registered for
// every operation the pair shares, in operation order, before the stream can post for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

namespace fusco {

class BridgeLedger {
 public:
  struct Shipment {
    const char* data = nullptr;
    size_t bytes = 0;
  };
  struct Landing {
    char* data = nullptr;
    size_t bytes = 0;
  };
  // What goes on the wire next: nothing, a ready post, a slice of the front shipment, or the done
  // post that ends it.
  enum class Kind { None, Ready, Slice, Done };
  struct Step {
    Kind kind = Kind::None;
    uint32_t value = 0;  // the post (Ready, Done)
    const char* data = nullptr;
    size_t bytes = 0;  // the slice (Slice)
  };

  // One operation the pair shares: this rank ships `s` after its stream's next done post, and the
  // peer's next done lands in `l`. posted false: the stream never posts this operation's done on
  // the bridge's words (a captured operation, refused): its done goes out, empty, once it is
  // first in line, so the counters of both sides stay paired.
  void expect(Shipment s, Landing l, bool posted = true);
  // The next step, given the values of this rank's ready and done posts so far (the outbox words)
  // and the channel's slot size. Done posts beyond the registered shipments wait (none is due).
  Step next(uint32_t readyPosted, uint32_t donePosted, size_t slotBytes) const;
  // The step went out.
  void sent(const Step& s);
  // Something posted is not out yet, or a shipment is registered whose done is still to come.
  bool owes(uint32_t readyPosted, uint32_t donePosted) const;

  // A slice from the peer: into the front landing. False (and *why) when it does not fit.
  bool onSlice(const void* buf, size_t len, std::string* why);
  // The peer's done post: its landing must be complete. False (and *why) otherwise. With `early`,
  // a done that comes before this rank registered its operation is kept (*early true) instead:
  // a peer's refused operation needs no stream work, so its empty done may run ahead of this
  // rank's resolve. applyEarlyDone then completes the landing once it is registered.
  bool onDone(uint32_t value, std::string* why, bool* early = nullptr);
  // After expect: 1 and *value when a kept done completes the front landing (the caller raises
  // the done word to it), 0 when none is kept, -1 (*why) when the landing expects rows.
  int applyEarlyDone(uint32_t* value, std::string* why);
  size_t landingsPending() const { return landings_.size(); }
  size_t shipmentsPending() const { return shipments_.size(); }

 private:
  struct Cursor {
    Shipment s;
    size_t off = 0;
    bool posted = true;
  };
  std::deque<Cursor> shipments_;
  struct Open {
    Landing l;
    size_t landed = 0;
  };
  std::deque<Open> landings_;
  std::deque<uint32_t> earlyDones_;
  uint32_t readySent_ = 0, doneSent_ = 0;
};

}  // namespace fusco
