#include "exec/progress.h"

#include <algorithm>
#include <chrono>
#include <future>

#include "core/clock.h"
#include "core/cuda_guard.h"
#include "core/log.h"
#include "core/params.h"
#include "core/result.h"
#include "core/seq_compare.h"

namespace fusco {

FUSCO_PARAM_INT(LivenessMs, "FUSCO_LIVENESS_MS", 100, 1, INT32_MAX,
                "how often a waiting rank checks that its peers are alive, in milliseconds");

Progress::Progress(int64_t timeoutMs, int64_t livenessMs,
                   std::function<fuscoResult_t(int)> checkPeer,
                   std::function<void(fuscoResult_t, const std::string&)> fail,
                   std::function<void()> onStart)
    : timeoutNs_(timeoutMs * 1000000LL),
      livenessNs_(std::max<int64_t>(1, livenessMs) * 1000000LL),
      checkPeer_(std::move(checkPeer)),
      fail_(std::move(fail)),
      onStart_(std::move(onStart)),
      thread_([this] { run(); }),
      watchdog_([this] { watch(); }) {}

Progress::~Progress() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  {
    std::lock_guard<std::mutex> g(mu_);  // the watchdog sees stop_ with no job running
  }
  watchCv_.notify_all();
  watchdog_.join();
  // Waits still listed (drain released them already, or the comm's words are gone) no longer
  // hold the process's setup calls back.
  std::lock_guard<std::mutex> g(mu_);
  cudaGuardWaitsDone(waits_.size());
  waits_.clear();
}

void Progress::post(std::function<void()> job, const char* what) {
  {
    std::lock_guard<std::mutex> g(mu_);
    jobs_.emplace_back(std::move(job), what);
  }
  cv_.notify_all();
}

fuscoResult_t Progress::runSync(std::function<fuscoResult_t()> job) {
  if (onThread()) return job();
  // The job's failure message becomes the caller's last error, as if it had run on the caller;
  // both are handed over before the caller wakes.
  struct Outcome {
    fuscoResult_t result;
    std::string message;
  };
  std::promise<Outcome> done;
  std::future<Outcome> outcome = done.get_future();
  post(
      [&job, &done] {
        fuscoResult_t r;
        try {
          r = job();
        } catch (const std::exception& e) {
          // The caller is told, then the thread's own handler breaks the comm.
          done.set_value(
              Outcome{fuscoInternalError, std::string("a progress job failed: ") + e.what()});
          throw;
        }
        done.set_value(Outcome{r, r == fuscoSuccess ? std::string() : threadLastError()});
      },
      "a synchronous call's exchange");
  Outcome o = outcome.get();
  if (o.result != fuscoSuccess) setThreadLastError(o.message);
  return o.result;
}

void Progress::add(int peer, volatile uint32_t* flag, uint32_t expected, const char* what) {
  cudaGuardWaitAdded();  // before the lock: it waits out an open setup window
  {
    std::lock_guard<std::mutex> g(mu_);
    if (released_) {
      cudaGuardWaitsDone(1);  // the comm is broken: the abort word ends this wait at once
      return;
    }
    if (waits_.empty()) lastProgress_ = nowNs();
    waits_.push_back(Wait{peer, flag, expected, what});
  }
  cv_.notify_all();
}

void Progress::setIdleCheck(std::function<void()> check) {
  {
    std::lock_guard<std::mutex> g(mu_);
    idleCheck_ = std::move(check);
  }
  cv_.notify_all();
}

void Progress::setPump(std::function<bool()> pump) {
  {
    std::lock_guard<std::mutex> g(mu_);
    pump_ = std::move(pump);
  }
  cv_.notify_all();
}

void Progress::noteProgress() {
  std::lock_guard<std::mutex> g(mu_);
  lastProgress_ = nowNs();
}

bool Progress::pumpStep(std::unique_lock<std::mutex>& lk) {
  if (!pump_) return false;
  std::function<bool()> pump = pump_;
  lk.unlock();
  const bool busy = pump();
  lk.lock();
  return busy;
}

