// The KV-cache transfer engine (prim/kv.hpp, docs/kv.md): agents as threads
// of this process sharing a MemoryStore, each pair on its own 2-rank
// transport (shared memory or TCP over loopback).  Batches of writes and
// reads land byte for byte, the notification comes after its batch, bad
// descriptors and forged or stale metadata are clear errors that write
// nothing outside a region, a peer that dies mid-transfer fails only the
// transfers to it, agents join and leave, and a transfer can be cancelled.
// The C API at the end runs two agents over a real store server.
#include <chorus/chorus.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <optional>
#include <thread>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap/memory_store.hpp"
#include "prim/kv.hpp"
#include "support/guarded.hpp"
#include "support/kv_pair.hpp"

namespace chorus::prim::kv {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using chorus::support::Guarded;
using chorus::support::connectBoth;

void fillPattern(std::byte* p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<std::byte>(x);
  }
}

// Who drives the agents: CHORUS_KV_PROGRESS as the C API reads it (thread
// unless set to caller), so that ctest runs this file in both modes
// (tests/CMakeLists.txt: KvEngineCallerProgress).
Progress progressFromEnv() {
  const char* v = std::getenv("CHORUS_KV_PROGRESS");
  return v != nullptr && std::string_view(v) == "caller" ? Progress::Caller : Progress::Thread;
}

std::unique_ptr<Agent> makeAgent(const std::string& name, std::shared_ptr<bootstrap::Store> store,
                                 const std::string& transport, std::optional<Progress> progress = std::nullopt) {
  AgentOptions o;
  o.name = name;
  o.store = std::move(store);
  o.transport = transport;
  o.progress = progress.value_or(progressFromEnv());
  o.cfg.timeout = 20s;
  auto root = net::resolve("127.0.0.1", 0);
  EXPECT_TRUE(root.isOk());
  o.id.root = *root;
  auto a = Agent::create(o);
  EXPECT_TRUE(a.isOk()) << a.status().message();
  return a.isOk() ? std::move(a.value()) : nullptr;
}

// Progresses until a notification from `from` arrives (or 30 s).
std::optional<uint64_t> awaitNote(Agent& a, const std::string& from) {
  const auto deadline = Clock::now() + 30s;
  while (Clock::now() < deadline) {
    auto notes = a.takeNotifications();
    EXPECT_TRUE(notes.isOk());
    if (!notes.isOk()) return std::nullopt;
    for (const Notification& n : *notes)
      if (n.agent == from) return n.value;
    std::this_thread::yield();
  }
  return std::nullopt;
}

// Progresses until `flag` is set.
void serveUntil(Agent& a, const std::atomic<bool>& flag) {
  const auto deadline = Clock::now() + 60s;
  while (!flag.load() && Clock::now() < deadline) {
    EXPECT_TRUE(a.progress().isOk());
    std::this_thread::yield();
  }
}

class KvEngineTest : public testing::TestWithParam<std::string> {};

