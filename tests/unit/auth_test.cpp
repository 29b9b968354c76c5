// Job-secret handshake: good and bad secrets, replay, garbage, bounds and
// deadlines, all over loopback TCP.
#include "bootstrap/auth.hpp"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <future>
#include <thread>
#include <vector>

namespace chorus::auth {
namespace {

using namespace std::chrono_literals;
using net::Clock;
using net::Fd;

Clock::time_point in(std::chrono::milliseconds d) { return Clock::now() + d; }

// A listener on 127.0.0.1 and a way to get connected pairs from it.
class Loopback {
 public:
  Loopback() {
    auto l = net::listenOn(*net::resolve("127.0.0.1", 0));
    EXPECT_TRUE(l.isOk()) << l.status().message();
    listener_ = std::move(*l);
    addr_ = *net::boundAddress(listener_.get());
  }
  std::pair<Fd, Fd> pair() {
    auto c = net::connectTo(addr_, in(5s));
    EXPECT_TRUE(c.isOk());
    auto s = net::acceptUntil(listener_.get(), in(5s));
    EXPECT_TRUE(s.isOk());
    return {std::move(*c), std::move(*s)};
  }

 private:
  Fd listener_;
  net::SockAddr addr_;
};

std::vector<std::byte> bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size()};
}

TEST(Secret, HexRoundTripAndErrors) {
  Secret s = Secret::random();
  EXPECT_TRUE(s.present);
  auto back = Secret::fromHex(s.toHex());
  ASSERT_TRUE(back.isOk());
  EXPECT_EQ(back->bytes, s.bytes);
  EXPECT_TRUE(back->present);
  EXPECT_NE(Secret::random().bytes, s.bytes);
  EXPECT_EQ(Secret::fromHex("abc").status().code(), chorusInvalidArgument);
  std::string bad(64, 'a');
  bad[10] = 'g';
  auto r = Secret::fromHex(bad);
  EXPECT_EQ(r.status().code(), chorusInvalidArgument);
  EXPECT_NE(r.status().message().find("position 10"), std::string::npos);
  auto upper = Secret::fromHex(std::string(64, 'F'));
  ASSERT_TRUE(upper.isOk());
  EXPECT_EQ(upper->bytes[0], std::byte{0xff});
}

TEST(Hmac, MatchesRfc4231StyleKnownValueAndComparesConstantTime) {
  // HMAC-SHA256 with a 32-byte key of 0x0b and data "Hi There" split in two
  // parts must equal the one-part result (parts are concatenated).
  Secret s;
  s.bytes.fill(std::byte{0x0b});
  s.present = true;
  auto hi = bytes("Hi "), there = bytes("There"), whole = bytes("Hi There");
  const std::span<const std::byte> two[] = {hi, there};
  const std::span<const std::byte> one[] = {whole};
  auto a = hmac(s, two), b = hmac(s, one);
  EXPECT_EQ(a, b);
  // Reference: python3 -c "import hmac,hashlib;print(hmac.new(b'\x0b'*32,b'Hi There',hashlib.sha256).hexdigest())"
  Secret digest_as_secret;
  for (size_t i = 0; i < 32; ++i) digest_as_secret.bytes[i] = a[i];
  EXPECT_EQ(digest_as_secret.toHex(), "198a607eb44bfbc69903a0f1cf2bbdc5ba0aa3f3d9ae3c1c7a3b1696a0b68cf7");
  EXPECT_TRUE(equalMac(a, b));
  b[31] ^= std::byte{1};
  EXPECT_FALSE(equalMac(a, b));
  EXPECT_FALSE(equalMac(std::span(a).first(16), b));
  // A different key gives a different MAC; the absent secret is the zero key.
  Secret zero;
  EXPECT_NE(hmac(zero, one), a);
}

TEST(Handshake, GoodSecretPassesAndCarriesHello) {
  Loopback lb;
  auto conn_c = lb.pair();  // no structured bindings: lambdas capture these
  Fd &c = conn_c.first, &s = conn_c.second;
  Secret secret = Secret::random();
  auto hello = bytes("rank 3 comm 42");
  auto server = std::async(std::launch::async, [&] { return serverHandshake(s.get(), secret, in(5s)); });
  Status cs = clientHandshake(c.get(), secret, hello, in(5s));
  auto sr = server.get();
  ASSERT_TRUE(cs.isOk()) << cs.message();
  ASSERT_TRUE(sr.isOk()) << sr.status().message();
  EXPECT_EQ(*sr, hello);
}

