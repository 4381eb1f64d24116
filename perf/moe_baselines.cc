#include "moe_baselines.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "row_reduce.h"

#ifdef FUSCO_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace fusco {
namespace perf {

namespace {

class FuscoExchange : public RowExchange {
 public:
  FuscoExchange(fuscoComm_t comm, int nranks)
      : comm_(comm), sc_(nranks), sd_(nranks), rc_(nranks), rd_(nranks) {}
  bool counts(const int64_t* send, int64_t* recv, size_t perPeer) override {
    return ok(fuscoAllToAll(send, recv, perPeer, fuscoInt64, comm_, nullptr), "fuscoAllToAll");
  }
  bool rows(const void* send, const size_t* sendRows, void* recv, const size_t* recvRows,
            size_t rowBytes) override {
    size_t so = 0, ro = 0;
    for (size_t p = 0; p < sc_.size(); ++p) {  // byte counts: size_t, no overflow
      sc_[p] = sendRows[p] * rowBytes, sd_[p] = so, so += sc_[p];
      rc_[p] = recvRows[p] * rowBytes, rd_[p] = ro, ro += rc_[p];
    }
    return ok(fuscoAllToAllv(send, sc_.data(), sd_.data(), recv, rc_.data(), rd_.data(), fuscoUint8,
                             comm_, nullptr),
              "fuscoAllToAllv");
  }

 private:
  bool ok(fuscoResult_t r, const char* what) {
    if (r == fuscoSuccess) return true;
    error =
        std::string(what) + " failed: " + fuscoGetErrorString(r) + ": " + fuscoGetLastError(comm_);
    return false;
  }
  fuscoComm_t comm_;
  std::vector<size_t> sc_, sd_, rc_, rd_;
};

#ifdef FUSCO_HAVE_MPI
// MPI_Alltoallv with a contiguous row datatype, so counts stay in int range for big rows.
class MpiExchange : public RowExchange {
 public:
  explicit MpiExchange(int nranks) : sc_(nranks), sd_(nranks), rc_(nranks), rd_(nranks) {}
  ~MpiExchange() override {
    if (rowType_ != MPI_DATATYPE_NULL) MPI_Type_free(&rowType_);
  }
  bool counts(const int64_t* send, int64_t* recv, size_t perPeer) override {
    return ok(MPI_Alltoall(send, static_cast<int>(perPeer), MPI_INT64_T, recv,
                           static_cast<int>(perPeer), MPI_INT64_T, MPI_COMM_WORLD),
              "MPI_Alltoall");
  }
  bool rows(const void* send, const size_t* sendRows, void* recv, const size_t* recvRows,
            size_t rowBytes) override {
    if (rowBytes != rowBytes_) {
      if (rowType_ != MPI_DATATYPE_NULL) MPI_Type_free(&rowType_);
      if (rowBytes > INT_MAX ||
          !ok(MPI_Type_contiguous(static_cast<int>(rowBytes), MPI_BYTE, &rowType_),
              "MPI_Type_contiguous") ||
          !ok(MPI_Type_commit(&rowType_), "MPI_Type_commit"))
        return false;
      rowBytes_ = rowBytes;
    }
    long long so = 0, ro = 0;
    for (size_t p = 0; p < sc_.size(); ++p) {
      sc_[p] = static_cast<int>(sendRows[p]), sd_[p] = static_cast<int>(so), so += sc_[p];
      rc_[p] = static_cast<int>(recvRows[p]), rd_[p] = static_cast<int>(ro), ro += rc_[p];
    }
    if (so > INT_MAX || ro > INT_MAX) {
      error = "MPI_Alltoallv: more than INT_MAX rows";
      return false;
    }
    return ok(MPI_Alltoallv(send, sc_.data(), sd_.data(), rowType_, recv, rc_.data(), rd_.data(),
                            rowType_, MPI_COMM_WORLD),
              "MPI_Alltoallv");
  }

