// The TCP transport's data path.
//
// Frame format (per message, per ordered pair of ranks):
//   socket 0:   header {magic u32 = "CTF1", flags u32 = 0, length u64} (16 bytes,
//               little endian) followed by socket 0's share of the payload;
//   socket s>0: socket s's share of the payload, nothing else.
// The payload is cut into 256 KiB pieces; piece k travels on socket
// k % sockets_per_peer (with one socket, all of it on socket 0).  A message of
// at most one piece therefore only uses socket 0.  Both ends compute the
// shares from the header's length, so the receiver learns the layout from
// socket 0 and never needs a header on the others; every socket carries its
// shares of consecutive messages in message order, which keeps the pair FIFO.
//
// Rendezvous (messages of at least CHORUS_TCP_RENDEZVOUS_BYTES; tcp_wire.hpp
// has the headers): socket 0 carries an RTS header in the message's place;
// the payload (socket 0: a kFlagData header, then its share; other sockets:
// their shares) waits at the head of each socket's queue, holding later
// messages behind it, until the peer's cumulative grant covers the message.
// Grants (CTS headers) are written on socket 0 at a frame boundary of this
// side's own stream — also right after an RTS whose payload waits, so two
// ranks that announce to each other still grant each other — and read at a
// frame boundary whenever a receive, an announced payload or a send waiting
// for a grant needs socket 0 (a message header read then stays staged until
// its receive is posted).  Why: a send that completes once it is in the
// kernel's buffer lets a partner a round ahead push data onto this host's
// link while this round's data still arrives (docs/simulator.md, "Real runs").
//
// Receiving: a socket is read only while a receive is posted that expects
// bytes on it (TCP's window is the back-pressure; nothing unexpected is
// buffered).  The header is validated before a payload byte reaches user
// memory: bad magic, unknown flags or a length over 2^48 break the
// connection; a length different from the posted receive's fails that
// receive with chorusMismatch and the payload is read and discarded, so the
// stream stays in step and later messages still match.  Small receives read
// header and payload with one syscall into a staging buffer (bounded by the
// posted length, so an over-read can only happen on a mismatch and is pushed
// back for the next frame).  Copies land straight in the destination
// (readv); reductions go through one bounce buffer per transport, handing the
// reducer whole elements and carrying partial ones over per socket.
//
// One-sided operations (TcpSetup::rma; rma.hpp): a connection per pair of
// their own, always read when there is anything on it (an epoll set of those
// connections, nested in the wait set; poll() asks it while one-sided work is
// outstanding, after a wait() it woke, and every 64th call otherwise).  The
// frames and the checks are in tcp_wire.hpp; the section "one-sided" below
// has the code.
//
// Threading: everything but wake() and abort() runs on the executor thread;
// abort() publishes its status under a mutex and an atomic flag, and both
// write the eventfd that wait() watches.
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>

#include "bootstrap/wire_protect.hpp"
#include "common/log.hpp"
#include "transport/rma.hpp"
#include "transport/tcp/tcp.hpp"
#include "transport/tcp/tcp_setup.hpp"
#include "transport/tcp/tcp_wire.hpp"

