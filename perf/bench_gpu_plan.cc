// One rank's share of MoE planning per layer on the GPU (src/device/plan_steps.h): the send side
// of its own routing, its receive side from every source, and combine's term rows, timed with
// CUDA events (median of --iters runs after warm-up), next to the host planner (planSend +
// planRecv) and the planner's host twin on the same routing. Uniform top-k routing, contiguous
// placement, RANK dedup. Without a usable GPU it prints the host figures and says why the kernel
// column is missing.
//
//   bench_gpu_plan [--ranks 8] [--experts 64] [--topk 8] [--tokens 4096,16384] [--iters 100]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "device/device_plan_ops.h"
#include "plan/moe_plan.h"

namespace {

struct Opts {
  int ranks = 8, experts = 64, topk = 8, iters = 100;
  std::vector<size_t> tokens{4096, 16384};
};

Opts parse(int argc, char** argv) {
  Opts o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--ranks") o.ranks = atoi(v);
    if (k == "--experts") o.experts = atoi(v);
    if (k == "--topk") o.topk = atoi(v);
    if (k == "--iters") o.iters = atoi(v);
    if (k == "--tokens") {
      o.tokens.clear();
      for (const char* p = v; *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] ? 1 : 0))
        o.tokens.push_back(strtoull(p, nullptr, 10));
    }
  }
  return o;
}

std::vector<int64_t> uniformTopk(size_t tokens, int topk, int experts, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> idx(tokens * topk);
  std::vector<int> perm(experts);
  for (int e = 0; e < experts; ++e) perm[e] = e;
  for (size_t t = 0; t < tokens; ++t)
    for (int k = 0; k < topk; ++k) {
      std::swap(perm[k], perm[k + rng() % (experts - k)]);
      idx[t * topk + k] = perm[k];
    }
  return idx;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

template <typename F>
double hostMedianUs(int iters, F f) {
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(us);
}

// Every rank's send side and rank 0's receive side, in memory from alloc (host or device).
struct Layer {
  std::vector<fusco::gplan::SendArgs> send;
  fusco::gplan::RecvArgs recv;
  const int64_t* remoteFan = nullptr;
};

// Host or device memory for a Layer: alloc, copies in and out (out waits for the steps).
struct HostMem {
  std::vector<std::vector<char>> bufs;
  char* alloc(size_t bytes) {
    bufs.emplace_back(bytes + 16);
    return bufs.back().data();
  }
  void put(void* dst, const void* src, size_t bytes) {
    if (bytes > 0) memcpy(dst, src, bytes);
  }
  void get(void* dst, const void* src, size_t bytes) {
    if (bytes > 0) memcpy(dst, src, bytes);
  }
  void send(const fusco::gplan::SendArgs& a) { fusco::hostPlanSend(a); }
};

struct DevMem {
  std::vector<void*> bufs;
  cudaStream_t s = nullptr;
  DevMem() { cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); }
  ~DevMem() {
    cudaStreamSynchronize(s);
    for (void* p : bufs) cudaFree(p);
    cudaStreamDestroy(s);
  }
  char* alloc(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes + 16) != cudaSuccess) return nullptr;
    cudaMemset(p, 0, bytes + 16);
    bufs.push_back(p);
    return static_cast<char*>(p);
  }
  void put(void* dst, const void* src, size_t bytes) {
    cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
  }
  void get(void* dst, const void* src, size_t bytes) {
    cudaStreamSynchronize(s);
    cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
  }
  void send(const fusco::gplan::SendArgs& a) { fusco::devicePlanSend(a, s); }
};

template <typename M>
fusco::gplan::SendArgs sendSide(M& m, const fusco::MoeShape& shape,
                                const std::vector<int64_t>& topk, size_t tokens, const Opts& o,
                                const int32_t* tables) {
  fusco::gplan::SendArgs a;
  char* base = m.alloc(fusco::carvePlanSend(nullptr, tokens, o.topk, o.ranks, &a));
  fusco::carvePlanSend(base, tokens, o.topk, o.ranks, &a);
  int64_t* idx = reinterpret_cast<int64_t*>(m.alloc(topk.size() * 8));
  m.put(idx, topk.data(), topk.size() * 8);
  a.topkIdx = idx;
  a.numTokens = tokens;
  a.topk = o.topk;
  a.rankOf = tables;
  a.localOf = tables + shape.numExperts;
  a.numExperts = shape.numExperts;
  a.nranks = o.ranks;
  a.perRank = 1;
  return a;
}

