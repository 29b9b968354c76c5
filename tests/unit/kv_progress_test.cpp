// The KV engine's progress thread (prim/kv.hpp Progress::Thread, docs/kv.md
// "Progress"): transfers move while the callers do not call into their
// agents at all, and the thread and the callers share an agent without a
// race (this file is in the TSan phase's subset, tests/CMakeLists.txt).
//
// The mode is CHORUS_KV_PROGRESS's (thread unless it says caller), as the C
// API reads it: `CHORUS_KV_PROGRESS=caller kv_progress_test` makes the
// two *Sleeps tests fail (nothing moves while nobody calls), which is what
// they are for.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

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

Progress progressFromEnv() {
  const char* v = std::getenv("CHORUS_KV_PROGRESS");
  return v != nullptr && std::string_view(v) == "caller" ? Progress::Caller : Progress::Thread;
}

std::unique_ptr<Agent> makeAgent(const std::string& name, std::shared_ptr<bootstrap::Store> store,
                                 const std::string& transport) {
  AgentOptions o;
  o.name = name;
  o.store = std::move(store);
  o.transport = transport;
  o.progress = progressFromEnv();
  o.cfg.timeout = 20s;
  auto root = net::resolve("127.0.0.1", 0);
  EXPECT_TRUE(root.isOk());
  o.id.root = *root;
  auto a = Agent::create(o);
  EXPECT_TRUE(a.isOk()) << a.status().message();
  return a.isOk() ? std::move(a.value()) : nullptr;
}

void fill(std::byte* p, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>((i * 131 + seed) >> 3);
}

// Two agents and a scattered 2 MiB batch: descriptor i lands at the
// mirrored slot.
struct Pair {
  static constexpr size_t kBytes = 2 << 20, kDescs = 32;
  std::shared_ptr<bootstrap::MemoryStore> store = std::make_shared<bootstrap::MemoryStore>();
  std::unique_ptr<Agent> a, b;
  std::vector<std::byte> src = std::vector<std::byte>(kBytes);
  Guarded dst{kBytes, std::byte{0}};
  std::vector<Desc> descs;

  explicit Pair(const std::string& transport) {
    a = makeAgent("prefill0", store, transport);
    b = makeAgent("decode0", store, transport);
    if (!a || !b) return;
    fill(src.data(), kBytes, 9);
    auto hs = a->registerRegion(src.data(), kBytes, Access::Read);
    auto hd = b->registerRegion(dst.data(), kBytes, Access::Write);
    EXPECT_TRUE(hs.isOk() && hd.isOk());
    connectBoth(*a, *b);
    constexpr uint64_t kPiece = kBytes / kDescs;
    for (uint64_t i = 0; i < kDescs; ++i)
      descs.push_back({hs->index, i * kPiece, hd->index, (kDescs - 1 - i) * kPiece, kPiece});
  }
  void expectLanded() {
    for (const Desc& d : descs)
      ASSERT_EQ(std::memcmp(dst.data() + d.remote_offset, src.data() + d.local_offset, d.bytes), 0);
    EXPECT_TRUE(dst.guardsIntact());
  }
};

class KvProgressTest : public testing::TestWithParam<std::string> {};

// The origin posts and then sleeps, never calling into its agent, while the
// target polls its notifications: the batch arrives.  (Progress::Caller:
// nothing is even posted, the origin's calls post.)
TEST_P(KvProgressTest, TransferMovesWhileItsOriginSleeps) {
  Pair t(GetParam());
  ASSERT_TRUE(t.a && t.b && !t.descs.empty());
  std::atomic<bool> arrived{false};
  std::thread target([&] {
    const auto deadline = Clock::now() + 20s;
    while (Clock::now() < deadline && !arrived.load()) {
      auto notes = t.b->takeNotifications();
      ASSERT_TRUE(notes.isOk());
      for (const Notification& n : *notes)
        if (n.agent == "prefill0" && n.value == 1) arrived = true;
      std::this_thread::sleep_for(1ms);
    }
  });
  auto w = t.a->postWrite("decode0", t.descs, true, 1);
  ASSERT_TRUE(w.isOk()) << w.status().message();
  const auto until = Clock::now() + 20s;
  while (!arrived.load() && Clock::now() < until) std::this_thread::sleep_for(5ms);  // no call into `a`
  target.join();
  ASSERT_TRUE(arrived.load()) << "the batch did not arrive while its origin slept ("
                              << progressName(t.a->progressMode()) << " progress)";
  t.expectLanded();
  Status why;
  auto s = t.a->wait(*w, 20s, &why);
  ASSERT_TRUE(s.isOk()) << s.status().message();
  EXPECT_EQ(*s, XferState::Done) << why.message();
}

