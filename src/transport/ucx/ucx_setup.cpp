// Setup of the UCX transport: the UCP context and worker, the endpoints and
// the handshake; and the plumbing every UCP operation goes through (Sink).
//
// Protocol, per rank r (collective over r and its peers):
//  1. create a UCP context (UCX_TLS from CHORUS_UCX_TLS when set, UCP's
//     keepalive from CHORUS_HEARTBEAT_MS) and one worker, and publish the
//     worker's address in the store under "ucx/<r>";
//  2. for every peer p, read "ucx/<p>" and create an endpoint to it in UCP's
//     peer error-handling mode (UCP_ERR_HANDLING_MODE_PEER), whose error
//     handler records the failure for the poll loop;
//  3. the handshake, over tagged messages on the control channel with the
//     clear sequences 0 and 1 (ucx_wire.hpp), with every peer at once:
//       r -> p  Hello {r, p, comm_id, nonce_rp}             (a fresh 32-byte challenge per peer)
//       p -> r  Proof {p, r, comm_id, echo = nonce_rp, nonce_pr,
//                      mac = HMAC(secret, "chorus-ucx-proof" | p | r | comm_id | nonce_rp | nonce_pr)}
//     and the same the other way.  r answers every hello that claims to be
//     from p (at most kMaxHellos of them) with a proof over the hello's nonce,
//     and accepts p once a proof over its own challenge verifies.  A proof
//     that echoes another challenge is dropped (a stranger, or a stale rank);
//     one that echoes r's challenge but fails its MAC comes from the rank that
//     received the challenge and does not know the secret: setup fails at
//     once, naming it.  A stranger that reached the worker can therefore
//     delay nobody's handshake by more than its own messages, and learns
//     nothing it could use.
//  4. both ends derive the pair's keys from the secret and both
//     (authenticated) nonces: the token every header carries and the
//     offsets that key every tag of the pair (ucx_wire.hpp, PairKeys), and,
//     with CHORUS_WIRE_PROTECT=mac|encrypt, one AES-256-GCM key per
//     direction (HKDF, auth::deriveMessageKeys) that seals every later
//     message.  The proof carries the prover's mode under its MAC, so ranks
//     that disagree on it fail here, naming it, and nobody can downgrade it.
// Every wait is bounded by setup.timeout.  Without a job secret (an
// unauthenticated job) the MACs use the all-zero key, as auth.hpp does.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "bootstrap/auth.hpp"
#include "common/log.hpp"
#include "transport/ucx/ucx_detail.hpp"

namespace chorus::transport::ucx {
namespace {

using Clock = std::chrono::steady_clock;

// A stranger's hellos cost a proof each: at most this many are answered per
// peer (the real peer's hello precedes its proof, so the peer is answered
// unless this many forged hellos in its name came first).
constexpr int kMaxHellos = 64;
// The worker address a peer publishes; UCX's are a few hundred bytes.
constexpr size_t kMaxAddressBytes = 64 * 1024;

std::string storeKey(int rank) { return fmt::format("ucx/{}", rank); }

// ---- UCP callbacks: record, queue, never act (ucx_detail.hpp, Op) ----

void finish(Op* op, void* request, ucs_status_t status) {
  op->status = status;
  if (op->outstanding) {
    op->outstanding = false;
    --op->sink->outstanding;
  }
  op->ucp = nullptr;
  op->sink->done.push_back(op);
  if (request != nullptr) op->sink->api->ucp_request_free(request);
}

void sendDone(void* request, ucs_status_t status, void* user) { finish(static_cast<Op*>(user), request, status); }

void recvDone(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* op = static_cast<Op*>(user);
  op->length = info != nullptr ? info->length : 0;
  finish(op, request, status);
}

void epFailed(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* l = static_cast<PeerLink*>(arg);
  int ok = UCS_OK;
  l->ep_error.compare_exchange_strong(ok, static_cast<int>(status));
  l->fabric->ep_errors.fetch_add(1, std::memory_order_release);
  // UCP may call this outside the progress call (its async thread): make a
  // sleeping wait() look.
  if (const int fd = l->fabric->wake_fd; fd >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(fd, &one, sizeof one);
  }
}

ucp_request_param_t params(Op* op, bool recv) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  if (recv) {
    // Always through the callback: one completion path.
    p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = recvDone;
  } else {
    p.cb.send = sendDone;
  }
  p.user_data = op;
  return p;
}

}  // namespace