// Writes of scattered descriptors of many sizes (0 B to 1 MiB, odd offsets),
// a notification that finds every byte in place, then reads that bring the
// bytes back.
TEST_P(KvEngineTest, WriteAndReadBatchesLandExactly) {
  auto store = std::make_shared<bootstrap::MemoryStore>();
  auto a = makeAgent("prefill0", store, GetParam());
  auto b = makeAgent("decode0", store, GetParam());
  ASSERT_TRUE(a && b);
  constexpr size_t kSrc = 3 << 20, kDst = 3 << 20;
  std::vector<std::byte> src(kSrc), back(kSrc, std::byte{0});
  fillPattern(src.data(), kSrc, 7);
  Guarded dst(kDst);
  auto hs = a->registerRegion(src.data(), kSrc, Access::Read);
  auto hb = a->registerRegion(back.data(), kSrc, Access::ReadWrite);
  auto hd = b->registerRegion(dst.data(), kDst, Access::ReadWrite);
  ASSERT_TRUE(hs.isOk() && hb.isOk() && hd.isOk());
  connectBoth(*a, *b);
  std::vector<Desc> descs;
  uint64_t so = 3, dof = kDst - 1;
  for (uint64_t len : {0ull, 1ull, 7ull, 4096ull, 16383ull, 16385ull, 65536ull + 5, 1ull << 20, 333ull}) {
    dof -= len + 11;  // back to front in the destination
    descs.push_back({hs->index, so, hd->index, dof, len});
    so += len + 5;
  }
  std::atomic<bool> done{false};
  std::thread tb([&] {
    auto v = awaitNote(*b, "prefill0");
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(*v, 0xfeedu);
    // Every byte of the batch is in place when its notification is taken.
    for (const Desc& d : descs)
      EXPECT_EQ(std::memcmp(dst.data() + d.remote_offset, src.data() + d.local_offset, d.bytes), 0) << d.bytes;
    serveUntil(*b, done);
  });
  auto w = a->postWrite("decode0", descs, true, 0xfeed);
  ASSERT_TRUE(w.isOk()) << w.status().message();
  Status why;
  auto s = a->wait(*w, 30s, &why);
  ASSERT_TRUE(s.isOk()) << s.status().message();
  EXPECT_EQ(*s, XferState::Done) << why.message();
  // Read the same ranges back into `back` at the source offsets.
  std::vector<Desc> rd;
  for (const Desc& d : descs) rd.push_back({hb->index, d.local_offset, d.remote_region, d.remote_offset, d.bytes});
  auto r = a->postRead("decode0", rd, false, 0);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  s = a->wait(*r, 30s, &why);
  ASSERT_TRUE(s.isOk());
  EXPECT_EQ(*s, XferState::Done) << why.message();
  done = true;
  tb.join();
  for (const Desc& d : descs) EXPECT_EQ(std::memcmp(back.data() + d.local_offset, src.data() + d.local_offset, d.bytes), 0);
  EXPECT_TRUE(dst.guardsIntact());
  EXPECT_TRUE(a->release(*w).isOk());
  EXPECT_FALSE(a->test(*w).isOk());  // released: unknown
}

