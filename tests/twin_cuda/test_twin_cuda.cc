// The twin CUDA runtime against what the CUDA documentation states, one test per behaviour, each
// naming the section of the CUDA programming guide (PG) or the runtime/driver API reference it
// checks. The program is compiled against the toolkit's headers and linked with
// fusco_twin_cudart instead of cudart, as the library will be.
//
// Tests that poison the context (a sticky error) or need a knob read at context creation run
// their body in a fresh process (a "threadsafe" death test: the binary re-executes itself), so
// the binary passes run whole as well as one test per process under ctest.
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "twin_cuda.h"
#include "twin_test.h"

namespace {

using twintest::Clock;
using twintest::msSince;

// Kernel identities of the twin: any distinct address.
const char kBusy = 0, kCopy = 0, kAppend = 0, kNeverLoaded = 0;

void registerKernels() {
  twincuda::registerKernel(&kBusy, "busy");
  twincuda::registerKernel(&kCopy, "copyKernel");
  twincuda::registerKernel(&kAppend, "append");
  twincuda::registerKernel(&kNeverLoaded, "neverLoadedKernel");
}

cudaError_t load(const void* k) {
  cudaFuncAttributes a;
  return cudaFuncGetAttributes(&a, k);
}

// A kernel that runs for `ms` (the [gpu] suite's spin kernel).
cudaError_t busy(cudaStream_t s, int ms, std::function<void()> after = nullptr) {
  twincuda::Launch l;
  l.kernel = &kBusy;
  l.stream = s;
  l.body = [ms, after] {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    if (after) after();
  };
  return twincuda::launch(std::move(l));
}

// A checked copy kernel: reads src, writes dst.
cudaError_t copyKernel(cudaStream_t s, void* dst, const void* src, size_t n) {
  twincuda::Launch l;
  l.kernel = &kCopy;
  l.stream = s;
  l.reads = {{src, n}};
  l.writes = {{dst, n}};
  l.body = [=] { std::memcpy(dst, src, n); };
  return twincuda::launch(std::move(l));
}

using BatchFn = CUresult (*)(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int);
using RangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

template <typename Fn>
Fn driverFn(const char* name) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<Fn>(f);
}

CUresult waitValue(cudaStream_t s, uint32_t* addr, uint32_t v, unsigned flags) {
  CUstreamBatchMemOpParams p{};
  p.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  p.waitValue.address = reinterpret_cast<CUdeviceptr>(addr);
  p.waitValue.value = v;
  p.waitValue.flags = flags;
  return driverFn<BatchFn>("cuStreamBatchMemOp")(s, 1, &p, 0);
}

CUresult writeValue(cudaStream_t s, uint32_t* addr, uint32_t v) {
  CUstreamBatchMemOpParams p{};
  p.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  p.writeValue.address = reinterpret_cast<CUdeviceptr>(addr);
  p.writeValue.value = v;
  return driverFn<BatchFn>("cuStreamBatchMemOp")(s, 1, &p, 0);
}

void storeFlag(uint32_t* f, uint32_t v) { __atomic_store_n(f, v, __ATOMIC_SEQ_CST); }

// ------------------------------------------------------------------ the exporting process
// The peer of the IPC tests: this binary started again with TWIN_CUDA_TEST_ROLE=exporter. A
// forked copy of a process whose CUDA context is live may not use CUDA (PG, "Initialization":
// CUDA does not support fork() after the context exists), so the child execs afresh, as rank
// processes of a real test are started. It allocates 4 MiB, fills it, sends the handle, then obeys
// one command: 'c' sends back the first word (the parent's write), 'x' exits at once (death).
constexpr size_t kIpcBytes = 4 << 20;
uint32_t pattern(size_t i) { return static_cast<uint32_t>(i * 2654435761u + 17); }

