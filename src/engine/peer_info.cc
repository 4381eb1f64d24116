#include "engine/peer_info.h"

#include <unistd.h>

#include <cstring>

#include "core/liveness.h"

namespace fusco {

namespace {
constexpr uint32_t kPeerInfoMagic = 0x50454552;  // "PEER"
constexpr size_t kFixedBytes = 24;               // magic, pid, start time, local size, host length
}  // namespace

std::string encodePeerInfo(const PeerInfo& info, int localSize) {
  std::string out;
  uint32_t magic = kPeerInfoMagic;
  int32_t pid = info.pid;
  uint64_t start = info.startTime;
  int32_t local = localSize;
  uint32_t hostLen = static_cast<uint32_t>(info.hostId.size());
  out.append(reinterpret_cast<const char*>(&magic), 4);
  out.append(reinterpret_cast<const char*>(&pid), 4);
  out.append(reinterpret_cast<const char*>(&start), 8);
  out.append(reinterpret_cast<const char*>(&local), 4);
  out.append(reinterpret_cast<const char*>(&hostLen), 4);
  out += info.hostId;
  return out;
}

bool decodePeerInfo(const std::string& blob, PeerInfo* info, int* localSize) {
  if (blob.size() < kFixedBytes) return false;
  uint32_t magic, hostLen;
  int32_t pid, local;
  memcpy(&magic, blob.data(), 4);
  memcpy(&pid, blob.data() + 4, 4);
  memcpy(&info->startTime, blob.data() + 8, 8);
  memcpy(&local, blob.data() + 16, 4);
  memcpy(&hostLen, blob.data() + 20, 4);
  if (magic != kPeerInfoMagic || blob.size() != kFixedBytes + static_cast<size_t>(hostLen))
    return false;
  info->pid = pid;
  *localSize = local;
  info->hostId = blob.substr(kFixedBytes);
  return true;
}

PeerInfo localPeerInfo() {
  PeerInfo info;
  info.hostId = localHostId();
  info.pid = getpid();
  info.startTime = processStartTime(info.pid);
  return info;
}

}  // namespace fusco