namespace chorus::transport {
namespace {

// One non-blocking gather write of cnt pieces, retried on EINTR: the bytes
// written, or -1 with errno set.
ssize_t sendIov(int fd, iovec* iov, int cnt) {
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<size_t>(cnt);
  ssize_t n;
  do {
    n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  return n;
}

// A connection's I/O, through its record layer when CHORUS_WIRE_PROTECT
// seals it (bootstrap/wire_protect.hpp: the same semantics as the calls).
inline ssize_t ioWritev(auth::SealedStream* sealed, int fd, iovec* iov, int cnt) {
  return sealed != nullptr ? sealed->writev(fd, iov, cnt) : sendIov(fd, iov, cnt);
}
inline ssize_t ioReadv(auth::SealedStream* sealed, int fd, iovec* iov, int cnt) {
  if (sealed != nullptr) return sealed->readv(fd, iov, cnt);
  ssize_t n;
  do {
    n = ::readv(fd, iov, cnt);
  } while (n < 0 && errno == EINTR);
  return n;
}
inline ssize_t ioRecv(auth::SealedStream* sealed, int fd, void* buf, size_t len) {
  iovec iov{buf, len};
  return ioReadv(sealed, fd, &iov, 1);
}
// Sealed bytes taken but not sent yet: the connection wants POLLOUT.
inline bool sealedPending(const std::unique_ptr<auth::SealedStream>& s) { return s && s->outPending(); }
// Plaintext already read ahead: readable without the socket.
inline bool sealedBuffered(const std::unique_ptr<auth::SealedStream>& s) { return s && s->inBuffered(); }

using tcp::FrameHeader;
using tcp::kHeaderBytes;
using tcp::Ring;

// Receives up to this size are read together with their header.
constexpr size_t kSmallBytes = 4096 - kHeaderBytes;
constexpr size_t kBounceBytes = 256 * 1024;
constexpr int kMaxIov = 64;
// poll() returns after this many passes over the peers even if data keeps
// arriving, so the executor gets to post more work.
constexpr int kMaxPasses = 8;
// From this many sockets awaiting data on, poll() asks epoll which are
// readable instead of trying each: a read that finds nothing costs ~0.7 us on
// loopback TCP, epoll_wait(0) ~0.25 us, so one socket (the latency case) is
// tried directly and an all-to-all is not charged a syscall per idle peer.
constexpr int kHintMinSockets = 3;
// Socket buffers we ask for when the system allows it (see tuneBuffers).
constexpr int kSocketBufferBytes = 4 << 20;

// A posted send or receive.  Lives in the transport's pool from post until
// its request finishes; the socket queues point at it.
struct Op {
  Request* req = nullptr;
  const std::byte* src = nullptr;  // send
  std::byte* dst = nullptr;        // receive
  const std::byte* accum = nullptr;
  const kernels::Reducer* reducer = nullptr;
  uint64_t len = 0;
  int pending = 0;  // sockets that still carry part of it
  uint64_t seq = 0;  // index in the pair's stream (this direction for sends, the other for receives)
  bool rdv = false;  // send: waits for the receiver's grant before its payload
  FrameHeader hdr;   // send: the header socket 0 writes (kFlagRts for a rendezvous send)
  FrameHeader hdr2;  // rendezvous send: the kFlagData header that starts socket 0's payload
};

// One socket's part of one message.  Send streams on socket 0 start with
// the header; receive streams never do (socket 0 reads it before matching).
// op == nullptr: payload of a mismatched message, read and discarded.
struct Entry {
  Op* op = nullptr;
  uint64_t len = 0;    // the whole message's length (for the layout)
  uint64_t done = 0;   // stream bytes moved so far
  uint64_t total = 0;  // stream bytes of this message on this socket
};

struct Sock {
  net::Fd fd;
  std::unique_ptr<auth::SealedStream> sealed;  // CHORUS_WIRE_PROTECT: the record layer over fd
  int index = 0;
  uint32_t epoll_mask = 0;  // registered events in the wait set; 0 = not in it
  bool readable = true;     // poll(): may have data (the hint set said so, or no hint was taken)
  Ring<Entry> tx;
  Ring<Entry> rx;
  std::array<std::byte, 16> carry{};  // a partial element between reads (reduce)
  size_t carry_len = 0;
};

// ---- one-sided state ----

// A one-sided operation this rank posted, until its answer.
struct RmaOp {
  RmaOpKind kind = RmaOpKind::Put;
  Request* req = nullptr;
  tcp::RmaFrame hdr;               // the request as it goes on the wire
  const std::byte* src = nullptr;  // put: the payload
  std::byte* dst = nullptr;        // get
};

// An answer this rank owes the peer: a header, and for a get its data from
// the region (or, once the region was deregistered, from `own`).
struct RmaAnswer {
  tcp::RmaFrame hdr;
  const std::byte* src = nullptr;
  bool from_region = false;
  uint32_t region = 0;
  uint64_t generation = 0;
  std::vector<std::byte> own;
};

// Payload bytes after a one-sided header.
constexpr uint64_t rmaPayload(const tcp::RmaFrame& h) {
  return h.kind == tcp::kRmaPut || h.kind == tcp::kRmaGetData ? h.length : 0;
}

static_assert(tcp::kRmaMaxReason == static_cast<uint16_t>(RmaRefusal::Last), "tcp_wire.hpp's refusal range");

// Payloads at least this long are read straight into their destination.
constexpr uint64_t kRmaDirectBytes = 16 * 1024;
constexpr size_t kRmaStageBytes = 64 * 1024;
constexpr uint64_t kRmaPassBytes = 4 << 20;  // per peer and direction per poll(), so others are not starved

// A pair's one-sided connection (tcp_wire.hpp).
struct RmaLink {
  net::Fd fd;
  std::unique_ptr<auth::SealedStream> sealed;  // CHORUS_WIRE_PROTECT
  bool closed = false;  // the peer closed it while nothing was outstanding (its transport is gone)
  uint32_t epoll_mask = 0;
  // Origin: our operations in post order until answered; ops[0, written)
  // are on the wire whole.
  Ring<RmaOp> ops;
  size_t written = 0;
  uint64_t next_op = 1;
  // Target: the number the peer's next request carries, and what we owe it.
  uint64_t expect = 1;
  Ring<RmaAnswer> answers;
  // The frame being written: from answers (1) or ops (2), and its bytes out.
  int tx_queue = 0;
  uint64_t tx_done = 0;
  // Reading: a staging buffer of what arrived, and the payload being read
  // (a put's into the region, or discarded when dst is null; a get's data).
  std::vector<std::byte> buf;
  size_t off = 0;
  size_t len = 0;
  bool in_payload = false;
  bool payload_put = false;
  std::byte* dst = nullptr;
  uint64_t left = 0;
  RmaRefusal why = RmaRefusal::None;
  uint64_t detail = 0;
  uint32_t region = 0;
  uint64_t generation = 0;

  [[nodiscard]] bool txPending() const {
    return tx_queue != 0 || !answers.empty() || written < ops.size() || sealedPending(sealed);
  }
  [[nodiscard]] bool busy() const { return !ops.empty() || txPending() || in_payload || off < len; }
};

struct Peer {
  int rank = -1;
  std::string addr;
  std::vector<Sock> socks;
  RmaLink rma;  // TcpSetup::rma: the one-sided connection
  Ring<Op*> unmatched;  // posted receives whose header has not arrived
  // Socket 0's header stage: the header, plus a small message's payload.
  std::vector<std::byte> stage;
  size_t stage_len = 0;
  bool header_parsed = false;
  // Bytes read past a mismatched small frame, replayed before the socket.
  std::vector<std::byte> pushback;
  size_t pushback_off = 0;
  size_t pushback_len = 0;
  bool failed = false;
  Status error;
  // Rendezvous, sending side: messages with seq < granted may stream.
  uint64_t send_seq = 0;
  uint64_t granted = 0;
  // Rendezvous, receiving side: the grant to tell the peer, what was told,
  // and the CTS header being written on socket 0.
  uint64_t recv_seq = 0;
  uint64_t grant_want = 0;
  uint64_t grant_sent = 0;
  FrameHeader ctl;
  size_t ctl_done = 0;
  bool ctl_active = false;
  // A matched RTS whose kFlagData header has not arrived (rdv_op == nullptr:
  // the receive failed with a mismatch and the payload is discarded).
  bool rdv_wait = false;
  Op* rdv_op = nullptr;
  uint64_t rdv_len = 0;

  [[nodiscard]] bool ctlPending() const { return ctl_active || grant_want > grant_sent; }

  // A rendezvous send at the head of a socket waits for a grant.
  [[nodiscard]] bool awaitingGrant() const {
    for (const Sock& s : socks)
      if (!s.tx.empty() && s.tx[0].op->rdv && s.tx[0].op->seq >= granted) return true;
    return false;
  }

  // Socket 0 should be read at its frame boundary: a receive waits for its
  // header, a rendezvous payload for its kFlagData header, or a send for a
  // grant (then only up to the next header, which stays staged).
  [[nodiscard]] bool frameWanted() const {
    return !unmatched.empty() || rdv_wait || (stage_len < kHeaderBytes && awaitingGrant());
  }

  [[nodiscard]] bool busy() const {
    if (!unmatched.empty() || rdv_wait || ctlPending()) return true;
    for (const Sock& s : socks)
      if (!s.tx.empty() || !s.rx.empty()) return true;
    return false;
  }
};

std::string describeErrno(int err) {
  char buf[128];
  return strerror_r(err, buf, sizeof buf);
}

// Asks for big socket buffers only where the system grants them: setting
// SO_RCVBUF turns off the kernel's autotuning, so a request capped at a small
// net.core.rmem_max would make the buffer smaller, not bigger.
void tuneBuffers(int fd) {
  auto sysMax = [](const char* path) {
    long v = 0;
    if (FILE* f = std::fopen(path, "re")) {
      if (std::fscanf(f, "%ld", &v) != 1) v = 0;
      std::fclose(f);
    }
    return v;
  };
  static const bool rcv_ok = sysMax("/proc/sys/net/core/rmem_max") >= kSocketBufferBytes;
  static const bool snd_ok = sysMax("/proc/sys/net/core/wmem_max") >= kSocketBufferBytes;
  int size = kSocketBufferBytes;
  if (rcv_ok) (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  if (snd_ok) (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
}

// Heartbeat: a peer host that vanishes (powered off, cable pulled, network
// namespace deleted) sends no FIN or RST.  TCP keepalive probes an idle
// connection every CHORUS_HEARTBEAT_MS and gives up after 2 unanswered probes;
// a connection with data in flight is watched by the transport itself
// (TcpTransport::checkLiveness: no acknowledgement for 3 x
// CHORUS_HEARTBEAT_MS while the kernel retransmits or probes), so a dead peer
// is noticed within about 3 x CHORUS_HEARTBEAT_MS either way.
//
// Not TCP_USER_TIMEOUT: it also fails a connection whose live peer merely
// does not read for that long (its window is zero and it answers every
// window probe), i.e. a rank that computes for a few seconds while a large
// message waits for it.
void setHeartbeat(int fd, int heartbeat_ms) {
  if (heartbeat_ms <= 0) return;
  const int on = 1, secs = std::max(1, heartbeat_ms / 1000), probes = 2;
  (void)::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &secs, sizeof secs);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &secs, sizeof secs);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
}

// Whether the peer of fd looks dead: no acknowledgement for dead_ms while the
// kernel keeps retransmitting unacknowledged data (an RTO fired twice) or
// keeps sending zero-window probes nobody answers.  A live peer's kernel
// acknowledges data and answers window probes even when the rank does not
// read, so neither condition holds for it.
bool peerLooksDead(int fd, int dead_ms, unsigned* silent_ms) {
  tcp_info info{};
  socklen_t len = sizeof info;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
  *silent_ms = info.tcpi_last_ack_recv;
  if (info.tcpi_last_ack_recv <= static_cast<unsigned>(dead_ms)) return false;
  return (info.tcpi_unacked > 0 && info.tcpi_retransmits >= 2) || info.tcpi_probes >= 2;
}

class TcpTransport final : public Transport, public PostedRma {
 public:
  TcpTransport(int rank, int nsockets, int heartbeat_ms, uint64_t rendezvous_bytes, bool rma)
      : rank_(rank),
        nsockets_(nsockets),
        heartbeat_ms_(heartbeat_ms),
        rdv_bytes_(rendezvous_bytes == 0 ? 0 : std::max(rendezvous_bytes, tcp::kMinRendezvousBytes)),
        bounce_(kBounceBytes),
        rma_enabled_(rma),
        regions_(rmaTransportTag("tcp"), rank) {}

  // Reads what peers sent and nobody took before the sockets close: a close
  // with unread data resets the connection, and a peer's kernel then drops
  // what it has not delivered yet — the abort frame that says why.
  ~TcpTransport() override {
    for (Peer& p : peers_) {
      for (Sock& sk : p.socks) drainUnread(sk);
      drainFd(p.rma.fd);
    }
  }

  Status init(std::vector<tcp::PeerLink> links, std::chrono::microseconds spin);

  [[nodiscard]] std::string_view name() const override { return "tcp"; }

  Status postSend(int peer, const void* src, size_t bytes, Request* req) override;
  Status postRecv(int peer, const RecvTarget& target, Request* req) override;
  Result<bool> poll() override;
  void wait(std::chrono::microseconds timeout) override;
  void wake() override;
  void abort(const Status& why) override;

  // Rma (rma.hpp)
  Rma* rma() override { return rma_enabled_ ? this : nullptr; }
  Result<RegionId> registerRegion(void* base, size_t bytes, Access access) override {
    return regions_.add(base, bytes, access);
  }
  Status deregisterRegion(RegionId id) override;
  Result<std::vector<std::byte>> packKey(RegionId id) override { return regions_.pack(id); }
  Result<RemoteKey> unpackKey(int peer, std::span<const std::byte> blob) override {
    const bool ok = peer >= 0 && static_cast<size_t>(peer) < index_of_.size() && index_of_[static_cast<size_t>(peer)] >= 0;
    return regions_.unpack(peer, ok, blob);
  }
  Result<bool> takeNotification(int* peer, uint64_t* value) override;

 private:
  static constexpr uint64_t kWakeTag = ~uint64_t{0};
  static constexpr uint64_t kRmaTag = ~uint64_t{0} - 1;

  // ---- posting ----

  Result<Peer*> peerForPost(int peer, Request* req, std::string_view what);
  static Status rejectPost(Request* req, Status why);
  static void markPosted(Request* req);
  Status unclaimedCheck(const Peer& p) const;
  void noteCall(uint64_t sig);
  Op* allocOp();
  void releaseOp(Op* op) { free_ops_.push_back(op); }
  void partDone(Op* op);

  // ---- progress ----

  void takeReadHint();
  Status progressPeer(Peer& p, bool& moved);
  static uint64_t headerBytes(const Op* op, int index);
  static uint64_t sendLimit(const Peer& p, const Entry& e, int index);
  static bool atBoundary(const Sock& s);
  static bool hasWritable(const Peer& p, const Sock& s);
  Result<int> writeSome(Peer& p, Sock& s);
  Result<int> readFrame(Peer& p);
  Status corrupt(const Peer& p, const FrameHeader& h, std::string_view why) const;
  void consumeHeader(Peer& p);
  void unread(Peer& p, const std::byte* src, size_t n);
  void matchRendezvous(Peer& p, Op* op, uint64_t len, uint64_t sig);
  Status mismatchStatus(const Peer& p, const Op* op, uint64_t len, uint64_t sig) const;
  void mismatch(Peer& p, Op* op, uint64_t len, uint64_t sig);
  Result<int> readEntry(Peer& p, Sock& s);
  static void deliver(Op* op, uint64_t off, const std::byte* src, size_t bytes);
  Result<size_t> readv(Peer& p, Sock& s, iovec* iov, int cnt);
  Status pendingAbort(const Peer& p) const;
  std::string pendingAbortReason(const Peer& p, uint64_t* code) const;
  Status connectionError(const Peer& p, const Sock& s, int err) const;

  // ---- failure ----

  void checkLiveness(Status& first_error);
  void failPeer(Peer& p, const Status& why);
  void sendAbortFrame(Peer& p, const Status& why);
  Status applyAbort();
  static void drainUnread(const Sock& sk);
  static void drainFd(const net::Fd& fd);

  // ---- one-sided ----

  Status postRma(int peer, RmaOpKind kind, const void* local, size_t bytes, const RemoteKey* key, uint64_t offset,
                 uint64_t value, Request* req) override;
  [[gnu::noinline]] void progressRma(bool& progressed, Status& first_error);  // out of poll()'s hot path
  Result<int> writeRma(Peer& p);
  void rmaInterest(Peer& p);
  Status readRma(Peer& p, bool& progressed);
  Status rmaHeader(Peer& p, const tcp::RmaFrame& h);
  Status rmaPayloadDone(Peer& p);
  Status rmaEnd(Peer& p);
  Status rmaCorrupt(const Peer& p, const tcp::RmaFrame& h, std::string_view why) const;
  Status rmaConnectionError(const Peer& p, int err) const;
  static void rmaAnswer(RmaLink& l, uint16_t kind, uint64_t op, RmaRefusal why = RmaRefusal::None,
                        uint64_t detail = 0);

  uint64_t current_sig_ = 0;  // the collective call of the latest request (noteCall)
  const int rank_;
  const int nsockets_;
  const int heartbeat_ms_;
  const uint64_t rdv_bytes_;  // 0: no rendezvous
  std::chrono::steady_clock::time_point next_liveness_check_{};
  std::vector<Peer> peers_;
  std::vector<int> index_of_;  // rank -> index in peers_, -1 for non-peers
  std::vector<std::byte> bounce_;
  std::vector<std::unique_ptr<Op[]>> op_chunks_;
  std::vector<Op*> free_ops_;
  std::chrono::microseconds spin_{50};  // TcpSetup::spin: wait() polls this long before it sleeps
  net::Fd epoll_;       // wait(): sockets with posted work, and the eventfd
  net::Fd hint_epoll_;  // poll(): every socket's input, to skip idle ones
  net::Fd wake_fd_;

  std::atomic<bool> aborted_{false};
  std::mutex abort_mu_;
  Status abort_status_;  // guarded by abort_mu_
  bool abort_applied_ = false;

  // One-sided: on with TcpSetup::rma.  rma_epoll_ holds every one-sided
  // connection (input always, output while something waits to go out) and
  // is itself in epoll_ (kRmaTag).
  const bool rma_enabled_;
 public:
  auth::WireProtect protect_ = auth::WireProtect::kOff;  // set before init()
 private:
  RegionTable regions_;
  std::deque<std::pair<int, uint64_t>> notes_;  // notifications not taken yet
  net::Fd rma_epoll_;
  bool rma_hint_ = false;   // wait() saw one-sided traffic
  bool rma_again_ = false;  // a pass stopped at its budget with work left
  bool rma_busy_ = false;   // one-sided operations or answers outstanding
  uint32_t rma_tick_ = 0;
};

// The members are defined `inline`, as they were while the class body held
// them: GCC gives functions declared inline a larger inlining budget, and the
// progress loop relies on hasWritable, readv, deliver and the like being
// inlined into it (the object code is the same as with in-class definitions).

inline Status TcpTransport::init(std::vector<tcp::PeerLink> links, std::chrono::microseconds spin) {
  spin_ = std::max(spin, std::chrono::microseconds(0));
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) return errnoError("epoll_create1 (tcp transport)", errno);
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_.valid()) return errnoError("eventfd (tcp transport)", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeTag;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev) != 0)
    return errnoError("epoll_ctl (tcp transport eventfd)", errno);

