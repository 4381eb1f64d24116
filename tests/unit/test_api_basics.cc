// Public API entry points that need no peers: version, error strings, last error, argument checks
// and the config struct check. Everything here must return promptly in one process.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <set>
#include <string>
#include <thread>

#include "core/bootstrap.h"
#include "fusco.h"
#include "harness/raw_enum.h"

namespace {

// A fresh id whose listening socket is released when the test ends.
class FreshId {
 public:
  FreshId() {
    memset(&id_, 0, sizeof(id_));
    ok_ = fuscoGetUniqueId(&id_) == fuscoSuccess;
  }
  ~FreshId() {
    if (ok_) fusco::bootstrapReleaseId(id_);
  }
  bool ok() const { return ok_; }
  const fuscoUniqueId& id() const { return id_; }

 private:
  fuscoUniqueId id_;
  bool ok_ = false;
};

TEST(ApiBasics, VersionMatchesHeader) {
  int v = -1;
  ASSERT_EQ(fuscoGetVersion(&v), fuscoSuccess);
  EXPECT_EQ(v, FUSCO_VERSION_CODE);
  EXPECT_EQ(v, FUSCO_MAJOR * 10000 + FUSCO_MINOR * 100 + FUSCO_PATCH);
}

TEST(ApiBasics, VersionWithNullIsInvalidArgument) {
  EXPECT_EQ(fuscoGetVersion(nullptr), fuscoInvalidArgument);
  EXPECT_STRNE(fuscoGetLastError(nullptr), "");
}

TEST(ApiBasics, ErrorStringNamesEveryResultDistinctly) {
  std::set<std::string> seen;
  for (int r = 0; r < fuscoNumResults; ++r) {
    const char* s = fuscoGetErrorString(static_cast<fuscoResult_t>(r));
    ASSERT_NE(s, nullptr) << "result " << r;
    EXPECT_GT(strlen(s), 0u) << "result " << r;
    EXPECT_TRUE(seen.insert(s).second) << "result " << r << " shares the string '" << s << "'";
  }
}

TEST(ApiBasics, ErrorStringOfUnknownCodeIsNotNull) {
  for (int r : {static_cast<int>(fuscoNumResults), -1, 1000}) {
    const char* s = fuscoGetErrorString(static_cast<fuscoResult_t>(r));
    ASSERT_NE(s, nullptr) << "result " << r;
    EXPECT_GT(strlen(s), 0u) << "result " << r;
  }
}

TEST(ApiBasics, ResultValuesMatchNccl) {
  EXPECT_EQ(fuscoSuccess, 0);
  EXPECT_EQ(fuscoUnhandledCudaError, 1);
  EXPECT_EQ(fuscoSystemError, 2);
  EXPECT_EQ(fuscoInternalError, 3);
  EXPECT_EQ(fuscoInvalidArgument, 4);
  EXPECT_EQ(fuscoInvalidUsage, 5);
  EXPECT_EQ(fuscoRemoteError, 6);
  EXPECT_EQ(fuscoInProgress, 7);
  EXPECT_EQ(fuscoTimeout, 8);
  EXPECT_EQ(fuscoNumResults, 9);
}

TEST(ApiBasics, LastErrorIsNeverNull) {
  ASSERT_NE(fuscoGetLastError(nullptr), nullptr);
  EXPECT_EQ(fuscoGetUniqueId(nullptr), fuscoInvalidArgument);
  const char* msg = fuscoGetLastError(nullptr);
  ASSERT_NE(msg, nullptr);
  EXPECT_STRNE(msg, "") << "a failed call must leave a message";
}

TEST(ApiBasics, UniqueIdWithNullIsInvalidArgument) {
  EXPECT_EQ(fuscoGetUniqueId(nullptr), fuscoInvalidArgument);
}

TEST(ApiBasics, UniqueIdsDiffer) {
  FreshId a, b;
  ASSERT_TRUE(a.ok()) << fuscoGetLastError(nullptr);
  ASSERT_TRUE(b.ok()) << fuscoGetLastError(nullptr);
  EXPECT_NE(memcmp(&a.id(), &b.id(), sizeof(fuscoUniqueId)), 0) << "two ids must not be equal";
  fuscoUniqueId zero;
  memset(&zero, 0, sizeof(zero));
  EXPECT_NE(memcmp(&a.id(), &zero, sizeof(zero)), 0);
}

TEST(ApiBasics, DataTypeSizeOfEveryType) {
  const std::pair<fuscoDataType_t, size_t> expected[] = {
      {fuscoInt8, 1},    {fuscoUint8, 1},    {fuscoInt32, 4},      {fuscoUint32, 4},
      {fuscoInt64, 8},   {fuscoUint64, 8},   {fuscoFloat16, 2},    {fuscoFloat32, 4},
      {fuscoFloat64, 8}, {fuscoBfloat16, 2}, {fuscoFloat8e4m3, 1}, {fuscoFloat8e5m2, 1}};
  for (const auto& e : expected) {
    size_t b = 0;
    ASSERT_EQ(fuscoDataTypeSize(e.first, &b), fuscoSuccess) << "type " << e.first;
    EXPECT_EQ(b, e.second) << "type " << e.first;
  }
  size_t b = 12345;
  EXPECT_EQ(fuscoDataTypeSize(fuscoNumTypes, &b), fuscoInvalidArgument);
  EXPECT_EQ(fuscoTestDataTypeSizeRaw(-1, &b), fuscoInvalidArgument);
  EXPECT_EQ(b, 12345u) << "an out-parameter must not be written on failure";
  EXPECT_EQ(fuscoDataTypeSize(fuscoInt8, nullptr), fuscoInvalidArgument);
}

TEST(ApiBasics, NullCommIsInvalidArgumentAndLeavesOutputsAlone) {
  int count = -7, rank = -7, node = -7, numNodes = -7, localRank = -7, localSize = -7;
  EXPECT_EQ(fuscoCommCount(nullptr, &count), fuscoInvalidArgument);
  EXPECT_EQ(fuscoCommUserRank(nullptr, &rank), fuscoInvalidArgument);
  EXPECT_EQ(fuscoCommNodeInfo(nullptr, &node, &numNodes, &localRank, &localSize),
            fuscoInvalidArgument);
  EXPECT_EQ(count, -7);
  EXPECT_EQ(rank, -7);
  EXPECT_EQ(node, -7);
  EXPECT_EQ(localSize, -7);
  fuscoResult_t async = fuscoInProgress;
  EXPECT_EQ(fuscoCommGetAsyncError(nullptr, &async), fuscoInvalidArgument);
  EXPECT_EQ(async, fuscoInProgress);
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(fuscoMemAlloc(nullptr, &p, 64), fuscoInvalidArgument);
  EXPECT_EQ(p, reinterpret_cast<void*>(0x1));
  char buf[16];
  EXPECT_EQ(fuscoAllToAll(buf, buf, 1, fuscoInt8, nullptr, nullptr), fuscoInvalidArgument);
  EXPECT_EQ(fuscoSend(buf, 1, fuscoInt8, 0, nullptr, nullptr), fuscoInvalidArgument);
  EXPECT_EQ(fuscoRecv(buf, 1, fuscoInt8, 0, nullptr, nullptr), fuscoInvalidArgument);
}

TEST(ApiBasics, InitWithNullCommPointerIsInvalidArgument) {
  FreshId id;
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(fuscoCommInitRank(nullptr, 1, id.id(), 0), fuscoInvalidArgument);
  EXPECT_STRNE(fuscoGetLastError(nullptr), "");
}

TEST(ApiBasics, InitWithZeroOrNegativeNranksIsInvalidArgument) {
  FreshId id;
  ASSERT_TRUE(id.ok());
  for (int n : {0, -1}) {
    fuscoComm_t comm = nullptr;
    EXPECT_EQ(fuscoCommInitRank(&comm, n, id.id(), 0), fuscoInvalidArgument) << "nranks " << n;
    EXPECT_EQ(comm, nullptr);
  }
}

TEST(ApiBasics, InitWithZeroIdIsInvalidArgument) {
  fuscoUniqueId zero;
  memset(&zero, 0, sizeof(zero));
  fuscoComm_t comm = nullptr;
  EXPECT_EQ(fuscoCommInitRank(&comm, 1, zero, 0), fuscoInvalidArgument);
  EXPECT_EQ(comm, nullptr);
  EXPECT_STRNE(fuscoGetLastError(nullptr), "");
}

TEST(ApiBasics, ConfigWithBadSizeMagicOrVersionIsInvalidArgument) {
  FreshId id;
  ASSERT_TRUE(id.ok());
  for (int which = 0; which < 3; ++which) {
    fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
    if (which == 0) cfg.size = sizeof(fuscoConfig_t) - 8;
    if (which == 1) cfg.magic = 0xdeadbeef;
    if (which == 2) cfg.version = FUSCO_CONFIG_VERSION + 1;
    fuscoComm_t comm = nullptr;
    EXPECT_EQ(fuscoCommInitRankConfig(&comm, 1, id.id(), 0, &cfg), fuscoInvalidArgument)
        << "case " << which;
    EXPECT_EQ(comm, nullptr) << "case " << which;
    EXPECT_STRNE(fuscoGetLastError(nullptr), "") << "case " << which;
  }
  fuscoComm_t comm = nullptr;
  EXPECT_EQ(fuscoCommInitRankConfig(&comm, 1, id.id(), 0, nullptr), fuscoInvalidArgument);
  EXPECT_EQ(comm, nullptr);
}

TEST(ApiBasics, ConfigInitializerHasDocumentedDefaults) {
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  EXPECT_EQ(cfg.size, sizeof(fuscoConfig_t));
  EXPECT_EQ(cfg.magic, FUSCO_CONFIG_MAGIC);
  EXPECT_EQ(cfg.version, FUSCO_CONFIG_VERSION);
  EXPECT_EQ(cfg.memType, fuscoMemHost);
  EXPECT_EQ(cfg.cudaDevice, -1);
  EXPECT_EQ(cfg.timeoutMs, 0);
  EXPECT_EQ(cfg.localSize, 0);
  EXPECT_EQ(cfg.netDevices, nullptr);
  EXPECT_EQ(cfg.chunkBytes, 0u);
  EXPECT_EQ(cfg.pipelineDepth, 0);
  EXPECT_EQ(cfg.maxSms, 0);
}

// A program built against the version-1 header (no maxSms) still makes comms; its padding is
// not read as an SM budget. A negative budget is refused with a message naming it.
TEST(ApiBasics, ConfigVersionOneIsReadAndANegativeSmBudgetIsRefused) {
  {
    FreshId id;
    ASSERT_TRUE(id.ok());
    fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
    cfg.version = 1;
    cfg.maxSms = -7;  // the padding of a version-1 struct: ignored
    fuscoComm_t comm = nullptr;
    ASSERT_EQ(fuscoCommInitRankConfig(&comm, 1, id.id(), 0, &cfg), fuscoSuccess)
        << fuscoGetLastError(nullptr);
    EXPECT_EQ(fuscoCommDestroy(comm), fuscoSuccess);
  }
  FreshId id;
  ASSERT_TRUE(id.ok());
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.maxSms = -1;
  fuscoComm_t comm = nullptr;
  EXPECT_EQ(fuscoCommInitRankConfig(&comm, 1, id.id(), 0, &cfg), fuscoInvalidArgument);
  EXPECT_EQ(comm, nullptr);
  EXPECT_NE(std::string(fuscoGetLastError(nullptr)).find("maxSms (-1)"), std::string::npos)
      << fuscoGetLastError(nullptr);
  cfg.version = 0;
  EXPECT_EQ(fuscoCommInitRankConfig(&comm, 1, id.id(), 0, &cfg), fuscoInvalidArgument);
}

// A one-rank comm needs no peers, so the whole life cycle runs in this process.
TEST(ApiBasics, SingleRankCommLifeCycle) {
  FreshId id;
  ASSERT_TRUE(id.ok());
  fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
  cfg.timeoutMs = 10000;
  fuscoComm_t comm = nullptr;
  ASSERT_EQ(fuscoCommInitRankConfig(&comm, 1, id.id(), 0, &cfg), fuscoSuccess)
      << fuscoGetLastError(nullptr);
  ASSERT_NE(comm, nullptr);
  int count = 0, rank = -1;
  EXPECT_EQ(fuscoCommCount(comm, &count), fuscoSuccess);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(fuscoCommUserRank(comm, &rank), fuscoSuccess);
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(fuscoCommCount(comm, nullptr), fuscoInvalidArgument);
  EXPECT_STRNE(fuscoGetLastError(comm), "");
  int64_t send[4] = {11, 22, 33, 44}, recv[4] = {0, 0, 0, 0};
  EXPECT_EQ(fuscoAllToAll(send, recv, 4, fuscoInt64, comm, nullptr), fuscoSuccess)
      << fuscoGetLastError(comm);
  EXPECT_EQ(memcmp(send, recv, sizeof(send)), 0);
  int dummy = 0;
  EXPECT_EQ(fuscoAllToAll(send, recv, 4, fuscoInt64, comm, &dummy), fuscoInvalidArgument)
      << "a non-NULL stream on a host comm";
  EXPECT_EQ(fuscoCommDestroy(comm), fuscoSuccess);
}

}  // namespace

