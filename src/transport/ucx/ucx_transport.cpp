// The UCX transport's data path (ucx.hpp; setup and the handshake are in
// ucx_setup.cpp, the records in ucx_wire.hpp).
//
// Messages.  The k-th message from rank a to rank b (k = 0, 1, ...) is a
// tagged message on the message channel with sequence k: a 32-byte header
// {magic, flags, length, signature, token}, followed, for at most
// kInlineBytes, by the payload.  A longer payload is a second tagged message
// on the data channel with the same sequence, sent at once from the user's
// buffer.  b always has one receive posted for a's next header (into a
// stage); when it arrives, b checks the token (a header without it is a
// stranger's and is dropped), then the header, and holds it until a receive
// is posted for a (FIFO: the oldest receive takes the next sequence).  The
// header is compared with the receive before a byte reaches the receive's
// memory: another length or another call's signature fails the receive with
// chorusMismatch (a separate payload is then received into nothing and
// dropped), and the stream goes on.  Otherwise an inline payload is copied or
// reduced out of the stage, and a separate payload is received straight into
// the destination (or, to reduce it, into a bounce buffer).  The next header
// receive is posted as soon as the stage is free, so headers flow while
// large payloads are still moving.  A held header that no receive claims is
// compared with the latest call (sameCallOtherSignature), as TCP does.
//
// Faults.  UCP's peer error handling reports a peer whose endpoint failed
// (it died, or its host is unreachable: UCP's keepalive); a peer that
// destroys its transport says so first (a close on the control channel); a
// peer that aborts sends its reason (an abort on the control channel).  What
// a peer sent before it went is still delivered (one endpoint delivers in
// order), and a receive fails only when nothing more can come: the next
// header's receive was cancelled unmatched.  Sends and one-sided moves UCP
// still holds for a peer that went fail when its endpoint is closed.  A
// Request that failed is never touched by UCP again: operations on user
// memory fail only once UCP has given them back.
//
// One-sided operations (rma.hpp; "one-sided" below): the target checks every
// access in its region table, and moves a large access's bytes itself with
// ucp_get_nbx / ucp_put_nbx on the origin's buffer (mapped by the origin for
// exactly that access, its remote key in the request).
//
// Waiting: poll the worker for CHORUS_SPIN_US (yielding the core every few
// tries), then sleep on the worker's event fd (ucp_worker_arm) and the
// transport's eventfd (wake(), abort(), UCP's error handler).
//
// Threading: everything but wake() and abort() runs on the executor thread.
// UCP's request callbacks run on that thread too (inside ucp_worker_progress,
// or inside the post or close call that finished them) and only queue the
// finished operation (ucx_detail.hpp, Op); the endpoint error handler, which
// UCP may call from its own thread, only sets atomics and the eventfd.
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>

#include "bootstrap/socket.hpp"
#include "common/log.hpp"
#include "transport/rma.hpp"
#include "transport/ucx/ucx.hpp"
#include "transport/ucx/ucx_detail.hpp"

namespace chorus::transport {
namespace ucx {

// A posted receive waiting for its header.
struct RecvPost {
  Request* req = nullptr;
  RecvTarget target;
};

// A one-sided operation this rank posted, until the target answers it.
struct OriginOp {
  RmaOpKind kind = RmaOpKind::Put;
  Request* req = nullptr;
  std::byte* dst = nullptr;  // get
  uint32_t region = 0;
  uint64_t generation = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  ucp_mem_h memh = nullptr;  // the buffer, mapped for the target (large accesses)
  int cached = -1;           // memh's entry in the registration cache (-1: mapped for this access alone)
};

// The registration cache (origin side of large one-sided accesses): a
// buffer's mapping and packed remote key, kept after an access for the next
// one on exactly the same buffer (address, length, rights), as a
// registration (pinning, on RDMA) costs more than many accesses.  An entry
// is dropped when any byte of its buffer leaves the address space (munmap,
// mremap, a heap that shrinks, madvise(DONTNEED): UCX's memory events,
// UCM_EVENT_VM_UNMAPPED), so a buffer freed and another mapped at the same
// address is registered anew; without UCX's memory events there is no cache.
struct RegEntry {
  uintptr_t addr = 0;
  size_t length = 0;
  unsigned prot = 0;
  ucp_mem_h memh = nullptr;
  std::vector<std::byte> rkey;  // packed
  int users = 0;                // accesses in flight that use it
  bool stale = false;           // its buffer went: unmapped once unused
  uint64_t last_use = 0;
};
constexpr size_t kRegCacheEntries = 32;
// Unmapped ranges the memory-event callback records (no allocation there:
// it runs inside munmap/free, on any thread) until the transport drains them.
constexpr size_t kUnmappedSlots = 64;

// A one-sided request of the peer, from its arrival until answered.
struct TargetOp {
  enum State : uint8_t { kWaiting, kRunning, kDone };
  State state = kWaiting;
  uint16_t kind = 0;
  uint64_t op = 0;
  uint32_t region = 0;
  uint64_t generation = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t addr = 0;
  std::vector<std::byte> extra;  // an inline put's bytes, or the origin's remote key
};

struct Peer {
  int rank = -1;
  PeerLink* link = nullptr;
  // Two-sided.
  uint64_t send_seq = 0;  // the sequence of the next message to the peer
  uint64_t recv_seq = 0;  // the sequence `header` waits for / holds
  Op* header = nullptr;   // the header receive (nullptr: none posted any more)
  bool staged = false;    // `header` arrived and waits in its stage for a receive
  std::deque<RecvPost> unmatched;
  Op* ctl = nullptr;      // the control receive
  uint64_t ctl_send_seq = 0;  // sealed control messages sent (their nonces)
  // Set when the peer went (closed, failed, aborted, corrupt): what later
  // posts get.  hard: nothing of it is trusted any more (abort, corruption,
  // a mismatch), so even a held header is dropped.
  Status gone;
  bool hard = false;
  bool ep_seen = false;  // its endpoint's failure was handled
  std::chrono::steady_clock::time_point gone_at{};
  // One-sided.
  uint64_t rma_send_seq = 0;
  uint64_t rma_recv_seq = 0;
  Op* rma_rx = nullptr;
  uint64_t next_op = 1;    // origin: the number of the next operation posted
  uint64_t expect_op = 1;  // target: the number the next request must carry
  std::map<uint64_t, OriginOp> origin;
  std::deque<TargetOp> target;  // in arrival order
};

}  // namespace ucx

namespace {

using namespace ucx;
using Clock = std::chrono::steady_clock;

// A payload receive of a peer that went, still held by UCP this long after,
// waits for bytes that can no longer come (UCP 1.13 does not always return a
// rendezvous receive whose sender's endpoint failed or was closed): its
// request fails then, and the receive is left to UCP, detached from it.
// The endpoint is closed, so no byte can reach the buffer any more.
constexpr auto kDetachGrace = std::chrono::milliseconds(100);

// Whether [a, a + n) and [b, b + m) share a byte (saturating: a refused
// access with an overflowing range still orders conservatively).
bool overlaps(uint64_t a, uint64_t n, uint64_t b, uint64_t m) {
  if (n == 0 || m == 0) return false;
  const uint64_t ae = a > UINT64_MAX - n ? UINT64_MAX : a + n;
  const uint64_t be = b > UINT64_MAX - m ? UINT64_MAX : b + m;
  return a < be && b < ae;
}

std::string sanitized(const char* p, size_t n) {
  std::string s(p, n);
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) == 0x7f) c = ' ';  // untrusted text
  return s;
}

class UcxTransport final : public Transport, public PostedRma {
 public:
  UcxTransport(std::unique_ptr<Fabric> fabric, const UcxSetup& s)
      : rank_(s.rank),
        spin_(std::max(s.spin, std::chrono::microseconds(0))),
        timeout_(s.timeout),
        heartbeat_ms_(s.heartbeat_ms),
        api_(fabric->api),
        protect_(s.protect),
        test_received_(s.test_received),
        test_drop_send_(s.test_drop_send),
        test_drop_payload_(s.test_drop_payload),
        regions_(rmaTransportTag("ucx"), s.rank),
        fabric_(std::move(fabric)) {}
  ~UcxTransport() override;

  Status init();

  [[nodiscard]] std::string_view name() const override { return "ucx"; }
  Status postSend(int peer, const void* src, size_t bytes, Request* req) override;
  Status postRecv(int peer, const RecvTarget& target, Request* req) override;
  Result<bool> poll() override;
  void wait(std::chrono::microseconds timeout) override;
  void wake() override;
  void abort(const Status& why) override;

  // Rma (rma.hpp)
  Rma* rma() override { return this; }
  Result<RegionId> registerRegion(void* base, size_t bytes, Access access) override;
  Status deregisterRegion(RegionId id) override;
  Result<std::vector<std::byte>> packKey(RegionId id) override { return regions_.pack(id); }
  Result<RemoteKey> unpackKey(int peer, std::span<const std::byte> blob) override {
    return regions_.unpack(peer, peerIndex(peer) >= 0, blob);
  }
  Result<bool> takeNotification(int* peer, uint64_t* value) override;

 private:
  // ---- tags (ucx_wire.hpp): ours carry out-keys, the peer's in-keys ----
  uint64_t msgTagOut(const Peer& p, uint64_t seq) const { return makeTag(rank_, kChanMsg, seq + p.link->out.msg); }
  uint64_t dataTagOut(const Peer& p, uint64_t seq) const { return makeTag(rank_, kChanData, seq + p.link->out.data); }
  uint64_t rmaTagOut(const Peer& p, uint64_t seq) const { return makeTag(rank_, kChanRma, seq + p.link->out.rma); }
  uint64_t ctlTagOut(const Peer& p) const { return makeTag(rank_, kChanCtl, p.link->out.ctl); }
  static uint64_t msgTagIn(const Peer& p, uint64_t seq) { return makeTag(p.rank, kChanMsg, seq + p.link->in.msg); }
  static uint64_t dataTagIn(const Peer& p, uint64_t seq) { return makeTag(p.rank, kChanData, seq + p.link->in.data); }
  static uint64_t rmaTagIn(const Peer& p, uint64_t seq) { return makeTag(p.rank, kChanRma, seq + p.link->in.rma); }
  static uint64_t ctlTagIn(const Peer& p) { return makeTag(p.rank, kChanCtl, p.link->in.ctl); }

  // ---- posting ----
  int peerIndex(int peer) const {
    return peer >= 0 && static_cast<size_t>(peer) < index_of_.size() ? index_of_[static_cast<size_t>(peer)] : -1;
  }
  Result<Peer*> peerFor(int peer, Request* req, std::string_view what);
  static Status rejectPost(Request* req, Status why);
  static void markPosted(Request* req);
  void noteCall(uint64_t sig);
  Status unclaimedCheck(const Peer& p) const;
  void postHeader(Peer& p);

