// The GPU planner's steps (src/device/plan_steps.h) for every rank of a problem in one process,
// with the host planner (src/plan/moe_plan.h) as the reference: the cases and the comparison are
// shared by the host twin's unit test and the kernels' [gpu] test, which differ only in the
// executor X that holds the buffers and runs the steps:
//   char* X::alloc(bytes)                 a buffer the steps can use, poisoned
//   void X::toDevice(dst, src, bytes)     host -> buffer
//   void X::toHost(dst, src, bytes)       buffer -> host (after every step enqueued so far)
//   void X::send(SendArgs), X::recv(RecvArgs), X::terms(SendArgs, const int64_t* remoteFan)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "device/device_plan_ops.h"
#include "harness/moe_cases.h"
#include "harness/moe_reference.h"
#include "plan/moe_plan.h"

namespace fusco {
namespace test {

struct GpuPlanCase {
  std::string name;
  MoeCase moe;
  Dedup dedup = Dedup::Rank;
  uint64_t salt = 0;
  uint64_t entrySlack = 0;  // receive side sized for this many entries more than arrive
};
std::vector<GpuPlanCase> gpuPlanCases();

// One rank's send side alone (invalid routing checks).
class GpuPlanSendOnly {
 public:
  GpuPlanSendOnly(const MoeShape& shape, const int64_t* topkIdx, size_t numTokens, int topk,
                  Dedup dedup);
  template <typename X>
  void execute(X& x);
  unsigned long long badSlot() const;
  // True when no list of the send side was written (the buffer outside the work arrays is still
  // the poison).
  bool listsUntouched() const;

 private:
  friend class GpuPlanRun;
  template <typename X>
  void enqueue(X& x, const int32_t* rankOf, const int32_t* localOf);
  template <typename X>
  void download(X& x);

  const MoeShape& shape_;
  std::vector<int64_t> topk_;
  size_t numTokens_;
  int k_;
  Dedup dedup_;
  gplan::SendArgs dev_;      // pointers into the executor's buffer
  std::vector<char> image_;  // the buffer, downloaded
  gplan::SendArgs host_;     // the same arrays in image_
  char* base_ = nullptr;
  size_t bytes_ = 0;
};

class GpuPlanRun {
 public:
  GpuPlanRun(const MoeRefProblem& p, Dedup dedup, uint64_t entrySlack);
  // Sizes every receive side for at most maxEntries entries, however many arrive.
  void capEntries(uint64_t maxEntries) { cap_ = maxEntries; }
  template <typename X>
  void execute(X& x);
  // "" when every list of every rank equals the host planner's; else the first difference.
  std::string compareWithHostPlanner() const;
  uint32_t recvErrors(int r) const;
  bool fanRowsUntouched(int r) const;

 private:
  struct Recv {
    gplan::RecvArgs dev, host;
    std::vector<char> image;
    char* base = nullptr;
    size_t bytes = 0;
    uint64_t entries = 0;  // that arrive
  };
  template <typename X>
  void enqueueRecv(X& x, int r);
  template <typename X>
  void enqueueTerms(X& x, int s);
  uint32_t rowsTo(int s, int r) const;
  uint32_t slotsTo(int s, int r) const;
  std::string compareSend(int s) const;
  std::string compareRecv(int r) const;
  std::string compareTerms(int s) const;