 private:
  bool ok(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return true;
    char msg[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    error = std::string(what) + " failed: " + msg;
    return false;
  }
  std::vector<int> sc_, sd_, rc_, rd_;
  MPI_Datatype rowType_ = MPI_DATATYPE_NULL;
  size_t rowBytes_ = 0;
};

std::string findOnPath(const char* name) {
  const char* path = getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t b = 0;
  while (b <= dirs.size()) {
    size_t e = dirs.find(':', b);
    if (e == std::string::npos) e = dirs.size();
    std::string cand = (e > b ? dirs.substr(b, e - b) : std::string(".")) + "/" + name;
    if (access(cand.c_str(), X_OK) == 0) return cand;
    b = e + 1;
  }
  return "";
}

std::vector<char*> cArgs(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(&s[0]);
  out.push_back(nullptr);
  return out;
}

// Runs args (stdout and stderr to /dev/null) for at most timeoutMs; its exit status, or -1.
int runQuietly(const std::string& prog, std::vector<std::string> args, int timeoutMs) {
  std::vector<char*> argv = cArgs(args);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    FILE* devnull = freopen("/dev/null", "w", stdout);
    (void)devnull;
    dup2(fileno(stdout), 2);
    execv(prog.c_str(), argv.data());
    _exit(127);
  }
  if (pid < 0) return -1;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
#endif

}  // namespace

#ifdef FUSCO_HAVE_MPI
void relaunchUnderMpirun(int argc, char** argv, int np, std::string* why) {
  std::string mpirun = findOnPath("mpirun");
  if (mpirun.empty()) {
    *why = "mpirun is not on PATH";
    return;
  }
  char self[4096] = {};
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) {
    *why = std::string("cannot find this binary (/proc/self/exe): ") + strerror(errno);
    return;
  }
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  std::vector<std::string> args = {mpirun, "--oversubscribe",  "--bind-to", "none",
                                   "-np",  std::to_string(np), self};
  std::vector<std::string> probe = args;
  probe.push_back("--mpi-probe");
  int rc = runQuietly(mpirun, probe, 60000);
  if (rc != 0) {
    *why = "mpirun failed to start (`mpirun --oversubscribe -np " + std::to_string(np) + " " +
           self + " --mpi-probe` " +
           (rc < 0 ? "timed out or crashed" : "exited " + std::to_string(rc)) + ")";
    return;
  }
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "-np") == 0 && i + 1 < argc) {
      ++i;
      continue;
    }
    args.push_back(argv[i]);
  }
  std::vector<char*> cargs = cArgs(args);
  fflush(stdout);
  fflush(stderr);
  execv(mpirun.c_str(), cargs.data());
  *why = "execv " + mpirun + ": " + strerror(errno);
}
#endif

std::unique_ptr<RowExchange> makeFuscoExchange(fuscoComm_t comm, int nranks) {
  return std::unique_ptr<RowExchange>(new FuscoExchange(comm, nranks));
}

#ifdef FUSCO_HAVE_MPI
std::unique_ptr<RowExchange> makeMpiExchange(int nranks) {
  return std::unique_ptr<RowExchange>(new MpiExchange(nranks));
}
#endif