  hint_epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!hint_epoll_.valid()) return errnoError("epoll_create1 (tcp transport)", errno);
  if (rma_enabled_) {
    rma_epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!rma_epoll_.valid()) return errnoError("epoll_create1 (tcp transport, one-sided)", errno);
    epoll_event rev{};
    rev.events = EPOLLIN;
    rev.data.u64 = kRmaTag;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, rma_epoll_.get(), &rev) != 0)
      return errnoError("epoll_ctl (tcp transport, one-sided set)", errno);
  }

  peers_.resize(links.size());
  int max_rank = 0;
  for (const auto& l : links) max_rank = std::max(max_rank, l.rank);
  index_of_.assign(static_cast<size_t>(max_rank) + 1, -1);
  for (size_t i = 0; i < links.size(); ++i) {
    Peer& p = peers_[i];
    p.rank = links[i].rank;
    p.addr = links[i].addr;
    index_of_[static_cast<size_t>(p.rank)] = static_cast<int>(i);
    p.stage.resize(kHeaderBytes + kSmallBytes);
    p.pushback.resize(kSmallBytes);
    p.socks.resize(links[i].socks.size());
    for (size_t k = 0; k < p.socks.size(); ++k) {
      Sock& s = p.socks[k];
      s.fd = std::move(links[i].socks[k]);
      s.index = static_cast<int>(k);
      if (protect_ != auth::WireProtect::kOff)
        s.sealed = std::make_unique<auth::SealedStream>(protect_, links[i].keys.at(k));
      CHORUS_RETURN_IF_ERROR(net::setNonBlocking(s.fd.get(), true));
      CHORUS_RETURN_IF_ERROR(net::setNoDelay(s.fd.get()));
      tuneBuffers(s.fd.get());
      setHeartbeat(s.fd.get(), heartbeat_ms_);
      // The hint set watches every socket's input all the time; only poll()
      // reads it, so data nobody asked for yet just stays reported there.
      epoll_event hint{};
      hint.events = EPOLLIN;
      hint.data.u64 = (uint64_t{i} << 32) | k;
      if (::epoll_ctl(hint_epoll_.get(), EPOLL_CTL_ADD, s.fd.get(), &hint) != 0)
        return errnoError("epoll_ctl (tcp transport hint set)", errno);
    }
    if (rma_enabled_) {
      if (!links[i].rma.valid())
        return internalError("tcp transport rank {}: no one-sided connection to rank {}", rank_, p.rank);
      RmaLink& l = p.rma;
      l.fd = std::move(links[i].rma);
      if (protect_ != auth::WireProtect::kOff)
        l.sealed = std::make_unique<auth::SealedStream>(protect_, links[i].rma_keys);
      CHORUS_RETURN_IF_ERROR(net::setNonBlocking(l.fd.get(), true));
      CHORUS_RETURN_IF_ERROR(net::setNoDelay(l.fd.get()));
      tuneBuffers(l.fd.get());
      setHeartbeat(l.fd.get(), heartbeat_ms_);
      l.buf.resize(kRmaStageBytes);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = i;
      if (::epoll_ctl(rma_epoll_.get(), EPOLL_CTL_ADD, l.fd.get(), &ev) != 0)
        return errnoError("epoll_ctl (tcp transport, one-sided connection)", errno);
      l.epoll_mask = EPOLLIN;
    }
  }
  return {};
}

inline Status TcpTransport::postSend(int peer, const void* src, size_t bytes, Request* req) {
  CHORUS_ASSIGN_OR_RETURN(Peer * p, peerForPost(peer, req, "send"));
  if (bytes > tcp::kMaxFrameBytes)
    return rejectPost(
        req, invalidArgument("tcp send of {} bytes to rank {} exceeds the 2^48-byte message limit", bytes, peer));
  if (bytes > 0 && src == nullptr)
    return rejectPost(req, invalidArgument("tcp send of {} bytes to rank {} from a null buffer", bytes, peer));
  Op* op = allocOp();
  op->req = req;
  op->src = static_cast<const std::byte*>(src);
  op->len = bytes;
  op->seq = p->send_seq++;
  op->rdv = rdv_bytes_ != 0 && bytes >= rdv_bytes_;
  op->hdr = FrameHeader{tcp::kFrameMagic, op->rdv ? tcp::kFlagRts : 0, bytes, req->sig};
  op->hdr2 = FrameHeader{tcp::kFrameMagic, tcp::kFlagData, bytes, req->sig};
  op->pending = 0;
  markPosted(req);
  noteCall(req->sig);
  for (Sock& s : p->socks) {
    uint64_t total = tcp::shareBytes(bytes, nsockets_, s.index) + headerBytes(op, s.index);
    if (total == 0) continue;
    ++op->pending;
    s.tx.push(Entry{op, bytes, 0, total});
  }
  return {};
}

inline Status TcpTransport::postRecv(int peer, const RecvTarget& target, Request* req) {
  CHORUS_ASSIGN_OR_RETURN(Peer * p, peerForPost(peer, req, "receive"));
  if (target.bytes > 0 && target.dst == nullptr)
    return rejectPost(req,
                      invalidArgument("tcp receive of {} bytes from rank {} into a null buffer", target.bytes, peer));
  if (target.reducer != nullptr) {
    if (!target.reducer->valid())
      return rejectPost(req, invalidArgument("tcp receive from rank {}: the reducer is not initialised", peer));
    size_t es = target.reducer->elemSize();
    if (es == 0 || es > sizeof(Sock::carry) || target.bytes % es != 0)
      return rejectPost(req, invalidArgument("tcp reducing receive from rank {}: {} bytes is not a whole number of "
                                             "{}-byte elements",
                                             peer, target.bytes, es));
  }
  Op* op = allocOp();
  op->req = req;
  op->dst = target.dst;
  op->reducer = target.reducer;
  op->accum = target.accum != nullptr ? target.accum : target.dst;
  op->len = target.bytes;
  op->pending = 0;
  op->seq = p->recv_seq++;
  // Clear to send at once: the grant travels while the sender gets there.
  if (rdv_bytes_ != 0 && op->len >= rdv_bytes_) p->grant_want = std::max(p->grant_want, op->seq + 1);
  markPosted(req);
  p->unmatched.push(op);
  noteCall(req->sig);
  return {};
}

inline Result<bool> TcpTransport::poll() {
  if (aborted_.load(std::memory_order_acquire)) return applyAbort();
  bool progressed = false;
  Status first_error;
  if (heartbeat_ms_ > 0) checkLiveness(first_error);
  takeReadHint();
  for (int pass = 0; pass < kMaxPasses; ++pass) {
    bool moved = false;
    for (Peer& p : peers_) {
      if (p.failed || !p.busy()) continue;
      Status s = progressPeer(p, moved);
      if (!s.isOk()) {
        failPeer(p, s);
        moved = true;
        if (first_error.isOk()) first_error = s;
      }
    }
    if (!moved) break;
    progressed = true;
  }
  // One-sided traffic (TcpSetup::rma): while some is outstanding, after a
  // wait() it ended, and every 64th call (a message-only executor pays a
  // branch, or with one-sided operations on an epoll_wait per 64 calls).
  if (rma_enabled_ && (rma_hint_ || rma_again_ || rma_busy_ || (++rma_tick_ & 63) == 0)) [[unlikely]]
    progressRma(progressed, first_error);
  if (!first_error.isOk()) return first_error;
  return progressed;
}

