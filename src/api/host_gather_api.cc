// fuscoCommHostAllGather: setup data (split colours, unique ids) between the ranks of a comm over
// its bootstrap, in host memory on every kind of comm: no device memory, no stream, no CUDA call.
#include <cstring>
#include <string>
#include <vector>

#include "api/api_internal.h"
#include "core/bootstrap.h"
#include "core/log.h"

using namespace fusco;

namespace {

constexpr size_t kMaxHostGatherBytes = size_t{1} << 20;
// Every message starts with this tag, so a rank in another bootstrap collective of the comm (a
// low-latency create or destroy) is told so instead of reading its bytes as data.
constexpr const char* kTag = "hostallgather ";

// What this rank contributes: "+" and its bytes, or "-" and why its arguments are refused (it
// still joins, so that its peers fail at once rather than at the timeout).
std::string contribution(const void* sendbuf, void* recvbuf, size_t bytes, const char* fn) {
  if (bytes > kMaxHostGatherBytes)
    return std::string("-") + fn + ": bytes (" + std::to_string(bytes) + ") is over " +
           std::to_string(kMaxHostGatherBytes);
  if (bytes > 0 && (sendbuf == nullptr || recvbuf == nullptr))
    return std::string("-") + fn + ": sendbuf and recvbuf must be non-NULL when bytes > 0";
  std::string m = "+";
  m.append(static_cast<const char*>(sendbuf), bytes);
  return m;
}

// Checks every rank's message, in rank order (so that every rank names the same one at fault);
// fills recvbuf when all of them gave `bytes` bytes.
fuscoResult_t unpack(Communicator& c, const std::vector<std::string>& all, size_t bytes,
                     void* recvbuf, const char* fn) {
  const size_t tag = strlen(kTag);
  for (int p = 0; p < c.nranks(); ++p) {
    const std::string& m = all[p];
    if (m.compare(0, tag, kTag) != 0) {
      const fuscoResult_t r = FUSCO_FAIL(
          fuscoInvalidUsage, kApi,
          "%s: rank %d is in another collective of the comm's setup (a low-latency create or "
          "destroy) while rank %d gathers; the communicator cannot be used any more",
          fn, p, c.rank());
      c.markBroken(r, threadLastError());
      return r;
    }
    if (m[tag] == '-')
      return FUSCO_FAIL(fuscoInvalidArgument, kApi, "%s: rank %d refused its arguments: %s", fn, p,
                        m.c_str() + tag + 1);
  }
  for (int p = 0; p < c.nranks(); ++p)
    if (all[p].size() - tag - 1 != bytes)
      return FUSCO_FAIL(fuscoInvalidArgument, kApi,
                        "%s: rank %d gives %zu bytes, rank %d %zu; every rank must give the same",
                        fn, p, all[p].size() - tag - 1, c.rank(), bytes);
  for (int p = 0; p < c.nranks(); ++p)
    if (bytes > 0) memcpy(static_cast<char*>(recvbuf) + p * bytes, all[p].data() + tag + 1, bytes);
  return fuscoSuccess;
}

}  // namespace

extern "C" fuscoResult_t fuscoCommHostAllGather(fuscoComm_t comm, const void* sendbuf,
                                                void* recvbuf, size_t bytes) {
  constexpr const char* fn = "fuscoCommHostAllGather";
  return guarded(comm, fn, [&]() -> fuscoResult_t {
    FUSCO_CHECK(checkComm(comm, fn));
    Communicator& c = implOf(comm);
    FUSCO_CHECK(c.checkUsable(fn));
    const std::string mine = kTag + contribution(sendbuf, recvbuf, bytes, fn);
    std::vector<std::string> all;
    fuscoResult_t r = c.bootstrap().allGather(mine, &all);
    if (r != fuscoSuccess) {
      c.markBroken(r, threadLastError());  // the ranks' bootstrap rounds are no longer in step
      return r;
    }
    return unpack(c, all, bytes, recvbuf, fn);
  });
}
