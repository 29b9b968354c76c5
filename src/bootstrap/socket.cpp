// Socket helpers: every fd is CLOEXEC, every wait is bounded by a deadline,
// and sends never raise SIGPIPE (a dead peer is an error value, not a signal).
#include "bootstrap/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>


namespace chorus::net {
namespace {

// Milliseconds poll() may wait before `deadline`: -1 for "no deadline", 0 when
// it has passed, rounded up so a sub-millisecond remainder does not busy-spin.
int pollTimeoutMs(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;
  auto now = Clock::now();
  if (deadline <= now) return 0;
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(deadline - now).count();
  int64_t ms = (us + 999) / 1000;
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

// The peer's address for error messages ("?" when unknown).
std::string peerName(int fd) {
  SockAddr a;
  a.len = sizeof a.ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a.ss), &a.len) != 0) return "?";
  return a.toString();
}

// Waits for `events` on fd until deadline.  Ok when ready (or on
// POLLERR/POLLHUP: the following read/write reports the precise error).
Status waitFor(int fd, short events, Clock::time_point deadline, std::string_view what, size_t done,
               size_t total) {
  for (;;) {
    int ms = pollTimeoutMs(deadline);
    if (ms == 0)
      return makeError(chorusTimeout, "{} {} bytes (peer {}) timed out with {} of {} bytes transferred", what, total,
                       peerName(fd), done, total);
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, ms);
    if (r > 0) return {};
    if (r < 0 && errno != EINTR) return errnoError(fmt::format("poll on fd {}", fd), errno);
    // r == 0: loop re-checks the deadline (poll may return early by rounding).
  }
}

bool isLoopback(const SockAddr& a) {
  if (a.family() == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&a.ss);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (a.family() == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a.ss);
    return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
  }
  return false;
}

}  // namespace

uint16_t SockAddr::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

void SockAddr::setPort(uint16_t p) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(p);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(p);
}

std::string SockAddr::toString() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
    return fmt::format("{}:{}", buf, port());
  }
  if (family() == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf);
    if (in6->sin6_scope_id != 0) return fmt::format("[{}%{}]:{}", buf, in6->sin6_scope_id, port());
    return fmt::format("[{}]:{}", buf, port());
  }
  return fmt::format("<address family {}>", family());
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);  // close() errors are not actionable here (fd is gone either way)
  fd_ = fd;
}

Result<SockAddr> resolve(const std::string& host, uint16_t port) {
  if (host.empty()) return invalidArgument("cannot resolve an empty host name (is the master address set?)");
  // A bracketed IPv6 literal ("[::1]") is accepted as users copy it from URLs.
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_ADDRCONFIG;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(h.c_str(), nullptr, &hints, &res);
  if (rc == EAI_BADFLAGS || (rc != 0 && rc != EAI_SYSTEM)) {
    // AI_ADDRCONFIG hides loopback-only hosts' addresses in minimal network
    // namespaces; retry without it before giving up.
    hints.ai_flags = 0;
    rc = ::getaddrinfo(h.c_str(), nullptr, &hints, &res);
  }
  if (rc != 0 || res == nullptr)
    return makeError(chorusSystemError, "cannot resolve host '{}': {} (check the master address / DNS)", host,
                     rc == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(rc));
  // Prefer IPv4 when a name has both: the other ranks most likely chose IPv4 too.
  const addrinfo* pick = res;
  for (const addrinfo* ai = res; ai; ai = ai->ai_next)
    if (ai->ai_family == AF_INET) {
      pick = ai;
      break;
    }
  SockAddr a;
  std::memcpy(&a.ss, pick->ai_addr, pick->ai_addrlen);
  a.len = pick->ai_addrlen;
  ::freeaddrinfo(res);
  a.setPort(port);
  return a;
}

