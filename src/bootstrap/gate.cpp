// Admission on a listener strangers can reach (see gate.hpp).
#include "bootstrap/gate.hpp"

#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "common/log.hpp"

namespace chorus::auth {

using net::Clock;

namespace {

constexpr size_t kMaxHostsNamed = 4;
constexpr int kAcceptsPerPoll = 64;  // a storm cannot starve the owner's other work
constexpr auto kAcceptPause = std::chrono::milliseconds(100);

constexpr std::string_view kRefusalText[kRefusalKinds] = {
    "silent past the handshake deadline", "failed authentication", "closed during the handshake",
    "dropped to make room (too many unauthenticated connections)", "refused after authentication"};

// "10.0.0.5:41234" -> "10.0.0.5"; "[::1]:5" -> "[::1]".
std::string hostOf(std::string_view peer) {
  auto colon = peer.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::string(peer);
  return std::string(peer.substr(0, colon));
}

}  // namespace

// ---------------------------------------------------------------- StrangerLog

StrangerLog::StrangerLog(std::string where) : where_(std::move(where)) {}

StrangerLog::~StrangerLog() {
  size_t left = 0;
  for (size_t n : unreported_) left += n;
  if (left > 0) log::warn("{}: refused {}", where_, describe(unreported_));
}

void StrangerLog::refused(std::string_view peer, Refusal why, std::string_view detail) {
  ++counts_[static_cast<size_t>(why)];
  std::string host = hostOf(peer);
  if (std::find(hosts_.begin(), hosts_.end(), host) == hosts_.end()) {
    if (hosts_.size() < kMaxHostsNamed)
      hosts_.push_back(std::move(host));
    else
      ++more_hosts_;
  }
  if (!logged_first_) {
    logged_first_ = true;
    last_line_ = Clock::now();
    log::warn("{}: refused a connection from {}: {} (further refusals are summarised every {} s)", where_, peer, detail,
              kReportEvery.count());
    return;
  }
  ++unreported_[static_cast<size_t>(why)];
  tick();
}

Clock::time_point StrangerLog::nextReport() const {
  for (size_t n : unreported_)
    if (n > 0) return last_line_ + kReportEvery;
  return Clock::time_point::max();
}

void StrangerLog::tick() {
  if (Clock::now() < nextReport()) return;
  log::warn("{}: refused {} in the last {} s", where_, describe(unreported_), kReportEvery.count());
  unreported_.fill(0);
  last_line_ = Clock::now();
}

size_t StrangerLog::total() const {
  size_t t = 0;
  for (size_t n : counts_) t += n;
  return t;
}

std::string StrangerLog::describe(const std::array<size_t, kRefusalKinds>& counts) const {
  size_t total = 0;
  std::string parts;
  for (size_t i = 0; i < kRefusalKinds; ++i) {
    if (counts[i] == 0) continue;
    total += counts[i];
    parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", counts[i], kRefusalText[i]);
  }
  std::string hosts;
  for (const std::string& h : hosts_) hosts += fmt::format("{}{}", hosts.empty() ? "" : ", ", h);
  if (more_hosts_ > 0) hosts += fmt::format(" and {} more hosts", more_hosts_);
  return fmt::format("{} connection{} ({}) from {}", total, total == 1 ? "" : "s", parts, hosts);
}

std::string StrangerLog::summary() const { return total() == 0 ? std::string() : describe(counts_); }

// ---------------------------------------------------------------- Gate

size_t defaultMaxPending() {
  rlimit lim{};
  size_t nofile = 1024;
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) nofile = lim.rlim_cur;
  return std::clamp<size_t>(nofile / 8, 4, 64);
}

struct Gate::Pending {
  net::Fd fd;
  std::string peer;
  ServerHandshakeMachine hs;
  Clock::time_point deadline;
  std::vector<std::byte> out;  // greeting, then proof, not yet sent
  size_t out_off = 0;
  size_t received = 0;  // bytes from the client so far
  bool dead = false;

  Pending(net::Fd f, std::string p, const Secret& s, Clock::time_point d)
      : fd(std::move(f)), peer(std::move(p)), hs(s, peer), deadline(d) {}
};

Gate::Gate(int listen_fd, const Secret& secret, std::string where, GateOptions options)
    : listen_fd_(listen_fd),
      secret_(secret),
      options_(options),
      max_pending_(options.max_pending > 0 ? options.max_pending : defaultMaxPending()),
      log_(std::move(where)) {
  (void)net::setNonBlocking(listen_fd_, true);  // a failure shows as a blocking accept: never here (poll says ready)
}

Gate::~Gate() = default;

size_t Gate::appendPollFds(std::vector<pollfd>& fds) {
  bool accepting = Clock::now() >= accept_paused_until_;
  fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
  polled_.clear();
  for (auto& p : pending_) {
    short ev = POLLRDHUP;
    ev |= p->out_off < p->out.size() ? POLLOUT : POLLIN;
    fds.push_back({p->fd.get(), ev, 0});
    polled_.push_back(p.get());
  }
  return 1 + polled_.size();
}

std::vector<Admitted> Gate::onPoll(std::span<const pollfd> entries) {
  for (size_t i = 1; i < entries.size() && i - 1 < polled_.size(); ++i)
    if (entries[i].revents != 0 && !polled_[i - 1]->dead) drive(*polled_[i - 1], entries[i].revents);
  polled_.clear();
  if (!entries.empty() && (entries[0].revents & POLLIN)) acceptReady();
  expire();
  return std::exchange(admitted_, {});
}

