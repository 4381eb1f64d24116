// Combine's messages on CUDA comms (moe/moe_exec.h, deviceCombineStreams and deviceCombineLate):
// one pull message per peer, whose byte count decides whether the reader maps the peer's expert
// output at all; to a peer that cannot map it, the same rows pushed in the peer's slot order. A
// capacity plan's combine is sized on the progress thread once the plan resolved; a zero-byte
// message there would leave the peer's base null while the sum kernel reads the peer's rows (an
// illegal address on the GPU).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "api/api_internal.h"
#include "core/bootstrap.h"
#include "fusco.h"
#include "moe/moe_exec.h"

namespace {

using fusco::MoeHandle;
using fusco::Op;
using fusco::PeerWork;

constexpr size_t kRowOut = 96;

// A one-rank host comm: enough for the late operation's traffic notes.
class OneRankComm {
 public:
  OneRankComm() {
    memset(&id_, 0, sizeof(id_));
    idOk_ = fuscoGetUniqueId(&id_) == fuscoSuccess;
    fuscoConfig_t cfg = FUSCO_CONFIG_INITIALIZER;
    cfg.timeoutMs = 10000;
    if (idOk_ && fuscoCommInitRankConfig(&comm_, 1, id_, 0, &cfg) != fuscoSuccess) comm_ = nullptr;
  }
  ~OneRankComm() {
    if (comm_ != nullptr) fuscoCommDestroy(comm_);
    if (idOk_) fusco::bootstrapReleaseId(id_);
  }
  fusco::Communicator* impl() const { return comm_ != nullptr ? fusco::commImpl(comm_) : nullptr; }

