#include "engine/engine_wire.h"

#include <cstring>

namespace fusco {

namespace {

constexpr uint32_t kHeaderMagic = 0x46534831;  // "FSH1"
constexpr uint32_t kVerdictMagic = 0x46535631;

struct Writer {
  char* p;
  size_t cap, len = 0;
  bool ok = true;
  void put(const void* v, size_t n) {
    if (len + n > cap) {
      ok = false;
      return;
    }
    memcpy(p + len, v, n);
    len += n;
  }
  template <typename T>
  void pod(T v) {
    put(&v, sizeof(v));
  }
};

struct Reader {
  const char* p;
  size_t len, pos = 0;
  bool ok = true;
  void get(void* v, size_t n) {
    if (pos + n > len) {
      ok = false;
      return;
    }
    memcpy(v, p + pos, n);
    pos += n;
  }
  template <typename T>
  T pod() {
    T v{};
    get(&v, sizeof(v));
    return v;
  }
};

void putVec(Writer& w, const std::vector<uint64_t>& v) {
  w.pod<uint32_t>(static_cast<uint32_t>(v.size()));
  if (!v.empty()) w.put(v.data(), v.size() * sizeof(uint64_t));
}

bool getVec(Reader& r, std::vector<uint64_t>* v, size_t maxCount) {
  uint32_t n = r.pod<uint32_t>();
  if (!r.ok || n > maxCount) return false;
  v->resize(n);
  if (n) r.get(v->data(), n * sizeof(uint64_t));
  return r.ok;
}

}  // namespace

bool encodeHeader(const PairHeader& h, void* buf, size_t cap, size_t* len) {
  Writer w{static_cast<char*>(buf), cap};
  w.pod(kHeaderMagic);
  w.pod(static_cast<uint32_t>(h.kind));
  w.pod(h.call);
  w.pod(h.seq);
  w.pod(h.status);
  w.pod(h.onStream);
  putVec(w, h.sendBytes);
  putVec(w, h.recvBytes);
  putVec(w, h.recvTokens);
  putVec(w, h.recvExtents);
  putVec(w, h.sendTokens);
  putVec(w, h.sendExtents);
  putVec(w, h.agree);
  *len = w.len;
  return w.ok;
}

size_t encodedHeaderBytes(const PairHeader& h) {
  const size_t fixed = sizeof(kHeaderMagic) + sizeof(uint32_t) + sizeof(h.call) + sizeof(h.seq) +
                       sizeof(h.status) + sizeof(h.onStream);
  size_t bytes = fixed;
  for (const std::vector<uint64_t>* v : {&h.sendBytes, &h.recvBytes, &h.recvTokens, &h.recvExtents,
                                         &h.sendTokens, &h.sendExtents, &h.agree})
    bytes += sizeof(uint32_t) + v->size() * sizeof(uint64_t);
  return bytes;
}

bool decodeHeader(const void* buf, size_t len, PairHeader* h) {
  Reader r{static_cast<const char*>(buf), len};
  if (r.pod<uint32_t>() != kHeaderMagic || !r.ok) return false;
  h->kind = static_cast<OpKind>(r.pod<uint32_t>());
  h->call = r.pod<uint64_t>();
  h->seq = r.pod<uint64_t>();
  h->status = r.pod<int32_t>();
  h->onStream = r.pod<uint32_t>();
  size_t maxCount = len / sizeof(uint64_t);
  return getVec(r, &h->sendBytes, maxCount) && getVec(r, &h->recvBytes, maxCount) &&
         getVec(r, &h->recvTokens, maxCount) && getVec(r, &h->recvExtents, maxCount) &&
         getVec(r, &h->sendTokens, maxCount) && getVec(r, &h->sendExtents, maxCount) &&
         getVec(r, &h->agree, maxCount) && h->recvTokens.size() == h->recvBytes.size() &&
         h->recvExtents.size() == h->recvBytes.size() &&
         (h->sendTokens.empty() || h->sendTokens.size() == h->sendBytes.size()) &&
         h->sendExtents.size() == h->sendTokens.size();
}

bool pairInStep(const PairHeader& mine, const PairHeader& theirs, int peer, std::string* why) {
  if (mine.call == theirs.call && mine.seq == theirs.seq) return true;
  *why = "rank " + std::to_string(peer) + " is out of step with this rank: it is in call #" +
         std::to_string(theirs.call) + " (operation #" + std::to_string(theirs.seq) +
         " of the pair), this rank in call #" + std::to_string(mine.call) + " (operation #" +
         std::to_string(mine.seq) + ")";
  return false;
}

bool valuesAgree(const std::vector<AgreeValue>& mine, const std::vector<uint64_t>& theirs, int me,
                 int peer, std::string* why) {
  auto show = [](const AgreeValue& v, uint64_t x) {
    return v.show != nullptr ? v.show(x) : std::to_string(x);
  };
  if (theirs.size() != mine.size()) {
    *why = "rank " + std::to_string(peer) + " agrees on " + std::to_string(theirs.size()) +
           " call values, rank " + std::to_string(me) + " on " + std::to_string(mine.size());
    return false;
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    if (mine[i].value == theirs[i]) continue;
    *why = std::string(mine[i].name) + " differs between ranks: rank " + std::to_string(peer) +
           " passed " + show(mine[i], theirs[i]) + ", rank " + std::to_string(me) + " passed " +
           show(mine[i], mine[i].value) + " (every rank must pass the same)";
    return false;
  }
  return true;
}

bool encodeVerdict(const Verdict& v, void* buf, size_t cap, size_t* len) {
  Writer w{static_cast<char*>(buf), cap};
  w.pod(kVerdictMagic);
  w.pod(v.status);
  w.pod(v.culprit);
  std::string m = v.message.substr(0, 512);
  w.pod<uint32_t>(static_cast<uint32_t>(m.size()));
  w.put(m.data(), m.size());
  *len = w.len;
  return w.ok;
}

bool decodeVerdict(const void* buf, size_t len, Verdict* v) {
  Reader r{static_cast<const char*>(buf), len};
  if (r.pod<uint32_t>() != kVerdictMagic || !r.ok) return false;
  v->status = r.pod<int32_t>();
  v->culprit = r.pod<int32_t>();
  uint32_t n = r.pod<uint32_t>();
  if (!r.ok || n > 512) return false;
  v->message.resize(n);
  if (n) r.get(&v->message[0], n);
  return r.ok;
}

}  // namespace fusco