  // ---- completions ----
  bool handleDone(Status& first_error);
  void handle(Op* op, Status& first_error);
  void onSend(Op* op, Status& first_error);
  void onHeader(Op* op, Status& first_error);
  void match(Peer& p, Status& first_error);
  void consume(Peer& p);
  void onData(Op* op, Status& first_error);
  void onCtl(Op* op, Status& first_error);
  void checkEndpoints(Status& first_error);
  bool checkGaps(Status& first_error);

  // ---- sealing (CHORUS_WIRE_PROTECT; ucx_wire.hpp, "sealing") ----
  [[nodiscard]] bool sealed() const { return protect_ != auth::WireProtect::kOff; }
  [[nodiscard]] size_t msgStage() const { return sealed() ? kMsgSealedStageBytes : kMsgStageBytes; }
  [[nodiscard]] size_t ctlStage() const { return sizeof(CtlMsg) + (sealed() ? kSealTagBytes : 0); }
  [[nodiscard]] size_t rmaStage() const { return kRmaStageBytes + (sealed() ? kSealTagBytes : 0); }
  void received(const Peer& p, Channel ch, std::byte* data, size_t n) const {
    if (test_received_) test_received_(p.rank, static_cast<int>(ch), std::span(data, n));
  }
  // Opens a received keyed message in place (ucx_wire.hpp, SealedLayout).
  bool openMessage(const Peer& p, Channel ch, uint64_t seq, std::byte* data, const SealedLayout& at) const;
  Status integrity(const Peer& p, std::string_view what, uint64_t seq) const;
  void failIntegrity(Peer& p, const Status& why, Status& first_error);

  // ---- failure ----
  Status failure(const Peer& p, ucs_status_t st, std::string_view what) const;
  Status corrupt(const Peer& p, std::string_view what) const;
  void stranger(const Peer& p, std::string_view what);
  void failPeer(Peer& p, const Status& why, bool hard, Status& first_error);
  void sendCtl(Peer& p, CtlKind kind, const Status& why);
  Status abortStatus() const;
  Status applyAbort();
  template <typename F>
  void forEachOutstanding(F&& f);
  bool drain(const std::function<bool()>& done, Clock::time_point deadline);
  void detachStuck(bool now, Status& first_error);

  // ---- the registration cache (RegEntry) ----
  static void onUnmapped(ucm_event_type_t type, ucm_event_t* event, void* arg);
  void drainUnmapped();
  // The cached mapping and packed key of exactly [addr, addr + length) with
  // `prot` (mapped and inserted when absent): its index, or -1 with *err.
  int regLookup(const void* addr, size_t length, unsigned prot, Status* err, int peer, bool is_put);
  void regRelease(OriginOp& o);
  void regEvict(size_t i);
  // Installs the memory-event handler at the first large access (so that a
  // job that makes none never has UCX's memory hooks): whether the cache is on.
  bool regCacheOn();

 public:
  [[nodiscard]] UcxRegistrationStats regStats() const { return reg_stats_; }
  [[nodiscard]] std::string configChanges() const { return fabric_->config_changes; }
  [[nodiscard]] std::string endpointInfo(int peer) const {
    for (const auto& l : fabric_->links) {
      if (l->rank != peer || l->ep == nullptr) continue;
      char* text = nullptr;
      size_t len = 0;
      FILE* out = ::open_memstream(&text, &len);
      if (out == nullptr) return {};
      api_->ucp_ep_print_info(l->ep, out);
      std::fclose(out);
      std::string info(text, len);
      std::free(text);
      return info;
    }
    return {};
  }

 private:
  // ---- one-sided ----
  Status postRma(int peer, RmaOpKind kind, const void* local, size_t bytes, const RemoteKey* key, uint64_t offset,
                 uint64_t value, Request* req) override;
  void sendRma(Peer& p, const RmaMsg& m, const std::byte* extra, size_t n);
  void answer(Peer& p, uint16_t kind, uint64_t op, RmaRefusal why = RmaRefusal::None, uint64_t detail = 0,
              const std::byte* data = nullptr, size_t n = 0);
  void onRma(Op* op, Status& first_error);
  void onRmaRequest(Peer& p, const RmaMsg& m, const std::byte* extra, Status& first_error);
  void onRmaAnswer(Peer& p, const RmaMsg& m, const std::byte* extra, Status& first_error);
  void serveTarget(Peer& p, Status& first_error);
  void startTarget(Peer& p, TargetOp& t, Status& first_error);
  TargetOp* findTarget(Peer& p, uint64_t op);
  void onMove(Op* op, Status& first_error);
  void onFlush(Op* op, Status& first_error);
  void failOrigin(Peer& p, const Status& why);
  ucp_mem_h regionMemh(uint32_t index, uint64_t generation) const;
  bool regionBusy(RegionId id) const;
  void unmap(ucp_mem_h& memh);

  const int rank_;
  const std::chrono::microseconds spin_;
  const std::chrono::milliseconds timeout_;
  const int heartbeat_ms_;
  const UcpApi* api_;
  const auth::WireProtect protect_;
  const std::function<void(int, int, std::span<std::byte>)> test_received_;
  const std::function<bool(int, uint64_t)> test_drop_send_;
  const std::function<bool(int, uint64_t)> test_drop_payload_;
  std::vector<Peer> peers_;
  std::vector<int> index_of_;  // rank -> index in peers_, -1 for non-peers
  uint64_t current_sig_ = 0;   // the collective call of the latest request (noteCall)
  uint64_t seen_ep_errors_ = 0;
  std::vector<Op*> batch_;
  Status deferred_error_;  // an error found outside poll() (deregisterRegion), reported by the next poll()
  int strangers_ = 0;
  int gone_peers_ = 0;  // peers that went: poll() then looks for stuck receives (detachStuck)
  Clock::time_point next_detach_{};
  bool tearing_down_ = false;

  net::Fd wake_fd_;
  std::atomic<bool> woken_{false};
  std::atomic<bool> aborted_{false};
  mutable std::mutex abort_mu_;
  Status abort_status_;  // guarded by abort_mu_
  bool abort_applied_ = false;

  RegionTable regions_;
  struct RegionMap {
    uint64_t generation = 0;
    ucp_mem_h memh = nullptr;
  };
  std::vector<RegionMap> region_maps_;  // by region index
  std::deque<std::pair<int, uint64_t>> notes_;

  std::vector<RegEntry> reg_cache_;
  bool reg_hooked_ = false;  // onUnmapped is installed: the cache is on
  bool reg_tried_ = false;
  uint64_t reg_clock_ = 0;
  UcxRegistrationStats reg_stats_;
  std::mutex unmapped_mu_;  // guards the four below; never held across an allocation or a UCX call
  std::array<std::pair<uintptr_t, size_t>, kUnmappedSlots> unmapped_{};
  size_t unmapped_n_ = 0;
  bool unmapped_overflow_ = false;
  std::atomic<bool> unmapped_pending_{false};

  std::unique_ptr<Fabric> fabric_;  // last: destroyed first (it holds the worker UCP calls back from)
};

Status UcxTransport::init() {
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_.valid()) return errnoError("eventfd (ucx transport)", errno);

  fabric_->wake_fd = wake_fd_.get();
  peers_.resize(fabric_->links.size());
  int max_rank = 0;
  for (const auto& l : fabric_->links) max_rank = std::max(max_rank, l->rank);
  index_of_.assign(static_cast<size_t>(max_rank) + 1, -1);
  for (size_t i = 0; i < peers_.size(); ++i) {
    Peer& p = peers_[i];
    p.link = fabric_->links[i].get();
    p.rank = p.link->rank;
    index_of_[static_cast<size_t>(p.rank)] = static_cast<int>(i);
    p.header = fabric_->sink.alloc(Op::kRecvHeader, &p);
    p.header->buf.resize(msgStage());
    postHeader(p);
    p.ctl = fabric_->sink.alloc(Op::kRecvCtl, &p);
    p.ctl->buf.resize(ctlStage());
    fabric_->sink.recv(fabric_->worker, ctlTagIn(p), p.ctl, p.ctl->buf.data(), ctlStage());
    p.rma_rx = fabric_->sink.alloc(Op::kRecvRma, &p);
    p.rma_rx->buf.resize(rmaStage());
    fabric_->sink.recv(fabric_->worker, rmaTagIn(p, 0), p.rma_rx, p.rma_rx->buf.data(), rmaStage());
  }
  startHeartbeat(*fabric_);  // once wake_fd is set: it wakes a sleeping wait()
  return {};
}

void UcxTransport::postHeader(Peer& p) {
  p.header->seq = p.recv_seq;
  fabric_->sink.recv(fabric_->worker, msgTagIn(p, p.recv_seq), p.header, p.header->buf.data(), msgStage());
}

// Leaving: tell the peers (a close: what we sent before still counts), give
// every receive back, flush and close the endpoints, and wait (bounded) until
// UCP has returned every operation, so none runs into freed memory.  User
// requests are not touched any more: their owners may be gone.
UcxTransport::~UcxTransport() {
  tearing_down_ = true;
  Fabric& f = *fabric_;
  if (!abort_applied_)
    for (Peer& p : peers_)
      if (p.gone.isOk()) sendCtl(p, kCtlClose, Status());
  forEachOutstanding([&](Op* op) {
    if (op->kind == Op::kRecvHeader || op->kind == Op::kRecvCtl || op->kind == Op::kRecvRma ||
        op->kind == Op::kRecvData || op->kind == Op::kRecvDiscard)
      f.sink.cancel(f.worker, op);
  });
  size_t flushing = 0;
  for (Peer& p : peers_) {
    if (p.link->ep == nullptr) continue;
    Op* fl = f.sink.alloc(Op::kSendCtl, &p);
    f.sink.flush(p.link->ep, fl);
    ++flushing;
  }
  if (flushing > 0) {
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    size_t seen = 0;
    while (seen < flushing && Clock::now() < deadline) {
      f.progress();
      std::vector<Op*> done;
      done.swap(f.sink.done);
      for (Op* op : done) {
        if (op->kind == Op::kSendCtl && op->rma_op == 0) ++seen;  // flushes and the close messages alike: enough
        if (op->kind == Op::kRmaMove && op->rkey != nullptr) api_->ucp_rkey_destroy(op->rkey);
        f.sink.release(op);
      }
      if (f.sink.done.empty() && seen < flushing) f.sleep(std::chrono::milliseconds(5));
    }
  }
  for (Peer& p : peers_) f.closeEndpoint(*p.link, /*force=*/true);
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while ((f.sink.outstanding > 0 || !f.closing.empty()) && Clock::now() < deadline) {
    f.progress();
    std::vector<Op*> done;
    done.swap(f.sink.done);
    for (Op* op : done) {
      if (op->kind == Op::kRmaMove && op->rkey != nullptr) api_->ucp_rkey_destroy(op->rkey);
      f.sink.release(op);
    }
  }
  for (Peer& p : peers_)
    for (auto& [n, o] : p.origin) regRelease(o);
  for (RegionMap& m : region_maps_) unmap(m.memh);
  if (reg_hooked_) api_->ucm_unset_event_handler(UCM_EVENT_VM_UNMAPPED, &UcxTransport::onUnmapped, this);
  for (RegEntry& e : reg_cache_) unmap(e.memh);
  reg_cache_.clear();
  fabric_.reset();
}