TEST(Handshake, EmptyAndMaxHelloAndNoSecret) {
  Loopback lb;
  for (size_t len : {size_t{0}, kMaxHello}) {
    auto conn_c = lb.pair();  // no structured bindings: lambdas capture these
    Fd &c = conn_c.first, &s = conn_c.second;
    Secret none;  // unauthenticated job: still the same wire format
    std::vector<std::byte> hello(len, std::byte{0x5a});
    auto server = std::async(std::launch::async, [&] { return serverHandshake(s.get(), none, in(5s)); });
    ASSERT_TRUE(clientHandshake(c.get(), none, hello, in(5s)).isOk());
    auto sr = server.get();
    ASSERT_TRUE(sr.isOk());
    EXPECT_EQ(*sr, hello);
  }
  auto conn_c = lb.pair();
  Fd& c = conn_c.first;
  std::vector<std::byte> too_big(kMaxHello + 1);
  EXPECT_EQ(clientHandshake(c.get(), Secret::random(), too_big, in(1s)).code(), chorusInvalidArgument);
}

TEST(Handshake, WrongSecretFailsBothSides) {
  Loopback lb;
  auto conn_c = lb.pair();  // no structured bindings: lambdas capture these
  Fd &c = conn_c.first, &s = conn_c.second;
  Secret a = Secret::random(), b = Secret::random();
  auto server = std::async(std::launch::async, [&] {
    auto r = serverHandshake(s.get(), a, in(5s));
    s.reset();  // what a real server does on failure: the client sees the close
    return r;
  });
  Status cs = clientHandshake(c.get(), b, bytes("x"), in(5s));
  auto sr = server.get();
  EXPECT_EQ(sr.status().code(), chorusRemoteError);
  EXPECT_NE(sr.status().message().find("authentication failed"), std::string::npos);
  EXPECT_NE(sr.status().message().find("CHORUS_SECRET"), std::string::npos);
  EXPECT_NE(sr.status().message().find("127.0.0.1"), std::string::npos) << sr.status().message();
  EXPECT_EQ(cs.code(), chorusRemoteError) << cs.message();
  EXPECT_NE(cs.message().find("authentication failed"), std::string::npos);
}

TEST(Handshake, ClientRejectsServerWithoutSecret) {
  // A fake server that sends a valid greeting, then a MAC it cannot compute.
  Loopback lb;
  auto conn_c = lb.pair();  // no structured bindings: lambdas capture these
  Fd &c = conn_c.first, &s = conn_c.second;
  std::thread fake([&] {
    std::vector<std::byte> greet = bytes("CHRS");
    greet.push_back(std::byte{1});
    greet.resize(37, std::byte{7});
    (void)net::writeAll(s.get(), greet, in(5s));
    std::vector<std::byte> msg(34 + 1 + 32);
    (void)net::readAll(s.get(), msg, in(5s));
    std::vector<std::byte> mac(32, std::byte{9});
    (void)net::writeAll(s.get(), mac, in(5s));
  });
  Status cs = clientHandshake(c.get(), Secret::random(), bytes("x"), in(5s));
  fake.join();
  EXPECT_EQ(cs.code(), chorusRemoteError);
  EXPECT_NE(cs.message().find("did not prove"), std::string::npos) << cs.message();
}