// ---- Sink ----

Op* Sink::alloc(Op::Kind kind, Peer* peer) {
  if (free_ops.empty()) {
    chunks.push_back(std::make_unique<Op[]>(kOpChunk));
    for (size_t i = 0; i < kOpChunk; ++i) free_ops.push_back(&chunks.back()[i]);
  }
  Op* op = free_ops.back();
  free_ops.pop_back();
  op->kind = kind;
  op->outstanding = false;
  op->status = UCS_OK;
  op->length = 0;
  op->ucp = nullptr;
  op->sink = this;
  op->peer = peer;
  op->index = 0;
  op->req = nullptr;
  op->target = RecvTarget{};
  op->leader = nullptr;
  op->parts = 0;
  op->error = Status();
  op->seq = 0;
  op->gap_cancel = false;
  op->rma_op = 0;
  op->rkey = nullptr;
  return op;
}

void Sink::release(Op* op) {
  op->kind = Op::kFree;
  op->req = nullptr;
  op->error = Status();
  op->buf.shrinkAbove(kKeepBufferBytes);
  free_ops.push_back(op);
}

void Sink::track(ucs_status_ptr_t p, Op* op) {
  if (p == nullptr) {  // completed at once
    finish(op, nullptr, UCS_OK);
  } else if (UCS_PTR_IS_ERR(p)) {
    finish(op, nullptr, UCS_PTR_STATUS(p));
  } else if (op->outstanding) {  // (a callback from inside the call would have cleared it)
    op->ucp = p;
  }
}

void Sink::send(ucp_ep_h ep, uint64_t tag, Op* op, const void* src, size_t bytes) {
  ucp_request_param_t p = params(op, false);
  op->outstanding = true;
  ++outstanding;
  if (ep == nullptr) return finish(op, nullptr, UCS_ERR_NOT_CONNECTED);  // closed: fails like a broken endpoint
  track(api->ucp_tag_send_nbx(ep, src != nullptr ? src : op->buf.data(), bytes, tag, &p), op);
}

void Sink::recv(ucp_worker_h worker, uint64_t tag, Op* op, void* dst, size_t bytes) {
  ucp_request_param_t p = params(op, true);
  op->outstanding = true;
  ++outstanding;
  track(api->ucp_tag_recv_nbx(worker, dst, bytes, tag, kFullMask, &p), op);
}

void Sink::put(ucp_ep_h ep, const void* src, size_t bytes, uint64_t remote_addr, ucp_rkey_h rkey, ucp_mem_h memh,
               Op* op) {
  ucp_request_param_t p = params(op, false);
  if (memh != nullptr) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = memh;
  }
  op->outstanding = true;
  ++outstanding;
  if (ep == nullptr) return finish(op, nullptr, UCS_ERR_NOT_CONNECTED);
  track(api->ucp_put_nbx(ep, src, bytes, remote_addr, rkey, &p), op);
}

void Sink::get(ucp_ep_h ep, void* dst, size_t bytes, uint64_t remote_addr, ucp_rkey_h rkey, ucp_mem_h memh, Op* op) {
  ucp_request_param_t p = params(op, false);
  if (memh != nullptr) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = memh;
  }
  op->outstanding = true;
  ++outstanding;
  if (ep == nullptr) return finish(op, nullptr, UCS_ERR_NOT_CONNECTED);
  track(api->ucp_get_nbx(ep, dst, bytes, remote_addr, rkey, &p), op);
}

void Sink::flush(ucp_ep_h ep, Op* op) {
  ucp_request_param_t p = params(op, false);
  op->outstanding = true;
  ++outstanding;
  if (ep == nullptr) return finish(op, nullptr, UCS_ERR_NOT_CONNECTED);
  track(api->ucp_ep_flush_nbx(ep, &p), op);
}

void Sink::completeNow(Op* op) {
  op->outstanding = true;
  ++outstanding;
  finish(op, nullptr, UCS_OK);
}

void Sink::cancel(ucp_worker_h worker, Op* op) {
  if (op->outstanding && op->ucp != nullptr) api->ucp_request_cancel(worker, op->ucp);
}