// Local checks before anything is posted, and the target's own checks for
// what the origin cannot know (forged or stale metadata).
TEST_P(KvEngineTest, BadDescriptorsAreClearErrorsAndWriteNothing) {
  auto store = std::make_shared<bootstrap::MemoryStore>();
  auto a = makeAgent("prefill0", store, GetParam());
  auto b = makeAgent("decode0", store, GetParam());
  ASSERT_TRUE(a && b);
  std::vector<std::byte> src(8192);
  fillPattern(src.data(), src.size(), 3);
  Guarded dst(4096), ro(4096), gone(4096);
  auto hs = a->registerRegion(src.data(), src.size(), Access::Read);
  auto hd = b->registerRegion(dst.data(), dst.n, Access::Write);
  auto hr = b->registerRegion(ro.data(), ro.n, Access::Read);
  auto hg = b->registerRegion(gone.data(), gone.n, Access::ReadWrite);
  ASSERT_TRUE(hs.isOk() && hd.isOk() && hr.isOk() && hg.isOk());
  connectBoth(*a, *b);
  std::atomic<bool> done{false};
  std::thread tb([&] { serveUntil(*b, done); });
  auto expectPostError = [&](Desc d, std::string_view text) {
    auto r = a->postWrite("decode0", std::span<const Desc>(&d, 1), true, 1);
    ASSERT_FALSE(r.isOk()) << text;
    EXPECT_EQ(r.status().code(), chorusInvalidArgument);
    EXPECT_NE(r.status().message().find(text), std::string::npos) << r.status().message();
  };
  expectPostError({99, 0, hd->index, 0, 8}, "local region 99 is not registered");
  expectPostError({hs->index, 0, 77, 0, 8}, "has no region 77");
  expectPostError({hs->index, 0, hd->index, 4000, 97}, "past its end (4096 bytes)");
  expectPostError({hs->index, 8190, hd->index, 0, 8}, "past its end (8192 bytes)");
  expectPostError({hs->index, 0, hd->index, ~0ull - 3, 8}, "overflows 64 bits");
  expectPostError({hs->index, 0, hr->index, 0, 8}, "allows read access only");
  EXPECT_TRUE(dst.all(std::byte{0x5C}));  // nothing was posted
  // A garbled blob is refused whole.
  auto md = b->metadata();
  auto bad = md;
  bad[30] ^= std::byte{1};
  auto lr = a->loadRemote(bad);
  ASSERT_FALSE(lr.isOk());
  EXPECT_NE(lr.status().message().find("check word"), std::string::npos) << lr.status().message();
  bad = md;
  bad.resize(bad.size() - 1);
  EXPECT_FALSE(a->loadRemote(bad).isOk());
  // A forged blob with a valid check that claims the write region is 64x
  // larger: the origin believes it, the target refuses the access.
  auto parsed = unpackMetadata(md);
  ASSERT_TRUE(parsed.isOk());
  for (RegionInfo& r : parsed->regions)
    if (r.index == hd->index) r.bytes *= 64;
  ASSERT_TRUE(a->loadRemote(packMetadata(*parsed)).isOk());  // same instance: refreshes the regions
  Desc past{hs->index, 0, hd->index, 4096 - 8, 64};
  auto w = a->postWrite("decode0", std::span<const Desc>(&past, 1), true, 5);
  ASSERT_TRUE(w.isOk()) << w.status().message();
  Status why;
  auto st = a->wait(*w, 30s, &why);
  ASSERT_TRUE(st.isOk());
  EXPECT_EQ(*st, XferState::Failed);
  EXPECT_EQ(why.code(), chorusInvalidArgument);
  EXPECT_NE(why.message().find("out of bounds"), std::string::npos) << why.message();
  EXPECT_TRUE(dst.guardsIntact());
  EXPECT_TRUE(dst.all(std::byte{0x5C}));
  // Stale metadata: the region was deregistered after the blob was taken.
  ASSERT_TRUE(a->loadRemote(md).isOk());
  done = true;
  tb.join();
  ASSERT_TRUE(b->deregisterRegion(*hg).isOk());
  done = false;
  std::thread tb2([&] { serveUntil(*b, done); });
  Desc stale{hs->index, 0, hg->index, 0, 64};
  w = a->postWrite("decode0", std::span<const Desc>(&stale, 1), true, 6);
  ASSERT_TRUE(w.isOk()) << w.status().message();
  st = a->wait(*w, 30s, &why);
  ASSERT_TRUE(st.isOk());
  EXPECT_EQ(*st, XferState::Failed);
  EXPECT_NE(why.message().find("deregistered"), std::string::npos) << why.message();
  EXPECT_TRUE(gone.all(std::byte{0x5C}));
  EXPECT_TRUE(gone.guardsIntact());
  // The pair still works: a good write lands, and its notification is the
  // first one (the failed batches sent none).
  Desc good{hs->index, 100, hd->index, 8, 200};
  w = a->postWrite("decode0", std::span<const Desc>(&good, 1), true, 7);
  ASSERT_TRUE(w.isOk());
  st = a->wait(*w, 30s, &why);
  ASSERT_TRUE(st.isOk());
  EXPECT_EQ(*st, XferState::Done) << why.message();
  done = true;
  tb2.join();
  auto v = awaitNote(*b, "prefill0");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(*v, 7u);
  EXPECT_EQ(std::memcmp(dst.data() + 8, src.data() + 100, 200), 0);
  EXPECT_TRUE(dst.guardsIntact());
}