TEST(Handshake, ReplayedClientMessageFailsAgainstNewNonce) {
  Loopback lb;
  Secret secret = Secret::random();
  // Connection 1: record what the genuine client sends.
  std::vector<std::byte> recorded;
  {
    auto conn_c = lb.pair();  // no structured bindings: lambdas capture these
    Fd &c = conn_c.first, &s = conn_c.second;
    auto server = std::async(std::launch::async, [&] { return serverHandshake(s.get(), secret, in(5s)); });
    // The genuine client (c2) talks to the real server (s) through a relay
    // that records the client's message, as an eavesdropper would.
    auto conn_c2 = lb.pair();  // no structured bindings: lambdas capture these
    Fd &c2 = conn_c2.first, &s2 = conn_c2.second;
    std::thread rec([&, fd = s2.get()] {
      std::vector<std::byte> greet(37);
      // Relay the real server's greeting to the client.
      (void)net::readAll(c.get(), greet, in(5s));
      (void)net::writeAll(fd, greet, in(5s));
      recorded.resize(34 + 5 + 32);
      (void)net::readAll(fd, recorded, in(5s));
      (void)net::writeAll(c.get(), recorded, in(5s));
      std::vector<std::byte> mac(32);
      (void)net::readAll(c.get(), mac, in(5s));
      (void)net::writeAll(fd, mac, in(5s));
    });
    Status cs = clientHandshake(c2.get(), secret, bytes("hello"), in(5s));
    rec.join();
    ASSERT_TRUE(cs.isOk()) << cs.message();
    ASSERT_TRUE(server.get().isOk());
  }
  // Connection 2: replay the recorded client message to a fresh server.
  auto conn_c = lb.pair();  // no structured bindings: lambdas capture these
  Fd &c = conn_c.first, &s = conn_c.second;
  auto server = std::async(std::launch::async, [&] { return serverHandshake(s.get(), secret, in(5s)); });
  std::vector<std::byte> greet(37);
  ASSERT_TRUE(net::readAll(c.get(), greet, in(5s)).isOk());
  ASSERT_TRUE(net::writeAll(c.get(), recorded, in(5s)).isOk());
  auto sr = server.get();
  EXPECT_EQ(sr.status().code(), chorusRemoteError);
  EXPECT_NE(sr.status().message().find("did not prove"), std::string::npos) << sr.status().message();
}

TEST(Handshake, GarbageFromClientFails) {
  Loopback lb;
  auto conn_c = lb.pair();  // no structured bindings: lambdas capture these
  Fd &c = conn_c.first, &s = conn_c.second;
  auto server = std::async(std::launch::async, [&] { return serverHandshake(s.get(), Secret::random(), in(5s)); });
  std::vector<std::byte> garbage(200);
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = std::byte((i * 37 + 11) & 0xff);
  garbage[32] = std::byte{10};  // hello_len = 10 (in bounds), the MAC is garbage
  garbage[33] = std::byte{0};
  (void)net::writeAll(c.get(), garbage, in(5s));
  auto sr = server.get();
  EXPECT_EQ(sr.status().code(), chorusRemoteError) << sr.status().message();
}

TEST(Handshake, OversizedHelloLenFailsWithoutWaiting) {
  Loopback lb;
  auto conn_c = lb.pair();  // no structured bindings: lambdas capture these
  Fd &c = conn_c.first, &s = conn_c.second;
  auto server = std::async(std::launch::async, [&] { return serverHandshake(s.get(), Secret::random(), in(20s)); });
  std::vector<std::byte> head(34, std::byte{0});
  head[32] = std::byte{0xff};  // hello_len = 0xffff > kMaxHello
  head[33] = std::byte{0xff};
  ASSERT_TRUE(net::writeAll(c.get(), head, in(5s)).isOk());
  auto t0 = Clock::now();
  auto sr = server.get();
  EXPECT_EQ(sr.status().code(), chorusRemoteError);
  EXPECT_NE(sr.status().message().find("65535"), std::string::npos) << sr.status().message();
  EXPECT_LT(Clock::now() - t0, 10s);  // rejected on the bound, not at the 20 s deadline
}

TEST(Handshake, ClientRejectsWrongMagic) {
  Loopback lb;
  auto conn_c = lb.pair();  // no structured bindings: lambdas capture these
  Fd &c = conn_c.first, &s = conn_c.second;
  std::vector<std::byte> greet = bytes("HTTP/1.1 200 OK\r\n\r\n");
  greet.resize(37, std::byte{0x2e});
  ASSERT_TRUE(net::writeAll(s.get(), greet, in(5s)).isOk());
  Status cs = clientHandshake(c.get(), Secret::random(), {}, in(5s));
  EXPECT_EQ(cs.code(), chorusRemoteError);
  EXPECT_NE(cs.message().find("not a chorus endpoint"), std::string::npos) << cs.message();
}

