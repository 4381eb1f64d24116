// alltoall_perf: fuscoAllToAll bandwidth, nccl-tests style.
//
// Sizes are the total bytes each rank sends (count * type size * nranks, as nccl-tests'
// alltoall_perf). algbw = size / time, busbw = algbw * (n-1)/n; time is the slowest rank's average
// per-iteration time. With -c 1 every received element is checked against the value its sender
// wrote (a seeded hash of source rank, destination rank and index), and #wrong is summed over
// ranks.
//
// --mem cuda: the buffers are device memory and the calls go to a fuscoMemCuda comm on the rank's
// stream (cuda_mem.h). The timed loop enqueues the iterations and then waits for the stream, as
// nccl-tests does; the checked call's bytes are copied to the host and checked there. Barriers
// and results stay on the host comm made from the launcher's id. An extra column, host, is the
// host wall time of one fuscoAllToAll call (it returns once enqueued): each rank's median over the
// timed calls, the slowest rank's median shown.
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "cuda_mem.h"
#include "fusco.h"
#include "launcher.h"
#include "mps_daemon.h"
#include "perf_rng.h"

namespace {

using fusco::perf::BufferKind;
using fusco::perf::Launch;
using fusco::perf::MemMode;
using fusco::perf::MpsMode;

struct TypeInfo {
  const char* name;
  fuscoDataType_t type;
  size_t bytes;
};

const TypeInfo kTypes[] = {
    {"int8", fuscoInt8, 1},          {"uint8", fuscoUint8, 1},
    {"int32", fuscoInt32, 4},        {"uint32", fuscoUint32, 4},
    {"int64", fuscoInt64, 8},        {"uint64", fuscoUint64, 8},
    {"half", fuscoFloat16, 2},       {"float", fuscoFloat32, 4},
    {"double", fuscoFloat64, 8},     {"bfloat16", fuscoBfloat16, 2},
    {"fp8e4m3", fuscoFloat8e4m3, 1}, {"fp8e5m2", fuscoFloat8e5m2, 1},
};

struct Options {
  size_t minBytes = 1 << 10;
  size_t maxBytes = 64 << 20;
  int factor = 2;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  int arena = 1;  // host: 1 fuscoMemAlloc, 0 malloc; cuda: BufferKind (0, 1, 2)
  MemMode mem = MemMode::Host;
  MpsMode mps = MpsMode::Auto;        // --mps: a private MPS daemon for -np ranks sharing a GPU
  const char* mpsKind = "off";        // what the run got (MpsRun::kind), for the header and JSON
  const TypeInfo* type = &kTypes[7];  // float
  const char* jsonPath = nullptr;
  fusco::perf::LaunchOptions launch;
};

void usage(const char* prog) {
  printf(
      "usage: %s [options]\n"
      "  -b BYTES   smallest size: bytes each rank sends in total (K/M/G suffixes; default 1K)\n"
      "  -e BYTES   largest size (default 64M)\n"
      "  -f N       size step factor (default 2)\n"
      "  -n N       timed iterations per size (default 20)\n"
      "  -w N       warmup iterations per size (default 5)\n"
      "  -c 0|1     check every received element (default 1)\n"
      "  -d TYPE    int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 fp8e4m3\n"
      "             fp8e5m2 (default float)\n"
      "  -a 0|1|2   buffers from fuscoMemAlloc (1, one-copy path) or malloc (0) (default 1);\n"
      "             with --mem cuda: fuscoMemAlloc (1), cudaMalloc (0), cudaMalloc +\n"
      "             fuscoCommRegister (2)\n"
      "  --mem M    host | cuda | auto (default host): cuda = device buffers, a fuscoMemCuda\n"
      "             comm, stream-ordered calls; auto = cuda when a CUDA device is present\n"
      "  --mps M    auto | on | off (default auto): with -np N ranks on CUDA memory, a private\n"
      "             MPS daemon for the run (auto: when ranks outnumber the devices and\n"
      "             nvidia-cuda-mps-control is on PATH, unless one already serves; on: the\n"
      "             same, and no daemon is an error; off: time-sliced)\n"
      "  -np N      fork N local ranks (else: mpirun / srun / torchrun environment, else 1 rank)\n"
      "  -J FILE    append one JSON line per size to FILE (rank 0)\n"
      "  -h         this help\n"
      "srun needs MASTER_ADDR exported (rank 0's host); the id is served on FUSCO_ID_PORT\n"
      "(default MASTER_PORT+1). Test hook: FUSCO_PERF_FAKE_DEVICES=N makes --mps decide as if N\n"
      "devices and CUDA memory (the ranks keep --mem).\n",
      prog);
}

// Returns 0 to run, 1 after -h, 2 on a bad command line (message printed).
int parseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(argv[0]);
      return 1;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "%s: unknown option or missing value: %s (see -h)\n", argv[0], a.c_str());
      return 2;
    }
    const char* v = argv[++i];
    bool ok = true;
    if (a == "-b")
      ok = fusco::perf::parseSize(v, &o->minBytes);
    else if (a == "-e")
      ok = fusco::perf::parseSize(v, &o->maxBytes);
    else if (a == "-f")
      ok = fusco::perf::parseInt(v, &o->factor) && o->factor >= 2;
    else if (a == "-n")
      ok = fusco::perf::parseInt(v, &o->iters) && o->iters >= 1;
    else if (a == "-w")
      ok = fusco::perf::parseInt(v, &o->warmup) && o->warmup >= 0;
    else if (a == "-c")
      ok = fusco::perf::parseInt(v, &o->check) && (o->check == 0 || o->check == 1);
    else if (a == "-a")
      ok = fusco::perf::parseInt(v, &o->arena) && o->arena >= 0 && o->arena <= 2;
    else if (a == "--mem")
      ok = fusco::perf::parseMemMode(v, &o->mem);
    else if (a == "--mps")
      ok = fusco::perf::parseMpsMode(v, &o->mps);
    else if (a == "-np")
      ok = fusco::perf::parseInt(v, &o->launch.np) && o->launch.np >= 1;
    else if (a == "-J")
      o->jsonPath = v;
    else if (a == "-d") {
      o->type = nullptr;
      for (const TypeInfo& t : kTypes) {
        if (strcmp(t.name, v) == 0) o->type = &t;
      }
      ok = o->type != nullptr;
    } else {
      fprintf(stderr, "%s: unknown option %s (see -h)\n", argv[0], a.c_str());
      return 2;
    }
    if (!ok) {
      fprintf(stderr, "%s: bad value for %s: %s (see -h)\n", argv[0], a.c_str(), v);
      return 2;
    }
  }
  if (o->minBytes > o->maxBytes) {
    fprintf(stderr, "%s: -b must not exceed -e\n", argv[0]);
    return 2;
  }
  return 0;
}

