// The watch over a CUDA communicator's stream waits. Calls on a fuscoMemCuda comm return once their
// work is enqueued, so the waits for peers (DeviceFlags) happen later, on the GPU. This thread
// keeps every enqueued wait in view: when a peer dies or aborts, or nothing advances within the
// comm's timeout, it releases the waiting streams (so no stream of the caller hangs forever),
// breaks the communicator with a message naming the peer (fuscoCommGetAsyncError reports it) and
// tells the peers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fusco.h"

namespace fusco {

class DeviceWatch {
 public:
  // checkPeer: fuscoSuccess while the peer is alive; fail(result, message): break the comm.
  DeviceWatch(int64_t timeoutMs, int64_t livenessMs, std::function<fuscoResult_t(int)> checkPeer,
              std::function<void(fuscoResult_t, const std::string&)> fail);
  ~DeviceWatch();
  DeviceWatch(const DeviceWatch&) = delete;
  DeviceWatch& operator=(const DeviceWatch&) = delete;

  // A stream will wait until (int32)(*flag - expected) >= 0; `peer` is the rank that advances it.
  void add(int peer, volatile uint32_t* flag, uint32_t expected, const char* what);
  // Waits until every wait was satisfied or released (teardown); releases whatever remains after
  // the timeout or once the comm is broken.
  void drain();

 private:
  struct Wait {
    int peer;
    volatile uint32_t* flag;
    uint32_t expected;
    const char* what;
  };
  void run();
  bool sweep();  // drops satisfied waits; true if any was
  void releaseAll(fuscoResult_t r, const std::string& why);

  const int64_t timeoutNs_, livenessNs_;
  std::function<fuscoResult_t(int)> checkPeer_;
  std::function<void(fuscoResult_t, const std::string&)> fail_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Wait> waits_;
  bool stop_ = false, released_ = false;
  int64_t lastProgress_ = 0;
  std::thread thread_;
};

}  // namespace fusco
