// The progress thread of a CUDA communicator (the role NCCL's proxy plays). Calls on a
// fuscoMemCuda comm only enqueue: each hands its operation to this thread (post) and returns. The
// thread runs the operations in call order, exchanging their headers and verdicts with the peers'
// progress threads, resolves where every message lands, and then lets the caller's stream go on
// (the stream waits on a flag the thread sets; engine_async.h). Between operations it watches
// every wait the streams were given (add): when a peer dies or aborts, or nothing advances within
// the comm's timeout, it releases the waiting streams, so no stream of the caller hangs, and
// breaks the communicator with a message naming the peer (fuscoCommGetAsyncError reports it).
// It sleeps when it has neither work nor waits, and is joined by the comm's destruction.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fusco.h"

namespace fusco {

// FUSCO_LIVENESS_MS: how often a waiting rank checks that its peers are alive (engine waits and the
// CUDA path's device watch), in milliseconds.
int64_t paramLivenessMs();

class Progress {
 public:
  // checkPeer: fuscoSuccess while the peer is alive; fail(result, message): break the comm.
  // onStart runs first on the thread (e.g. makes the comm's device current).
  Progress(int64_t timeoutMs, int64_t livenessMs, std::function<fuscoResult_t(int)> checkPeer,
           std::function<void(fuscoResult_t, const std::string&)> fail,
           std::function<void()> onStart = nullptr);
  // Runs the jobs still queued (each bounded by the comm's timeout), then joins the thread.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Queues a job; jobs run one at a time in the order they were posted.
  // `what` names the job in the watchdog's report (a string that outlives the job).
  void post(std::function<void()> job, const char* what = "a queued job");
  // Queues a job after every job posted before and waits for its result (the synchronous calls of
  // a CUDA comm, e.g. fuscoMoePlan's exchanges, which use the same channels as queued operations).
  fuscoResult_t runSync(std::function<fuscoResult_t()> job);
  // True on the progress thread itself.
  bool onThread() const { return std::this_thread::get_id() == thread_.get_id(); }

  // A stream will wait until (int32)(*flag - expected) >= 0; `peer` is the rank that advances it
  // (-1: this rank's own progress thread).
  void add(int peer, volatile uint32_t* flag, uint32_t expected, const char* what);
  // Waits until every wait was satisfied or released (teardown); releases whatever remains after
  // the timeout or once the comm is broken.
  void drain();
  // Releases every wait at once and breaks the comm (an operation failed on this thread).
  void release(fuscoResult_t r, const std::string& why);
  // Releases every wait without breaking the comm (it is broken already, from another thread).
  void releaseWaits();
  // How a release reaches the streams: `abort` sets the word every wait of the operations' kernels
  // reads (device/op_steps.h), so they give up by themselves; no stream wait is ever written to.
  // `kernelTimeout` reports a wait a kernel gave up on after the timeout ("" while none did): the
  // thread then breaks the comm with that message.
  void setAbort(std::function<void()> abort, std::function<std::string()> kernelTimeout);
  // From now on the idle thread wakes every liveness period and runs `check` (a comm with
  // captured operations looks at its peers; progress.h's waits do not cover graph replays).
  void setIdleCheck(std::function<void()> check);
  // From now on the thread runs `pump` whenever it has no job to run, and polls while it returns
  // true (the network bridge still owes a peer something, net_bridge.h). At destruction the thread
  // keeps pumping until it returns false, for at most the comm's timeout.
  void setPump(std::function<bool()> pump);
  // Something moved for the streams' waits (the bridge's rows): the timeout starts again.
  void noteProgress();
  // From now on a change of beat(p) for a rank p the streams wait for, or of beat(-1) (this rank's
  // stream), counts as progress: a large transfer that keeps moving is not a hang (the timeout
  // measures how long nothing moved, not how long a wait lasts).
  void setBeat(std::function<uint32_t(int)> beat);
  // What the running job does now (the watchdog's report names it); the job's name by default.
  void setDoing(const std::string& what);

 private:
  struct Wait {
    int peer;
    volatile uint32_t* flag;
    uint32_t expected;
    const char* what;
  };
  void run();
  // The watchdog: a job that runs past the timeout (a CUDA call that waits for the device, a
  // peer that never answers) cannot check the waits itself, so this thread reports it, naming
  // what the job was doing, releases every wait of the comm's streams and breaks the comm.
  void watch();
  void runJob(std::function<void()>& job, const char* what, std::unique_lock<std::mutex>& lk);
  void watchStep(std::unique_lock<std::mutex>& lk, int64_t* lastLive);
  bool sweep();  // drops satisfied waits; true if any was
  void releaseAll(fuscoResult_t r, const std::string& why);
  void releaseLocked();
  void idleStep(std::unique_lock<std::mutex>& lk);
  bool pumpStep(std::unique_lock<std::mutex>& lk);

  const int64_t timeoutNs_, livenessNs_;
  std::function<fuscoResult_t(int)> checkPeer_;
  std::function<void(fuscoResult_t, const std::string&)> fail_;
  std::function<void()> onStart_;
  std::function<void()> idleCheck_;
  std::function<bool()> pump_;
  mutable std::mutex mu_;
  std::condition_variable cv_, doneCv_;
  std::deque<std::pair<std::function<void()>, const char*>> jobs_;
  int64_t jobStart_ = 0;  // while a job runs: when it started (0: none runs)
  std::string doing_;     // what it does
  bool jobReported_ = false;
  std::condition_variable watchCv_;
  std::vector<Wait> waits_;
  std::function<void()> abort_;
  std::function<std::string()> kernelTimeout_;
  bool stop_ = false, released_ = false;
  int64_t lastProgress_ = 0;
  std::function<uint32_t(int)> beat_;
  uint64_t lastBeats_ = 0;  // a digest of the beats at the progress loop's last look
  bool beatsMoved(uint64_t* last) const;
  uint64_t beatDigest() const;
  std::thread thread_;
  std::thread watchdog_;
};

}  // namespace fusco