// Rank 0's receive side from every source's (already planned) send side.
template <typename M>
fusco::gplan::RecvArgs recvSide(M& m, const fusco::MoeShape& shape,
                                const std::vector<fusco::gplan::SendArgs>& send, const Opts& o) {
  const int n = o.ranks;
  std::vector<uint64_t> ptrs(2 * n);
  std::vector<uint32_t> rowsFrom(n), off(2 * (n + 1));
  uint64_t rows = 0, entries = 0;
  for (int s = 0; s < n; ++s) {
    m.get(off.data(), send[s].rowOff, (n + 1) * 4);
    m.get(off.data() + n + 1, send[s].slotOff, (n + 1) * 4);
    rowsFrom[s] = off[1] - off[0];
    rows += rowsFrom[s];
    entries += off[n + 2] - off[n + 1];
    ptrs[s] = reinterpret_cast<uintptr_t>(send[s].kStart + off[0]);
    ptrs[n + s] = reinterpret_cast<uintptr_t>(send[s].local + off[n + 1]);
  }
  fusco::gplan::RecvArgs r;
  const uint32_t local = static_cast<uint32_t>(shape.localExperts[0].size());
  char* base = m.alloc(fusco::carvePlanRecv(nullptr, n, local, entries, rows, &r));
  fusco::carvePlanRecv(base, n, local, entries, rows, &r);
  char* tail = m.alloc(ptrs.size() * 8 + rowsFrom.size() * 4);
  m.put(tail, ptrs.data(), ptrs.size() * 8);
  m.put(tail + ptrs.size() * 8, rowsFrom.data(), rowsFrom.size() * 4);
  r.nranks = n;
  r.numLocal = local;
  r.align = 1;
  r.srcKStart = reinterpret_cast<const uint32_t* const*>(tail);
  r.srcLocal = reinterpret_cast<const int32_t* const*>(tail + n * 8);
  r.rowsFrom = reinterpret_cast<const uint32_t*>(tail + ptrs.size() * 8);
  return r;
}

template <typename M>
Layer buildLayer(M& m, const fusco::MoeShape& shape, const std::vector<std::vector<int64_t>>& topk,
                 size_t tokens, const Opts& o) {
  std::vector<int32_t> tables(shape.expertToRank.begin(), shape.expertToRank.end());
  tables.insert(tables.end(), shape.localIndexOf.begin(), shape.localIndexOf.end());
  int32_t* t = reinterpret_cast<int32_t*>(m.alloc(tables.size() * 4));
  m.put(t, tables.data(), tables.size() * 4);
  Layer l;
  for (int s = 0; s < o.ranks; ++s) {
    l.send.push_back(sendSide(m, shape, topk[s], tokens, o, t));
    m.send(l.send.back());
  }
  l.recv = recvSide(m, shape, l.send, o);
  l.remoteFan = reinterpret_cast<const int64_t*>(m.alloc(tokens * o.topk * 8));
  return l;
}

double hostPlannerUs(const fusco::MoeShape& shape, const std::vector<std::vector<int64_t>>& topk,
                     size_t tokens, const Opts& o) {
  std::vector<std::vector<int32_t>> metaFrom(o.ranks);
  for (int s = 0; s < o.ranks; ++s)
    metaFrom[s] =
        fusco::planSend(shape, s, topk[s].data(), tokens, o.topk, fusco::Dedup::Rank).meta[0];
  fusco::MoeSendPlan send;
  fusco::MoeRecvPlan recv;
  return hostMedianUs(o.iters, [&] {
    fusco::planSendInto(shape, 0, topk[0].data(), tokens, o.topk, fusco::Dedup::Rank, &send);
    fusco::planRecv(shape, 0, metaFrom, &recv);
  });
}

