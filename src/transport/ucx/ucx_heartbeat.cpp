// The UCX transport's heartbeat (ucx_detail.hpp, Heartbeat; docs/ucx.md,
// "Faults"): how a peer whose host was cut off the network is found within
// 3 x CHORUS_HEARTBEAT_MS, as on the TCP transport.
//
// Why our own: UCP's keepalive (KEEPALIVE_INTERVAL) does not find it over
// UCX 1.13's tcp lane (the keepalive completes locally on a socket whose peer
// vanished), the TCP keepalive UCX sets on its sockets probes only idle
// connections after UCX_TCP_KEEPIDLE (10 s; ucp_config_modify refuses it),
// and chorus cannot read the TCP_INFO of UCX's sockets as its TCP transport
// does.  So every rank tells every peer it is alive:
//
//  * a second worker of the transport's UCP context (the context is created
//    with mt_workers_shared), owned by a thread of the heartbeat's own, with an
//    endpoint to every peer's heartbeat worker (their addresses travel through
//    the store as the transport's do, under "ucxhb/<rank>");
//  * every CHORUS_HEARTBEAT_MS / 4 the thread sends each peer a 16-byte beat
//    {magic, sender rank, the pair's token} (a tagged message; a beat whose
//    previous one UCP still holds is skipped, so nothing piles up behind a
//    peer that vanished), and takes the beats that arrived: a beat counts
//    only with the token the handshake derived for that sender (a stranger
//    cannot keep a dead rank alive without it);
//  * a peer heard from at least once and silent for 3 x CHORUS_HEARTBEAT_MS
//    since is declared unreachable: PeerLink::silent_ms, the endpoint-error
//    counter and the transport's wake fd, so the poll loop fails the peer
//    (naming it and the silence) as it fails a peer whose endpoint failed.
//
// The thread beats whatever the rank's own thread does, so a rank computing
// outside chorus for minutes is not declared dead; a process stopped
// (SIGSTOP) for that long is.  A peer never heard from is not judged (it may
// still be in its own setup, waiting for a third rank): its failures are its
// endpoint's and the operation's timeout's.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "bootstrap/socket.hpp"
#include "common/log.hpp"
#include "transport/ucx/ucx_detail.hpp"

namespace chorus::transport::ucx {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kBeatMagic = 0x31425543;  // "CUB1"
constexpr size_t kMaxAddressBytes = 64 * 1024;

struct Beat {
  uint32_t magic = kBeatMagic;
  int32_t from = -1;
  uint64_t token = 0;
};
static_assert(sizeof(Beat) == 16);

std::string storeKey(int rank) { return fmt::format("ucxhb/{}", rank); }

}  // namespace

class Heartbeat {
 public:
  Heartbeat(const UcxSetup& s, Fabric& f)
      : f_(f), api_(*f.api), rank_(s.rank), every_(std::max(s.heartbeat_ms / 4, 5)),
        limit_(std::chrono::milliseconds(3 * int64_t{s.heartbeat_ms})), heartbeat_ms_(s.heartbeat_ms) {}
  ~Heartbeat();

  Status create(bootstrap::Store& store);
  Status connect(bootstrap::Store& store, std::chrono::milliseconds timeout);
  void start();

 private:
  struct Peer {
    PeerLink* link = nullptr;
    ucp_ep_h ep = nullptr;
    std::atomic<bool> ep_failed{false};  // set by UCP's error handler (any thread)
    Beat beat;                            // what we send it (constant after connect)
    void* send = nullptr;                 // the beat UCP still holds
    bool heard = false;
    Clock::time_point last{};
    bool declared = false;
  };

  static void epFailed(void* arg, ucp_ep_h, ucs_status_t) {
    static_cast<Peer*>(arg)->ep_failed.store(true, std::memory_order_release);
  }
  static void recvDone(void*, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
    auto* self = static_cast<Heartbeat*>(user);
    self->rx_status_ = status;
    self->rx_length_ = info != nullptr ? info->length : 0;
    self->rx_done_ = true;
  }

  void run();
  void postRecv();
  void takeBeat(Clock::time_point now);
  void sendBeats();
  void judge(Clock::time_point now);