// An agent that joins after the others connect, transfers, and an agent
// that leaves and comes back as a new instance under its old name.
TEST_P(KvEngineTest, AgentsJoinAndLeaveWithoutRestartingOthers) {
  auto store = std::make_shared<bootstrap::MemoryStore>();
  auto a = makeAgent("prefill0", store, GetParam());
  auto b = makeAgent("decode0", store, GetParam());
  ASSERT_TRUE(a && b);
  std::vector<std::byte> src(1 << 16);
  fillPattern(src.data(), src.size(), 11);
  auto hs = a->registerRegion(src.data(), src.size(), Access::Read);
  ASSERT_TRUE(hs.isOk());
  std::vector<std::byte> bd(1 << 16);
  auto hb = b->registerRegion(bd.data(), bd.size(), Access::Write);
  connectBoth(*a, *b);
  auto writeTo = [&](Agent& peer, uint32_t region, uint64_t value) {
    std::atomic<bool> got{false}, acked{false};
    std::thread t([&] {
      auto v = awaitNote(peer, "prefill0");
      EXPECT_TRUE(v.has_value());
      EXPECT_EQ(v.value_or(0), value);
      got = true;
      serveUntil(peer, acked);
    });
    Desc d{hs->index, 0, region, 0, src.size()};
    auto w = a->postWrite(peer.name(), std::span<const Desc>(&d, 1), true, value);
    EXPECT_TRUE(w.isOk()) << w.status().message();
    if (w.isOk()) {
      Status why;
      auto s = a->wait(*w, 30s, &why);
      EXPECT_TRUE(s.isOk() && *s == XferState::Done) << why.message();
    }
    acked = true;
    t.join();
    return got.load();
  };
  ASSERT_TRUE(writeTo(*b, hb->index, 1));
  // A later agent registers, publishes and connects; prefill0 keeps decode0.
  auto c = makeAgent("decode1", store, GetParam());
  std::vector<std::byte> cd(1 << 16);
  auto hc = c->registerRegion(cd.data(), cd.size(), Access::Write);
  ASSERT_TRUE(hc.isOk());
  connectBoth(*a, *c);
  EXPECT_EQ(a->peers(), (std::vector<std::string>{"decode0", "decode1"}));
  ASSERT_TRUE(writeTo(*c, hc->index, 2));
  EXPECT_EQ(std::memcmp(cd.data(), src.data(), src.size()), 0);
  // decode0 leaves.  A write to it fails, naming it; decode1 still works.
  // Over TCP prefill0 sees the closed connection; on one host a peer is
  // seen gone by its process id, which these threads share, so the
  // application tells prefill0 (disconnect) as its control plane would.
  b.reset();
  if (GetParam() != "tcp") {
    ASSERT_TRUE(a->disconnect("decode0").isOk());
  }
  Desc d{hs->index, 0, hb->index, 0, 64};
  auto w = a->postWrite("decode0", std::span<const Desc>(&d, 1), false, 0);
  if (w.isOk()) {
    Status why;
    auto s = a->wait(*w, 30s, &why);
    ASSERT_TRUE(s.isOk());
    EXPECT_EQ(*s, XferState::Failed);
    EXPECT_NE(why.message().find("decode0"), std::string::npos) << why.message();
  } else {
    EXPECT_NE(w.status().message().find("decode0"), std::string::npos) << w.status().message();
  }
  ASSERT_TRUE(writeTo(*c, hc->index, 3));
  // decode0 comes back (a new instance): loading its metadata replaces the pair.
  b = makeAgent("decode0", store, GetParam());
  std::fill(bd.begin(), bd.end(), std::byte{0});
  hb = b->registerRegion(bd.data(), bd.size(), Access::Write);
  connectBoth(*a, *b);
  ASSERT_TRUE(writeTo(*b, hb->index, 4));
  EXPECT_EQ(std::memcmp(bd.data(), src.data(), src.size()), 0);
}

