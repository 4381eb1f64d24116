// Low-latency calls and checked rounds on CUDA comms (see gpu_ll.h).
#include "gpu/gpu_ll.h"

#include <cstring>

#include "harness/data_gen.h"
#include "harness/ll_cases.h"

namespace fusco::test::gpu {

namespace {

template <class T>
void reload(DevBuf& b, const std::vector<T>& v) {
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
}

}  // namespace

LlDevInputs llUpload(fuscoComm_t comm, const LlInputs& in, int rank) {
  LlDevInputs b;
  b.x = toDevice(comm, in.x[rank]);
  b.idx = toDevice(comm, in.topkIdx[rank]);
  b.w = toDevice(comm, in.weights[rank]);
  return b;
}

void llReload(LlDevInputs& b, const LlInputs& in, int rank) {
  reload(b.x, in.x[rank]);
  reload(b.idx, in.topkIdx[rank]);
  reload(b.w, in.weights[rank]);
}

fuscoResult_t llGpuDispatch(fuscoLowLatency_t ll, const LlDevInputs& b, const LlInputs& in,
                            int rank, int format, unsigned int flags, fuscoLowLatencyDispatch_t* d,
                            cudaStream_t stream) {
  return fuscoLowLatencyDispatch(ll, b.xPtr(), b.idxPtr(), in.c.numTokens[rank], in.c.topk, format,
                                 flags, d, stream);
}

fuscoResult_t llGpuCombine(fuscoLowLatency_t ll, const fuscoLowLatencyDispatch_t* d,
                           const DevBuf& expertOut, const LlDevInputs& b, const LlInputs& in,
                           int rank, bool weighted, unsigned int flags, void* out,
                           unsigned long long* hook, cudaStream_t stream) {
  return fuscoLowLatencyCombine(ll, d, expertOut.get(), b.idxPtr(), weighted ? b.wPtr() : nullptr,
                                in.c.numTokens[rank], in.c.topk, out, flags, hook, stream);
}

::testing::AssertionResult llFinish(cudaStream_t s, fuscoComm_t comm, const std::string& what) {
  const cudaError_t e = syncWithin(s, kLlWaitSec);
  if (e == cudaErrorNotReady)
    return ::testing::AssertionFailure()
           << what << " did not complete within " << kLlWaitSec << " s";
  if (e != cudaSuccess) return ::testing::AssertionFailure() << streamSyncFailure(e, what);
  fuscoResult_t async = fuscoSuccess;
  const fuscoResult_t r = fuscoCommGetAsyncError(comm, &async);
  if (r == fuscoSuccess && async == fuscoSuccess) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": fuscoCommGetAsyncError -> " << fuscoGetErrorString(r) << ", async "
         << fuscoGetErrorString(async) << ": " << fuscoGetLastError(comm);
}

LlRecv llFetchDevice(const fuscoLowLatencyDispatch_t& d, const LlCase& c, int format) {
  return llFetch(d, c, format, [](void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return true;
    const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
    EXPECT_EQ(e, cudaSuccess) << "copying a receive output back: " << cudaGetErrorName(e);
    return e == cudaSuccess;
  });
}

DevBuf llDevExpertOut(fuscoComm_t comm, const LlCase& c, int format, int rank, const LlRecv& got) {
  const std::vector<uint8_t> host = llExpertOut(c, format, rank, got);
  DevBuf b(comm, host.size());
  b.upload(host);
  return b;
}

bool llGpuDispatchChecked(fuscoComm_t comm, fuscoLowLatency_t ll, const RankCtx& ctx,
                          const LlInputs& in, const LlDevInputs& b, const LlGpuRound& o,
                          cudaStream_t stream, const std::string& what,
                          fuscoLowLatencyDispatch_t* d, LlRecv* got) {
  std::memset(d, kPoison, sizeof *d);
  const unsigned int flags = o.hook ? FUSCO_LL_RECV_HOOK : 0;
  fuscoResult_t r = llGpuDispatch(ll, b, in, ctx.rank, o.format, flags, d, stream);
  EXPECT_EQ(r, fuscoSuccess) << what << " dispatch -> " << fuscoGetErrorString(r) << ": "
                             << fuscoGetLastError(comm);
  if (r != fuscoSuccess) return false;
  EXPECT_TRUE(llDispatchFields(*d, o.format, o.buffer < 0 ? d->buffer : o.buffer, o.hook))
      << what << " dispatch";
  if (o.hook) {
    const cudaStream_t hs = o.hookStream != nullptr ? o.hookStream : stream;
    r = fuscoLowLatencyRecvHook(ll, d->hook, hs);
    EXPECT_EQ(r, fuscoSuccess) << what << " dispatch hook -> " << fuscoGetErrorString(r) << ": "
                               << fuscoGetLastError(comm);
    if (r != fuscoSuccess) return false;
    if (hs != stream) {
      EXPECT_TRUE(llFinish(hs, comm, what + " dispatch hook stream"));
    }
  }
  const ::testing::AssertionResult done = llFinish(stream, comm, what + " dispatch");
  EXPECT_TRUE(done);
  if (!done) return false;
  *got = llFetchDevice(*d, in.c, o.format);
  EXPECT_TRUE(llRecvMatches(in.c, o.format, llRefDispatch(in, ctx.rank, o.format), *got))
      << what << " rank " << ctx.rank << " received";
  return true;
}

std::vector<uint8_t> llGpuCombineChecked(fuscoComm_t comm, fuscoLowLatency_t ll, const RankCtx& ctx,
                                         const LlInputs& in, const LlDevInputs& b,
                                         const LlGpuRound& o, const fuscoLowLatencyDispatch_t& d,
                                         const LlRecv& got, cudaStream_t stream,
                                         const std::string& what) {
  const size_t bytes = static_cast<size_t>(in.c.numTokens[ctx.rank]) * in.c.hidden * 2;
  DevBuf out = poisonedBuf(comm, bytes + kTailBytes);
  const DevBuf eo = llDevExpertOut(comm, in.c, o.format, ctx.rank, got);
  const std::string how = what + (o.weighted ? " combine" : " combine (NULL weights)");
  unsigned long long hook = 0;
  fuscoResult_t r =
      llGpuCombine(ll, &d, eo, b, in, ctx.rank, o.weighted, o.hook ? FUSCO_LL_RECV_HOOK : 0,
                   bytes ? out.get() : nullptr, o.hook ? &hook : nullptr, stream);
  EXPECT_EQ(r, fuscoSuccess) << how << " -> " << fuscoGetErrorString(r) << ": "
                             << fuscoGetLastError(comm);
  if (r != fuscoSuccess) return {};
  if (o.hook) {
    EXPECT_NE(hook, 0u) << how << " with FUSCO_LL_RECV_HOOK gave no hook";
    const cudaStream_t hs = o.hookStream != nullptr ? o.hookStream : stream;
    r = fuscoLowLatencyRecvHook(ll, hook, hs);
    EXPECT_EQ(r, fuscoSuccess) << how << " hook -> " << fuscoGetErrorString(r) << ": "
                               << fuscoGetLastError(comm);
    if (r != fuscoSuccess) return {};
    if (hs != stream) {
      EXPECT_TRUE(llFinish(hs, comm, how + " hook stream"));
    }
  }
  const ::testing::AssertionResult done = llFinish(stream, comm, how);
  EXPECT_TRUE(done);
  if (!done) return {};
  std::vector<uint8_t> host = out.download();
  EXPECT_EQ(findNotPoison(host.data() + bytes, kTailBytes), SIZE_MAX)
      << how << " wrote past numTokens * hidden";
  host.resize(bytes);
  EXPECT_TRUE(llOutMatches(llRefCombine(in, ctx.rank, o.format, o.weighted), host, in.c.hidden,
                           how + " rank " + std::to_string(ctx.rank)));
  return host;
}

std::vector<uint8_t> llGpuRoundChecked(fuscoComm_t comm, fuscoLowLatency_t ll, const RankCtx& ctx,
                                       const LlInputs& in, const LlGpuRound& o, cudaStream_t stream,
                                       const std::string& what) {
  const LlDevInputs b = llUpload(comm, in, ctx.rank);
  fuscoLowLatencyDispatch_t d;
  LlRecv got;
  if (!llGpuDispatchChecked(comm, ll, ctx, in, b, o, stream, what, &d, &got)) return {};
  return llGpuCombineChecked(comm, ll, ctx, in, b, o, d, got, stream, what);
}

}  // namespace fusco::test::gpu
