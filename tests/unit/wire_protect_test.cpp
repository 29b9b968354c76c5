// The record layer of CHORUS_WIRE_PROTECT: round trips in both modes, what
// the wire shows, and every kind of tampering an on-path relay can do
// (change, drop, replay, reorder, truncate, other keys) ending in an error.
#include "bootstrap/wire_protect.hpp"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <thread>

#include "bootstrap/socket.hpp"

namespace chorus::auth {
namespace {

using namespace std::chrono_literals;

Secret secretOf(int seed) {
  Secret s;
  for (size_t i = 0; i < s.bytes.size(); ++i) s.bytes[i] = std::byte(seed * 13 + static_cast<int>(i));
  s.present = true;
  return s;
}

std::array<std::byte, 32> nonce(int seed) {
  std::array<std::byte, 32> n{};
  for (size_t i = 0; i < n.size(); ++i) n[i] = std::byte(seed + static_cast<int>(i) * 7);
  return n;
}

struct Pair {
  int fd[2] = {-1, -1};
  Pair() {
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fd), 0);
  }
  ~Pair() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
};

// Client and server ends of one connection's keys.
SessionKeys keysOf(bool client, int secret = 1) {
  return deriveSessionKeys(secretOf(secret), nonce(1), nonce(2), client);
}

std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = std::byte(rng() & 0xff);
  return v;
}

// Moves `data` from `tx` (fd a) to `rx` (fd b), alternating non-blocking
// writes and reads in random-sized pieces; returns what rx read.
std::vector<std::byte> pump(SealedStream& tx, int a, SealedStream& rx, int b, const std::vector<std::byte>& data,
                            std::mt19937& rng) {
  std::vector<std::byte> got(data.size());
  size_t sent = 0, recvd = 0;
  for (int guard = 0; guard < 1000000 && recvd < data.size(); ++guard) {
    if (sent < data.size() || tx.outPending()) {
      if (sent < data.size()) {
        size_t n = std::min<size_t>(data.size() - sent, 1 + rng() % 200000);
        // Two pieces: the layer gathers iovecs.
        size_t half = n / 2;
        iovec iov[2] = {{const_cast<std::byte*>(data.data() + sent), half},
                        {const_cast<std::byte*>(data.data() + sent + half), n - half}};
        ssize_t w = tx.writev(a, iov, 2);
        if (w > 0) {
          sent += static_cast<size_t>(w);
        } else {
          EXPECT_EQ(errno, EAGAIN);
        }
      } else {
        EXPECT_GE(tx.flush(a), 0);
      }
    }
    size_t want = std::min<size_t>(data.size() - recvd, 1 + rng() % 100000);
    iovec r{got.data() + recvd, want};
    ssize_t n = rx.readv(b, &r, 1);
    if (n > 0) {
      recvd += static_cast<size_t>(n);
    } else if (n < 0) {
      EXPECT_EQ(errno, EAGAIN) << rx.error();
    }
  }
  EXPECT_EQ(recvd, data.size());
  return got;
}

TEST(WireProtect, RoundTripsInBothModesAndBothDirections) {
  std::mt19937 rng(3);
  for (WireProtect mode : {WireProtect::kMac, WireProtect::kEncrypt}) {
    Pair p;
    SealedStream c(mode, keysOf(true)), s(mode, keysOf(false));
    for (size_t n : {size_t{1}, size_t{24}, size_t{4095}, size_t{65536}, size_t{65537}, size_t{3} << 20}) {
      auto data = pattern(n, static_cast<uint32_t>(n));
      EXPECT_EQ(pump(c, p.fd[0], s, p.fd[1], data, rng), data) << wireProtectName(mode) << " " << n;
      EXPECT_EQ(pump(s, p.fd[1], c, p.fd[0], data, rng), data) << wireProtectName(mode) << " back " << n;
    }
    EXPECT_GT(c.recordsSent(), 50u);
    EXPECT_EQ(c.recordsSent(), s.recordsReceived());
  }
}

// What an on-path observer sees: the plaintext under `mac`, never under `encrypt`.
TEST(WireProtect, EncryptHidesThePayloadAndMacDoesNot) {
  const std::string secret_text = "the quick brown fox jumps over the lazy dog, 0123456789";
  for (WireProtect mode : {WireProtect::kMac, WireProtect::kEncrypt}) {
    Pair p;
    SealedStream c(mode, keysOf(true));
    iovec iov{const_cast<char*>(secret_text.data()), secret_text.size()};
    ASSERT_EQ(c.writev(p.fd[0], &iov, 1), static_cast<ssize_t>(secret_text.size()));
    std::string wire(4096, '\0');
    ssize_t n = ::recv(p.fd[1], wire.data(), wire.size(), 0);
    ASSERT_EQ(n, static_cast<ssize_t>(secret_text.size() + SealedStream::kOverhead));
    wire.resize(static_cast<size_t>(n));
    EXPECT_EQ(wire.find(secret_text) != std::string::npos, mode == WireProtect::kMac) << wireProtectName(mode);
  }
}

// Records captured on the wire, for a relay to play with.
std::vector<std::vector<std::byte>> capture(WireProtect mode, int records, size_t each) {
  Pair p;
  SealedStream c(mode, keysOf(true));
  std::vector<std::vector<std::byte>> out;
  for (int i = 0; i < records; ++i) {
    auto data = pattern(each, static_cast<uint32_t>(i));
    iovec iov{data.data(), data.size()};
    EXPECT_EQ(c.writev(p.fd[0], &iov, 1), static_cast<ssize_t>(each));
    std::vector<std::byte> rec(each + SealedStream::kOverhead);
    EXPECT_TRUE(net::readAll(p.fd[1], rec, net::Clock::now() + 5s).isOk());
    out.push_back(std::move(rec));
  }
  return out;
}

