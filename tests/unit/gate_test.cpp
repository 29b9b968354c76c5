// auth::Gate: strangers on a listener (silent, slow, garbage, a flood past
// the cap) cost honest clients nothing, are closed by their deadline or
// displaced, and are counted by kind; the StrangerLog's summary names them.
#include "bootstrap/gate.hpp"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

namespace chorus::auth {
namespace {

using namespace std::chrono_literals;
using net::Clock;

Secret secretOf(int seed) {
  Secret s;
  for (size_t i = 0; i < s.bytes.size(); ++i) s.bytes[i] = std::byte(seed * 31 + static_cast<int>(i));
  s.present = true;
  return s;
}

// A listener with its Gate served by a thread until stopped; every admitted
// connection's hello is recorded.
class Served {
 public:
  explicit Served(GateOptions opt) {
    auto addr = net::resolve("127.0.0.1", 0);
    EXPECT_TRUE(addr.isOk());
    auto l = net::listenOn(*addr, 1024);
    EXPECT_TRUE(l.isOk()) << l.status().message();
    listener_ = std::move(*l);
    addr_ = *net::boundAddress(listener_.get());
    gate_ = std::make_unique<Gate>(listener_.get(), secretOf(1), "test listener", opt);
    thread_ = std::thread([this] { loop(); });
  }
  ~Served() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  [[nodiscard]] const net::SockAddr& address() const { return addr_; }
  size_t admitted() const { return admitted_.load(); }
  // The client's handshake ends when it reads the proof, a moment before the
  // server's loop hands the connection over: wait (bounded) for that.
  size_t admittedWithin(size_t want, std::chrono::milliseconds limit) const {
    auto end = Clock::now() + limit;
    while (admitted_.load() < want && Clock::now() < end) std::this_thread::sleep_for(1ms);
    return admitted_.load();
  }
  size_t maxPendingSeen() const { return max_pending_seen_.load(); }
  // Read after stop().
  Gate& gate() { return *gate_; }

 private:
  void loop() {
    std::vector<pollfd> fds;
    while (!stop_) {
      fds.clear();
      size_t n = gate_->appendPollFds(fds);
      ::poll(fds.data(), fds.size(), 10);
      for (Admitted& a : gate_->onPoll(std::span(fds).first(n))) {
        if (std::string(reinterpret_cast<const char*>(a.hello.data()), a.hello.size()) == "honest") ++admitted_;
        kept_.push_back(std::move(a.fd));
      }
      max_pending_seen_ = std::max(max_pending_seen_.load(), gate_->pending());
    }
  }