int exporterMain(int in, int out) {
  void* p = nullptr;
  if (cudaMalloc(&p, kIpcBytes) != cudaSuccess) return 2;
  std::vector<uint32_t> h(kIpcBytes / 4);
  for (size_t i = 0; i < h.size(); ++i) h[i] = pattern(i);
  if (cudaMemcpy(p, h.data(), kIpcBytes, cudaMemcpyHostToDevice) != cudaSuccess) return 3;
  cudaIpcMemHandle_t handle;
  if (cudaIpcGetMemHandle(&handle, p) != cudaSuccess) return 4;
  if (write(out, &handle, sizeof handle) != sizeof handle) return 5;
  for (;;) {
    char cmd = 0;
    if (read(in, &cmd, 1) != 1) return 0;
    if (cmd == 'x') return 0;
    uint32_t first = 0;
    if (cudaMemcpy(&first, p, 4, cudaMemcpyDeviceToHost) != cudaSuccess) return 6;
    if (write(out, &first, 4) != 4) return 7;
  }
}

const int kRoleRan = [] {
  const char* role = std::getenv("TWIN_CUDA_TEST_ROLE");
  if (role != nullptr && std::strcmp(role, "exporter") == 0) _exit(exporterMain(3, 4));
  return 0;
}();

struct Exporter {
  pid_t pid = -1;
  int toChild = -1, fromChild = -1;
  cudaIpcMemHandle_t handle{};

  bool start() {
    int a[2], b[2];
    if (pipe2(a, O_CLOEXEC) != 0 || pipe2(b, O_CLOEXEC) != 0) return false;
    pid = twintest::spawnSelf("exporter", {}, {{a[0], 3}, {b[1], 4}});
    close(a[0]);
    close(b[1]);
    toChild = a[1];
    fromChild = b[0];
    return pid > 0 && read(fromChild, &handle, sizeof handle) == sizeof handle;
  }
  bool command(char c) { return write(toChild, &c, 1) == 1; }
  int finish() {
    if (toChild >= 0) close(toChild);
    toChild = -1;
    int st = 0;
    if (pid > 0) waitpid(pid, &st, 0);
    pid = -1;
    if (fromChild >= 0) close(fromChild);
    fromChild = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  }
  ~Exporter() {
    if (pid > 0) finish();
  }
};

class TwinCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    registerKernels();
  }
};

}  // namespace

// PG "Streams": commands of one stream execute in issue order.
TEST_F(TwinCuda, StreamRunsItsItemsInIssueOrder) {
  ASSERT_EQ(load(&kAppend), cudaSuccess);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  std::mutex mu;
  std::vector<int> seen;
  for (int i = 0; i < 64; ++i) {
    twincuda::Launch l;
    l.kernel = &kAppend;
    l.stream = s;
    l.body = [&, i] {
      if (i % 7 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::lock_guard<std::mutex> g(mu);
      seen.push_back(i);
    };
    ASSERT_EQ(twincuda::launch(std::move(l)), cudaSuccess);
  }
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_EQ(seen.size(), 64u);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(seen[i], i);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// Runtime API, "API synchronization behavior": kernel launches and *Async calls return once
// enqueued; nothing drains behind the caller.
TEST_F(TwinCuda, CallsReturnBeforeTheirWorkRuns) {
  ASSERT_EQ(load(&kBusy), cudaSuccess);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 4096), cudaSuccess);
  std::vector<unsigned char> host(4096, 0x5a), back(4096, 0);
  const auto t0 = Clock::now();
  ASSERT_EQ(busy(s, 300), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d, host.data(), 4096, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), d, 4096, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_LT(msSince(t0), 100);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  EXPECT_EQ(back[0], 0);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_GE(msSince(t0), 290);
  EXPECT_EQ(back, host);
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
}

// PG "Events" and runtime API cudaStreamWaitEvent / cudaEventElapsedTime: a stream waits for the
// work recorded before the event on another stream.
TEST_F(TwinCuda, AnEventOrdersWorkAcrossStreams) {
  ASSERT_EQ(load(&kBusy), cudaSuccess);
  cudaStream_t a, b;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t start, done;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&done), cudaSuccess);
  std::atomic<int> x{0}, seen{-1};
  ASSERT_EQ(cudaEventRecord(start, a), cudaSuccess);
  ASSERT_EQ(busy(a, 200, [&] { x = 1; }), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(done, a), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b, done, 0), cudaSuccess);
  ASSERT_EQ(busy(b, 0, [&] { seen = x.load(); }), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done), cudaErrorNotReady);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_EQ(seen.load(), 1);
  EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
  float ms = 0;
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, done), cudaSuccess);
  EXPECT_GE(ms, 150.f);
  cudaEvent_t untimed;
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(untimed, a), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(untimed), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, untimed), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
}