  const MoeRefProblem& p_;
  Dedup dedup_;
  uint64_t slack_, cap_ = ~0ull;
  MoeShape shape_;
  std::vector<int32_t> rankOf_, localOf_;
  std::vector<GpuPlanSendOnly> send_;
  std::vector<Recv> recv_;
};

template <typename X>
void GpuPlanSendOnly::enqueue(X& x, const int32_t* rankOf, const int32_t* localOf) {
  bytes_ = carvePlanSend(nullptr, numTokens_, static_cast<uint32_t>(k_),
                         static_cast<uint32_t>(shape_.nranks), &dev_);
  base_ = x.alloc(bytes_ + topk_.size() * sizeof(int64_t));
  carvePlanSend(base_, numTokens_, static_cast<uint32_t>(k_), static_cast<uint32_t>(shape_.nranks),
                &dev_);
  int64_t* topk = reinterpret_cast<int64_t*>(base_ + bytes_);
  x.toDevice(topk, topk_.data(), topk_.size() * sizeof(int64_t));
  dev_.topkIdx = topk;
  dev_.numTokens = numTokens_;
  dev_.topk = static_cast<uint32_t>(k_);
  dev_.rankOf = rankOf;
  dev_.localOf = localOf;
  dev_.numExperts = shape_.numExperts;
  dev_.nranks = static_cast<uint32_t>(shape_.nranks);
  dev_.perRank = dedup_ != Dedup::None;
  x.send(dev_);
}

template <typename X>
void GpuPlanSendOnly::download(X& x) {
  image_.resize(bytes_);
  x.toHost(image_.data(), base_, bytes_);
  host_ = dev_;
  carvePlanSend(image_.data(), numTokens_, static_cast<uint32_t>(k_),
                static_cast<uint32_t>(shape_.nranks), &host_);
}

template <typename X>
void GpuPlanSendOnly::execute(X& x) {
  std::vector<int32_t> tables(2 * static_cast<size_t>(shape_.numExperts));
  for (int e = 0; e < shape_.numExperts; ++e) {
    tables[e] = shape_.expertToRank[e];
    tables[shape_.numExperts + e] = shape_.localIndexOf[e];
  }
  int32_t* dev = reinterpret_cast<int32_t*>(x.alloc(tables.size() * sizeof(int32_t)));
  x.toDevice(dev, tables.data(), tables.size() * sizeof(int32_t));
  enqueue(x, dev, dev + shape_.numExperts);
  download(x);
}

template <typename X>
void GpuPlanRun::enqueueRecv(X& x, int r) {
  const int n = p_.nranks;
  Recv& rv = recv_[r];
  uint64_t rows = 0;
  std::vector<uint64_t> ptrs(2 * n);
  std::vector<uint32_t> rowsFrom(n);
  for (int s = 0; s < n; ++s) {
    const gplan::SendArgs& d = send_[s].dev_;
    const gplan::SendArgs& h = send_[s].host_;
    rowsFrom[s] = rowsTo(s, r);
    rows += rowsFrom[s];
    rv.entries += slotsTo(s, r);
    ptrs[s] = reinterpret_cast<uintptr_t>(d.kStart + h.rowOff[r] + r);
    ptrs[n + s] = reinterpret_cast<uintptr_t>(d.local + h.slotOff[r]);
  }
  const uint64_t maxEntries = std::min(rv.entries + slack_, cap_);
  const uint32_t numLocal = static_cast<uint32_t>(shape_.localExperts[r].size());
  rv.bytes = carvePlanRecv(nullptr, n, numLocal, maxEntries, rows, &rv.dev);
  const size_t extra = ptrs.size() * 8 + rowsFrom.size() * 4;
  rv.base = x.alloc(rv.bytes + extra);
  carvePlanRecv(rv.base, n, numLocal, maxEntries, rows, &rv.dev);
  char* tail = rv.base + rv.bytes;
  x.toDevice(tail, ptrs.data(), ptrs.size() * 8);
  x.toDevice(tail + ptrs.size() * 8, rowsFrom.data(), rowsFrom.size() * 4);
  rv.dev.nranks = static_cast<uint32_t>(n);
  rv.dev.numLocal = numLocal;
  rv.dev.align = static_cast<uint32_t>(shape_.expertAlignment);
  rv.dev.srcKStart = reinterpret_cast<const uint32_t* const*>(tail);
  rv.dev.srcLocal = reinterpret_cast<const int32_t* const*>(tail + n * 8);
  rv.dev.rowsFrom = reinterpret_cast<const uint32_t*>(tail + ptrs.size() * 8);
  x.recv(rv.dev);
}

template <typename X>
void GpuPlanRun::enqueueTerms(X& x, int s) {
  const int n = p_.nranks;
  const gplan::SendArgs& h = send_[s].host_;
  std::vector<int64_t> fan(h.slotOff[n]);
  for (int r = 0; r < n; ++r) {
    const Recv& rv = recv_[r];
    const int64_t* from = rv.host.fanRows + rv.host.entryOff[s];
    std::copy(from, from + slotsTo(s, r), fan.begin() + h.slotOff[r]);
  }
  int64_t* dev = reinterpret_cast<int64_t*>(x.alloc(fan.size() * 8 + 8));
  x.toDevice(dev, fan.data(), fan.size() * 8);
  x.terms(send_[s].dev_, dev);
}

template <typename X>
void GpuPlanRun::execute(X& x) {
  const int n = p_.nranks;
  std::vector<int32_t> tables(rankOf_);
  tables.insert(tables.end(), localOf_.begin(), localOf_.end());
  int32_t* dev = reinterpret_cast<int32_t*>(x.alloc(tables.size() * sizeof(int32_t)));
  x.toDevice(dev, tables.data(), tables.size() * sizeof(int32_t));
  for (int s = 0; s < n; ++s) send_[s].enqueue(x, dev, dev + shape_.numExperts);
  for (int s = 0; s < n; ++s) send_[s].download(x);
  for (int r = 0; r < n; ++r) enqueueRecv(x, r);
  for (int r = 0; r < n; ++r) {
    Recv& rv = recv_[r];
    rv.image.resize(rv.bytes);
    x.toHost(rv.image.data(), rv.base, rv.bytes);
    rv.host = rv.dev;
    carvePlanRecv(rv.image.data(), n, rv.dev.numLocal, rv.dev.maxEntries, rv.dev.maxRows, &rv.host);
  }
  if (cap_ != ~0ull) return;  // overflowed receive sides have no fan rows to hand back
  for (int s = 0; s < n; ++s) enqueueTerms(x, s);
  for (int s = 0; s < n; ++s) send_[s].download(x);
}

}  // namespace test
}  // namespace fusco
