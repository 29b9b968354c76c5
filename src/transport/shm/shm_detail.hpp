// Private to the shared-memory transport (and its tests): the segment layout
// shared between processes, the tuning constants, a growable FIFO and the
// counters tests read.
//
// Segment of rank r (created and owned by r, mapped by every local peer):
//
//   page 0            SegmentHeader (line 0), doorbell word (line 1), sleeping flag (line 2)
//   pages 1..         the board: BoardSlot[kBoardSlots], this rank's one-shot slots (transport.hpp, Board)
//   per slot i        one page of SlotControl, then ring_bytes of ring data, then
//                     kRmaRingBytes of the one-sided ring (records of rma.hpp's
//                     operations: requests, answers and their data; RmaRecord)
//
// Slot i is the receive ring of messages *to* r *from* header.slot rank i: the
// peer produces (writes data, advances tail), r consumes (advances head).  All
// counters are byte counts that only grow; position = counter & (ring - 1).
// Every record in a ring starts 8-byte aligned and occupies a multiple of 8
// bytes, so a record header never straddles the wrap and neither does an
// element of size 1, 2, 4 or 8 (the wrap point is 8-aligned relative to the
// payload start).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <sched.h>

#include "transport/transport.hpp"

namespace chorus::transport::shm_detail {

inline constexpr size_t kCacheLine = 64;
inline constexpr size_t kPage = 4096;
inline constexpr uint64_t kSegmentMagic = 0x3167'6573'6d68'7363ULL;  // "cshmseg1"
inline constexpr uint32_t kLayoutVersion = 4;
inline constexpr uint64_t kProbeValue = 0x6368'6f72'7573'434dULL;  // read by peers' CMA probe

// The measurements behind these constants (ring vs CMA, piece and bounce
// sizes) are in docs/performance.md, "Shared-memory transport constants".
inline constexpr size_t kCmaThreshold = 1 << 20;
inline constexpr size_t kRingPiece = 64 << 10;
inline constexpr size_t kCmaCopyPiece = 1 << 20;  // one process_vm_readv straight into dst
inline constexpr size_t kBounceBytes = 256 << 10; // CMA reduce: read into an L2-resident bounce, then reduce
inline constexpr size_t kPollBudget = 4 << 20;    // bytes per peer per progress call, so other peers are not starved

// A record header: the word (length << 8) | kTag | kind, then the message's
// call signature (Request::sig, 8 bytes).
inline constexpr uint64_t kTagMask = 0xF0;
inline constexpr uint64_t kTag = 0xA0;
inline constexpr uint64_t kKindInline = 1;  // header, then the payload padded to 8 bytes
inline constexpr uint64_t kKindCma = 2;     // header, then the sender's address (8 bytes)
inline constexpr uint64_t kRecordHeaderBytes = 16;

// The one-sided channel (rma.hpp; docs/rma.md): per ordered pair a second
// SPSC ring, apart from the message ring, so that a message nobody has
// received yet never holds up a put, and the message path pays nothing for
// it.  Records are an RmaRecord, then `payload` bytes padded to 8.  The
// origin's requests and the target's answers to the other side's requests
// share the ring of their direction.
inline constexpr size_t kRmaRingBytes = 64 << 10;
inline constexpr size_t kRmaPiece = 16 << 10;  // data per record when the data streams through the ring
inline constexpr uint32_t kRmaPut = 1;      // request: put (kRmaCma: the target reads the origin's buffer at addr; else the data follows, `chunk` = where in the access)
inline constexpr uint32_t kRmaGet = 2;      // request: get (kRmaCma: the target writes the origin's buffer at addr; else kRmaGetData records answer)
inline constexpr uint32_t kRmaNotify = 3;   // request: notification, value in `generation`
inline constexpr uint32_t kRmaDone = 4;     // answer: op finished; `reason` an RmaRefusal (0: done), `generation` its detail
inline constexpr uint32_t kRmaGetData = 5;  // answer: a piece of a get's data at `chunk`, then a kRmaDone
inline constexpr uint16_t kRmaCma = 1;
struct RmaRecord {
  uint32_t kind = 0;
  uint16_t flags = 0;
  uint16_t reason = 0;
  uint32_t region = 0;
  uint32_t payload = 0;     // data bytes after the record (then padded to 8)
  uint64_t op = 0;          // the origin's operation number (1, 2, ... per ordered pair); an answer's: the op it answers
  uint64_t generation = 0;  // the key's generation; notify: the value; kRmaDone: the refusal's detail
  uint64_t offset = 0;      // into the region
  uint64_t bytes = 0;       // the access's length
  uint64_t addr = 0;        // kRmaCma: the origin's buffer
  uint64_t chunk = 0;       // data records: offset of the payload within the access
};
static_assert(sizeof(RmaRecord) == 64);

struct alignas(kCacheLine) SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t nslots;
  uint64_t ring_bytes;
  uint64_t total_bytes;
  int32_t owner_rank;
  int32_t owner_pid;
};