void Progress::release(fuscoResult_t r, const std::string& why) {
  std::lock_guard<std::mutex> g(mu_);
  releaseAll(r, why);
}

bool Progress::sweep() {
  size_t before = waits_.size();
  waits_.erase(std::remove_if(waits_.begin(), waits_.end(),
                              [](const Wait& w) { return seqReached(*w.flag, w.expected); }),
               waits_.end());
  cudaGuardWaitsDone(before - waits_.size());
  return waits_.size() != before;
}

// The streams' waits give up by themselves once the abort word is set; this thread stops
// watching them (and the guard counting them).
void Progress::releaseLocked() {
  released_ = true;
  if (abort_) abort_();
  cudaGuardWaitsDone(waits_.size());
  waits_.clear();
}

void Progress::setAbort(std::function<void()> abort, std::function<std::string()> kernelTimeout) {
  std::lock_guard<std::mutex> g(mu_);
  abort_ = std::move(abort);
  kernelTimeout_ = std::move(kernelTimeout);
}

void Progress::releaseAll(fuscoResult_t r, const std::string& why) {
  releaseLocked();
  fail_(r, why);
}

void Progress::releaseWaits() {
  {
    std::lock_guard<std::mutex> g(mu_);
    releaseLocked();
  }
  cv_.notify_all();
}

// Nothing to watch: sleep until work comes, or (an idle check) wake every liveness period.
void Progress::idleStep(std::unique_lock<std::mutex>& lk) {
  auto woken = [&] { return stop_ || !waits_.empty() || !jobs_.empty(); };
  if (!idleCheck_) {
    cv_.wait(lk, woken);
    return;
  }
  if (cv_.wait_for(lk, std::chrono::nanoseconds(livenessNs_), woken)) return;
  std::function<void()> check = idleCheck_;
  lk.unlock();
  check();
  lk.lock();
}

void Progress::setBeat(std::function<uint32_t(int)> beat) {
  std::lock_guard<std::mutex> g(mu_);
  beat_ = std::move(beat);
}

// The beats of this rank's stream and of the ranks the waits are for, in one number (mu_ held).
uint64_t Progress::beatDigest() const {
  if (!beat_) return 0;
  uint64_t digest = beat_(-1);
  for (const Wait& w : waits_)
    if (w.peer >= 0) digest = digest * 0x100000001b3ull + beat_(w.peer) + 1;
  return digest;
}

// Whether this rank's stream or a rank a wait is for moved since the look that left *last (mu_
// held): the progress loop and the watchdog each keep their own.
bool Progress::beatsMoved(uint64_t* last) const {
  const uint64_t digest = beatDigest();
  const bool moved = digest != *last;
  *last = digest;
  return moved;
}

// One look at the waits: progress, dead peers (every liveness period), the timeout.
void Progress::watchStep(std::unique_lock<std::mutex>& lk, int64_t* lastLive) {
  const int64_t now = nowNs();
  const std::string kernel = kernelTimeout_ && !released_ ? kernelTimeout_() : std::string();
  if (!kernel.empty()) {
    FUSCO_WARN(kEngine, "%s", kernel.c_str());
    releaseAll(fuscoTimeout, kernel);
    return;
  }
  const bool swept = sweep();
  if (beatsMoved(&lastBeats_) || swept) lastProgress_ = now;
  if (!waits_.empty() && now - *lastLive >= livenessNs_) {
    *lastLive = now;
    std::vector<int> peers;
    for (const Wait& w : waits_)
      if (w.peer >= 0) peers.push_back(w.peer);
    std::sort(peers.begin(), peers.end());
    peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
    for (int p : peers) {
      if (checkPeer_(p) == fuscoSuccess) continue;
      std::string why =
          "a stream wait for rank " + std::to_string(p) + " was released: " + threadLastError();
      FUSCO_WARN(kEngine, "%s", why.c_str());
      releaseAll(fuscoRemoteError, why);
      return;
    }
  }
  if (!waits_.empty() && now - lastProgress_ >= timeoutNs_) {
    const Wait& w = waits_.front();
    std::string who = w.peer >= 0 ? "rank " + std::to_string(w.peer) : "this rank's progress";
    std::string why = std::string("no progress within the timeout (") +
                      std::to_string(timeoutNs_ / 1000000) + " ms) while a stream waited for " +
                      who + " (" + w.what + ")";
    FUSCO_WARN(kEngine, "%s", why.c_str());
    releaseAll(fuscoTimeout, why);
  }
  (void)lk;
}