// ---- posting ----

Result<Peer*> UcxTransport::peerFor(int peer, Request* req, std::string_view what) {
  if (aborted_.load(std::memory_order_acquire)) return rejectPost(req, abortStatus());
  const int idx = peerIndex(peer);
  if (idx < 0)
    return rejectPost(req,
                      invalidArgument("ucx {} on rank {}: rank {} is not a peer of this transport", what, rank_, peer));
  return &peers_[static_cast<size_t>(idx)];
}

Status UcxTransport::rejectPost(Request* req, Status why) {
  if (req != nullptr) req->fail(why);
  return why;
}

void UcxTransport::markPosted(Request* req) {
  req->status = Status();
  req->state.store(Request::Posted, std::memory_order_release);
}

Status UcxTransport::postSend(int peer, const void* src, size_t bytes, Request* req) {
  CHORUS_ASSIGN_OR_RETURN(Peer * p, peerFor(peer, req, "send"));
  if (!p->gone.isOk()) return rejectPost(req, p->gone);
  if (bytes > kMaxMessageBytes)
    return rejectPost(req, invalidArgument("ucx send of {} bytes to rank {} exceeds the 2^48-byte message limit",
                                           bytes, peer));
  if (bytes > 0 && src == nullptr)
    return rejectPost(req, invalidArgument("ucx send of {} bytes to rank {} from a null buffer", bytes, peer));
  if (sealed() && bytes > auth::MessageSealer::kMaxBody)
    return rejectPost(req, invalidArgument("ucx send of {} bytes to rank {}: CHORUS_WIRE_PROTECT={} seals messages of "
                                           "at most {} bytes (AES-GCM's limit)", bytes, peer,
                                           auth::wireProtectName(protect_), auth::MessageSealer::kMaxBody));
  markPosted(req);
  noteCall(req->sig);  // may find the peer's held message a mismatch: the peer is failed then
  if (!p->gone.isOk()) return rejectPost(req, p->gone);
  const bool inl = bytes <= kInlineBytes;
  const uint64_t seq = p->send_seq++;
  MsgHeader h;
  h.flags = inl ? kMsgInline : kMsgData;
  h.length = bytes;
  h.sig = req->sig;
  h.token = p->link->out.token;
  Sink& sink = fabric_->sink;
  Op* lead = sink.alloc(Op::kSendMsg, p);
  lead->req = req;
  lead->seq = seq;
  lead->parts = inl ? 1 : 2;
  const size_t inline_bytes = inl ? bytes : 0;
  const size_t trailer = msgTrailerBytes(h.flags, sealed());
  lead->buf.resize(sizeof h + inline_bytes + trailer);
  std::byte* msg = lead->buf.data();
  std::memcpy(msg, &h, sizeof h);
  if (inl && bytes > 0) std::memcpy(msg + sizeof h, src, bytes);
  Op* d = nullptr;
  const void* data_src = src;
  if (!inl) {
    d = sink.alloc(Op::kSendData, p);
    d->leader = lead;
    d->seq = seq;
  }
  if (sealed()) {
    // The payload first (its tag rides in the header), then the header
    // message: header | inline payload | [payload tag] | tag.
    auth::MessageSealer& seal = *p->link->seal;
    const auto* from = static_cast<const std::byte*>(src);
    bool ok = true;
    if (!inl) {
      std::byte* into = nullptr;
      if (protect_ == auth::WireProtect::kEncrypt) {
        d->buf.resize(bytes);
        into = d->buf.data();
        data_src = into;
      }
      ok = seal.seal(kChanData, seq, {}, std::span(from, bytes), into, msg + sizeof h);
    }
    const size_t clear = sizeof h + (inl ? 0 : kSealTagBytes);
    ok = ok && seal.seal(kChanMsg, seq, std::span(msg, clear), std::span(msg + sizeof h, inline_bytes),
                         msg + sizeof h, msg + lead->buf.size() - kSealTagBytes);
    if (!ok) {  // libcrypto failed: the stream has a hole now, so the peer is gone for good
      if (d != nullptr) sink.release(d);
      sink.release(lead);
      const Status why = internalError("ucx send to rank {}: sealing message {} failed (libcrypto)", peer, seq);
      failPeer(*p, why, /*hard=*/true, deferred_error_);
      return rejectPost(req, why);
    }
  }
  if (test_drop_send_ && test_drop_send_(peer, seq)) {  // a test's lost message
    sink.completeNow(lead);
    if (d != nullptr) sink.completeNow(d);
    return {};
  }
  sink.send(p->link->ep, msgTagOut(*p, seq), lead, nullptr, lead->buf.size());
  if (d != nullptr && test_drop_payload_ && test_drop_payload_(peer, seq)) {  // a test's lost payload
    sink.completeNow(d);
    return {};
  }
  if (d != nullptr) sink.send(p->link->ep, dataTagOut(*p, seq), d, data_src == src ? src : nullptr, bytes);
  return {};
}

Status UcxTransport::postRecv(int peer, const RecvTarget& target, Request* req) {
  CHORUS_ASSIGN_OR_RETURN(Peer * p, peerFor(peer, req, "receive"));
  // A peer that went may still have a message waiting here (sent before it
  // went); a receive fails only when nothing more can come.
  if (!p->gone.isOk() && (p->hard || (!p->staged && p->header == nullptr))) return rejectPost(req, p->gone);
  if (target.bytes > 0 && target.dst == nullptr)
    return rejectPost(req,
                      invalidArgument("ucx receive of {} bytes from rank {} into a null buffer", target.bytes, peer));
  if (target.bytes > kMaxMessageBytes)
    return rejectPost(req, invalidArgument("ucx receive of {} bytes from rank {} exceeds the 2^48-byte message limit",
                                           target.bytes, peer));
  if (target.reducer != nullptr) {
    if (!target.reducer->valid())
      return rejectPost(req, invalidArgument("ucx receive from rank {}: the reducer is not initialised", peer));
    const size_t es = target.reducer->elemSize();
    if (es == 0 || target.bytes % es != 0)
      return rejectPost(req, invalidArgument("ucx reducing receive from rank {}: {} bytes is not a whole number of "
                                             "{}-byte elements", peer, target.bytes, es));
  }
  markPosted(req);
  p->unmatched.push_back(RecvPost{req, target});
  noteCall(req->sig);
  Status ignored;  // a receive that fails here has its request failed; poll() reports the rest
  match(*p, ignored);
  return {};
}

// A held header no posted receive claims: if it belongs to the call being
// run (same call number) but has another signature, the ranks disagree on
// the call (typically its root: both sides only send) and nobody would ever
// receive it.
Status UcxTransport::unclaimedCheck(const Peer& p) const {
  if (current_sig_ == 0 || !p.staged || !p.unmatched.empty() || p.hard) return {};
  MsgHeader h;
  std::memcpy(&h, p.header->buf.data(), sizeof h);
  if (!sameCallOtherSignature(current_sig_, h.sig)) return {};
  return signatureMismatch(rank_, p.rank, current_sig_, h.sig);
}

void UcxTransport::noteCall(uint64_t sig) {
  if (sig == 0 || (sig & kWirePointToPoint) != 0 || sig == current_sig_) return;
  current_sig_ = sig;
  for (Peer& q : peers_)
    if (Status st = unclaimedCheck(q); !st.isOk()) failPeer(q, st, /*hard=*/true, deferred_error_);
}

// ---- progress ----

Result<bool> UcxTransport::poll() {
  if (aborted_.load(std::memory_order_acquire)) return applyAbort();
  Status first_error = std::move(deferred_error_);
  deferred_error_ = Status();
  bool progressed = fabric_->progress();
  progressed = handleDone(first_error) || progressed;
  if (fabric_->ep_errors.load(std::memory_order_acquire) != seen_ep_errors_) {
    checkEndpoints(first_error);
    handleDone(first_error);
    progressed = true;
  }
  if (gone_peers_ > 0 && Clock::now() >= next_detach_) {
    next_detach_ = Clock::now() + kDetachGrace / 2;
    detachStuck(false, first_error);
  }
  if (!first_error.isOk()) return first_error;
  return progressed;
}

namespace {
// A completed control receive holding the peer's abort (its token checked
// again by onCtl, which handles it).
bool isAbortNotice(const Op* op) {
  if (op->kind != Op::kRecvCtl || op->status != UCS_OK || op->length < sizeof(CtlMsg)) return false;
  CtlMsg m;
  std::memcpy(&m, op->buf.data(), sizeof m);
  return m.kind == kCtlAbort && m.token == op->peer->link->in.token;
}
}  // namespace

bool UcxTransport::handleDone(Status& first_error) {
  bool any = false;
  Sink& sink = fabric_->sink;
  while (!sink.done.empty()) {
    batch_.clear();
    batch_.swap(sink.done);  // handlers may queue more (a cancel, a close, an immediate completion)
    // A batch that fails something handles a peer's abort notice first, so
    // that what fails names the root cause the notice carries: a ring
    // neighbour that learnt of a killed rank and closed its endpoints would
    // otherwise be blamed for it (the send to it fails in the same batch).
    if (std::any_of(batch_.begin(), batch_.end(), [](const Op* o) { return o->status != UCS_OK; }))
      std::stable_partition(batch_.begin(), batch_.end(), [](const Op* o) { return isAbortNotice(o); });
    for (Op* op : batch_) {
      any = true;
      handle(op, first_error);
    }
  }
  return any;
}

void UcxTransport::handle(Op* op, Status& first_error) {
  switch (op->kind) {
    case Op::kSendMsg:
    case Op::kSendData: onSend(op, first_error); return;
    case Op::kRecvHeader: onHeader(op, first_error); return;
    case Op::kRecvData: onData(op, first_error); return;
    case Op::kRecvCtl: onCtl(op, first_error); return;
    case Op::kRecvRma: onRma(op, first_error); return;
    case Op::kRmaMove: onMove(op, first_error); return;
    case Op::kRmaFlush: onFlush(op, first_error); return;
    default:  // sends of our own records, flushes, dropped payloads, the handshake's leftovers
      fabric_->sink.release(op);
      return;
  }
}

void UcxTransport::onSend(Op* op, Status& first_error) {
  Op* lead = op->kind == Op::kSendMsg ? op : op->leader;
  Peer& p = *op->peer;
  if (op->status != UCS_OK && lead->error.isOk()) lead->error = failure(p, op->status, "a send to");
  if (op != lead) fabric_->sink.release(op);
  if (--lead->parts > 0) return;
  if (lead->error.isOk()) {
    lead->req->complete();
  } else {
    lead->req->fail(lead->error);
    if (first_error.isOk()) first_error = lead->error;
  }
  fabric_->sink.release(lead);
}

