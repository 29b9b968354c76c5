// The shared-memory transport: SPSC rings in POSIX shared memory for small
// messages, cross-memory attach for large ones, futex doorbells for waiting.
// shm.hpp has the overview, shm_detail.hpp the segment layout.
//
// Threading: every member except abort(), wake() and the atomics they touch is
// used by the executor thread only (Transport's contract), so the per-peer
// queues and cursors need no locks.
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>

#include "common/log.hpp"
#include "transport/rma.hpp"
#include "transport/shm/shm.hpp"
#include "transport/shm/shm_detail.hpp"

namespace chorus::transport {
namespace {

using namespace shm_detail;
using Clock = std::chrono::steady_clock;

// How often a blocked rank checks that the peers it waits on still exist.
constexpr auto kLivenessInterval = std::chrono::milliseconds(100);

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Shared (not FUTEX_PRIVATE) futexes: the word lives in a MAP_SHARED segment
// that other processes map at other addresses.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000), static_cast<long>(timeout.count() % 1000000) * 1000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void futexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Maps the pages of [addr, addr + len) of a shared mapping into this
// process now, so that the first calls do not take a page fault per page of
// ring they write or read: ~20 faults per call, 10-40 us, in the first
// thousands of calls of a 4-rank 32 KiB allgather on 2 cores.  The pages
// exist (the owner created its segment with MAP_POPULATE before publishing
// it).  MADV_POPULATE_WRITE (Linux 5.14) does it in one call; before it, a
// read of each page maps it (shmem maps a shared page writable on a read).
void prefault(std::byte* addr, size_t len) {
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;
#endif
  if (madvise(addr, len, MADV_POPULATE_WRITE) == 0) return;
  for (size_t off = 0; off < len; off += kPage) (void)*reinterpret_cast<volatile const std::byte*>(addr + off);
}

// An mmap'd region, unmapped on destruction.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* addr, size_t len) : addr_(static_cast<std::byte*>(addr)), len_(len) {}
  Mapping(Mapping&& o) noexcept : addr_(std::exchange(o.addr_, nullptr)), len_(std::exchange(o.len_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    std::swap(addr_, o.addr_);
    std::swap(len_, o.len_);
    return *this;
  }
  ~Mapping() {
    if (addr_ != nullptr) munmap(addr_, len_);
  }
  [[nodiscard]] std::byte* data() const { return addr_; }
  [[nodiscard]] PageZero* page0() const { return reinterpret_cast<PageZero*>(addr_); }

 private:
  std::byte* addr_ = nullptr;
  size_t len_ = 0;
};

// What a rank publishes in the store as "shm/<rank>".
struct SegmentRecord {
  uint64_t magic;
  int32_t rank;
  int32_t pid;
  uint64_t probe_addr;  // address of a kProbeValue in the owner's memory
  uint64_t total_bytes;
  char name[256];
};

struct SendOp {
  const std::byte* src = nullptr;
  uint64_t bytes = 0;
  uint64_t off = 0;
  Request* req = nullptr;
  bool cma = false;
  bool header_done = false;
};

struct RecvOp {
  RecvTarget target;
  Request* req = nullptr;
  bool header_done = false;
  bool cma = false;
  uint64_t remote_addr = 0;
  uint64_t off = 0;
};

// A one-sided operation this rank posted (rma.hpp), until its answer.
struct RmaOp {
  RmaOpKind kind = RmaOpKind::Put;
  Request* req = nullptr;
  const std::byte* src = nullptr;  // put
  std::byte* dst = nullptr;        // get
  uint64_t bytes = 0;
  uint32_t region = 0;
  uint64_t generation = 0;  // notify: the value
  uint64_t offset = 0;
  uint64_t id = 0;
  bool cma = false;
  uint64_t sent = 0;  // put through the ring: data bytes written
  uint64_t got = 0;   // get through the ring: data bytes received
};

// What this rank owes a peer for its requests: a kRmaDone record, or (a get
// answered through the ring) the data, re-checked piece by piece, then one.
struct RmaReply {
  uint64_t op = 0;
  RmaRefusal why = RmaRefusal::None;
  uint64_t detail = 0;
  bool stream = false;
  uint32_t region = 0;
  uint64_t generation = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t sent = 0;
};

struct Peer {
  uint32_t msgs_in = 0;   // receives from this peer finished (each matches one message)
  uint32_t msgs_out = 0;  // message headers written to this peer
  int rank = -1;
  pid_t pid = 0;
  int pidfd = -1;
  Mapping seg;  // the peer's segment
  PageZero* peer_page0 = nullptr;
  const BoardSlot* board = nullptr;  // the peer's board (kBoardSlots slots)

  // Outgoing: our ring in the peer's segment.
  SlotControl* out = nullptr;
  std::byte* out_data = nullptr;
  uint64_t out_mask = 0;
  uint64_t out_tail = 0;       // our next write position (published or not)
  uint64_t out_published = 0;  // last value stored to out->tail
  uint64_t out_head = 0;       // cached copy of out->head
  bool want_space_set = false;
  bool cma_send = false;
  uint64_t acks_seen = 0;
  Fifo<SendOp> sends;        // not yet fully written into the ring, in post order
  Fifo<Request*> cma_wait;   // CMA descriptors written, waiting for the peer's ack

  // Incoming: the peer's ring in our segment.
  SlotControl* in = nullptr;
  std::byte* in_data = nullptr;
  uint64_t in_mask = 0;
  uint64_t in_head = 0;       // our next read position
  uint64_t in_published = 0;  // last value stored to in->head
  uint64_t in_tail = 0;       // cached copy of in->tail
  uint64_t tail_polled = 0;   // in->tail when poll() last looked; wait() watches it move
  uint64_t discard = 0;       // ring bytes of a rejected message still to skip
  uint64_t acks_given = 0;
  Fifo<RecvOp> recvs;

  Status dead;               // non-ok once the peer is known to be gone
  bool dead_reported = false;

  // One-sided (rma.hpp): our RMA ring in the peer's segment (we produce)
  // and its ring in ours (we consume).
  std::byte* rma_out_data = nullptr;
  uint64_t rma_out_tail = 0;
  uint64_t rma_out_head = 0;  // cached copy of out->rma_head
  uint64_t rma_out_published = 0;
  std::byte* rma_in_data = nullptr;
  uint64_t rma_in_head = 0;
  uint64_t rma_in_published = 0;
  Fifo<RmaOp> rma_ops;      // posted and not answered yet, in post order
  size_t rma_written = 0;   // rma_ops.at(0 .. rma_written - 1) are written whole
  uint64_t rma_next_op = 1;  // the number of our next op to this peer
  uint64_t rma_expect = 1;   // the number the peer's next request must carry
  Fifo<RmaReply> rma_replies;
  // A put of the peer streaming through the ring: its op, the next piece's
  // offset, and the first refusal of its pieces.
  uint64_t rma_put_op = 0;
  uint64_t rma_put_next = 0;
  RmaRefusal rma_put_why = RmaRefusal::None;
  uint64_t rma_put_detail = 0;

  [[nodiscard]] bool busy() const { return !sends.empty() || !cma_wait.empty() || !recvs.empty(); }
  // Also one-sided operations awaiting answers (what the liveness check watches).
  [[nodiscard]] bool busyAny() const { return busy() || !rma_ops.empty(); }
};

// Rings `pz`'s doorbell: the increment pairs with the owner's seq_cst store of
// `sleeping` and load of `bell` in wait() (a Dekker pair): either the owner
// sees the new bell value and does not sleep, or we see sleeping == 1 and
// FUTEX_WAKE it.  FUTEX_WAIT itself re-checks the word atomically, which covers
// an increment that lands between the owner's check and its sleep.
// A new message needs no doorbell: the owner's wait() watches the tails of its
// rings while it polls (one line per peer, written by that peer alone), and
// only a sleeping owner needs the futex.  Dekker as in ring(): our seq_cst
// tail store then load of `sleeping`, against the owner's seq_cst store of
// `sleeping` then load of the tails.  Saves an atomic read-modify-write of a
// line every sender shares on each message.
inline bool wakeIfSleeping(PageZero* pz) {
  if (pz->sleeping.load(std::memory_order_seq_cst) == 0) return false;
  pz->bell.fetch_add(1, std::memory_order_seq_cst);
  futexWake(&pz->bell);
  return true;
}

inline bool ring(PageZero* pz) {
  pz->bell.fetch_add(1, std::memory_order_seq_cst);
  if (pz->sleeping.load(std::memory_order_seq_cst) != 0) {
    futexWake(&pz->bell);
    return true;
  }
  return false;
}

// How long wait() spins without yielding before it starts yielding the core.
constexpr std::chrono::microseconds kPureSpin{4};

class ShmTransport final : public Transport, public Board, public Rma {
 public:
  ShmTransport() = default;
  ~ShmTransport() override {
    for (Peer& p : peers_)
      if (p.pidfd >= 0) close(p.pidfd);
    if (!own_name_.empty()) shm_unlink(own_name_.c_str());  // only when setup failed before unlinking
  }

  Status init(const ShmSetup& setup, bootstrap::Store& store);

  [[nodiscard]] std::string_view name() const override { return "shm"; }
  Status postSend(int peer, const void* src, size_t bytes, Request* req) override;
  Status postRecv(int peer, const RecvTarget& target, Request* req) override;
  Result<bool> poll() override;
  void wait(std::chrono::microseconds timeout) override;
  void wake() override;
  void abort(const Status& why) override;

  // Board
  std::byte* slot(uint64_t k) override { return own_board_[k % kBoardSlots].data; }
  void publish(uint64_t k, const CallSignature& sig) override;
  bool signature(int peer, uint64_t k, CallSignature* out) const override;
  uint64_t slotCall(int peer, uint64_t k) const override;
  void settle() override;
  Result<const std::byte*> await(int peer, uint64_t k, std::chrono::milliseconds timeout,
                                 CallSignature* sig) override;