// The owner's doorbell.  Anything the owner may be waiting for increments
// `bell` and, when `sleeping` is set, FUTEX_WAKEs it (shared futex: the word
// lives in a MAP_SHARED mapping seen by several processes).
struct PageZero {
  SegmentHeader header;
  alignas(kCacheLine) std::atomic<uint32_t> bell;
  alignas(kCacheLine) std::atomic<uint32_t> sleeping;
  // Set once by the owner when its transport is aborted (an error broke its
  // communicator, or chorusCommAbort): peers fail their requests with it.
  // Holds the abort's chorusResult_t (nonzero).
  alignas(kCacheLine) std::atomic<uint32_t> aborted;
  char abort_reason[240];  // why (NUL-terminated), written before `aborted`
  // The CPU the owner was on when a wait of its last began to yield (-1:
  // none yet): a peer whose yield came back late reads it to tell the
  // owner, a rank of its own job on its core, from a stranger (spinFor).
  alignas(kCacheLine) std::atomic<int32_t> yield_cpu{-1};
};

struct SlotControl {
  // Written by the producer (the sending peer).
  alignas(kCacheLine) std::atomic<uint64_t> tail;
  // Producer sets it when it found the ring full; the consumer then rings the
  // producer's doorbell whenever it frees space.  Only the producer clears it
  // (a single writer, so a clear can never hide a later set).
  std::atomic<uint32_t> want_space;
  // Written by the consumer (the owner).
  alignas(kCacheLine) std::atomic<uint64_t> head;
  std::atomic<uint64_t> cma_acks;  // CMA messages fully read so far
  // Which of the next messages the owner will reduce rather than copy (see
  // ShmTransport::publishHint): bit 63 valid, bits 32..62 one per posted
  // receive, bits 0..31 the index of the message the first of them matches.
  std::atomic<uint64_t> recv_hint;
  // Written by the owner before the setup barrier, read-only afterwards.
  alignas(kCacheLine) int32_t sender_rank;
  std::atomic<uint32_t> cma_ok;  // 1: the owner can process_vm_readv from the sender
  // The one-sided ring (kRmaRingBytes after the message ring): the sender
  // produces (rma_tail), the owner consumes (rma_head).  Each side rings the
  // other's doorbell when it moved its counter, so neither needs a flag.
  alignas(kCacheLine) std::atomic<uint64_t> rma_tail;
  alignas(kCacheLine) std::atomic<uint64_t> rma_head;
};

// One slot of the owner's board (call k uses slot k % kBoardSlots).  `call` shares the first line with the
// first 56 bytes of data, so a small payload travels with its flag: a reader
// polling `call` has the data in the same cache-line transfer.
struct alignas(kCacheLine) BoardSlot {
  std::atomic<uint64_t> call;  // the call whose data `data` holds (0: none yet)
  std::atomic<uint64_t> sig;  // that call's CallSignature word, written before `call`
  std::byte data[kBoardSlotBytes];
};
inline constexpr size_t kBoardRegion = (kBoardSlots * sizeof(BoardSlot) + kPage - 1) / kPage * kPage;
inline constexpr size_t kHeaderBytes = kPage + kBoardRegion;
inline BoardSlot* boardSlots(std::byte* base) { return reinterpret_cast<BoardSlot*>(base + kPage); }