void UcxTransport::onHeader(Op* op, Status& first_error) {
  Peer& p = *op->peer;
  if (op->status == UCS_ERR_CANCELED) {  // the peer went (or is hard-failed): nothing more from it
    fabric_->sink.release(op);
    p.header = nullptr;
    match(p, first_error);
    return;
  }
  // A header that breaks the protocol fails the peer; its stage goes with it.
  auto broken = [&](const Status& why) {
    fabric_->sink.release(op);
    p.header = nullptr;
    failPeer(p, why, /*hard=*/true, first_error);
  };
  if (op->status != UCS_OK) {
    broken(op->status == UCS_ERR_MESSAGE_TRUNCATED
               ? corrupt(p, fmt::format("message header of {} bytes (a header with its inline payload has at most {})",
                                        op->length, kMsgStageBytes))
               : failure(p, op->status, "a receive from"));
    return;
  }
  if (p.hard) {  // arrived while the peer was being failed: dropped with it
    fabric_->sink.release(op);
    p.header = nullptr;
    return;
  }
  MsgHeader h;
  if (op->length < sizeof h) {
    broken(corrupt(p, fmt::format("message header of {} bytes", op->length)));
    return;
  }
  received(p, kChanMsg, op->buf.data(), op->length);
  std::memcpy(&h, op->buf.data(), sizeof h);
  size_t length = op->length;  // without the seal's trailer
  if (sealed()) {
    // Nothing of it counts before its tag verified.  The flags (checked by
    // the tag too) say whether a payload tag precedes the message's own.
    SealedLayout at;
    if (!sealedMsgLayout(h.flags, op->length, &at) || !openMessage(p, kChanMsg, p.recv_seq, op->buf.data(), at)) {
      const Status why = integrity(p, "message", p.recv_seq);
      fabric_->sink.release(op);
      p.header = nullptr;
      failIntegrity(p, why, first_error);
      return;
    }
    std::memcpy(&h, op->buf.data(), sizeof h);
    length = at.unsealed;
  } else if (h.token != p.link->in.token) {
    stranger(p, "message header");
    postHeader(p);  // the same sequence again: the real one is still to come
    return;
  }
  if (const char* bad = h.token != p.link->in.token ? "a sealed header without the pair's token"
                                                    : msgHeaderProblem(h, length);
      bad != nullptr) {
    broken(corrupt(p, fmt::format("message header (magic {:#x} flags {:#x} length {}): {}", h.magic, h.flags, h.length,
                                  bad)));
    return;
  }
  p.staged = true;
  match(p, first_error);
  if (Status st = unclaimedCheck(p); !st.isOk()) failPeer(p, st, true, first_error);
}

// Matches held headers with posted receives, oldest first; fails the
// receives a peer that went can no longer satisfy.
void UcxTransport::match(Peer& p, Status& first_error) {
  while (!p.unmatched.empty()) {
    if (p.staged) {
      consume(p);
      continue;
    }
    if (!p.gone.isOk() && (p.hard || p.header == nullptr)) {
      for (RecvPost& r : p.unmatched) r.req->fail(p.gone);
      p.unmatched.clear();
      if (first_error.isOk()) first_error = p.gone;
    }
    break;
  }
}

// The held header meets the oldest posted receive.
void UcxTransport::consume(Peer& p) {
  Sink& sink = fabric_->sink;
  Op* hop = p.header;
  MsgHeader h;
  std::memcpy(&h, hop->buf.data(), sizeof h);
  const RecvPost r = p.unmatched.front();
  p.unmatched.pop_front();
  const uint64_t seq = p.recv_seq;
  if (h.length != r.target.bytes || h.sig != r.req->sig) {
    r.req->fail(h.sig != r.req->sig
                    ? signatureMismatch(rank_, p.rank, r.req->sig, h.sig)
                    : makeError(chorusMismatch,
                                "message from rank {} has {} bytes but the receive expects {} (are all ranks calling "
                                "the same collective with the same count?)",
                                p.rank, h.length, r.target.bytes));
    if (h.flags == kMsgData) {  // its payload is received into nothing (UCP drops what does not fit)
      Op* d = sink.alloc(Op::kRecvDiscard, &p);
      d->buf.resize(1);
      sink.recv(fabric_->worker, dataTagIn(p, seq), d, d->buf.data(), 0);
    }
  } else if (h.flags == kMsgInline) {
    const std::byte* src = hop->buf.data() + sizeof h;
    if (h.length > 0) {
      if (r.target.reducer == nullptr) {
        std::memcpy(r.target.dst, src, h.length);
      } else {
        const std::byte* acc = r.target.accum != nullptr ? r.target.accum : r.target.dst;
        (*r.target.reducer)(r.target.dst, acc, src, h.length / r.target.reducer->elemSize());
      }
    }
    r.req->complete();
  } else {
    Op* d = sink.alloc(Op::kRecvData, &p);
    d->req = r.req;
    d->target = r.target;
    d->seq = seq;
    if (sealed()) std::memcpy(d->tag.data(), hop->buf.data() + sizeof h, kSealTagBytes);
    std::byte* into = r.target.dst;
    if (r.target.reducer != nullptr) {
      d->buf.resize(h.length);
      into = d->buf.data();
    }
    sink.recv(fabric_->worker, dataTagIn(p, seq), d, into, h.length);
  }
  p.staged = false;
  ++p.recv_seq;
  postHeader(p);
  // A peer that went may have sent more before it went: the repost above
  // took it if it is here; else nothing more comes.
  if (!p.gone.isOk()) fabric_->sink.cancel(fabric_->worker, hop);
}

void UcxTransport::onData(Op* op, Status& first_error) {
  Peer& p = *op->peer;
  Request* req = op->req;
  if (req == nullptr) {  // detached (detachStuck): its request failed already
    fabric_->sink.release(op);
    return;
  }
  if (p.hard && op->status == UCS_OK) op->status = UCS_ERR_CANCELED;  // nothing of the peer counts any more
  if (op->status == UCS_OK && op->length == op->target.bytes) {
    const RecvTarget& t = op->target;
    std::byte* got = t.reducer != nullptr ? op->buf.data() : t.dst;
    received(p, kChanData, got, t.bytes);
    // Sealed: the bytes count only once their tag (from the header) verified;
    // `encrypt` decrypts them in place.
    if (sealed() && !p.link->open->open(kChanData, op->seq, {}, std::span(got, t.bytes), got, op->tag.data())) {
      const Status why = integrity(p, "message payload", op->seq);
      if (protect_ == auth::WireProtect::kMac) std::memset(got, 0, t.bytes);  // (encrypt: wiped by open)
      req->fail(why);
      fabric_->sink.release(op);
      failIntegrity(p, why, first_error);
      return;
    }
    if (t.reducer != nullptr && t.bytes > 0) {
      const std::byte* acc = t.accum != nullptr ? t.accum : t.dst;
      (*t.reducer)(t.dst, acc, op->buf.data(), t.bytes / t.reducer->elemSize());
    }
    req->complete();
  } else {
    Status why;
    if (op->status == UCS_ERR_CANCELED && op->gap_cancel && p.gone.isOk() && !p.hard) {
      why = remoteError("ucx: the payload of message #{} from rank {} is missing: message #{} arrived while this "
                        "rank still waited for it (lost on the way?)",
                        op->seq, p.rank, op->seq + 1);
      req->fail(why);
      fabric_->sink.release(op);
      failIntegrity(p, why, first_error);
      return;
    }
    if (op->status == UCS_OK || op->status == UCS_ERR_MESSAGE_TRUNCATED) {
      why = corrupt(p, fmt::format("payload: message {} has {} bytes, its header said {}", op->seq, op->length,
                                   op->target.bytes));
      failPeer(p, why, true, first_error);
    } else {
      why = failure(p, op->status, "a receive from");
    }
    req->fail(why);
    if (first_error.isOk()) first_error = why;
  }
  fabric_->sink.release(op);
}

void UcxTransport::onCtl(Op* op, Status& first_error) {
  Peer& p = *op->peer;
  if (op->status == UCS_ERR_CANCELED) {
    p.ctl = nullptr;
    fabric_->sink.release(op);
    return;
  }
  if (p.hard) {
    p.ctl = nullptr;
    fabric_->sink.release(op);
    return;
  }
  CtlMsg m;
  bool ours = op->status == UCS_OK && op->length == ctlStage();
  if (ours) {
    received(p, kChanCtl, op->buf.data(), op->length);
    SealedLayout at;
    if (sealed() && !(sealedRecordLayout(kCtlClearBytes, op->length, &at) &&
                      openMessage(p, kChanCtl, 0, op->buf.data(), at))) {
      const Status why = integrity(p, "control message", 0);
      p.ctl = nullptr;
      fabric_->sink.release(op);
      failPeer(p, why, true, first_error);
      return;
    }
    std::memcpy(&m, op->buf.data(), sizeof m);
    ours = m.token == p.link->in.token;
  }
  if (!ours) {  // another size or no token: not from the peer
    stranger(p, "control message");
    fabric_->sink.recv(fabric_->worker, ctlTagIn(p), op, op->buf.data(), ctlStage());
    return;
  }
  p.ctl = nullptr;
  fabric_->sink.release(op);
  if (const char* bad = ctlProblem(m, sizeof m); bad != nullptr) {
    failPeer(p, corrupt(p, fmt::format("control message: {}", bad)), true, first_error);
    return;
  }
  if (m.kind == kCtlAbort) {
    const std::string reason = sanitized(m.reason.data(), m.reason_len);
    failPeer(p,
             makeError(relayedAbortCode(m.code),
                       "ucx: peer rank {} aborted its communicator: {}", p.rank,
                       reason.empty() ? std::string("no reason given") : std::string(abortRootCause(reason))),
             true, first_error);
  } else {
    failPeer(p,
             remoteError("ucx: rank {} closed its transport while this rank still expected data from it (did rank {} "
                         "exit, fail or destroy its communicator?)", p.rank, p.rank),
             false, first_error);
  }
}

void UcxTransport::checkEndpoints(Status& first_error) {
  seen_ep_errors_ = fabric_->ep_errors.load(std::memory_order_acquire);
  for (Peer& p : peers_) {
    const int e = p.link->ep_error.load(std::memory_order_acquire);
    const int64_t silent = p.link->silent_ms.load(std::memory_order_acquire);
    if ((e == UCS_OK && silent == 0) || p.ep_seen) continue;
    p.ep_seen = true;
    if (e != UCS_OK)
      failPeer(p,
               remoteError("ucx: rank {} is unreachable: {} (did rank {} exit, fail or abort?)", p.rank,
                           api_->text(static_cast<ucs_status_t>(e)), p.rank),
               false, first_error);
    else  // the heartbeat (ucx_heartbeat.cpp)
      failPeer(p,
               remoteError("ucx: rank {} is unreachable: nothing heard from it for {} ms (its heartbeat; "
                           "CHORUS_HEARTBEAT_MS={}: is its host down or cut off the network, or its process "
                           "stopped?)", p.rank, silent, heartbeat_ms_),
               false, first_error);
  }
}