// Cancelling a batch whose target is not serving stops its remaining
// descriptors and its notification.  The target drives its transport only
// inside its calls (Progress::Caller) so that it serves nothing until told.
TEST_P(KvEngineTest, CancelStopsTheBatchAndItsNotification) {
  auto store = std::make_shared<bootstrap::MemoryStore>();
  auto a = makeAgent("prefill0", store, GetParam());
  auto b = makeAgent("decode0", store, GetParam(), Progress::Caller);
  ASSERT_TRUE(a && b);
  std::vector<std::byte> src(1 << 20), dst(1 << 20);
  auto hs = a->registerRegion(src.data(), src.size(), Access::Read);
  auto hd = b->registerRegion(dst.data(), dst.size(), Access::Write);
  connectBoth(*a, *b);
  std::vector<Desc> many;
  for (uint64_t i = 0; i < 1000; ++i) many.push_back({hs->index, i * 1000, hd->index, i * 1000, 1000});
  auto w = a->postWrite("decode0", many, true, 1);
  ASSERT_TRUE(w.isOk());
  ASSERT_TRUE(a->progress().isOk());  // posts the first window; decode0 serves nothing yet
  ASSERT_TRUE(a->cancel(*w).isOk());
  std::atomic<bool> done{false};
  std::thread tb([&] { serveUntil(*b, done); });
  Status why;
  auto s = a->wait(*w, 30s, &why);
  ASSERT_TRUE(s.isOk());
  EXPECT_EQ(*s, XferState::Cancelled);
  EXPECT_TRUE(a->release(*w).isOk());
  Desc one{hs->index, 0, hd->index, 0, 8};
  w = a->postWrite("decode0", std::span<const Desc>(&one, 1), true, 2);
  ASSERT_TRUE(w.isOk());
  s = a->wait(*w, 30s, &why);
  ASSERT_TRUE(s.isOk());
  EXPECT_EQ(*s, XferState::Done);
  done = true;
  tb.join();
  // Notifications arrive in post order: 1, had it been sent, would come first.
  auto v = awaitNote(*b, "prefill0");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(*v, 2u);
}

INSTANTIATE_TEST_SUITE_P(Transports, KvEngineTest, testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

// A peer that dies with a batch on the wire (TCP: its connection resets)
// fails that batch with a named error; a batch to another agent completes.
TEST(KvEngine, PeerThatDiesFailsOnlyItsTransfer) {
  auto store = std::make_shared<bootstrap::MemoryStore>();
  auto a = makeAgent("prefill0", store, "tcp");
  auto b = makeAgent("decode0", store, "tcp", Progress::Caller);  // serves nothing until it dies
  auto c = makeAgent("decode1", store, "tcp");
  ASSERT_TRUE(a && b && c);
  constexpr size_t kBig = 64 << 20;
  std::vector<std::byte> src(kBig), bd(kBig), cd(1 << 20);
  fillPattern(src.data(), 1 << 20, 5);
  auto hs = a->registerRegion(src.data(), src.size(), Access::Read);
  auto hb = b->registerRegion(bd.data(), bd.size(), Access::Write);
  auto hc = c->registerRegion(cd.data(), cd.size(), Access::Write);
  ASSERT_TRUE(hs.isOk() && hb.isOk() && hc.isOk());
  connectBoth(*a, *b);
  connectBoth(*a, *c);
  std::vector<Desc> big;
  for (uint64_t i = 0; i < 64; ++i) big.push_back({hs->index, i << 20, hb->index, i << 20, 1 << 20});
  auto wb = a->postWrite("decode0", big, true, 1);
  ASSERT_TRUE(wb.isOk());
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(a->progress().isOk());  // decode0 does not serve: the batch stalls
  b.reset();  // dies with the batch on the wire
  Desc one{hs->index, 0, hc->index, 0, 1 << 20};
  auto wc = a->postWrite("decode1", std::span<const Desc>(&one, 1), true, 2);
  ASSERT_TRUE(wc.isOk());
  std::atomic<bool> acked{false};
  std::thread tc([&] {
    auto v = awaitNote(*c, "prefill0");
    EXPECT_EQ(v.value_or(0), 2u);
    serveUntil(*c, acked);
  });
  Status why;
  auto s = a->wait(*wb, 60s, &why);
  ASSERT_TRUE(s.isOk()) << s.status().message();
  EXPECT_EQ(*s, XferState::Failed);
  EXPECT_EQ(why.code(), chorusRemoteError) << why.message();
  EXPECT_NE(why.message().find("decode0"), std::string::npos) << why.message();
  s = a->wait(*wc, 60s, &why);
  ASSERT_TRUE(s.isOk());
  EXPECT_EQ(*s, XferState::Done) << why.message();
  acked = true;
  tc.join();
  EXPECT_EQ(std::memcmp(cd.data(), src.data(), cd.size()), 0);
}

TEST(KvMetadata, RoundTripsAndRefusesMalformedBlobs) {
  Metadata md{"agent-1.x", 0x1234, {{0, 5, 100, Access::Read}, {3, 9, 1ull << 40, Access::ReadWrite}}};
  auto blob = packMetadata(md);
  auto back = unpackMetadata(blob);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back->name, md.name);
  EXPECT_EQ(back->instance, md.instance);
  ASSERT_EQ(back->regions.size(), 2u);
  EXPECT_EQ(back->regions[1].bytes, 1ull << 40);
  // Every single-byte change is refused (the check word, or a field check).
  for (size_t i = 0; i < blob.size(); ++i) {
    auto b = blob;
    b[i] ^= std::byte{0x40};
    EXPECT_FALSE(unpackMetadata(b).isOk()) << "byte " << i;
  }
  for (size_t n = 0; n < blob.size(); ++n) EXPECT_FALSE(unpackMetadata(std::span(blob).first(n)).isOk()) << n;
  Metadata twice{"a", 1, {{2, 5, 1, Access::Read}, {2, 6, 1, Access::Read}}};
  EXPECT_FALSE(unpackMetadata(packMetadata(twice)).isOk());
  Metadata badname{"a b", 1, {}};
  EXPECT_FALSE(unpackMetadata(packMetadata(badname)).isOk());
}


