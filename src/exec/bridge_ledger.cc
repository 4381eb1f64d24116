#include "exec/bridge_ledger.h"

#include <algorithm>
#include <cstring>

#include "core/seq_compare.h"

namespace fusco {

namespace {
// Dones kept ahead of this rank's operations: one per refused operation the peer ran ahead by.
constexpr size_t kMaxEarlyDones = 4096;
}  // namespace

void BridgeLedger::expect(Shipment s, Landing l, bool posted) {
  shipments_.push_back({s, 0, posted});
  landings_.push_back({l, 0});
}

BridgeLedger::Step BridgeLedger::next(uint32_t readyPosted, uint32_t donePosted,
                                      size_t slotBytes) const {
  Step st;
  if (seqAfter(readyPosted, readySent_)) {
    st.kind = Kind::Ready;
    st.value = readyPosted;
    return st;
  }
  if (shipments_.empty()) return st;
  const Cursor& c = shipments_.front();
  if (c.posted && !seqAfter(donePosted, doneSent_)) return st;
  if (c.off < c.s.bytes) {
    st.kind = Kind::Slice;
    st.data = c.s.data + c.off;
    st.bytes = std::min(slotBytes, c.s.bytes - c.off);
    return st;
  }
  st.kind = Kind::Done;
  st.value = doneSent_ + 1;
  return st;
}

void BridgeLedger::sent(const Step& s) {
  switch (s.kind) {
    case Kind::Ready:
      readySent_ = s.value;
      break;
    case Kind::Slice:
      shipments_.front().off += s.bytes;
      break;
    case Kind::Done:
      doneSent_ = s.value;
      shipments_.pop_front();
      break;
    case Kind::None:
      break;
  }
}

bool BridgeLedger::owes(uint32_t readyPosted, uint32_t donePosted) const {
  (void)donePosted;  // a post without a registered shipment is not due (see next)
  return seqAfter(readyPosted, readySent_) || !shipments_.empty();
}

bool BridgeLedger::onSlice(const void* buf, size_t len, std::string* why) {
  if (landings_.empty()) {
    *why = "rows for an operation this rank has not resolved";
    return false;
  }
  Open& o = landings_.front();
  if (len == 0 || len > o.l.bytes - o.landed) {
    *why = "a slice of " + std::to_string(len) + " bytes where " +
           std::to_string(o.l.bytes - o.landed) + " of " + std::to_string(o.l.bytes) + " remained";
    return false;
  }
  std::memcpy(o.l.data + o.landed, buf, len);
  o.landed += len;
  return true;
}

bool BridgeLedger::onDone(uint32_t value, std::string* why, bool* early) {
  if (landings_.empty() && early != nullptr && earlyDones_.size() < kMaxEarlyDones) {
    earlyDones_.push_back(value);
    *early = true;
    return true;
  }
  if (early != nullptr) *early = false;
  if (landings_.empty()) {
    *why =
        "a done post (" + std::to_string(value) + ") for an operation this rank has not resolved";
    return false;
  }
  const Open& o = landings_.front();
  if (o.landed != o.l.bytes) {
    *why = "a done post after " + std::to_string(o.landed) + " of " + std::to_string(o.l.bytes) +
           " bytes";
    return false;
  }
  landings_.pop_front();
  return true;
}

int BridgeLedger::applyEarlyDone(uint32_t* value, std::string* why) {
  if (earlyDones_.empty() || landings_.empty()) return 0;
  const Open& o = landings_.front();
  if (o.landed != o.l.bytes) {
    *why = "a done post (" + std::to_string(earlyDones_.front()) + ") before the " +
           std::to_string(o.l.bytes) + " bytes of its operation";
    return -1;
  }
  *value = earlyDones_.front();
  earlyDones_.pop_front();
  landings_.pop_front();
  return 1;
}

}  // namespace fusco
