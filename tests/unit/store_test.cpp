// The rendezvous store over loopback: operations, blocking gets, timeouts,
// hostile clients (wrong secret, silent, garbage) next to good ones, and
// prompt shutdown.
#include "bootstrap/store.hpp"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <random>
#include <thread>

#include "bootstrap/memory_store.hpp"
#include "support/relay.hpp"

namespace chorus::bootstrap {
namespace {

using namespace std::chrono_literals;
using net::Clock;

Clock::time_point in(std::chrono::milliseconds d) { return Clock::now() + d; }

struct Server {
  auth::Secret secret = auth::Secret::random();
  std::unique_ptr<StoreServer> server;
  explicit Server(StoreServerOptions opt = {}) {
    auto s = StoreServer::start(*net::resolve("127.0.0.1", 0), secret, opt);
    EXPECT_TRUE(s.isOk()) << s.status().message();
    server = std::move(*s);
  }
  std::shared_ptr<Store> client() {
    auto c = connectStore(server->address(), secret, 5s);
    EXPECT_TRUE(c.isOk()) << c.status().message();
    return c.isOk() ? *c : nullptr;
  }
};

// A good client doing a full set/get/add cycle: proves the server still serves.
void expectServes(Server& s, const std::string& tag) {
  auto c = s.client();
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->set("alive/" + tag, toBytes(std::string_view(tag))).isOk());
  auto v = c->get("alive/" + tag, 5s);
  ASSERT_TRUE(v.isOk()) << v.status().message();
  EXPECT_EQ(toString(*v), tag);
  auto n = c->add("alive/count", 1);
  EXPECT_TRUE(n.isOk());
}

// Reads from a raw connection until the server closes it; true if it did.
bool closedByServer(int fd, std::chrono::milliseconds within) {
  std::byte b[256];
  auto deadline = in(within);
  for (;;) {
    Status s = net::readAll(fd, std::span(b, 1), deadline);
    if (s.code() == chorusRemoteError) return true;
    if (!s.isOk()) return false;
  }
}

TEST(StoreServer, SetGetAddAcrossEightClientThreads) {
  Server s;
  constexpr int kThreads = 8, kAdds = 50;
  std::vector<std::thread> ts;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      auto c = s.client();
      if (!c) return void(++failures);
      if (!c->set(fmt::format("rank{}", t), toBytes(fmt::format("addr-{}", t))).isOk()) ++failures;
      for (int i = 0; i < kAdds; ++i)
        if (!c->add("counter", 1).isOk()) ++failures;
      for (int j = 0; j < kThreads; ++j) {
        auto v = c->get(fmt::format("rank{}", j), 10s);
        if (!v.isOk() || toString(*v) != fmt::format("addr-{}", j)) ++failures;
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto c = s.client();
  auto total = c->add("counter", 0);
  ASSERT_TRUE(total.isOk());
  EXPECT_EQ(*total, kThreads * kAdds);
  auto as_string = c->get("counter", 1s);  // add keeps a decimal string, as MemoryStore does
  ASSERT_TRUE(as_string.isOk());
  EXPECT_EQ(toString(*as_string), std::to_string(kThreads * kAdds));
}

TEST(StoreServer, GetBlocksUntilALaterSet) {
  Server s;
  auto getter = s.client(), setter = s.client();
  auto fut = std::async(std::launch::async, [&] { return getter->get("late", 10s); });
  // Makes it likely the get is parked first; the assertion holds either way.
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(fut.wait_for(0ms), std::future_status::timeout);
  ASSERT_TRUE(setter->set("late", toBytes(std::string_view("here"))).isOk());
  auto v = fut.get();
  ASSERT_TRUE(v.isOk()) << v.status().message();
  EXPECT_EQ(toString(*v), "here");
}

TEST(StoreServer, ManyWaitersOnOneKey) {
  Server s;
  std::vector<std::future<Result<Bytes>>> futs;
  std::vector<std::shared_ptr<Store>> clients;
  for (int i = 0; i < 6; ++i) clients.push_back(s.client());
  for (auto& c : clients) futs.push_back(std::async(std::launch::async, [c] { return c->get("go", 10s); }));
  ASSERT_TRUE(s.client()->add("go", 7).isOk());
  for (auto& f : futs) {
    auto v = f.get();
    ASSERT_TRUE(v.isOk());
    EXPECT_EQ(toString(*v), "7");
  }
}

TEST(StoreServer, GetTimeoutNamesKeyAndKeepsConnection) {
  Server s;
  auto c = s.client();
  auto t0 = Clock::now();
  auto v = c->get("never/set", 150ms);
  EXPECT_EQ(v.status().code(), chorusTimeout);
  EXPECT_NE(v.status().message().find("never/set"), std::string::npos) << v.status().message();
  EXPECT_GE(Clock::now() - t0, 150ms);
  EXPECT_LT(Clock::now() - t0, 5s);
  // The timed-out get was answered by the server, so the stream is in sync.
  ASSERT_TRUE(c->set("after", toBytes(std::string_view("ok"))).isOk());
  auto a = c->get("after", 1s);
  ASSERT_TRUE(a.isOk());
  EXPECT_EQ(toString(*a), "ok");
}

TEST(StoreServer, LargeValuesAndLimits) {
  Server s;
  auto c = s.client();
  Bytes big(16 << 20);
  for (size_t i = 0; i < big.size(); i += 4096) big[i] = std::byte(i >> 12);
  ASSERT_TRUE(c->set("big", big).isOk());
  auto v = c->get("big", 5s);
  ASSERT_TRUE(v.isOk());
  EXPECT_EQ(*v, big);
  big.push_back(std::byte{0});
  EXPECT_EQ(c->set("big2", big).code(), chorusInvalidArgument);
  EXPECT_EQ(c->set(std::string(1025, 'k'), {}).code(), chorusInvalidArgument);
  EXPECT_EQ(c->set("", {}).code(), chorusInvalidArgument);
  EXPECT_TRUE(c->set(std::string(1024, 'k'), {}).isOk());
  // Client-side rejections do not break the connection.
  EXPECT_TRUE(c->get("big", 1s).isOk());
}

TEST(StoreServer, AddOnNonIntegerIsAnErrorAndConnectionSurvives) {
  Server s;
  auto c = s.client();
  ASSERT_TRUE(c->set("text", toBytes(std::string_view("hello"))).isOk());
  auto r = c->add("text", 1);
  EXPECT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("text"), std::string::npos);
  EXPECT_EQ(*c->add("n", -5), -5);
  EXPECT_EQ(*c->add("n", 12), 7);
}

TEST(StoreServer, WrongSecretIsRejectedWhileGoodClientsWork) {
  Server s;
  auto good = s.client();
  ASSERT_TRUE(good->set("k", toBytes(std::string_view("v"))).isOk());
  auto bad = connectStore(s.server->address(), auth::Secret::random(), 5s);
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), chorusRemoteError);
  EXPECT_NE(bad.status().message().find("authentication failed"), std::string::npos) << bad.status().message();
  auth::Secret none;  // an unauthenticated client against an authenticated job
  EXPECT_FALSE(connectStore(s.server->address(), none, 5s).isOk());
  EXPECT_TRUE(good->get("k", 1s).isOk());
  expectServes(s, "after-wrong-secret");
}