inline void TcpTransport::wait(std::chrono::microseconds timeout) {
  if (aborted_.load(std::memory_order_acquire) || rma_again_) return;
  // Interest follows the posted work: a socket with nothing to do is not in
  // the set, so unread data for a receive not yet posted (or a peer that
  // hung up while idle) cannot turn waiting into spinning.
  for (Peer& p : peers_) {
    if (p.failed) continue;
    // Pushed-back bytes are readable without the socket: poll() can move them now.
    if (p.pushback_len > 0 && (p.frameWanted() || !p.socks[0].rx.empty())) return;
    // So is plaintext the record layer read ahead.
    for (Sock& s : p.socks)
      if (sealedBuffered(s.sealed) && (!s.rx.empty() || (s.index == 0 && p.frameWanted()))) return;
    for (Sock& s : p.socks) {
      uint32_t want = 0;
      if (hasWritable(p, s)) want |= EPOLLOUT;
      if (!s.rx.empty() || (s.index == 0 && p.frameWanted())) want |= EPOLLIN;
      if (want == s.epoll_mask) continue;
      epoll_event ev{};
      ev.events = want;
      ev.data.u64 = 0;
      int op = s.epoll_mask == 0 ? EPOLL_CTL_ADD : (want == 0 ? EPOLL_CTL_DEL : EPOLL_CTL_MOD);
      if (::epoll_ctl(epoll_.get(), op, s.fd.get(), &ev) != 0) {
        // Cannot happen for a valid socket; spinning is a safe degradation.
        log::warn("tcp transport rank {}: epoll_ctl for rank {}: {}", rank_, p.rank, describeErrno(errno));
        return;
      }
      s.epoll_mask = want;
    }
  }
  std::array<epoll_event, 32> events;
  auto drainWake = [&](int n) {
    for (int i = 0; i < n; ++i) {
      if (events[static_cast<size_t>(i)].data.u64 == kWakeTag) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_.get(), &v, sizeof v);
      }
      if (events[static_cast<size_t>(i)].data.u64 == kRmaTag) rma_hint_ = true;
    }
  };
  // Poll before sleeping, as the shared-memory transport does: a peer that
  // answers within CHORUS_SPIN_US is caught without a sleep and a wake-up
  // (loopback 8-byte allreduce: ~20-30 us when both sides sleep on epoll,
  // Open MPI's busy-polling TCP BTL ~8 us).  Each try is a non-blocking
  // epoll_wait; the core is yielded every few tries, so a peer queued
  // behind us on this core gets it.  A short wait (the executor taking turns
  // between transports) does not spin: the other transport's wait does.
  if (spin_.count() > 0 && timeout >= std::chrono::milliseconds(1)) {
    const auto spin_end = std::chrono::steady_clock::now() + spin_;
    for (uint32_t i = 1;; ++i) {
      const int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), 0);
      if (n != 0) {
        drainWake(n);
        return;
      }
      if ((i & 3) == 0) {
        if (std::chrono::steady_clock::now() >= spin_end) break;
        sched_yield();
      }
    }
  }
  timespec ts{};
  auto us = std::max<int64_t>(timeout.count(), 0);
  ts.tv_sec = us / 1000000;
  ts.tv_nsec = (us % 1000000) * 1000;
  int n = ::epoll_pwait2(epoll_.get(), events.data(), static_cast<int>(events.size()), &ts, nullptr);
  if (n < 0 && errno == ENOSYS) {  // kernels before 5.11: millisecond resolution, rounded up
    int ms = static_cast<int>(std::min<int64_t>((us + 999) / 1000, INT_MAX));
    n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), ms);
  }
  drainWake(n);
}

inline void TcpTransport::wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t r = ::write(wake_fd_.get(), &one, sizeof one);
}

inline void TcpTransport::abort(const Status& why) {
  {
    std::lock_guard lock(abort_mu_);
    if (!aborted_.load(std::memory_order_relaxed))
      abort_status_ = why.isOk() ? internalError("tcp transport aborted without a reason") : why;
  }
  aborted_.store(true, std::memory_order_release);
  wake();
}

// ---- posting ----

inline Result<Peer*> TcpTransport::peerForPost(int peer, Request* req, std::string_view what) {
  if (aborted_.load(std::memory_order_acquire)) {
    std::lock_guard lock(abort_mu_);
    return rejectPost(req, abort_status_);
  }
  int idx = peer >= 0 && static_cast<size_t>(peer) < index_of_.size() ? index_of_[static_cast<size_t>(peer)] : -1;
  if (idx < 0)
    return rejectPost(
        req, invalidArgument("tcp {} on rank {}: rank {} is not a peer of this transport", what, rank_, peer));
  Peer& p = peers_[static_cast<size_t>(idx)];
  if (p.failed) return rejectPost(req, p.error);
  return &p;
}

inline Status TcpTransport::rejectPost(Request* req, Status why) {
  if (req != nullptr) req->fail(why);
  return why;
}

inline void TcpTransport::markPosted(Request* req) {
  req->status = Status();
  req->state.store(Request::Posted, std::memory_order_release);
}

// A staged message header no posted receive claims: if it belongs to the
// call being run (same call number) but has another signature, the ranks
// disagree on the call (typically its root: both sides only send) and
// nobody would ever receive it.
inline Status TcpTransport::unclaimedCheck(const Peer& p) const {
  if (current_sig_ == 0 || p.rdv_wait || !p.unmatched.empty() || p.stage_len < kHeaderBytes) return {};
  FrameHeader h;
  std::memcpy(&h, p.stage.data(), sizeof h);
  if (h.magic != tcp::kFrameMagic || (h.flags != 0 && h.flags != tcp::kFlagRts)) return {};
  if (!sameCallOtherSignature(current_sig_, h.sig)) return {};
  return signatureMismatch(rank_, p.rank, current_sig_, h.sig);
}

// A request of another collective call than the last: check what the peers
// have staged against it.
inline void TcpTransport::noteCall(uint64_t sig) {
  if (sig == 0 || (sig & kWirePointToPoint) != 0 || sig == current_sig_) return;
  current_sig_ = sig;
  for (Peer& q : peers_)
    if (!q.failed)
      if (Status st = unclaimedCheck(q); !st.isOk()) failPeer(q, st);
}

inline Op* TcpTransport::allocOp() {
  if (free_ops_.empty()) {
    constexpr size_t kChunk = 64;
    op_chunks_.push_back(std::make_unique<Op[]>(kChunk));
    for (size_t i = 0; i < kChunk; ++i) free_ops_.push_back(&op_chunks_.back()[i]);
  }
  Op* op = free_ops_.back();
  free_ops_.pop_back();
  *op = Op{};
  return op;
}

// One socket finished its part of op.
inline void TcpTransport::partDone(Op* op) {
  if (--op->pending > 0) return;
  op->req->complete();
  releaseOp(op);
}

// ---- progress ----

// Marks which sockets are worth a read this poll().
inline void TcpTransport::takeReadHint() {
  int awaiting = 0;
  for (Peer& p : peers_) {
    if (p.failed) continue;
    for (Sock& s : p.socks) {
      s.readable = true;
      if (!s.rx.empty() || (s.index == 0 && p.frameWanted())) ++awaiting;
    }
  }
  if (awaiting < kHintMinSockets) return;
  for (Peer& p : peers_)
    for (Sock& s : p.socks) s.readable = false;
  std::array<epoll_event, 64> events;
  int n = ::epoll_wait(hint_epoll_.get(), events.data(), static_cast<int>(events.size()), 0);
  if (n < 0 || n == static_cast<int>(events.size())) {
    // No hint (or maybe not all of it): try every socket, as with few.
    for (Peer& p : peers_)
      for (Sock& s : p.socks) s.readable = true;
    return;
  }
  for (int i = 0; i < n; ++i) {
    uint64_t tag = events[static_cast<size_t>(i)].data.u64;
    Peer& p = peers_[static_cast<size_t>(tag >> 32)];
    if (!p.failed) p.socks[static_cast<size_t>(tag & 0xffffffffu)].readable = true;
  }
}

inline Status TcpTransport::progressPeer(Peer& p, bool& moved) {
  for (Sock& s : p.socks) {
    while (hasWritable(p, s)) {
      CHORUS_ASSIGN_OR_RETURN(int r, writeSome(p, s));
      if (r > 0) moved = true;
      if (r <= 1) break;  // 0: would block, 1: partial write (buffer full)
    }
  }
  for (Sock& s : p.socks) {
    if (!s.readable && !(s.index == 0 && p.pushback_len > 0) && !sealedBuffered(s.sealed)) continue;
    for (;;) {
      int r = 0;
      if (!s.rx.empty()) {
        CHORUS_ASSIGN_OR_RETURN(r, readEntry(p, s));
      } else if (s.index == 0 && p.frameWanted()) {
        CHORUS_ASSIGN_OR_RETURN(r, readFrame(p));
      } else {
        break;
      }
      if (r > 0) moved = true;
      if (r <= 1) break;
    }
  }
  return {};
}

// Stream bytes of op's part on socket `index` that are headers.
inline uint64_t TcpTransport::headerBytes(const Op* op, int index) {
  return index != 0 ? 0 : (op->rdv ? 2 * kHeaderBytes : kHeaderBytes);
}

// How far e's stream may be written now: all of it, or for a rendezvous
// send not yet granted, only socket 0's RTS header.
inline uint64_t TcpTransport::sendLimit(const Peer& p, const Entry& e, int index) {
  if (!e.op->rdv || e.op->seq < p.granted) return e.total;
  return index == 0 ? kHeaderBytes : 0;
}

// Socket 0's outgoing stream is between frames, where a CTS header may go.
inline bool TcpTransport::atBoundary(const Sock& s) {
  if (s.tx.empty()) return true;
  const Entry& e = s.tx[0];
  return e.done == 0 || (e.op->rdv && e.done == kHeaderBytes);
}

inline bool TcpTransport::hasWritable(const Peer& p, const Sock& s) {
  if (sealedPending(s.sealed)) return true;
  if (s.index == 0 && (p.ctl_active || (p.grant_want > p.grant_sent && atBoundary(s)))) return true;
  return !s.tx.empty() && s.tx[0].done < sendLimit(p, s.tx[0], s.index);
}