// Two threads destroy one comm at once: one destroy succeeds, the other is refused as a destroyed
// handle is, whichever of them gets there first (never two successes for one comm).
TEST(ApiBasics, TwoDestroysOfOneCommAtOnceSucceedOnce) {
  for (int round = 0; round < 40; ++round) {
    FreshId id;
    ASSERT_TRUE(id.ok());
    fuscoComm_t comm = nullptr;
    ASSERT_EQ(fuscoCommInitRank(&comm, 1, id.id(), 0), fuscoSuccess) << fuscoGetLastError(nullptr);
    std::atomic<int> ready{0};
    fuscoResult_t r[2] = {fuscoInternalError, fuscoInternalError};
    auto destroy = [&](int i) {
      ready++;
      while (ready.load() < 2) {
      }
      r[i] = i == 0 ? fuscoCommDestroy(comm) : fuscoCommAbort(comm);
    };
    std::thread a(destroy, 0), b(destroy, 1);
    a.join();
    b.join();
    EXPECT_EQ((r[0] == fuscoSuccess) + (r[1] == fuscoSuccess), 1)
        << "round " << round << ": " << fuscoGetErrorString(r[0]) << ", "
        << fuscoGetErrorString(r[1]);
    EXPECT_TRUE(r[0] == fuscoInvalidArgument || r[1] == fuscoInvalidArgument) << "round " << round;
  }
}