// The C API: two agents over a real store server (the first serves it),
// one writes a batch with a notification, bad arguments are named.
TEST(KvCApi, WriteWithNotificationOverARealStore) {
  chorusUniqueId id;
  ASSERT_EQ(chorusGetUniqueId(&id), chorusSuccess);
  chorusKvAgent_t p = nullptr, d = nullptr;
  ASSERT_EQ(chorusKvAgentCreate(&p, "c-prefill", id, 1), chorusSuccess) << chorusGetLastError(nullptr);
  ASSERT_EQ(chorusKvAgentCreate(&d, "c-decode", id, 0), chorusSuccess) << chorusGetLastError(nullptr);
  std::vector<uint8_t> src(100000), dst(100000, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  uint32_t rs = 0, rd = 0;
  ASSERT_EQ(chorusKvRegister(p, src.data(), src.size(), CHORUS_KV_READ, &rs), chorusSuccess);
  ASSERT_EQ(chorusKvRegister(d, dst.data(), dst.size(), CHORUS_KV_WRITE, &rd), chorusSuccess);
  EXPECT_EQ(chorusKvRegister(d, dst.data(), dst.size(), 9, &rd), chorusInvalidArgument);
  size_t need = 0;
  ASSERT_EQ(chorusKvGetMetadata(d, nullptr, 0, &need), chorusSuccess);
  EXPECT_GT(need, 24u);
  ASSERT_EQ(chorusKvPublishMetadata(p), chorusSuccess);
  ASSERT_EQ(chorusKvPublishMetadata(d), chorusSuccess);
  std::atomic<bool> pdone{false};
  std::thread td([&] {
    ASSERT_EQ(chorusKvConnect(d, "c-prefill", 20000), chorusSuccess) << chorusGetLastError(nullptr);
    char from[80];
    uint64_t value = 0;
    int got = 0;
    const auto deadline = Clock::now() + 30s;
    while (!got && Clock::now() < deadline) ASSERT_EQ(chorusKvGetNotif(d, from, sizeof from, &value, &got), chorusSuccess);
    ASSERT_EQ(got, 1);
    EXPECT_STREQ(from, "c-prefill");
    EXPECT_EQ(value, 99u);
    EXPECT_EQ(std::memcmp(dst.data() + 10, src.data() + 20, 50000), 0);
    // Serve until the prefill side has its acknowledgements.
    const auto until = Clock::now() + 60s;
    while (!pdone.load() && Clock::now() < until) (void)chorusKvProgress(d);
  });
  ASSERT_EQ(chorusKvConnect(p, "c-decode", 20000), chorusSuccess) << chorusGetLastError(nullptr);
  chorusKvDesc_t desc{rs, 20, rd, 10, 50000};
  uint64_t x = 0;
  ASSERT_EQ(chorusKvPostWrite(p, "c-decode", &desc, 1, 1, 99, &x), chorusSuccess) << chorusGetLastError(nullptr);
  EXPECT_EQ(chorusKvWait(p, x, 30000), chorusSuccess) << chorusGetLastError(nullptr);
  EXPECT_EQ(chorusKvRelease(p, x), chorusSuccess);
  chorusKvDesc_t past{rs, 0, rd, 99999, 2};
  EXPECT_EQ(chorusKvPostWrite(p, "c-decode", &past, 1, 0, 0, &x), chorusInvalidArgument);
  EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("past its end"), std::string::npos) << chorusGetLastError(nullptr);
  EXPECT_EQ(chorusKvPostWrite(p, "nobody", &desc, 1, 0, 0, &x), chorusInvalidArgument);
  pdone = true;
  td.join();
  EXPECT_EQ(chorusKvDeregister(d, rd), chorusSuccess);
  EXPECT_EQ(chorusKvDeregister(d, rd), chorusInvalidArgument);
  EXPECT_EQ(chorusKvAgentDestroy(d), chorusSuccess);
  EXPECT_EQ(chorusKvAgentDestroy(p), chorusSuccess);
  EXPECT_EQ(chorusKvProgress(p), chorusInvalidUsage);  // destroyed
}