// ---- Fabric ----

Fabric::~Fabric() {
  heartbeat.reset();  // its thread first: it reads the links
  if (api == nullptr) return;
  if (worker != nullptr) {
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    for (auto& l : links)
      if (l->ep != nullptr) closeEndpoint(*l, /*force=*/true);
    // UCP returns what it holds (cancelled receives, purged sends) through
    // the callbacks, which must run while the Ops exist.
    while ((sink.outstanding > 0 || !closing.empty()) && Clock::now() < deadline) {
      progress();
      sink.done.clear();
    }
    if (sink.outstanding > 0)
      log::warn("ucx transport rank {}: {} UCP operations still outstanding at teardown", rank, sink.outstanding);
    discardUnexpected();
    for (void* r : closing) api->ucp_request_free(r);
    api->ucp_worker_destroy(worker);
  }
  if (context != nullptr) api->ucp_cleanup(context);
}

void Fabric::discardUnexpected() {
  const auto deadline = Clock::now() + std::chrono::milliseconds(200);
  for (int i = 0; i < 100000 && Clock::now() < deadline; ++i) {
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg = api->ucp_tag_probe_nb(worker, 0, 0, /*remove=*/1, &info);
    if (msg == nullptr) return;
    ucp_request_param_t p{};  // no callback: polled below
    std::byte sink_byte{};
    ucs_status_ptr_t r = api->ucp_tag_msg_recv_nbx(worker, &sink_byte, 0, msg, &p);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) continue;
    while (api->ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline)
      api->ucp_worker_progress(worker);
    api->ucp_request_free(r);
  }
}

bool Fabric::progress() {
  bool any = false;
  // Until UCP has nothing more, or one of our operations completed (the
  // caller handles it; another pass here would only be one more epoll_wait
  // on the tcp lane before it can).
  for (int i = 0; i < 64; ++i) {
    if (api->ucp_worker_progress(worker) == 0) break;
    any = true;
    if (!sink.done.empty()) break;
  }
  for (size_t i = 0; i < closing.size();) {
    if (api->ucp_request_check_status(closing[i]) != UCS_INPROGRESS) {
      api->ucp_request_free(closing[i]);
      closing[i] = closing.back();
      closing.pop_back();
    } else {
      ++i;
    }
  }
  return any || !sink.done.empty();
}

