#include "support/relay.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <vector>

namespace chorus::testing {

using namespace std::chrono_literals;
using net::Clock;

Relay::Relay(const net::SockAddr& target, size_t flip_at, Direction dir) : target_(target), flip_at_(flip_at), dir_(dir) {
  auto a = net::resolve("127.0.0.1", 0);
  if (a.isOk())
    if (auto l = net::listenOn(*a); l.isOk()) listener_ = std::move(*l);
  if (listener_.valid())
    if (auto b = net::boundAddress(listener_.get()); b.isOk()) addr_ = *b;
  thread_ = std::thread([this] { run(); });
}

Relay::~Relay() {
  stop_ = true;
  thread_.join();
}

void Relay::run() {
  if (!listener_.valid()) return;
  auto deadline = Clock::now() + 20s;
  Result<net::Fd> a = makeError(chorusTimeout, "");
  while (!stop_ && Clock::now() < deadline && !(a = net::acceptUntil(listener_.get(), Clock::now() + 100ms)).isOk()) {
  }
  if (!a.isOk()) return;
  auto b = net::connectTo(target_, Clock::now() + 5s);
  if (!b.isOk()) return;
  const int fds[2] = {a->get(), b->get()};  // client side, server side
  size_t seen = 0;  // bytes of the flipped direction so far
  std::vector<std::byte> buf(65536);
  while (!stop_) {
    pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
    if (::poll(p, 2, 50) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = ::recv(fds[i], buf.data(), buf.size(), MSG_DONTWAIT);
      if (n <= 0) return;
      if (i == static_cast<int>(dir_)) {
        if (flip_at_ >= seen && flip_at_ < seen + static_cast<size_t>(n)) {
          buf[flip_at_ - seen] ^= std::byte{0x80};
          flipped_ = true;
        }
        seen += static_cast<size_t>(n);
      }
      if (!net::writeAll(fds[1 - i], std::span(buf.data(), static_cast<size_t>(n)), Clock::now() + 5s).isOk()) return;
    }
  }
}

}  // namespace chorus::testing