  Fabric& f_;
  const UcpApi& api_;
  const int rank_;
  const std::chrono::milliseconds every_;
  const std::chrono::milliseconds limit_;
  const int heartbeat_ms_;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  net::Fd stop_fd_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::vector<int> index_of_;  // rank -> index in peers_
  // The one receive posted for any beat (the thread's only, after connect).
  void* rx_ = nullptr;
  Beat rx_buf_{};
  bool rx_done_ = false;
  ucs_status_t rx_status_ = UCS_OK;
  size_t rx_length_ = 0;
};

Status Heartbeat::create(bootstrap::Store& store) {
  stop_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop_fd_.valid()) return errnoError("eventfd (ucx heartbeat)", errno);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // the heartbeat's thread alone, once started
  ucs_status_t st = api_.ucp_worker_create(f_.context, &wp, &worker_);
  if (st != UCS_OK) return systemError("ucx transport on rank {}: the heartbeat's ucp_worker_create: {}", rank_, api_.text(st));
  st = api_.ucp_worker_get_efd(worker_, &efd_);
  if (st != UCS_OK) return systemError("ucx transport on rank {}: the heartbeat's worker has no event fd: {}", rank_, api_.text(st));
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  st = api_.ucp_worker_get_address(worker_, &addr, &len);
  if (st != UCS_OK) return systemError("ucx transport on rank {}: the heartbeat's ucp_worker_get_address: {}", rank_, api_.text(st));
  const Status set = store.set(storeKey(rank_), std::span(reinterpret_cast<const std::byte*>(addr), len));
  api_.ucp_worker_release_address(worker_, addr);
  return set;
}