// A lost message (docs/ucx.md, "Faults").  Headers of one peer arrive in
// order (one endpoint, eager), and this rank always has the receive of the
// peer's next header posted unless it holds one: so a later header of the
// peer waiting unexpected in UCP while that receive is still open means the
// expected one was lost on the way.  Looked for only when a wait is about to
// sleep (nothing moved), with one probe per peer; an unexpected message on
// the peer's message channel whose sequence is not just ahead of the
// expected one (a stranger's: it would have to guess the pair's 40-bit tag
// offset) is received and dropped instead.
bool UcxTransport::checkGaps(Status& first_error) {
  constexpr uint64_t kGapWindow = uint64_t{1} << 16;  // how far ahead a real later header can be
  bool found = false;
  for (Peer& p : peers_) {
    if (p.header == nullptr || p.staged || p.hard || !p.gone.isOk() || p.unmatched.empty()) continue;
    const uint64_t want = msgTagIn(p, p.recv_seq);
    for (int tries = 0; tries < 4; ++tries) {
      ucp_tag_recv_info_t info{};
      if (api_->ucp_tag_probe_nb(fabric_->worker, want, ~kSeqMask, /*remove=*/0, &info) == nullptr) break;
      const uint64_t ahead = ((info.sender_tag & kSeqMask) - (want & kSeqMask)) & kSeqMask;
      if (ahead > 0 && ahead < kGapWindow) {
        failIntegrity(p,
                      remoteError("ucx: message #{} from rank {} is missing: message #{} arrived while this rank "
                                  "still waited for it (lost on the way?)",
                                  p.recv_seq, p.rank, p.recv_seq + ahead),
                      first_error);
        found = true;
        break;
      }
      stranger(p, "message header");
      ucp_tag_message_h msg = api_->ucp_tag_probe_nb(fabric_->worker, want, ~kSeqMask, /*remove=*/1, &info);
      if (msg == nullptr) break;
      ucp_request_param_t prm{};  // no callback: released by UCP once it completes
      std::byte none{};
      ucs_status_ptr_t r = api_->ucp_tag_msg_recv_nbx(fabric_->worker, &none, 0, msg, &prm);
      if (r != nullptr && !UCS_PTR_IS_ERR(r)) api_->ucp_request_free(r);
    }
  }
  // A large payload travels right after its header on the same endpoint, so
  // once the next header of the peer arrived, the payload (an eager message
  // or its rendezvous request) arrived too and met its receive.  A payload
  // receive UCP still has unmatched then will never be: cancelling it
  // succeeds only in that case (UCP cancels a receive only while it waits in
  // its expected queue; a matched one, its bytes still flowing, goes on),
  // and onData fails it as missing.
  forEachOutstanding([&](Op* op) {
    if (op->kind != Op::kRecvData || op->req == nullptr || op->gap_cancel) return;
    const Peer& p = *op->peer;
    if (p.hard || !p.gone.isOk()) return;
    if (p.recv_seq > op->seq + 1 || (p.recv_seq == op->seq + 1 && p.staged)) {
      op->gap_cancel = true;
      fabric_->sink.cancel(fabric_->worker, op);
      found = true;
    }
  });
  return found;
}

// ---- sealing ----

bool UcxTransport::openMessage(const Peer& p, Channel ch, uint64_t seq, std::byte* data, const SealedLayout& at) const {
  return p.link->open->open(ch, seq, std::span(data, at.clear), std::span(data + at.body_at, at.body),
                            data + at.body_at, data + at.tag_at);
}

Status UcxTransport::integrity(const Peer& p, std::string_view what, uint64_t seq) const {
  return remoteError("ucx: {} #{} from rank {} failed its integrity check (CHORUS_WIRE_PROTECT={}): changed, replayed, "
                     "reordered or dropped on the way, or sealed under other keys; nothing of it was used",
                     what, seq, p.rank, auth::wireProtectName(protect_));
}

// The peer's bytes cannot be trusted any more: it is told why (so that it
// fails naming this rank and the check), then failed for good.
void UcxTransport::failIntegrity(Peer& p, const Status& why, Status& first_error) {
  if (p.gone.isOk()) {
    sendCtl(p, kCtlAbort, remoteError("rank {}: {}", rank_, why.message()));
    // Handed to UCP before the endpoint is closed (bounded: a notice that
    // does not go out leaves the peer to find the closed endpoint).
    const auto until = Clock::now() + std::chrono::milliseconds(200);
    bool pending = true;
    while (pending && Clock::now() < until) {
      pending = false;
      forEachOutstanding([&](Op* o) { pending = pending || (o->kind == Op::kSendCtl && o->peer == &p); });
      if (pending) fabric_->progress();
    }
  }
  failPeer(p, why, /*hard=*/true, first_error);
}

// ---- failure ----

Status UcxTransport::failure(const Peer& p, ucs_status_t st, std::string_view what) const {
  if (abort_applied_) return abortStatus();
  if (!p.gone.isOk()) return p.gone;
  return remoteError("ucx: {} rank {} failed: {} (did rank {} exit, fail or abort?)", what, p.rank, api_->text(st),
                     p.rank);
}

Status UcxTransport::corrupt(const Peer& p, std::string_view what) const {
  return remoteError("ucx: rank {} sent a corrupt {} (a different chorus version, or not a chorus peer?)", p.rank, what);
}

void UcxTransport::stranger(const Peer& p, std::string_view what) {
  if (++strangers_ <= 8)
    log::warn("ucx transport rank {}: dropped a {} that claims to come from rank {} but does not carry the pair's "
              "token (a stranger that reached this worker?)", rank_, what, p.rank);
}

// The peer went (hard: nothing of it is trusted any more).  Fails what can no
// longer finish and closes its endpoint, so UCP gives back what it holds for
// it (those requests fail when it does).
void UcxTransport::failPeer(Peer& p, const Status& why, bool hard, Status& first_error) {
  if (p.gone.isOk()) {
    p.gone = why;
    p.gone_at = Clock::now();
    ++gone_peers_;
  }
  const bool harden = hard && !p.hard;
  if (hard) p.hard = true;
  Fabric& f = *fabric_;
  if (p.hard) {
    if (p.staged) {  // a held header: dropped with the peer
      p.staged = false;
      f.sink.release(p.header);
      p.header = nullptr;
    }
    if (harden)
      forEachOutstanding([&](Op* op) {
        if (op->peer == &p && (op->kind == Op::kRecvData || op->kind == Op::kRecvHeader)) f.sink.cancel(f.worker, op);
      });
  } else if (!p.staged && p.header != nullptr) {
    f.sink.cancel(f.worker, p.header);  // unless a message is arriving, nothing more comes
  }
  if (p.ctl != nullptr) f.sink.cancel(f.worker, p.ctl);
  if (p.rma_rx != nullptr) f.sink.cancel(f.worker, p.rma_rx);
  f.closeEndpoint(*p.link, /*force=*/true);
  failOrigin(p, p.gone);
  // Requests of the peer not started are dropped; running moves end with
  // the endpoint (onMove).
  p.target.erase(std::remove_if(p.target.begin(), p.target.end(),
                                [](const TargetOp& t) { return t.state != TargetOp::kRunning; }),
                 p.target.end());
  match(p, first_error);
}

void UcxTransport::sendCtl(Peer& p, CtlKind kind, const Status& why) {
  if (p.link->ep == nullptr) return;
  CtlMsg m;
  m.kind = kind;
  m.token = p.link->out.token;
  if (kind == kCtlAbort) {
    m.code = static_cast<uint64_t>(why.code());
    m.reason_len = static_cast<uint32_t>(std::min(why.message().size(), kMaxAbortReason));
    std::memcpy(m.reason.data(), why.message().data(), m.reason_len);
  }
  Op* op = fabric_->sink.alloc(Op::kSendCtl, &p);
  op->rma_op = 1;  // not a flush (the destructor counts those)
  op->buf.resize(ctlStage());
  std::memcpy(op->buf.data(), &m, sizeof m);
  if (sealed()) {
    std::byte* b = op->buf.data();
    if (!p.link->seal->seal(kChanCtl, p.ctl_send_seq++, std::span(b, kCtlClearBytes),
                            std::span(b + kCtlClearBytes, sizeof m - kCtlClearBytes), b + kCtlClearBytes,
                            b + sizeof m)) {
      fabric_->sink.release(op);
      return;
    }
  }
  fabric_->sink.send(p.link->ep, ctlTagOut(p), op, nullptr, op->buf.size());
}

template <typename F>
void UcxTransport::forEachOutstanding(F&& f) {
  for (auto& chunk : fabric_->sink.chunks)
    for (size_t i = 0; i < kOpChunk; ++i) {
      Op* op = &chunk[i];
      if (op->kind != Op::kFree && op->outstanding) f(op);
    }
}

// Progresses and handles completions until done() or the deadline.
bool UcxTransport::drain(const std::function<bool()>& done, Clock::time_point deadline) {
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    fabric_->progress();
    Status ignored;  // the requests themselves carry their failures
    if (!handleDone(ignored)) fabric_->sleep(std::chrono::milliseconds(1));
  }
  return true;
}

void UcxTransport::detachStuck(bool now, Status& first_error) {
  const auto t = Clock::now();
  forEachOutstanding([&](Op* op) {
    if (op->kind != Op::kRecvData || op->req == nullptr || op->peer->gone.isOk()) return;
    if (!now && t < op->peer->gone_at + kDetachGrace) return;
    const Status why = failure(*op->peer, UCS_ERR_CANCELED, "a receive from");
    op->req->fail(why);
    op->req = nullptr;
    if (first_error.isOk()) first_error = why;
  });
}

void UcxTransport::wake() {
  woken_.store(true, std::memory_order_release);
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t r = ::write(wake_fd_.get(), &one, sizeof one);
}

void UcxTransport::abort(const Status& why) {
  {
    std::lock_guard lock(abort_mu_);
    if (!aborted_.load(std::memory_order_relaxed))
      abort_status_ = why.isOk() ? internalError("ucx transport aborted without a reason") : why;
  }
  aborted_.store(true, std::memory_order_release);
  wake();
}

Status UcxTransport::abortStatus() const {
  std::lock_guard lock(abort_mu_);
  return abort_status_;
}