void Fabric::sleep(std::chrono::microseconds timeout) {
  const ucs_status_t armed = api->ucp_worker_arm(worker);
  if (armed == UCS_ERR_BUSY) return;  // events UCP has not reported yet: progress first
  if (armed != UCS_OK) {              // cannot sleep on the fd: a short nap instead
    std::this_thread::sleep_for(std::min(timeout, std::chrono::microseconds(100)));
    return;
  }
  pollfd fds[2] = {{efd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
  const auto us = std::max<int64_t>(timeout.count(), 0);
  timespec ts{static_cast<time_t>(us / 1000000), static_cast<long>((us % 1000000) * 1000)};
  (void)::ppoll(fds, wake_fd >= 0 ? 2 : 1, &ts, nullptr);
}

void Fabric::closeEndpoint(PeerLink& l, bool force) {
  if (l.ep == nullptr) return;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t r = api->ucp_ep_close_nbx(l.ep, &p);
  l.ep = nullptr;
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing.push_back(r);
}

// ---- setup ----

namespace {

std::span<const std::byte> label(std::string_view s) { return {reinterpret_cast<const std::byte*>(s.data()), s.size()}; }
template <typename T>
std::span<const std::byte> bytesOf(const T& v) {
  return std::as_bytes(std::span(&v, 1));
}

using Nonce = std::array<std::byte, kNonceBytes>;

std::array<std::byte, kMacBytes> proofMac(const auth::Secret& secret, int32_t from, int32_t to, uint64_t comm_id,
                                          uint16_t protect, const Nonce& echo, const Nonce& nonce) {
  const std::span<const std::byte> parts[] = {label("chorus-ucx-proof"), bytesOf(from), bytesOf(to),
                                              bytesOf(comm_id), bytesOf(protect), echo, nonce};
  return auth::hmac(secret, parts);
}

// The keys of the direction from -> to: what both ends compute alike.
PairKeys deriveKeys(const auth::Secret& secret, int32_t from, int32_t to, uint64_t comm_id, const Nonce& nonce_from,
                    const Nonce& nonce_to) {
  const std::span<const std::byte> parts[] = {label("chorus-ucx-keys"), bytesOf(from), bytesOf(to),
                                              bytesOf(comm_id), nonce_from, nonce_to};
  const auto k = auth::hmac(secret, parts);
  uint64_t w[4];
  std::memcpy(w, k.data(), sizeof w);
  PairKeys out;
  out.token = w[0];
  out.msg = w[1] & kSeqMask;
  out.data = w[2] & kSeqMask;
  out.rma = w[3] & kSeqMask;
  out.ctl = (((w[1] ^ w[2]) * 0x9E3779B97F4A7C15ULL) >> 24 & kSeqMask) | kCtlKeyBit;
  return out;
}

// The sealers of the pair (rank, peer): the lower rank's challenge is nonce_a.
void makeSealers(const UcxSetup& s, PeerLink& l, const Nonce& mine, const Nonce& peer) {
  if (s.protect == auth::WireProtect::kOff) return;
  const bool a = s.rank < l.rank;
  const int32_t lo = std::min(s.rank, l.rank), hi = std::max(s.rank, l.rank);
  const std::span<const std::byte> ctx_parts[] = {label("ucx"), bytesOf(s.comm_id), bytesOf(lo), bytesOf(hi)};
  std::vector<std::byte> ctx;
  for (auto part : ctx_parts) ctx.insert(ctx.end(), part.begin(), part.end());
  auth::SessionKeys k = auth::deriveMessageKeys(s.secret, a ? mine : peer, a ? peer : mine, ctx, a);
  l.seal = std::make_unique<auth::MessageSealer>(s.protect, k.send, /*sealing=*/true);
  l.open = std::make_unique<auth::MessageSealer>(s.protect, k.recv, /*sealing=*/false);
  std::fill(k.send.begin(), k.send.end(), std::byte{0});
  std::fill(k.recv.begin(), k.recv.end(), std::byte{0});
}

Status validate(const UcxSetup& s) {
  if (s.rank < 0 || s.rank >= kMaxRanks)
    return invalidArgument("ucx transport: rank {} is outside [0, {})", s.rank, kMaxRanks);
  if (s.protect != auth::WireProtect::kOff && !s.secret.present)
    return invalidArgument("ucx transport: CHORUS_WIRE_PROTECT={} needs a job secret (its keys derive from it); set "
                           "CHORUS_SECRET or launch with chorus-run",
                           auth::wireProtectName(s.protect));
  std::vector<int> sorted = s.peers;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= kMaxRanks || sorted[i] == s.rank)
      return invalidArgument("ucx transport on rank {}: peer {} is invalid (negative, too large or this rank)", s.rank,
                             sorted[i]);
    if (i > 0 && sorted[i] == sorted[i - 1])
      return invalidArgument("ucx transport on rank {}: peer {} is listed twice", s.rank, sorted[i]);
  }
  return {};
}

std::chrono::milliseconds remaining(Clock::time_point deadline) {
  return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                  std::chrono::milliseconds(1));
}

// The transport's defaults for UCX's tcp lane (createWorker).
struct TcpDefault {
  const char* key;    // for ucp_config_modify
  const char* env;    // the user's variable that overrides it
  const char* value;
};
constexpr TcpDefault kTcpDefaults[] = {
    {"RX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE", "1M"},
};