void Gate::expire() {
  auto now = Clock::now();
  for (auto& p : pending_)
    if (!p->dead && now >= p->deadline)
      refuse(*p, Refusal::kSilent,
             fmt::format("no complete job-secret handshake within {} ms (a port scanner, a slow client, or not a "
                         "chorus peer)",
                         options_.handshake_timeout.count()));
  std::erase_if(pending_, [](const std::unique_ptr<Pending>& p) { return p->dead; });
  log_.tick();
}

Clock::time_point Gate::nextDeadline() const {
  auto next = log_.nextReport();
  for (const auto& p : pending_) next = std::min(next, p->deadline);
  if (accept_paused_until_ > Clock::now()) next = std::min(next, accept_paused_until_);
  return next;
}

void Gate::acceptReady() {
  for (int i = 0; i < kAcceptsPerPoll; ++i) {
    net::SockAddr peer;
    peer.len = sizeof peer.ss;
    int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer.ss), &peer.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
      // EMFILE/ENFILE/ENOBUFS: the connection stays in the backlog and poll
      // would report it again at once; pause accepting briefly instead.
      // Logged once: under a flood this would repeat every pause.
      if (accept_failures_++ == 0)
        log::warn("{}: accept failed: {}; pausing accepts for {} ms each time (raise `ulimit -n`?)", log_.where(),
                  std::strerror(err), kAcceptPause.count());
      accept_paused_until_ = Clock::now() + kAcceptPause;
      return;
    }
    (void)net::setNoDelay(fd);  // latency only (the proof and the answer after it); failure is harmless
    size_t live = static_cast<size_t>(
        std::count_if(pending_.begin(), pending_.end(), [](const auto& p) { return !p->dead; }));
    if (live >= max_pending_) evictOne();
    auto p = std::make_unique<Pending>(net::Fd(fd), peer.toString(), secret_,
                                       Clock::now() + options_.handshake_timeout);
    if (Status s = p->hs.consume({}); !s.isOk()) {  // a failed nonce draw
      refuse(*p, Refusal::kBadAuth, s.message());
      continue;
    }
    auto g = p->hs.greeting();
    p->out.assign(g.begin(), g.end());
    drive(*p, POLLOUT);
    if (!p->dead) pending_.push_back(std::move(p));
  }
}

void Gate::evictOne() {
  // The oldest that has said nothing, else the oldest: an honest peer
  // answers the greeting at once, so it is rarely the one displaced.
  Pending* victim = nullptr;
  for (auto& p : pending_)
    if (!p->dead && p->received == 0) {
      victim = p.get();
      break;
    }
  if (victim == nullptr)
    for (auto& p : pending_)
      if (!p->dead) {
        victim = p.get();
        break;
      }
  if (victim == nullptr) return;
  // Tell an honest client to connect again (auth.hpp, kBusyBytes); the
  // greeting went out whole at accept, so this lands where the proof would.
  if (victim->out_off == victim->out.size()) {
    std::array<std::byte, kBusyBytes> busy;
    busy.fill(kBusyByte);
    (void)::send(victim->fd.get(), busy.data(), busy.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    // Unread input would turn the close into a reset, which can drop the
    // notice before the client reads it: take what the client sent.
    std::byte sink[512];
    for (int i = 0; i < 4 && ::recv(victim->fd.get(), sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
    }
  }
  refuse(*victim, Refusal::kEvicted,
           fmt::format("{} unauthenticated connections were already waiting", max_pending_));
}

void Gate::drive(Pending& p, short revents) {
  // Write what is queued (the greeting; the proof at the end).
  while (p.out_off < p.out.size()) {
    ssize_t n = ::send(p.fd.get(), p.out.data() + p.out_off, p.out.size() - p.out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p.out_off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    refuse(p, Refusal::kClosed, fmt::format("send failed: {}", std::strerror(errno)));
    return;
  }
  if (p.hs.done()) {  // the proof is out: admitted
    admitted_.push_back(Admitted{std::move(p.fd), p.peer, p.hs.takeHello(), p.hs.sessionKeys()});
    p.dead = true;
    return;
  }
  if (!(revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR))) return;
  // Read exactly what the machine wants: nothing beyond the handshake is
  // taken from the socket (the owner reads the rest).
  std::byte buf[512];
  while (p.hs.wanted() > 0) {
    ssize_t n = ::recv(p.fd.get(), buf, std::min(sizeof buf, p.hs.wanted()), MSG_DONTWAIT);
    if (n > 0) {
      p.received += static_cast<size_t>(n);
      if (Status s = p.hs.consume(std::span(buf, static_cast<size_t>(n))); !s.isOk()) {
        refuse(p, Refusal::kBadAuth, s.message());
        return;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    refuse(p, Refusal::kClosed,
           n == 0 ? std::string("closed before completing the handshake") : std::string(std::strerror(errno)));
    return;
  }
  if (p.hs.done()) {
    auto proof = p.hs.proof();
    p.out.assign(proof.begin(), proof.end());
    p.out_off = 0;
    drive(p, 0);
  }
}

void Gate::refuse(Pending& p, Refusal why, std::string_view detail) {
  if (p.dead) return;
  log_.refused(p.peer, why, detail);
  p.fd.reset();
  p.dead = true;
}

}  // namespace chorus::auth
