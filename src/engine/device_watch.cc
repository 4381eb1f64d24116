#include "engine/device_watch.h"

#include <algorithm>
#include <chrono>

#include "core/clock.h"
#include "core/log.h"
#include "core/result.h"

namespace fusco {

namespace {
bool reached(uint32_t value, uint32_t expected) {
  return static_cast<int32_t>(value - expected) >= 0;
}
}  // namespace

DeviceWatch::DeviceWatch(int64_t timeoutMs, int64_t livenessMs,
                         std::function<fuscoResult_t(int)> checkPeer,
                         std::function<void(fuscoResult_t, const std::string&)> fail)
    : timeoutNs_(timeoutMs * 1000000LL),
      livenessNs_(std::max<int64_t>(1, livenessMs) * 1000000LL),
      checkPeer_(std::move(checkPeer)),
      fail_(std::move(fail)),
      thread_([this] { run(); }) {}

DeviceWatch::~DeviceWatch() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void DeviceWatch::add(int peer, volatile uint32_t* flag, uint32_t expected, const char* what) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (released_) {
      *flag = expected;  // the comm is broken: nothing may wait on it any more
      return;
    }
    if (waits_.empty()) lastProgress_ = nowNs();
    waits_.push_back(Wait{peer, flag, expected, what});
  }
  cv_.notify_all();
}

bool DeviceWatch::sweep() {
  size_t before = waits_.size();
  waits_.erase(std::remove_if(waits_.begin(), waits_.end(),
                              [](const Wait& w) { return reached(*w.flag, w.expected); }),
               waits_.end());
  return waits_.size() != before;
}

void DeviceWatch::releaseAll(fuscoResult_t r, const std::string& why) {
  released_ = true;
  for (const Wait& w : waits_)
    if (!reached(*w.flag, w.expected)) *w.flag = w.expected;
  waits_.clear();
  fail_(r, why);
}

void DeviceWatch::run() {
  std::unique_lock<std::mutex> lk(mu_);
  int64_t lastLive = nowNs();
  while (!stop_) {
    if (waits_.empty()) {
      cv_.wait(lk, [&] { return stop_ || !waits_.empty(); });
      continue;
    }
    const int64_t now = nowNs();
    if (sweep()) lastProgress_ = now;
    if (!waits_.empty() && now - lastLive >= livenessNs_) {
      lastLive = now;
      std::vector<int> peers;
      for (const Wait& w : waits_) peers.push_back(w.peer);
      std::sort(peers.begin(), peers.end());
      peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
      for (int p : peers) {
        if (checkPeer_(p) == fuscoSuccess) continue;
        std::string why =
            "a stream wait for rank " + std::to_string(p) + " was released: " + threadLastError();
        FUSCO_WARN(kEngine, "%s", why.c_str());
        releaseAll(fuscoRemoteError, why);
        break;
      }
    }
    if (!waits_.empty() && now - lastProgress_ >= timeoutNs_) {
      const Wait& w = waits_.front();
      std::string why =
          std::string("no progress within the timeout (") + std::to_string(timeoutNs_ / 1000000) +
          " ms) while a stream waited for rank " + std::to_string(w.peer) + " (" + w.what + ")";
      FUSCO_WARN(kEngine, "%s", why.c_str());
      releaseAll(fuscoTimeout, why);
    }
    // Poll quickly while waits are young, then back off (a flag write needs no syscall to see).
    cv_.wait_for(lk, std::chrono::microseconds(waits_.empty() ? 0 : 200));
  }
}

void DeviceWatch::drain() {
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
