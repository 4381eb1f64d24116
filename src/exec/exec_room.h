// The engine room of one communicator (docs/DESIGN.md, "Layers"): what runs after an operation is
// enqueued. It owns the stream's implementation, the network bridge, the operation queue and the
// progress thread, and takes them down in the one safe order: the progress thread is joined
// first (it uses the others), then the queue and the bridge (their memory comes from the stream's
// implementation), then the stream's implementation itself. Host comms without a twin have none.
#pragma once

#include <cstddef>
#include <memory>

#include "exec/bridge_link.h"
#include "exec/device_queue.h"
#include "exec/net_bridge.h"
#include "exec/progress.h"
#include "exec/stream_ops.h"
#include "fusco.h"

namespace fusco {

class ExecRoom {
 public:
  ExecRoom() = default;
  ~ExecRoom() { close(); }
  ExecRoom(const ExecRoom&) = delete;
  ExecRoom& operator=(const ExecRoom&) = delete;

  StreamOps* streamOps() const { return streamOps_.get(); }
  NetBridge* bridge() const { return bridge_.get(); }
  DeviceQueue* queue() const { return queue_.get(); }
  Progress* progress() const { return progress_.get(); }

  void setStreamOps(std::unique_ptr<StreamOps> ops) { streamOps_ = std::move(ops); }
  // The network bridge to the peers on other nodes (after setStreamOps: its words are the
  // stream's mapped memory).
  fuscoResult_t startBridge(BridgeLink& link) {
    bridge_ = std::make_unique<NetBridge>(link);
    return bridge_->init();
  }
  // The operation queue with a parameter ring of ringBytes and a pool of graphBytes for captured
  // operations (after setStreamOps).
  fuscoResult_t startQueue(size_t ringBytes, size_t graphBytes) {
    queue_ = std::make_unique<DeviceQueue>();
    return queue_->init(ringBytes, graphBytes, streamOps_.get());
  }
  void setProgress(std::unique_ptr<Progress> p) { progress_ = std::move(p); }
  // Joins the progress thread, then frees the queue, the bridge and the stream's implementation.
  void close() {
    progress_.reset();
    queue_.reset();
    bridge_.reset();
    streamOps_.reset();
  }

 private:
  std::unique_ptr<StreamOps> streamOps_;
  std::unique_ptr<NetBridge> bridge_;
  std::unique_ptr<DeviceQueue> queue_;
  std::unique_ptr<Progress> progress_;
};

}  // namespace fusco