Status UcxTransport::applyAbort() {
  const Status why = abortStatus();
  if (abort_applied_) return why;
  abort_applied_ = true;
  // Large one-sided operations of this rank that a live target is moving
  // finish first (bounded): on UCP's software RMA (TCP, shared memory) the
  // target's writes into this rank's buffer arrive as messages that UCP
  // applies without asking, so the buffer is released only once they stopped.
  drain([&] {
    for (const Peer& p : peers_)
      if (p.gone.isOk())
        for (const auto& [n, o] : p.origin)
          if (o.memh != nullptr) return false;
    return true;
  }, Clock::now() + std::chrono::seconds(1));
  // The reason next, so that peers fail with it.  Its send completes once
  // UCP has handed it to the wire; on an endpoint with a rendezvous send
  // waiting for the peer, that takes the peer's progress (bounded: a peer
  // that does not progress learns of the abort when this rank's worker goes).
  bool told = false;
  for (Peer& p : peers_) {
    if (!p.gone.isOk() || p.link->ep == nullptr) continue;
    sendCtl(p, kCtlAbort, why);
    told = true;
  }
  if (told)
    drain([&] {
      size_t left = 0;
      forEachOutstanding([&](Op* op) { left += op->kind == Op::kSendCtl ? 1 : 0; });
      return left == 0;
    }, Clock::now() + std::chrono::seconds(1));
  Status ignored;
  for (Peer& p : peers_) failPeer(p, why, /*hard=*/true, ignored);
  // Every operation on user memory comes back before poll() reports the
  // abort: their requests fail then (failure() gives the abort's status).
  // Payload receives UCP keeps are detached after a short grace.
  auto userOps = [&] {
    bool user = false;
    forEachOutstanding([&](Op* op) {
      user = user || op->kind == Op::kSendMsg || op->kind == Op::kSendData ||
             (op->kind == Op::kRecvData && op->req != nullptr) || op->kind == Op::kRmaMove ||
             op->kind == Op::kRmaFlush;
    });
    return !user;
  };
  if (!drain(userOps, Clock::now() + kDetachGrace)) detachStuck(/*now=*/true, ignored);
  if (!drain(userOps, Clock::now() + std::chrono::seconds(5)))
    log::warn("ucx transport rank {}: UCP did not return every operation within 5 s of the abort", rank_);
  return why;
}

void UcxTransport::wait(std::chrono::microseconds timeout) {
  if (aborted_.load(std::memory_order_acquire) || !fabric_->sink.done.empty()) return;
  auto woken = [&] {
    return woken_.load(std::memory_order_acquire) || aborted_.load(std::memory_order_acquire) ||
           fabric_->ep_errors.load(std::memory_order_acquire) != seen_ep_errors_;
  };
  if (!woken()) {
    // Poll before sleeping, as the other transports do: a peer that answers
    // within CHORUS_SPIN_US is caught without a sleep and a wake-up; the core
    // is yielded every few tries, so a rank queued behind us on this core
    // gets it.  A short wait (the executor taking turns between transports)
    // does not spin: the other transport's wait does.
    bool slept = true;
    if (spin_.count() > 0 && timeout >= std::chrono::milliseconds(1)) {
      const auto spin_end = Clock::now() + spin_;
      for (uint32_t i = 1;; ++i) {
        if (fabric_->progress() || woken()) {
          slept = false;
          break;
        }
        if ((i & 3) == 0) {
          if (Clock::now() >= spin_end) break;
          sched_yield();
        }
      }
    }
    // Nothing moved: a peer whose next message is missing while a later one
    // already arrived is failed now, not at the call's timeout.
    if (slept && checkGaps(deferred_error_)) slept = false;
    if (slept) fabric_->sleep(timeout);
    // Data that arrived while polling ends the wait without a system call
    // more: the eventfd is drained only after a sleep or a wake.  A wake
    // written meanwhile stays readable, so the next sleep returns at once.
    if (!slept && !woken()) return;
  }
  woken_.store(false, std::memory_order_release);
  uint64_t v;
  [[maybe_unused]] ssize_t r = ::read(wake_fd_.get(), &v, sizeof v);
}

// ---- one-sided ----

Result<RegionId> UcxTransport::registerRegion(void* base, size_t bytes, Access access) {
  CHORUS_ASSIGN_OR_RETURN(RegionId id, regions_.add(base, bytes, access));
  ucp_mem_h memh = nullptr;
  if (bytes > 0) {
    // Registered with UCP for the target's own moves into and out of it
    // (no remote key of a region ever leaves this rank).  Where UCP cannot
    // map it, each move registers what it needs instead.
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_PROT;
    mp.address = base;
    mp.length = bytes;
    mp.prot = (allows(access, Access::Read) ? unsigned{UCP_MEM_MAP_PROT_LOCAL_READ} : 0u) |
              (allows(access, Access::Write) ? unsigned{UCP_MEM_MAP_PROT_LOCAL_WRITE} : 0u);
    if (const ucs_status_t st = api_->ucp_mem_map(fabric_->context, &mp, &memh); st != UCS_OK) {
      log::info("ucx transport rank {}: ucp_mem_map of a {}-byte region: {}; its moves register per operation", rank_,
                bytes, api_->text(st));
      memh = nullptr;
    }
  }
  if (region_maps_.size() <= id.index) region_maps_.resize(id.index + 1);
  region_maps_[id.index] = RegionMap{id.generation, memh};
  return id;
}

ucp_mem_h UcxTransport::regionMemh(uint32_t index, uint64_t generation) const {
  if (index >= region_maps_.size() || region_maps_[index].generation != generation) return nullptr;
  return region_maps_[index].memh;
}

void UcxTransport::unmap(ucp_mem_h& memh) {
  if (memh != nullptr) api_->ucp_mem_unmap(fabric_->context, memh);
  memh = nullptr;
}

bool UcxTransport::regionBusy(RegionId id) const {
  for (const Peer& p : peers_)
    for (const TargetOp& t : p.target)
      if (t.state == TargetOp::kRunning && t.region == id.index && t.generation == id.generation) return true;
  return false;
}

// Moves of peers' accesses into or out of the region finish first: once this
// returns, the transport touches its memory no more.
Status UcxTransport::deregisterRegion(RegionId id) {
  if (!regions_.live(id.index, id.generation)) return regions_.remove(id);  // the error
  if (regionBusy(id)) {
    Status first_error;
    const auto deadline = Clock::now() + timeout_;
    while (regionBusy(id)) {
      if (Clock::now() >= deadline)
        return makeError(chorusTimeout, "ucx rma on rank {}: deregistering region {}: a peer's access into it did not "
                         "finish within {} ms", rank_, id.index, timeout_.count());
      fabric_->progress();
      if (!handleDone(first_error)) fabric_->sleep(std::chrono::milliseconds(1));
    }
    if (!first_error.isOk() && deferred_error_.isOk()) deferred_error_ = first_error;
  }
  if (id.index < region_maps_.size()) {
    unmap(region_maps_[id.index].memh);
    region_maps_[id.index] = RegionMap{};
  }
  return regions_.remove(id);
}

Result<bool> UcxTransport::takeNotification(int* peer, uint64_t* value) {
  if (!notes_.empty()) {
    *peer = notes_.front().first;
    *value = notes_.front().second;
    notes_.pop_front();
    return true;
  }
  if (aborted_.load(std::memory_order_acquire)) return abortStatus();
  return false;
}

Status UcxTransport::postRma(int peer, RmaOpKind kind, const void* local, size_t bytes, const RemoteKey* key,
                             uint64_t offset, uint64_t value, Request* req) {
  if (req == nullptr) return invalidArgument("ucx rma on rank {}: a null request", rank_);
  CHORUS_ASSIGN_OR_RETURN(Peer * p, peerFor(peer, req, "one-sided operation"));
  if (!p->gone.isOk()) return rejectPost(req, p->gone);
  if (Status s = rmaCheckPost("ucx", rank_, kind, peer, local, bytes, key, rmaTransportTag("ucx")); !s.isOk())
    return rejectPost(req, s);
  if (bytes > kMaxMessageBytes)
    return rejectPost(req, invalidArgument("ucx rma on rank {}: {} bytes to or from rank {} exceed the 2^48-byte "
                                           "limit", rank_, bytes, peer));
  OriginOp o;
  o.kind = kind;
  o.req = req;
  RmaMsg m;
  m.token = p->link->out.token;
  std::vector<std::byte> extra;
  if (kind == RmaOpKind::Notify) {
    m.kind = kRmaNotify;
    m.generation = value;
  } else {
    o.region = m.region = key->region;
    o.generation = m.generation = key->generation;
    o.offset = m.offset = offset;
    o.length = m.length = bytes;
    const bool is_put = kind == RmaOpKind::Put;
    if (!is_put) o.dst = static_cast<std::byte*>(const_cast<void*>(local));
    if (bytes <= kRmaInlineBytes) {
      m.kind = is_put ? kRmaPut : kRmaGet;
      if (is_put && bytes > 0) {
        const auto* b = static_cast<const std::byte*>(local);
        extra.assign(b, b + bytes);
      }
    } else if (sealed()) {
      // The target's ucp_get_nbx / ucp_put_nbx would move these bytes outside
      // any sealed message.
      return rejectPost(req, invalidArgument("ucx rma on rank {}: a {}-byte {} with rank {}: with CHORUS_WIRE_PROTECT={} "
                                             "one-sided accesses of at most {} bytes are sealed and larger ones are "
                                             "refused (split it, or use two-sided messages)",
                                             rank_, bytes, is_put ? "put" : "get", peer,
                                             auth::wireProtectName(protect_), kRmaInlineBytes));
    } else if (regCacheOn()) {
      // The target moves the bytes: it needs this buffer, and only this
      // buffer, mapped for its access, and the remote key of it (cached).
      const unsigned prot = is_put ? (UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_REMOTE_READ)
                                   : (UCP_MEM_MAP_PROT_LOCAL_WRITE | UCP_MEM_MAP_PROT_REMOTE_WRITE);
      Status err;
      o.cached = regLookup(local, bytes, prot, &err, peer, is_put);
      if (o.cached < 0) return rejectPost(req, err);
      const RegEntry& e = reg_cache_[static_cast<size_t>(o.cached)];
      o.memh = e.memh;
      extra = e.rkey;
      m.kind = is_put ? kRmaPutRkey : kRmaGetRkey;
      m.addr = reinterpret_cast<uint64_t>(local);
    } else {
      // The target moves the bytes: it needs this buffer, and only this
      // buffer, mapped for its access, and the remote key of it.
      ucp_mem_map_params_t mp{};
      mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_PROT;
      mp.address = const_cast<void*>(local);
      mp.length = bytes;
      mp.prot = is_put ? (UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_REMOTE_READ)
                       : (UCP_MEM_MAP_PROT_LOCAL_WRITE | UCP_MEM_MAP_PROT_REMOTE_WRITE);
      ucs_status_t st = api_->ucp_mem_map(fabric_->context, &mp, &o.memh);
      if (st != UCS_OK)
        return rejectPost(req, systemError("ucx rma on rank {}: mapping the {}-byte buffer of a {} for rank {}: {}",
                                           rank_, bytes, is_put ? "put" : "get", peer, api_->text(st)));
      void* rkb = nullptr;
      size_t rks = 0;
      st = api_->ucp_rkey_pack(fabric_->context, o.memh, &rkb, &rks);
      if (st != UCS_OK || rks == 0 || rks > kMaxRkeyBytes) {
        if (st == UCS_OK) api_->ucp_rkey_buffer_release(rkb);
        unmap(o.memh);
        return rejectPost(req, systemError("ucx rma on rank {}: packing the remote key of a buffer for rank {}: {}",
                                           rank_, peer, st != UCS_OK ? api_->text(st) : "a key of an unusable size"));
      }
      const auto* b = static_cast<const std::byte*>(rkb);
      extra.assign(b, b + rks);
      api_->ucp_rkey_buffer_release(rkb);
      m.kind = is_put ? kRmaPutRkey : kRmaGetRkey;
      m.addr = reinterpret_cast<uint64_t>(local);
    }
  }
  m.op = p->next_op++;
  m.extra = static_cast<uint32_t>(extra.size());
  markPosted(req);
  p->origin.emplace(m.op, o);
  sendRma(*p, m, extra.data(), extra.size());
  return {};
}