Result<SockAddr> interfaceAddress(const std::string& ifname) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return errnoError("getifaddrs", errno);
  SockAddr v4, v6;
  bool found_if = false;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (i->ifa_name == nullptr || ifname != i->ifa_name) continue;
    found_if = true;
    if (i->ifa_addr == nullptr) continue;
    if (i->ifa_addr->sa_family == AF_INET && v4.len == 0) {
      std::memcpy(&v4.ss, i->ifa_addr, sizeof(sockaddr_in));
      v4.len = sizeof(sockaddr_in);
    } else if (i->ifa_addr->sa_family == AF_INET6 && v6.len == 0) {
      std::memcpy(&v6.ss, i->ifa_addr, sizeof(sockaddr_in6));
      v6.len = sizeof(sockaddr_in6);
    }
  }
  ::freeifaddrs(list);
  if (v4.len != 0) return v4;
  if (v6.len != 0) return v6;
  if (!found_if)
    return invalidArgument("network interface '{}' does not exist (check CHORUS_SOCKET_IFNAME; `ip addr` lists them)",
                           ifname);
  return invalidArgument("network interface '{}' has no IPv4 or IPv6 address (check CHORUS_SOCKET_IFNAME)", ifname);
}

Result<SockAddr> localAddressFor(const SockAddr& remote) {
  Fd s(::socket(remote.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return errnoError("socket(SOCK_DGRAM)", errno);
  SockAddr target = remote;
  if (target.port() == 0) target.setPort(9);  // connect() on UDP needs a port; nothing is sent
  if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&target.ss), target.len) != 0)
    return errnoError(fmt::format("no route to {} (set CHORUS_SOCKET_IFNAME?)", remote.toString()), errno);
  CHORUS_ASSIGN_OR_RETURN(SockAddr local, boundAddress(s.get()));
  local.setPort(0);
  return local;
}

Result<SockAddr> chooseBindAddress(const SockAddr& master, const std::string& ifname) {
  if (!ifname.empty()) return interfaceAddress(ifname);
  if (isLoopback(master)) {
    SockAddr a = master;
    a.setPort(0);
    return a;
  }
  return localAddressFor(master);
}

Result<Fd> listenOn(const SockAddr& addr, int backlog) {
  Fd s(::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return errnoError("socket(SOCK_STREAM)", errno);
  int one = 1;
  if (::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
    return errnoError("setsockopt(SO_REUSEADDR)", errno);
  if (::bind(s.get(), reinterpret_cast<const sockaddr*>(&addr.ss), addr.len) != 0)
    return errnoError(fmt::format("bind to {}", addr.toString()), errno);
  if (::listen(s.get(), backlog) != 0) return errnoError(fmt::format("listen on {}", addr.toString()), errno);
  return s;
}

Result<SockAddr> boundAddress(int fd) {
  SockAddr a;
  a.len = sizeof a.ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a.ss), &a.len) != 0) return errnoError("getsockname", errno);
  return a;
}

Result<Fd> connectTo(const SockAddr& addr, Clock::time_point deadline) {
  // Backoff between refused attempts: the peer is most likely still starting,
  // so retry quickly at first and then at most every 100 ms.
  auto backoff = std::chrono::milliseconds(1);
  int last_err = 0;
  int attempts = 0;
  for (;;) {
    ++attempts;
    Fd s(::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s.valid()) return errnoError("socket(SOCK_STREAM)", errno);
    int err = 0;
    if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr.ss), addr.len) != 0) {
      err = errno;
      if (err == EINPROGRESS || err == EINTR) {
        // EINTR on a non-blocking connect: the connection still proceeds asynchronously.
        for (;;) {
          int ms = pollTimeoutMs(deadline);
          if (ms == 0) {
            err = ETIMEDOUT;
            break;
          }
          pollfd p{s.get(), POLLOUT, 0};
          int r = ::poll(&p, 1, ms);
          if (r < 0 && errno == EINTR) continue;
          if (r < 0) return errnoError("poll (connect)", errno);
          if (r == 0) continue;
          socklen_t len = sizeof err;
          if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
          break;
        }
      }
    }
    if (err == 0) {
      CHORUS_RETURN_IF_ERROR(setNonBlocking(s.get(), false));
      CHORUS_RETURN_IF_ERROR(setNoDelay(s.get()));
      return s;
    }
    last_err = err;
    bool retryable = err == ECONNREFUSED || err == ETIMEDOUT || err == ECONNRESET || err == EAGAIN ||
                     err == ECONNABORTED || err == EHOSTUNREACH || err == ENETUNREACH;
    if (!retryable) return errnoError(fmt::format("connect to {}", addr.toString()), err);
    auto now = Clock::now();
    if (now >= deadline) break;
    auto sleep = std::min<Clock::duration>(backoff, deadline - now);
    std::this_thread::sleep_for(sleep);  // retry pacing, not synchronisation
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
  char buf[128];
  return makeError(chorusTimeout,
                   "could not connect to {} before the deadline ({} attempts, last error: {}); is rank 0 / the peer "
                   "running and reachable at that address?",
                   addr.toString(), attempts, strerror_r(last_err, buf, sizeof buf));
}

