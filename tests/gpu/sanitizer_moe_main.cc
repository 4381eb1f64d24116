// A small 2-rank MoE dispatch + combine on a CUDA comm, for compute-sanitizer (GpuSanitizer.* in
// test_gpu_sanitizer.cc runs it under --tool memcheck and --tool racecheck). The parent forks the
// ranks before anything touches CUDA; each rank plans, dispatches and combines (NONE and RANK
// dedup, bf16 and fp32) on its own stream and checks the results bitwise against the host
// reference; then a capacity plan that fits (plan, dispatch and combine against the reference)
// and one a row short on rank 0 (an async error, nothing written out of bounds). Prints
// "fusco_gpu_sanitizer_moe: OK" and exits 0 when every rank succeeded.
//
// Usage: fusco_gpu_sanitizer_moe [nranks (default 2)]
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/bootstrap.h"
#include "fusco.h"
#include "gpu/gpu_harness.h"
#include "gpu/gpu_moe.h"
#include "harness/data_gen.h"
#include "harness/moe_cases.h"
#include "harness/mp_harness.h"

namespace {

using namespace fusco::test;
using namespace fusco::test::gpu;

constexpr int kDeadlineSec = 240;  // the sanitizers slow kernels and copies down a lot

int failures = 0;

void report(int rank, const std::string& what) {
  fprintf(stderr, "fusco_gpu_sanitizer_moe rank %d: %s\n", rank, what.c_str());
  ++failures;
}

void check(int rank, const ::testing::AssertionResult& r, const std::string& what) {
  if (!r) report(rank, what + ": " + r.message());
}

// Capacity mode that fits (8 rows to spare): plan, dispatch and combine enqueue back to back and
// equal the reference; the combine reads every peer's rows through the bases its late operation
// mapped.
void capacityRoundTrip(fuscoComm_t comm, int rank, const CombineSetup& s, cudaStream_t st) {
  const size_t rowOut = s.hidden * dtypeSize(s.dt), need = s.d.numRecvRows[rank];
  const size_t capacity = need + 8;
  DevBuf idx = toDevice(comm, s.p.topkIdx[rank]), x = toDevice(comm, s.x[rank]);
  DevBuf recvX = poisonedBuf(comm, capacity * rowOut), expertOut(comm, capacity * rowOut);
  expertOut.upload(s.expertOut[rank]);
  DevBuf w = toDevice(comm, s.weights[rank]);
  DevBuf out = poisonedBuf(comm, s.p.numTokens[rank] * rowOut);
  fuscoMoeConfig_t cfg = moeConfig(s.c, FUSCO_DEDUP_RANK);
  fuscoMoeHandle_t h = nullptr;
  if (fuscoMoePlanCapacity(&h, comm, &cfg, static_cast<const int64_t*>(idx.get()),
                           s.p.numTokens[rank], s.p.topk, capacity, st) != fuscoSuccess)
    return report(rank, std::string("capacity plan: ") + fuscoGetLastError(comm));
  if (fuscoMoeDispatch(h, x.get(), rowOut, recvX.get(), st) != fuscoSuccess)
    report(rank, std::string("capacity dispatch: ") + fuscoGetLastError(comm));
  if (fuscoMoeCombine(h, expertOut.get(), s.dt, s.hidden, static_cast<const float*>(w.get()),
                      out.get(), st) != fuscoSuccess)
    report(rank, std::string("capacity combine: ") + fuscoGetLastError(comm));
  if (cudaStreamSynchronize(st) != cudaSuccess) return report(rank, "capacity: stream failed");
  const std::vector<uint8_t> got = recvX.download(need * rowOut);
  if (got != s.d.recvX[rank]) report(rank, "capacity dispatch: recvX differs from the reference");
  if (out.download() != moeRefCombine(s.p, s.d, s.expertOut, s.dt, s.hidden, s.weights)[rank])
    report(rank, "capacity combine: out differs from the reference");
  if (fuscoMoeHandleDestroy(h) != fuscoSuccess) report(rank, "fuscoMoeHandleDestroy failed");
}

// Capacity mode with rank 0 one row short: the plan and dispatch enqueue, nothing is written out
// of bounds, and every rank's async error says the plan failed.
void capacityOverflow(fuscoComm_t comm, int rank, const CombineSetup& s, cudaStream_t st) {
  const size_t rowOut = s.hidden * dtypeSize(s.dt), need = s.d.numRecvRows[rank];
  const size_t capacity = rank == 0 ? need - 1 : need;
  DevBuf idx = toDevice(comm, s.p.topkIdx[rank]), x = toDevice(comm, s.x[rank]);
  DevBuf recvX = poisonedBuf(comm, capacity * rowOut);
  fuscoMoeConfig_t cfg = moeConfig(s.c, FUSCO_DEDUP_RANK);
  fuscoMoeHandle_t h = nullptr;
  if (fuscoMoePlanCapacity(&h, comm, &cfg, static_cast<const int64_t*>(idx.get()),
                           s.p.numTokens[rank], s.p.topk, capacity, st) != fuscoSuccess)
    return report(rank, std::string("capacity plan: ") + fuscoGetLastError(comm));
  if (fuscoMoeDispatch(h, x.get(), rowOut, recvX.get(), st) != fuscoSuccess)
    report(rank, std::string("capacity dispatch: ") + fuscoGetLastError(comm));
  if (cudaStreamSynchronize(st) != cudaSuccess) report(rank, "capacity: stream failed");
  fuscoResult_t async = fuscoSuccess;
  fuscoCommGetAsyncError(comm, &async);
  if (async != fuscoInvalidArgument)
    report(rank, std::string("capacity overflow: async error ") + fuscoGetErrorString(async));
  if (fuscoMoeHandleDestroy(h) != fuscoSuccess) report(rank, "fuscoMoeHandleDestroy failed");
}

void runRank(int rank, int n, const fuscoUniqueId& id) {
  if (cudaSetDevice(0) != cudaSuccess) return report(rank, "cudaSetDevice(0) failed");
  fuscoConfig_t cfg = gpuConfig(n, 120000);
  fuscoComm_t comm = nullptr;
  fuscoResult_t r = fuscoCommInitRankConfig(&comm, n, id, rank, &cfg);
  if (r != fuscoSuccess)
    return report(rank, std::string("fuscoCommInitRankConfig -> ") + fuscoGetErrorString(r) + ": " +
                            fuscoGetLastError(nullptr));
  {
    Stream stream;
    MoeCase c = oneNodeCase(n);
    c.numExperts = 4 * n;
    c.topk = 3;
    c.numTokens.assign(n, 0);
    for (int s = 0; s < n; ++s) c.numTokens[s] = 9 + 5 * s;
    c.align = 4;
    for (fuscoDataType_t dt : {fuscoBfloat16, fuscoFloat32}) {
      const CombineSetup s = makeCombine(c, 0x5a417 + dt, dt, 40);
      const size_t rowOut = s.hidden * dtypeSize(dt);
      for (int dedup : {FUSCO_DEDUP_NONE, FUSCO_DEDUP_RANK}) {
        const std::string what = caseName(c, dedup, rowOut) + " " + dtypeName(dt);
        fuscoMoeHandle_t h = nullptr;
        auto ok = gpuPlan(comm, rank, c, s.p, s.d, dedup, FUSCO_BALANCE_AUTO, stream.get(), &h);
        check(rank, ok, what + " plan");
        if (!ok) continue;
        check(rank,
              gpuDispatch(comm, h, rank, s.p, s.d, s.x, rowOut, Mem::Cuda, Mem::Cuda, stream.get()),
              what + " dispatch");
        check(rank, gpuCombine(comm, h, rank, s, true, Mem::Cuda, Mem::Cuda, stream.get()),
              what + " combine");
        if (fuscoMoeHandleDestroy(h) != fuscoSuccess) report(rank, "fuscoMoeHandleDestroy failed");
      }
    }
    capacityRoundTrip(comm, rank, makeCombine(c, 0x5a417, fuscoBfloat16, 40), stream.get());
    capacityOverflow(comm, rank, makeCombine(c, 0x5a417, fuscoBfloat16, 40), stream.get());
  }
  r = fuscoCommDestroy(comm);
  if (r != fuscoSuccess) report(rank, std::string("fuscoCommDestroy -> ") + fuscoGetErrorString(r));
}

// A rank process: runs the body with every gtest failure (DevBuf and friends use EXPECT_*)
// captured, then exits 0 only if nothing failed.
[[noreturn]] void rankMain(int rank, int n, const fuscoUniqueId& id, pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(97);
  if (rank != 0) fusco::bootstrapReleaseId(id);
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter rep(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, &results);
    runRank(rank, n, id);
  }
  for (int i = 0; i < results.size(); ++i) {
    const auto& pr = results.GetTestPartResult(i);
    if (pr.failed())
      report(rank, std::string(pr.file_name() ? pr.file_name() : "?") + ":" +
                       std::to_string(pr.line_number()) + ": " + pr.message());
  }
  fflush(stderr);
  _exit(failures == 0 ? 0 : 1);
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 2;
  if (n < 1 || n > 8) {
    fprintf(stderr, "usage: %s [nranks 1..8]\n", argv[0]);
    return 2;
  }
  fuscoUniqueId id;
  fuscoResult_t r = fuscoGetUniqueId(&id);
  if (r != fuscoSuccess) {
    fprintf(stderr, "fuscoGetUniqueId -> %s: %s\n", fuscoGetErrorString(r),
            fuscoGetLastError(nullptr));
    return 1;
  }
  fflush(stdout);
  fflush(stderr);
  const pid_t parent = getpid();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < n; ++rank) {
    pid_t pid = fork();
    if (pid == 0) rankMain(rank, n, id, parent);
    if (pid < 0) {
      perror("fork");
      for (pid_t p : pids) kill(p, SIGKILL);
      return 1;
    }
    pids.push_back(pid);
  }
  fusco::bootstrapReleaseId(id);
  int bad = 0;
  const double deadline = nowSec() + kDeadlineSec;
  std::vector<bool> done(n, false);
  for (int left = n; left > 0;) {
    for (int rank = 0; rank < n; ++rank) {
      if (done[rank]) continue;
      int status = 0;
      if (waitpid(pids[rank], &status, WNOHANG) != pids[rank]) continue;
      done[rank] = true;
      --left;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "fusco_gpu_sanitizer_moe: rank %d %s %d\n", rank,
                WIFEXITED(status) ? "exited with status" : "was killed by signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        ++bad;
      }
    }
    if (left > 0 && nowSec() > deadline) {
      for (int rank = 0; rank < n; ++rank)
        if (!done[rank]) {
          fprintf(stderr, "fusco_gpu_sanitizer_moe: rank %d did not finish in %d s\n", rank,
                  kDeadlineSec);
          kill(pids[rank], SIGKILL);
          waitpid(pids[rank], nullptr, 0);
          done[rank] = true;
          ++bad;
        }
      break;
    }
    usleep(20000);
  }
  if (bad != 0) return 1;
  printf("fusco_gpu_sanitizer_moe: OK\n");
  return 0;
}
