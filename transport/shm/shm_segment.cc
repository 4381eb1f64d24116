#include "transport/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "core/checked_math.h"
#include "core/log.h"
#include "core/result.h"

namespace fusco {

namespace {

void closeRetry(int fd) {
  if (fd >= 0) close(fd);  // never retry close on EINTR (Linux releases the fd anyway)
}

}  // namespace

bool shmComputeLayout(uint32_t numRings, uint64_t depth, uint64_t chunkBytes, uint64_t arenaBytes,
                      ShmLayout* out) {
  ShmLayout l;
  l.numRings = numRings;
  l.depth = depth;
  l.chunkBytes = chunkBytes;
  if (depth == 0 || depth > (1u << 20) || chunkBytes > (uint64_t(1) << 40)) return false;
  // Payloads are page-aligned so gathers and copies into them start on a page boundary.
  l.slotStride = shmAlignUp(chunkBytes == 0 ? 1 : chunkBytes, kShmPage);
  l.payloadOffset = shmAlignUp(sizeof(ShmRingCtrl) + depth * sizeof(ShmSlotHeader), kShmPage);
  uint64_t payloads = 0, ringsBytes = 0, end = 0;
  if (!checkedMul(l.slotStride, depth, &payloads)) return false;
  if (!checkedAdd(l.payloadOffset, payloads, &l.ringStride)) return false;
  l.ringsOffset = shmAlignUp(senderTableOffset() + sizeof(int32_t) * uint64_t(numRings), kShmPage);
  if (!checkedMul(l.ringStride, numRings, &ringsBytes)) return false;
  if (!checkedAdd(l.ringsOffset, ringsBytes, &l.arenaOffset)) return false;
  l.arenaBytes = shmAlignUp(arenaBytes, kShmPage);
  if (!checkedAdd(l.arenaOffset, l.arenaBytes, &end)) return false;
  l.segBytes = end;
  *out = l;
  return true;
}

std::string shmEncodeBlob(const ShmBlob& b) {
  return std::string(reinterpret_cast<const char*>(&b), sizeof(b));
}

bool shmDecodeBlob(const std::string& s, ShmBlob* b) {
  if (s.size() != sizeof(ShmBlob)) return false;
  memcpy(b, s.data(), sizeof(ShmBlob));
  return b->magic == kShmSegmentMagic && b->version == kShmLayoutVersion;
}

namespace {

void writeHeader(const ShmLayout& l, int rank, uint64_t commTag, const std::vector<int>& senders,
                 ShmMapping* m) {
  ShmSegmentHeader* h = new (m->base) ShmSegmentHeader();
  h->magic = kShmSegmentMagic;
  h->version = kShmLayoutVersion;
  h->ownerPid = static_cast<int32_t>(getpid());
  h->ownerRank = rank;
  h->numRings = l.numRings;
  h->commTag = commTag;
  h->segBytes = l.segBytes;
  h->ringsOffset = l.ringsOffset;
  h->ringStride = l.ringStride;
  h->depth = l.depth;
  h->chunkBytes = l.chunkBytes;
  h->slotStride = l.slotStride;
  h->payloadOffset = l.payloadOffset;
  h->arenaOffset = l.arenaOffset;
  h->arenaBytes = l.arenaBytes;
  h->aborted.store(0, std::memory_order_relaxed);
  for (uint32_t i = 0; i < l.numRings; ++i) {
    m->senderTable()[i] = senders[i];
    ShmRingCtrl* c = new (m->ring(i)) ShmRingCtrl();
    c->head.store(0, std::memory_order_relaxed);
    c->tail.store(0, std::memory_order_relaxed);
  }
  std::atomic_thread_fence(std::memory_order_release);
}

}  // namespace

fuscoResult_t shmMemfdMap(const char* name, size_t bytes, ShmMapping* out) {
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return FUSCO_FAIL(fuscoSystemError, kShm, "memfd_create failed: %s", strerror(errno));
  // Owner-only: peers of the same user reach it through /proc/<pid>/fd, nobody else can.
  int rc;
  do rc = fchmod(fd, 0600);
  while (rc == -1 && errno == EINTR);
  if (rc == 0) {
    do rc = ftruncate(fd, static_cast<off_t>(bytes));
    while (rc == -1 && errno == EINTR);
  }
  if (rc != 0) {
    int e = errno;
    closeRetry(fd);
    return FUSCO_FAIL(fuscoSystemError, kShm, "sizing shared segment to %zu bytes failed: %s",
                      bytes, strerror(e));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    closeRetry(fd);
    return FUSCO_FAIL(fuscoSystemError, kShm, "mmap of own %zu-byte shared segment failed: %s",
                      bytes, strerror(e));
  }
  out->fd = fd;
  out->base = static_cast<uint8_t*>(p);
  out->bytes = bytes;
  return fuscoSuccess;
}

fuscoResult_t shmCreateSegment(const ShmLayout& l, int rank, uint64_t commTag,
                               const std::vector<int>& senders, ShmMapping* out) {
  FUSCO_CHECK(shmMemfdMap("fusco-shm", l.segBytes, out));
  writeHeader(l, rank, commTag, senders, out);
  return fuscoSuccess;
}

namespace {

// Checks that a mapped peer header is the segment the blob described and is self-consistent.
fuscoResult_t checkPeerHeader(int rank, const ShmBlob& b, const ShmMapping& m) {
  const ShmSegmentHeader* h = m.header();
  if (h->magic != kShmSegmentMagic || h->version != kShmLayoutVersion || h->ownerPid != b.pid ||
      h->commTag != b.commTag || h->segBytes != b.segBytes || h->ownerRank != rank)
    return FUSCO_FAIL(fuscoInternalError, kShm,
                      "shared segment of rank %d (pid %d, fd %d) has an unexpected header "
                      "(magic %llx version %u owner pid %d rank %d)",
                      rank, b.pid, b.fd, (unsigned long long)h->magic, h->version, h->ownerPid,
                      h->ownerRank);
  ShmLayout l;
  if (!shmComputeLayout(h->numRings, h->depth, h->chunkBytes, h->arenaBytes, &l) ||
      l.segBytes != h->segBytes || l.ringsOffset != h->ringsOffset ||
      l.arenaOffset != h->arenaOffset || l.ringStride != h->ringStride ||
      l.slotStride != h->slotStride || l.payloadOffset != h->payloadOffset)
    return FUSCO_FAIL(fuscoInternalError, kShm,
                      "shared segment of rank %d has an inconsistent layout", rank);
  return fuscoSuccess;
}

}  // namespace

fuscoResult_t shmMapPeerFd(int rank, int32_t pid, int32_t fd, uint64_t bytes, ShmMapping* out) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
  int f;
  do f = open(path, O_RDWR | O_CLOEXEC);
  while (f == -1 && errno == EINTR);
  if (f < 0)
    return FUSCO_FAIL(fuscoSystemError, kShm, "cannot open shared segment of rank %d (%s): %s",
                      rank, path, strerror(errno));
  struct stat st;
  if (fstat(f, &st) != 0 || static_cast<uint64_t>(st.st_size) < bytes || bytes < kShmPage) {
    int e = errno;
    closeRetry(f);
    return FUSCO_FAIL(fuscoSystemError, kShm,
                      "shared segment of rank %d (%s) is not the published %llu bytes: %s", rank,
                      path, (unsigned long long)bytes, strerror(e));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  int e = errno;
  closeRetry(f);  // the mapping keeps the memory alive
  if (p == MAP_FAILED)
    return FUSCO_FAIL(fuscoSystemError, kShm, "mmap of shared segment of rank %d (%s) failed: %s",
                      rank, path, strerror(e));
  out->fd = -1;
  out->base = static_cast<uint8_t*>(p);
  out->bytes = bytes;
  return fuscoSuccess;
}

fuscoResult_t shmOpenPeerSegment(int rank, const ShmBlob& b, ShmMapping* out) {
  ShmMapping m;
  FUSCO_CHECK(shmMapPeerFd(rank, b.pid, b.fd, b.segBytes, &m));
  fuscoResult_t r = checkPeerHeader(rank, b, m);
  if (r != fuscoSuccess) {
    shmUnmap(&m);
    return r;
  }
  *out = m;
  return fuscoSuccess;
}

void shmUnmap(ShmMapping* m) {
  if (m->base != nullptr) munmap(m->base, m->bytes);
  closeRetry(m->fd);
  m->base = nullptr;
  m->bytes = 0;
  m->fd = -1;
}

}  // namespace fusco