Result<Fd> acceptUntil(int listen_fd, Clock::time_point deadline) {
  for (;;) {
    int ms = pollTimeoutMs(deadline);
    if (ms == 0) return makeError(chorusTimeout, "no connection arrived on listening fd {} before the deadline", listen_fd);
    pollfd p{listen_fd, POLLIN, 0};
    int r = ::poll(&p, 1, ms);
    if (r < 0 && errno != EINTR) return errnoError("poll (accept)", errno);
    if (r <= 0) continue;
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      Fd s(fd);
      // Linux does not inherit O_NONBLOCK on accept, but the listener's state is
      // not ours to assume: make the contract ("blocking mode") explicit.
      CHORUS_RETURN_IF_ERROR(setNonBlocking(fd, false));
      CHORUS_RETURN_IF_ERROR(setNoDelay(fd));
      return s;
    }
    int err = errno;
    // The connection vanished between poll and accept, or a transient error.
    if (err == EINTR || err == EAGAIN || err == EWOULDBLOCK || err == ECONNABORTED || err == EPROTO) continue;
    return errnoError("accept", err);
  }
}

Status setNonBlocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) return errnoError("fcntl(F_GETFL)", errno);
  int want = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (want != flags && ::fcntl(fd, F_SETFL, want) != 0) return errnoError("fcntl(F_SETFL)", errno);
  return {};
}

Status setNoDelay(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
    if (errno == EOPNOTSUPP || errno == ENOPROTOOPT) return {};  // not TCP (e.g. a socketpair in tests)
    return errnoError("setsockopt(TCP_NODELAY)", errno);
  }
  return {};
}

// Both loops try the I/O first with MSG_DONTWAIT (works for blocking and
// non-blocking sockets alike) and poll only when it would block, so the
// deadline bounds every wait.  Non-socket fds (pipes) fall back to
// poll + read/write.
Status writeAll(int fd, std::span<const std::byte> data, Clock::time_point deadline) {
  size_t done = 0;
  bool is_socket = true;
  while (done < data.size()) {
    ssize_t n;
    if (is_socket) {
      n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == ENOTSOCK) {
        is_socket = false;
        continue;
      }
    } else {
      CHORUS_RETURN_IF_ERROR(waitFor(fd, POLLOUT, deadline, "write of", done, data.size()));
      n = ::write(fd, data.data() + done, data.size() - done);
    }
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    int err = n < 0 ? errno : EAGAIN;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      CHORUS_RETURN_IF_ERROR(waitFor(fd, POLLOUT, deadline, "write of", done, data.size()));
      continue;
    }
    if (err == EPIPE || err == ECONNRESET || err == ENOTCONN)
      return remoteError("peer {} closed the connection while we wrote {} bytes ({} sent): {}", peerName(fd),
                         data.size(), done, std::strerror(err));
    return errnoError(fmt::format("write to {}", peerName(fd)), err);
  }
  return {};
}

Status readAll(int fd, std::span<std::byte> data, Clock::time_point deadline) {
  size_t done = 0;
  bool is_socket = true;
  while (done < data.size()) {
    ssize_t n;
    if (is_socket) {
      n = ::recv(fd, data.data() + done, data.size() - done, MSG_DONTWAIT);
      if (n < 0 && errno == ENOTSOCK) {
        is_socket = false;
        continue;
      }
    } else {
      CHORUS_RETURN_IF_ERROR(waitFor(fd, POLLIN, deadline, "read of", done, data.size()));
      n = ::read(fd, data.data() + done, data.size() - done);
    }
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0)
      return remoteError("peer {} closed the connection after {} of {} expected bytes (did it exit or fail?)",
                         peerName(fd), done, data.size());
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      CHORUS_RETURN_IF_ERROR(waitFor(fd, POLLIN, deadline, "read of", done, data.size()));
      continue;
    }
    if (err == ECONNRESET || err == ENOTCONN || err == EPIPE)
      return remoteError("peer {} reset the connection after {} of {} expected bytes: {}", peerName(fd), done,
                         data.size(), std::strerror(err));
    return errnoError(fmt::format("read from {}", peerName(fd)), err);
  }
  return {};
}

}  // namespace chorus::net