bool UnfusedPipeline::plan(const int64_t* topkIdx) {
  const int perRank = numExperts_ / nranks_;
  std::vector<int64_t> count(numExperts_, 0), cursor(numExperts_, 0);
  for (size_t i = 0; i < tokens_ * topk_; ++i)
    if (topkIdx[i] >= 0) ++count[topkIdx[i]];
  size_t total = 0;
  for (int e = 0; e < numExperts_; ++e) cursor[e] = static_cast<int64_t>(total), total += count[e];
  // permute: sorted by expert (stable in token order), so each rank's chunk is expert-major.
  permIdx_.resize(total);
  slotPos_.assign(tokens_ * topk_, -1);
  for (size_t t = 0; t < tokens_; ++t) {
    for (int k = 0; k < topk_; ++k) {
      int64_t e = topkIdx[t * topk_ + k];
      if (e < 0) continue;
      int64_t pos = cursor[e]++;
      permIdx_[pos] = static_cast<int64_t>(t);
      slotPos_[t * topk_ + k] = pos;
    }
  }
  sendTo_.assign(nranks_, 0);
  for (int e = 0; e < numExperts_; ++e) sendTo_[e / perRank] += count[e];
  // Counts per (source, local expert), as Megatron's all-to-all of tokens_per_expert.
  recvCounts_.assign(static_cast<size_t>(nranks_) * perRank, 0);
  if (!ex_->counts(count.data(), recvCounts_.data(), perRank)) return false;
  recvFrom_.assign(nranks_, 0);
  recvTotal_ = 0;
  for (int s = 0; s < nranks_; ++s) {
    for (int e = 0; e < perRank; ++e) recvFrom_[s] += recvCounts_[s * perRank + e];
    recvTotal_ += recvFrom_[s];
  }
  return true;
}

void UnfusedPipeline::sortChunks(const char* src, char* dst, size_t rowBytes, bool unsort) const {
  const int perRank = numExperts_ / nranks_;
  // Offsets of chunk (s, e) in source-major order, then walk expert-major order.
  std::vector<size_t> smOff(recvCounts_.size());
  size_t off = 0;
  for (size_t i = 0; i < recvCounts_.size(); ++i) smOff[i] = off, off += recvCounts_[i];
  size_t em = 0;
  for (int e = 0; e < perRank; ++e) {
    for (int s = 0; s < nranks_; ++s) {
      size_t i = static_cast<size_t>(s) * perRank + e, n = recvCounts_[i];
      if (n == 0) continue;
      if (!unsort)
        memcpy(dst + em * rowBytes, src + smOff[i] * rowBytes, n * rowBytes);
      else
        memcpy(dst + smOff[i] * rowBytes, src + em * rowBytes, n * rowBytes);
      em += n;
    }
  }
}

bool UnfusedPipeline::dispatch(const void* x, size_t rowBytes, void* permBuf, void* recvBuf,
                               void* out) {
  const char* xs = static_cast<const char*>(x);
  char* perm = static_cast<char*>(permBuf);
  for (size_t pos = 0; pos < permIdx_.size(); ++pos)
    memcpy(perm + pos * rowBytes, xs + permIdx_[pos] * rowBytes, rowBytes);
  if (!ex_->rows(permBuf, sendTo_.data(), recvBuf, recvFrom_.data(), rowBytes)) return false;
  sortChunks(static_cast<const char*>(recvBuf), static_cast<char*>(out), rowBytes, false);
  return true;
}

bool UnfusedPipeline::combine(const void* expertOut, fuscoDataType_t dt, size_t hidden,
                              const float* weights, void* unsortBuf, void* backBuf, void* out) {
  size_t elem = 0;
  fuscoDataTypeSize(dt, &elem);
  const size_t rowBytes = hidden * elem;
  sortChunks(static_cast<const char*>(expertOut), static_cast<char*>(unsortBuf), rowBytes, true);
  if (!ex_->rows(unsortBuf, recvFrom_.data(), backBuf, sendTo_.data(), rowBytes)) return false;
  // un-permute: out[t] = sum over valid k (in k order) of w[t][k] * row(t, k), fp32 accumulation.
  const char* back = static_cast<const char*>(backBuf);
  std::vector<const void*> ptrs(topk_);
  std::vector<float> w(topk_);
  for (size_t t = 0; t < tokens_; ++t) {
    size_t m = 0;
    for (int k = 0; k < topk_; ++k) {
      int64_t pos = slotPos_[t * topk_ + k];
      if (pos < 0) continue;
      ptrs[m] = back + pos * rowBytes;
      w[m++] = weights != nullptr ? weights[t * topk_ + k] : 1.0f;
    }
    weightedSumRows(dt, hidden, ptrs.data(), w.data(), m, static_cast<char*>(out) + t * rowBytes);
  }
  return true;
}

}  // namespace perf
}  // namespace fusco