// Runtime API "Stream synchronization behavior": the legacy default stream waits for the blocking
// streams' earlier work; a cudaStreamNonBlocking stream does not.
TEST_F(TwinCuda, TheLegacyStreamWaitsForBlockingStreamsOnly) {
  ASSERT_EQ(load(&kBusy), cudaSuccess);
  cudaStream_t blocking, nonBlocking;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&nonBlocking, cudaStreamNonBlocking), cudaSuccess);
  std::atomic<bool> busyDone{false};
  std::atomic<int> legacySaw{-1}, nonBlockingSaw{-1};
  ASSERT_EQ(busy(blocking, 300, [&] { busyDone = true; }), cudaSuccess);
  ASSERT_EQ(busy(0, 0, [&] { legacySaw = busyDone.load(); }), cudaSuccess);
  ASSERT_EQ(busy(nonBlocking, 0, [&] { nonBlockingSaw = busyDone.load(); }), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nonBlocking), cudaSuccess);
  EXPECT_EQ(nonBlockingSaw.load(), 0);
  ASSERT_EQ(cudaStreamSynchronize(0), cudaSuccess);
  EXPECT_EQ(legacySaw.load(), 1);
}

// Driver API "Stream Memory Operations" (cuStreamBatchMemOp, through
// cudaGetDriverEntryPointByVersion as the library takes it): a wait holds its stream until the
// value holds; a write follows it. Driver API cuMemGetAddressRange: the allocation holding a
// pointer.
TEST_F(TwinCuda, MemoryOperationsWaitAndWriteThroughTheDriverEntryPoint) {
  ASSERT_NE(driverFn<BatchFn>("cuStreamBatchMemOp"), nullptr);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  uint32_t* flag = nullptr;
  uint32_t* done = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&flag), 8), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&done), 8), cudaSuccess);
  flag[0] = 0;
  done[0] = 0;
  ASSERT_EQ(waitValue(s, flag, 5, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
  ASSERT_EQ(writeValue(s, done, 7), CUDA_SUCCESS);
  ASSERT_EQ(waitValue(s, flag, 9, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
  ASSERT_EQ(writeValue(s, done, 8), CUDA_SUCCESS);
  storeFlag(flag, 3);  // below the GEQ value: nothing moves
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(__atomic_load_n(done, __ATOMIC_SEQ_CST), 0u);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  storeFlag(flag, 10);  // GEQ 5 holds, EQ 9 does not
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(__atomic_load_n(done, __ATOMIC_SEQ_CST), 7u);
  storeFlag(flag, 9);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(done[0], 8u);

  RangeFn range = driverFn<RangeFn>("cuMemGetAddressRange");
  ASSERT_NE(range, nullptr);
  CUdeviceptr base = 0;
  size_t bytes = 0;
  ASSERT_EQ(range(&base, &bytes, reinterpret_cast<CUdeviceptr>(done) + 4), CUDA_SUCCESS);
  EXPECT_EQ(base, reinterpret_cast<CUdeviceptr>(done));
  EXPECT_GE(bytes, 8u);
  int onStack = 0;
  EXPECT_EQ(range(&base, &bytes, reinterpret_cast<CUdeviceptr>(&onStack)), CUDA_ERROR_NOT_FOUND);
}

// Runtime API cudaPointerGetAttributes: device, pinned, registered (reported as host memory) and
// unknown (cudaMemoryTypeUnregistered) memory.
TEST_F(TwinCuda, PointerAttributesNameEachKindOfMemory) {
  void *d, *h;
  ASSERT_EQ(cudaMalloc(&d, 100), cudaSuccess);
  ASSERT_EQ(cudaHostAlloc(&h, 100, cudaHostAllocMapped), cudaSuccess);
  std::vector<char> reg(4096), plain(64);
  ASSERT_EQ(cudaHostRegister(reg.data(), reg.size(), cudaHostRegisterDefault), cudaSuccess);
  EXPECT_EQ(cudaHostRegister(reg.data() + 8, 8, 0), cudaErrorHostMemoryAlreadyRegistered);
  cudaGetLastError();
  cudaPointerAttributes a;
  ASSERT_EQ(cudaPointerGetAttributes(&a, static_cast<char*>(d) + 50), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  ASSERT_EQ(cudaPointerGetAttributes(&a, h), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  ASSERT_EQ(cudaPointerGetAttributes(&a, reg.data() + 100), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  ASSERT_EQ(cudaPointerGetAttributes(&a, plain.data()), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  void* dh = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(&dh, h, 0), cudaSuccess);
  EXPECT_EQ(dh, h);
  EXPECT_EQ(cudaHostGetDevicePointer(&dh, plain.data(), 0), cudaErrorInvalidValue);
  cudaGetLastError();
  EXPECT_EQ(cudaHostUnregister(reg.data()), cudaSuccess);
  ASSERT_EQ(cudaPointerGetAttributes(&a, reg.data()), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  EXPECT_EQ(cudaFreeHost(h), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
}

// PG "CUDA Graphs" / "Creating a Graph Using Stream Capture": captured work does not run; each
// launch of the instantiated graph replays it, reading the inputs as they are at the replay.
TEST_F(TwinCuda, ACaptureReplaysWithNewInputValues) {
  ASSERT_EQ(load(&kCopy), cudaSuccess);
  ASSERT_EQ(load(&kAppend), cudaSuccess);
  constexpr size_t n = 256;
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  uint32_t *in, *out, *hostIn, *hostOut;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&in), n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), n * 4), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&hostIn), n * 4), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&hostOut), n * 4), cudaSuccess);
  std::memset(hostOut, 0xa5, n * 4);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaStreamCaptureStatus st;
  ASSERT_EQ(cudaStreamIsCapturing(s, &st), cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusActive);
  ASSERT_EQ(cudaMemcpyAsync(in, hostIn, n * 4, cudaMemcpyHostToDevice, s), cudaSuccess);
  twincuda::Launch l;  // out = 3 * in + 1
  l.kernel = &kAppend;
  l.stream = s;
  l.reads = {{in, n * 4}};
  l.writes = {{out, n * 4}};
  l.body = [=] {
    for (size_t i = 0; i < n; ++i) out[i] = 3 * in[i] + 1;
  };
  ASSERT_EQ(twincuda::launch(std::move(l)), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(hostOut, out, n * 4, cudaMemcpyDeviceToHost, s), cudaSuccess);
  cudaGraph_t g = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  ASSERT_NE(g, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(hostOut[0], 0xa5a5a5a5u) << "captured work ran";
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
  for (uint32_t r = 0; r < 5; ++r) {
    for (size_t i = 0; i < n; ++i) hostIn[i] = r * 1000 + static_cast<uint32_t>(i);
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(hostOut[i], 3 * (r * 1000 + i) + 1) << "replay " << r;
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(g), cudaSuccess);
}

// Runtime API cudaStreamBeginCapture / cudaThreadExchangeStreamCaptureMode: under a global-mode
// capture, another thread's cudaMalloc (a "potentially unsafe API call") is refused and the
// capture is invalidated; a thread-local capture, or a thread in relaxed mode, allows it.
TEST_F(TwinCuda, AGlobalCaptureRefusesCudaMallocOnAnotherThread) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  auto mallocElsewhere = [](bool relaxed) {
    cudaError_t e = cudaErrorUnknown;
    std::thread t([&] {
      if (relaxed) {
        cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
        cudaThreadExchangeStreamCaptureMode(&m);
      }
      void* p = nullptr;
      e = cudaMalloc(&p, 64);
      if (e == cudaSuccess) cudaFree(p);
    });
    t.join();
    return e;
  };
  cudaGraph_t g = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  testing::internal::CaptureStderr();
  EXPECT_EQ(mallocElsewhere(false), cudaErrorStreamCaptureUnsupported);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("cudaMalloc is not permitted while stream"), std::string::npos) << err;
  EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(g, nullptr);
  cudaGetLastError();

  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(mallocElsewhere(true), cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  cudaGraphDestroy(g);

  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(mallocElsewhere(false), cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);  // on the capturing thread
  EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
}