// Feeds `wire` to a fresh receiver; returns the first error (errno) and its text, or 0.
std::pair<int, std::string> deliver(WireProtect mode, const std::vector<std::vector<std::byte>>& wire,
                                    bool close_after = false, int secret = 1) {
  Pair p;
  SealedStream s(mode, keysOf(false, secret));
  for (const auto& r : wire) EXPECT_TRUE(net::writeAll(p.fd[0], r, net::Clock::now() + 5s).isOk());
  if (close_after) {
    ::close(p.fd[0]);
    p.fd[0] = -1;
  }
  std::vector<std::byte> buf(1 << 20);
  for (int i = 0; i < 1000; ++i) {
    iovec iov{buf.data(), buf.size()};
    ssize_t n = s.readv(p.fd[1], &iov, 1);
    if (n < 0 && errno != EAGAIN) return {errno, s.error()};
    if (n == 0) return {0, ""};
    if (n < 0) return {0, ""};  // all read, nothing wrong
  }
  return {0, ""};
}

TEST(WireProtect, ChangedDroppedReplayedReorderedTruncatedAndForeignRecordsFail) {
  for (WireProtect mode : {WireProtect::kMac, WireProtect::kEncrypt}) {
    SCOPED_TRACE(std::string(wireProtectName(mode)));
    auto recs = capture(mode, 4, 1000);
    EXPECT_EQ(deliver(mode, recs).first, 0);  // untouched: fine
    auto changed = recs;
    changed[1][4 + 500] ^= std::byte{0x80};  // one payload bit (a float's sign)
    auto r = deliver(mode, changed);
    EXPECT_EQ(r.first, EBADMSG);
    EXPECT_NE(r.second.find("record #1"), std::string::npos) << r.second;
    auto len_changed = recs;
    len_changed[0][0] = std::byte{0xe7};  // 999 bytes announced: the tag covers the length
    EXPECT_NE(deliver(mode, len_changed).first, 0);
    auto dropped = recs;
    dropped.erase(dropped.begin() + 1);
    EXPECT_EQ(deliver(mode, dropped).first, EBADMSG);
    auto replayed = recs;
    replayed.insert(replayed.begin() + 2, recs[1]);
    EXPECT_EQ(deliver(mode, replayed).first, EBADMSG);
    auto reordered = recs;
    std::swap(reordered[1], reordered[2]);
    EXPECT_EQ(deliver(mode, reordered).first, EBADMSG);
    auto truncated = recs;
    truncated.back().resize(300);
    EXPECT_EQ(deliver(mode, truncated, /*close_after=*/true).first, EPROTO);
    EXPECT_EQ(deliver(mode, recs, false, /*secret=*/2).first, EBADMSG);  // another job's keys
    std::vector<std::vector<std::byte>> huge{{std::byte{0xff}, std::byte{0xff}, std::byte{0xff}, std::byte{0x7f}}};
    EXPECT_EQ(deliver(mode, huge).first, EPROTO);
  }
}

// The handshake gives both ends matching keys: the client's send key is the
// server's receive key, and two connections never share keys.
TEST(WireProtect, HandshakeDerivesMatchingKeysPerConnection) {
  std::vector<SessionKeys> servers, clients;
  for (int conn = 0; conn < 2; ++conn) {
    Pair p;
    int sfd = p.fd[1];
    ASSERT_TRUE(net::setNonBlocking(p.fd[0], false).isOk());
    ASSERT_TRUE(net::setNonBlocking(sfd, false).isOk());
    SessionKeys ck;
    std::thread client([&] {
      std::byte hello[4] = {};
      EXPECT_TRUE(clientHandshake(p.fd[0], secretOf(5), hello, net::Clock::now() + 5s, &ck).isOk());
    });
    ServerHandshakeMachine m(secretOf(5), "test");
    ASSERT_TRUE(m.consume({}).isOk());
    ASSERT_TRUE(net::writeAll(sfd, m.greeting(), net::Clock::now() + 5s).isOk());
    std::vector<std::byte> buf;
    while (!m.done()) {
      buf.resize(m.wanted());
      ASSERT_TRUE(net::readAll(sfd, buf, net::Clock::now() + 5s).isOk());
      ASSERT_TRUE(m.consume(buf).isOk());
    }
    ASSERT_TRUE(net::writeAll(sfd, m.proof(), net::Clock::now() + 5s).isOk());
    client.join();
    SessionKeys sk = m.sessionKeys();
    ASSERT_TRUE(sk.valid && ck.valid);
    EXPECT_EQ(ck.send, sk.recv);
    EXPECT_EQ(ck.recv, sk.send);
    EXPECT_NE(ck.send, ck.recv);
    servers.push_back(sk);
    clients.push_back(ck);
  }
  EXPECT_NE(clients[0].send, clients[1].send);  // fresh nonces, fresh keys
}

TEST(WireProtect, ParsesItsModes) {
  EXPECT_EQ(*parseWireProtect("off"), WireProtect::kOff);
  EXPECT_EQ(*parseWireProtect("mac"), WireProtect::kMac);
  EXPECT_EQ(*parseWireProtect("encrypt"), WireProtect::kEncrypt);
  auto bad = parseWireProtect("aes");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("off, mac, encrypt"), std::string::npos);
}

}  // namespace
}  // namespace chorus::auth