  // Rma (rma.hpp)
  Rma* rma() override { return this; }
  Result<RegionId> registerRegion(void* base, size_t bytes, Access access) override {
    return regions_.add(base, bytes, access);
  }
  Status deregisterRegion(RegionId id) override { return regions_.remove(id); }
  Result<std::vector<std::byte>> packKey(RegionId id) override { return regions_.pack(id); }
  Result<RemoteKey> unpackKey(int peer, std::span<const std::byte> blob) override {
    return regions_.unpack(peer, findPeer(peer) != nullptr, blob);
  }
  Status put(int peer, const void* local, size_t bytes, const RemoteKey& key, uint64_t offset, Request* req) override;
  Status get(int peer, void* local, size_t bytes, const RemoteKey& key, uint64_t offset, Request* req) override;
  Status notify(int peer, uint64_t value, Request* req) override;
  Result<bool> takeNotification(int* peer, uint64_t* value) override;

  [[nodiscard]] const ShmStats& stats() const { return stats_; }

 private:
  Peer* findPeer(int rank) {
    if (rank < 0 || static_cast<size_t>(rank) >= peer_index_.size() || peer_index_[static_cast<size_t>(rank)] < 0)
      return nullptr;
    return &peers_[static_cast<size_t>(peer_index_[static_cast<size_t>(rank)])];
  }
  const Peer* findPeer(int rank) const { return const_cast<ShmTransport*>(this)->findPeer(rank); }
  Status abortStatus() {
    std::lock_guard lock(abort_mu_);
    return abort_status_;
  }

  // init()'s steps.
  Status configure(const ShmSetup& setup);
  Result<SegmentRecord> createSegment(const ShmSetup& setup);
  Status mapPeer(Peer& p, bootstrap::Store& store, std::chrono::milliseconds timeout, std::vector<std::string>* names);
  uint32_t probeCma(const Peer& p, uint64_t probe_addr) const;
  Status setupBarrier(bootstrap::Store& store, std::chrono::milliseconds timeout);

  bool progressSend(Peer& p);
  void publishHint(Peer& p);
  void checkUnclaimed(Peer& p);
  // The latest collective call a request was posted for (transport.hpp's
  // sameCallOtherSignature).
  void noteCall(uint64_t sig) {
    if (sig != 0 && (sig & kWirePointToPoint) == 0) current_sig_ = sig;
  }
  uint64_t current_sig_ = 0;
  bool progressRecv(Peer& p);
  bool reserve(Peer& p, uint64_t need);
  void flushSend(Peer& p);
  void flushRecv(Peer& p);
  void writeRing(Peer& p, const void* src, uint64_t n);
  void deliverInline(Peer& p, RecvOp& op, uint64_t n);
  Status readCma(Peer& p, RecvOp& op);
  void ackCma(Peer& p);
  void failPeer(Peer& p, const Status& why);
  // One-sided.
  Status postRma(int peer, RmaOp op, const RemoteKey* key, const void* local);
  [[gnu::noinline]] bool pollRma(Status& err);  // out of poll()'s hot path
  bool progressRma(Peer& p);
  bool consumeRma(Peer& p);
  bool produceRma(Peer& p);
  bool rmaReserve(Peer& p, uint64_t need);
  void rmaWrite(Peer& p, const RmaRecord& rec, const std::byte* payload, uint64_t n);
  void serveRequest(Peer& p, const RmaRecord& rec, uint64_t payload_at);
  Status takeAnswer(Peer& p, const RmaRecord& rec, uint64_t payload_at);
  uint64_t cmaCopy(const Peer& p, std::byte* mine, uint64_t theirs, uint64_t n, bool write_theirs);
  bool checkLiveness();
  bool processGone(const Peer& p) const;
  template <typename F>
  bool spinFor(F&& done, int polls, std::chrono::microseconds timeout, Clock::time_point* start);
  // Whether a peer's waits last yielded on the CPU we run on now.
  bool peerYieldsHere() const;
  void spreadFrom(Clock::time_point now);
  Status abortedOr(const Peer& p, Status otherwise) const;

  int rank_ = 0;
  pid_t pid_ = 0;
  std::string own_name_;  // non-empty until unlinked
  Mapping own_;
  PageZero* page0_ = nullptr;
  BoardSlot* own_board_ = nullptr;
  bool board_unsettled_ = false;  // published, but not yet settle()d
  std::atomic<uint64_t> settle_fence_{0};
  std::vector<int> peer_ranks_;  // sorted; peers_[i] serves peer_ranks_[i] and our slot i
  std::vector<int32_t> peer_index_;  // rank -> i (-1: not a peer): findPeer in O(1) on every board read
  std::vector<Peer> peers_;
  std::vector<std::byte> bounce_;
  std::chrono::microseconds spin_{50};
  SpinPolicy policy_{spin_, false};  // set by init()
  // More local ranks than cores: the peer we wait for may be queued behind us
  // on our own core, so the wait yields from the first poll (see wait()).
  bool oversubscribed_ = false;
  bool allow_cma_ = true;
  size_t cma_threshold_ = kCmaThreshold;  // CHORUS_SHM_CMA_BYTES
  alignas(8) volatile uint64_t probe_ = kProbeValue;  // peers read it by process_vm_readv

  uint32_t seen_bell_ = 0;  // bell value read at the start of the last poll()
  Clock::time_point last_liveness_{};
  // Spreading ranks that share a core (spreadFrom): on, when it may try
  // again, and the peers' (rank, last CPU) it reads.
  bool spread_ = false;
  Clock::time_point next_spread_{};
  std::vector<std::pair<int, int>> spread_peers_;

  // One-sided: the regions, the notifications that arrived, and when the
  // RMA rings were last looked at (a peer rings our doorbell after every
  // change to them, so poll() looks only when the bell moved since).
  RegionTable regions_{rmaTransportTag("shm"), 0};
  std::deque<std::pair<int, uint64_t>> notes_;
  // The bell value at the last look, or kRmaAgain: look at the next poll
  // (a bounded pass left work).
  static constexpr uint64_t kRmaAgain = ~uint64_t{0};
  uint64_t rma_bell_ = kRmaAgain;

  std::atomic<bool> wake_pending_{false};
  std::atomic<bool> aborted_{false};
  bool abort_handled_ = false;
  std::mutex abort_mu_;
  Status abort_status_;

  ShmStats stats_;
};

// ---------------------------------------------------------------- setup ----

Status ShmTransport::init(const ShmSetup& setup, bootstrap::Store& store) {
  CHORUS_RETURN_IF_ERROR(configure(setup));
  CHORUS_ASSIGN_OR_RETURN(const SegmentRecord rec, createSegment(setup));
  CHORUS_RETURN_IF_ERROR(store.set(fmt::format("shm/{}", rank_), bootstrap::toBytes(rec)));

  // Map every peer's segment and find our ring in it.
  std::vector<std::string> peer_names;
  for (Peer& p : peers_) CHORUS_RETURN_IF_ERROR(mapPeer(p, store, setup.timeout, &peer_names));

  CHORUS_RETURN_IF_ERROR(setupBarrier(store, setup.timeout));
  // Every rank of the set has mapped every segment now, so any of them may
  // remove every name: the names go even if some ranks are killed right here.
  shm_unlink(own_name_.c_str());
  own_name_.clear();
  for (const std::string& n : peer_names) shm_unlink(n.c_str());

  for (Peer& p : peers_) {
    p.cma_send = allow_cma_ && p.out->cma_ok.load(std::memory_order_acquire) != 0;
    stats_.cma_peers += p.cma_send ? 1 : 0;
    if (p.pid != pid_) {
      p.pidfd = static_cast<int>(syscall(SYS_pidfd_open, p.pid, 0));  // -1: fall back to kill(pid, 0)
    }
  }
  if (allow_cma_ && !peers_.empty()) bounce_.resize(kBounceBytes);  // for CMA reduce-receives
  seen_bell_ = page0_->bell.load(std::memory_order_acquire);
  last_liveness_ = Clock::now();
  return {};
}

Status ShmTransport::configure(const ShmSetup& setup) {
  rank_ = setup.rank;
  regions_ = RegionTable(rmaTransportTag("shm"), rank_);
  pid_ = getpid();
  peer_ranks_ = setup.peers;
  std::sort(peer_ranks_.begin(), peer_ranks_.end());
  if (std::adjacent_find(peer_ranks_.begin(), peer_ranks_.end()) != peer_ranks_.end() ||
      std::binary_search(peer_ranks_.begin(), peer_ranks_.end(), rank_))
    return invalidArgument("shm transport, rank {}: the peer list must be distinct ranks other than {} itself",
                           rank_, rank_);
  // The knob (CHORUS_SHM_RING_BYTES) is validated with the same rule where
  // it is read (api/config.cpp); this checks the argument of direct callers.
  const size_t ring_bytes = setup.ring_bytes;
  if (ring_bytes < kPage || (ring_bytes & (ring_bytes - 1)) != 0 || ring_bytes > (size_t{1} << 32))
    return invalidArgument("shm transport, rank {}: ring size {} bytes must be a power of two in [4096, 4 GiB]",
                           rank_, ring_bytes);
  if (setup.segment_prefix.empty() || setup.segment_prefix.size() > 200 ||
      setup.segment_prefix.find('/', 1) != std::string::npos)
    return invalidArgument("shm transport, rank {}: segment prefix '{}' must be 1..200 characters with no '/' "
                           "after the first", rank_, setup.segment_prefix);
  allow_cma_ = setup.allow_cma;
  cma_threshold_ = std::max<size_t>(setup.cma_bytes, 1);
  cpu_set_t cpus;
  size_t ncores = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? static_cast<size_t>(CPU_COUNT(&cpus)) : 1;
  oversubscribed_ = peer_ranks_.size() + 1 > ncores;
  spread_ = setup.spread && !oversubscribed_ && ncores > 1;
  spin_ = std::max(setup.spin, std::chrono::microseconds(0));
  policy_ = SpinPolicy(spin_, oversubscribed_);
  return {};
}

// Creates, sizes and lays out our segment; returns the record that tells the
// peers where it is.
Result<SegmentRecord> ShmTransport::createSegment(const ShmSetup& setup) {
  const size_t ring_bytes = setup.ring_bytes;
  // A name left by a killed earlier run is unlinked once.
  std::string name = setup.segment_prefix[0] == '/' ? setup.segment_prefix : "/" + setup.segment_prefix;
  name += fmt::format("-r{}", rank_);
  const size_t nslots = peer_ranks_.size();
  const size_t total = segmentBytes(nslots, ring_bytes);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) {
    log::warn("shm transport, rank {}: removing stale segment {} (left by a killed run?)", rank_, name);
    shm_unlink(name.c_str());
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  }
  if (fd < 0)
    return errnoError(fmt::format("shm transport, rank {}: shm_open({}) (is /dev/shm mounted and writable?)", rank_,
                                  name), errno);
  own_name_ = name;
  fchmod(fd, 0600);  // the umask can only remove bits, but be explicit
  if (ftruncate(fd, static_cast<off_t>(total)) != 0) {
    int err = errno;
    close(fd);
    return errnoError(fmt::format("shm transport, rank {}: ftruncate({}, {} bytes) (is /dev/shm large enough? "
                                  "lower CHORUS_SHM_RING_BYTES)", rank_, name, total), err);
  }
  // Populated: every page of it is ours to read (our rings' data) and the
  // peers', and a fault per ring page would slow the first calls.
  void* addr = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int map_err = errno;
  close(fd);
  if (addr == MAP_FAILED)
    return errnoError(fmt::format("shm transport, rank {}: mmap of {} ({} bytes)", rank_, name, total), map_err);
  own_ = Mapping(addr, total);
  page0_ = new (own_.data()) PageZero{};
  page0_->header = SegmentHeader{kSegmentMagic, kLayoutVersion, static_cast<uint32_t>(nslots), ring_bytes, total,
                                 rank_, static_cast<int32_t>(pid_)};
  own_board_ = boardSlots(own_.data());
  for (size_t k = 0; k < kBoardSlots; ++k) new (&own_board_[k]) BoardSlot{};
  peers_.resize(nslots);
  peer_index_.assign(peer_ranks_.empty() ? 0 : static_cast<size_t>(std::max(peer_ranks_.back(), 0)) + 1, -1);
  for (size_t i = 0; i < nslots; ++i) {
    if (peer_ranks_[i] >= 0) peer_index_[static_cast<size_t>(peer_ranks_[i])] = static_cast<int32_t>(i);
    SlotControl* sc = new (slotControl(own_.data(), ring_bytes, i)) SlotControl{};
    sc->sender_rank = peer_ranks_[i];
    Peer& p = peers_[i];
    p.rank = peer_ranks_[i];
    p.in = sc;
    p.in_data = slotData(own_.data(), ring_bytes, i);
    p.in_mask = ring_bytes - 1;
    p.rma_in_data = rmaData(own_.data(), ring_bytes, i);
  }

