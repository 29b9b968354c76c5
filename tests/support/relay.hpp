// An on-path attacker for tests: a TCP relay that passes one connection's
// bytes through both ways and flips one bit at a chosen offset of one
// direction's stream (offsets count from the connection's first byte, the
// handshake included).
#pragma once

#include <atomic>
#include <cstddef>
#include <thread>

#include "bootstrap/socket.hpp"

namespace chorus::testing {

class Relay {
 public:
  enum Direction { kClientToServer = 0, kServerToClient = 1 };
  // Listens on loopback; the first connection it accepts is relayed to target.
  Relay(const net::SockAddr& target, size_t flip_at, Direction dir);
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;
  [[nodiscard]] const net::SockAddr& address() const { return addr_; }
  // The byte at flip_at went through (changed).
  [[nodiscard]] bool flipped() const { return flipped_.load(); }

 private:
  void run();
  net::SockAddr target_, addr_;
  size_t flip_at_;
  Direction dir_;
  net::Fd listener_;
  std::atomic<bool> stop_{false}, flipped_{false};
  std::thread thread_;
};

}  // namespace chorus::testing
