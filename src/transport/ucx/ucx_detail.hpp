// Private to the UCX transport: the UCP worker and endpoints one transport
// owns, the record every outstanding UCP operation carries, and the setup
// that builds them (ucx_setup.cpp).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bootstrap/store.hpp"
#include "bootstrap/wire_protect.hpp"
#include "common/status.hpp"
#include "transport/transport.hpp"
#include "transport/ucx/ucx.hpp"
#include "transport/ucx/ucx_api.hpp"
#include "transport/ucx/ucx_wire.hpp"

namespace chorus::transport::ucx {

struct Sink;
struct Peer;

// Growable bytes that are not zeroed when they grow (a bounce buffer for a
// large message is written by UCP before it is read).
class Buffer {
 public:
  [[nodiscard]] std::byte* data() { return p_.get(); }
  [[nodiscard]] const std::byte* data() const { return p_.get(); }
  [[nodiscard]] size_t size() const { return size_; }
  void resize(size_t n) {
    if (n > cap_) {
      p_.reset(new std::byte[n]);
      cap_ = n;
    }
    size_ = n;
  }
  void assign(std::span<const std::byte> b) {
    resize(b.size());
    if (!b.empty()) std::memcpy(p_.get(), b.data(), b.size());
  }
  // Gives back memory over `keep` bytes (a pooled Op keeps small buffers).
  void shrinkAbove(size_t keep) {
    if (cap_ > keep) {
      p_.reset();
      cap_ = size_ = 0;
    }
  }

 private:
  std::unique_ptr<std::byte[]> p_;
  size_t cap_ = 0;
  size_t size_ = 0;
};

// One UCP operation of this transport, from its post until the poll loop has
// handled its completion.  UCP calls back with the Op as user data; the
// callback only records the outcome and queues the Op on its Sink, so every
// consequence (completing a Request, posting the next receive) happens in the
// poll loop, outside UCP's progress call.  Ops live in a pool with stable
// addresses (Sink::alloc) and are reused.
struct Op {
  enum Kind : uint8_t {
    kFree = 0,
    // two-sided
    kSendMsg,      // a message's header (with an inline payload): leads the user's send
    kSendData,     // a large message's payload (part of the leader's send)
    kRecvHeader,   // the pre-posted receive of a peer's next header
    kRecvData,     // a large message's payload, into the destination or a bounce buffer
    kRecvDiscard,  // the payload of a message whose receive failed (mismatch): dropped
    kRecvCtl,      // the pre-posted receive of a peer's abort or close
    kSendCtl,
    // one-sided
    kRecvRma,      // the pre-posted receive of a peer's next one-sided record
    kSendRma,
    kRmaMove,      // the target's ucp_get_nbx / ucp_put_nbx on the origin's buffer
    kRmaFlush,     // the target's flush after a get's ucp_put_nbx (remote completion)
    // the handshake
    kRecvAuth,
    kSendAuth,
  };
  Kind kind = kFree;
  Sink* sink = nullptr;
  bool outstanding = false;  // UCP holds it (posted, callback not run yet)
  ucs_status_t status = UCS_OK;
  size_t length = 0;  // a receive: the bytes that arrived (the sender's length when truncated)
  void* ucp = nullptr;  // the UCP request while outstanding (to cancel a receive)
  Peer* peer = nullptr;
  // The owned buffer: a send's record and inline payload, a receive's stage,
  // a reduction's bounce buffer.  Its capacity stays with the pooled Op.
  Buffer buf;
  // Two-sided: the user's request and target.
  Request* req = nullptr;
  RecvTarget target;
  Op* leader = nullptr;  // kSendData: its kSendMsg
  int parts = 0;         // a leader: parts not finished yet (itself included)
  Status error;          // a leader: the first failure of a part
  uint64_t seq = 0;      // the stream position it was posted for
  bool gap_cancel = false;  // kRecvData: cancelled because a later header arrived first (checkGaps)
  size_t index = 0;      // the handshake: which pair
  // One-sided (target side): the queue entry it serves.
  uint64_t rma_op = 0;
  ucp_rkey_h rkey = nullptr;
  // kRecvData of a sealed transport: the payload's tag (from its header).
  std::array<std::byte, kSealTagBytes> tag{};
};

// Ops are allocated this many at a time.
constexpr size_t kOpChunk = 64;
// A pooled Op keeps a buffer up to this size for its next use.
constexpr size_t kKeepBufferBytes = 1 << 20;

// Where callbacks leave completed Ops, and the pool they come from.
struct Sink {
  const UcpApi* api = nullptr;
  std::vector<Op*> done;      // completed, in completion order, not handled yet
  size_t outstanding = 0;     // Ops UCP holds
  std::vector<std::unique_ptr<Op[]>> chunks;
  std::vector<Op*> free_ops;

  Op* alloc(Op::Kind kind, Peer* peer);
  void release(Op* op);

