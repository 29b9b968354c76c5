// Socket helpers over loopback: connect/accept, full reads and writes with
// deadlines, timeouts and peer close as distinct error codes.
#include "bootstrap/socket.hpp"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/socket.h>

#include <numeric>
#include <thread>
#include <vector>

namespace chorus::net {
namespace {

using namespace std::chrono_literals;

Clock::time_point in(std::chrono::milliseconds d) { return Clock::now() + d; }

struct Pair {
  Fd listener, client, server;
};

Pair connectedPair(const char* host = "127.0.0.1") {
  Pair p;
  auto addr = resolve(host, 0);
  EXPECT_TRUE(addr.isOk()) << addr.status().message();
  auto l = listenOn(*addr);
  EXPECT_TRUE(l.isOk()) << l.status().message();
  p.listener = std::move(*l);
  auto bound = boundAddress(p.listener.get());
  EXPECT_TRUE(bound.isOk());
  EXPECT_NE(bound->port(), 0);
  auto c = connectTo(*bound, in(5s));
  EXPECT_TRUE(c.isOk()) << c.status().message();
  p.client = std::move(*c);
  auto s = acceptUntil(p.listener.get(), in(5s));
  EXPECT_TRUE(s.isOk()) << s.status().message();
  p.server = std::move(*s);
  return p;
}

TEST(SockAddr, FormatsAndSetsPort) {
  auto a = resolve("127.0.0.1", 1234);
  ASSERT_TRUE(a.isOk());
  EXPECT_EQ(a->family(), AF_INET);
  EXPECT_EQ(a->toString(), "127.0.0.1:1234");
  a->setPort(99);
  EXPECT_EQ(a->port(), 99);
  auto b = resolve("::1", 7);
  if (b.isOk()) {
    EXPECT_EQ(b->toString(), "[::1]:7");
  }
  EXPECT_FALSE(resolve("", 1).isOk());
}

TEST(Socket, AllFdsAreCloexec) {
  Pair p = connectedPair();
  for (int fd : {p.listener.get(), p.client.get(), p.server.get()}) EXPECT_TRUE(fcntl(fd, F_GETFD) & FD_CLOEXEC);
}

TEST(Socket, LargeTransferBothWays) {
  Pair p = connectedPair();
  std::vector<std::byte> out(8 << 20), in_buf(out.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = std::byte(i * 131 + 7);
  // A large write cannot complete until the peer reads, so write on a thread.
  Status wst;
  std::thread w([&] { wst = writeAll(p.client.get(), out, in(20s)); });
  Status rst = readAll(p.server.get(), in_buf, in(20s));
  w.join();
  ASSERT_TRUE(wst.isOk()) << wst.message();
  ASSERT_TRUE(rst.isOk()) << rst.message();
  EXPECT_EQ(out, in_buf);
}

TEST(Socket, ReadTimesOutAtDeadline) {
  Pair p = connectedPair();
  std::vector<std::byte> buf(16);
  auto t0 = Clock::now();
  Status s = readAll(p.server.get(), buf, in(100ms));
  EXPECT_EQ(s.code(), chorusTimeout) << s.message();
  EXPECT_GE(Clock::now() - t0, 100ms);
  EXPECT_LT(Clock::now() - t0, 5s);
}

TEST(Socket, PartialThenTimeoutReportsProgress) {
  Pair p = connectedPair();
  std::vector<std::byte> half(8, std::byte{1});
  ASSERT_TRUE(writeAll(p.client.get(), half, in(1s)).isOk());
  std::vector<std::byte> buf(16);
  Status s = readAll(p.server.get(), buf, in(50ms));
  EXPECT_EQ(s.code(), chorusTimeout);
  EXPECT_NE(s.message().find("8 of 16"), std::string::npos) << s.message();
}

TEST(Socket, PeerCloseIsRemoteError) {
  Pair p = connectedPair();
  std::vector<std::byte> three(3, std::byte{2});
  ASSERT_TRUE(writeAll(p.client.get(), three, in(1s)).isOk());
  p.client.reset();
  std::vector<std::byte> buf(16);
  Status s = readAll(p.server.get(), buf, in(5s));
  EXPECT_EQ(s.code(), chorusRemoteError) << s.message();
}

TEST(Socket, WriteToClosedPeerIsRemoteErrorNotSigpipe) {
  Pair p = connectedPair();
  p.server.reset();
  std::vector<std::byte> buf(1 << 20);
  Status s;
  // The first write may land in the buffer; the RST makes a later one fail.
  for (int i = 0; i < 50 && s.isOk(); ++i) s = writeAll(p.client.get(), buf, in(5s));
  EXPECT_EQ(s.code(), chorusRemoteError) << s.message();
}

TEST(Socket, ConnectRetriesUntilListenerAppears) {
  // Reserve a port, close it, then listen on it again shortly after the client started.
  auto addr = resolve("127.0.0.1", 0);
  ASSERT_TRUE(addr.isOk());
  SockAddr target;
  {
    auto l = listenOn(*addr);
    ASSERT_TRUE(l.isOk());
    target = *boundAddress(l->get());
  }
  Result<Fd> c = Status(chorusInternalError, "unset");
  std::thread t([&] { c = connectTo(target, in(10s)); });
  std::this_thread::sleep_for(50ms);  // lets the client see ECONNREFUSED at least once (not synchronisation)
  auto l = listenOn(target);
  ASSERT_TRUE(l.isOk()) << l.status().message();
  t.join();
  ASSERT_TRUE(c.isOk()) << c.status().message();
  auto s = acceptUntil(l->get(), in(5s));
  EXPECT_TRUE(s.isOk());
}

TEST(Socket, ConnectToNothingTimesOut) {
  auto addr = resolve("127.0.0.1", 0);
  SockAddr target;
  {
    auto l = listenOn(*addr);
    target = *boundAddress(l->get());
  }
  auto t0 = Clock::now();
  auto c = connectTo(target, in(200ms));
  EXPECT_EQ(c.status().code(), chorusTimeout) << c.status().message();
  EXPECT_LT(Clock::now() - t0, 5s);
  EXPECT_NE(c.status().message().find(target.toString()), std::string::npos);
}

TEST(Socket, AcceptTimesOut) {
  auto addr = resolve("127.0.0.1", 0);
  auto l = listenOn(*addr);
  ASSERT_TRUE(l.isOk());
  auto s = acceptUntil(l->get(), in(50ms));
  EXPECT_EQ(s.status().code(), chorusTimeout);
}

TEST(Socket, Ipv6Loopback) {
  // Linux has ::1 on lo unless IPv6 is switched off (net.ipv6.conf.lo.disable_ipv6=1):
  // chorus must work over it, so its absence fails rather than skips.
  auto a = resolve("::1", 0);
  ASSERT_TRUE(a.isOk()) << "no IPv6 loopback: " << a.status().message();
  auto l = listenOn(*a);
  ASSERT_TRUE(l.isOk()) << "cannot bind ::1 (is net.ipv6.conf.lo.disable_ipv6 set?): " << l.status().message();
  auto bound = *boundAddress(l->get());
  EXPECT_EQ(bound.family(), AF_INET6);
  auto c = connectTo(bound, in(5s));
  ASSERT_TRUE(c.isOk()) << c.status().message();
  auto s = acceptUntil(l->get(), in(5s));
  ASSERT_TRUE(s.isOk());
  std::vector<std::byte> msg{std::byte{1}, std::byte{2}}, got(2);
  ASSERT_TRUE(writeAll(c->get(), msg, in(1s)).isOk());
  ASSERT_TRUE(readAll(s->get(), got, in(1s)).isOk());
  EXPECT_EQ(msg, got);
}

TEST(Socket, LocalAddressForLoopbackIsLoopback) {
  auto a = resolve("127.0.0.1", 5000);
  auto local = localAddressFor(*a);
  ASSERT_TRUE(local.isOk()) << local.status().message();
  EXPECT_EQ(local->toString(), "127.0.0.1:0");
}

TEST(Socket, InterfaceAddressOfLoopbackAndMissing) {
  auto lo = interfaceAddress("lo");
  ASSERT_TRUE(lo.isOk()) << lo.status().message();
  EXPECT_EQ(lo->toString(), "127.0.0.1:0");
  auto bad = interfaceAddress("nosuchif0");
  EXPECT_EQ(bad.status().code(), chorusInvalidArgument);
  EXPECT_NE(bad.status().message().find("nosuchif0"), std::string::npos);
}

TEST(Socket, ChooseBindAddressHonoursIfname) {
  auto master = resolve("10.255.255.1", 1);
  auto a = chooseBindAddress(*master, "lo");
  ASSERT_TRUE(a.isOk()) << a.status().message();
  EXPECT_EQ(a->toString(), "127.0.0.1:0");
  EXPECT_FALSE(chooseBindAddress(*master, "nosuchif0").isOk());
  auto loop = chooseBindAddress(*resolve("127.0.0.1", 9), "");
  ASSERT_TRUE(loop.isOk());
  EXPECT_EQ(loop->toString(), "127.0.0.1:0");
}

}  // namespace
}  // namespace chorus::net