void UcxTransport::sendRma(Peer& p, const RmaMsg& m, const std::byte* extra, size_t n) {
  if (p.link->ep == nullptr) return;
  Op* op = fabric_->sink.alloc(Op::kSendRma, &p);
  op->buf.resize(sizeof m + n + (sealed() ? kSealTagBytes : 0));
  std::byte* b = op->buf.data();
  std::memcpy(b, &m, sizeof m);
  if (n > 0) std::memcpy(b + sizeof m, extra, n);
  const uint64_t seq = p.rma_send_seq++;
  if (sealed() &&
      !p.link->seal->seal(kChanRma, seq, std::span(b, sizeof m), std::span(b + sizeof m, n), b + sizeof m, b + sizeof m + n)) {
    fabric_->sink.release(op);  // a hole in the stream: the peer is gone for good
    failPeer(p, internalError("ucx rma to rank {}: sealing record {} failed (libcrypto)", p.rank, seq), true,
             deferred_error_);
    return;
  }
  fabric_->sink.send(p.link->ep, rmaTagOut(p, seq), op, nullptr, op->buf.size());
}

void UcxTransport::answer(Peer& p, uint16_t kind, uint64_t op, RmaRefusal why, uint64_t detail,
                          const std::byte* data, size_t n) {
  if (!p.gone.isOk()) return;
  RmaMsg m;
  m.kind = kind;
  m.op = op;
  m.reason = static_cast<uint16_t>(why);
  m.generation = detail;
  m.extra = static_cast<uint32_t>(n);
  m.token = p.link->out.token;
  sendRma(p, m, data, n);
}

void UcxTransport::onRma(Op* op, Status& first_error) {
  Peer& p = *op->peer;
  if (op->status == UCS_ERR_CANCELED || !p.gone.isOk()) {  // what a peer that went still sent is moot
    p.rma_rx = nullptr;
    fabric_->sink.release(op);
    return;
  }
  RmaMsg m;
  if (op->status != UCS_OK || op->length < sizeof m) {
    p.rma_rx = nullptr;
    fabric_->sink.release(op);
    failPeer(p,
             op->status == UCS_OK || op->status == UCS_ERR_MESSAGE_TRUNCATED
                 ? corrupt(p, fmt::format("one-sided record of {} bytes", op->length))
                 : failure(p, op->status, "a one-sided receive from"),
             true, first_error);
    return;
  }
  received(p, kChanRma, op->buf.data(), op->length);
  size_t length = op->length;
  if (sealed()) {
    SealedLayout at;
    if (!sealedRecordLayout(sizeof m, op->length, &at) || !openMessage(p, kChanRma, p.rma_recv_seq, op->buf.data(), at)) {
      const Status why = integrity(p, "one-sided record", p.rma_recv_seq);
      p.rma_rx = nullptr;
      fabric_->sink.release(op);
      failIntegrity(p, why, first_error);
      return;
    }
    length = at.unsealed;
  }
  std::memcpy(&m, op->buf.data(), sizeof m);
  if (m.token != p.link->in.token && !sealed()) {
    stranger(p, "one-sided record");
    fabric_->sink.recv(fabric_->worker, rmaTagIn(p, p.rma_recv_seq), op, op->buf.data(), rmaStage());
    return;
  }
  if (const char* bad = m.token != p.link->in.token ? "a sealed record without the pair's token" : rmaProblem(m, length);
      bad != nullptr) {
    p.rma_rx = nullptr;
    fabric_->sink.release(op);
    failPeer(p, corrupt(p, fmt::format("one-sided record (kind {} op {} region {} offset {} length {}): {}", m.kind,
                                       m.op, m.region, m.offset, m.length, bad)),
             true, first_error);
    return;
  }
  // Handled before the stage is reused by the next receive.
  if (rmaIsRequest(m.kind))
    onRmaRequest(p, m, op->buf.data() + sizeof m, first_error);
  else
    onRmaAnswer(p, m, op->buf.data() + sizeof m, first_error);
  if (!p.gone.isOk()) {
    p.rma_rx = nullptr;
    fabric_->sink.release(op);
    return;
  }
  ++p.rma_recv_seq;
  fabric_->sink.recv(fabric_->worker, rmaTagIn(p, p.rma_recv_seq), op, op->buf.data(), rmaStage());
}

void UcxTransport::onRmaRequest(Peer& p, const RmaMsg& m, const std::byte* extra, Status& first_error) {
  if (m.op != p.expect_op) {
    failPeer(p, corrupt(p, fmt::format("one-sided request: op {} out of order (expected {})", m.op, p.expect_op)),
             true, first_error);
    return;
  }
  ++p.expect_op;
  TargetOp t;
  t.kind = m.kind;
  t.op = m.op;
  t.region = m.region;
  t.generation = m.generation;
  t.offset = m.offset;
  t.length = m.length;
  t.addr = m.addr;
  t.extra.assign(extra, extra + m.extra);
  p.target.push_back(std::move(t));
  serveTarget(p, first_error);
}

// Starts the peer's requests in arrival order, each once nothing before it
// that it could observe is still running: an access waits for earlier ones
// on overlapping bytes of the same region, and a notification (and
// everything after it) for every earlier one.  So the peer's operations take
// effect as if one at a time, in its post order, while independent ones
// overlap.
void UcxTransport::serveTarget(Peer& p, Status& first_error) {
  for (size_t i = 0; i < p.target.size() && p.gone.isOk(); ++i) {
    TargetOp& t = p.target[i];
    if (t.state != TargetOp::kWaiting) continue;
    if (t.kind == kRmaNotify) {
      const bool earlier = std::any_of(p.target.begin(), p.target.begin() + static_cast<ptrdiff_t>(i),
                                       [](const TargetOp& e) { return e.state != TargetOp::kDone; });
      if (earlier) break;
      notes_.emplace_back(p.rank, t.generation);
      t.state = TargetOp::kDone;
      answer(p, kRmaAck, t.op);
      continue;
    }
    bool blocked = false;
    for (size_t j = 0; j < i && !blocked; ++j) {
      const TargetOp& e = p.target[j];
      blocked = e.state != TargetOp::kDone && e.region == t.region && overlaps(e.offset, e.length, t.offset, t.length);
    }
    if (!blocked) startTarget(p, t, first_error);
  }
  while (!p.target.empty() && p.target.front().state == TargetOp::kDone) p.target.pop_front();
}

// One request of the peer: checked in the region table before a byte of the
// region moves.
void UcxTransport::startTarget(Peer& p, TargetOp& t, Status& first_error) {
  const bool is_put = t.kind == kRmaPut || t.kind == kRmaPutRkey;
  RmaRefusal why = RmaRefusal::None;
  uint64_t detail = 0;
  std::byte* mem = regions_.resolve(t.region, t.generation, t.offset, t.length, is_put ? Access::Write : Access::Read,
                                    &why, &detail);
  if (mem == nullptr) {
    t.state = TargetOp::kDone;
    answer(p, kRmaError, t.op, why, detail);
    return;
  }
  switch (t.kind) {
    case kRmaPut:
      if (t.length > 0) std::memcpy(mem, t.extra.data(), t.length);
      t.state = TargetOp::kDone;
      answer(p, kRmaAck, t.op);
      return;
    case kRmaGet:
      t.state = TargetOp::kDone;
      answer(p, kRmaGetData, t.op, RmaRefusal::None, 0, mem, t.length);
      return;
    default: break;
  }
  // A large access: the bytes move between the region and the origin's
  // buffer, which only the origin's remote key opens (an authenticated
  // peer's bytes, still parsed by UCP alone).
  ucp_rkey_h rkey = nullptr;
  const ucs_status_t st = api_->ucp_ep_rkey_unpack(p.link->ep, t.extra.data(), &rkey);
  if (st != UCS_OK) {
    t.state = TargetOp::kDone;
    failPeer(p, corrupt(p, fmt::format("remote key with its one-sided op {}: {}", t.op, api_->text(st))), true,
             first_error);
    return;
  }
  Op* mv = fabric_->sink.alloc(Op::kRmaMove, &p);
  mv->rma_op = t.op;
  mv->rkey = rkey;
  t.state = TargetOp::kRunning;
  const ucp_mem_h memh = regionMemh(t.region, t.generation);
  if (is_put)
    fabric_->sink.get(p.link->ep, mem, t.length, t.addr, rkey, memh, mv);
  else
    fabric_->sink.put(p.link->ep, mem, t.length, t.addr, rkey, memh, mv);
}

TargetOp* UcxTransport::findTarget(Peer& p, uint64_t op) {
  for (TargetOp& t : p.target)
    if (t.op == op) return &t;
  return nullptr;
}

void UcxTransport::onMove(Op* op, Status& first_error) {
  Peer& p = *op->peer;
  if (op->rkey != nullptr) api_->ucp_rkey_destroy(op->rkey);
  op->rkey = nullptr;
  TargetOp* t = findTarget(p, op->rma_op);
  const ucs_status_t st = op->status;
  const uint64_t n = op->rma_op;
  fabric_->sink.release(op);
  if (t == nullptr) return;
  if (!p.gone.isOk()) {  // nobody to answer
    t->state = TargetOp::kDone;
    return;
  }
  if (st != UCS_OK) {
    t->state = TargetOp::kDone;
    if (p.gone.isOk())
      failPeer(p, remoteError("ucx rma: rank {}: moving the bytes of its one-sided op {} failed: {} (its buffer or "
                              "remote key is bad, or its endpoint failed)", p.rank, n, api_->text(st)),
               true, first_error);
    serveTarget(p, first_error);
    return;
  }
  if (t->kind == kRmaPutRkey) {
    t->state = TargetOp::kDone;
    answer(p, kRmaAck, n);
  } else {
    // The put completed here; the flush makes it complete in the origin's
    // memory before the acknowledgement says so.
    Op* fl = fabric_->sink.alloc(Op::kRmaFlush, &p);
    fl->rma_op = n;
    fabric_->sink.flush(p.link->ep, fl);
  }
  serveTarget(p, first_error);
}