  // Posts a tagged send of buf[0, bytes) (or, with src, of src[0, bytes)).
  // Immediate completion and an immediate error queue the Op on `done` like
  // a callback would.
  void send(ucp_ep_h ep, uint64_t tag, Op* op, const void* src, size_t bytes);
  // Posts a tagged receive of exactly `tag` into dst[0, bytes).
  void recv(ucp_worker_h worker, uint64_t tag, Op* op, void* dst, size_t bytes);
  // RMA on the peer's memory at remote_addr (with rkey); completion as for send.
  void put(ucp_ep_h ep, const void* src, size_t bytes, uint64_t remote_addr, ucp_rkey_h rkey, ucp_mem_h memh, Op* op);
  void get(ucp_ep_h ep, void* dst, size_t bytes, uint64_t remote_addr, ucp_rkey_h rkey, ucp_mem_h memh, Op* op);
  void flush(ucp_ep_h ep, Op* op);
  // Completes the Op at once as a successful post would (a send a test
  // hook dropped).
  void completeNow(Op* op);
  // Cancels an outstanding receive (its callback then reports UCS_ERR_CANCELED).
  void cancel(ucp_worker_h worker, Op* op);

 private:
  void track(ucs_status_ptr_t p, Op* op);
};

// One peer as setup leaves it.
struct Fabric;
struct PeerLink {
  int rank = -1;
  Fabric* fabric = nullptr;
  ucp_ep_h ep = nullptr;
  // Set by UCP's error handler (peer error-handling mode): the endpoint
  // failed (a ucs_status_t).  Atomic: UCP may call the handler from its
  // async thread.
  std::atomic<int> ep_error{UCS_OK};
  // Set by the heartbeat thread (Heartbeat): nothing came from the peer's
  // heartbeat for this many milliseconds, over the bound (> 0: declared
  // unreachable; the poll loop fails the peer as for ep_error).
  std::atomic<int64_t> silent_ms{0};
  PairKeys out;  // this rank -> the peer
  PairKeys in;   // the peer -> this rank
  // CHORUS_WIRE_PROTECT=mac|encrypt: the pair's sealers, one per direction
  // (keys from the job secret and the handshake's nonces); null when off.
  std::unique_ptr<auth::MessageSealer> seal;  // this rank -> the peer
  std::unique_ptr<auth::MessageSealer> open;  // the peer -> this rank
};

// The liveness check between the ranks of a transport (ucx_heartbeat.cpp;
// docs/ucx.md, "Faults"): a second UCP worker of the transport's context,
// driven by a thread of its own, sends every peer a small keyed beat every
// CHORUS_HEARTBEAT_MS / 4 and declares a peer whose beats stopped for
// 3 x CHORUS_HEARTBEAT_MS unreachable (PeerLink::silent_ms).  Its own thread
// keeps beating while the rank computes outside chorus, so only a peer whose
// process or host stopped falls silent.
class Heartbeat;
struct HeartbeatDelete {  // ucx_heartbeat.cpp: stops the thread, releases the worker
  void operator()(Heartbeat* hb) const;
};

// The UCP objects of one transport.  Destroying it force-closes what is left
// open and releases the worker and the context (the transport closes its
// endpoints gracefully first).
struct Fabric {
  const UcpApi* api = nullptr;
  int rank = 0;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int efd = -1;  // the worker's event fd (owned by UCP)
  std::string config_changes;  // "KEY=VALUE ..." the transport's defaults set in UCP's configuration
  std::vector<std::unique_ptr<PeerLink>> links;  // setup.peers' order; stable addresses (the error handler's argument)
  std::atomic<uint64_t> ep_errors{0};  // error handler calls so far (the poll loop compares)
  int wake_fd = -1;  // the transport's eventfd: the error handler writes it (sleep() watches it)
  std::vector<void*> closing;  // endpoint close requests UCP has not finished
  Sink sink;
  // The heartbeat's worker and thread (null when CHORUS_HEARTBEAT_MS=0);
  // stopped and released first when the Fabric goes.
  std::unique_ptr<Heartbeat, HeartbeatDelete> heartbeat;

  Fabric() = default;
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;
  ~Fabric();

  // Progresses the worker until it has nothing more to do (bounded).
  bool progress();
  // Waits for the worker's event fd (and wake_fd, when >= 0) for up to
  // `timeout`; returns at once when the worker has events it has not
  // reported yet (ucp_worker_arm: busy).
  void sleep(std::chrono::microseconds timeout);
  // Receives and drops the messages nobody posted a receive for (a peer's
  // after an abort, a stranger's), so that UCP does not report each one at
  // teardown; bounded.
  void discardUnexpected();
  // Starts closing one endpoint (force: UCP fails what is outstanding on it
  // with UCS_ERR_CANCELED at once; else its sends are flushed first); the
  // request is reaped by progress().  Later calls for the link do nothing.
  void closeEndpoint(PeerLink& l, bool force);
  [[nodiscard]] std::string text(ucs_status_t s) const { return api->text(s); }
};

// Creates the context and the worker, publishes the worker's address,
// connects to every peer and runs the handshake (ucx_setup.cpp).
Result<std::unique_ptr<Fabric>> establish(const UcxSetup& setup, bootstrap::Store& store);

// The heartbeat (ucx_heartbeat.cpp).  createHeartbeat makes its worker and
// publishes its address ("ucxhb/<rank>", before the transport's own address,
// so a peer that read that one finds this one); connectHeartbeat, after the
// handshake (the beats carry the pair's token), connects to every peer's;
// startHeartbeat starts its thread once the transport's wake fd is set.
Status createHeartbeat(const UcxSetup& setup, Fabric& f, bootstrap::Store& store);
Status connectHeartbeat(Fabric& f, bootstrap::Store& store, std::chrono::milliseconds timeout);
void startHeartbeat(Fabric& f);

}  // namespace chorus::transport::ucx