Status createWorker(const UcxSetup& s, Fabric& f) {
  const UcpApi& api = *f.api;
  ucp_config_t* cfg = nullptr;
  ucs_status_t st = api.ucp_config_read(nullptr, nullptr, &cfg);
  if (st != UCS_OK) return systemError("ucx transport on rank {}: reading UCX's configuration: {}", s.rank, api.text(st));
  if (!s.tls.empty()) {
    st = api.ucp_config_modify(cfg, "TLS", s.tls.c_str());
    if (st != UCS_OK) {
      api.ucp_config_release(cfg);
      return invalidArgument("ucx transport on rank {}: UCX refuses CHORUS_UCX_TLS='{}': {} (accepted: a UCX_TLS "
                             "list, e.g. tcp, sm,tcp, rc,sm,self, ^ib)",
                             s.rank, s.tls, api.text(st));
    }
  }
  // UCX's tcp lane receives in segments of UCX_TCP_RX_SEG_SIZE (64K), the
  // largest fragment of its rendezvous data.  Every fragment costs a header,
  // a send and a receive call and a pass through UCP's progress; 1M segments
  // move a large message in 16 times fewer (docs/ucx.md, "Defaults for UCX's
  // tcp lane": about 12 % less CPU per large allreduce).  The send segment
  // (UCX_TCP_TX_SEG_SIZE, UCP's eager limit there) stays: raised to 256K it
  // made 64-256 KiB messages slower (eager copies on both sides).  The key
  // names only the tcp lane's field (UCX applies a key it does not know to
  // the transports that have it); a UCX_TCP_RX_SEG_SIZE the user set wins.
  for (const TcpDefault& d : kTcpDefaults) {
    if (std::find(s.user_set.begin(), s.user_set.end(), d.env) != s.user_set.end()) continue;
    if (api.ucp_config_modify(cfg, d.key, d.value) != UCS_OK) {
      log::info("ucx transport rank {}: UCX does not take {}={}; its default applies", s.rank, d.key, d.value);
      continue;
    }
    f.config_changes += fmt::format("{}{}={}", f.config_changes.empty() ? "" : " ", d.key, d.value);
  }
  if (s.heartbeat_ms > 0) {
    const std::string every = fmt::format("{}ms", s.heartbeat_ms);
    if (api.ucp_config_modify(cfg, "KEEPALIVE_INTERVAL", every.c_str()) != UCS_OK)
      log::warn("ucx transport rank {}: UCX does not take KEEPALIVE_INTERVAL={}; its default applies", s.rank, every);
  }
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
  p.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  p.estimated_num_eps = std::max<size_t>(s.peers.size(), 1);
  if (s.heartbeat_ms > 0) {  // the heartbeat's worker runs on a thread of its own (ucx_heartbeat.cpp)
    p.field_mask |= UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    p.mt_workers_shared = 1;
  }
  st = api.init(&p, cfg, &f.context);
  api.ucp_config_release(cfg);
  if (st != UCS_OK)
    return systemError("ucx transport on rank {}: ucp_init: {} (does UCX_TLS{} name a transport this machine has? "
                       "ucx_info -d lists them)",
                       s.rank, api.text(st), s.tls.empty() ? "" : fmt::format(" (CHORUS_UCX_TLS='{}')", s.tls));
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // one thread at a time (transport.hpp); wake() uses our own fd
  st = api.ucp_worker_create(f.context, &wp, &f.worker);
  if (st != UCS_OK) return systemError("ucx transport on rank {}: ucp_worker_create: {}", s.rank, api.text(st));
  st = api.ucp_worker_get_efd(f.worker, &f.efd);
  if (st != UCS_OK)
    return systemError("ucx transport on rank {}: the worker has no event fd ({}): it could only spin", s.rank,
                       api.text(st));
  return {};
}

Status publishAddress(const UcxSetup& s, Fabric& f, bootstrap::Store& store) {
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  const ucs_status_t st = f.api->ucp_worker_get_address(f.worker, &addr, &len);
  if (st != UCS_OK) return systemError("ucx transport on rank {}: ucp_worker_get_address: {}", s.rank, f.api->text(st));
  const Status set = store.set(storeKey(s.rank), std::span(reinterpret_cast<const std::byte*>(addr), len));
  f.api->ucp_worker_release_address(f.worker, addr);
  return set;
}