 private:
  fuscoUniqueId id_;
  bool idOk_ = false;
  fuscoComm_t comm_ = nullptr;
};

void capacityHandle(MoeHandle* h, std::vector<size_t> slotsFrom, std::vector<size_t> slotsTo) {
  h->capacity = 64;
  h->bySteps = true;
  h->dedup = fusco::Dedup::Rank;
  h->weightIdx.assign(slotsFrom.size(), {});
  h->sizes.slotsFrom = std::move(slotsFrom);
  h->sizes.slotsTo = std::move(slotsTo);
}

const std::vector<bool> kPull(3, false);

TEST(MoeDeviceCombine, EveryPeersMessageCarriesThePlansSlotsOnceSized) {
  MoeHandle h;
  capacityHandle(&h, {3, 0, 7}, {5, 2, 0});
  char offered[16];
  std::vector<PeerWork> work(3);
  fusco::deviceCombineStreams(h, true, offered, kRowOut, 64 * kRowOut, kPull, &work);
  for (size_t p = 0; p < work.size(); ++p) {
    ASSERT_EQ(work[p].sends.size(), 1u);
    ASSERT_EQ(work[p].recvs.size(), 1u);
    EXPECT_EQ(work[p].sends[0].bytes(), h.sizes.slotsFrom[p] * kRowOut) << "peer " << p;
    EXPECT_EQ(work[p].recvs[0].bytes(), h.sizes.slotsTo[p] * kRowOut) << "peer " << p;
    EXPECT_EQ(work[p].sends[0].base, offered);
    EXPECT_EQ(work[p].sends[0].extentBytes(), 64 * kRowOut) << "the capacity's rows are offered";
    EXPECT_FALSE(work[p].sends[0].push);
  }
  // Unsized: one zero-byte placeholder per pair, so every pair still takes part.
  fusco::deviceCombineStreams(h, false, offered, kRowOut, 64 * kRowOut, kPull, &work);
  for (const PeerWork& w : work) {
    ASSERT_EQ(w.sends.size(), 1u);
    ASSERT_EQ(w.recvs.size(), 1u);
    EXPECT_EQ(w.sends[0].bytes(), 0u);
    EXPECT_EQ(w.recvs[0].bytes(), 0u);
  }
}

// A peer that cannot map the expert output gets its rows pushed: the fan rows it sent in dispatch
// (one per slot, in its slot order), not an offer of the buffer.
TEST(MoeDeviceCombine, APeerThatCannotMapGetsItsRowsPushedInItsSlotOrder) {
  MoeHandle h;
  capacityHandle(&h, {3, 0, 7}, {5, 2, 0});
  const std::vector<int64_t> fan0{4, 1, 9}, fan2{0, 2, 3, 5, 6, 8, 11};
  h.dev.recvFanRows = {fan0.data(), nullptr, fan2.data()};
  char offered[16];
  std::vector<PeerWork> work(3);
  fusco::deviceCombineStreams(h, true, offered, kRowOut, 64 * kRowOut, {true, false, true}, &work);
  for (size_t p : {0u, 2u}) {
    const fusco::RowStream& s = work[p].sends[0];
    EXPECT_TRUE(s.push) << "peer " << p;
    EXPECT_EQ(s.rows, p == 0 ? fan0.data() : fan2.data()) << "peer " << p;
    EXPECT_EQ(s.bytes(), h.sizes.slotsFrom[p] * kRowOut) << "peer " << p;
    EXPECT_EQ(s.base, offered);
  }
  EXPECT_FALSE(work[1].sends[0].push);
  EXPECT_EQ(work[1].sends[0].extentBytes(), 64 * kRowOut);
}

// The late operation of a capacity plan's combine sizes the messages from the plan, not as the
// placeholders it replaces.
TEST(MoeDeviceCombine, CapacityPlansLateOperationSizesTheMessagesFromThePlan) {
  OneRankComm comm;
  ASSERT_NE(comm.impl(), nullptr) << fuscoGetLastError(nullptr);
  MoeHandle h;
  h.comm = comm.impl();
  capacityHandle(&h, {9}, {9});
  h.planState = MoeHandle::kPlanReady;
  char offered[16];
  Op op(1);
  fusco::deviceCombineStreams(h, false, offered, kRowOut, 64 * kRowOut, {false}, &op.peers);
  fusco::LateSizes late = fusco::deviceCombineLate(h, offered, kRowOut, 64 * kRowOut, {false});
  ASSERT_TRUE(static_cast<bool>(late));
  ASSERT_EQ(late(op), fuscoSuccess);
  EXPECT_EQ(op.argStatus, fuscoSuccess);
  ASSERT_EQ(op.peers[0].sends.size(), 1u);
  ASSERT_EQ(op.peers[0].recvs.size(), 1u);
  EXPECT_EQ(op.peers[0].sends[0].bytes(), 9 * kRowOut);
  EXPECT_EQ(op.peers[0].recvs[0].bytes(), 9 * kRowOut);
  EXPECT_EQ(op.peers[0].sends[0].base, offered);
  EXPECT_EQ(op.peers[0].sends[0].extentBytes(), 64 * kRowOut);
}

TEST(MoeDeviceCombine, CapacityPlanThatFailedFailsTheCombineAndSizesNothing) {
  OneRankComm comm;
  ASSERT_NE(comm.impl(), nullptr) << fuscoGetLastError(nullptr);
  MoeHandle h;
  h.comm = comm.impl();
  capacityHandle(&h, {9}, {9});
  h.planState = MoeHandle::kPlanFailed;
  char offered[16];
  Op op(1);
  fusco::deviceCombineStreams(h, false, offered, kRowOut, 64 * kRowOut, {false}, &op.peers);
  ASSERT_EQ(fusco::deviceCombineLate(h, offered, kRowOut, 64 * kRowOut, {false})(op), fuscoSuccess);
  EXPECT_EQ(op.argStatus, fuscoInvalidUsage);
  EXPECT_NE(op.argError.find("fuscoMoeCombine"), std::string::npos) << op.argError;
  EXPECT_EQ(op.peers[0].sends[0].bytes(), 0u);
}

}  // namespace
