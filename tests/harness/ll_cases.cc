// Low-latency calls and checked rounds on host communicators (see ll_cases.h).
#include "harness/ll_cases.h"

#include <gtest/gtest.h>

#include <cstring>
#include <regex>

#include "harness/data_gen.h"

namespace fusco::test {

namespace {

template <class T>
const T* orNull(const std::vector<T>& v) {
  return v.empty() ? nullptr : v.data();
}

}  // namespace

fuscoConfig_t llCommConfig(const RankCtx& ctx, int timeoutMs) {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = timeoutMs;
  cfg.localSize = ctx.nranks;
  return cfg;
}

LlCase llSmallCase(int n) {
  LlCase c;
  c.nranks = n;
  c.numExperts = 2 * n;
  c.topk = 2;
  c.maxTopk = 2;
  c.maxTokensPerRank = 4;
  c.hidden = 128;
  c.numTokens.assign(n, 2);
  return c;
}

fuscoLowLatency_t llCreate(fuscoComm_t comm, const LlCase& c) {
  const fuscoLowLatencyConfig_t cfg = llConfig(c);
  fuscoLowLatency_t ll = nullptr;
  const fuscoResult_t r = fuscoLowLatencyCreate(&ll, comm, &cfg);
  EXPECT_EQ(r, fuscoSuccess) << "fuscoLowLatencyCreate " << llCaseName(c, FUSCO_LL_BF16) << " -> "
                             << fuscoGetErrorString(r) << ": " << fuscoGetLastError(comm);
  EXPECT_TRUE(r != fuscoSuccess || ll != nullptr) << "fuscoLowLatencyCreate gave a NULL handle";
  return r == fuscoSuccess ? ll : nullptr;
}

fuscoResult_t llDispatchCall(fuscoLowLatency_t ll, const LlInputs& in, int rank, int format,
                             unsigned int flags, fuscoLowLatencyDispatch_t* d) {
  return fuscoLowLatencyDispatch(ll, orNull(in.x[rank]), orNull(in.topkIdx[rank]),
                                 in.c.numTokens[rank], in.c.topk, format, flags, d, nullptr);
}

fuscoResult_t llCombineCall(fuscoLowLatency_t ll, const fuscoLowLatencyDispatch_t* d,
                            const LlInputs& in, int rank, const std::vector<uint8_t>& expertOut,
                            bool weighted, unsigned int flags, void* out,
                            unsigned long long* hook) {
  return fuscoLowLatencyCombine(ll, d, expertOut.data(), orNull(in.topkIdx[rank]),
                                weighted ? orNull(in.weights[rank]) : nullptr, in.c.numTokens[rank],
                                in.c.topk, out, flags, hook, nullptr);
}

::testing::AssertionResult llDispatchFields(const fuscoLowLatencyDispatch_t& d, int format,
                                            int buffer, bool hooked) {
  auto fail = ::testing::AssertionFailure();
  bool ok = true;
  if (d.buffer != buffer) {
    fail << " buffer " << d.buffer << ", expected " << buffer << ";";
    ok = false;
  }
  if (d.format != format) {
    fail << " format " << d.format << ", expected " << format << ";";
    ok = false;
  }
  if (hooked != (d.hook != 0)) {
    fail << " hook " << d.hook << (hooked ? ", expected one;" : ", expected 0 without the flag;");
    ok = false;
  }
  if (d.recvX == nullptr || d.recvCount == nullptr || d.recvLayout == nullptr ||
      d.recvSrcToken == nullptr) {
    fail << " a receive output is NULL;";
    ok = false;
  }
  if ((format == FUSCO_LL_FP8) != (d.recvScales != nullptr)) {
    fail << " recvScales " << static_cast<const void*>(d.recvScales)
         << (format == FUSCO_LL_FP8 ? ", expected the scales;" : ", expected NULL for BF16;");
    ok = false;
  }
  return ok ? ::testing::AssertionSuccess() : fail;
}

LlRecv llFetchHost(const fuscoLowLatencyDispatch_t& d, const LlCase& c, int format) {
  return llFetch(d, c, format, [](void* dst, const void* src, size_t bytes) {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return true;
  });
}

bool llDispatchChecked(fuscoComm_t comm, fuscoLowLatency_t ll, const RankCtx& ctx,
                       const LlInputs& in, const LlRound& o, const std::string& what,
                       fuscoLowLatencyDispatch_t* d, LlRecv* got) {
  std::memset(d, kPoison, sizeof *d);
  fuscoResult_t r = llDispatchCall(ll, in, ctx.rank, o.format, o.hook ? FUSCO_LL_RECV_HOOK : 0, d);
  // A refused slot (repeated or invalid id) fails this rank's call after it completed with its
  // peers; everything else arrives.
  int badToken = -1, badSlot = -1;
  const bool refused = llRefFirstRefused(in, ctx.rank, &badToken, &badSlot);
  const fuscoResult_t want = refused ? fuscoInvalidArgument : fuscoSuccess;
  EXPECT_EQ(r, want) << what << " dispatch -> " << fuscoGetErrorString(r) << ": "
                     << fuscoGetLastError(comm);
  if (r != want) return false;
  if (refused) {
    const std::string msg = fuscoGetLastError(comm);
    EXPECT_TRUE(llNamesNumber(msg, "token", badToken) && llNamesNumber(msg, "slot", badSlot))
        << what << ": " << msg;
  }
  EXPECT_TRUE(llDispatchFields(*d, o.format, o.buffer, o.hook)) << what << " dispatch";
  if (o.hook) {
    r = fuscoLowLatencyRecvHook(ll, d->hook, nullptr);
    EXPECT_EQ(r, fuscoSuccess) << what << " dispatch hook -> " << fuscoGetErrorString(r) << ": "
                               << fuscoGetLastError(comm);
    if (r != fuscoSuccess) return false;
  }
  *got = llFetchHost(*d, in.c, o.format);
  EXPECT_TRUE(llRecvMatches(in.c, o.format, llRefDispatch(in, ctx.rank, o.format), *got))
      << what << " rank " << ctx.rank << " received";
  return true;
}

std::vector<uint8_t> llCombineChecked(fuscoComm_t comm, fuscoLowLatency_t ll, const RankCtx& ctx,
                                      const LlInputs& in, const LlRound& o,
                                      const fuscoLowLatencyDispatch_t& d, const LlRecv& got,
                                      const std::string& what) {
  const size_t bytes = static_cast<size_t>(in.c.numTokens[ctx.rank]) * in.c.hidden * 2;
  std::vector<uint8_t> out(bytes + kLlTailBytes, kPoison);
  const std::vector<uint8_t> expertOut = llExpertOut(in.c, o.format, ctx.rank, got);
  unsigned long long hook = 0;
  const std::string how = what + (o.weighted ? " combine" : " combine (NULL weights)");
  fuscoResult_t r =
      llCombineCall(ll, &d, in, ctx.rank, expertOut, o.weighted, o.hook ? FUSCO_LL_RECV_HOOK : 0,
                    bytes ? out.data() : nullptr, o.hook ? &hook : nullptr);
  EXPECT_EQ(r, fuscoSuccess) << how << " -> " << fuscoGetErrorString(r) << ": "
                             << fuscoGetLastError(comm);
  if (r != fuscoSuccess) return {};
  if (o.hook) {
    EXPECT_NE(hook, 0u) << how << " with FUSCO_LL_RECV_HOOK gave no hook";
    r = fuscoLowLatencyRecvHook(ll, hook, nullptr);
    EXPECT_EQ(r, fuscoSuccess) << how << " hook -> " << fuscoGetErrorString(r) << ": "
                               << fuscoGetLastError(comm);
    if (r != fuscoSuccess) return {};
  }
  EXPECT_EQ(findNotPoison(out.data() + bytes, kLlTailBytes), SIZE_MAX)
      << how << " wrote past numTokens * hidden";
  out.resize(bytes);
  const std::vector<uint8_t> want = llRefCombine(in, ctx.rank, o.format, o.weighted);
  EXPECT_TRUE(llOutMatches(want, out, in.c.hidden, how + " rank " + std::to_string(ctx.rank)));
  return out;
}

std::vector<uint8_t> llRoundChecked(fuscoComm_t comm, fuscoLowLatency_t ll, const RankCtx& ctx,
                                    const LlInputs& in, const LlRound& o, const std::string& what) {
  fuscoLowLatencyDispatch_t d;
  LlRecv got;
  if (!llDispatchChecked(comm, ll, ctx, in, o, what, &d, &got)) return {};
  return llCombineChecked(comm, ll, ctx, in, o, d, got, what);
}

void llFormatRounds(const RankCtx& ctx, const std::function<LlInputs(int format)>& in,
                    const std::string& label) {
  fuscoConfig_t cfg = llCommConfig(ctx);
  fuscoComm_t comm = initComm(ctx, &cfg);
  fuscoLowLatency_t ll = llCreate(comm, in(FUSCO_LL_BF16).c);
  ASSERT_NE(ll, nullptr);
  LlRound o;
  for (int format : {FUSCO_LL_BF16, FUSCO_LL_FP8}) {
    o.format = format;
    const LlInputs inputs = in(format);
    llRoundChecked(comm, ll, ctx, inputs, o, llCaseName(inputs.c, format) + " " + label);
    o.buffer ^= 1;
  }
  FUSCO_EXPECT_OK(comm, fuscoLowLatencyDestroy(ll));
  FUSCO_EXPECT_OK(comm, fuscoCommDestroy(comm));
}

bool llNamesNumber(const std::string& msg, const std::string& what, int n) {
  const std::regex re(what + "\\s*[#=:]?\\s*" + std::to_string(n) + "(?![0-9])", std::regex::icase);
  return std::regex_search(msg, re);
}

}  // namespace fusco::test