// Writes as much of socket s's queue as one sendmsg takes (a pending CTS
// header first).  Returns 0 when it would block or nothing may be written,
// 1 after a partial write, 2 when everything offered went.
inline Result<int> TcpTransport::writeSome(Peer& p, Sock& s) {
  if (sealedPending(s.sealed)) {  // sealed bytes of earlier writes go first
    const int f = s.sealed->flush(s.fd.get());
    if (f < 0) return connectionError(p, s, errno);
    if (f == 0) return 0;
  }
  std::array<iovec, kMaxIov> iov;
  int cnt = 0;
  size_t offered = 0;
  if (s.index == 0 && !p.ctl_active && p.grant_want > p.grant_sent && atBoundary(s)) {
    p.ctl = FrameHeader{tcp::kFrameMagic, tcp::kFlagCts, p.grant_want};
    p.grant_sent = p.grant_want;
    p.ctl_active = true;
    p.ctl_done = 0;
  }
  if (s.index == 0 && p.ctl_active) {
    iov[static_cast<size_t>(cnt++)] = {reinterpret_cast<std::byte*>(&p.ctl) + p.ctl_done, kHeaderBytes - p.ctl_done};
    offered += kHeaderBytes - p.ctl_done;
  }
  for (size_t i = 0; i < s.tx.size() && cnt + 2 < kMaxIov; ++i) {
    Entry& e = s.tx[i];
    const uint64_t limit = sendLimit(p, e, s.index);
    const uint64_t hb = headerBytes(e.op, s.index);
    uint64_t off = e.done;
    if (off >= limit) break;  // waits for its grant; later messages stay behind it
    if (s.index == 0) {
      if (off < kHeaderBytes) {
        iov[static_cast<size_t>(cnt++)] = {reinterpret_cast<std::byte*>(&e.op->hdr) + off, kHeaderBytes - off};
        offered += kHeaderBytes - off;
        off = kHeaderBytes;
      }
      if (off < hb && off < limit) {
        const uint64_t o2 = off - kHeaderBytes;
        iov[static_cast<size_t>(cnt++)] = {reinterpret_cast<std::byte*>(&e.op->hdr2) + o2, kHeaderBytes - o2};
        offered += kHeaderBytes - o2;
        off = hb;
      }
    }
    if (limit < e.total) break;  // only the RTS header may go
    off -= hb;
    uint64_t share = e.total - hb;
    while (off < share && cnt < kMaxIov) {
      tcp::Run run = tcp::payloadRun(e.len, nsockets_, s.index, off);
      iov[static_cast<size_t>(cnt++)] = {const_cast<std::byte*>(e.op->src + run.msg_off), run.bytes};
      offered += run.bytes;
      off += run.bytes;
    }
  }
  if (cnt == 0) return 0;
  const ssize_t n = ioWritev(s.sealed.get(), s.fd.get(), iov.data(), cnt);
  if (n < 0) {
    int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK) return 0;
    return connectionError(p, s, err);
  }
  auto left = static_cast<uint64_t>(n);
  if (s.index == 0 && p.ctl_active) {
    size_t take = static_cast<size_t>(std::min<uint64_t>(left, kHeaderBytes - p.ctl_done));
    p.ctl_done += take;
    left -= take;
    if (p.ctl_done == kHeaderBytes) p.ctl_active = false;
  }
  while (left > 0) {
    Entry& e = s.tx.front();
    uint64_t take = std::min(left, e.total - e.done);
    e.done += take;
    left -= take;
    if (e.done == e.total) {
      Op* op = e.op;
      s.tx.pop();
      partDone(op);
    }
  }
  // A zero-payload entry (an empty message's header) counts as offered bytes.
  return static_cast<size_t>(n) < offered ? 1 : 2;
}

// Reads socket 0's next frame header (and a small message's payload with
// it): a CTS (consumed at once), the kFlagData header a matched RTS waits
// for, or the header of the next message for the oldest posted receive.
// With no receive posted (a send waits for a grant) a message header stays
// staged until one is.  Same return convention as writeSome.
inline Result<int> TcpTransport::readFrame(Peer& p) {
  Op* op = !p.rdv_wait && !p.unmatched.empty() ? p.unmatched.front() : nullptr;
  size_t want = kHeaderBytes + (op != nullptr && op->len <= kSmallBytes ? op->len : 0);
  if (p.stage_len >= want && op == nullptr) {  // a message header waits for its receive
    CHORUS_RETURN_IF_ERROR(unclaimedCheck(p));
    return 0;
  }
  iovec iov{p.stage.data() + p.stage_len, want - p.stage_len};
  CHORUS_ASSIGN_OR_RETURN(size_t n, readv(p, p.socks[0], &iov, 1));
  if (n == 0 && p.stage_len < want) return 0;
  p.stage_len += n;
  bool full = p.stage_len == want;
  if (p.stage_len < kHeaderBytes) return 1;
  FrameHeader h;
  std::memcpy(&h, p.stage.data(), sizeof h);
  if (!p.header_parsed) {
    if (h.magic == tcp::kFrameMagic && h.flags == tcp::kFlagAbort && h.length <= tcp::kMaxAbortReason) {
      // The peer aborted: the reason follows (usually in the same segment).
      std::string reason(reinterpret_cast<const char*>(p.stage.data()) + kHeaderBytes,
                         std::min<size_t>(p.stage_len - kHeaderBytes, h.length));
      while (reason.size() < h.length) {
        char more[tcp::kMaxAbortReason];
        ssize_t got = ioRecv(p.socks[0].sealed.get(), p.socks[0].fd.get(), more, h.length - reason.size());
        if (got <= 0) break;
        reason.append(more, static_cast<size_t>(got));
      }
      for (char& ch : reason)
        if (static_cast<unsigned char>(ch) < 0x20) ch = ' ';  // untrusted text: no control characters
      // A mismatch keeps its code: every rank of the call then reports one.
      return makeError(relayedAbortCode(h.sig),
                       "tcp: peer rank {} ({}) aborted its communicator: {}", p.rank, p.addr,
                       reason.empty() ? std::string("no reason given") : std::string(abortRootCause(reason)));
    }
    const bool known = h.flags == 0 || h.flags == tcp::kFlagRts || h.flags == tcp::kFlagCts ||
                       h.flags == tcp::kFlagData;
    if (h.magic != tcp::kFrameMagic || !known || h.length > tcp::kMaxFrameBytes)
      return corrupt(p, h, "");
    if (h.flags == tcp::kFlagCts) {
      // A grant: cumulative, so it must grow.
      if (h.length <= p.granted) return corrupt(p, h, " (a clear-to-send that does not raise the grant)");
      p.granted = h.length;
      consumeHeader(p);
      return 2;
    }
    if (p.rdv_wait) {
      if (h.flags != tcp::kFlagData || h.length != p.rdv_len)
        return corrupt(p, h, fmt::format(" (expected the payload of the announced {}-byte message)", p.rdv_len));
      consumeHeader(p);
      p.rdv_wait = false;
      uint64_t total = tcp::shareBytes(p.rdv_len, nsockets_, 0);
      p.socks[0].rx.push(Entry{p.rdv_op, p.rdv_len, 0, total});
      p.rdv_op = nullptr;
      return 2;
    }
    if (h.flags == tcp::kFlagData) return corrupt(p, h, " (a payload header no announcement preceded)");
    if (h.flags == tcp::kFlagRts && h.length < tcp::kMinRendezvousBytes)
      return corrupt(p, h, " (a rendezvous announcement for a small message)");
    if (op == nullptr) {  // stays staged until its receive is posted
      CHORUS_RETURN_IF_ERROR(unclaimedCheck(p));
      return 1;
    }
    if (h.flags == tcp::kFlagRts) {
      matchRendezvous(p, op, h.length, h.sig);
      return 2;
    }
    p.header_parsed = true;
    if (h.length != op->len || h.sig != op->req->sig) {
      mismatch(p, op, h.length, h.sig);
      return 2;
    }
  }
  if (!full) return 1;
  p.unmatched.pop();
  p.stage_len = 0;
  p.header_parsed = false;
  if (op->len <= kSmallBytes) {
    deliver(op, 0, p.stage.data() + kHeaderBytes, op->len);
    op->pending = 1;
    partDone(op);
    return 2;
  }
  for (Sock& s : p.socks) {
    uint64_t total = tcp::shareBytes(op->len, nsockets_, s.index);
    if (total == 0) continue;
    ++op->pending;
    s.rx.push(Entry{op, op->len, 0, total});
  }
  return 2;
}

inline Status TcpTransport::corrupt(const Peer& p, const FrameHeader& h, std::string_view why) const {
  return remoteError(
      "connection to rank {} ({}) is corrupt: frame header magic {:#x} flags {:#x} length {}{} "
      "(a different chorus version, or not a chorus peer?)",
      p.rank, p.addr, h.magic, h.flags, h.length, why);
}

// The staged header was a control header (no payload): bytes staged after
// it belong to the next frame and are pushed back.
inline void TcpTransport::consumeHeader(Peer& p) {
  unread(p, p.stage.data() + kHeaderBytes, p.stage_len - kHeaderBytes);
  p.stage_len = 0;
  p.header_parsed = false;
}

// Returns the last `n` staged bytes (at src) to the front of socket 0's stream.
inline void TcpTransport::unread(Peer& p, const std::byte* src, size_t n) {
  if (n == 0) return;
  if (p.pushback_len > 0) {
    // Everything staged since the stage was last emptied came from the
    // pushback buffer, contiguously, so these bytes are just before its offset.
    p.pushback_off -= n;
    p.pushback_len += n;
  } else {
    std::memmove(p.pushback.data(), src, n);
    p.pushback_off = 0;
    p.pushback_len = n;
  }
}

// An RTS for the oldest posted receive `op`: match it (or fail it with a
// mismatch and discard the payload), grant it if not yet granted, and wait
// for its kFlagData header on socket 0; the other sockets' shares follow
// their earlier messages directly.
inline void TcpTransport::matchRendezvous(Peer& p, Op* op, uint64_t len, uint64_t sig) {
  consumeHeader(p);
  p.unmatched.pop();
  p.grant_want = std::max(p.grant_want, op->seq + 1);
  if (len != op->len || sig != op->req->sig) {
    op->req->fail(mismatchStatus(p, op, len, sig));
    releaseOp(op);
    op = nullptr;
  }
  p.rdv_wait = true;
  p.rdv_op = op;
  p.rdv_len = len;
  for (Sock& s : p.socks) {
    uint64_t total = tcp::shareBytes(len, nsockets_, s.index);
    if (total == 0) continue;
    if (op != nullptr) ++op->pending;
    if (s.index != 0) s.rx.push(Entry{op, len, 0, total});
  }
}

// The arriving message (len bytes) does not fit the posted receive: fail
// it and queue the payload for discarding, keeping the stream in step.
// A message of another call (its signature differs) or another length.
inline Status TcpTransport::mismatchStatus(const Peer& p, const Op* op, uint64_t len, uint64_t sig) const {
  if (sig != op->req->sig)
    return signatureMismatch(rank_, p.rank, op->req->sig, sig);
  return makeError(chorusMismatch,
                   "message from rank {} has {} bytes but the receive expects {} (are all ranks calling the "
                   "same collective with the same count?)",
                   p.rank, len, op->len);
}

inline void TcpTransport::mismatch(Peer& p, Op* op, uint64_t len, uint64_t sig) {
  p.unmatched.pop();
  op->req->fail(mismatchStatus(p, op, len, sig));
  releaseOp(op);
  size_t extra = p.stage_len - kHeaderBytes;  // payload bytes already staged
  uint64_t share0 = tcp::shareBytes(len, nsockets_, 0);
  if (extra > share0) {
    // Only a small message can be shorter than what we staged, so these
    // bytes start the next frame.
    size_t over = extra - static_cast<size_t>(share0);
    unread(p, p.stage.data() + kHeaderBytes + share0, over);
  }
  for (Sock& s : p.socks) {
    uint64_t total = tcp::shareBytes(len, nsockets_, s.index);
    uint64_t done = s.index == 0 ? std::min<uint64_t>(extra, total) : 0;
    if (total > done) s.rx.push(Entry{nullptr, len, done, total});
  }
  p.stage_len = 0;
  p.header_parsed = false;
}