static_assert(sizeof(PageZero) <= kPage);
static_assert(sizeof(SlotControl) <= kPage);
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "shared-memory counters must be lock-free (address-free) atomics");

constexpr size_t slotStride(size_t ring_bytes) { return kPage + ring_bytes + kRmaRingBytes; }
constexpr size_t segmentBytes(size_t nslots, size_t ring_bytes) { return kHeaderBytes + nslots * slotStride(ring_bytes); }
inline SlotControl* slotControl(std::byte* base, size_t ring_bytes, size_t i) {
  return reinterpret_cast<SlotControl*>(base + kHeaderBytes + i * slotStride(ring_bytes));
}
inline std::byte* slotData(std::byte* base, size_t ring_bytes, size_t i) {
  return base + kHeaderBytes + i * slotStride(ring_bytes) + kPage;
}
inline std::byte* rmaData(std::byte* base, size_t ring_bytes, size_t i) {
  return base + kHeaderBytes + i * slotStride(ring_bytes) + kPage + ring_bytes;
}
constexpr uint64_t round8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

// A FIFO over a power-of-two vector that doubles when full and otherwise never
// allocates, so steady-state posting costs no heap traffic.
template <typename T>
class Fifo {
 public:
  Fifo() : buf_(64) {}
  [[nodiscard]] bool empty() const { return head_ == tail_; }
  [[nodiscard]] size_t size() const { return tail_ - head_; }
  T& front() { return buf_[head_ & (buf_.size() - 1)]; }
  T& at(size_t i) { return buf_[(head_ + i) & (buf_.size() - 1)]; }
  void pop() { ++head_; }
  void push(const T& v) {
    if (size() == buf_.size()) grow();
    buf_[tail_++ & (buf_.size() - 1)] = v;
  }
  template <typename F>
  void forEach(F&& f) {
    for (size_t i = head_; i != tail_; ++i) f(buf_[i & (buf_.size() - 1)]);
  }
  void clear() { head_ = tail_ = 0; }

 private:
  void grow() {
    std::vector<T> bigger(buf_.size() * 2);
    for (size_t i = head_; i != tail_; ++i) bigger[i - head_] = buf_[i & (buf_.size() - 1)];
    tail_ -= head_;
    head_ = 0;
    buf_.swap(bigger);
  }
  std::vector<T> buf_;
  size_t head_ = 0;
  size_t tail_ = 0;
};

// The shm transport's wait policy between spinning and sleeping (its
// spinFor; docs/performance.md, "Waits under contention").  Without other
// load a wait spins up to the configured budget, yielding the core after the
// first microseconds, which costs nothing when nobody else wants the core.
// When another process does (a busy task on our core), a yield hands it the
// core for a scheduler slice, milliseconds, while the peer's answer may
// already be here.  A yield that comes back late says so; the waits then
// spin only a few times as long as the spin-satisfied waits have recently
// taken (at least kContendedMinSpin) and sleep on the futex without
// yielding, so that the peer's doorbell wakes us (the scheduler runs a woken
// task before the busy one) instead of the busy task's slice ending.  The
// mode lasts kContendedHold after the last late yield; then a yield is tried
// again.  With more ranks than cores (oversubscribed) a long yield is the
// point (a peer rank ran): that mode is never entered.
class SpinPolicy {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::microseconds kYieldStolen{20};
  static constexpr std::chrono::milliseconds kContendedHold{20};
  static constexpr std::chrono::microseconds kContendedMinSpin{10};

  SpinPolicy(std::chrono::microseconds spin, bool oversubscribed) : spin_(spin), oversubscribed_(oversubscribed) {}