// A peer agent in another process, killed (SIGKILL) with a batch to it on
// the wire: the batch fails with chorusRemoteError naming it, over shared
// memory (its process is gone) and TCP (its connection reset).
class KvProcessTest : public testing::TestWithParam<std::string> {};

TEST_P(KvProcessTest, KilledPeerProcessFailsItsTransfer) {
  auto secret = auth::Secret{};
  auto addr = net::resolve("127.0.0.1", 0);
  ASSERT_TRUE(addr.isOk());
  auto server = bootstrap::StoreServer::start(*addr, secret);
  ASSERT_TRUE(server.isOk()) << server.status().message();
  const net::SockAddr where = (*server)->address();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the victim: connects, registers, then sleeps without serving
    close(ready[0]);
    auto st = bootstrap::connectStore(where, secret, std::chrono::milliseconds(20000), auth::WireProtect::kOff);
    if (!st.isOk()) _exit(2);
    auto v = makeAgent("victim", *st, GetParam(), Progress::Caller);  // serves nothing
    if (!v) _exit(3);
    static std::vector<std::byte> mem(64 << 20);
    if (!v->registerRegion(mem.data(), mem.size(), Access::Write).isOk()) _exit(4);
    if (!v->publishMetadata().isOk() || !v->connect("prefill0", 20s).isOk()) _exit(5);
    char c = 1;
    if (write(ready[1], &c, 1) != 1) _exit(6);
    pause();
    _exit(0);
  }
  close(ready[1]);
  auto st = bootstrap::connectStore(where, secret, std::chrono::milliseconds(20000), auth::WireProtect::kOff);
  ASSERT_TRUE(st.isOk()) << st.status().message();
  auto a = makeAgent("prefill0", *st, GetParam());
  ASSERT_TRUE(a);
  std::vector<std::byte> src(64 << 20);
  auto hs = a->registerRegion(src.data(), src.size(), Access::Read);
  ASSERT_TRUE(a->publishMetadata().isOk());
  auto peer = a->connect("victim", 20s);
  ASSERT_TRUE(peer.isOk()) << peer.status().message();
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  std::vector<Desc> big;
  for (uint64_t i = 0; i < 64; ++i) big.push_back({hs->index, i << 20, 0, i << 20, 1 << 20});
  auto w = a->postWrite("victim", big, true, 1);
  ASSERT_TRUE(w.isOk()) << w.status().message();
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(a->progress().isOk());
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  Status why;
  auto s = a->wait(*w, 60s, &why);
  ASSERT_TRUE(s.isOk()) << s.status().message();
  EXPECT_EQ(*s, XferState::Failed);
  EXPECT_EQ(why.code(), chorusRemoteError) << why.message();
  EXPECT_NE(why.message().find("victim"), std::string::npos) << why.message();
}

INSTANTIATE_TEST_SUITE_P(Transports, KvProcessTest, testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace chorus::prim::kv