// Reads into socket s's head receive entry.  Same return convention as writeSome.
inline Result<int> TcpTransport::readEntry(Peer& p, Sock& s) {
  Entry& e = s.rx.front();
  Op* op = e.op;
  size_t n;
  size_t asked;
  if (op != nullptr && op->reducer == nullptr) {
    std::array<iovec, kMaxIov> iov;
    int cnt = 0;
    asked = 0;
    for (uint64_t off = e.done; off < e.total && cnt < kMaxIov;) {
      tcp::Run run = tcp::payloadRun(e.len, nsockets_, s.index, off);
      iov[static_cast<size_t>(cnt++)] = {op->dst + run.msg_off, run.bytes};
      asked += run.bytes;
      off += run.bytes;
    }
    CHORUS_ASSIGN_OR_RETURN(n, readv(p, s, iov.data(), cnt));
    e.done += n;
  } else {
    // Reduce or discard through the bounce buffer, after the carried bytes.
    std::memcpy(bounce_.data(), s.carry.data(), s.carry_len);
    asked = static_cast<size_t>(std::min<uint64_t>(bounce_.size() - s.carry_len, e.total - e.done));
    iovec iov{bounce_.data() + s.carry_len, asked};
    CHORUS_ASSIGN_OR_RETURN(n, readv(p, s, &iov, 1));
    if (op != nullptr && n > 0) {
      size_t es = op->reducer->elemSize();
      size_t avail = s.carry_len + n;
      size_t whole = avail / es * es;
      uint64_t stream_off = e.done - s.carry_len;
      for (size_t used = 0; used < whole;) {
        tcp::Run run = tcp::payloadRun(e.len, nsockets_, s.index, stream_off + used);
        size_t take = static_cast<size_t>(std::min<uint64_t>(run.bytes, whole - used));
        deliver(op, run.msg_off, bounce_.data() + used, take);
        used += take;
      }
      s.carry_len = avail - whole;
      std::memcpy(s.carry.data(), bounce_.data() + whole, s.carry_len);
    }
    e.done += n;
  }
  if (n == 0) return 0;
  if (e.done == e.total) {
    s.carry_len = 0;
    s.rx.pop();
    if (op != nullptr) partDone(op);
  }
  return n < asked ? 1 : 2;
}

// Lands `bytes` of op's message at offset `off` (whole elements when reducing).
inline void TcpTransport::deliver(Op* op, uint64_t off, const std::byte* src, size_t bytes) {
  if (bytes == 0) return;
  if (op->reducer == nullptr) {
    std::memcpy(op->dst + off, src, bytes);
  } else {
    (*op->reducer)(op->dst + off, op->accum + off, src, bytes / op->reducer->elemSize());
  }
}

// readv that first replays pushed-back bytes on socket 0.  Returns the
// bytes read; 0 means it would block; a closed or broken connection is an error.
inline Result<size_t> TcpTransport::readv(Peer& p, Sock& s, iovec* iov, int cnt) {
  if (s.index == 0 && p.pushback_len > 0) {
    size_t total = 0;
    for (int i = 0; i < cnt && p.pushback_len > 0; ++i) {
      size_t take = std::min(iov[i].iov_len, p.pushback_len);
      std::memcpy(iov[i].iov_base, p.pushback.data() + p.pushback_off, take);
      p.pushback_off += take;
      p.pushback_len -= take;
      total += take;
    }
    return total;
  }
  const ssize_t n = ioReadv(s.sealed.get(), s.fd.get(), iov, cnt);
  if (n > 0) return static_cast<size_t>(n);
  if (n == 0) {
    size_t asked = 0;
    for (int i = 0; i < cnt; ++i) asked += iov[i].iov_len;
    if (asked == 0) return size_t{0};
    if (Status why = pendingAbort(p); !why.isOk()) return why;
    return remoteError(
        "connection to rank {} ({}) closed: the peer closed socket {} while this rank expected data "
        "(did rank {} exit, fail or abort?)",
        p.rank, p.addr, s.index, p.rank);
  }
  int err = errno;
  if (err == EAGAIN || err == EWOULDBLOCK) return size_t{0};
  return connectionError(p, s, err);
}

// When a connection breaks, the peer may have said why just before: an
// abort frame waiting, unread, at a message boundary of socket 0.
// The peer's abort, when its frame is the next thing on socket 0 (its
// code kept for a mismatch, so every rank of the call reports one).
inline Status TcpTransport::pendingAbort(const Peer& p) const {
  uint64_t code = 0;
  std::string why = pendingAbortReason(p, &code);
  if (why.empty()) return {};
  return makeError(relayedAbortCode(code),
                   "tcp: peer rank {} ({}) aborted its communicator: {}", p.rank, p.addr, abortRootCause(why));
}

inline std::string TcpTransport::pendingAbortReason(const Peer& p, uint64_t* code) const {
  if (p.socks.empty() || !p.socks[0].fd.valid() || p.stage_len != 0 || !p.socks[0].rx.empty()) return {};
  // Grants (CTS headers) not read yet may come first.
  constexpr size_t kSkip = 8;
  std::array<char, (kSkip + 1) * sizeof(FrameHeader) + tcp::kMaxAbortReason> buf;
  const ssize_t got = p.socks[0].sealed
                          ? static_cast<ssize_t>(p.socks[0].sealed->peek(
                                p.socks[0].fd.get(), std::as_writable_bytes(std::span(buf.data(), buf.size()))))
                          : ::recv(p.socks[0].fd.get(), buf.data(), buf.size(), MSG_PEEK | MSG_DONTWAIT);
  if (got <= 0) return {};
  const auto n = static_cast<size_t>(got);
  size_t at = 0;
  FrameHeader h;
  for (;;) {
    if (n - at < sizeof h) return {};
    std::memcpy(&h, buf.data() + at, sizeof h);
    if (h.magic != tcp::kFrameMagic || h.flags != tcp::kFlagCts || at == kSkip * sizeof h) break;
    at += sizeof h;
  }
  if (h.magic != tcp::kFrameMagic || h.flags != tcp::kFlagAbort || h.length > tcp::kMaxAbortReason) return {};
  at += sizeof h;
  *code = h.sig;
  std::string reason(buf.data() + at, std::min<size_t>(h.length, n - at));
  for (char& ch : reason)
    if (static_cast<unsigned char>(ch) < 0x20) ch = ' ';  // untrusted text
  return reason;
}

inline Status TcpTransport::connectionError(const Peer& p, const Sock& s, int err) const {
  if ((err == EBADMSG || err == EPROTO) && s.sealed)
    return remoteError("connection to rank {} ({}) broken: socket {}: {} (CHORUS_WIRE_PROTECT={}: an attacker on the "
                       "path, or a rank given other keys)",
                       p.rank, p.addr, s.index, s.sealed->error(), auth::wireProtectName(s.sealed->mode()));
  if (Status why = pendingAbort(p); !why.isOk()) return why;
  if (err == EPIPE || err == ECONNRESET || err == ENOTCONN || err == ETIMEDOUT || err == EHOSTUNREACH)
    return remoteError("connection to rank {} ({}) closed: socket {}: {} (did rank {} exit, fail or abort?)", p.rank,
                       p.addr, s.index, describeErrno(err), p.rank);
  return makeError(chorusRemoteError, "connection to rank {} ({}) failed: socket {}: {}", p.rank, p.addr, s.index,
                   describeErrno(err));
}

// ---- failure ----

// Every min(heartbeat / 4, 100 ms), from poll(): fails the peers whose
// connections look dead (peerLooksDead).
inline void TcpTransport::checkLiveness(Status& first_error) {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_liveness_check_) return;
  next_liveness_check_ = now + std::chrono::milliseconds(std::clamp(heartbeat_ms_ / 4, 1, 100));
  for (Peer& p : peers_) {
    if (p.failed) continue;
    for (size_t k = 0; k <= p.socks.size(); ++k) {
      const net::Fd& fd = k < p.socks.size() ? p.socks[k].fd : p.rma.fd;
      unsigned silent_ms = 0;
      if (!fd.valid() || !peerLooksDead(fd.get(), 3 * heartbeat_ms_, &silent_ms)) continue;
      Status why = remoteError(
          "rank {} ({}) has acknowledged nothing for {} ms while data waits for it (3 x CHORUS_HEARTBEAT_MS = {} "
          "ms): its host is unreachable or dead",
          p.rank, p.addr, silent_ms, 3 * heartbeat_ms_);
      failPeer(p, why);
      if (first_error.isOk()) first_error = why;
      break;
    }
  }
}

// Fails every request of p with why, closes its sockets and makes later
// posts to p fail.
inline void TcpTransport::failPeer(Peer& p, const Status& why) {
  p.failed = true;
  p.error = why;
  auto failOp = [&](Op* op) {
    if (op == nullptr || op->req == nullptr) return;  // a discard entry, or failed via another socket
    op->req->fail(why);
    op->req = nullptr;
    releaseOp(op);
  };
  for (size_t i = 0; i < p.unmatched.size(); ++i) failOp(p.unmatched[i]);
  p.unmatched.clear();
  failOp(p.rdv_op);
  p.rdv_op = nullptr;
  p.rdv_wait = false;
  p.ctl_active = false;
  p.grant_sent = p.grant_want;
  for (Sock& s : p.socks) {
    for (size_t i = 0; i < s.tx.size(); ++i) failOp(s.tx[i].op);
    for (size_t i = 0; i < s.rx.size(); ++i) failOp(s.rx[i].op);
    s.tx.clear();
    s.rx.clear();
    s.carry_len = 0;
    // Leave both wait sets and tell the peer at once (FIN), but keep the
    // descriptor until the transport goes: closing it with unread data
    // would reset the connection, and the peer's kernel would then drop
    // what it has not delivered yet, e.g. our abort frame that says why.
    if (s.fd.valid()) {
      if (s.epoll_mask != 0) (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, s.fd.get(), nullptr);
      (void)::epoll_ctl(hint_epoll_.get(), EPOLL_CTL_DEL, s.fd.get(), nullptr);
      ::shutdown(s.fd.get(), SHUT_WR);
      drainUnread(s);
    }
    s.epoll_mask = 0;
  }
  p.stage_len = 0;
  p.header_parsed = false;
  p.pushback_len = 0;
  RmaLink& l = p.rma;
  for (size_t i = 0; i < l.ops.size(); ++i) l.ops[i].req->fail(why);
  l.ops.clear();
  l.written = 0;
  l.answers.clear();
  l.tx_queue = 0;
  l.tx_done = 0;
  l.in_payload = false;
  l.dst = nullptr;
  l.off = l.len = 0;
  if (l.fd.valid()) {
    if (l.epoll_mask != 0) (void)::epoll_ctl(rma_epoll_.get(), EPOLL_CTL_DEL, l.fd.get(), nullptr);
    l.epoll_mask = 0;
    ::shutdown(l.fd.get(), SHUT_WR);
    drainFd(l.fd);
  }
}

