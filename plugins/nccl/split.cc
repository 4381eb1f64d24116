// Standalone communicators: init over a unique id, and ncclCommSplit over the parent fusco
// communicator. A split is two host all-gathers on the parent (fuscoCommHostAllGather: host
// memory, no CUDA call, whatever the comm's memory): every rank's (color, key), then each new
// root's fresh unique id; then each color inits its own fusco communicator (new rank = position
// by key, ties by parent rank, as NCCL orders them).
#include <string.h>

#include <algorithm>

#include "shim.h"

namespace fnccl {
namespace {

ncclResult_t makeComm(ncclComm_t* out, int nranks, const fuscoUniqueId& id, int rank,
                      fuscoMemType_t mem, const char* call) {
  int device = mem == fuscoMemCuda ? currentDevice() : -1;
  fuscoConfig_t cfg = fuscoConfigFor(mem, device);
  fuscoComm_t fc = nullptr;
  ncclResult_t r = fromFusco(nullptr, fuscoCommInitRankConfig(&fc, nranks, id, rank, &cfg), call);
  if (r != ncclSuccess) return r;
  CommRef c = std::make_shared<Comm>();
  c->fc = fc;
  c->memType = mem;
  c->cudaDevice = device;
  fuscoCommUserRank(fc, &c->rank);
  fuscoCommCount(fc, &c->nranks);
  Comm* raw = c.get();
  *out = registerComm(std::move(c));
  logServed(raw);
  return ncclSuccess;
}

}  // namespace

ncclResult_t standaloneInit(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank,
                            const ncclConfig_t* config, const char* call) {
  if (comm == nullptr) return fail(nullptr, ncclInvalidArgument, "%s: comm is NULL", call);
  if (group().depth > 0)
    return noteGroupError(
        fail(nullptr, ncclInvalidUsage,
             "%s inside ncclGroupStart/ncclGroupEnd is not served by fusco (one process per "
             "rank): call it outside the group",
             call));
  fuscoUniqueId fid;
  memcpy(&fid, &id, sizeof(fid));
  return makeComm(comm, nranks, fid, rank, commMemType(), call);
}

ncclResult_t standaloneSplit(Comm* parent, int color, int key, ncclComm_t* newcomm,
                             ncclResult_t refused) {
  const int n = parent->nranks;
  // A rank with bad arguments still joins both exchanges, in no new communicator, so its peers
  // finish their split instead of waiting for it, and no later call on the parent pairs with them.
  ncclResult_t bad = refused;
  if (bad != ncclSuccess) {
    // the caller recorded the message; the parent keeps it too
    fail(parent, bad, "%s", threadLastError());
  } else if (newcomm == nullptr)
    bad = fail(parent, ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  else if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    bad = fail(parent, ncclInvalidArgument, "ncclCommSplit: color %d is negative", color);
  if (bad != ncclSuccess) color = NCCL_SPLIT_NOCOLOR;
  const int32_t mine[2] = {color, key};
  std::vector<int32_t> all(2 * static_cast<size_t>(n));
  ncclResult_t r =
      fromFusco(parent, fuscoCommHostAllGather(parent->fc, mine, all.data(), sizeof(mine)),
                "ncclCommSplit (exchanging colors)");
  if (r != ncclSuccess) return r;
  // Members of each rank's color, ordered by key then parent rank; the first is the new root.
  auto membersOf = [&](int col) {
    std::vector<int> m;
    for (int p = 0; p < n; ++p)
      if (all[2 * p] == col) m.push_back(p);
    std::stable_sort(m.begin(), m.end(),
                     [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
    return m;
  };
  std::vector<int> members = color == NCCL_SPLIT_NOCOLOR ? std::vector<int>() : membersOf(color);
  const bool root = !members.empty() && members[0] == parent->rank;
  fuscoUniqueId id;  // a root's new id; the others give zeros, which no one reads
  memset(&id, 0, sizeof(id));
  std::vector<fuscoUniqueId> got(n);
  if (root) {
    r = fromFusco(parent, fuscoGetUniqueId(&id), "ncclCommSplit (making the new id)");
    // A failure here still joins the exchange below, with an id that init will refuse.
    if (r != ncclSuccess) memset(&id, 0, sizeof(id));
  }
  ncclResult_t xr =
      fromFusco(parent, fuscoCommHostAllGather(parent->fc, &id, got.data(), sizeof(id)),
                "ncclCommSplit (sending the new id)");
  if (bad != ncclSuccess) return bad;
  if (r != ncclSuccess || xr != ncclSuccess) return r != ncclSuccess ? r : xr;
  if (color == NCCL_SPLIT_NOCOLOR) {
    *newcomm = nullptr;
    return ncclSuccess;
  }
  const int newRank =
      static_cast<int>(std::find(members.begin(), members.end(), parent->rank) - members.begin());
  return makeComm(newcomm, static_cast<int>(members.size()), got[members[0]], newRank,
                  parent->memType, "ncclCommSplit");
}

}  // namespace fnccl
