// The plan's index lists on the device for fuscoMemCuda comms: one packed upload per plan
// (stream-ordered; dispatch and combine wait for it), including the terms of combine's sum at the
// source in the fixed order of docs/API.md. A replan uploads into the same buffer when it fits.
#include <algorithm>
#include <cstring>
#include <vector>

#include "moe/moe_exec.h"

namespace fusco {

namespace {

// Places sections in one buffer, each 16-byte aligned.
struct Packer {
  size_t at = 0;
  size_t take(size_t bytes) {
    size_t off = at;
    at += (bytes + 15) / 16 * 16;
    return off;
  }
};

template <typename T>
void put(char* host, size_t off, const std::vector<T>& v) {
  if (!v.empty()) memcpy(host + off, v.data(), v.size() * sizeof(T));
}

// Where each list lies in the packed buffer: per rank, then the padding ranges and the terms.
struct Sections {
  std::vector<size_t> sRows, rFan, sK, rStart, rRows;  // [nranks]
  size_t pad = 0, tstart = 0, trank = 0, trow = 0, twt = 0, tlast = 0, tseq = 0, bytes = 0;
};

void placeSections(const MoeHandle& h, Sections* sec) {
  const int n = h.shape.nranks;
  const MoeSumTerms& st = h.dev.terms;
  Packer pk;
  sec->sRows.resize(n), sec->rFan.resize(n), sec->sK.resize(n);
  sec->rStart.resize(n), sec->rRows.resize(n);
  for (int p = 0; p < n; ++p) {
    sec->sRows[p] = pk.take(h.send.rows[p].size() * 8);
    sec->rFan[p] = pk.take(h.remoteFanRows[p].size() * 8);
    sec->sK[p] = pk.take(h.send.kStart[p].size() * 4);
    sec->rStart[p] = pk.take(h.recv.fanStart[p].size() * 4);
    sec->rRows[p] = pk.take(h.recv.fanRows[p].size() * 8);
  }
  static_assert(sizeof(RowRange) == 16, "a padding range is two int64s on the device");
  sec->pad = pk.take(h.recv.padding.size() * sizeof(RowRange));
  sec->tstart = pk.take(st.start.size() * 4), sec->trank = pk.take(st.rank.size() * 4);
  sec->trow = pk.take(st.row.size() * 8), sec->twt = pk.take(st.weight.size() * 8);
  sec->tlast = pk.take(st.last.size());
  sec->tseq = pk.take(st.seq.size() * 4);
  sec->bytes = pk.at;
}

void fillHost(const MoeHandle& h, const Sections& sec, char* host) {
  const MoeSumTerms& st = h.dev.terms;
  for (int p = 0; p < h.shape.nranks; ++p) {
    put(host, sec.sRows[p], h.send.rows[p]);
    put(host, sec.rFan[p], h.remoteFanRows[p]);
    put(host, sec.sK[p], h.send.kStart[p]);
    put(host, sec.rStart[p], h.recv.fanStart[p]);
    put(host, sec.rRows[p], h.recv.fanRows[p]);
  }
  put(host, sec.pad, h.recv.padding);
  put(host, sec.tstart, st.start);
  put(host, sec.trank, st.rank);
  put(host, sec.trow, st.row);
  put(host, sec.twt, st.weight);
  put(host, sec.tlast, st.last);
  put(host, sec.tseq, st.seq);
}

// The device addresses of the lists (d: the buffer's device side), into h.dev.
void pointDevicePlan(const Sections& sec, const char* d, MoeHandle& h) {
  const int n = h.shape.nranks;
  auto& dv = h.dev;
  dv.sendRows.resize(n), dv.remoteFanRows.resize(n), dv.recvFanRows.resize(n);
  dv.sendKStart.resize(n), dv.recvFanStart.resize(n);
  for (int p = 0; p < n; ++p) {
    dv.sendRows[p] = reinterpret_cast<const int64_t*>(d + sec.sRows[p]);
    dv.remoteFanRows[p] = reinterpret_cast<const int64_t*>(d + sec.rFan[p]);
    dv.sendKStart[p] = reinterpret_cast<const uint32_t*>(d + sec.sK[p]);
    dv.recvFanStart[p] = reinterpret_cast<const uint32_t*>(d + sec.rStart[p]);
    dv.recvFanRows[p] = reinterpret_cast<const int64_t*>(d + sec.rRows[p]);
  }
  dv.paddingRanges = reinterpret_cast<const int64_t*>(d + sec.pad);
  dv.paddingLongest = 0;
  for (const RowRange& r : h.recv.padding) dv.paddingLongest = std::max(dv.paddingLongest, r.count);
  dv.termStart = reinterpret_cast<const uint32_t*>(d + sec.tstart);
  dv.termRank = reinterpret_cast<const uint32_t*>(d + sec.trank);
  dv.termRow = reinterpret_cast<const int64_t*>(d + sec.trow);
  dv.termWeight = reinterpret_cast<const int64_t*>(d + sec.twt);
  dv.termLast = reinterpret_cast<const uint8_t*>(d + sec.tlast);
  dv.termSeq = reinterpret_cast<const uint32_t*>(d + sec.tseq);
}

}  // namespace

fuscoResult_t uploadMoePlan(MoeHandle& h, void* stream) {
  planSumTerms(h.send, h.remoteFanRows, &h.dev.terms);
  Sections sec;
  placeSections(h, &sec);
  // The host side is rewritten once the previous upload's copy is done; the upload waits for the
  // dispatches and combines that read the previous lists (DeviceBuffer::markUsed).
  FUSCO_CHECK(h.devBuffer.reserve(sec.bytes, h.comm->timeoutMs()));
  fillHost(h, sec, h.devBuffer.host());
  FUSCO_CHECK(h.devBuffer.upload(sec.bytes, stream));
  pointDevicePlan(sec, h.devBuffer.device(), h);
  return fuscoSuccess;
}

}  // namespace fusco