void UcxTransport::onFlush(Op* op, Status& first_error) {
  Peer& p = *op->peer;
  TargetOp* t = findTarget(p, op->rma_op);
  const ucs_status_t st = op->status;
  const uint64_t n = op->rma_op;
  fabric_->sink.release(op);
  if (t == nullptr) return;
  t->state = TargetOp::kDone;
  if (st == UCS_OK)
    answer(p, kRmaAck, n);
  else if (p.gone.isOk())
    failPeer(p, failure(p, st, "a one-sided flush to"), true, first_error);
  serveTarget(p, first_error);
}

void UcxTransport::onRmaAnswer(Peer& p, const RmaMsg& m, const std::byte* extra, Status& first_error) {
  auto it = p.origin.find(m.op);
  if (it == p.origin.end()) {
    failPeer(p, corrupt(p, fmt::format("one-sided answer (kind {}) to op {}, which this rank does not await", m.kind,
                                       m.op)),
             true, first_error);
    return;
  }
  OriginOp& o = it->second;
  const bool small_get = o.kind == RmaOpKind::Get && o.memh == nullptr;
  const char* bad = nullptr;
  if (m.kind == kRmaGetData && (!small_get || m.extra != o.length)) bad = "get data that does not fit the get it answers";
  if (m.kind == kRmaAck && small_get) bad = "an acknowledgement where a get's data belongs";
  if (m.kind == kRmaError && o.kind == RmaOpKind::Notify) bad = "a refused notification";
  if (bad != nullptr) {
    failPeer(p, corrupt(p, fmt::format("one-sided answer to op {}: {}", m.op, bad)), true, first_error);
    return;
  }
  Request* req = o.req;
  if (m.kind == kRmaError) {
    req->fail(rmaRefused("ucx", o.kind, rank_, p.rank, o.region, o.generation, o.offset, o.length,
                         static_cast<RmaRefusal>(m.reason), m.generation));
  } else {
    if (m.kind == kRmaGetData && m.extra > 0) std::memcpy(o.dst, extra, m.extra);
    req->complete();
  }
  regRelease(o);
  p.origin.erase(it);
}

// The peer went: its endpoint is closed (so it can no longer reach a mapped
// buffer), and what this rank awaited from it fails.
void UcxTransport::failOrigin(Peer& p, const Status& why) {
  for (auto& [n, o] : p.origin) {
    o.req->fail(why);
    regRelease(o);
  }
  p.origin.clear();
}

// ---- the registration cache ----

bool UcxTransport::regCacheOn() {
  if (reg_tried_) return reg_hooked_;
  reg_tried_ = true;
#if !CHORUS_UCX_REG_CACHE
  // UCX's memory hooks patch munmap and friends under the sanitizers'
  // interceptors: not combined; every access maps its buffer.
  return false;
#else
  if (api_->ucm_set_event_handler == nullptr) return false;
  reg_cache_.reserve(kRegCacheEntries);
  reg_hooked_ = api_->ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, 1000, &UcxTransport::onUnmapped, this) == UCS_OK;
  if (!reg_hooked_)
    log::info("ucx transport rank {}: UCX's memory events are off (UCX_MEM_EVENTS?): no registration cache", rank_);
  return reg_hooked_;
#endif
}

// UCX's memory event (inside munmap, free, brk, madvise; any thread): only
// records the range.
void UcxTransport::onUnmapped(ucm_event_type_t, ucm_event_t* event, void* arg) {
  auto* t = static_cast<UcxTransport*>(arg);
  const auto addr = reinterpret_cast<uintptr_t>(event->vm_unmapped.address);
  const size_t size = event->vm_unmapped.size;
  std::lock_guard lock(t->unmapped_mu_);
  if (t->unmapped_n_ < kUnmappedSlots)
    t->unmapped_[t->unmapped_n_++] = {addr, size};
  else
    t->unmapped_overflow_ = true;  // too many to keep: every entry is dropped
  t->unmapped_pending_.store(true, std::memory_order_release);
}

// Marks the entries whose buffers lost a byte stale, and unmaps the unused ones.
void UcxTransport::drainUnmapped() {
  if (!unmapped_pending_.load(std::memory_order_acquire)) return;
  std::array<std::pair<uintptr_t, size_t>, kUnmappedSlots> ranges;
  size_t n = 0;
  bool all = false;
  {
    std::lock_guard lock(unmapped_mu_);
    n = unmapped_n_;
    std::copy_n(unmapped_.begin(), n, ranges.begin());
    all = unmapped_overflow_;
    unmapped_n_ = 0;
    unmapped_overflow_ = false;
    unmapped_pending_.store(false, std::memory_order_release);
  }
  for (RegEntry& e : reg_cache_) {
    if (e.stale) continue;
    bool hit = all;
    for (size_t i = 0; i < n && !hit; ++i) hit = overlaps(e.addr, e.length, ranges[i].first, ranges[i].second);
    if (hit) {
      e.stale = true;
      ++reg_stats_.invalidated;
    }
  }
  for (size_t i = reg_cache_.size(); i-- > 0;)
    if (reg_cache_[i].stale && reg_cache_[i].users == 0) regEvict(i);
}

void UcxTransport::regEvict(size_t i) {
  unmap(reg_cache_[i].memh);
  // Indices of entries in use must not move: the last one takes the slot
  // only when nobody uses it, else the slot stays as a tombstone.
  const size_t last = reg_cache_.size() - 1;
  if (i != last && reg_cache_[last].users == 0) {
    reg_cache_[i] = std::move(reg_cache_[last]);
    reg_cache_.pop_back();
  } else if (i == last) {
    reg_cache_.pop_back();
  } else {
    reg_cache_[i] = RegEntry{};
    reg_cache_[i].stale = true;  // a free slot
  }
}

int UcxTransport::regLookup(const void* addr, size_t length, unsigned prot, Status* err, int peer, bool is_put) {
  drainUnmapped();
  const auto a = reinterpret_cast<uintptr_t>(addr);
  for (size_t i = 0; i < reg_cache_.size(); ++i) {
    RegEntry& e = reg_cache_[i];
    if (!e.stale && e.memh != nullptr && e.addr == a && e.length == length && e.prot == prot) {
      ++e.users;
      e.last_use = ++reg_clock_;
      ++reg_stats_.hits;
      return static_cast<int>(i);
    }
  }
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_PROT;
  mp.address = const_cast<void*>(addr);
  mp.length = length;
  mp.prot = prot;
  RegEntry e;
  e.addr = a;
  e.length = length;
  e.prot = prot;
  ucs_status_t st = api_->ucp_mem_map(fabric_->context, &mp, &e.memh);
  if (st != UCS_OK) {
    *err = systemError("ucx rma on rank {}: mapping the {}-byte buffer of a {} for rank {}: {}", rank_, length,
                       is_put ? "put" : "get", peer, api_->text(st));
    return -1;
  }
  void* rkb = nullptr;
  size_t rks = 0;
  st = api_->ucp_rkey_pack(fabric_->context, e.memh, &rkb, &rks);
  if (st != UCS_OK || rks == 0 || rks > kMaxRkeyBytes) {
    if (st == UCS_OK) api_->ucp_rkey_buffer_release(rkb);
    unmap(e.memh);
    *err = systemError("ucx rma on rank {}: packing the remote key of a buffer for rank {}: {}", rank_, peer,
                       st != UCS_OK ? api_->text(st) : "a key of an unusable size");
    return -1;
  }
  const auto* b = static_cast<const std::byte*>(rkb);
  e.rkey.assign(b, b + rks);
  api_->ucp_rkey_buffer_release(rkb);
  e.users = 1;
  e.last_use = ++reg_clock_;
  ++reg_stats_.maps;
  // Full: the least recently used entry nobody uses goes.
  size_t live = 0;
  for (const RegEntry& x : reg_cache_) live += x.memh != nullptr ? 1 : 0;
  if (live >= kRegCacheEntries) {
    size_t victim = reg_cache_.size();
    for (size_t i = 0; i < reg_cache_.size(); ++i)
      if (reg_cache_[i].memh != nullptr && reg_cache_[i].users == 0 &&
          (victim == reg_cache_.size() || reg_cache_[i].last_use < reg_cache_[victim].last_use))
        victim = i;
    if (victim < reg_cache_.size()) {
      unmap(reg_cache_[victim].memh);
      reg_cache_[victim] = RegEntry{};
      reg_cache_[victim].stale = true;
    }
  }
  for (size_t i = 0; i < reg_cache_.size(); ++i)
    if (reg_cache_[i].memh == nullptr && reg_cache_[i].users == 0) {  // a free slot
      reg_cache_[i] = std::move(e);
      return static_cast<int>(i);
    }
  reg_cache_.push_back(std::move(e));
  return static_cast<int>(reg_cache_.size() - 1);
}

// The access is over: a cached mapping stays (unmapped if its buffer went),
// a private one goes.
void UcxTransport::regRelease(OriginOp& o) {
  if (o.cached < 0) {
    unmap(o.memh);
    return;
  }
  RegEntry& e = reg_cache_[static_cast<size_t>(o.cached)];
  o.cached = -1;
  o.memh = nullptr;
  if (--e.users == 0 && e.stale) {
    unmap(e.memh);
    e = RegEntry{};
    e.stale = true;
  }
}

}  // namespace

UcxRegistrationStats ucxRegistrationStats(const Transport& t) {
  const auto* u = dynamic_cast<const UcxTransport*>(&t);
  return u != nullptr ? u->regStats() : UcxRegistrationStats{};
}

std::string ucxConfigChanges(const Transport& t) {
  const auto* u = dynamic_cast<const UcxTransport*>(&t);
  return u != nullptr ? u->configChanges() : std::string();
}

std::string ucxEndpointInfo(const Transport& t, int peer) {
  const auto* u = dynamic_cast<const UcxTransport*>(&t);
  return u != nullptr ? u->endpointInfo(peer) : std::string();
}

Result<std::unique_ptr<Transport>> createUcxTransport(const UcxSetup& setup, bootstrap::Store& store) {
  CHORUS_ASSIGN_OR_RETURN(std::unique_ptr<Fabric> fabric, establish(setup, store));
  auto t = std::make_unique<UcxTransport>(std::move(fabric), setup);
  CHORUS_RETURN_IF_ERROR(t->init());
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace chorus::transport