  SegmentRecord rec{};
  rec.magic = kSegmentMagic;
  rec.rank = rank_;
  rec.pid = static_cast<int32_t>(pid_);
  rec.probe_addr = reinterpret_cast<uint64_t>(&probe_);
  rec.total_bytes = total;
  std::snprintf(rec.name, sizeof rec.name, "%s", name.c_str());
  return rec;
}

// Maps p's segment (its name goes to *names, to be unlinked after the
// barrier), finds our ring in it and tells p whether we can read its memory.
Status ShmTransport::mapPeer(Peer& p, bootstrap::Store& store, std::chrono::milliseconds timeout,
                             std::vector<std::string>* names) {
  CHORUS_ASSIGN_OR_RETURN(bootstrap::Bytes b, store.get(fmt::format("shm/{}", p.rank), timeout));
  SegmentRecord pr{};
  if (b.size() != sizeof pr)
    return internalError("shm transport, rank {}: store record of peer rank {} has {} bytes, expected {} "
                         "(mixed chorus versions?)", rank_, p.rank, b.size(), sizeof pr);
  std::memcpy(&pr, b.data(), sizeof pr);
  pr.name[sizeof pr.name - 1] = '\0';
  names->emplace_back(pr.name);
  int pfd = shm_open(pr.name, O_RDWR, 0);
  if (pfd < 0)
    return errnoError(fmt::format("shm transport, rank {}: opening peer rank {}'s segment {} (is that rank on "
                                  "another host or in another IPC namespace?)", rank_, p.rank, pr.name), errno);
  struct stat st {};
  if (fstat(pfd, &st) != 0 || static_cast<uint64_t>(st.st_size) != pr.total_bytes) {
    close(pfd);
    return internalError("shm transport, rank {}: peer rank {}'s segment {} has size {}, expected {}", rank_,
                         p.rank, pr.name, static_cast<int64_t>(st.st_size), pr.total_bytes);
  }
  void* paddr = mmap(nullptr, pr.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
  int perr = errno;
  close(pfd);
  if (paddr == MAP_FAILED)
    return errnoError(fmt::format("shm transport, rank {}: mmap of peer rank {}'s segment {}", rank_, p.rank,
                                  pr.name), perr);
  p.seg = Mapping(paddr, pr.total_bytes);
  p.peer_page0 = p.seg.page0();
  const SegmentHeader& h = p.peer_page0->header;
  if (h.magic != kSegmentMagic || h.version != kLayoutVersion || h.owner_rank != p.rank)
    return internalError("shm transport, rank {}: segment {} of peer rank {} has a foreign layout (magic {:#x}, "
                         "version {}, owner {})", rank_, pr.name, p.rank, h.magic, h.version, h.owner_rank);
  p.pid = h.owner_pid;
  p.board = boardSlots(p.seg.data());
  size_t slot = h.nslots;
  for (size_t i = 0; i < h.nslots; ++i)
    if (slotControl(p.seg.data(), h.ring_bytes, i)->sender_rank == rank_) slot = i;
  if (slot == h.nslots)
    return invalidArgument("shm transport, rank {}: peer rank {} does not list rank {} among its local peers "
                           "(do all ranks agree on which ranks share this host?)", rank_, p.rank, rank_);
  p.out = slotControl(p.seg.data(), h.ring_bytes, slot);
  p.out_data = slotData(p.seg.data(), h.ring_bytes, slot);
  p.rma_out_data = rmaData(p.seg.data(), h.ring_bytes, slot);
  // Map now what this rank touches of the peer's segment: its header and
  // board, and our ring in it (the rest are other ranks' rings).
  prefault(p.seg.data(), kHeaderBytes);
  prefault(reinterpret_cast<std::byte*>(p.out), slotStride(h.ring_bytes));
  p.out_mask = h.ring_bytes - 1;
  p.in->cma_ok.store(probeCma(p, pr.probe_addr), std::memory_order_release);
  return {};
}

// CMA probe: can we (the receiver of p's messages) read its memory?  1: yes.
uint32_t ShmTransport::probeCma(const Peer& p, uint64_t probe_addr) const {
  if (!allow_cma_) return 0;
  uint64_t v = 0;
  iovec local{&v, sizeof v};
  iovec remote{reinterpret_cast<void*>(probe_addr), sizeof v};
  ssize_t n = process_vm_readv(p.pid, &local, 1, &remote, 1, 0);
  if (n == static_cast<ssize_t>(sizeof v) && v == kProbeValue) return 1;
  log::info("shm transport, rank {}: cross-memory attach to peer rank {} (pid {}) unavailable ({}); large "
            "messages from it go through the ring", rank_, p.rank, p.pid, n < 0 ? strerror(errno) : "short");
  return 0;
}

// After it every peer has mapped our segment (so the name can go) and has
// written its cma_ok flags (so we can read them).  Keyed by the lowest rank of
// the set so that other hosts' sets do not share a counter.
Status ShmTransport::setupBarrier(bootstrap::Store& store, std::chrono::milliseconds timeout) {
  const int nset = static_cast<int>(peers_.size()) + 1;
  const int lowest = peer_ranks_.empty() ? rank_ : std::min(rank_, peer_ranks_.front());
  const std::string bkey = fmt::format("shm/barrier/{}", lowest);
  CHORUS_ASSIGN_OR_RETURN(int64_t arrived, store.add(bkey, 1));
  if (arrived == nset) CHORUS_RETURN_IF_ERROR(store.set(bkey + "/done", bootstrap::toBytes(std::string_view("1"))));
  return store.get(bkey + "/done", timeout).status();
}

// ------------------------------------------------------------ posting ------

Status ShmTransport::postSend(int peer, const void* src, size_t bytes, Request* req) {
  if (aborted_.load(std::memory_order_acquire)) {
    Status why = abortStatus();
    req->fail(why);
    return why;
  }
  Peer* p = findPeer(peer);
  if (p == nullptr) return invalidArgument("shm transport, rank {}: send to rank {}, which is not a local peer", rank_, peer);
  if (bytes > 0 && src == nullptr) return invalidArgument("shm transport, rank {}: send of {} bytes to rank {} from a null buffer", rank_, bytes, peer);
  if (!p->dead.isOk()) {
    req->fail(p->dead);
    return p->dead;
  }
  req->status = Status();
  req->state.store(Request::Posted, std::memory_order_relaxed);
  noteCall(req->sig);
  p->sends.push(SendOp{static_cast<const std::byte*>(src), bytes, 0, req, p->cma_send && bytes >= cma_threshold_, false});
  // Start at once: a small message is usually in the ring before post returns.
  progressSend(*p);
  return {};
}

Status ShmTransport::postRecv(int peer, const RecvTarget& target, Request* req) {
  if (aborted_.load(std::memory_order_acquire)) {
    Status why = abortStatus();
    req->fail(why);
    return why;
  }
  Peer* p = findPeer(peer);
  if (p == nullptr) return invalidArgument("shm transport, rank {}: receive from rank {}, which is not a local peer", rank_, peer);
  if (target.bytes > 0 && target.dst == nullptr)
    return invalidArgument("shm transport, rank {}: receive of {} bytes from rank {} into a null buffer", rank_, target.bytes, peer);
  RecvTarget t = target;
  if (t.reducer != nullptr) {
    size_t es = t.reducer->valid() ? t.reducer->elemSize() : 0;
    // Ring records are 8-byte aligned, so elements of these sizes never straddle a piece or the wrap.
    if (es == 0 || 8 % es != 0 || t.bytes % es != 0)
      return invalidArgument("shm transport, rank {}: reduce-receive of {} bytes from rank {} with element size {} "
                             "(bytes must be a multiple of an element size of 1, 2, 4 or 8)", rank_, t.bytes, peer, es);
    if (t.accum == nullptr) t.accum = t.dst;
  }
  if (!p->dead.isOk()) {
    req->fail(p->dead);
    return p->dead;
  }
  req->status = Status();
  req->state.store(Request::Posted, std::memory_order_relaxed);
  noteCall(req->sig);
  RecvOp op;
  op.target = t;
  op.req = req;
  p->recvs.push(op);
  if (p->recvs.size() <= 31) publishHint(*p);
  if (p->recvs.size() == 1) progressRecv(*p);  // the message may be waiting already
  return {};
}

// ------------------------------------------------------------- sending -----

// True when `need` bytes are free in our ring at p; refreshes the cached head
// only when the cached one says no, and raises want_space before giving up.
bool ShmTransport::reserve(Peer& p, uint64_t need) {
  const uint64_t cap = p.out_mask + 1;
  if (cap - (p.out_tail - p.out_head) >= need) return true;
  p.out_head = p.out->head.load(std::memory_order_acquire);
  if (cap - (p.out_tail - p.out_head) < need) {
    // Pairs with the consumer's seq_cst head store + want_space load in
    // flushRecv: either it sees our flag and rings us, or we see its head.
    if (!p.want_space_set) {
      p.out->want_space.store(1, std::memory_order_seq_cst);
      p.want_space_set = true;
    }
    p.out_head = p.out->head.load(std::memory_order_seq_cst);
    if (cap - (p.out_tail - p.out_head) < need) return false;
  }
  if (p.want_space_set) {
    p.out->want_space.store(0, std::memory_order_relaxed);
    p.want_space_set = false;
  }
  return true;
}

void ShmTransport::writeRing(Peer& p, const void* src, uint64_t n) {
  const uint64_t cap = p.out_mask + 1;
  const uint64_t pos = p.out_tail & p.out_mask;
  const uint64_t first = std::min(n, cap - pos);
  std::memcpy(p.out_data + pos, src, first);
  if (first < n) std::memcpy(p.out_data, static_cast<const std::byte*>(src) + first, n - first);
}

void ShmTransport::flushSend(Peer& p) {
  if (p.out_tail == p.out_published) return;
  p.out_published = p.out_tail;
  p.out->tail.store(p.out_tail, std::memory_order_seq_cst);
  if (wakeIfSleeping(p.peer_page0)) ++stats_.futex_wakes;
}

// Tells the sender which of its next messages this rank will reduce (see
// SlotControl::recv_hint).  Receives are matched in order, so the i-th posted
// receive is message msgs_in + i.
void ShmTransport::publishHint(Peer& p) {
  uint64_t mask = 0;
  const size_t n = std::min<size_t>(p.recvs.size(), 31);
  for (size_t i = 0; i < n; ++i)
    if (p.recvs.at(i).target.reducer != nullptr) mask |= uint64_t{1} << i;
  p.in->recv_hint.store((uint64_t{1} << 63) | (mask << 32) | p.msgs_in, std::memory_order_release);
}

bool ShmTransport::progressSend(Peer& p) {
  bool progressed = false;
  if (!p.cma_wait.empty()) {
    const uint64_t acks = p.out->cma_acks.load(std::memory_order_acquire);
    while (p.acks_seen < acks && !p.cma_wait.empty()) {
      p.cma_wait.front()->complete();
      p.cma_wait.pop();
      ++p.acks_seen;
      progressed = true;
    }
  }
  const uint64_t start_tail = p.out_tail;  // bounds one call's work so other peers get their turn
  while (!p.sends.empty() && p.out_tail - start_tail < kPollBudget) {
    SendOp& op = p.sends.front();
    if (!op.header_done) {
      // A message the receiver will reduce goes through the ring even when it
      // is large: the sender's copy into the ring then overlaps the
      // receiver's reduction out of it, where with cross-memory attach the
      // receiver would copy and reduce alone (2-3x slower measured).
      if (op.cma) {
        const uint64_t h = p.out->recv_hint.load(std::memory_order_acquire);
        const uint32_t d = p.msgs_out - static_cast<uint32_t>(h);
        if ((h >> 63) != 0 && d < 31 && ((h >> (32 + d)) & 1) != 0) op.cma = false;
      }
      if (!reserve(p, kRecordHeaderBytes + (op.cma ? 8 : 0))) break;
      const uint64_t hdr[2] = {(op.bytes << 8) | kTag | (op.cma ? kKindCma : kKindInline), op.req->sig};
      writeRing(p, hdr, kRecordHeaderBytes);
      p.out_tail += kRecordHeaderBytes;
      op.header_done = true;
      ++p.msgs_out;
      progressed = true;
      if (op.cma) {
        const uint64_t addr = reinterpret_cast<uint64_t>(op.src);
        writeRing(p, &addr, 8);
        p.out_tail += 8;
        ++stats_.cma_sends;
        p.cma_wait.push(op.req);
        p.sends.pop();
        continue;
      }
    }
    bool blocked = false;
    while (op.off < op.bytes) {
      if (p.out_tail - start_tail >= kPollBudget) {
        blocked = true;
        break;
      }
      // A piece that is not the message's last keeps the tail 8-aligned (the
      // free space is always a multiple of 8 bytes); the last one is padded.
      const uint64_t want = std::min<uint64_t>(op.bytes - op.off, kRingPiece);
      uint64_t n = want;
      if (!reserve(p, round8(want))) {
        const uint64_t cap = p.out_mask + 1;
        n = cap - (p.out_tail - p.out_head);
        if (n == 0) {
          blocked = true;
          break;
        }
      }
      writeRing(p, op.src + op.off, n);
      p.out_tail += round8(n);
      op.off += n;
      progressed = true;
      if (n >= kRingPiece / 2) flushSend(p);  // let the receiver start on it while we copy the next piece
    }
    if (blocked) break;
    ++stats_.inline_sends;
    op.req->complete();
    p.sends.pop();
  }
  flushSend(p);
  return progressed;
}

// ----------------------------------------------------------- receiving -----

void ShmTransport::flushRecv(Peer& p) {
  if (p.in_head == p.in_published) return;
  p.in_published = p.in_head;
  // seq_cst: pairs with the producer's want_space store + head reload in reserve().
  p.in->head.store(p.in_head, std::memory_order_seq_cst);
  if (p.in->want_space.load(std::memory_order_seq_cst) != 0 && ring(p.peer_page0)) ++stats_.futex_wakes;
}

void ShmTransport::ackCma(Peer& p) {
  p.in->cma_acks.store(++p.acks_given, std::memory_order_release);
  if (ring(p.peer_page0)) ++stats_.futex_wakes;
}

// Copies or reduces the next n payload bytes of op out of the ring at in_head.
void ShmTransport::deliverInline(Peer& p, RecvOp& op, uint64_t n) {
  const uint64_t cap = p.in_mask + 1;
  const uint64_t pos = p.in_head & p.in_mask;
  const uint64_t first = std::min(n, cap - pos);
  const RecvTarget& t = op.target;
  if (t.reducer == nullptr) {
    std::memcpy(t.dst + op.off, p.in_data + pos, first);
    if (first < n) std::memcpy(t.dst + op.off + first, p.in_data, n - first);
  } else {
    const size_t es = t.reducer->elemSize();
    (*t.reducer)(t.dst + op.off, t.accum + op.off, p.in_data + pos, first / es);
    if (first < n) (*t.reducer)(t.dst + op.off + first, t.accum + op.off + first, p.in_data, (n - first) / es);
  }
}

Status ShmTransport::readCma(Peer& p, RecvOp& op) {
  const RecvTarget& t = op.target;
  uint64_t budget = kPollBudget;
  while (op.off < t.bytes && budget > 0) {
    const bool reduce = t.reducer != nullptr;
    uint64_t n = std::min<uint64_t>({t.bytes - op.off, reduce ? kBounceBytes : kCmaCopyPiece, budget});
    std::byte* into = reduce ? bounce_.data() : t.dst + op.off;
    iovec local{into, n};
    iovec remote{reinterpret_cast<void*>(op.remote_addr + op.off), n};
    ssize_t got = process_vm_readv(p.pid, &local, 1, &remote, 1, 0);
    if (got <= 0) {
      int err = got < 0 ? errno : EIO;
      if (err == ESRCH)
        return abortedOr(p, remoteError("shm transport, rank {}: peer rank {} (pid {}) exited while rank {} was "
                                        "reading its {}-byte message", rank_, p.rank, p.pid, rank_, t.bytes));
      if (err == EFAULT)  // the sender's buffer is gone: its operation failed and it moved on
        return abortedOr(p, remoteError("shm transport, rank {}: peer rank {} (pid {}) withdrew its {}-byte message "
                                        "(its operation failed, or it freed the buffer before completion)",
                                        rank_, p.rank, p.pid, t.bytes));
      return errnoError(fmt::format("shm transport, rank {}: process_vm_readv of {} bytes from peer rank {} (pid {}) "
                                    "(set CHORUS_SHM_CMA=0 to avoid cross-memory attach)", rank_, n, p.rank, p.pid),
                        err);
    }
    n = static_cast<uint64_t>(got);
    if (reduce) {
      const size_t es = t.reducer->elemSize();
      n -= n % es;  // a short read may end mid-element; the rest is read again
      if (n == 0) continue;
      (*t.reducer)(t.dst + op.off, t.accum + op.off, bounce_.data(), n / es);
    }
    op.off += n;
    budget -= std::min(budget, n);
  }
  return {};
}

// A message from p that no posted receive claims: if it belongs to the call
// being run (same call number) but has another signature, the ranks disagree
// on the call — typically on its root, so that both sides only send — and
// nobody would ever receive it.  The peer is then failed with the mismatch.
void ShmTransport::checkUnclaimed(Peer& p) {
  if (current_sig_ == 0 || !p.dead.isOk()) return;
  if (p.in_tail - p.in_head < kRecordHeaderBytes) p.in_tail = p.in->tail.load(std::memory_order_acquire);
  if (p.in_tail - p.in_head < kRecordHeaderBytes) return;
  uint64_t sig;
  std::memcpy(&sig, p.in_data + ((p.in_head + 8) & p.in_mask), 8);
  if (sameCallOtherSignature(current_sig_, sig))
    p.dead = signatureMismatch(rank_, p.rank, current_sig_, sig);
}

bool ShmTransport::progressRecv(Peer& p) {
  if (p.recvs.empty() && p.discard == 0) {
    checkUnclaimed(p);
    return false;
  }
  bool progressed = false;
  const uint64_t start_head = p.in_head;  // bounds one call's work so other peers get their turn
  auto avail = [&p] { return p.in_tail - p.in_head; };
  auto refresh = [&p] { p.in_tail = p.in->tail.load(std::memory_order_acquire); };
  if (avail() == 0) refresh();
  while (true) {
    if (p.discard > 0) {
      if (avail() == 0) refresh();
      const uint64_t n = std::min(avail(), p.discard);
      if (n == 0) break;
      p.in_head += n;
      p.discard -= n;
      progressed = true;
      continue;
    }
    if (p.recvs.empty()) {
      checkUnclaimed(p);
      break;
    }
    RecvOp& op = p.recvs.front();
    if (!op.header_done) {
      if (avail() < kRecordHeaderBytes) refresh();
      if (avail() < kRecordHeaderBytes) break;  // the producer publishes the header's words together
      uint64_t word, sig;
      std::memcpy(&word, p.in_data + (p.in_head & p.in_mask), 8);
      std::memcpy(&sig, p.in_data + ((p.in_head + 8) & p.in_mask), 8);
      const uint64_t kind = word & 0x0F;
      const uint64_t len = word >> 8;
      if ((word & kTagMask) != kTag || (kind != kKindInline && kind != kKindCma)) {
        p.dead = internalError("shm transport, rank {}: corrupt record header {:#x} in the ring from rank {} "
                               "(memory corruption or mixed chorus versions)", rank_, word, p.rank);
        break;
      }
      const bool cma = kind == kKindCma;
      if (cma) {
        if (avail() < kRecordHeaderBytes + 8) refresh();
        if (avail() < kRecordHeaderBytes + 8) break;  // published with the header; cannot happen
        std::memcpy(&op.remote_addr, p.in_data + ((p.in_head + kRecordHeaderBytes) & p.in_mask), 8);
      }
      p.in_head += kRecordHeaderBytes + (cma ? 8 : 0);
      progressed = true;
      if (sig != op.req->sig || len != op.target.bytes) {
        op.req->fail(sig != op.req->sig
                         ? signatureMismatch(rank_, p.rank, op.req->sig, sig)
                         : makeError(chorusMismatch,
                                     "shm transport, rank {}: message from rank {} has {} bytes but the posted receive "
                                     "expects {} (do both ranks run the same collective with the same count and type?)",
                                     rank_, p.rank, len, op.target.bytes));
        if (cma)
          ackCma(p);  // the sender's buffer is released unread
        else
          p.discard = round8(len);
        p.recvs.pop();
        ++p.msgs_in;
        publishHint(p);
        continue;
      }
      op.header_done = true;
      op.cma = cma;
    }
    if (op.cma) {
      Status s = readCma(p, op);
      progressed = true;
      if (!s.isOk()) {
        p.dead = s;
        break;
      }
      if (op.off < op.target.bytes) break;  // budget spent; continue at the next poll
      ackCma(p);
      ++stats_.cma_recvs;
      op.req->complete();
      p.recvs.pop();
      ++p.msgs_in;
      publishHint(p);
      continue;
    }
    const uint64_t len = op.target.bytes;
    if (op.off < len) {
      if (avail() == 0) refresh();
      // Ring bytes of this message still to come (the payload padded to 8).
      const uint64_t n_ring = std::min({avail(), round8(len) - op.off, uint64_t{kRingPiece}});
      if (n_ring == 0) break;
      const uint64_t n = std::min(n_ring, len - op.off);
      deliverInline(p, op, n);
      op.off += n;
      p.in_head += n_ring;
      progressed = true;
      if (p.in_head - p.in_published >= kRingPiece / 2) flushRecv(p);
      if (op.off < len) {
        if (p.in_head - start_head >= kPollBudget) break;
        continue;
      }
    }
    ++stats_.inline_recvs;
    op.req->complete();
    p.recvs.pop();
    ++p.msgs_in;
    publishHint(p);
  }
  flushRecv(p);
  return progressed;
}

// ------------------------------------------------------------ one-sided ----
//
// Each ordered pair has an RMA ring beside its message ring (shm_detail.hpp,
// RmaRecord).  The origin writes requests; the target checks each one in its
// region table (RegionTable::resolve) before it touches its memory, moves the
// data itself — by cross-memory attach from or into the origin's buffer
// (kRmaCma: beyond kRmaPiece bytes, when the setup probe passed), or by
// copying pieces through the rings — and answers with a kRmaDone record in
// the ring of the other direction, which completes or fails the origin's
// request.  Requests are served in ring order, so a notification is taken
// after the puts before it have landed.

void ringCopyIn(std::byte* ring, uint64_t pos, const void* src, uint64_t n) {
  const uint64_t at = pos & (kRmaRingBytes - 1);
  const uint64_t first = std::min<uint64_t>(n, kRmaRingBytes - at);
  std::memcpy(ring + at, src, first);
  if (first < n) std::memcpy(ring, static_cast<const std::byte*>(src) + first, n - first);
}

void ringCopyOut(const std::byte* ring, uint64_t pos, void* dst, uint64_t n) {
  const uint64_t at = pos & (kRmaRingBytes - 1);
  const uint64_t first = std::min<uint64_t>(n, kRmaRingBytes - at);
  std::memcpy(dst, ring + at, first);
  if (first < n) std::memcpy(static_cast<std::byte*>(dst) + first, ring, n - first);
}

Status ShmTransport::put(int peer, const void* local, size_t bytes, const RemoteKey& key, uint64_t offset,
                         Request* req) {
  RmaOp op;
  op.kind = RmaOpKind::Put;
  op.req = req;
  op.src = static_cast<const std::byte*>(local);
  op.bytes = bytes;
  op.region = key.region;
  op.generation = key.generation;
  op.offset = offset;
  return postRma(peer, op, &key, local);
}

Status ShmTransport::get(int peer, void* local, size_t bytes, const RemoteKey& key, uint64_t offset, Request* req) {
  RmaOp op;
  op.kind = RmaOpKind::Get;
  op.req = req;
  op.dst = static_cast<std::byte*>(local);
  op.bytes = bytes;
  op.region = key.region;
  op.generation = key.generation;
  op.offset = offset;
  return postRma(peer, op, &key, local);
}

Status ShmTransport::notify(int peer, uint64_t value, Request* req) {
  RmaOp op;
  op.kind = RmaOpKind::Notify;
  op.req = req;
  op.generation = value;
  return postRma(peer, op, nullptr, nullptr);
}

Result<bool> ShmTransport::takeNotification(int* peer, uint64_t* value) {
  if (!notes_.empty()) {
    *peer = notes_.front().first;
    *value = notes_.front().second;
    notes_.pop_front();
    return true;
  }
  if (aborted_.load(std::memory_order_acquire)) return abortStatus();
  return false;
}

Status ShmTransport::postRma(int peer, RmaOp op, const RemoteKey* key, const void* local) {
  if (op.req == nullptr) return invalidArgument("shm rma on rank {}: a null request", rank_);
  auto reject = [&](Status why) {
    op.req->fail(why);
    return why;
  };
  if (aborted_.load(std::memory_order_acquire)) return reject(abortStatus());
  Peer* p = findPeer(peer);
  if (p == nullptr)
    return reject(invalidArgument("shm rma on rank {}: rank {} is not a local peer of this transport", rank_, peer));
  if (Status s = rmaCheckPost("shm", rank_, op.kind, peer, local, op.bytes, key, rmaTransportTag("shm")); !s.isOk())
    return reject(s);
  if (!p->dead.isOk()) return reject(p->dead);
  op.req->status = Status();
  op.req->state.store(Request::Posted, std::memory_order_relaxed);
  op.id = p->rma_next_op++;
  // Small accesses copy through the ring (a syscall costs more than the
  // copies); larger ones are copied once, by the target, from or into our
  // buffer where the setup probe says it may.
  op.cma = p->cma_send && op.kind != RmaOpKind::Notify && op.bytes > kRmaPiece;
  p->rma_ops.push(op);
  produceRma(*p);  // start at once, as postSend does
  return {};
}

// poll()'s look at the one-sided rings, only when the doorbell moved since
// the last look (every record and every consumption rings it) or a bounded
// pass left work: the message path pays one compare.
bool ShmTransport::pollRma(Status& err) {
  rma_bell_ = seen_bell_;
  bool progressed = false;
  for (Peer& p : peers_) {
    if (!p.dead.isOk()) continue;
    progressed |= progressRma(p);
    // A peer that aborted answers nothing more (it rang our bell when it did).
    if (p.dead.isOk() && !p.rma_ops.empty() && p.peer_page0->aborted.load(std::memory_order_acquire) != 0)
      p.dead = abortedOr(p, Status());
    if (!p.dead.isOk()) {  // as poll() does for the message path
      failPeer(p, p.dead);
      p.dead_reported = true;
      progressed = true;
      if (err.isOk()) err = p.dead;
    }
  }
  return progressed;
}

bool ShmTransport::progressRma(Peer& p) {
  const bool consumed = consumeRma(p);
  const bool produced = p.dead.isOk() && produceRma(p);
  return consumed || produced;
}

bool ShmTransport::rmaReserve(Peer& p, uint64_t need) {
  if (kRmaRingBytes - (p.rma_out_tail - p.rma_out_head) >= need) return true;
  // The consumer rings our doorbell after it moves the head, so a full ring
  // is looked at again once it has room.
  p.rma_out_head = p.out->rma_head.load(std::memory_order_acquire);
  return kRmaRingBytes - (p.rma_out_tail - p.rma_out_head) >= need;
}

void ShmTransport::rmaWrite(Peer& p, const RmaRecord& rec, const std::byte* payload, uint64_t n) {
  RmaRecord r = rec;
  r.payload = static_cast<uint32_t>(n);
  ringCopyIn(p.rma_out_data, p.rma_out_tail, &r, sizeof r);
  if (n > 0) ringCopyIn(p.rma_out_data, p.rma_out_tail + sizeof r, payload, n);
  p.rma_out_tail += sizeof r + round8(n);
}

// Writes what we owe the peer (answers first, so that a long stream of our
// own requests does not delay them), then our requests, as far as the ring
// and one pass's budget allow.
bool ShmTransport::produceRma(Peer& p) {
  bool progressed = false;
  const uint64_t start = p.rma_out_tail;
  bool blocked = false;
  while (!blocked) {
    if (p.rma_out_tail - start >= kPollBudget) {
      rma_bell_ = kRmaAgain;
      break;
    }
    if (!p.rma_replies.empty()) {
      RmaReply& r = p.rma_replies.front();
      if (r.stream) {
        // A get answered through the ring: each piece checks the region
        // again (it may have been deregistered since the last one).
        RmaRefusal why = RmaRefusal::None;
        uint64_t detail = 0;
        const std::byte* src =
            regions_.resolve(r.region, r.generation, r.offset, r.bytes, Access::Read, &why, &detail);
        if (src == nullptr) {
          r.why = why == RmaRefusal::Deregistered ? RmaRefusal::DeregisteredDuring : why;
          r.detail = detail;
          r.stream = false;
          continue;
        }
        if (r.sent == r.bytes) {
          r.stream = false;  // the kRmaDone follows
          continue;
        }
        const uint64_t n = std::min<uint64_t>(r.bytes - r.sent, kRmaPiece);
        if (!rmaReserve(p, sizeof(RmaRecord) + round8(n))) break;
        RmaRecord rec;
        rec.kind = kRmaGetData;
        rec.op = r.op;
        rec.bytes = r.bytes;
        rec.chunk = r.sent;
        rmaWrite(p, rec, src + r.sent, n);
        r.sent += n;
        progressed = true;
        continue;
      }
      if (!rmaReserve(p, sizeof(RmaRecord))) break;
      RmaRecord rec;
      rec.kind = kRmaDone;
      rec.op = r.op;
      rec.reason = static_cast<uint16_t>(r.why);
      rec.generation = r.detail;
      rmaWrite(p, rec, nullptr, 0);
      p.rma_replies.pop();
      progressed = true;
      continue;
    }
    if (p.rma_written == p.rma_ops.size()) break;
    RmaOp& op = p.rma_ops.at(p.rma_written);
    RmaRecord rec;
    rec.op = op.id;
    rec.region = op.region;
    rec.generation = op.generation;
    rec.offset = op.offset;
    rec.bytes = op.bytes;
    if (op.kind == RmaOpKind::Put && !op.cma) {
      const uint64_t n = std::min<uint64_t>(op.bytes - op.sent, kRmaPiece);
      if (!rmaReserve(p, sizeof(RmaRecord) + round8(n))) break;
      rec.kind = kRmaPut;
      rec.chunk = op.sent;
      rmaWrite(p, rec, op.src + op.sent, n);
      op.sent += n;
      if (op.sent == op.bytes) ++p.rma_written;
      progressed = true;
      continue;
    }
    if (!rmaReserve(p, sizeof(RmaRecord))) break;
    rec.kind = op.kind == RmaOpKind::Put ? kRmaPut : op.kind == RmaOpKind::Get ? kRmaGet : kRmaNotify;
    rec.flags = op.cma ? kRmaCma : 0;
    rec.addr = op.kind == RmaOpKind::Put ? reinterpret_cast<uint64_t>(op.src) : reinterpret_cast<uint64_t>(op.dst);
    rmaWrite(p, rec, nullptr, 0);
    ++p.rma_written;
    progressed = true;
  }
  if (p.rma_out_tail != p.rma_out_published) {
    p.rma_out_published = p.rma_out_tail;
    p.out->rma_tail.store(p.rma_out_tail, std::memory_order_release);
    if (ring(p.peer_page0)) ++stats_.futex_wakes;  // the bell tells the peer's poll to look
  }
  return progressed;
}

// Reads the peer's records: its requests (served at once; their answers
// queue in rma_replies) and its answers to ours.
bool ShmTransport::consumeRma(Peer& p) {
  bool progressed = false;
  const uint64_t tail = p.in->rma_tail.load(std::memory_order_acquire);
  const uint64_t start = p.rma_in_head;
  while (p.dead.isOk() && tail - p.rma_in_head >= sizeof(RmaRecord)) {
    if (p.rma_in_head - start >= kPollBudget) {
      rma_bell_ = kRmaAgain;
      break;
    }
    RmaRecord rec;
    ringCopyOut(p.rma_in_data, p.rma_in_head, &rec, sizeof rec);
    const uint64_t total = sizeof rec + round8(rec.payload);
    if (rec.payload > kRmaPiece || tail - p.rma_in_head < total) {
      p.dead = internalError("shm transport, rank {}: corrupt one-sided record from rank {} (kind {}, {} payload "
                             "bytes; memory corruption or mixed chorus versions?)", rank_, p.rank, rec.kind,
                             rec.payload);
      break;
    }
    const uint64_t payload_at = p.rma_in_head + sizeof rec;
    if (rec.kind == kRmaPut || rec.kind == kRmaGet || rec.kind == kRmaNotify) {
      serveRequest(p, rec, payload_at);
    } else if (Status s = takeAnswer(p, rec, payload_at); !s.isOk()) {
      p.dead = s;
    }
    if (!p.dead.isOk()) break;
    p.rma_in_head += total;
    progressed = true;
  }
  if (p.rma_in_head != p.rma_in_published) {
    p.rma_in_published = p.rma_in_head;
    p.in->rma_head.store(p.rma_in_head, std::memory_order_release);
    if (ring(p.peer_page0)) ++stats_.futex_wakes;  // room for its next records
  }
  return progressed;
}

// One request of the peer: checked against our region table before a byte
// of our memory moves.
void ShmTransport::serveRequest(Peer& p, const RmaRecord& rec, uint64_t payload_at) {
  auto corrupt = [&](std::string_view what) {
    p.dead = internalError("shm transport, rank {}: corrupt one-sided request from rank {} (kind {}, op {}): {} "
                           "(memory corruption or mixed chorus versions?)", rank_, p.rank, rec.kind, rec.op, what);
  };
  if (rec.kind == kRmaPut && (rec.flags & kRmaCma) == 0) {
    // A piece of a put whose data streams through the ring.
    if (rec.chunk == 0) {
      if (p.rma_put_op != 0) return corrupt("a new put before the last one's data ended");
      if (rec.op != p.rma_expect) return corrupt(fmt::format("op number out of order (expected {})", p.rma_expect));
      ++p.rma_expect;
      ++stats_.rma_requests;
      p.rma_put_op = rec.op;
      p.rma_put_next = 0;
      p.rma_put_why = RmaRefusal::None;
      p.rma_put_detail = 0;
    } else if (rec.op != p.rma_put_op || rec.chunk != p.rma_put_next) {
      return corrupt("a piece of a put out of order");
    }
    if (rec.payload > rec.bytes - rec.chunk || (rec.payload == 0 && rec.bytes != 0))
      return corrupt("a piece beyond its put's length");
    if (p.rma_put_why == RmaRefusal::None) {
      RmaRefusal why = RmaRefusal::None;
      uint64_t detail = 0;
      std::byte* dst = regions_.resolve(rec.region, rec.generation, rec.offset, rec.bytes, Access::Write, &why, &detail);
      if (dst == nullptr) {
        p.rma_put_why = rec.chunk != 0 && why == RmaRefusal::Deregistered ? RmaRefusal::DeregisteredDuring : why;
        p.rma_put_detail = detail;
      } else if (rec.payload > 0) {
        ringCopyOut(p.rma_in_data, payload_at, dst + rec.chunk, rec.payload);
      }
    }
    p.rma_put_next += rec.payload;
    if (p.rma_put_next == rec.bytes) {
      RmaReply r;
      r.op = rec.op;
      r.why = p.rma_put_why;
      r.detail = p.rma_put_detail;
      p.rma_replies.push(r);
      p.rma_put_op = 0;
    }
    return;
  }
  if (p.rma_put_op != 0) return corrupt("a request inside a put's data");
  if (rec.op != p.rma_expect) return corrupt(fmt::format("op number out of order (expected {})", p.rma_expect));
  if (rec.payload != 0) return corrupt("data after a request that carries none");
  ++p.rma_expect;
  ++stats_.rma_requests;
  RmaReply r;
  r.op = rec.op;
  if (rec.kind == kRmaNotify) {
    notes_.emplace_back(p.rank, rec.generation);
    p.rma_replies.push(r);
    return;
  }
  const bool is_put = rec.kind == kRmaPut;
  std::byte* mine = regions_.resolve(rec.region, rec.generation, rec.offset, rec.bytes,
                                     is_put ? Access::Write : Access::Read, &r.why, &r.detail);
  if (mine != nullptr) {
    if ((rec.flags & kRmaCma) != 0) {
      ++stats_.rma_cma;
      if (const uint64_t err = cmaCopy(p, mine, rec.addr, rec.bytes, !is_put); err != 0) {
        r.why = RmaRefusal::CopyFailed;
        r.detail = err;
      }
    } else if (!is_put) {
      r.stream = true;  // produceRma sends the data, checking the region again for each piece
      r.region = rec.region;
      r.generation = rec.generation;
      r.offset = rec.offset;
      r.bytes = rec.bytes;
    }
  }
  p.rma_replies.push(r);
}

// The peer's answer to our oldest request (they come in request order).
Status ShmTransport::takeAnswer(Peer& p, const RmaRecord& rec, uint64_t payload_at) {
  if (p.rma_written == 0 || p.rma_ops.empty() || rec.op != p.rma_ops.front().id)
    return internalError("shm transport, rank {}: rank {} answered one-sided op {}, which is not the oldest one this "
                         "rank awaits (memory corruption or mixed chorus versions?)", rank_, p.rank, rec.op);
  RmaOp& op = p.rma_ops.front();
  if (rec.kind == kRmaGetData) {
    if (op.kind != RmaOpKind::Get || op.cma || rec.chunk != op.got || rec.payload > op.bytes - op.got)
      return internalError("shm transport, rank {}: rank {} sent data for one-sided op {} that does not fit it "
                           "(memory corruption or mixed chorus versions?)", rank_, p.rank, rec.op);
    ringCopyOut(p.rma_in_data, payload_at, op.dst + op.got, rec.payload);
    op.got += rec.payload;
    return {};
  }
  if (rec.kind != kRmaDone)
    return internalError("shm transport, rank {}: unknown one-sided record kind {} from rank {} (memory corruption "
                         "or mixed chorus versions?)", rank_, rec.kind, p.rank);
  if (rec.reason != 0) {
    op.req->fail(rmaRefused("shm", op.kind, rank_, p.rank, op.region, op.generation, op.offset, op.bytes,
                            static_cast<RmaRefusal>(rec.reason), rec.generation));
  } else if (op.kind == RmaOpKind::Get && !op.cma && op.got != op.bytes) {
    return internalError("shm transport, rank {}: rank {} finished one-sided get {} after {} of its {} bytes", rank_,
                         p.rank, rec.op, op.got, op.bytes);
  } else {
    op.req->complete();
  }
  p.rma_ops.pop();
  --p.rma_written;
  return {};
}

// Copies n bytes between our memory and the peer's at `theirs` (a put: from
// theirs into mine; a get: from mine into theirs).  Returns 0 or the errno.
uint64_t ShmTransport::cmaCopy(const Peer& p, std::byte* mine, uint64_t theirs, uint64_t n, bool write_theirs) {
  uint64_t done = 0;
  while (done < n) {
    const uint64_t piece = std::min<uint64_t>(n - done, uint64_t{1} << 30);
    iovec local{mine + done, piece};
    iovec remote{reinterpret_cast<void*>(theirs + done), piece};
    const ssize_t got = write_theirs ? process_vm_writev(p.pid, &local, 1, &remote, 1, 0)
                                     : process_vm_readv(p.pid, &local, 1, &remote, 1, 0);
    if (got <= 0) return got < 0 ? static_cast<uint64_t>(errno) : EIO;
    done += static_cast<uint64_t>(got);
  }
  return 0;
}

// -------------------------------------------------- progress and waiting ---

void ShmTransport::failPeer(Peer& p, const Status& why) {
  p.sends.forEach([&](SendOp& op) { op.req->fail(why); });
  p.cma_wait.forEach([&](Request* r) { r->fail(why); });
  p.recvs.forEach([&](RecvOp& op) { op.req->fail(why); });
  p.sends.clear();
  p.cma_wait.clear();
  p.recvs.clear();
  p.rma_ops.forEach([&](RmaOp& op) { op.req->fail(why); });
  p.rma_ops.clear();
  p.rma_written = 0;
  p.rma_replies.clear();
}

Result<bool> ShmTransport::poll() {
  // Read before looking at any ring: a change made after this load bumps the
  // bell past seen_bell_, so wait() will not sleep through it.
  seen_bell_ = page0_->bell.load(std::memory_order_acquire);
  for (Peer& p : peers_)
    if (p.in != nullptr) p.tail_polled = p.in->tail.load(std::memory_order_acquire);
  if (aborted_.load(std::memory_order_acquire)) {
    Status why = abortStatus();
    if (!abort_handled_) {
      for (Peer& p : peers_) failPeer(p, why);
      abort_handled_ = true;
    }
    return why;
  }
  bool progressed = false;
  Status err;
  for (Peer& p : peers_) {
    if (p.dead.isOk()) {
      progressed |= progressRecv(p);
      progressed |= progressSend(p);
      // A peer that aborted sends nothing more and reads nothing more: what
      // it wrote before is still delivered above; what is left cannot finish.
      // (Data written before the flag is visible once the flag is: drain it.)
      if (p.busy() && p.peer_page0->aborted.load(std::memory_order_acquire) != 0 && !progressRecv(p) && p.busy())
        p.dead = abortedOr(p, Status());
    }
    if (!p.dead.isOk() && !p.dead_reported) {
      failPeer(p, p.dead);
      p.dead_reported = true;
      progressed = true;
      if (err.isOk()) err = p.dead;
    }
  }
  // The one-sided rings: only when a peer rang the bell since the last look
  // (it does after every record it wrote and every one it consumed), or a
  // bounded pass left work.  The message path pays one compare.
  if (uint64_t{seen_bell_} != rma_bell_) [[unlikely]]
    progressed |= pollRma(err);
  if (!err.isOk()) return err;
  return progressed;
}

// A peer that aborted before it went away left the reason (the root cause,
// e.g. another rank's death) in its page zero: that error, when there is one,
// rather than `otherwise` ("it exited"), which would hide the root cause.
Status ShmTransport::abortedOr(const Peer& p, Status otherwise) const {
  if (p.peer_page0 == nullptr || p.peer_page0->aborted.load(std::memory_order_acquire) == 0) return otherwise;
  char reason[sizeof(p.peer_page0->abort_reason)];
  std::memcpy(reason, p.peer_page0->abort_reason, sizeof reason);
  reason[sizeof reason - 1] = '\0';
  return makeError(relayedAbortCode(p.peer_page0->aborted.load(std::memory_order_acquire)),
                   "shm transport, rank {}: peer rank {} (pid {}) aborted its communicator: {}", rank_, p.rank, p.pid,
                   reason[0] ? abortRootCause(reason) : "chorusCommAbort or an error on that rank");
}

// Marks peers that no longer exist (only those we have requests with).
// Returns true when one was found.
bool ShmTransport::checkLiveness() {
  last_liveness_ = Clock::now();
  bool found = false;
  for (Peer& p : peers_) {
    if (p.pid == pid_ || !p.dead.isOk() || !p.busyAny()) continue;
    if (processGone(p)) {
      p.dead = abortedOr(p, remoteError("shm transport, rank {}: peer rank {} (pid {}) has exited; its pending sends "
                                        "and receives fail (did that process crash or get killed? check its output)",
                                        rank_, p.rank, p.pid));
      found = true;
    }
  }
  return found;
}

bool ShmTransport::processGone(const Peer& p) const {
  if (p.pid == pid_) return false;
  if (p.pidfd >= 0) {
    pollfd pfd{p.pidfd, POLLIN, 0};
    return ::poll(&pfd, 1, 0) > 0;  // a pidfd is readable once the process has exited (zombies included)
  }
  return kill(p.pid, 0) != 0 && errno == ESRCH;
}

// The spinning phases of a wait, until done() holds (true) or they end
// (false): `polls` pure polls before the first clock read (none when
// oversubscribed: the peer may need this core), then polls until spin_ (or
// `timeout`) has passed since *start.  Spin purely for a few microseconds (a
// peer that is running answers in well under that), then keep polling but
// yield the core at each turn: when the machine is oversubscribed (more
// ranks than cores, or other load) the peer we wait for may be queued behind
// us on this very core, and a pure spin would burn the time it needs.  With
// more ranks than cores there is no pure phase and the yield comes every 8
// polls instead of every 64: a 4-rank 8-byte allreduce on 2 cores went from
// 23-25 us to 6 us (docs/performance.md, "Oversubscribed waits").
// Contention by other processes (not ranks) is different: policy_
// (SpinPolicy, shm_detail.hpp) shortens the spin and drops the yields.
template <typename F>
bool ShmTransport::spinFor(F&& done, int polls, std::chrono::microseconds timeout, Clock::time_point* start) {
  for (int i = 0; i < (oversubscribed_ ? 0 : polls); ++i) {
    cpuRelax();
    if (done()) return true;
  }
  *start = Clock::now();
  bool contended = false;
  const auto budget = policy_.budget(*start, &contended, [this] { return peerYieldsHere(); });
  const auto spin_end = *start + std::min<std::chrono::microseconds>(timeout, budget);
  const auto pure_end = oversubscribed_ ? *start : contended ? spin_end : std::min(spin_end, *start + kPureSpin);
  const uint32_t yield_mask = oversubscribed_ ? 7 : 63;
  bool cpu_published = false;
  for (uint32_t i = 1;; ++i) {
    if (done()) {
      // Remember how long it took (a wait done within the first polls counts
      // as none: not worth a clock read).
      policy_.satisfied(i > 64 ? std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - *start)
                               : std::chrono::nanoseconds(0));
      return true;
    }
    cpuRelax();
    if ((i & yield_mask) == 0) {
      const auto now = Clock::now();
      if (now >= spin_end) return false;
      if (now >= pure_end) {
        if (!cpu_published) {
          page0_->yield_cpu.store(sched_getcpu(), std::memory_order_relaxed);
          cpu_published = true;
        }
        sched_yield();
        const auto back = Clock::now();
        // The yield ran something (a no-op one returns within a microsecond).
        if (spread_ && back - now > std::chrono::microseconds(2)) spreadFrom(back);
        if (policy_.yielded(now, back, [this] { return peerYieldsHere(); })) {
          stats_.stolen_yields = policy_.stolenYields();
          return false;  // sleep rather than yield again
        }
      }
    }
  }
}

// A yield that ran something, with as many cores as local ranks: if a peer
// rank of ours last yielded on this core too, the two ranks share one core
// while another is free for one of them.  That happens at start-up: both
// ranks start where their launcher ran, and the kernel spreads them only when
// it sees the imbalance, which ranks that mostly spin and yield hide from it
// (2 ranks, 8-byte allreduce: 8-9 us a call instead of 0.2 for 40-100 ms, or
// for as long as a busy process holds the other core: docs/performance.md).
// The higher-numbered of the two moves itself to an allowed CPU no peer was
// last seen on: pinned to it for the migration, then its own mask again, so
// the placement stays a hint, never a binding.  At most every kSpreadEvery.
void ShmTransport::spreadFrom(Clock::time_point now) {
  constexpr std::chrono::milliseconds kSpreadEvery{5};
  if (now < next_spread_) return;
  next_spread_ = now + kSpreadEvery;
  cpu_set_t mask;  // the mask now: the user may have bound the rank since init
  if (sched_getaffinity(0, sizeof mask, &mask) != 0 || CPU_COUNT(&mask) < 2) return;
  std::vector<std::pair<int, int>>& seen = spread_peers_;
  seen.clear();
  for (const Peer& p : peers_)
    if (p.peer_page0 != nullptr) seen.emplace_back(p.rank, p.peer_page0->yield_cpu.load(std::memory_order_relaxed));
  const int to = shm_detail::spreadTarget(sched_getcpu(), rank_, seen, mask);
  if (to < 0) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(to, &one);
  if (sched_setaffinity(0, sizeof one, &one) == 0) sched_setaffinity(0, sizeof mask, &mask);
  ++stats_.spreads;
}

bool ShmTransport::peerYieldsHere() const {
  const int cpu = sched_getcpu();
  if (cpu < 0) return false;
  for (const Peer& p : peers_)
    if (p.peer_page0 != nullptr && p.peer_page0->yield_cpu.load(std::memory_order_relaxed) == cpu) return true;
  return false;
}

void ShmTransport::wait(std::chrono::microseconds timeout) {
  // Something to poll for: the doorbell moved (space, acks, aborts, wake()),
  // or a ring's tail (a message) since poll() looked.
  auto moved = [this](std::memory_order mo) {
    if (page0_->bell.load(mo) != seen_bell_) return true;
    for (const Peer& p : peers_)
      if (p.in != nullptr && p.in->tail.load(mo) != p.tail_polled) return true;
    return false;
  };
  auto changed = [&] {
    return moved(std::memory_order_acquire) || wake_pending_.exchange(false, std::memory_order_acq_rel);
  };
  if (changed()) return;
  // A few polls before reading the clock: a running peer's next message is
  // usually here by then, and a read costs as much as dozens of polls.
  // Then spin on our doorbell and the rings' tails (lines that change only
  // when there is something to do): it catches the next message without a
  // syscall or a doorbell on either side (spinFor), and then sleep on the futex.
  Clock::time_point start;
  if (spinFor([&] { return moved(std::memory_order_relaxed); }, 32, timeout, &start)) return;
  const auto deadline = start + timeout;
  while (true) {
    auto now = Clock::now();
    if (now - last_liveness_ >= kLivenessInterval && checkLiveness()) return;
    if (now >= deadline) return;
    auto slice = std::min(deadline - now, last_liveness_ + kLivenessInterval - now);
    // Dekker with ring(): our seq_cst store of `sleeping` then load of `bell`
    // against the waker's seq_cst increment of `bell` then load of `sleeping`.
    // One of the two loads must see the other side's write, so an increment
    // after the last poll() either stops us here or wakes the futex.
    page0_->sleeping.store(1, std::memory_order_seq_cst);
    if (moved(std::memory_order_seq_cst) || wake_pending_.load(std::memory_order_seq_cst)) {
      page0_->sleeping.store(0, std::memory_order_relaxed);
      wake_pending_.store(false, std::memory_order_relaxed);
      return;
    }
    ++stats_.futex_waits;
    futexWait(&page0_->bell, seen_bell_,
              std::max(std::chrono::duration_cast<std::chrono::microseconds>(slice), std::chrono::microseconds(1)));
    page0_->sleeping.store(0, std::memory_order_relaxed);
    if (changed()) return;
  }
}

// ---------------------------------------------------------------- board ----

void ShmTransport::publish(uint64_t k, const CallSignature& sig) {
  BoardSlot& slot = own_board_[k % kBoardSlots];
  slot.sig.store(sig.word, std::memory_order_relaxed);
  slot.call.store(k, std::memory_order_release);
  board_unsettled_ = true;
  ++stats_.board_calls;
}

// Dekker with await(): our store of the call, a full fence, then the load of
// each peer's `sleeping`, against the peer's seq_cst store of `sleeping` then
// load of the call.  Either the peer sees our call and does not sleep, or we
// see it sleeping and ring.  The fence may come any time after the store.
void ShmTransport::settle() {
  if (!board_unsettled_) return;
  board_unsettled_ = false;
  // A full fence as a locked instruction on a private word: the same cost as
  // a fence on x86, and sanitizers (TSan drops atomic_thread_fence) keep it.
  settle_fence_.fetch_add(1, std::memory_order_seq_cst);
  for (Peer& p : peers_)
    if (wakeIfSleeping(p.peer_page0)) ++stats_.futex_wakes;
}

uint64_t ShmTransport::slotCall(int peer, uint64_t k) const {
  const Peer* p = findPeer(peer);
  return p == nullptr ? 0 : p->board[k % kBoardSlots].call.load(std::memory_order_acquire);
}

bool ShmTransport::signature(int peer, uint64_t k, CallSignature* out) const {
  const Peer* p = findPeer(peer);
  if (p == nullptr) return false;
  const BoardSlot& s = p->board[k % kBoardSlots];
  if (s.call.load(std::memory_order_acquire) != k) return false;
  // A reuse writes the word before the call number: its call bits tell.
  out->word = s.sig.load(std::memory_order_acquire);
  return ((out->word >> 40) & 0xff) == (k & 0xff);
}

Result<const std::byte*> ShmTransport::await(int peer, uint64_t k, std::chrono::milliseconds timeout,
                                             CallSignature* sig) {
  const Peer* p = findPeer(peer);
  if (p == nullptr) return internalError("shm board, rank {}: rank {} is not a peer of this transport", rank_, peer);
  const BoardSlot& s = p->board[k % kBoardSlots];
  auto ready = [&](std::memory_order mo) { return s.call.load(mo) >= k; };
  // The word was stored before the call number (publish): after the acquire
  // load that saw k it is k's (the peer cannot reuse the slot before our k + 1).
  auto found = [&]() -> const std::byte* {
    if (sig != nullptr) sig->word = s.sig.load(std::memory_order_relaxed);
    return s.data;
  };
  if (ready(std::memory_order_acquire)) return found();
  // The same phases as wait(): pure polls, polls that yield the core
  // (spinFor), then sleeps on our doorbell, which the peer's settle() rings.
  Clock::time_point start;
  if (spinFor([&] { return ready(std::memory_order_acquire); }, 64, timeout, &start)) return found();
  const auto deadline = start + timeout;
  // About to sleep: the peers must see our publish first (they may be
  // asleep waiting for it, as we are about to be for theirs).
  settle();
  auto last_liveness = start;
  while (true) {
    if (ready(std::memory_order_acquire)) return found();
    if (aborted_.load(std::memory_order_acquire)) return abortStatus();
    if (p->peer_page0->aborted.load(std::memory_order_acquire) != 0) return abortedOr(*p, Status());
    const auto now = Clock::now();
    if (now - last_liveness >= kLivenessInterval) {
      last_liveness = now;
      if (processGone(*p)) {
        return abortedOr(*p, remoteError("shm transport, rank {}: peer rank {} (pid {}) has exited during a one-shot "
                                         "call (did that process crash or get killed? check its output)",
                                         rank_, p->rank, p->pid));
      }
    }
    if (now >= deadline)
      return makeError(chorusTimeout, "rank {}: operation timed out after {} ms; pending: rank {}'s one-shot input "
                       "(board call {})", rank_, timeout.count(), p->rank, k);
    const auto slice = std::min(deadline - now, last_liveness + kLivenessInterval - now);
    const uint32_t bell = page0_->bell.load(std::memory_order_acquire);
    page0_->sleeping.store(1, std::memory_order_seq_cst);
    if (ready(std::memory_order_seq_cst) || aborted_.load(std::memory_order_seq_cst) ||
        p->peer_page0->aborted.load(std::memory_order_seq_cst) != 0) {
      page0_->sleeping.store(0, std::memory_order_relaxed);
      continue;
    }
    ++stats_.futex_waits;
    futexWait(&page0_->bell, bell,
              std::max(std::chrono::duration_cast<std::chrono::microseconds>(slice), std::chrono::microseconds(1)));
    page0_->sleeping.store(0, std::memory_order_relaxed);
  }
}

void ShmTransport::wake() {
  wake_pending_.store(true, std::memory_order_seq_cst);
  ring(page0_);
}

void ShmTransport::abort(const Status& why) {
  {
    std::lock_guard lock(abort_mu_);
    if (aborted_.load(std::memory_order_relaxed)) return;
    abort_status_ = why.isOk() ? makeError(chorusAborted, "shm transport, rank {}: aborted", rank_) : why;
  }
  aborted_.store(true, std::memory_order_release);
  // Tell the peers, so that they fail promptly instead of waiting on us, and
  // why: the root cause then reaches every rank, not "rank X aborted".
  {
    const std::string& why_text = abortStatus().message();
    const size_t n = std::min(why_text.size(), sizeof(page0_->abort_reason) - 1);
    std::memcpy(page0_->abort_reason, why_text.data(), n);
    page0_->abort_reason[n] = '\0';
  }
  // The code, so a mismatch stays one on every rank (abortedOr).
  const auto code = static_cast<uint32_t>(abortStatus().code());
  page0_->aborted.store(code != 0 ? code : 1, std::memory_order_seq_cst);
  for (Peer& p : peers_)
    if (p.peer_page0 != nullptr) ring(p.peer_page0);
  wake();
}

}  // namespace

Result<std::unique_ptr<Transport>> createShmTransport(const ShmSetup& setup, bootstrap::Store& store, Board** board) {
  auto t = std::make_unique<ShmTransport>();
  CHORUS_RETURN_IF_ERROR(t->init(setup, store));
  if (board != nullptr) *board = t.get();
  return std::unique_ptr<Transport>(std::move(t));
}

namespace shm_detail {
std::optional<ShmStats> shmStats(const Transport& t) {
  if (const auto* s = dynamic_cast<const ShmTransport*>(&t)) return s->stats();
  return std::nullopt;
}
}  // namespace shm_detail

}  // namespace chorus::transport