// Best effort: tells the peer why, so that the root cause reaches every
// rank instead of "connection closed".  Only at a message boundary of
// socket 0 (a frame cannot be cut into), and without blocking.
inline void TcpTransport::sendAbortFrame(Peer& p, const Status& why) {
  if (p.socks.empty() || !p.socks[0].fd.valid()) return;
  Sock& s0 = p.socks[0];
  if (p.ctl_active || !atBoundary(s0)) return;
  const std::string& text = why.message();
  const size_t n = std::min<size_t>(text.size(), tcp::kMaxAbortReason);
  FrameHeader h;
  h.flags = tcp::kFlagAbort;
  h.length = n;
  h.sig = static_cast<uint64_t>(why.code());
  std::array<std::byte, sizeof(FrameHeader) + tcp::kMaxAbortReason> buf;
  std::memcpy(buf.data(), &h, sizeof h);
  std::memcpy(buf.data() + sizeof h, text.data(), n);
  iovec iov{buf.data(), sizeof h + n};
  [[maybe_unused]] ssize_t w = ioWritev(s0.sealed.get(), s0.fd.get(), &iov, 1);
  if (s0.sealed) (void)s0.sealed->flush(s0.fd.get());  // best effort, as above
}

inline Status TcpTransport::applyAbort() {
  Status why;
  {
    std::lock_guard lock(abort_mu_);
    why = abort_status_;
  }
  if (!abort_applied_) {
    abort_applied_ = true;
    for (Peer& p : peers_) {
      if (!p.failed) {
        sendAbortFrame(p, why);
        failPeer(p, why);
      }
      // Peers learn now (FIN after the abort frame), not when this process
      // exits.  Only the write side: closing with unread data would send a
      // reset, which makes the peer's kernel drop the abort frame unread
      // (the destructor drains first).
      for (Sock& sk : p.socks)
        if (sk.fd.valid()) ::shutdown(sk.fd.get(), SHUT_WR);
    }
  }
  return why;
}

inline void TcpTransport::drainUnread(const Sock& sk) { drainFd(sk.fd); }

inline void TcpTransport::drainFd(const net::Fd& fd) {
  if (!fd.valid()) return;
  std::array<std::byte, 64 * 1024> sink;
  for (int i = 0; i < 1024; ++i)  // bounded: at most 64 MiB
    if (::recv(fd.get(), sink.data(), sink.size(), MSG_DONTWAIT) <= 0) break;
}

// ---- one-sided ----
//
// Each side of a pair's one-sided connection writes its requests and its
// answers to the peer's requests (answers first at a frame boundary, so our
// own long puts do not hold them up), and reads the peer's.  A request is
// checked against the region table before a payload byte moves; its answer
// goes out after all of it was read.  Answers come in request order, so an
// origin matches each with its oldest operation on the wire.

inline Status TcpTransport::postRma(int peer, RmaOpKind kind, const void* local, size_t bytes, const RemoteKey* key,
                                    uint64_t offset, uint64_t value, Request* req) {
  if (req == nullptr) return invalidArgument("tcp rma on rank {}: a null request", rank_);
  if (!rma_enabled_)
    return rejectPost(req, invalidUsage("tcp transport on rank {}: one-sided operations are not enabled on it "
                                        "(TcpSetup::rma)", rank_));
  CHORUS_ASSIGN_OR_RETURN(Peer * p, peerForPost(peer, req, "one-sided operation"));
  if (Status s = rmaCheckPost("tcp", rank_, kind, peer, local, bytes, key, rmaTransportTag("tcp")); !s.isOk())
    return rejectPost(req, s);
  if (bytes > tcp::kMaxFrameBytes)
    return rejectPost(req, invalidArgument("tcp rma on rank {}: {} bytes to or from rank {} exceed the 2^48-byte "
                                           "limit", rank_, bytes, peer));
  RmaLink& l = p->rma;
  if (l.closed)
    return rejectPost(req, remoteError("tcp rma on rank {}: rank {} ({}) closed its one-sided connection (has it "
                                       "destroyed its transport?)", rank_, peer, p->addr));
  RmaOp op;
  op.kind = kind;
  op.req = req;
  op.hdr.op = l.next_op++;
  switch (kind) {
    case RmaOpKind::Put:
      op.hdr.kind = tcp::kRmaPut;
      op.src = static_cast<const std::byte*>(local);
      break;
    case RmaOpKind::Get:
      op.hdr.kind = tcp::kRmaGet;
      op.dst = static_cast<std::byte*>(const_cast<void*>(local));
      break;
    case RmaOpKind::Notify:
      op.hdr.kind = tcp::kRmaNotify;
      op.hdr.generation = value;
      break;
  }
  if (key != nullptr) {
    op.hdr.region = key->region;
    op.hdr.generation = key->generation;
    op.hdr.offset = offset;
    op.hdr.length = bytes;
  }
  markPosted(req);
  l.ops.push(op);
  rma_busy_ = true;  // the next poll() writes it
  return {};
}

inline Result<bool> TcpTransport::takeNotification(int* peer, uint64_t* value) {
  if (!notes_.empty()) {
    *peer = notes_.front().first;
    *value = notes_.front().second;
    notes_.pop_front();
    return true;
  }
  if (aborted_.load(std::memory_order_acquire)) {
    std::lock_guard lock(abort_mu_);
    return abort_status_;
  }
  return false;
}

// The memory of a deregistered region is not touched after this returns: a
// put landing in it drops the rest of its payload (its origin is told), and
// a get answered from it is answered from a copy made now.
inline Status TcpTransport::deregisterRegion(RegionId id) {
  if (!regions_.live(id.index, id.generation)) return regions_.remove(id);  // the error
  for (Peer& p : peers_) {
    RmaLink& l = p.rma;
    if (l.in_payload && l.payload_put && l.dst != nullptr && l.region == id.index && l.generation == id.generation) {
      l.dst = nullptr;
      l.why = RmaRefusal::DeregisteredDuring;
      l.detail = 0;
    }
    for (size_t i = 0; i < l.answers.size(); ++i) {
      RmaAnswer& a = l.answers[i];
      if (!a.from_region || a.region != id.index || a.generation != id.generation) continue;
      a.own.assign(a.src, a.src + a.hdr.length);
      a.src = a.own.data();
      a.from_region = false;
    }
  }
  return regions_.remove(id);
}

inline void TcpTransport::rmaAnswer(RmaLink& l, uint16_t kind, uint64_t op, RmaRefusal why, uint64_t detail) {
  RmaAnswer a;
  a.hdr.kind = kind;
  a.hdr.op = op;
  a.hdr.reason = static_cast<uint16_t>(why);
  a.hdr.generation = detail;
  l.answers.push(std::move(a));
}

// Moves one-sided traffic (poll() decides when): reads the connections
// epoll reports, writes what waits to go out.
void TcpTransport::progressRma(bool& progressed, Status& first_error) {
  rma_hint_ = false;
  rma_again_ = false;
  auto fail = [&](Peer& p, const Status& why) {
    failPeer(p, why);
    progressed = true;
    if (first_error.isOk()) first_error = why;
  };
  std::array<epoll_event, 64> events;
  const int n = ::epoll_wait(rma_epoll_.get(), events.data(), static_cast<int>(events.size()), 0);
  if (n == static_cast<int>(events.size())) rma_again_ = true;
  for (int i = 0; i < n; ++i) {
    Peer& p = peers_[static_cast<size_t>(events[static_cast<size_t>(i)].data.u64)];
    if (p.failed || p.rma.closed) continue;
    if (Status st = readRma(p, progressed); !st.isOk()) fail(p, st);
  }
  bool busy = false;
  for (Peer& p : peers_) {
    RmaLink& l = p.rma;
    if (p.failed || l.closed || !l.fd.valid()) continue;
    if (l.off < l.len) {  // staged bytes a budgeted pass left
      if (Status st = readRma(p, progressed); !st.isOk()) {
        fail(p, st);
        continue;
      }
    }
    if (l.txPending()) {
      Result<int> w = writeRma(p);
      if (!w.isOk()) {
        fail(p, w.status());
        continue;
      }
      if (*w > 0) progressed = true;
    }
    rmaInterest(p);
    busy = busy || l.busy();
  }
  rma_busy_ = busy;
}

// Output interest in the one-sided set only while something waits to go out.
inline void TcpTransport::rmaInterest(Peer& p) {
  RmaLink& l = p.rma;
  const uint32_t want = uint32_t{EPOLLIN} | (l.txPending() ? uint32_t{EPOLLOUT} : 0u);
  if (want == l.epoll_mask || l.epoll_mask == 0) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = static_cast<uint64_t>(index_of_[static_cast<size_t>(p.rank)]);
  if (::epoll_ctl(rma_epoll_.get(), EPOLL_CTL_MOD, l.fd.get(), &ev) == 0) l.epoll_mask = want;
}