  // The spin budget of a wait starting at `now`; *contended: whether it is
  // in contended mode (then it must not yield).  `peer_rank_here()` is asked
  // only in contended mode: true when one of our own ranks yields on this CPU
  // now (the placement changed under the mode), so what took our core was
  // that rank, not a stranger, and a long spin without a yield would only
  // keep it from running: the mode ends.
  template <typename F>
  [[nodiscard]] std::chrono::microseconds budget(Clock::time_point now, bool* contended, F&& peer_rank_here) {
    *contended = !oversubscribed_ && now < contended_until_;
    if (*contended && peer_rank_here()) {
      contended_until_ = {};
      *contended = false;
    }
    if (!*contended) return spin_;
    const auto typical = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::nanoseconds(4 * ewma_ns_));
    return std::clamp(typical, std::min(kContendedMinSpin, spin_), spin_);
  }
  // A wait the spin satisfied after `took` (0 when it was not timed).
  void satisfied(std::chrono::nanoseconds took) { ewma_ns_ += (took.count() - ewma_ns_) / 8; }
  // A sched_yield from `before` to `after`: true when it handed the core to
  // another task (the wait should go to sleep now).  `ran_a_peer_rank()` is
  // asked only of a late yield: true when one of our own ranks yields on
  // this CPU too (ranks that started on one core, before the kernel spreads
  // them), so the yield was the right hand-over, not a stranger's slice.
  template <typename F>
  bool yielded(Clock::time_point before, Clock::time_point after, F&& ran_a_peer_rank) {
    if (oversubscribed_ || after - before <= kYieldStolen || ran_a_peer_rank()) return false;
    contended_until_ = after + kContendedHold;
    ++stolen_;
    return true;
  }
  [[nodiscard]] uint64_t stolenYields() const { return stolen_; }

 private:
  std::chrono::microseconds spin_;
  bool oversubscribed_;
  int64_t ewma_ns_ = 1000;
  Clock::time_point contended_until_{};
  uint64_t stolen_ = 0;
};

// Where a rank on `cpu` that shares it with a peer rank should move
// (ShmTransport::spreadFrom): only the higher-numbered of two ranks on one
// core moves (so they never both do), to the first CPU of `allowed` that no
// peer was last seen on; -1: stay.  `peers` holds (rank, last CPU; -1
// unknown).
inline int spreadTarget(int cpu, int rank, const std::vector<std::pair<int, int>>& peers, const cpu_set_t& allowed) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) return -1;
  bool lower_here = false;
  cpu_set_t taken;
  CPU_ZERO(&taken);
  CPU_SET(cpu, &taken);
  for (const auto& [r, c] : peers) {
    if (c < 0 || c >= CPU_SETSIZE) continue;
    CPU_SET(c, &taken);
    lower_here = lower_here || (c == cpu && r < rank);
  }
  if (!lower_here) return -1;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed) && !CPU_ISSET(c, &taken)) return c;
  return -1;
}

// Counters of one transport, updated by its executor thread only; read them
// when that thread is quiescent (tests join it first).
struct ShmStats {
  uint64_t inline_sends = 0;
  uint64_t cma_sends = 0;
  uint64_t inline_recvs = 0;
  uint64_t cma_recvs = 0;
  uint64_t futex_waits = 0;
  uint64_t futex_wakes = 0;
  uint64_t stolen_yields = 0;  // yields that handed the core to another task (contended mode, spinFor)
  uint64_t board_calls = 0;   // publish() calls
  uint64_t spreads = 0;       // moves to another core away from a peer rank sharing ours (spreadFrom)
  uint32_t cma_peers = 0;  // peers this rank sends to by CMA (probe passed on their side)
  uint64_t rma_requests = 0;  // one-sided requests this rank served (put, get, notify)
  uint64_t rma_cma = 0;       // of them, copied by cross-memory attach
};

// The stats of a transport made by createShmTransport; nullopt for others.
std::optional<ShmStats> shmStats(const Transport& t);

}  // namespace chorus::transport::shm_detail