// Runtime API "Interprocess Communication" (cudaIpcGetMemHandle / cudaIpcOpenMemHandle): another
// process's allocation is mapped, after FUSCO_TWIN_IPC_OPEN_US (the delayed acknowledgement), and
// both processes see each other's writes. Opening it again counts a reference.
TEST_F(TwinCuda, IpcOpenWaitsForTheDelayAndMapsAnotherProcesssMemory) {
  ASSERT_EQ(load(&kCopy), cudaSuccess);
  setenv("FUSCO_TWIN_IPC_OPEN_US", "50000", 1);
  Exporter peer;
  ASSERT_TRUE(peer.start());
  void* p = nullptr;
  const auto t0 = Clock::now();
  ASSERT_EQ(cudaIpcOpenMemHandle(&p, peer.handle, cudaIpcMemLazyEnablePeerAccess), cudaSuccess);
  EXPECT_GE(msSince(t0), 50);
  cudaPointerAttributes a;
  ASSERT_EQ(cudaPointerGetAttributes(&a, p), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  void* again = nullptr;
  ASSERT_EQ(cudaIpcOpenMemHandle(&again, peer.handle, cudaIpcMemLazyEnablePeerAccess), cudaSuccess);
  EXPECT_EQ(again, p);
  uint32_t* local = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&local), kIpcBytes), cudaSuccess);
  ASSERT_EQ(copyKernel(0, local, p, kIpcBytes), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (size_t i = 0; i < kIpcBytes / 4; i += 4099) ASSERT_EQ(local[i], pattern(i)) << i;
  const uint32_t mark = 0xfeedf00d;
  ASSERT_EQ(cudaMemcpy(p, &mark, 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_TRUE(peer.command('c'));
  uint32_t echoed = 0;
  ASSERT_EQ(read(peer.fromChild, &echoed, 4), 4);
  EXPECT_EQ(echoed, mark);
  EXPECT_EQ(cudaIpcCloseMemHandle(p), cudaSuccess);
  EXPECT_EQ(cudaIpcCloseMemHandle(p), cudaSuccess);
  EXPECT_EQ(peer.finish(), 0);
  unsetenv("FUSCO_TWIN_IPC_OPEN_US");
}

// Runtime API cudaError (cudaErrorIllegalAddress): an access outside the memory the process may
// touch faults, the error is sticky ("any further CUDA work will return the same error"), and the
// twin prints and counts it.
TEST_F(TwinCuda, AnAccessOutsideMappedMemoryIsAStickyIllegalAddress) {
  auto body = [] {
    CHILD_CHECK(load(&kCopy) == cudaSuccess);
    std::vector<char> pageable(256, 1);
    void* d = nullptr;
    CHILD_CHECK(cudaMalloc(&d, 256) == cudaSuccess);
    CHILD_CHECK(copyKernel(0, d, pageable.data(), 256) == cudaSuccess);  // enqueued: no check yet
    CHILD_CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
    CHILD_CHECK(twincuda::illegalAddressCount() == 1);
    CHILD_CHECK(static_cast<char*>(d)[0] == 0);  // the faulting kernel did not run
    void* more = nullptr;
    CHILD_CHECK(cudaMalloc(&more, 64) == cudaErrorIllegalAddress);
    CHILD_CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
    CHILD_CHECK(cudaGetLastError() == cudaErrorIllegalAddress);  // not reset: sticky
    return 0;
  };
  EXPECT_ISOLATED(body, "twin-cuda: illegal address: read of 256 bytes at .* by kernel copyKernel");
}

// PG "Lazy Loading: Potential Hazards" and runtime API notes on implicit synchronization: a setup
// call waits for the device; one held by a stream wait nobody releases would wait for ever on a
// GPU. The twin fails it past FUSCO_TWIN_SYNC_LIMIT_MS, naming the item that held it.
TEST_F(TwinCuda, ASetupCallWaitsForBusyStreamsAndFailsPastTheLimitNamingTheHolder) {
  ASSERT_EQ(load(&kBusy), cudaSuccess);
  setenv("FUSCO_TWIN_SYNC_LIMIT_MS", "300", 1);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  void* p = nullptr;
  auto t0 = Clock::now();
  ASSERT_EQ(busy(s, 150), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&p, 64), cudaSuccess);
  EXPECT_GE(msSince(t0), 140) << "cudaMalloc did not wait for the busy stream";
  uint32_t* flag = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&flag), 4), cudaSuccess);
  *flag = 0;
  ASSERT_EQ(waitValue(s, flag, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
  const uint64_t before = twincuda::syncLimitCount();
  testing::internal::CaptureStderr();
  t0 = Clock::now();
  EXPECT_EQ(cudaFree(p), cudaErrorTimeout);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_GE(msSince(t0), 290);
  EXPECT_EQ(twincuda::syncLimitCount(), before + 1);
  EXPECT_NE(err.find("twin-cuda: cudaFree waited for the stream stream"), std::string::npos) << err;
  EXPECT_NE(err.find("held by cuStreamBatchMemOp wait-value-32 GEQ 1 at"), std::string::npos)
      << err;
  cudaGetLastError();
  storeFlag(flag, 1);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  unsetenv("FUSCO_TWIN_SYNC_LIMIT_MS");
}

// PG "Lazy Loading": a kernel is loaded at its first use; the twin refuses a launch of a kernel
// no one loaded (cudaFuncGetAttributes), naming it, and launches it once loaded, also through
// cudaLaunchKernelEx (the C++ template the headers turn into cudaLaunchKernelExC).
void exKernel(int* out) { (void)out; }

cudaError_t exLauncher(const cudaLaunchConfig_t* cfg, void** args) {
  int* out = *static_cast<int**>(args[0]);
  twincuda::Launch l;
  l.kernel = reinterpret_cast<const void*>(&exKernel);
  l.stream = cfg->stream;
  l.writes = {{out, sizeof(int)}};
  l.body = [out] { *out = 42; };
  return twincuda::launch(std::move(l));
}

TEST_F(TwinCuda, AKernelLaunchedBeforeItIsLoadedIsRefused) {
  // In a fresh process: no kernel is loaded there yet, however often the test is repeated.
  auto body = [] {
    twincuda::Launch l;
    l.kernel = &kNeverLoaded;
    l.body = [] {};
    CHILD_CHECK(twincuda::launch(l) == cudaErrorInvalidDeviceFunction);
    CHILD_CHECK(twincuda::refusedLaunchCount() == 1);
    cudaGetLastError();
    CHILD_CHECK(load(&kNeverLoaded) == cudaSuccess);
    CHILD_CHECK(twincuda::launch(l) == cudaSuccess);

    twincuda::registerKernel(reinterpret_cast<const void*>(&exKernel), "exKernel", exLauncher);
    int* out = nullptr;
    CHILD_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), sizeof(int)) == cudaSuccess);
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(32);
    CHILD_CHECK(cudaLaunchKernelEx(&cfg, exKernel, out) == cudaErrorInvalidDeviceFunction);
    cudaGetLastError();
    cudaFuncAttributes fa;
    CHILD_CHECK(cudaFuncGetAttributes(&fa, reinterpret_cast<const void*>(&exKernel)) ==
                cudaSuccess);
    int blocks = 0;
    CHILD_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                    &blocks, reinterpret_cast<const void*>(&exKernel), 256, 0) == cudaSuccess);
    CHILD_CHECK(blocks == 8);
    CHILD_CHECK(cudaLaunchKernelEx(&cfg, exKernel, out) == cudaSuccess);
    CHILD_CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHILD_CHECK(*out == 42);
    CHILD_CHECK(twincuda::refusedLaunchCount() == 2);
    return 0;
  };
  EXPECT_ISOLATED(body,
                  "kernel neverLoadedKernel launched before it was loaded(.|\n)*kernel exKernel "
                  "launched before it was loaded");
}