Status Heartbeat::connect(bootstrap::Store& store, std::chrono::milliseconds timeout) {
  int max_rank = 0;
  for (const auto& l : f_.links) max_rank = std::max(max_rank, l->rank);
  index_of_.assign(static_cast<size_t>(max_rank) + 1, -1);
  for (const auto& l : f_.links) {
    auto p = std::make_unique<Peer>();
    p->link = l.get();
    p->beat.from = rank_;
    p->beat.token = l->out.token;
    CHORUS_ASSIGN_OR_RETURN(bootstrap::Bytes addr, store.get(storeKey(l->rank), timeout));
    if (addr.empty() || addr.size() > kMaxAddressBytes)
      return remoteError("ucx transport setup on rank {}: the heartbeat address of rank {} has {} bytes (not a UCX "
                         "address)", rank_, l->rank, addr.size());
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(addr.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = epFailed;
    ep.err_handler.arg = p.get();
    const ucs_status_t st = api_.ucp_ep_create(worker_, &ep, &p->ep);
    if (st != UCS_OK)
      return remoteError("ucx transport setup on rank {}: no heartbeat endpoint to rank {}: {}", rank_, l->rank,
                         api_.text(st));
    index_of_[static_cast<size_t>(l->rank)] = static_cast<int>(peers_.size());
    peers_.push_back(std::move(p));
  }
  postRecv();
  return {};
}

void Heartbeat::start() {
  if (!peers_.empty()) thread_ = std::thread([this] { run(); });
}

Heartbeat::~Heartbeat() {
  if (thread_.joinable()) {
    stop_.store(true, std::memory_order_release);
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(stop_fd_.get(), &one, sizeof one);
    thread_.join();
  }
  if (worker_ == nullptr) return;
  // The thread is gone: this thread owns the worker now.
  if (rx_ != nullptr) api_.ucp_request_cancel(worker_, rx_);
  std::vector<void*> closing;
  for (auto& p : peers_) {
    if (p->send != nullptr) {
      api_.ucp_request_cancel(worker_, p->send);
      api_.ucp_request_free(p->send);  // released by UCP once it completes
      p->send = nullptr;
    }
    if (p->ep == nullptr) continue;
    ucp_request_param_t cp{};
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = api_.ucp_ep_close_nbx(p->ep, &cp);
    p->ep = nullptr;
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing.push_back(r);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  while ((rx_ != nullptr && !rx_done_) || !closing.empty()) {
    if (Clock::now() >= deadline) break;
    api_.ucp_worker_progress(worker_);
    for (size_t i = 0; i < closing.size();) {
      if (api_.ucp_request_check_status(closing[i]) != UCS_INPROGRESS) {
        api_.ucp_request_free(closing[i]);
        closing[i] = closing.back();
        closing.pop_back();
      } else {
        ++i;
      }
    }
  }
  if (rx_ != nullptr) {
    if (!rx_done_) log::warn("ucx heartbeat rank {}: its receive was not given back at teardown", rank_);
    api_.ucp_request_free(rx_);
  }
  for (void* r : closing) api_.ucp_request_free(r);
  api_.ucp_worker_destroy(worker_);
}

void Heartbeat::postRecv() {
  rx_done_ = false;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = recvDone;
  p.user_data = this;
  // Any tag: only beats come to this worker; a beat is judged by its bytes.
  ucs_status_ptr_t r = api_.ucp_tag_recv_nbx(worker_, &rx_buf_, sizeof rx_buf_, 0, 0, &p);
  if (UCS_PTR_IS_ERR(r)) {  // cannot listen: the peers' silence is never judged (no false alarm)
    log::warn("ucx heartbeat rank {}: cannot post its receive: {}", rank_, api_.text(UCS_PTR_STATUS(r)));
    rx_ = nullptr;
    return;
  }
  rx_ = r;
}

void Heartbeat::takeBeat(Clock::time_point now) {
  if (rx_ == nullptr || !rx_done_) return;
  api_.ucp_request_free(rx_);
  rx_ = nullptr;
  if (rx_status_ == UCS_OK && rx_length_ == sizeof(Beat) && rx_buf_.magic == kBeatMagic && rx_buf_.from >= 0 &&
      static_cast<size_t>(rx_buf_.from) < index_of_.size()) {
    const int i = index_of_[static_cast<size_t>(rx_buf_.from)];
    if (i >= 0) {
      Peer& p = *peers_[static_cast<size_t>(i)];
      if (rx_buf_.token == p.link->in.token) {  // else a stranger's: ignored
        p.heard = true;
        p.last = now;
      }
    }
  }
  postRecv();
}

void Heartbeat::sendBeats() {
  for (auto& pp : peers_) {
    Peer& p = *pp;
    if (p.ep == nullptr || p.ep_failed.load(std::memory_order_acquire) || p.declared) continue;
    if (p.send != nullptr) {
      if (api_.ucp_request_check_status(p.send) == UCS_INPROGRESS) continue;  // the last one is still queued
      api_.ucp_request_free(p.send);
      p.send = nullptr;
    }
    ucp_request_param_t prm{};  // no callback: polled above
    ucs_status_ptr_t r = api_.ucp_tag_send_nbx(p.ep, &p.beat, sizeof p.beat, makeTag(rank_, kChanCtl, 2), &prm);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) p.send = r;
  }
}

void Heartbeat::judge(Clock::time_point now) {
  for (auto& pp : peers_) {
    Peer& p = *pp;
    if (!p.heard || p.declared || now - p.last < limit_) continue;
    p.declared = true;
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - p.last).count();
    p.link->silent_ms.store(std::max<int64_t>(silent, 1), std::memory_order_release);
    f_.ep_errors.fetch_add(1, std::memory_order_release);
    if (const int fd = f_.wake_fd; fd >= 0) {
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t w = ::write(fd, &one, sizeof one);
    }
    log::warn("ucx transport rank {}: nothing heard from rank {}'s heartbeat for {} ms (CHORUS_HEARTBEAT_MS={}): "
              "declared unreachable", rank_, p.link->rank, silent, heartbeat_ms_);
  }
}

void Heartbeat::run() {
  auto next = Clock::now();
  while (!stop_.load(std::memory_order_acquire)) {
    while (api_.ucp_worker_progress(worker_) != 0) {
    }
    auto now = Clock::now();
    takeBeat(now);
    if (rx_done_) continue;  // another beat may be waiting: take it before sleeping
    if (now >= next) {
      sendBeats();
      judge(now);
      next = now + every_;
    }
    if (api_.ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
    pollfd fds[2] = {{efd_, POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count();
    (void)::poll(fds, 2, static_cast<int>(std::clamp<int64_t>(wait, 0, every_.count())));
  }
}

void HeartbeatDelete::operator()(Heartbeat* hb) const { delete hb; }

Status createHeartbeat(const UcxSetup& setup, Fabric& f, bootstrap::Store& store) {
  if (setup.heartbeat_ms <= 0) return {};
  f.heartbeat.reset(new Heartbeat(setup, f));
  return f.heartbeat->create(store);
}

Status connectHeartbeat(Fabric& f, bootstrap::Store& store, std::chrono::milliseconds timeout) {
  if (!f.heartbeat) return {};
  return f.heartbeat->connect(store, timeout);
}

void startHeartbeat(Fabric& f) {
  if (f.heartbeat) f.heartbeat->start();
}

}  // namespace chorus::transport::ucx
