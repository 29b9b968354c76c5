// Connection setup of the TCP transport.
//
// Protocol, per rank r (collective over r and its peers):
//  1. listen on setup.bind_addr with an ephemeral port and publish the bound
//     address in the store under "tcp/<r>" (the raw net::SockAddr record);
//  2. for every peer p > r, in increasing order: read "tcp/<p>", open
//     sockets_per_peer connections to it, and on each run
//     auth::clientHandshake with the hello {comm_id, rank r, socket index,
//     sockets_per_peer} (tcp_wire.hpp), then wait for the 4-byte ack;
//  3. concurrently (a thread), accept the connections of every peer p < r:
//     auth::serverHandshake, then check the authenticated hello — our comm_id,
//     a rank we expect a connection from, an index in range and not seen yet,
//     the same sockets_per_peer — and answer with the ack.
//     With setup.rma each pair has one more connection, the one-sided one
//     (tcp_wire.hpp), opened last with the socket index sockets_per_peer,
//     and every hello's sockets_per_peer carries kHelloRmaBit (ranks that
//     disagree on it fail at the first hello).  A connection that
//     fails any check is closed and counted, and accepting goes on: a
//     stranger (port scanner, a rank of another job, a stale rank of this
//     one) cannot break setup.  Handshakes run concurrently (auth::Gate), so
//     a silent, slow or garbage connection delays no honest one, and a flood
//     holds a bounded number of descriptors; the refusals are logged once and
//     then summarised, and named in the timeout error if setup times out.
// The listener is closed once every expected connection arrived, so nothing
// can connect afterwards.  Every wait is bounded by setup.timeout.
#include "transport/tcp/tcp_setup.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "bootstrap/auth.hpp"
#include "bootstrap/gate.hpp"
#include "common/log.hpp"
#include "transport/tcp/tcp_wire.hpp"

namespace chorus::transport::tcp {
namespace {

using net::Clock;

// Writing the 4-byte ack to an admitted connection (an empty send buffer:
// it does not wait unless the peer is gone).
constexpr auto kAckCap = std::chrono::seconds(2);
constexpr int kMaxSocketsPerPeer = 64;

std::string storeKey(int rank) { return fmt::format("tcp/{}", rank); }

std::chrono::milliseconds remaining(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

Status validate(const TcpSetup& s) {
  if (s.rank < 0) return invalidArgument("tcp transport: rank {} is negative", s.rank);
  if (s.protect != auth::WireProtect::kOff && !s.secret.present)
    return invalidArgument("tcp transport: CHORUS_WIRE_PROTECT={} needs a job secret (its keys derive from it); set "
                           "CHORUS_SECRET or launch with chorus-run",
                           auth::wireProtectName(s.protect));
  if (s.sockets_per_peer < 1 || s.sockets_per_peer > kMaxSocketsPerPeer)
    return invalidArgument("tcp transport: sockets_per_peer={} is outside [1, {}] (check CHORUS_TCP_SOCKETS)",
                           s.sockets_per_peer, kMaxSocketsPerPeer);
  std::vector<int> sorted = s.peers;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] == s.rank)
      return invalidArgument("tcp transport on rank {}: peer {} is invalid (negative or this rank)", s.rank, sorted[i]);
    if (i > 0 && sorted[i] == sorted[i - 1])
      return invalidArgument("tcp transport on rank {}: peer {} is listed twice", s.rank, sorted[i]);
  }
  return {};
}

// Accepts the connections of the lower-ranked peers.  Runs on its own thread
// during setup; owns nothing but writes links[i].socks for lower peers only,
// which the main thread does not touch until it has joined this one.
class Acceptor {
 public:
  Acceptor(const TcpSetup& setup, int listen_fd, std::vector<PeerLink>& links)
      : setup_(setup), listen_fd_(listen_fd), links_(links) {
    for (size_t i = 0; i < links.size(); ++i)
      if (links[i].rank < setup.rank) {
        links[i].socks.resize(static_cast<size_t>(setup.sockets_per_peer));
        links[i].keys.resize(static_cast<size_t>(setup.sockets_per_peer));
        expected_ += static_cast<size_t>(setup.sockets_per_peer) + (setup.rma ? 1 : 0);
      }
  }

  [[nodiscard]] size_t expected() const { return expected_; }

  // Thread-safe: ends run() at its next wait.
  void cancel() {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(cancel_.get(), &one, sizeof one);
  }

