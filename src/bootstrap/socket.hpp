// Small socket helpers shared by the store and the TCP transport.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/status.hpp"

namespace chorus::net {

using Clock = std::chrono::steady_clock;

// An IPv4 or IPv6 socket address.
struct SockAddr {
  sockaddr_storage ss{};
  socklen_t len = 0;

  [[nodiscard]] int family() const { return ss.ss_family; }
  [[nodiscard]] uint16_t port() const;
  void setPort(uint16_t port);
  [[nodiscard]] std::string toString() const;  // "1.2.3.4:5" or "[::1]:5"
};

// Owns a file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.release();
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  [[nodiscard]] int get() const { return fd_; }
  [[nodiscard]] bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Resolves "host" (name, IPv4 or IPv6 literal) and port.
Result<SockAddr> resolve(const std::string& host, uint16_t port);
// The address of interface `ifname` (IPv4 preferred).
Result<SockAddr> interfaceAddress(const std::string& ifname);
// The local address the kernel would use to reach `remote` (UDP connect trick).
Result<SockAddr> localAddressFor(const SockAddr& remote);
// The address to bind listeners to: interface ifname's if not empty
// (Config::net.socket_ifname, CHORUS_SOCKET_IFNAME), else the one routing to
// `master` (or loopback when master is loopback).
Result<SockAddr> chooseBindAddress(const SockAddr& master, const std::string& ifname);

// A listening TCP socket bound to addr (port 0 = ephemeral); CLOEXEC, REUSEADDR.
Result<Fd> listenOn(const SockAddr& addr, int backlog = 128);
// The bound address of a socket (to learn an ephemeral port).
Result<SockAddr> boundAddress(int fd);
// Connects with retries (ECONNREFUSED while the peer is starting) until deadline.
Result<Fd> connectTo(const SockAddr& addr, Clock::time_point deadline);
// accept() with a deadline (poll).  Returns the connected socket, blocking mode.
Result<Fd> acceptUntil(int listen_fd, Clock::time_point deadline);

Status setNonBlocking(int fd, bool on);
Status setNoDelay(int fd);

// Blocking-with-deadline full read/write (poll + read/write loops).  A peer
// that closes mid-message is chorusRemoteError; the deadline passing is
// chorusTimeout.
Status writeAll(int fd, std::span<const std::byte> data, Clock::time_point deadline);
Status readAll(int fd, std::span<std::byte> data, Clock::time_point deadline);

}  // namespace chorus::net