  net::Fd listener_;
  net::SockAddr addr_;
  std::unique_ptr<Gate> gate_;
  std::vector<net::Fd> kept_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> admitted_{0};
  std::atomic<size_t> max_pending_seen_{0};
  std::thread thread_;
};

net::Fd connectRaw(const net::SockAddr& a) {
  auto fd = net::connectTo(a, Clock::now() + 5s);
  EXPECT_TRUE(fd.isOk()) << fd.status().message();
  return fd.isOk() ? std::move(*fd) : net::Fd();
}

// An honest client's whole handshake; returns its duration.
Clock::duration honestHandshake(const net::SockAddr& a) {
  auto t0 = Clock::now();
  net::Fd fd = connectRaw(a);
  std::string_view hello = "honest";
  Status s = clientHandshake(fd.get(), secretOf(1), std::as_bytes(std::span(hello.data(), hello.size())),
                             Clock::now() + 10s);
  EXPECT_TRUE(s.isOk()) << s.message();
  return Clock::now() - t0;
}

TEST(Gate, SilentSlowAndGarbageConnectionsDoNotDelayHonestOnes) {
  Served srv(GateOptions{.handshake_timeout = 1500ms, .max_pending = 64});
  std::vector<net::Fd> silent, slow;
  for (int i = 0; i < 20; ++i) silent.push_back(connectRaw(srv.address()));
  for (int i = 0; i < 5; ++i) slow.push_back(connectRaw(srv.address()));
  std::mt19937 rng(7);
  for (int i = 0; i < 5; ++i) {  // garbage: refused as soon as the head is read
    net::Fd g = connectRaw(srv.address());
    std::vector<std::byte> junk(300);
    for (auto& b : junk) b = std::byte(rng() & 0xff);
    (void)net::writeAll(g.get(), junk, Clock::now() + 1s);
  }
  // The slow ones dribble a byte each while the honest clients come and go.
  std::byte one{0x42};
  for (int round = 0; round < 8; ++round) {
    for (auto& f : slow) (void)::send(f.get(), &one, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    auto took = honestHandshake(srv.address());
    EXPECT_LT(took, 1s) << "an honest handshake waited behind strangers (round " << round << ")";
  }
  EXPECT_EQ(srv.admittedWithin(8, 2s), 8u);
  // Past the deadline every stranger is gone.
  std::this_thread::sleep_for(2s);
  srv.stop();
  Gate& g = srv.gate();
  EXPECT_EQ(g.pending(), 0u);
  EXPECT_EQ(g.strangers().count(Refusal::kSilent), 25u);  // silent and slow alike: no complete handshake in time
  EXPECT_GE(g.strangers().count(Refusal::kBadAuth) + g.strangers().count(Refusal::kClosed), 5u);
  std::string sum = g.strangers().summary();
  EXPECT_NE(sum.find("25 silent past the handshake deadline"), std::string::npos) << sum;
  EXPECT_NE(sum.find("127.0.0.1"), std::string::npos) << sum;
}

TEST(Gate, AFloodHoldsAtMostTheCapAndHonestClientsStillGetIn) {
  constexpr size_t kCap = 8;
  Served srv(GateOptions{.handshake_timeout = 30s, .max_pending = kCap});
  std::vector<net::Fd> flood;
  for (int i = 0; i < 100; ++i) flood.push_back(connectRaw(srv.address()));
  for (int i = 0; i < 3; ++i) EXPECT_LT(honestHandshake(srv.address()), 1s);
  // The server side closed all but the newest kCap: their reads see EOF.
  std::this_thread::sleep_for(200ms);
  size_t closed = 0, told_busy = 0;
  for (auto& f : flood) {
    // The greeting (37 bytes), for a displaced one the busy notice (32 x
    // 0xff, auth.hpp), then the end of the stream.
    std::vector<std::byte> got;
    std::byte b[256];
    ssize_t n;
    while ((n = ::recv(f.get(), b, sizeof b, MSG_DONTWAIT)) > 0) got.insert(got.end(), b, b + n);
    if (n == 0) ++closed;
    if (got.size() == 37 + auth::kBusyBytes &&
        std::all_of(got.begin() + 37, got.end(), [](std::byte x) { return x == auth::kBusyByte; }))
      ++told_busy;
  }
  EXPECT_EQ(srv.admittedWithin(3, 2s), 3u);
  srv.stop();
  EXPECT_LE(srv.maxPendingSeen(), kCap);
  // The flood past the cap, and one more for the first honest client (it
  // found kCap waiting; the ones after it found kCap - 1).
  EXPECT_EQ(srv.gate().strangers().count(Refusal::kEvicted), 100 - kCap + 1);
  EXPECT_EQ(closed, 100 - kCap + 1);
  EXPECT_EQ(told_busy, 100 - kCap + 1) << "each displaced connection is told to connect again";
}

TEST(Gate, AWrongSecretIsRefusedAsBadAuthentication) {
  Served srv(GateOptions{.handshake_timeout = 5s, .max_pending = 16});
  net::Fd fd = connectRaw(srv.address());
  std::string_view hello = "honest";
  Status s = clientHandshake(fd.get(), secretOf(2), std::as_bytes(std::span(hello.data(), hello.size())),
                             Clock::now() + 5s);
  EXPECT_FALSE(s.isOk());
  EXPECT_LT(honestHandshake(srv.address()), 1s);
  EXPECT_EQ(srv.admittedWithin(1, 2s), 1u);
  srv.stop();
  EXPECT_EQ(srv.gate().strangers().count(Refusal::kBadAuth), 1u);
}

TEST(StrangerLog, SummaryCountsEachKindAndNamesHosts) {
  StrangerLog log("test");
  EXPECT_EQ(log.summary(), "");
  log.refused("10.0.0.5:4000", Refusal::kSilent, "x");
  log.refused("10.0.0.5:4001", Refusal::kSilent, "x");
  log.refused("[::1]:9", Refusal::kBadAuth, "y");
  EXPECT_EQ(log.total(), 3u);
  std::string s = log.summary();
  EXPECT_NE(s.find("3 connections"), std::string::npos) << s;
  EXPECT_NE(s.find("2 silent"), std::string::npos) << s;
  EXPECT_NE(s.find("1 failed authentication"), std::string::npos) << s;
  EXPECT_NE(s.find("10.0.0.5, [::1]"), std::string::npos) << s;
  // The first refusal was logged; the next two wait for the summary line.
  EXPECT_NE(log.nextReport(), Clock::time_point::max());
  EXPECT_LE(log.nextReport(), Clock::now() + StrangerLog::kReportEvery);
}

}  // namespace
}  // namespace chorus::auth