void Progress::run() {
  if (onStart_) onStart_();
  std::unique_lock<std::mutex> lk(mu_);
  int64_t lastLive = nowNs(), stopAt = 0;
  for (;;) {
    if (!jobs_.empty()) {
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      runJob(job.first, job.second, lk);
      pumpStep(lk);  // a long queue of jobs must not hold up what the bridge owes
      continue;
    }
    const bool busy = pumpStep(lk);
    if (stop_ && stopAt == 0) stopAt = nowNs();
    if (stop_ && (!busy || nowNs() - stopAt >= timeoutNs_)) break;
    if (waits_.empty() && !busy && !stop_) {
      idleStep(lk);
      continue;
    }
    watchStep(lk, &lastLive);
    // Poll quickly while waits are young (a flag write needs no syscall to see), and more quickly
    // while a bridge moves posts and rows for its peers.
    cv_.wait_for(lk, std::chrono::microseconds(pump_ ? 20 : waits_.empty() ? 0 : 200));
  }
}

// Runs one job with mu_ released; a job that throws breaks the comm (it never throws on purpose:
// whatever it left half done, the comm cannot go on).
void Progress::runJob(std::function<void()>& job, const char* what,
                      std::unique_lock<std::mutex>& lk) {
  jobStart_ = nowNs();
  doing_ = what;
  jobReported_ = false;
  watchCv_.notify_all();
  lk.unlock();
  std::string failure;
  try {
    job();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  lk.lock();
  jobStart_ = 0;
  lastProgress_ = nowNs();  // a finished job advanced the operations the streams wait for
  if (!failure.empty()) {
    FUSCO_WARN(kEngine, "a progress job failed: %s", failure.c_str());
    releaseAll(fuscoInternalError, "a progress job failed: " + failure);
  }
}

void Progress::setDoing(const std::string& what) {
  std::lock_guard<std::mutex> g(mu_);
  doing_ = what;
}

void Progress::watch() {
  std::unique_lock<std::mutex> lk(mu_);
  uint64_t seen = 0;
  for (;;) {
    // Asleep while no job runs; while one does, a look every liveness period.
    if (jobStart_ == 0) watchCv_.wait(lk, [this] { return stop_ || jobStart_ != 0; });
    if (jobStart_ == 0 && stop_) return;
    watchCv_.wait_for(lk, std::chrono::nanoseconds(livenessNs_));
    // A job that waits for ranks whose streams (or its own) still move is not stuck.
    if (beatsMoved(&seen) && jobStart_ != 0) jobStart_ = nowNs();
    if (jobStart_ == 0 || jobReported_ || nowNs() - jobStart_ < timeoutNs_) continue;
    jobReported_ = true;
    const std::string why = "the progress thread was stuck for longer than the timeout (" +
                            std::to_string(timeoutNs_ / 1000000) + " ms) in " + doing_ +
                            "; every stream wait of the communicator was released";
    FUSCO_WARN(kEngine, "%s", why.c_str());
    releaseLocked();
    lk.unlock();  // breaking the comm takes this lock again (Communicator::markBroken)
    fail_(fuscoTimeout, why);
    lk.lock();
  }
}

void Progress::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  const int64_t start = nowNs();
  while (!waits_.empty()) {
    sweep();
    if (waits_.empty()) break;
    if (released_ || nowNs() - start >= timeoutNs_) {
      releaseAll(fuscoTimeout,
                 "the communicator was destroyed while its streams still waited for peers");
      break;
    }
    lk.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    lk.lock();
  }
}

}  // namespace fusco