// Runtime API "Interprocess Communication": legacy IPC leaves access to an exited exporter's
// memory undefined (under MPS it faults). The twin takes the mappings away when the exporter
// exits, so the next access is an illegal address.
TEST_F(TwinCuda, APeersDeathTakesItsMemoryAway) {
  auto body = [] {
    CHILD_CHECK(load(&kCopy) == cudaSuccess);
    Exporter peer;
    CHILD_CHECK(peer.start());
    void* p = nullptr;
    CHILD_CHECK(cudaIpcOpenMemHandle(&p, peer.handle, cudaIpcMemLazyEnablePeerAccess) ==
                cudaSuccess);
    void* local = nullptr;
    CHILD_CHECK(cudaMalloc(&local, 4096) == cudaSuccess);
    CHILD_CHECK(copyKernel(0, local, p, 4096) == cudaSuccess);
    CHILD_CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHILD_CHECK(peer.command('x'));
    CHILD_CHECK(peer.finish() == 0);
    const auto t0 = Clock::now();
    while (twincuda::revokedMappingCount() == 0 && msSince(t0) < 5000)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHILD_CHECK(twincuda::revokedMappingCount() == 1);
    CHILD_CHECK(copyKernel(0, local, p, 4096) == cudaSuccess);
    CHILD_CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
    CHILD_CHECK(twincuda::illegalAddressCount() == 1);
    return 0;
  };
  EXPECT_ISOLATED(body,
                  "exited: 1 IPC mapping.*taken away(.|\n)*twin-cuda: illegal address: read "
                  "of 4096 bytes .* which exited");
}