  Status init() {
    cancel_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!cancel_.valid()) return errnoError("eventfd (tcp setup)", errno);
    return net::setNonBlocking(listen_fd_, true);
  }

  Status run(Clock::time_point deadline) {
    auth::Gate gate(listen_fd_, setup_.secret, fmt::format("tcp transport listener of rank {}", setup_.rank));
    std::vector<pollfd> fds;
    size_t got = 0;
    while (got < expected_) {
      auto now = Clock::now();
      if (now >= deadline) return timeoutError(gate.strangers());
      fds.clear();
      fds.push_back({cancel_.get(), POLLIN, 0});
      const size_t n = gate.appendPollFds(fds);
      auto wake = std::min(deadline, gate.nextDeadline());
      auto ms = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
      int r = ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30)));
      if (r < 0 && errno != EINTR) return errnoError("poll (tcp setup accept)", errno);
      if (r > 0 && fds[0].revents != 0)
        return internalError("tcp setup on rank {}: accepting cancelled", setup_.rank);
      if (r < 0) continue;
      for (auth::Admitted& a : gate.onPoll(std::span(fds).subspan(1, n))) {
        std::string peer = a.peer;
        if (Status s = admit(std::move(a), deadline); !s.isOk()) {
          gate.strangers().refused(peer, auth::Refusal::kRejected, s.message());
          continue;
        }
        ++got;
      }
    }
    return {};
  }

 private:
  Status admit(auth::Admitted a, Clock::time_point deadline) {
    const std::vector<std::byte>& raw = a.hello;
    Hello h;
    if (raw.size() != sizeof h)
      return remoteError("hello has {} bytes, expected {} (not a chorus tcp transport connection?)", raw.size(),
                         sizeof h);
    std::memcpy(&h, raw.data(), sizeof h);
    if (h.magic != kHelloMagic) return remoteError("hello has a bad magic {:#x}", h.magic);
    if (h.comm_id != setup_.comm_id)
      return remoteError("hello names communicator {:#x}, this is {:#x} (a rank of another communicator?)", h.comm_id,
                         setup_.comm_id);
    const int32_t protect = static_cast<int32_t>(setup_.protect) << kHelloProtectShift;
    if ((h.nsockets & kHelloProtectMask) != protect)
      return remoteError("rank {} protects its connections' bytes with CHORUS_WIRE_PROTECT={}, this rank with {} (set "
                         "it alike on all ranks)",
                         h.rank,
                         auth::wireProtectName(static_cast<auth::WireProtect>((h.nsockets & kHelloProtectMask) >>
                                                                              kHelloProtectShift)),
                         auth::wireProtectName(setup_.protect));
    h.nsockets &= ~kHelloProtectMask;
    const int32_t want = setup_.sockets_per_peer | (setup_.rma ? kHelloRmaBit : 0);
    if (h.nsockets != want && (h.nsockets & ~kHelloRmaBit) == setup_.sockets_per_peer)
      return remoteError("rank {} {} a one-sided (RMA) connection, this rank {} (enable the TCP transport's one-sided "
                         "operations alike on all ranks)", h.rank, setup_.rma ? "opens no" : "opens",
                         setup_.rma ? "expects one" : "has none");
    if (h.nsockets != want)
      return remoteError("rank {} uses {} sockets per peer, this rank {} (set CHORUS_TCP_SOCKETS alike on all ranks)",
                         h.rank, h.nsockets & ~kHelloRmaBit, setup_.sockets_per_peer);
    auto it = std::find_if(links_.begin(), links_.end(), [&](const PeerLink& l) { return l.rank == h.rank; });
    if (it == links_.end() || h.rank >= setup_.rank)
      return remoteError("hello names rank {}, which is not a lower-ranked peer of rank {}", h.rank, setup_.rank);
    if (h.index < 0 || h.index > setup_.sockets_per_peer - (setup_.rma ? 0 : 1))
      return remoteError("hello names socket index {} (of {})", h.index, setup_.sockets_per_peer);
    net::Fd& slot = h.index == setup_.sockets_per_peer ? it->rma : it->socks[static_cast<size_t>(h.index)];
    if (slot.valid()) return remoteError("rank {} socket {} is already connected (duplicate)", h.rank, h.index);
    uint32_t ack = kAck;
    CHORUS_RETURN_IF_ERROR(
        net::writeAll(a.fd.get(), std::as_bytes(std::span(&ack, 1)), std::min(deadline, Clock::now() + kAckCap)));
    // The links are handed over in blocking mode (tcp_setup.hpp).
    CHORUS_RETURN_IF_ERROR(net::setNonBlocking(a.fd.get(), false));
    it->addr = a.peer;
    slot = std::move(a.fd);
    if (h.index == setup_.sockets_per_peer)
      it->rma_keys = a.keys;
    else
      it->keys[static_cast<size_t>(h.index)] = a.keys;
    return {};
  }

  Status timeoutError(const auth::StrangerLog& strangers) const {
    std::string missing;
    for (const PeerLink& l : links_) {
      if (l.rank >= setup_.rank) continue;
      size_t have =
          static_cast<size_t>(std::count_if(l.socks.begin(), l.socks.end(), [](auto& f) { return f.valid(); }));
      const size_t want = l.socks.size() + (setup_.rma ? 1 : 0);
      have += setup_.rma && l.rma.valid() ? 1 : 0;
      if (have < want) missing += fmt::format("{}{} ({}/{})", missing.empty() ? "" : ", ", l.rank, have, want);
    }
    std::string others = strangers.summary();
    return makeError(chorusTimeout,
                     "tcp transport setup on rank {}: ranks {} did not connect within {} ms (did they start, and can "
                     "they reach this host?){}",
                     setup_.rank, missing, setup_.timeout.count(),
                     others.empty() ? std::string()
                                    : fmt::format("; meanwhile this listener refused {}", others));
  }

  const TcpSetup& setup_;
  int listen_fd_;
  std::vector<PeerLink>& links_;
  net::Fd cancel_;
  size_t expected_ = 0;
};