// True while the server keeps the connection open (nothing to read, no EOF).
bool stillOpen(int fd) {
  std::byte b;
  ssize_t n = ::recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

TEST(StoreServer, SlowLorisDoesNotBlockOthersAndIsDropped) {
  Server s(StoreServerOptions{.handshake_timeout = 2000ms});
  auto loris = net::connectTo(s.server->address(), in(5s));
  ASSERT_TRUE(loris.isOk());
  // A second loris that sends part of the handshake head and stalls.
  auto half = net::connectTo(s.server->address(), in(5s));
  ASSERT_TRUE(half.isOk());
  std::vector<std::byte> some(10, std::byte{1});
  ASSERT_TRUE(net::writeAll(half->get(), some, in(1s)).isOk());
  std::vector<std::byte> greeting(37);
  ASSERT_TRUE(net::readAll(loris->get(), greeting, in(5s)).isOk());
  ASSERT_TRUE(net::readAll(half->get(), greeting, in(5s)).isOk());
  for (int i = 0; i < 4; ++i) expectServes(s, fmt::format("loris{}", i));
  // Good clients were served while both lorises still held their
  // connections: the loop did not wait for them.
  EXPECT_TRUE(stillOpen(loris->get()));
  EXPECT_TRUE(stillOpen(half->get()));
  EXPECT_TRUE(closedByServer(loris->get(), 10s));
  EXPECT_TRUE(closedByServer(half->get(), 10s));
  expectServes(s, "after-loris");
}

// Keys count toward the store's limit (with a per-entry overhead): many
// empty-valued keys cannot grow the server without bound.
TEST(StoreServer, KeyBytesCountTowardTheLimit) {
  Server s(StoreServerOptions{.max_total_bytes = 64 * 1024});
  auto c = s.client();
  ASSERT_TRUE(c);
  const std::string pad(1000, 'k');
  int stored = 0;
  Status last;
  for (int i = 0; i < 200; ++i) {
    last = c->set(fmt::format("{}{:04}", pad, i), {});
    if (!last.isOk()) break;
    ++stored;
  }
  // 1,004-byte keys with empty values: at most 64 KiB / 1,004 of them fit.
  EXPECT_LE(stored, 64 * 1024 / 1004);
  EXPECT_GE(stored, 32);  // and the limit is not far below that (the overhead is small)
  EXPECT_NE(last.message().find("store full"), std::string::npos) << last.message();
  // Values still count, and overwriting an entry frees its old size.
  EXPECT_TRUE(c->set(fmt::format("{}{:04}", pad, 0), {}).isOk());
  expectServes(s, "after-full-of-keys");
}

// Count of this process's open descriptors.
size_t openFds() {
  size_t n = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// A flood of silent connections holds at most max_pending descriptors in the
// server (the rest are displaced), and good clients are served throughout.
TEST(StoreServer, AConnectionFloodHoldsAtMostTheCap) {
  constexpr size_t kCap = 8, kFlood = 150;
  Server s(StoreServerOptions{.handshake_timeout = 30000ms, .max_pending = kCap});
  expectServes(s, "before-flood");
  size_t before = openFds();
  std::vector<net::Fd> flood;
  for (size_t i = 0; i < kFlood; ++i) {
    auto fd = net::connectTo(s.server->address(), in(5s));
    ASSERT_TRUE(fd.isOk());
    flood.push_back(std::move(*fd));
  }
  auto t0 = Clock::now();
  expectServes(s, "during-flood");
  EXPECT_LT(Clock::now() - t0, 1s);
  std::this_thread::sleep_for(200ms);
  // Ours: the flood's client ends; the server's: at most kCap of theirs
  // (plus the good client's connection, closed by now or not).
  size_t server_side = openFds() - before - kFlood;
  EXPECT_LE(server_side, kCap + 2) << "the server holds " << server_side << " stranger descriptors";
}

// CHORUS_WIRE_PROTECT on the store stream: every operation works sealed,
// including values of the maximal size and parked gets.
TEST(StoreServer, SealedStreamsServeEveryOperation) {
  for (auth::WireProtect mode : {auth::WireProtect::kMac, auth::WireProtect::kEncrypt}) {
    SCOPED_TRACE(std::string(auth::wireProtectName(mode)));
    Server s(StoreServerOptions{.protect = mode});
    auto c = connectStore(s.server->address(), s.secret, 5s, mode);
    ASSERT_TRUE(c.isOk()) << c.status().message();
    auto other = connectStore(s.server->address(), s.secret, 5s, mode);
    ASSERT_TRUE(other.isOk());
    Bytes big(16 << 20);
    for (size_t i = 0; i < big.size(); i += 4096) big[i] = std::byte(i >> 12);
    ASSERT_TRUE((*c)->set("big", big).isOk());
    auto v = (*other)->get("big", 5s);
    ASSERT_TRUE(v.isOk()) << v.status().message();
    EXPECT_EQ(*v, big);
    std::thread setter([&] {
      std::this_thread::sleep_for(50ms);
      EXPECT_TRUE((*other)->set("late", toBytes(std::string_view("here"))).isOk());
    });
    auto late = (*c)->get("late", 5s);  // parked until the other client sets it
    setter.join();
    ASSERT_TRUE(late.isOk()) << late.status().message();
    EXPECT_EQ(toString(*late), "here");
    EXPECT_EQ(*(*c)->add("n", 3), 3);
    EXPECT_TRUE((*c)->serverTimeNs().isOk());
    // A client that asks for another mode is refused (its first request fails).
    auto plain = connectStore(s.server->address(), s.secret, 5s, auth::WireProtect::kOff);
    if (plain.isOk()) {
      EXPECT_FALSE((*plain)->set("x", {}).isOk());
    }
  }
  auth::Secret none;
  EXPECT_EQ(connectStore(net::SockAddr{}, none, 1s, auth::WireProtect::kMac).status().code(), chorusInvalidArgument);
}

// An on-path relay flips one bit of a value in the store's answer: without
// protection the client takes the wrong value; sealed, the get fails naming
// the integrity check.
TEST(StoreServer, AFlippedBitInAnAnswerIsAnErrorWhenSealed) {
  for (auth::WireProtect mode : {auth::WireProtect::kOff, auth::WireProtect::kMac, auth::WireProtect::kEncrypt}) {
    SCOPED_TRACE(std::string(auth::wireProtectName(mode)));
    Server s(StoreServerOptions{.protect = mode});
    auto writer = connectStore(s.server->address(), s.secret, 5s, mode);
    ASSERT_TRUE(writer.isOk());
    const std::string value(2000, 'v');
    ASSERT_TRUE((*writer)->set("k", toBytes(std::string_view(value))).isOk());
    // Server-to-client stream: greeting 37, proof 32, then the answer: its
    // 9-byte header and the value (sealed: after a 4-byte record length).
    const size_t at = 37 + 32 + (mode == auth::WireProtect::kOff ? 0 : 4) + 9 + 1000;
    chorus::testing::Relay relay(s.server->address(), at, chorus::testing::Relay::kServerToClient);
    auto reader = connectStore(relay.address(), s.secret, 5s, mode);
    ASSERT_TRUE(reader.isOk()) << reader.status().message();
    auto got = (*reader)->get("k", 5s);
    EXPECT_TRUE(relay.flipped());
    if (mode == auth::WireProtect::kOff) {
      ASSERT_TRUE(got.isOk()) << got.status().message();
      EXPECT_NE(toString(*got), value) << "the flipped bit should arrive unnoticed";
      EXPECT_EQ(toString(*got)[1000], static_cast<char>('v' ^ 0x80));
    } else {
      ASSERT_FALSE(got.isOk());
      EXPECT_NE(got.status().message().find("integrity check"), std::string::npos) << got.status().message();
    }
  }
}

TEST(StoreServer, GarbageClientIsRejected) {
  Server s;
  auto good = s.client();
  std::mt19937 rng(1234);
  for (int round = 0; round < 5; ++round) {
    auto g = net::connectTo(s.server->address(), in(5s));
    ASSERT_TRUE(g.isOk());
    std::vector<std::byte> junk(4096);
    for (auto& b : junk) b = std::byte(rng() & 0xff);
    (void)net::writeAll(g->get(), junk, in(5s));  // the server may close before taking it all
    EXPECT_TRUE(closedByServer(g->get(), 5s));
    ASSERT_TRUE(good->add("survived", 1).isOk());
  }
  expectServes(s, "after-garbage");
}

TEST(StoreServer, AuthenticatedClientWithBadFrameIsClosed) {
  Server s;
  auto raw = net::connectTo(s.server->address(), in(5s));
  ASSERT_TRUE(raw.isOk());
  ASSERT_TRUE(auth::clientHandshake(raw->get(), s.secret, toBytes(std::string_view("store")), in(5s)).isOk());
  std::vector<std::byte> frame(13, std::byte{0});
  frame[0] = std::byte{99};  // unknown op
  frame[1] = std::byte{1};
  ASSERT_TRUE(net::writeAll(raw->get(), frame, in(1s)).isOk());
  EXPECT_TRUE(closedByServer(raw->get(), 5s));
  expectServes(s, "after-bad-frame");
}

TEST(StoreServer, DestructionIsPromptWithParkedGetsAndIdleClients) {
  auto s = std::make_unique<Server>();
  auto idle = s->client();
  auto waiter = s->client();
  auto fut = std::async(std::launch::async, [&] { return waiter->get("never", 60s); });
  auto loris = net::connectTo(s->server->address(), in(5s));
  std::this_thread::sleep_for(20ms);  // lets the get reach the server (either order is correct)
  auto t0 = Clock::now();
  s->server.reset();
  EXPECT_LT(Clock::now() - t0, 2s);
  ASSERT_EQ(fut.wait_for(10s), std::future_status::ready);
  auto v = fut.get();
  EXPECT_EQ(v.status().code(), chorusRemoteError) << v.status().message();
  // The connection is now known broken: later calls fail fast with the cause.
  EXPECT_FALSE(waiter->set("x", {}).isOk());
  EXPECT_FALSE(idle->set("x", {}).isOk());
}

// stop() (what a process's exit does to the servers it kept, comm/wiring.cpp):
// prompt from two threads at once, and afterwards the server answers no one,
// old client or new, while its listener still holds the port.
TEST(StoreServer, StopEndsServingPromptlyAndTwice) {
  auto s = std::make_unique<Server>();
  expectServes(*s, "before");
  auto old = connectStore(s->server->address(), s->secret, 300ms);
  ASSERT_TRUE(old.isOk()) << old.status().message();
  ASSERT_TRUE((*old)->set("k", toBytes("v")).isOk());
  auto t0 = Clock::now();
  auto other = std::async(std::launch::async, [&] { s->server->stop(); });
  s->server->stop();
  ASSERT_EQ(other.wait_for(5s), std::future_status::ready);
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_FALSE((*old)->get("k", 200ms).isOk()) << "a stopped server answered an old client";
  EXPECT_FALSE(connectStore(s->server->address(), s->secret, 300ms).isOk()) << "a stopped server admitted a client";
  s->server->stop();  // once more: nothing left to do
  s->server.reset();
}

TEST(StoreClient, ConnectRetriesUntilDeadlineAndTimesOut) {
  net::SockAddr dead;
  {
    auto l = net::listenOn(*net::resolve("127.0.0.1", 0));
    dead = *net::boundAddress(l->get());
  }
  auto c = connectStore(dead, auth::Secret::random(), 200ms);
  EXPECT_EQ(c.status().code(), chorusTimeout);
  EXPECT_NE(c.status().message().find("store"), std::string::npos);
}

TEST(StoreServer, AdoptsListenerAndServesIpv6) {
  // ::1 is on lo unless IPv6 is switched off: its absence fails rather than skips.
  auto a = net::resolve("::1", 0);
  ASSERT_TRUE(a.isOk()) << "no IPv6 loopback: " << a.status().message();
  auto l = net::listenOn(*a);
  ASSERT_TRUE(l.isOk()) << "cannot bind ::1 (is net.ipv6.conf.lo.disable_ipv6 set?): " << l.status().message();
  auto expect = *net::boundAddress(l->get());
  auth::Secret secret = auth::Secret::random();
  auto s = StoreServer::start(std::move(*l), secret);
  ASSERT_TRUE(s.isOk());
  EXPECT_EQ((*s)->address().toString(), expect.toString());
  auto c = connectStore((*s)->address(), secret, 5s);
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_EQ(*(*c)->add("x", 3), 3);
}

TEST(StoreBarrier, AllRanksPassAndTimeoutCounts) {
  Server s;
  constexpr int kRanks = 8;
  std::vector<std::future<Status>> fs;
  for (int r = 0; r < kRanks; ++r)
    fs.push_back(std::async(std::launch::async, [&] {
      auto c = s.client();
      Status st = storeBarrier(*c, "b0", kRanks, 10s);
      if (!st.isOk()) return st;
      return storeBarrier(*c, "b1", kRanks, 10s);
    }));
  for (auto& f : fs) {
    Status st = f.get();
    EXPECT_TRUE(st.isOk()) << st.message();
  }
  auto c = s.client();
  Status st = storeBarrier(*c, "lonely", 2, 100ms);
  EXPECT_EQ(st.code(), chorusTimeout);
  EXPECT_NE(st.message().find("1 of 2"), std::string::npos) << st.message();
}

TEST(StoreBytes, StringsConvertByContent) {
  EXPECT_EQ(toBytes("ab").size(), 2u);
  EXPECT_EQ(toBytes(std::string("abc")).size(), 3u);
  EXPECT_EQ(toString(toBytes("xyz")), "xyz");
  EXPECT_EQ(toBytes(uint32_t{7}).size(), 4u);
}

TEST(PrefixStore, PrefixesEveryKey) {
  auto base = std::make_shared<MemoryStore>();
  PrefixStore p(base, "comm3/");
  ASSERT_TRUE(p.set("a", toBytes(std::string_view("1"))).isOk());
  EXPECT_TRUE(base->get("comm3/a", 0ms).isOk());
  EXPECT_FALSE(base->get("a", 0ms).isOk());
  EXPECT_EQ(*p.add("n", 2), 2);
  EXPECT_EQ(toString(*base->get("comm3/n", 0ms)), "2");
  EXPECT_EQ(toString(*p.get("a", 0ms)), "1");
}

std::vector<std::byte> frame(uint8_t op, uint32_t keylen, uint64_t vallen, size_t body) {
  std::vector<std::byte> f;
  f.push_back(std::byte{op});
  for (int i = 0; i < 4; ++i) f.push_back(std::byte(keylen >> (8 * i)));
  for (int i = 0; i < 8; ++i) f.push_back(std::byte(vallen >> (8 * i)));
  f.resize(f.size() + body, std::byte{'k'});
  return f;
}

TEST(ParseStoreRequest, CompletePartialAndInvalid) {
  auto f = frame(1, 3, 2, 5);
  auto ok = parseStoreRequest(f);
  ASSERT_TRUE(ok.isOk());
  ASSERT_TRUE(ok->has_value());
  EXPECT_EQ((*ok)->key, "kkk");
  EXPECT_EQ((*ok)->value.size(), 2u);
  EXPECT_EQ((*ok)->frame_bytes, 18u);
  // Two frames back to back: the first is parsed, frame_bytes says where the next starts.
  auto two = f;
  two.insert(two.end(), f.begin(), f.end());
  EXPECT_EQ((*parseStoreRequest(two))->frame_bytes, 18u);
  auto partial = parseStoreRequest(frame(1, 3, 2, 4));
  ASSERT_TRUE(partial.isOk());
  EXPECT_FALSE(partial->has_value());
  auto head = frame(1, 3, 2, 0);
  EXPECT_FALSE(parseStoreRequest(std::span(head).first(5))->has_value());
  EXPECT_FALSE(parseStoreRequest(frame(0, 3, 2, 5)).isOk());          // unknown op
  EXPECT_FALSE(parseStoreRequest(frame(1, 0, 2, 2)).isOk());          // empty key
  EXPECT_FALSE(parseStoreRequest(frame(1, 1025, 0, 0)).isOk());       // key too long
  EXPECT_FALSE(parseStoreRequest(frame(1, 1, (16 << 20) + 1, 0)).isOk());  // value too long
  EXPECT_FALSE(parseStoreRequest(frame(2, 1, 4, 5)).isOk());          // GET needs 8 bytes
  EXPECT_FALSE(parseStoreRequest(frame(3, 1, UINT64_MAX, 0)).isOk()); // no overflow on huge lengths
  EXPECT_EQ(parseStoreRequest(frame(1, 1, 0, 1)).status().code(), chorusSuccess);
}

}  // namespace
}  // namespace chorus::bootstrap