double twinUs(const fusco::MoeShape& shape, const std::vector<std::vector<int64_t>>& topk,
              size_t tokens, const Opts& o) {
  HostMem m;
  Layer l = buildLayer(m, shape, topk, tokens, o);
  return hostMedianUs(o.iters, [&] {
    fusco::hostPlanSend(l.send[0]);
    fusco::hostPlanRecv(l.recv);
    fusco::hostPlanTermRows(l.send[0], l.remoteFan);
  });
}

struct GpuTimes {
  double send = -1, recv = -1, terms = -1;
  std::string str(double v) const {
    if (send < 0) return "-";
    char b[32];
    snprintf(b, sizeof(b), "%.1f", v);
    return b;
  }
};

// Each phase between two events on the stream; medians over the iterations.
GpuTimes kernelUs(const fusco::MoeShape& shape, const std::vector<std::vector<int64_t>>& topk,
                  size_t tokens, const Opts& o) {
  cudaSetDevice(0);
  DevMem m;
  Layer l = buildLayer(m, shape, topk, tokens, o);
  cudaEvent_t ev[4];
  for (cudaEvent_t& e : ev) cudaEventCreate(&e);
  std::vector<double> t[3];
  for (int i = 0; i < o.iters + 10; ++i) {
    cudaEventRecord(ev[0], m.s);
    fusco::devicePlanSend(l.send[0], m.s);
    cudaEventRecord(ev[1], m.s);
    fusco::devicePlanRecv(l.recv, m.s);
    cudaEventRecord(ev[2], m.s);
    fusco::devicePlanTermRows(l.send[0], l.remoteFan, m.s);
    cudaEventRecord(ev[3], m.s);
    cudaEventSynchronize(ev[3]);
    for (int p = 0; p < 3 && i >= 10; ++p) {
      float ms = 0;
      cudaEventElapsedTime(&ms, ev[p], ev[p + 1]);
      t[p].push_back(ms * 1000.0);
    }
  }
  for (cudaEvent_t& e : ev) cudaEventDestroy(e);
  GpuTimes g;
  g.send = median(t[0]);
  g.recv = median(t[1]);
  g.terms = median(t[2]);
  return g;
}

}  // namespace

int main(int argc, char** argv) {
  const Opts o = parse(argc, argv);
  fusco::MoeShape shape;
  if (fusco::buildMoeShape(o.ranks, o.experts, nullptr, 1, &shape) != fuscoSuccess) {
    fprintf(stderr, "bench_gpu_plan: bad shape (experts %% ranks must be 0)\n");
    return 2;
  }
  int devices = 0;
  const bool gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  printf(
      "# one rank's MoE planning per layer: %d ranks, %d experts, top-%d, RANK dedup, us "
      "(median of %d)\n",
      o.ranks, o.experts, o.topk, o.iters);
  if (!gpu) printf("# no usable CUDA device: the gpu columns are not measured\n");
  printf("%10s %12s %12s %12s %12s %12s %12s\n", "tokens", "host plan", "host twin", "gpu send",
         "gpu recv", "gpu terms", "gpu total");
  for (size_t tokens : o.tokens) {
    std::vector<std::vector<int64_t>> topk(o.ranks);
    for (int s = 0; s < o.ranks; ++s) topk[s] = uniformTopk(tokens, o.topk, o.experts, 100 + s);
    const double host = hostPlannerUs(shape, topk, tokens, o);
    const double twin = twinUs(shape, topk, tokens, o);
    GpuTimes g;
    if (gpu) g = kernelUs(shape, topk, tokens, o);
    printf("%10zu %12.1f %12.1f %12s %12s %12s %12s\n", tokens, host, twin, g.str(g.send).c_str(),
           g.str(g.recv).c_str(), g.str(g.terms).c_str(), g.str(g.send + g.recv + g.terms).c_str());
  }
  return 0;
}