// Writes answers, then requests, as far as the socket takes them.  Same
// return convention as writeSome.
inline Result<int> TcpTransport::writeRma(Peer& p) {
  RmaLink& l = p.rma;
  int result = 0;
  if (sealedPending(l.sealed)) {
    const int f = l.sealed->flush(l.fd.get());
    if (f < 0) return rmaConnectionError(p, errno);
    if (f == 0) return 0;
  }
  while (l.txPending()) {
    const int q = l.tx_queue != 0 ? l.tx_queue : (!l.answers.empty() ? 1 : 2);
    const size_t avail = q == 1 ? l.answers.size() : l.ops.size() - l.written;
    std::array<iovec, kMaxIov> iov;
    int cnt = 0;
    uint64_t offered = 0;
    size_t frames = 0;
    for (size_t k = 0; k < avail && cnt + 2 <= kMaxIov && offered < kRmaPassBytes; ++k) {
      tcp::RmaFrame& h = q == 1 ? l.answers[k].hdr : l.ops[l.written + k].hdr;
      const std::byte* payload = q == 1 ? l.answers[k].src : l.ops[l.written + k].src;
      uint64_t skip = k == 0 ? l.tx_done : 0;
      if (skip < tcp::kRmaFrameBytes) {
        iov[static_cast<size_t>(cnt++)] = {reinterpret_cast<std::byte*>(&h) + skip, tcp::kRmaFrameBytes - skip};
        offered += tcp::kRmaFrameBytes - skip;
        skip = 0;
      } else {
        skip -= tcp::kRmaFrameBytes;
      }
      const uint64_t plen = rmaPayload(h);
      if (plen > skip) {
        iov[static_cast<size_t>(cnt++)] = {const_cast<std::byte*>(payload) + skip, plen - skip};
        offered += plen - skip;
      }
      ++frames;
    }
    const ssize_t n = ioWritev(l.sealed.get(), l.fd.get(), iov.data(), cnt);
    if (n < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) return result;
      return rmaConnectionError(p, err);
    }
    auto left = static_cast<uint64_t>(n);
    for (size_t k = 0; k < frames && left > 0; ++k) {
      const tcp::RmaFrame& h = q == 1 ? l.answers.front().hdr : l.ops[l.written].hdr;
      const uint64_t rest = tcp::kRmaFrameBytes + rmaPayload(h) - l.tx_done;
      if (left < rest) {
        l.tx_done += left;
        l.tx_queue = q;
        left = 0;
        break;
      }
      left -= rest;
      l.tx_done = 0;
      l.tx_queue = 0;
      if (q == 1) {
        l.answers.front().own = {};
        l.answers.pop();
      } else {
        ++l.written;
      }
    }
    if (static_cast<uint64_t>(n) < offered) return 1;
    result = 2;
  }
  return result;
}

// Reads what the peer sent on its one-sided connection, within a budget.
inline Status TcpTransport::readRma(Peer& p, bool& progressed) {
  RmaLink& l = p.rma;
  uint64_t budget = kRmaPassBytes;
  while (budget > 0) {
    if (!l.in_payload) {
      if (l.len - l.off < tcp::kRmaFrameBytes) {
        if (l.off > 0) {
          std::memmove(l.buf.data(), l.buf.data() + l.off, l.len - l.off);
          l.len -= l.off;
          l.off = 0;
        }
        const ssize_t n = ioRecv(l.sealed.get(), l.fd.get(), l.buf.data() + l.len, l.buf.size() - l.len);
        if (n > 0) {
          l.len += static_cast<size_t>(n);
          progressed = true;
          continue;
        }
        if (n == 0) return rmaEnd(p);
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
        return rmaConnectionError(p, errno);
      }
      tcp::RmaFrame h;
      std::memcpy(&h, l.buf.data() + l.off, sizeof h);
      l.off += sizeof h;
      budget -= std::min<uint64_t>(budget, sizeof h);
      CHORUS_RETURN_IF_ERROR(rmaHeader(p, h));
      progressed = true;
      continue;
    }
    if (l.left == 0) {
      CHORUS_RETURN_IF_ERROR(rmaPayloadDone(p));
      progressed = true;
      continue;
    }
    if (l.off < l.len) {
      const size_t take = static_cast<size_t>(std::min<uint64_t>(l.len - l.off, l.left));
      if (l.dst != nullptr) {
        std::memcpy(l.dst, l.buf.data() + l.off, take);
        l.dst += take;
      }
      l.off += take;
      l.left -= take;
      budget -= std::min<uint64_t>(budget, take);
      progressed = true;
      continue;
    }
    // Nothing staged: a long payload goes straight to its destination,
    // anything else through the stage.
    l.off = l.len = 0;
    const bool direct = l.dst != nullptr && l.left >= kRmaDirectBytes;
    std::byte* into = direct ? l.dst : l.buf.data();
    const size_t want = direct ? static_cast<size_t>(std::min<uint64_t>({l.left, budget, uint64_t{1} << 30}))
                               : l.buf.size();
    const ssize_t n = ioRecv(l.sealed.get(), l.fd.get(), into, want);
    if (n > 0) {
      if (direct) {
        l.dst += n;
        l.left -= static_cast<uint64_t>(n);
        budget -= std::min<uint64_t>(budget, static_cast<uint64_t>(n));
      } else {
        l.len = static_cast<size_t>(n);
      }
      progressed = true;
      continue;
    }
    if (n == 0) return rmaEnd(p);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
    return rmaConnectionError(p, errno);
  }
  rma_again_ = true;
  return {};
}

// The peer closed its one-sided connection: quietly when nothing was
// outstanding on it (its transport is gone), else an error.
inline Status TcpTransport::rmaEnd(Peer& p) {
  RmaLink& l = p.rma;
  if (l.ops.empty() && !l.in_payload && l.off == l.len) {
    l.closed = true;
    l.answers.clear();
    l.tx_queue = 0;
    l.tx_done = 0;
    if (l.epoll_mask != 0) (void)::epoll_ctl(rma_epoll_.get(), EPOLL_CTL_DEL, l.fd.get(), nullptr);
    l.epoll_mask = 0;
    return {};
  }
  if (Status why = pendingAbort(p); !why.isOk()) return why;
  return remoteError("connection to rank {} ({}) closed: the peer closed its one-sided connection while {} (did rank "
                     "{} exit, fail or abort?)", p.rank, p.addr,
                     l.ops.empty() ? "a frame of it was arriving" : "one-sided operations of this rank awaited answers",
                     p.rank);
}

inline Status TcpTransport::rmaConnectionError(const Peer& p, int err) const {
  if ((err == EBADMSG || err == EPROTO) && p.rma.sealed)
    return remoteError("connection to rank {} ({}) broken: its one-sided connection: {} (CHORUS_WIRE_PROTECT={}: an "
                       "attacker on the path, or a rank given other keys)",
                       p.rank, p.addr, p.rma.sealed->error(), auth::wireProtectName(p.rma.sealed->mode()));
  if (Status why = pendingAbort(p); !why.isOk()) return why;
  return remoteError("connection to rank {} ({}) failed: its one-sided connection: {} (did rank {} exit, fail or "
                     "abort?)", p.rank, p.addr, describeErrno(err), p.rank);
}

inline Status TcpTransport::rmaCorrupt(const Peer& p, const tcp::RmaFrame& h, std::string_view why) const {
  return remoteError("connection to rank {} ({}) is corrupt: one-sided frame magic {:#x} kind {} op {} region {} "
                     "offset {} length {}: {} (a different chorus version, or not a chorus peer?)", p.rank, p.addr,
                     h.magic, h.kind, h.op, h.region, h.offset, h.length, why);
}

// A header: validated whole before anything moves.  A request is checked
// against the region table; an answer must answer our oldest operation on
// the wire.
inline Status TcpTransport::rmaHeader(Peer& p, const tcp::RmaFrame& h) {
  RmaLink& l = p.rma;
  if (const char* bad = tcp::rmaFrameProblem(h); bad != nullptr) return rmaCorrupt(p, h, bad);
  if (h.kind == tcp::kRmaPut || h.kind == tcp::kRmaGet || h.kind == tcp::kRmaNotify) {
    if (h.op != l.expect) return rmaCorrupt(p, h, fmt::format("op number out of order (expected {})", l.expect));
    ++l.expect;
    rma_busy_ = true;  // an answer (or a payload) follows
    if (h.kind == tcp::kRmaNotify) {
      notes_.emplace_back(p.rank, h.generation);
      rmaAnswer(l, tcp::kRmaAck, h.op);
      return {};
    }
    RmaRefusal why = RmaRefusal::None;
    uint64_t detail = 0;
    const bool is_put = h.kind == tcp::kRmaPut;
    std::byte* mem = regions_.resolve(h.region, h.generation, h.offset, h.length,
                                      is_put ? Access::Write : Access::Read, &why, &detail);
    if (!is_put) {
      if (mem == nullptr) {
        rmaAnswer(l, tcp::kRmaError, h.op, why, detail);
        return {};
      }
      RmaAnswer a;
      a.hdr.kind = tcp::kRmaGetData;
      a.hdr.op = h.op;
      a.hdr.length = h.length;
      a.src = mem;
      a.from_region = true;
      a.region = h.region;
      a.generation = h.generation;
      l.answers.push(std::move(a));
      return {};
    }
    // A put: its payload lands in the region, or is dropped when refused.
    l.in_payload = true;
    l.payload_put = true;
    l.dst = mem;
    l.left = h.length;
    l.why = why;
    l.detail = detail;
    l.region = h.region;
    l.generation = h.generation;
    l.detail = detail;
    return {};
  }
  if (l.written == 0 || l.ops.empty() || l.ops.front().hdr.op != h.op)
    return rmaCorrupt(p, h, "an answer to no operation this rank awaits");
  RmaOp& op = l.ops.front();
  if (h.kind == tcp::kRmaGetData) {
    if (op.kind != RmaOpKind::Get || h.length != op.hdr.length)
      return rmaCorrupt(p, h, "data that does not fit the get it answers");
    l.in_payload = true;
    l.payload_put = false;
    l.dst = op.dst;
    l.left = h.length;
    return {};
  }
  if (h.kind == tcp::kRmaAck && op.kind == RmaOpKind::Get)
    return rmaCorrupt(p, h, "an acknowledgement where a get's data belongs");
  if (h.kind == tcp::kRmaError) {
    op.req->fail(rmaRefused("tcp", op.kind, rank_, p.rank, op.hdr.region, op.hdr.generation, op.hdr.offset,
                            op.hdr.length, static_cast<RmaRefusal>(h.reason), h.generation));
  } else {
    op.req->complete();
  }
  l.ops.pop();
  --l.written;
  return {};
}

inline Status TcpTransport::rmaPayloadDone(Peer& p) {
  RmaLink& l = p.rma;
  l.in_payload = false;
  l.dst = nullptr;
  if (l.payload_put) {
    const uint64_t op = l.expect - 1;
    if (l.why == RmaRefusal::None)
      rmaAnswer(l, tcp::kRmaAck, op);
    else
      rmaAnswer(l, tcp::kRmaError, op, l.why, l.detail);
    rma_busy_ = true;
    return {};
  }
  l.ops.front().req->complete();
  l.ops.pop();
  --l.written;
  return {};
}

}  // namespace

Result<std::unique_ptr<Transport>> createTcpTransport(const TcpSetup& setup, bootstrap::Store& store) {
  CHORUS_ASSIGN_OR_RETURN(std::vector<tcp::PeerLink> links, tcp::establishLinks(setup, store));
  auto t = std::make_unique<TcpTransport>(setup.rank, setup.sockets_per_peer, setup.heartbeat_ms,
                                          setup.rendezvous_bytes, setup.rma);
  t->protect_ = setup.protect;
  CHORUS_RETURN_IF_ERROR(t->init(std::move(links), setup.spin));
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace chorus::transport