// PG "Asynchronous Concurrent Execution" / CUDA_DEVICE_MAX_CONNECTIONS: streams share the
// hardware work queues; with one connection, a memory-operation wait at the head of the queue
// holds every other stream's work behind it.
TEST_F(TwinCuda, OneConnectionHoldsEveryStreamBehindAWait) {
  auto body = [] {
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 1);
    CHILD_CHECK(load(&kBusy) == cudaSuccess);
    cudaStream_t a, b;
    CHILD_CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
    CHILD_CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
    uint32_t* flag = nullptr;
    CHILD_CHECK(cudaMallocHost(reinterpret_cast<void**>(&flag), 4) == cudaSuccess);
    *flag = 0;
    cudaEvent_t e;
    CHILD_CHECK(cudaEventCreate(&e) == cudaSuccess);
    CHILD_CHECK(waitValue(a, flag, 1, CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS);
    CHILD_CHECK(busy(b, 0) == cudaSuccess);
    CHILD_CHECK(cudaEventRecord(e, b) == cudaSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHILD_CHECK(cudaEventQuery(e) == cudaErrorNotReady);
    fprintf(stderr, "another stream waited behind the wait\n");
    storeFlag(flag, 1);
    CHILD_CHECK(cudaEventSynchronize(e) == cudaSuccess);
    return 0;
  };
  EXPECT_ISOLATED(body, "another stream waited");
}

// The same with the default 8 connections: the two streams are on different queues.
TEST_F(TwinCuda, EightConnectionsLetAnotherStreamPassAWait) {
  ASSERT_EQ(load(&kBusy), cudaSuccess);
  cudaStream_t a, b;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  uint32_t* flag = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&flag), 4), cudaSuccess);
  *flag = 0;
  cudaEvent_t e;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  ASSERT_EQ(waitValue(a, flag, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
  ASSERT_EQ(busy(b, 0), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, b), cudaSuccess);
  const auto t0 = Clock::now();
  while (cudaEventQuery(e) == cudaErrorNotReady && msSince(t0) < 200)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  cudaGetLastError();
  storeFlag(flag, 1);
  ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
}
