// Process groups for the transport tests: forked ranks exchange setup blobs through pipes (via the
// parent), connect, and then run a body that talks through one transport's ops table only. Which
// transport, and how its ranks are laid out, is a TransportKind (transport_kinds.h), so the
// conformance suite runs the same bodies over every transport. Children report failures on stderr
// (CHILD_CHECK) and through their exit code; every wait has a deadline. Processes, not threads: the
// transports map memory between processes, CUDA IPC needs one process per rank, and a fault test
// must be able to SIGKILL a rank.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/result.h"
#include "core/topology.h"
#include "harness/transport_kinds.h"
#include "transport/transport.h"

namespace fusco::test::transport {

constexpr int kTimeoutMs = 30000;  // any single wait, and every rank's ctx.timeoutMs; a healthy
                                   // test takes well under a second even on a loaded machine

extern int gRank;  // rank of this process, for messages

// In a child's body: on failure, prints the rank, file:line, condition, message and last error,
// and returns 1 from the body (its exit code).
#define CHILD_CHECK(cond, ...)                                                                 \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "[transport test rank %d pid %d] %s:%d: check failed: %s: ",             \
              ::fusco::test::transport::gRank, static_cast<int>(getpid()), __FILE__, __LINE__, \
              #cond);                                                                          \
      fprintf(stderr, __VA_ARGS__);                                                            \
      fprintf(stderr, " (last error: %s)\n", ::fusco::threadLastError().c_str());              \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

struct Options {
  const TransportKind* kind = &shmKind();
  int nranks = 2;
  bool parentIsRank0 = false;   // the test process itself is rank 0 (liveness tests)
  bool exitAfterSetup = false;  // children publish their blob and exit (connect failure test)
  size_t chunkBytes = 4096;
  int depth = 3;
  int victim = -1;        // killed by the parent once every rank reached the body's first barrier
  bool knownPids = true;  // false: peers' pids unknown, so only the transport can notice a death
};

// One rank's view.
struct RankEnv {
  int rank = 0;
  int nranks = 0;
  const TransportOps* ops = nullptr;
  std::vector<PeerInfo> infos;
  NodeMap nodes;
  TransportContext ctx;
  std::vector<int> peers;
  TransportComm* tc = nullptr;  // a body may close it itself and set it to nullptr
  int fdsBeforeSetup = -1;      // open file descriptors before setup (children only)
  int toParent = -1;            // children only
  int fromParent = -1;          // children only

  // Children: wait until every rank reached the same barrier (the parent coordinates). Keeps
  // stepping the transport while it waits, as the engine does: a message this rank posted last may
  // still need its sender's progress (UCX rendezvous) while a peer waits for it. step false: a
  // rank that does not touch the transport meanwhile.
  bool barrier(bool step = true);
};

// Fills e for rank of pids.size() ranks on this host (o's transport kind, chunk size and depth);
// e->peers are the ranks the transport scores as reachable.
void buildEnv(RankEnv* e, int rank, const std::vector<pid_t>& pids, const Options& o);

// Open file descriptors of this process.
int openFdCount();

using Body = std::function<int(RankEnv&)>;

// Forks the child ranks, relays blobs and barriers, and reaps them with a deadline.
class Group {
 public:
  ~Group() { killAll(); }

  // Forks ranks [first, nranks) running body. Returns false if forking failed.
  bool start(const Options& o, const Body& body);

  pid_t pid(int rank) const { return pids_[rank]; }
  const std::vector<pid_t>& pids() const { return pids_; }

  // Gathers every child's blob (plus ownBlob as rank 0 if the parent is a rank), then sends
  // them all to every child. *blobs gets the full list.
  bool exchangeBlobs(const std::string& ownBlob, std::vector<std::string>* blobs);
  // One barrier round: every child sent 'B' -> all get 'G'. false if a child left instead.
  bool barrier();
  // Serves barriers until every child closed its pipe (finished), then reaps them all. Kills
  // o.victim once the body's first barrier is served. Returns each child's exit status (-1: killed
  // or timed out).
  std::vector<int> finish();
  // Waits (with deadline) for child `rank` to exit without reaping it (it stays a zombie).
  bool waitZombie(int rank);
  // Reaps one child; returns its exit status or -1 (signal or timeout).
  int reapOne(int rank);

 private:
  int childMain(int rank, int toParent, int fromParent, const Body& body);
  int childRun(RankEnv& e, const Body& body, const std::vector<std::string>& blobs);
  void closeDown();
  std::vector<int> reap(const Deadline& d);
  void killAll();

  Options opts_;
  std::vector<pid_t> pids_;
  std::vector<int> up_;    // child -> parent, read ends
  std::vector<int> down_;  // parent -> child, write ends
  std::set<int> reaped_;
};

// Runs body in o.nranks forked children (the parent only relays) and expects all but o.victim to
// succeed.
void runChildren(const Options& o, const Body& body);

// The parent is rank 0 and watches child rank 1 through checkPeer. Host transports only (the
// parent sets the transport up in the test process itself).
struct WatchedChild {
  Group g;
  RankEnv self;
  Options o;

  // Forks rank 1 running body, connects the parent as rank 0 and passes the post-connect barrier.
  bool start(const Body& body);
  // Polls checkPeer(1) until it fails (at most kTimeoutMs).
  fuscoResult_t waitForFailure();
  ~WatchedChild();
};

}  // namespace fusco::test::transport