using fusco::perf::mix64;

// The bits rank src sends to rank dst as element i (truncated to the type's size).
inline uint64_t elementValue(uint64_t seed, int src, int dst, size_t i) {
  return mix64(seed ^ (static_cast<uint64_t>(src) << 48) ^ (static_cast<uint64_t>(dst) << 32) ^ i);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The 99th percentile (nearest rank: the smallest sample no fewer than 99% of them reach).
double p99(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = (v.size() * 99 + 99) / 100;  // ceil(0.99 n)
  return v[rank - 1];
}

// One size's time per call, each call waited for: the slowest rank's median and p99.
struct Latency {
  double median = 0, p99 = 0;
};

// One line of the table.
struct Row {
  size_t bytes = 0, count = 0;
  double us = 0, algbw = 0, busbw = 0, hostUs = 0;
  Latency lat;
  int64_t wrong = 0;
};

inline void storeBits(char* p, size_t bytes, uint64_t v) { memcpy(p, &v, bytes); }
inline bool sameBits(const char* p, size_t bytes, uint64_t v) { return memcmp(p, &v, bytes) == 0; }

// One rank's run: a comm, its buffers, the sweep. Every failure is printed where it happens.
class Rank {
 public:
  Rank(const Options& o, const Launch& l) : o_(o), l_(l) {}
  ~Rank();
  int run();

 private:
  bool ok(fuscoResult_t r, const char* what);
  bool dataOk(fuscoResult_t r);  // a call on the data comm
  bool cudaOk(bool good, const char* what);
  bool cuda() const { return o_.mem == MemMode::Cuda; }
  bool initCuda();
  bool allocBuffers(size_t bytes);
  bool allocDevice(size_t bytes);
  bool gatherInfo();
  bool barrier();
  bool maxOverRanks(double mine, double* out);
  bool sumOverRanks(int64_t mine, int64_t* out);
  bool allToAll(size_t count, double* hostUs);
  bool timeCalls(size_t count, std::vector<double>* us);
  bool latencyOverRanks(const std::vector<double>& us, Latency* lat);
  bool runSize(size_t count, double* usPerIter, double* hostUs, Latency* lat, int64_t* wrong);
  void fill(size_t count, uint64_t seed);
  int64_t verify(size_t count, uint64_t seed) const;
  void printHeader(const std::vector<std::string>& info) const;
  void printRow(const Row& r);
  void jsonRow(const Row& r);
  std::string cudaJson(double hostUs) const;

  const Options& o_;
  const Launch& l_;
  fuscoComm_t comm_ = nullptr;
  char* send_ = nullptr;
  char* recv_ = nullptr;
  FILE* json_ = nullptr;
  // The comm and stream the measured calls use: comm_ and NULL, or (--mem cuda) the device's.
  fuscoComm_t data_ = nullptr;
  void* stream_ = nullptr;
  // Host views of the buffers, where fill() writes and verify() reads: send_ / recv_ themselves,
  // or (--mem cuda) host staging copies of the device buffers.
  char* hsend_ = nullptr;
  char* hrecv_ = nullptr;
  // --mem cuda: device, stream, data comm; the device buffers (freed before the comm) and staging.
  fusco::perf::CudaRank cuda_;
  std::unique_ptr<fusco::perf::DeviceBuffers> dbufs_;
  std::unique_ptr<char[]> staging_[2];
};

Rank::~Rank() {
  dbufs_.reset();  // --mem cuda: the device buffers (cuda_ destroys their comm afterwards)
  if (comm_ != nullptr) {
    for (char* p : {send_, recv_}) {
      if (p != nullptr && o_.arena && !cuda()) fuscoMemFree(comm_, p);
    }
    fuscoCommDestroy(comm_);
  }
  if (!o_.arena && !cuda()) {
    free(send_);
    free(recv_);
  }
  if (json_ != nullptr) fclose(json_);
}

bool Rank::ok(fuscoResult_t r, const char* what) {
  if (r == fuscoSuccess) return true;
  fprintf(stderr, "# rank %d: %s failed: %s: %s\n", l_.rank, what, fuscoGetErrorString(r),
          fuscoGetLastError(comm_));
  return false;
}

bool Rank::dataOk(fuscoResult_t r) {
  if (r == fuscoSuccess) return true;
  fprintf(stderr, "# rank %d: fuscoAllToAll failed: %s: %s\n", l_.rank, fuscoGetErrorString(r),
          fuscoGetLastError(data_));
  return false;
}

bool Rank::cudaOk(bool good, const char* what) {
  if (!good) fprintf(stderr, "# rank %d: %s\n", l_.rank, what);
  return good;
}

// --mem cuda: device, stream and the fuscoMemCuda data comm (collective over comm_).
bool Rank::initCuda() {
  std::string err;
  if (!fusco::perf::cudaRankInit(comm_, l_.rank, l_.nranks, &cuda_, &err))
    return cudaOk(false, ("--mem cuda: " + err).c_str());
  data_ = cuda_.comm;
  stream_ = cuda_.stream;
  return true;
}

// --mem cuda: device send and receive buffers of the chosen kind, and their host staging copies.
bool Rank::allocDevice(size_t bytes) {
  std::string err;
  dbufs_.reset(new fusco::perf::DeviceBuffers(data_, static_cast<BufferKind>(o_.arena)));
  send_ = static_cast<char*>(dbufs_->alloc(bytes, &err));
  recv_ = send_ != nullptr ? static_cast<char*>(dbufs_->alloc(bytes, &err)) : nullptr;
  if (recv_ == nullptr) return cudaOk(false, err.c_str());
  staging_[0].reset(new char[bytes]);
  staging_[1].reset(new char[bytes]);
  hsend_ = staging_[0].get();
  hrecv_ = staging_[1].get();
  return true;
}

bool Rank::allocBuffers(size_t bytes) {
  bytes = bytes < 64 ? 64 : bytes;
  if (cuda()) return allocDevice(bytes);
  if (o_.arena) {
    void* s = nullptr;
    void* r = nullptr;
    if (!ok(fuscoMemAlloc(comm_, &s, bytes), "fuscoMemAlloc")) return false;
    send_ = static_cast<char*>(s);
    if (!ok(fuscoMemAlloc(comm_, &r, bytes), "fuscoMemAlloc")) return false;
    recv_ = static_cast<char*>(r);
    hsend_ = send_, hrecv_ = recv_;
    return true;
  }
  void* s = nullptr;
  void* r = nullptr;
  if (posix_memalign(&s, 4096, bytes) != 0 || posix_memalign(&r, 4096, bytes) != 0) {
    free(s);
    fprintf(stderr, "# rank %d: cannot allocate 2 x %zu bytes\n", l_.rank, bytes);
    return false;
  }
  send_ = static_cast<char*>(s);
  recv_ = static_cast<char*>(r);
  hsend_ = send_, hrecv_ = recv_;
  return true;
}

bool Rank::maxOverRanks(double mine, double* out) {
  std::vector<double> s(l_.nranks, mine), r(l_.nranks, 0.0);
  if (!ok(fuscoAllToAll(s.data(), r.data(), 1, fuscoFloat64, comm_, nullptr), "fuscoAllToAll"))
    return false;
  *out = mine;
  for (double v : r) *out = v > *out ? v : *out;
  return true;
}

bool Rank::sumOverRanks(int64_t mine, int64_t* out) {
  std::vector<int64_t> s(l_.nranks, mine), r(l_.nranks, 0);
  if (!ok(fuscoAllToAll(s.data(), r.data(), 1, fuscoInt64, comm_, nullptr), "fuscoAllToAll"))
    return false;
  *out = 0;
  for (int64_t v : r) *out += v;
  return true;
}

bool Rank::barrier() {
  int64_t sum = 0;
  return sumOverRanks(1, &sum);
}

// Rank 0 learns every rank's host, pid and place in the node map, for the header.
bool Rank::gatherInfo() {
  int node = 0, numNodes = 1, localRank = 0, localSize = 1;
  if (!ok(fuscoCommNodeInfo(comm_, &node, &numNodes, &localRank, &localSize), "fuscoCommNodeInfo"))
    return false;
  char host[64] = "?";
  gethostname(host, sizeof(host) - 1);
  const size_t kRec = 128;
  char rec[kRec] = {};
  int len = snprintf(rec, kRec, "Rank %3d Pid %7d on %-16.32s node %d/%d local rank %d/%d", l_.rank,
                     static_cast<int>(getpid()), host, node, numNodes, localRank, localSize);
  if (cuda() && len > 0 && static_cast<size_t>(len) < kRec)
    snprintf(rec + len, kRec - len, " device %d [%s]", cuda_.device, cuda_.gpuName.c_str());
  std::vector<char> s(kRec * l_.nranks), r(kRec * l_.nranks);
  for (int p = 0; p < l_.nranks; ++p) memcpy(&s[kRec * p], rec, kRec);
  if (!ok(fuscoAllToAll(s.data(), r.data(), kRec, fuscoUint8, comm_, nullptr), "fuscoAllToAll"))
    return false;
  if (l_.rank != 0) return true;
  std::vector<std::string> info;
  for (int p = 0; p < l_.nranks; ++p) info.emplace_back(&r[kRec * p], strnlen(&r[kRec * p], kRec));
  printHeader(info);
  return true;
}

void Rank::printHeader(const std::vector<std::string>& info) const {
  int version = 0;
  fuscoGetVersion(&version);
  printf("# fusco %d.%d.%d alltoall_perf: %d ranks (%s, %s), MPS %s\n", version / 10000,
         (version / 100) % 100, version % 100, l_.nranks, l_.mode.c_str(), l_.launcher.c_str(),
         fusco::perf::mpsHeaderText(o_.mpsKind).c_str());
  printf(
      "# minBytes %zu maxBytes %zu step: %d(factor) warmup iters: %d iters: %d "
      "validation: %d datatype: %s buffers: %s\n",
      o_.minBytes, o_.maxBytes, o_.factor, o_.warmup, o_.iters, o_.check, o_.type->name,
      cuda()     ? fusco::perf::bufferKindText(static_cast<BufferKind>(o_.arena))
      : o_.arena ? "fuscoMemAlloc"
                 : "malloc");
  if (cuda())
    printf(
        "# memory: cuda (fuscoMemCuda comm, stream-ordered; iterations enqueued back to back, "
        "then cudaStreamSynchronize); GPU: %s (rank 0: device %d of %d)\n"
        "# host = host wall time of one fuscoAllToAll call alone (it returns once enqueued): "
        "median over the timed calls, slowest rank\n",
        cuda_.gpuName.c_str(), cuda_.device, cuda_.deviceCount);
  printf(
      "# median, p99 = time of one call waited for (%s), over the timed iterations, slowest "
      "rank\n",
      cuda() ? "a second series, call and cudaStreamSynchronize one at a time" : "the calls");
  printf("#\n# Ranks\n");
  for (const std::string& s : info) printf("#  %s\n", s.c_str());
  printf("#\n");
  printf("# %10s %12s %9s %11s %11s %11s %8s %11s %11s%s\n", "size", "count", "type", "time",
         "algbw", "busbw", "#wrong", "median", "p99", cuda() ? "        host" : "");
  printf("# %10s %12s %9s %11s %11s %11s %8s %11s %11s%s\n", "(B)", "(elements)", "", "(us)",
         "(GB/s)", "(GB/s)", "", "(us)", "(us)", cuda() ? "        (us)" : "");
  fflush(stdout);
}

void Rank::fill(size_t count, uint64_t seed) {
  const size_t tb = o_.type->bytes;
  for (int dst = 0; dst < l_.nranks; ++dst) {
    char* block = hsend_ + static_cast<size_t>(dst) * count * tb;
    for (size_t i = 0; i < count; ++i)
      storeBits(block + i * tb, tb, elementValue(seed, l_.rank, dst, i));
  }
}

int64_t Rank::verify(size_t count, uint64_t seed) const {
  const size_t tb = o_.type->bytes;
  int64_t wrong = 0;
  for (int src = 0; src < l_.nranks; ++src) {
    const char* block = hrecv_ + static_cast<size_t>(src) * count * tb;
    for (size_t i = 0; i < count; ++i) {
      uint64_t want = elementValue(seed, src, l_.rank, i);
      if (sameBits(block + i * tb, tb, want)) continue;
      if (wrong++ < 4) {
        uint64_t got = 0;
        memcpy(&got, block + i * tb, tb);
        const uint64_t mask = tb == 8 ? ~uint64_t{0} : ((uint64_t{1} << (8 * tb)) - 1);
        fprintf(stderr,
                "# rank %d: element %zu from rank %d: got 0x%" PRIx64 " want 0x%" PRIx64 "\n",
                l_.rank, i, src, got, want & mask);
      }
    }
  }
  return wrong;
}

// One fuscoAllToAll on the data comm; *hostUs: the host wall time of the call alone.
bool Rank::allToAll(size_t count, double* hostUs) {
  const auto t0 = std::chrono::steady_clock::now();
  const fuscoResult_t r = fuscoAllToAll(send_, recv_, count, o_.type->type, data_, stream_);
  *hostUs =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  return dataOk(r);
}

// `iters` calls, each waited for (--mem cuda: its stream synchronized) before the next; *us: the
// time of each.
bool Rank::timeCalls(size_t count, std::vector<double>* us) {
  std::string err;
  us->assign(o_.iters, 0);
  for (int i = 0; i < o_.iters; ++i) {
    double host = 0;
    const auto t0 = std::chrono::steady_clock::now();
    if (!allToAll(count, &host)) return false;
    if (cuda() && !cudaOk(fusco::perf::cudaSyncStream(stream_, "a call", &err), err.c_str()))
      return false;
    (*us)[i] =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  return true;
}

bool Rank::latencyOverRanks(const std::vector<double>& us, Latency* lat) {
  return maxOverRanks(median(us), &lat->median) && maxOverRanks(p99(us), &lat->p99);
}

// Times one size: warmup, a barrier, iters timed calls; then (with -c 1) one checked call into a
// poisoned receive buffer. Host mode: each call returns with its data in place, so the timed
// calls also give the latency. --mem cuda: the warmup is waited for before the barrier, the timed
// calls are enqueued back to back and the clock stops when the stream is done; *hostUs is the
// slowest rank's median host time per call; then a second series of iters calls, each waited
// for, gives the latency.
bool Rank::runSize(size_t count, double* usPerIter, double* hostUs, Latency* lat, int64_t* wrong) {
  const uint64_t seed = 0x5eedf05c0ULL ^ (count * 0x100000001b3ULL);
  const size_t bytes = count * o_.type->bytes * l_.nranks;
  std::string err;
  auto syncOk = [&](const char* what) {
    return !cuda() || cudaOk(fusco::perf::cudaSyncStream(stream_, what, &err), err.c_str());
  };
  fill(count, seed);
  auto copyOk = [&](void* dst, const void* src) {
    return cudaOk(fusco::perf::cudaCopySync(dst, src, bytes, stream_, &err), err.c_str());
  };
  if (cuda() && !copyOk(send_, hsend_)) return false;
  for (int i = 0; i < o_.warmup; ++i) {
    if (!dataOk(fuscoAllToAll(send_, recv_, count, o_.type->type, data_, stream_))) return false;
  }
  if (!syncOk("the warmup") || !barrier()) return false;
  std::vector<double> host(o_.iters);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o_.iters; ++i) {
    if (!allToAll(count, &host[i])) return false;
  }
  if (!syncOk("the timed iterations")) return false;
  double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  if (!maxOverRanks(us / o_.iters, usPerIter)) return false;
  *hostUs = 0;
  if (cuda() && !maxOverRanks(median(host), hostUs)) return false;
  std::vector<double> each = host;
  if (cuda() && (!barrier() || !timeCalls(count, &each))) return false;
  if (!latencyOverRanks(each, lat)) return false;
  *wrong = 0;
  if (!o_.check) return true;
  if (!cuda())
    memset(recv_, 0xA5, bytes);
  else if (!cudaOk(fusco::perf::cudaFillSync(recv_, 0xA5, bytes, stream_, &err), err.c_str()))
    return false;
  if (!dataOk(fuscoAllToAll(send_, recv_, count, o_.type->type, data_, stream_))) return false;
  if (cuda() && !copyOk(hrecv_, recv_)) return false;
  return sumOverRanks(verify(count, seed), wrong);
}

// --mem cuda: what each JSON line adds (nothing in host mode).
std::string Rank::cudaJson(double hostUs) const {
  if (!cuda()) return "";
  char buf[32];
  snprintf(buf, sizeof(buf), ",\"host_us\":%.3f", hostUs);
  return ",\"mem\":\"cuda\",\"gpu\":\"" + cuda_.gpuName + "\"" + buf;
}

void Rank::printRow(const Row& r) {
  char wrongText[32] = "N/A", hostText[32] = "";
  if (o_.check) snprintf(wrongText, sizeof(wrongText), "%" PRId64, r.wrong);
  if (cuda()) snprintf(hostText, sizeof(hostText), " %11.2f", r.hostUs);
  printf("  %10zu %12zu %9s %11.2f %11.3f %11.3f %8s %11.2f %11.2f%s\n", r.bytes, r.count,
         o_.type->name, r.us, r.algbw, r.busbw, wrongText, r.lat.median, r.lat.p99, hostText);
  fflush(stdout);
  if (json_ != nullptr) jsonRow(r);
}

void Rank::jsonRow(const Row& r) {
  fprintf(json_,
          "{\"bench\":\"alltoall_perf\",\"time\":%lld,\"nranks\":%d,\"launch\":\"%s\","
          "\"mps\":\"%s\","
          "\"type\":\"%s\",\"buffers\":\"%s\",\"size\":%zu,\"count\":%zu,\"iters\":%d,"
          "\"warmup\":%d,\"time_us\":%.3f,\"algbw_gbs\":%.4f,\"busbw_gbs\":%.4f,"
          "\"median_us\":%.3f,\"p99_us\":%.3f,"
          "\"wrong\":%" PRId64 ",\"checked\":%d%s}\n",
          static_cast<long long>(time(nullptr)), l_.nranks, l_.mode.c_str(), o_.mpsKind,
          o_.type->name,
          cuda()     ? (o_.arena == 1   ? "arena"
                        : o_.arena == 2 ? "registered"
                                        : "cudaMalloc")
          : o_.arena ? "arena"
                     : "malloc",
          r.bytes, r.count, o_.iters, o_.warmup, r.us, r.algbw, r.busbw, r.lat.median, r.lat.p99,
          r.wrong, o_.check, cudaJson(r.hostUs).c_str());
  fflush(json_);
}

int Rank::run() {
  if (!ok(fuscoCommInitRank(&comm_, l_.nranks, l_.id, l_.rank), "fuscoCommInitRank")) return 1;
  if (l_.rank == 0 && o_.jsonPath != nullptr && (json_ = fopen(o_.jsonPath, "a")) == nullptr) {
    fprintf(stderr, "# rank 0: cannot open %s for appending: %s\n", o_.jsonPath, strerror(errno));
  }
  const int64_t jsonFailed = (l_.rank == 0 && o_.jsonPath != nullptr && json_ == nullptr) ? 1 : 0;
  int64_t anyJsonFailed = 0;  // every rank stops together
  if (!sumOverRanks(jsonFailed, &anyJsonFailed) || anyJsonFailed != 0) return 1;
  data_ = comm_;
  if (cuda() && !initCuda()) return 1;
  if (!gatherInfo()) return 1;
  const size_t unit = o_.type->bytes * l_.nranks;
  if (!allocBuffers(o_.maxBytes / unit * unit)) return 1;

  int64_t totalWrong = 0;
  double busbwSum = 0;
  int rows = 0;
  size_t lastCount = ~size_t{0};
  for (size_t size = o_.minBytes; size <= o_.maxBytes; size = size == 0 ? 1 : size * o_.factor) {
    const bool last = size > o_.maxBytes / o_.factor;  // the next step passes -e (or overflows)
    const size_t count = size / unit;
    if (count == lastCount) {
      if (last) break;
      continue;
    }
    lastCount = count;
    Row r;
    r.count = count;
    if (!runSize(count, &r.us, &r.hostUs, &r.lat, &r.wrong)) return 1;
    r.bytes = count * unit;
    r.algbw = r.us > 0 ? r.bytes / r.us / 1e3 : 0;  // bytes/us/1e3 = GB/s
    r.busbw = r.algbw * (l_.nranks - 1) / l_.nranks;
    totalWrong += r.wrong;
    busbwSum += r.busbw;
    ++rows;
    if (l_.rank == 0) printRow(r);
    if (last) break;
  }
  if (l_.rank == 0) {
    printf("# Out of bounds values : %" PRId64 " %s\n", totalWrong,
           totalWrong == 0 ? "OK" : "FAILED");
    printf("# Avg bus bandwidth    : %.3f\n", rows > 0 ? busbwSum / rows : 0.0);
    printf("#\n");
    fflush(stdout);
  }
  return totalWrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  int rc = parseArgs(argc, argv, &o);
  if (rc != 0) return rc == 1 ? 0 : rc;
  if ((rc = fusco::perf::resolveMemMode(argv[0], &o.mem)) != 0) return rc;
  if (o.arena == 2 && o.mem != MemMode::Cuda) {
    fprintf(stderr, "%s: -a 2 (cudaMalloc + fuscoCommRegister) needs --mem cuda\n", argv[0]);
    return 2;
  }
  // --mps: a private daemon starts before the ranks are forked, so they inherit its environment,
  // and stops once they are done, a failed rank included.
  fusco::perf::MpsRequest req;
  req.mode = o.mps, req.np = o.launch.np, req.cudaMem = o.mem == MemMode::Cuda;
  fusco::perf::MpsRun mps;
  if ((rc = fusco::perf::startMps(argv[0], req, &mps)) != 0) return rc;
  o.mpsKind = mps.kind;  // the ranks' copy: forked after this
  rc = fusco::perf::launchRanks(o.launch, [&o](const Launch& l) {
    Rank rank(o, l);
    return rank.run();
  });
  return fusco::perf::stopMps(argv[0], &mps, rc);  // nothing in a forked rank (it returns here too)
}