// The target never calls into its agent while the origin waits for its
// batch: the batch completes, and the target's first call finds the
// notification already taken by its thread (the call only reads).
// (Progress::Caller: the target serves nothing and the wait times out.)
TEST_P(KvProgressTest, TransferMovesWhileItsTargetSleeps) {
  Pair t(GetParam());
  ASSERT_TRUE(t.a && t.b && !t.descs.empty());
  auto w = t.a->postWrite("decode0", t.descs, true, 2);
  ASSERT_TRUE(w.isOk()) << w.status().message();
  Status why;
  auto s = t.a->wait(*w, 10s, &why);
  ASSERT_TRUE(s.isOk()) << "the batch did not complete while its target slept ("
                        << progressName(t.b->progressMode()) << " progress): " << s.status().message();
  EXPECT_EQ(*s, XferState::Done) << why.message();
  auto notes = t.b->takeNotifications();
  ASSERT_TRUE(notes.isOk());
  ASSERT_EQ(notes->size(), 1u);
  EXPECT_EQ((*notes)[0].value, 2u);
  t.expectLanded();
}

// The callers' threads and the progress threads at once: one thread posts
// batches to two targets and registers and deregisters a region meanwhile,
// the targets' threads poll their notifications, a third agent joins and a
// target leaves mid-stream, and every agent is destroyed (its thread joined)
// with its state in use.  TSan's subset runs it; here it checks the bytes
// and the notifications' order.
TEST_P(KvProgressTest, CallersAndTheThreadShareAnAgent) {
  // The last batch's target region: nothing of this thread reads it (on one
  // host the transports' synchronisation goes through shared memory mapped
  // twice in this process, which TSan cannot follow: a read here before
  // decode1's thread writes it would be reported although the post orders it).
  std::vector<std::byte> tail(256 << 10);
  auto store = std::make_shared<bootstrap::MemoryStore>();
  auto a = makeAgent("prefill0", store, GetParam());
  auto b = makeAgent("decode0", store, GetParam());
  auto c = makeAgent("decode1", store, GetParam());
  ASSERT_TRUE(a && b && c);
  constexpr size_t kBytes = 256 << 10;
  constexpr int kBatches = 12;
  std::vector<std::byte> src(kBytes);
  fill(src.data(), kBytes, 3);
  std::vector<std::byte> bd(kBytes), cd(kBytes);
  auto hs = a->registerRegion(src.data(), kBytes, Access::Read);
  auto hb = b->registerRegion(bd.data(), kBytes, Access::Write);
  auto hc = c->registerRegion(cd.data(), kBytes, Access::Write);
  auto ht = c->registerRegion(tail.data(), tail.size(), Access::Write);
  ASSERT_TRUE(hs.isOk() && hb.isOk() && hc.isOk() && ht.isOk());
  connectBoth(*a, *b);
  std::atomic<bool> stop{false};
  auto poller = [&](Agent& t, std::vector<uint64_t>* got) {
    const auto deadline = Clock::now() + 30s;
    while (!stop.load() && Clock::now() < deadline) {
      auto notes = t.takeNotifications();
      ASSERT_TRUE(notes.isOk());
      for (const Notification& n : *notes) got->push_back(n.value);
      ASSERT_TRUE(t.progress().isOk());
      std::this_thread::yield();
    }
    auto notes = t.takeNotifications();  // what arrived before `stop`
    ASSERT_TRUE(notes.isOk());
    for (const Notification& n : *notes) got->push_back(n.value);
  };
  std::vector<uint64_t> bgot, cgot;
  std::thread tb(poller, std::ref(*b), &bgot);
  // decode1 joins while batches to decode0 are in flight.
  std::thread tc([&] {
    ASSERT_TRUE(c->publishMetadata().isOk());
    auto r = c->connect("prefill0", 20s);
    ASSERT_TRUE(r.isOk()) << r.status().message();
    poller(*c, &cgot);
  });
  std::vector<uint64_t> xs;
  for (int i = 0; i < kBatches; ++i) {
    Desc d{hs->index, static_cast<uint64_t>(i) * 1024, hb->index, 0, kBytes / 2};
    auto w = a->postWrite("decode0", std::span<const Desc>(&d, 1), true, 100 + i);
    ASSERT_TRUE(w.isOk()) << w.status().message();
    xs.push_back(*w);
    if (i == 3) {  // a region comes and goes while transfers move
      std::vector<std::byte> extra(4096);
      auto he = a->registerRegion(extra.data(), extra.size(), Access::Read);
      ASSERT_TRUE(he.isOk());
      ASSERT_TRUE(a->deregisterRegion(*he).isOk());
    }
    if (i == 5) {
      auto r = a->connect("decode1", 20s);
      ASSERT_TRUE(r.isOk()) << r.status().message();
    }
    if (i >= 5) {
      Desc e{hs->index, 0, hc->index, 0, kBytes};
      auto x = a->postWrite("decode1", std::span<const Desc>(&e, 1), true, 200 + i);
      ASSERT_TRUE(x.isOk()) << x.status().message();
      xs.push_back(*x);
    }
    Status why;
    auto s = a->test(xs.front(), &why);
    ASSERT_TRUE(s.isOk());
  }
  for (uint64_t x : xs) {
    Status why;
    auto s = a->wait(x, 30s, &why);
    ASSERT_TRUE(s.isOk()) << s.status().message();
    EXPECT_EQ(*s, XferState::Done) << why.message();
    EXPECT_TRUE(a->release(x).isOk());
  }
  // decode0 leaves (its thread stops polling first); prefill0 drops it.
  stop = true;
  tb.join();
  tc.join();
  ASSERT_TRUE(a->disconnect("decode0").isOk());
  b.reset();
  EXPECT_EQ(std::memcmp(bd.data(), src.data() + (kBatches - 1) * 1024, kBytes / 2), 0);
  EXPECT_EQ(std::memcmp(cd.data(), src.data(), kBytes), 0);
  // One more batch to decode1, left on the wire as every agent goes.
  Desc e{hs->index, 0, ht->index, 0, kBytes};
  auto last = a->postWrite("decode1", std::span<const Desc>(&e, 1), true, 999);
  ASSERT_TRUE(last.isOk());
  // Notifications in post order, every one once.
  ASSERT_EQ(bgot.size(), static_cast<size_t>(kBatches));
  for (int i = 0; i < kBatches; ++i) EXPECT_EQ(bgot[static_cast<size_t>(i)], static_cast<uint64_t>(100 + i));
  ASSERT_EQ(cgot.size(), static_cast<size_t>(kBatches - 5));
  for (int i = 5; i < kBatches; ++i) EXPECT_EQ(cgot[static_cast<size_t>(i - 5)], static_cast<uint64_t>(200 + i));
  c.reset();
  a.reset();
}

INSTANTIATE_TEST_SUITE_P(Transports, KvProgressTest, testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

TEST(KvProgress, ModeNames) {
  EXPECT_EQ(parseProgress("thread").value(), Progress::Thread);
  EXPECT_EQ(parseProgress("caller").value(), Progress::Caller);
  EXPECT_FALSE(parseProgress("both").isOk());
  EXPECT_FALSE(parseProgress("").isOk());
  EXPECT_EQ(progressName(Progress::Caller), "caller");
  EXPECT_EQ(progressName(Progress::Thread), "thread");
}

}  // namespace
}  // namespace chorus::prim::kv