Status connectPeers(const UcxSetup& s, Fabric& f, bootstrap::Store& store, Clock::time_point deadline) {
  for (const int peer : s.peers) {
    auto link = std::make_unique<PeerLink>();
    link->rank = peer;
    link->fabric = &f;
    CHORUS_ASSIGN_OR_RETURN(bootstrap::Bytes addr, store.get(storeKey(peer), remaining(deadline)));
    if (addr.empty() || addr.size() > kMaxAddressBytes)
      return remoteError("ucx transport setup on rank {}: the worker address of rank {} has {} bytes (not a UCX "
                         "address)", s.rank, peer, addr.size());
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(addr.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = epFailed;
    ep.err_handler.arg = link.get();
    const ucs_status_t st = f.api->ucp_ep_create(f.worker, &ep, &link->ep);
    if (st != UCS_OK)
      return remoteError("ucx transport setup on rank {}: no endpoint to rank {}: {} (do both ranks share a UCX "
                         "transport? set CHORUS_UCX_TLS / UCX_TLS alike on all ranks)",
                         s.rank, peer, f.api->text(st));
    f.links.push_back(std::move(link));
  }
  return {};
}

// The handshake with every peer (the protocol at the top of this file).
class Handshake {
 public:
  Handshake(const UcxSetup& s, Fabric& f) : s_(s), f_(f) {}

  Status run(Clock::time_point deadline) {
    pairs_.reserve(f_.links.size());
    for (auto& l : f_.links) {
      Pair& p = pairs_.emplace_back();
      p.link = l.get();
      const auth::Secret fresh = auth::Secret::random();  // 32 bytes from the OS CSPRNG
      if (!fresh.present)
        return systemError("ucx transport setup on rank {}: the system gives no random bytes for a challenge", s_.rank);
      p.nonce_mine = fresh.bytes;
      Hello h;
      h.from = s_.rank;
      h.to = l->rank;
      h.comm_id = s_.comm_id;
      h.nonce = p.nonce_mine;
      sendRecord(p, kHelloSeq, h);
    }
    for (Pair& p : pairs_) {
      p.hello = postAuthRecv(p, kHelloSeq, sizeof(Hello));
      p.proof = postAuthRecv(p, kProofSeq, sizeof(Proof));
    }
    Status st = loop(deadline);
    // A failed handshake still delivers this rank's proofs (bounded), so a
    // peer that disagrees on the secret or the mode learns it from them too.
    finish(/*sends_too=*/!st.isOk());
    CHORUS_RETURN_IF_ERROR(st);
    for (Pair& p : pairs_) {
      p.link->out = deriveKeys(s_.secret, s_.rank, p.link->rank, s_.comm_id, p.nonce_mine, p.nonce_peer);
      p.link->in = deriveKeys(s_.secret, p.link->rank, s_.rank, s_.comm_id, p.nonce_peer, p.nonce_mine);
      makeSealers(s_, *p.link, p.nonce_mine, p.nonce_peer);
    }
    return {};
  }

 private:
  struct Pair {
    PeerLink* link = nullptr;
    Nonce nonce_mine{};  // the challenge sent to this peer
    Nonce nonce_peer{};  // its challenge, authenticated by its proof
    bool verified = false;
    int hellos = 0;
    Op* hello = nullptr;  // posted receives (nullptr once no longer wanted)
    Op* proof = nullptr;
  };

  template <typename T>
  void sendRecord(Pair& p, uint64_t seq, const T& rec) {
    Op* op = f_.sink.alloc(Op::kSendAuth, nullptr);
    op->buf.assign(bytesOf(rec));
    f_.sink.send(p.link->ep, makeTag(s_.rank, kChanCtl, seq), op, nullptr, sizeof rec);
  }

  Op* postAuthRecv(Pair& p, uint64_t seq, size_t bytes) {
    Op* op = f_.sink.alloc(Op::kRecvAuth, nullptr);
    op->seq = seq;
    op->index = static_cast<size_t>(&p - pairs_.data());  // pairs_ does not grow any more
    op->buf.resize(bytes);
    f_.sink.recv(f_.worker, makeTag(p.link->rank, kChanCtl, seq), op, op->buf.data(), bytes);
    return op;
  }

  Status loop(Clock::time_point deadline) {
    for (;;) {
      bool moved = f_.progress();
      std::vector<Op*> batch;
      batch.swap(f_.sink.done);
      for (Op* op : batch) {
        moved = true;
        if (op->kind == Op::kSendAuth) {
          f_.sink.release(op);
          continue;
        }
        Pair& p = pairs_[op->index];
        Status st = op->seq == kHelloSeq ? onHello(p, op) : onProof(p, op);
        if (!st.isOk()) return st;
      }
      for (const Pair& p : pairs_)
        if (const int e = p.link->ep_error.load(); e != UCS_OK)
          return remoteError("ucx transport setup on rank {}: the endpoint to rank {} failed: {} (did rank {} exit or "
                             "fail?)", s_.rank, p.link->rank, f_.text(static_cast<ucs_status_t>(e)), p.link->rank);
      if (std::all_of(pairs_.begin(), pairs_.end(), [](const Pair& p) { return p.verified; })) return {};
      if (Clock::now() >= deadline) return timeoutError();
      if (!moved) f_.sleep(std::min<std::chrono::microseconds>(remaining(deadline), std::chrono::milliseconds(50)));
    }
  }

  Status onHello(Pair& p, Op* op) {
    p.hello = nullptr;
    if (op->status == UCS_ERR_CANCELED) {
      f_.sink.release(op);
      return {};
    }
    Hello h;
    const char* bad = nullptr;
    if (op->status != UCS_OK || op->length != sizeof h) {
      bad = op->status == UCS_OK || op->status == UCS_ERR_MESSAGE_TRUNCATED ? "a hello of the wrong size"
                                                                              : "a failed receive";
    } else {
      std::memcpy(&h, op->buf.data(), sizeof h);
      if (h.magic != kHelloMagic || h.version != kWireVersion || h.zero != 0) bad = "not a chorus ucx hello (or another version)";
      else if (h.from != p.link->rank || h.to != s_.rank) bad = "a hello for other ranks";
      else if (h.comm_id != s_.comm_id) bad = "a hello of another communicator";
    }
    if (bad != nullptr) {
      dropped(p, "hello", bad);
    } else if (p.hellos < kMaxHellos) {
      ++p.hellos;
      Proof pr;
      pr.from = s_.rank;
      pr.to = p.link->rank;
      pr.comm_id = s_.comm_id;
      pr.protect = static_cast<uint16_t>(s_.protect);
      pr.echo = h.nonce;
      pr.nonce = p.nonce_mine;
      pr.mac = proofMac(s_.secret, pr.from, pr.to, pr.comm_id, pr.protect, pr.echo, pr.nonce);
      sendRecord(p, kProofSeq, pr);
    }
    // The real peer's hello precedes its proof (one endpoint delivers in
    // order), so once the peer is verified its hello was answered.
    if (!p.verified) {
      p.hello = op;
      f_.sink.recv(f_.worker, makeTag(p.link->rank, kChanCtl, kHelloSeq), op, op->buf.data(), op->buf.size());
    } else {
      f_.sink.release(op);
    }
    return {};
  }

  Status onProof(Pair& p, Op* op) {
    p.proof = nullptr;
    if (op->status == UCS_ERR_CANCELED) {
      f_.sink.release(op);
      return {};
    }
    Proof pr;
    const char* bad = nullptr;
    if (op->status != UCS_OK || op->length != sizeof pr) {
      bad = op->status == UCS_OK || op->status == UCS_ERR_MESSAGE_TRUNCATED ? "a proof of the wrong size"
                                                                              : "a failed receive";
    } else {
      std::memcpy(&pr, op->buf.data(), sizeof pr);
      if (pr.magic != kProofMagic || pr.version != kWireVersion || pr.protect > kMaxProtect) bad = "not a chorus ucx proof (or another version)";
      else if (pr.from != p.link->rank || pr.to != s_.rank) bad = "a proof for other ranks";
      else if (pr.comm_id != s_.comm_id) bad = "a proof of another communicator";
      else if (!auth::equalMac(pr.echo, p.nonce_mine)) bad = "it answers a challenge this rank did not send";
    }
    if (bad == nullptr) {
      const auto want = proofMac(s_.secret, pr.from, pr.to, pr.comm_id, pr.protect, pr.echo, pr.nonce);
      if (!auth::equalMac(pr.mac, want)) {
        f_.sink.release(op);
        // It answers the challenge only rank p received: rank p runs with
        // another secret.
        return remoteError("ucx transport setup on rank {}: authentication failed: rank {} does not prove this job's "
                           "secret (its proof over this rank's challenge is wrong): do all ranks use the same "
                           "CHORUS_SECRET / unique id, and is rank {} a rank of this job?",
                           s_.rank, p.link->rank, p.link->rank);
      }
      if (pr.protect != static_cast<uint16_t>(s_.protect)) {
        f_.sink.release(op);
        // Under the MAC: rank p really runs that mode.
        return remoteError("ucx transport setup on rank {}: rank {} protects its messages with CHORUS_WIRE_PROTECT={}, "
                           "this rank with {} (set it alike on all ranks)",
                           s_.rank, p.link->rank, auth::wireProtectName(static_cast<auth::WireProtect>(pr.protect)),
                           auth::wireProtectName(s_.protect));
      }
      p.verified = true;
      p.nonce_peer = pr.nonce;
      f_.sink.release(op);
      return {};
    }
    dropped(p, "proof", bad);
    p.proof = op;
    f_.sink.recv(f_.worker, makeTag(p.link->rank, kChanCtl, kProofSeq), op, op->buf.data(), op->buf.size());
    return {};
  }

  void dropped(const Pair& p, const char* what, const char* why) {
    ++dropped_;
    if (dropped_ <= 8)
      log::warn("ucx transport setup on rank {}: dropped a {} that claims to come from rank {}: {} (a stranger's, a "
                "stale rank's, or rank {}'s answer to a stranger's hello)", s_.rank, what, p.link->rank, why,
                p.link->rank);
  }

  Status timeoutError() const {
    std::string missing;
    for (const Pair& p : pairs_)
      if (!p.verified) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", p.link->rank);
    return makeError(chorusTimeout,
                     "ucx transport setup on rank {}: ranks {} did not complete the handshake within {} ms (did they "
                     "start, with the ucx transport? can UCX reach them: CHORUS_UCX_TLS / UCX_TLS alike everywhere?){}",
                     s_.rank, missing, s_.timeout.count(),
                     dropped_ > 0 ? fmt::format("; {} records from strangers were dropped", dropped_) : std::string());
  }

  // Cancels the receives still posted and waits (bounded) until UCP gave
  // them back: their Ops must outlive UCP's use of them.
  void finish(bool sends_too) {
    for (Pair& p : pairs_)
      for (Op* op : {p.hello, p.proof})
        if (op != nullptr) f_.sink.cancel(f_.worker, op);
    const auto until = Clock::now() + std::chrono::seconds(2);
    for (;;) {
      bool pending = false;
      for (const Pair& p : pairs_) pending = pending || p.hello != nullptr || p.proof != nullptr;
      pending = pending || (sends_too && f_.sink.outstanding > 0);
      if (!pending || Clock::now() >= until) break;
      f_.progress();
      std::vector<Op*> batch;
      batch.swap(f_.sink.done);
      for (Op* op : batch) {
        if (op->kind == Op::kRecvAuth) {
          Pair& p = pairs_[op->index];
          (op == p.hello ? p.hello : p.proof) = nullptr;
        }
        // Sends still outstanding are released by the transport's poll loop
        // when they complete (Op::kSendAuth).
        f_.sink.release(op);
      }
    }
  }

  const UcxSetup& s_;
  Fabric& f_;
  std::vector<Pair> pairs_;
  int dropped_ = 0;
};

}  // namespace

Result<std::unique_ptr<Fabric>> establish(const UcxSetup& s, bootstrap::Store& store) {
  CHORUS_RETURN_IF_ERROR(validate(s));
  CHORUS_ASSIGN_OR_RETURN(const UcpApi* api, ucpApi());
  const auto deadline = Clock::now() + s.timeout;
  auto f = std::make_unique<Fabric>();
  f->api = api;
  f->rank = s.rank;
  f->sink.api = api;
  CHORUS_RETURN_IF_ERROR(createWorker(s, *f));
  CHORUS_RETURN_IF_ERROR(createHeartbeat(s, *f, store));  // published before "ucx/<rank>"
  CHORUS_RETURN_IF_ERROR(publishAddress(s, *f, store));
  CHORUS_RETURN_IF_ERROR(connectPeers(s, *f, store, deadline));
  Handshake hs(s, *f);
  CHORUS_RETURN_IF_ERROR(hs.run(deadline));
  CHORUS_RETURN_IF_ERROR(connectHeartbeat(*f, store, remaining(deadline)));
  return f;
}

}  // namespace chorus::transport::ucx