TEST(Handshake, SilentClientTimesOutAtDeadline) {
  Loopback lb;
  auto conn_c = lb.pair();  // the client end stays open and silent
  Fd& s = conn_c.second;
  auto t0 = Clock::now();
  auto sr = serverHandshake(s.get(), Secret::random(), in(150ms));
  EXPECT_EQ(sr.status().code(), chorusTimeout) << sr.status().message();
  EXPECT_GE(Clock::now() - t0, 150ms);
  EXPECT_LT(Clock::now() - t0, 5s);
}

TEST(Handshake, SilentServerTimesOutClient) {
  Loopback lb;
  auto conn_c = lb.pair();  // the server end stays open and silent
  Fd& c = conn_c.first;
  Status cs = clientHandshake(c.get(), Secret::random(), {}, in(100ms));
  EXPECT_EQ(cs.code(), chorusTimeout) << cs.message();
}

TEST(ServerHandshakeMachine, ByteAtATimeMatchesTheBlockingClient) {
  // The event-loop form of the server, fed one byte per call, against the
  // ordinary blocking client.
  Loopback lb;
  auto conn_c = lb.pair();  // no structured bindings: lambdas capture these
  Fd &c = conn_c.first, &s = conn_c.second;
  Secret secret = Secret::random();
  auto hello = bytes("byte by byte");
  auto client = std::async(std::launch::async, [&] { return clientHandshake(c.get(), secret, hello, in(5s)); });
  ServerHandshakeMachine m(secret, "test-peer");
  ASSERT_TRUE(net::writeAll(s.get(), m.greeting(), in(5s)).isOk());
  EXPECT_EQ(m.wanted(), 34u);
  int steps = 0;
  while (!m.done()) {
    std::byte b;
    ASSERT_TRUE(net::readAll(s.get(), std::span(&b, 1), in(5s)).isOk());
    ASSERT_TRUE(m.consume(std::span(&b, 1)).isOk());
    ++steps;
  }
  EXPECT_EQ(steps, 34 + static_cast<int>(hello.size()) + 32);
  EXPECT_EQ(m.wanted(), 0u);
  ASSERT_TRUE(net::writeAll(s.get(), m.proof(), in(5s)).isOk());
  Status cs = client.get();
  EXPECT_TRUE(cs.isOk()) << cs.message();
  EXPECT_EQ(m.takeHello(), hello);
}

TEST(ServerHandshakeMachine, RejectsOverfeedAndStaysFailed) {
  ServerHandshakeMachine m(Secret::random(), "p");
  std::vector<std::byte> head(34, std::byte{0});
  head[32] = std::byte{0x01};
  head[33] = std::byte{0x01};  // hello_len 257
  Status s = m.consume(head);
  EXPECT_EQ(s.code(), chorusRemoteError);
  EXPECT_EQ(m.wanted(), 0u);
  EXPECT_EQ(m.consume({}).code(), chorusRemoteError);
  ServerHandshakeMachine m2(Secret::random(), "p");
  std::vector<std::byte> too_much(35);
  EXPECT_EQ(m2.consume(too_much).code(), chorusInvalidUsage);
}

}  // namespace
}  // namespace chorus::auth

// A thread of the library drawing nonces while its process exits (a rank's
// store gate answering strangers after main returned) must not meet an
// OpenSSL that its atexit handler already freed: the library initialises
// OpenSSL without that handler (auth.cpp).  Each child starts a thread that
// draws random bytes without pause, then exits; with OpenSSL's cleanup at
// exit most children die of SIGSEGV (checked: 10 of 20 with the
// initialisation removed).
TEST(OpenSslAtExit, AThreadDrawingNoncesSurvivesTheProcessExit) {
  int failed = 0;
  for (int i = 0; i < 20; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::thread([] {
        for (;;) (void)chorus::auth::Secret::random();
      }).detach();
      ::usleep(2000);
      std::exit(0);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  EXPECT_EQ(failed, 0) << "children that did not exit cleanly";
}