Status connectOne(const TcpSetup& setup, const net::SockAddr& addr, int peer, int index, Clock::time_point deadline,
                  net::Fd& out, auth::SessionKeys& keys) {
  CHORUS_ASSIGN_OR_RETURN(net::Fd fd, net::connectTo(addr, deadline));
  Hello h;
  h.comm_id = setup.comm_id;
  h.rank = setup.rank;
  h.index = index;
  h.nsockets = setup.sockets_per_peer | (setup.rma ? kHelloRmaBit : 0) |
               static_cast<int32_t>(setup.protect) << kHelloProtectShift;
  CHORUS_RETURN_IF_ERROR(
      auth::clientHandshake(fd.get(), setup.secret, std::as_bytes(std::span(&h, 1)), deadline, &keys));
  uint32_t ack = 0;
  Status s = net::readAll(fd.get(), std::as_writable_bytes(std::span(&ack, 1)), deadline);
  if (!s.isOk() || ack != kAck)
    return remoteError(
        "rank {} refused socket {} after authentication (its log says why: another communicator, or "
        "different CHORUS_TCP_SOCKETS or CHORUS_WIRE_PROTECT, or one-sided operations enabled on one side only?){}{}",
        peer, index, s.isOk() ? "" : ": ", s.message());
  out = std::move(fd);
  return {};
}

Status connectHigher(const TcpSetup& setup, bootstrap::Store& store, std::vector<PeerLink>& links,
                     Clock::time_point deadline) {
  std::vector<size_t> order;
  for (size_t i = 0; i < links.size(); ++i)
    if (links[i].rank > setup.rank) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return links[a].rank < links[b].rank; });
  for (size_t i : order) {
    PeerLink& link = links[i];
    CHORUS_ASSIGN_OR_RETURN(bootstrap::Bytes raw, store.get(storeKey(link.rank), remaining(deadline)));
    net::SockAddr addr;
    if (raw.size() != sizeof addr)
      return internalError("store key '{}' holds {} bytes, not an address record of {} bytes", storeKey(link.rank),
                           raw.size(), sizeof addr);
    std::memcpy(&addr, raw.data(), sizeof addr);
    link.addr = addr.toString();
    link.socks.resize(static_cast<size_t>(setup.sockets_per_peer));
    link.keys.resize(static_cast<size_t>(setup.sockets_per_peer));
    for (int k = 0; k < setup.sockets_per_peer + (setup.rma ? 1 : 0); ++k) {
      const bool rma = k == setup.sockets_per_peer;
      net::Fd& slot = rma ? link.rma : link.socks[static_cast<size_t>(k)];
      auth::SessionKeys& keys = rma ? link.rma_keys : link.keys[static_cast<size_t>(k)];
      // A listener flooded by strangers may drop us before the handshake
      // ends (auth::serverBusy): connect again, with a growing pause.
      Status s = auth::retryWhileBusy(
          deadline, [&] { return connectOne(setup, addr, link.rank, k, deadline, slot, keys); });
      if (!s.isOk())
        return s.withContext(fmt::format("tcp transport setup: rank {} connecting to rank {} at {}: ", setup.rank,
                                         link.rank, link.addr));
    }
  }
  return {};
}

}  // namespace

Result<std::vector<PeerLink>> establishLinks(const TcpSetup& setup, bootstrap::Store& store) {
  CHORUS_RETURN_IF_ERROR(validate(setup));
  auto deadline = Clock::now() + setup.timeout;
  std::vector<PeerLink> links(setup.peers.size());
  for (size_t i = 0; i < links.size(); ++i) links[i].rank = setup.peers[i];

  net::SockAddr bind = setup.bind_addr;
  bind.setPort(0);
  CHORUS_ASSIGN_OR_RETURN(net::Fd listener, net::listenOn(bind));
  CHORUS_ASSIGN_OR_RETURN(net::SockAddr bound, net::boundAddress(listener.get()));
  CHORUS_RETURN_IF_ERROR(store.set(storeKey(setup.rank), bootstrap::toBytes(bound)));

  Acceptor acceptor(setup, listener.get(), links);
  Status accept_status;
  std::thread thread;
  if (acceptor.expected() > 0) {
    CHORUS_RETURN_IF_ERROR(acceptor.init());
    thread = std::thread([&] { accept_status = acceptor.run(deadline); });
  }
  Status connect_status = connectHigher(setup, store, links, deadline);
  if (thread.joinable()) {
    if (!connect_status.isOk()) acceptor.cancel();
    thread.join();
  }
  CHORUS_RETURN_IF_ERROR(connect_status);
  CHORUS_RETURN_IF_ERROR(accept_status);
  return links;
}

}  // namespace chorus::transport::tcp
