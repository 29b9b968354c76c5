// One-sided operations (transport/rma.hpp) over the shared-memory transport
// (with and without cross-memory attach) and TCP (TcpSetup::rma), ranks as
// threads of this process wired through a MemoryStore: puts and gets of
// many sizes and offsets checked byte for byte on both sides, notifications
// that arrive after the puts before them, and every refused access (bounds,
// overflow, rights, deregistered and stale keys, forged keys and garbled key
// blobs) failing the origin's request with a clear error while the target's
// memory stays untouched and both transports keep working.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <thread>

#include "bootstrap/memory_store.hpp"
#include "transport/rma.hpp"
#include "transport/shm/shm.hpp"
#include "transport/tcp/tcp.hpp"
#include "support/guarded.hpp"

namespace chorus::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Transports = std::vector<std::unique_ptr<Transport>>;

constexpr size_t kMiB = size_t{1} << 20;

void runRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

Result<Transports> buildOnThreads(int n, const std::function<Result<std::unique_ptr<Transport>>(int)>& make) {
  std::vector<std::optional<Result<std::unique_ptr<Transport>>>> out(static_cast<size_t>(n));
  runRanks(n, [&](int r) { out[static_cast<size_t>(r)].emplace(make(r)); });
  Transports ts;
  for (int r = 0; r < n; ++r) {
    auto& o = *out[static_cast<size_t>(r)];
    if (!o.isOk()) return o.status().withContext(fmt::format("rank {}: ", r));
    ts.push_back(std::move(o.value()));
  }
  return ts;
}

std::vector<int> othersThan(int rank, int n) {
  std::vector<int> v;
  for (int r = 0; r < n; ++r)
    if (r != rank) v.push_back(r);
  return v;
}

enum class Kind { ShmCma, ShmNoCma, Tcp };

std::string kindName(Kind k) {
  switch (k) {
    case Kind::ShmCma: return "shm_cma";
    case Kind::ShmNoCma: return "shm_nocma";
    case Kind::Tcp: return "tcp";
  }
  return "?";
}

Result<Transports> makeTransports(Kind k, int n, bootstrap::MemoryStore& store) {
  static std::atomic<int> counter{0};
  const std::string prefix = fmt::format("/chorus-rma-{}-{}", getpid(), counter.fetch_add(1));
  return buildOnThreads(n, [&](int r) -> Result<std::unique_ptr<Transport>> {
    if (k == Kind::Tcp) {
      TcpSetup t;
      t.rank = r;
      t.peers = othersThan(r, n);
      t.comm_id = 0x7e5a;
      CHORUS_ASSIGN_OR_RETURN(t.bind_addr, net::resolve("127.0.0.1", 0));
      t.timeout = 20s;
      t.rma = true;
      return createTcpTransport(t, store);
    }
    ShmSetup s;
    s.rank = r;
    s.peers = othersThan(r, n);
    s.segment_prefix = prefix;
    s.allow_cma = k == Kind::ShmCma;
    s.timeout = 20s;
    return createShmTransport(s, store);
  });
}

// Deterministic bytes per seed.
void fillPattern(std::byte* p, size_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x += 0xBF58476D1CE4E5B9ULL;
    uint64_t w = x ^ (x >> 29);
    std::memcpy(p + i, &w, 8);
  }
  for (; i < n; ++i) p[i] = std::byte(seed + i);
}

using chorus::support::Guarded;

// Polls until every request finished; fails on a poll error or after `limit`.
testing::AssertionResult drive(Transport& t, std::span<Request* const> reqs, std::chrono::milliseconds limit = 60s) {
  const auto deadline = Clock::now() + limit;
  while (true) {
    Result<bool> r = t.poll();
    if (!r.isOk()) return testing::AssertionFailure() << "poll: " << r.status().message();
    if (std::all_of(reqs.begin(), reqs.end(), [](Request* q) { return q->finished(); }))
      return testing::AssertionSuccess();
    if (Clock::now() > deadline) return testing::AssertionFailure() << "requests not finished in time";
    if (!*r) t.wait(1000us);
  }
}
testing::AssertionResult driveOne(Transport& t, Request& req) {
  Request* p = &req;
  return drive(t, std::span<Request* const>(&p, 1));
}

// Keeps t progressing (serving peers' one-sided requests) until `stop`.
void serveUntil(Transport& t, const std::atomic<bool>& stop, Status* error) {
  while (!stop.load(std::memory_order_acquire)) {
    Result<bool> r = t.poll();
    if (!r.isOk()) {
      if (error->isOk()) *error = r.status();
      return;
    }
    if (!*r) t.wait(1000us);
  }
}

void publishKey(bootstrap::Store& store, const std::string& name, int rank, std::span<const std::byte> blob) {
  ASSERT_TRUE(store.set(fmt::format("rma/{}/{}", name, rank), blob).isOk());
}
std::vector<std::byte> fetchKey(bootstrap::Store& store, const std::string& name, int rank) {
  auto b = store.get(fmt::format("rma/{}/{}", name, rank), 20s);
  EXPECT_TRUE(b.isOk()) << b.status().message();
  return b.isOk() ? *b : std::vector<std::byte>{};
}

struct Param {
  Kind kind;
  int nranks;
};
std::string paramName(const testing::TestParamInfo<Param>& p) {
  return kindName(p.param.kind) + "_" + std::to_string(p.param.nranks) + "ranks";
}

class OneSided : public testing::TestWithParam<Param> {};
// Tests that need only one pair of ranks (instantiated at 2 ranks only).
class OneSidedPair : public testing::TestWithParam<Param> {};

// The accesses each origin makes into its own area of every peer's region:
// (offset in the area, length).
struct Range {
  uint64_t off;
  size_t bytes;
};
const std::vector<Range>& ranges() {
  static const std::vector<Range> kRanges = {
      {0, 0}, {7, 1}, {4097, 4095}, {12345, kMiB}, {kMiB + 65536, 8 * kMiB}, {9 * kMiB + 70000, 3}};
  return kRanges;
}
constexpr size_t kArea = 10 * kMiB;

// Every rank puts every range into its own area of every peer's region and
// notifies; a target that takes the notification finds all of that origin's
// data in place.  Then every rank gets the ranges back and compares.
TEST_P(OneSided, PutsAndGetsOfManySizesLandExactlyAndNotificationsFollowThem) {
  const Param param = GetParam();  // not a structured binding: clang 14 cannot capture one in a lambda
  const auto kind = param.kind;
  const int n = param.nranks;
  bootstrap::MemoryStore store;
  auto ts = makeTransports(kind, n, store);
  ASSERT_TRUE(ts.isOk()) << ts.status().message();
  std::atomic<int> finished{0};
  runRanks(n, [&](int me) {
    Transport& t = *(*ts)[static_cast<size_t>(me)];
    Rma* rma = t.rma();
    ASSERT_NE(rma, nullptr);
    const std::vector<int> peers = othersThan(me, n);
    const size_t areas = peers.size();
    Guarded region(areas * kArea);
    auto id = rma->registerRegion(region.data(), region.n, Access::ReadWrite);
    ASSERT_TRUE(id.isOk()) << id.status().message();
    auto blob = rma->packKey(*id);
    ASSERT_TRUE(blob.isOk()) << blob.status().message();
    EXPECT_EQ(blob->size(), kKeyBlobBytes);
    publishKey(store, "sizes", me, *blob);

    // Our area in the region of `target`, and the data we put there.
    auto areaAt = [&](int origin, int target) { return static_cast<uint64_t>(origin < target ? origin : origin - 1) * kArea; };
    std::vector<std::vector<std::byte>> src(static_cast<size_t>(n));
    for (int p : peers) {
      src[static_cast<size_t>(p)].resize(kArea);
      fillPattern(src[static_cast<size_t>(p)].data(), kArea, static_cast<uint64_t>(me * 16 + p));
    }
    std::vector<RemoteKey> keys(static_cast<size_t>(n));
    for (int p : peers) {
      auto k = rma->unpackKey(p, fetchKey(store, "sizes", p));
      ASSERT_TRUE(k.isOk()) << k.status().message();
      EXPECT_EQ(k->owner, p);
      EXPECT_EQ(k->bytes, areas * kArea);
      EXPECT_EQ(k->access, Access::ReadWrite);
      keys[static_cast<size_t>(p)] = *k;
    }

    // Puts, then a notification, without waiting in between.
    std::deque<Request> reqs;
    std::vector<Request*> ptrs;
    for (int p : peers) {
      for (const Range& r : ranges()) {
        reqs.emplace_back();
        ASSERT_TRUE(rma->put(p, src[static_cast<size_t>(p)].data() + r.off, r.bytes, keys[static_cast<size_t>(p)],
                             areaAt(me, p) + r.off, &reqs.back())
                        .isOk());
        ptrs.push_back(&reqs.back());
      }
      reqs.emplace_back();
      ASSERT_TRUE(rma->notify(p, 1000 + static_cast<uint64_t>(me), &reqs.back()).isOk());
      ptrs.push_back(&reqs.back());
    }

    // Whose data is in our region, checked when its notification arrives.
    auto checkArea = [&](int origin) {
      std::vector<std::byte> want(kArea);
      fillPattern(want.data(), kArea, static_cast<uint64_t>(origin * 16 + me));
      const std::byte* area = region.data() + areaAt(origin, me);
      for (const Range& r : ranges())
        EXPECT_EQ(std::memcmp(area + r.off, want.data() + r.off, r.bytes), 0)
            << "rank " << me << ": data of rank " << origin << " at " << r.off << " (" << r.bytes << " bytes)";
      // Bytes between the ranges were never written.
      uint64_t at = 0;
      for (const Range& r : ranges()) {
        for (uint64_t i = at; i < r.off; i += 997) EXPECT_EQ(area[i], std::byte{0x5C}) << "byte " << i << " of rank " << origin << "'s area";
        at = r.off + r.bytes;
      }
    };
    int notes = 0;
    const auto deadline = Clock::now() + 60s;
    while (notes < static_cast<int>(peers.size()) ||
           !std::all_of(ptrs.begin(), ptrs.end(), [](Request* q) { return q->finished(); })) {
      auto r = t.poll();
      ASSERT_TRUE(r.isOk()) << r.status().message();
      int from = -1;
      uint64_t value = 0;
      auto got = rma->takeNotification(&from, &value);
      ASSERT_TRUE(got.isOk()) << got.status().message();
      if (*got) {
        EXPECT_EQ(value, 1000 + static_cast<uint64_t>(from));
        checkArea(from);
        ++notes;
        continue;
      }
      ASSERT_LT(Clock::now(), deadline) << "rank " << me << ": puts or notifications did not finish";
      if (!*r) t.wait(1000us);
    }
    for (Request* q : ptrs) EXPECT_EQ(q->state.load(), Request::Done) << q->status.message();
    EXPECT_TRUE(region.guardsIntact()) << "rank " << me << ": a put wrote outside the region";

    // Gets of the same ranges, into guarded buffers.
    std::deque<Guarded> dsts;
    std::vector<Request*> gets;
    for (int p : peers)
      for (const Range& r : ranges()) {
        dsts.emplace_back(r.bytes, std::byte{0x11});
        reqs.emplace_back();
        ASSERT_TRUE(rma->get(p, dsts.back().data(), r.bytes, keys[static_cast<size_t>(p)], areaAt(me, p) + r.off,
                             &reqs.back())
                        .isOk());
        gets.push_back(&reqs.back());
      }
    ASSERT_TRUE(drive(t, gets));
    size_t i = 0;
    for (int p : peers)
      for (const Range& r : ranges()) {
        Guarded& d = dsts[i];
        EXPECT_EQ(gets[i]->state.load(), Request::Done) << gets[i]->status.message();
        EXPECT_EQ(std::memcmp(d.data(), src[static_cast<size_t>(p)].data() + r.off, r.bytes), 0)
            << "rank " << me << ": get of " << r.bytes << " bytes at " << r.off << " from rank " << p;
        EXPECT_TRUE(d.guardsIntact()) << "a get wrote outside its buffer";
        ++i;
      }

    // Serve the others until every rank is done, then deregister.
    finished.fetch_add(1);
    while (finished.load() < n) {
      auto r = t.poll();
      ASSERT_TRUE(r.isOk()) << r.status().message();
      if (!*r) t.wait(1000us);
    }
    EXPECT_TRUE(rma->deregisterRegion(*id).isOk());
    EXPECT_FALSE(rma->deregisterRegion(*id).isOk()) << "a second deregistration must be refused";
  });
}

// Rank 0 issues many rounds of puts, each followed at once by a
// notification; rank 1 checks a round's data the moment its notification
// arrives.
TEST_P(OneSided, NotificationArrivesAfterEveryEarlierPut) {
  const Param param = GetParam();  // not a structured binding: clang 14 cannot capture one in a lambda
  const auto kind = param.kind;
  const int n = param.nranks;
  bootstrap::MemoryStore store;
  auto ts = makeTransports(kind, n, store);
  ASSERT_TRUE(ts.isOk()) << ts.status().message();
  constexpr int kRounds = 24;
  constexpr size_t kSmall = 3000, kSmalls = 6, kBig = 200 * 1024;
  constexpr size_t kRound = kSmall * kSmalls + kBig;
  std::atomic<bool> stop{false};
  runRanks(n, [&](int me) {
    Transport& t = *(*ts)[static_cast<size_t>(me)];
    Rma* rma = t.rma();
    ASSERT_NE(rma, nullptr);
    if (me == 1) {
      Guarded region(kRounds * kRound);
      auto id = rma->registerRegion(region.data(), region.n, Access::Write);
      ASSERT_TRUE(id.isOk());
      publishKey(store, "rounds", me, *rma->packKey(*id));
      std::vector<std::byte> want(kRound);
      int round = 0;
      const auto deadline = Clock::now() + 60s;
      while (round < kRounds) {
        auto r = t.poll();
        ASSERT_TRUE(r.isOk()) << r.status().message();
        int from = -1;
        uint64_t value = 0;
        if (*rma->takeNotification(&from, &value)) {
          EXPECT_EQ(from, 0);
          EXPECT_EQ(value, static_cast<uint64_t>(round));
          fillPattern(want.data(), kRound, 77 + value);
          EXPECT_EQ(std::memcmp(region.data() + round * kRound, want.data(), kRound), 0)
              << "round " << round << "'s data was not all there when its notification arrived";
          ++round;
          continue;
        }
        ASSERT_LT(Clock::now(), deadline);
        if (!*r) t.wait(1000us);
      }
      EXPECT_TRUE(region.guardsIntact());
      stop.store(true);
      return;
    }
    if (me != 0) {
      Status err;
      serveUntil(t, stop, &err);
      EXPECT_TRUE(err.isOk()) << err.message();
      return;
    }
    auto key = rma->unpackKey(1, fetchKey(store, "rounds", 1));
    ASSERT_TRUE(key.isOk()) << key.status().message();
    EXPECT_EQ(key->access, Access::Write);
    std::vector<std::vector<std::byte>> data(kRounds, std::vector<std::byte>(kRound));
    std::deque<Request> reqs;
    std::vector<Request*> ptrs;
    for (int round = 0; round < kRounds; ++round) {
      fillPattern(data[round].data(), kRound, 77 + static_cast<uint64_t>(round));
      // Pieces in an order that is not the address order.
      for (size_t s = kSmalls; s-- > 0;) {
        reqs.emplace_back();
        ASSERT_TRUE(rma->put(1, data[round].data() + kBig + s * kSmall, kSmall, *key, round * kRound + kBig + s * kSmall,
                             &reqs.back())
                        .isOk());
        ptrs.push_back(&reqs.back());
      }
      reqs.emplace_back();
      ASSERT_TRUE(rma->put(1, data[round].data(), kBig, *key, round * kRound, &reqs.back()).isOk());
      ptrs.push_back(&reqs.back());
      reqs.emplace_back();
      ASSERT_TRUE(rma->notify(1, static_cast<uint64_t>(round), &reqs.back()).isOk());
      ptrs.push_back(&reqs.back());
    }
    ASSERT_TRUE(drive(t, ptrs));
    for (Request* q : ptrs) EXPECT_EQ(q->state.load(), Request::Done) << q->status.message();
    Status err;
    serveUntil(t, stop, &err);
    EXPECT_TRUE(err.isOk()) << err.message();
  });
}

// Expects req to have failed with chorusInvalidArgument and a message that
// holds every one of `parts`.
void expectRefused(const Request& req, chorusResult_t code, const std::vector<std::string_view>& parts,
                   const char* what) {
  ASSERT_EQ(req.state.load(), Request::Failed) << what << ": not refused";
  EXPECT_EQ(req.status.code(), code) << what << ": " << req.status.message();
  for (std::string_view part : parts)
    EXPECT_NE(req.status.message().find(part), std::string::npos)
        << what << ": the error does not say '" << part << "': " << req.status.message();
}

// Rank 1 owns regions; rank 0 tries every kind of bad access.  Each fails
// rank 0's request naming the problem, rank 1's memory (the regions and the
// guard bytes around them) stays as it was, and both keep working: later
// valid puts, gets, notifications and two-sided messages go through.
TEST_P(OneSided, BadAccessesAreRefusedByTheTargetAndLeaveItsMemoryAlone) {
  const Param param = GetParam();  // not a structured binding: clang 14 cannot capture one in a lambda
  const auto kind = param.kind;
  const int n = param.nranks;
  bootstrap::MemoryStore store;
  auto ts = makeTransports(kind, n, store);
  ASSERT_TRUE(ts.isOk()) << ts.status().message();
  constexpr size_t kBytes = 4096;
  std::atomic<bool> stop{false};
  runRanks(n, [&](int me) {
    Transport& t = *(*ts)[static_cast<size_t>(me)];
    Rma* rma = t.rma();
    ASSERT_NE(rma, nullptr);
    if (me == 1) {
      Guarded rw(kBytes), ro(kBytes), wo(kBytes), gone(kBytes), reuse(kBytes);
      fillPattern(ro.data(), kBytes, 5);
      auto rw_id = rma->registerRegion(rw.data(), kBytes, Access::ReadWrite);
      auto ro_id = rma->registerRegion(ro.data(), kBytes, Access::Read);
      auto wo_id = rma->registerRegion(wo.data(), kBytes, Access::Write);
      auto gone_id = rma->registerRegion(gone.data(), kBytes, Access::ReadWrite);
      ASSERT_TRUE(rw_id.isOk() && ro_id.isOk() && wo_id.isOk() && gone_id.isOk());
      publishKey(store, "rw", me, *rma->packKey(*rw_id));
      publishKey(store, "ro", me, *rma->packKey(*ro_id));
      publishKey(store, "wo", me, *rma->packKey(*wo_id));
      publishKey(store, "gone", me, *rma->packKey(*gone_id));
      // Deregistered, and its index taken by a new region: the old key is
      // stale for both.
      ASSERT_TRUE(rma->deregisterRegion(*gone_id).isOk());
      EXPECT_FALSE(rma->packKey(*gone_id).isOk());
      auto reuse_id = rma->registerRegion(reuse.data(), kBytes, Access::ReadWrite);
      ASSERT_TRUE(reuse_id.isOk());
      EXPECT_EQ(reuse_id->index, gone_id->index) << "the test wants the index reused";
      EXPECT_NE(reuse_id->generation, gone_id->generation);
      publishKey(store, "reuse", me, *rma->packKey(*reuse_id));
      EXPECT_FALSE(rma->registerRegion(nullptr, 16, Access::Read).isOk());
      EXPECT_FALSE(rma->registerRegion(rw.data(), 16, static_cast<Access>(0)).isOk());
      EXPECT_FALSE(rma->deregisterRegion(*gone_id).isOk());

      // A two-sided message from rank 0 once it is done with the bad ones.
      std::vector<std::byte> msg(100);
      Request recv;
      ASSERT_TRUE(t.postRecv(0, RecvTarget{msg.data(), msg.size()}, &recv).isOk());
      ASSERT_TRUE(driveOne(t, recv));
      EXPECT_EQ(recv.state.load(), Request::Done) << recv.status.message();
      std::vector<std::byte> want(100);
      fillPattern(want.data(), 100, 9);
      EXPECT_EQ(msg, want);
      Status err;
      serveUntil(t, stop, &err);
      EXPECT_TRUE(err.isOk()) << err.message();

      // Untouched: the read-only, write-only (nothing valid was put there),
      // deregistered and reused regions, every guard; rw holds exactly the
      // one valid put.
      std::vector<std::byte> expect_ro(kBytes);
      fillPattern(expect_ro.data(), kBytes, 5);
      EXPECT_EQ(std::memcmp(ro.data(), expect_ro.data(), kBytes), 0);
      for (Guarded* g : {&wo, &gone, &reuse})
        EXPECT_TRUE(std::all_of(g->data(), g->data() + kBytes, [](std::byte b) { return b == std::byte{0x5C}; }));
      std::vector<std::byte> expect_rw(kBytes, std::byte{0x5C});
      fillPattern(expect_rw.data() + 100, 50, 3);
      EXPECT_EQ(std::memcmp(rw.data(), expect_rw.data(), kBytes), 0);
      for (Guarded* g : {&rw, &ro, &wo, &gone, &reuse}) EXPECT_TRUE(g->guardsIntact());
      int from = -1;
      uint64_t value = 0;
      auto note = rma->takeNotification(&from, &value);
      ASSERT_TRUE(note.isOk());
      EXPECT_TRUE(*note);
      EXPECT_EQ(from, 0);
      EXPECT_EQ(value, 42u);
      return;
    }
    if (me != 0) {
      // A third rank: it checks a key of rank 1 offered as rank 2's.
      auto blob = fetchKey(store, "rw", 1);
      auto wrong = rma->unpackKey(0, blob);
      EXPECT_FALSE(wrong.isOk());
      EXPECT_NE(wrong.status().message().find("is a key of rank 1"), std::string::npos) << wrong.status().message();
      Status err;
      serveUntil(t, stop, &err);
      EXPECT_TRUE(err.isOk()) << err.message();
      return;
    }

    auto unpack = [&](const std::string& name) {
      auto k = rma->unpackKey(1, fetchKey(store, name, 1));
      EXPECT_TRUE(k.isOk()) << name << ": " << k.status().message();
      return k.isOk() ? *k : RemoteKey{};
    };
    const RemoteKey rw = unpack("rw"), ro = unpack("ro"), wo = unpack("wo"), gone = unpack("gone"),
                    reuse = unpack("reuse");
    EXPECT_EQ(gone.region, reuse.region);
    std::vector<std::byte> buf(256 * 1024);
    fillPattern(buf.data(), buf.size(), 1);

    struct Bad {
      const char* what;
      bool is_put;
      RemoteKey key;
      uint64_t offset;
      size_t bytes;
      std::vector<std::string_view> parts;
    };
    RemoteKey forged_len = rw;  // claims a larger region: the target's table knows better
    forged_len.bytes = 1 << 20;
    forged_len.access = Access::ReadWrite;
    RemoteKey forged_region = rw;
    forged_region.region = 999;
    RemoteKey forged_gen = rw;
    forged_gen.generation ^= 0x10;
    RemoteKey forged_ro = ro;  // claims write access to the read-only region
    forged_ro.access = Access::ReadWrite;
    const std::vector<Bad> bads = {
        {"offset at the end", true, rw, kBytes, 1, {"out of bounds", "offset 4096", "length 1", "4096 bytes"}},
        {"crossing the end", true, rw, kBytes - 100, 200, {"out of bounds", "region"}},
        {"a large put crossing the end", true, rw, 0, 200 * 1024, {"out of bounds", "length 204800"}},
        {"a get past the end", false, rw, uint64_t{1} << 63, 8, {"out of bounds"}},
        {"offset + length overflow", true, rw, UINT64_MAX - 2, 16, {"overflows"}},
        {"get offset + length overflow", false, rw, UINT64_MAX, 2, {"overflows"}},
        {"put to a read-only region", true, ro, 0, 16, {"read access only", "write access"}},
        {"large put to a read-only region", true, forged_ro, 0, 64 * 1024, {"read access only"}},
        {"get from a write-only region", false, wo, 0, 16, {"write access only", "read access"}},
        {"large get from a write-only region", false, wo, 0, kBytes, {"write access only"}},
        {"a deregistered region", true, gone, 0, 16, {"deregistered", "stale"}},
        {"a get from a deregistered region", false, gone, 0, 16, {"deregistered"}},
        {"a forged length", true, forged_len, 8192, 16, {"out of bounds", "4096 bytes"}},
        {"a forged region", true, forged_region, 0, 16, {"no region 999"}},
        {"a forged generation", false, forged_gen, 0, 16, {"deregistered"}},
    };
    for (const Bad& b : bads) {
      Request req;
      Status posted = b.is_put ? rma->put(1, buf.data(), b.bytes, b.key, b.offset, &req)
                               : rma->get(1, buf.data(), b.bytes, b.key, b.offset, &req);
      ASSERT_TRUE(posted.isOk()) << b.what << ": " << posted.message();
      ASSERT_TRUE(driveOne(t, req)) << b.what;
      expectRefused(req, chorusInvalidArgument, b.parts, b.what);
      EXPECT_NE(req.status.message().find("rank 1"), std::string::npos) << req.status.message();
      EXPECT_NE(req.status.message().find(fmt::format("region {}", b.key.region)), std::string::npos)
          << req.status.message();
    }
    // The buffer a refused get named is untouched.
    std::vector<std::byte> expect_buf(buf.size());
    fillPattern(expect_buf.data(), expect_buf.size(), 1);
    EXPECT_EQ(buf, expect_buf);

    // Refused before anything travels.
    {
      Request req;
      EXPECT_EQ(rma->put(0, buf.data(), 8, rw, 0, &req).code(), chorusInvalidArgument) << "to itself";
      EXPECT_EQ(req.state.load(), Request::Failed);
      Request req2;
      EXPECT_EQ(rma->put(7, buf.data(), 8, rw, 0, &req2).code(), chorusInvalidArgument) << "to no peer";
      Request req3;
      EXPECT_EQ(rma->put(1, nullptr, 8, rw, 0, &req3).code(), chorusInvalidArgument) << "null buffer";
      RemoteKey other = rw;
      other.owner = 2;
      Request req4;
      Status s = rma->get(1, buf.data(), 8, other, 0, &req4);
      EXPECT_EQ(s.code(), chorusInvalidArgument);
      EXPECT_NE(s.message().find("key of rank 2"), std::string::npos) << s.message();
      EXPECT_EQ(req4.state.load(), Request::Failed);
    }

    // Garbled and foreign key blobs.
    const std::vector<std::byte> good = fetchKey(store, "rw", 1);
    auto refusedBlob = [&](std::vector<std::byte> blob, std::string_view part, const char* what) {
      auto k = rma->unpackKey(1, blob);
      ASSERT_FALSE(k.isOk()) << what;
      EXPECT_EQ(k.status().code(), chorusInvalidArgument) << what;
      EXPECT_NE(k.status().message().find(part), std::string::npos) << what << ": " << k.status().message();
    };
    for (size_t i = 0; i < good.size(); ++i) {
      std::vector<std::byte> b = good;
      b[i] ^= std::byte{0x40};
      EXPECT_FALSE(rma->unpackKey(1, b).isOk()) << "a key with byte " << i << " flipped was accepted";
    }
    refusedBlob({good.begin(), good.end() - 1}, "has 55 bytes", "cut short");
    refusedBlob({}, "has 0 bytes", "empty");
    {
      std::vector<std::byte> longer = good;
      longer.push_back(std::byte{0});
      refusedBlob(longer, "has 57 bytes", "too long");
    }
    {
      std::vector<std::byte> b = good;
      b[0] ^= std::byte{1};
      refusedBlob(b, "magic", "bad magic");
    }
    {
      std::vector<std::byte> b = good;
      b[4] = std::byte{9};
      refusedBlob(b, "version 9", "bad version");
    }
    {
      std::vector<std::byte> b = good;
      b[33] ^= std::byte{1};  // the length field
      refusedBlob(b, "fails its check", "garbled length");
    }
    EXPECT_FALSE(rma->unpackKey(0, good).isOk()) << "a key unpacked for this rank itself";

    // Still working: a valid put, a get, a notification, a message.
    std::vector<std::byte> part(50);
    fillPattern(part.data(), 50, 3);
    std::vector<std::byte> back(kBytes);
    std::deque<Request> reqs(4);
    ASSERT_TRUE(rma->put(1, part.data(), 50, rw, 100, &reqs[0]).isOk());
    ASSERT_TRUE(rma->get(1, back.data(), kBytes, ro, 0, &reqs[1]).isOk());
    ASSERT_TRUE(rma->notify(1, 42, &reqs[2]).isOk());
    std::vector<std::byte> msg(100);
    fillPattern(msg.data(), 100, 9);
    ASSERT_TRUE(t.postSend(1, msg.data(), msg.size(), &reqs[3]).isOk());
    std::vector<Request*> ptrs = {&reqs[0], &reqs[1], &reqs[2], &reqs[3]};
    ASSERT_TRUE(drive(t, ptrs));
    for (Request* q : ptrs) EXPECT_EQ(q->state.load(), Request::Done) << q->status.message();
    std::vector<std::byte> expect_ro(kBytes);
    fillPattern(expect_ro.data(), kBytes, 5);
    EXPECT_EQ(back, expect_ro);
    // Rank 1 checks its memory once its message arrived and stop is set;
    // the puts were answered, so they have landed.
    stop.store(true);
  });
}

// A target asleep in wait() wakes for an incoming notification, with no
// receive posted.
TEST_P(OneSided, AWaitingTargetWakesForOneSidedTraffic) {
  const Param param = GetParam();  // not a structured binding: clang 14 cannot capture one in a lambda
  const auto kind = param.kind;
  const int n = param.nranks;
  bootstrap::MemoryStore store;
  auto ts = makeTransports(kind, n, store);
  ASSERT_TRUE(ts.isOk()) << ts.status().message();
  std::atomic<bool> stop{false};
  runRanks(n, [&](int me) {
    Transport& t = *(*ts)[static_cast<size_t>(me)];
    Rma* rma = t.rma();
    ASSERT_NE(rma, nullptr);
    if (me == 1) {
      // Settle first (nothing to do), then sleep long waits until it comes.
      for (int i = 0; i < 20; ++i) ASSERT_TRUE(t.poll().isOk());
      ASSERT_TRUE(store.set("rma/asleep", std::vector<std::byte>(1)).isOk());
      const auto start = Clock::now();
      int from = -1;
      uint64_t value = 0;
      while (true) {
        auto r = t.poll();
        ASSERT_TRUE(r.isOk()) << r.status().message();
        if (*rma->takeNotification(&from, &value)) break;
        ASSERT_LT(Clock::now() - start, 20s);
        t.wait(10s);
      }
      EXPECT_LT(Clock::now() - start, 5s) << "the wait did not end for the notification";
      EXPECT_EQ(value, 7u);
      stop.store(true);
      return;
    }
    if (me == 0) {
      ASSERT_TRUE(store.get("rma/asleep", 20s).isOk());
      std::this_thread::sleep_for(100ms);
      Request req;
      ASSERT_TRUE(rma->notify(1, 7, &req).isOk());
      ASSERT_TRUE(driveOne(t, req));
      EXPECT_EQ(req.state.load(), Request::Done) << req.status.message();
    }
    Status err;
    serveUntil(t, stop, &err);
    EXPECT_TRUE(err.isOk()) << err.message();
  });
}

// An aborted transport fails the one-sided operations in flight and later
// posts; a peer's pending operations fail instead of hanging.
TEST_P(OneSidedPair, AbortFailsOneSidedOperations) {
  const Param param = GetParam();  // not a structured binding: clang 14 cannot capture one in a lambda
  const auto kind = param.kind;
  const int n = param.nranks;
  bootstrap::MemoryStore store;
  auto ts = makeTransports(kind, n, store);
  ASSERT_TRUE(ts.isOk()) << ts.status().message();
  Transport& t0 = *(*ts)[0];
  Transport& t1 = *(*ts)[1];
  Guarded region(4096);
  auto id = t1.rma()->registerRegion(region.data(), region.n, Access::ReadWrite);
  ASSERT_TRUE(id.isOk());
  auto key = t0.rma()->unpackKey(1, *t1.rma()->packKey(*id));
  ASSERT_TRUE(key.isOk()) << key.status().message();
  // Rank 1 never polls: the put stays pending until rank 1 aborts.
  std::vector<std::byte> buf(64);
  Request req;
  ASSERT_TRUE(t0.rma()->put(1, buf.data(), buf.size(), *key, 0, &req).isOk());
  for (int i = 0; i < 50; ++i) (void)t0.poll();
  EXPECT_FALSE(req.finished());
  t1.abort(makeError(chorusAborted, "test abort of rank 1"));
  (void)t1.poll();
  const auto deadline = Clock::now() + 20s;
  while (!req.finished() && Clock::now() < deadline) {
    (void)t0.poll();
    t0.wait(1ms);
  }
  ASSERT_TRUE(req.finished()) << "a put to an aborted peer hangs";
  EXPECT_EQ(req.state.load(), Request::Failed);
  EXPECT_NE(req.status.message().find("test abort of rank 1"), std::string::npos) << req.status.message();
  // Later posts on the aborted side fail at once.
  Request later;
  EXPECT_FALSE(t1.rma()->notify(0, 1, &later).isOk());
  EXPECT_EQ(later.state.load(), Request::Failed);
  int from = 0;
  uint64_t value = 0;
  EXPECT_FALSE(t1.rma()->takeNotification(&from, &value).isOk());
}

INSTANTIATE_TEST_SUITE_P(Transports, OneSided,
                         testing::Values(Param{Kind::ShmCma, 2}, Param{Kind::ShmCma, 3}, Param{Kind::ShmNoCma, 2},
                                         Param{Kind::ShmNoCma, 3}, Param{Kind::Tcp, 2}, Param{Kind::Tcp, 3}),
                         paramName);
INSTANTIATE_TEST_SUITE_P(Transports, OneSidedPair,
                         testing::Values(Param{Kind::ShmCma, 2}, Param{Kind::ShmNoCma, 2}, Param{Kind::Tcp, 2}),
                         paramName);

TEST(RmaTcp, OffUnlessTheSetupAsksForIt) {
  bootstrap::MemoryStore store;
  auto ts = buildOnThreads(2, [&](int r) -> Result<std::unique_ptr<Transport>> {
    TcpSetup t;
    t.rank = r;
    t.peers = othersThan(r, 2);
    t.comm_id = 0x7e5b;
    CHORUS_ASSIGN_OR_RETURN(t.bind_addr, net::resolve("127.0.0.1", 0));
    t.timeout = 20s;
    return createTcpTransport(t, store);
  });
  ASSERT_TRUE(ts.isOk()) << ts.status().message();
  EXPECT_EQ((*ts)[0]->rma(), nullptr);
  EXPECT_EQ((*ts)[1]->rma(), nullptr);
}

TEST(RmaTcp, BothEndsMustEnableIt) {
  bootstrap::MemoryStore store;
  std::vector<std::optional<Result<std::unique_ptr<Transport>>>> out(2);
  runRanks(2, [&](int r) {
    TcpSetup t;
    t.rank = r;
    t.peers = othersThan(r, 2);
    t.comm_id = 0x7e5c;
    t.bind_addr = *net::resolve("127.0.0.1", 0);
    t.timeout = 3s;
    t.rma = r == 0;  // rank 0 connects with a one-sided connection rank 1 does not expect
    out[static_cast<size_t>(r)].emplace(createTcpTransport(t, store));
  });
  // The rank that enables it opens a connection its peer does not expect:
  // its setup fails (naming the one-sided setting when the peer's refusal
  // reaches it before the peer's listener closes; a peer whose own sockets
  // were all accepted may finish its side of setup and then meets a closed
  // connection at its first message).  The pair never both succeeds.
  ASSERT_FALSE(out[0]->isOk()) << "rank 1: " << (out[1]->isOk() ? std::string("ok") : out[1]->status().message());
}

TEST(RmaKeys, RegionTableChecksEveryAccess) {
  RegionTable table(rmaTransportTag("test"), 3);
  std::vector<std::byte> mem(100);
  auto id = table.add(mem.data(), mem.size(), Access::Read);
  ASSERT_TRUE(id.isOk());
  RmaRefusal why{};
  uint64_t detail = 0;
  EXPECT_EQ(table.resolve(id->index, id->generation, 0, 100, Access::Read, &why, &detail), mem.data());
  EXPECT_EQ(table.resolve(id->index, id->generation, 100, 0, Access::Read, &why, &detail), mem.data() + 100);
  EXPECT_EQ(table.resolve(id->index, id->generation, 101, 0, Access::Read, &why, &detail), nullptr);
  EXPECT_EQ(why, RmaRefusal::OutOfBounds);
  EXPECT_EQ(detail, 100u);
  EXPECT_EQ(table.resolve(id->index, id->generation, 50, UINT64_MAX - 10, Access::Read, &why, &detail), nullptr);
  EXPECT_EQ(why, RmaRefusal::Overflow);
  EXPECT_EQ(table.resolve(id->index, id->generation, 0, 1, Access::Write, &why, &detail), nullptr);
  EXPECT_EQ(why, RmaRefusal::NoAccess);
  EXPECT_EQ(table.resolve(id->index + 1, id->generation, 0, 1, Access::Read, &why, &detail), nullptr);
  EXPECT_EQ(why, RmaRefusal::UnknownRegion);
  EXPECT_EQ(table.resolve(id->index, id->generation + 1, 0, 1, Access::Read, &why, &detail), nullptr);
  EXPECT_EQ(why, RmaRefusal::Deregistered);
  // Keys round-trip, and a key of another transport is refused.
  auto blob = table.pack(*id);
  ASSERT_TRUE(blob.isOk());
  auto key = table.unpack(3, true, *blob);
  ASSERT_TRUE(key.isOk()) << key.status().message();
  EXPECT_EQ(key->region, id->index);
  EXPECT_EQ(key->generation, id->generation);
  EXPECT_EQ(key->bytes, 100u);
  RegionTable other(rmaTransportTag("tcp"), 0);
  auto foreign = other.unpack(3, true, *blob);
  ASSERT_FALSE(foreign.isOk());
  EXPECT_NE(foreign.status().message().find("made by the test transport"), std::string::npos)
      << foreign.status().message();
  ASSERT_TRUE(table.remove(*id).isOk());
  EXPECT_EQ(table.resolve(id->index, id->generation, 0, 1, Access::Read, &why, &detail), nullptr);
  EXPECT_EQ(why, RmaRefusal::Deregistered);
  EXPECT_FALSE(table.pack(*id).isOk());
  // The texts name the ranks, the region, the offset and the length.
  Status s = rmaRefused("shm", RmaOpKind::Put, 0, 3, 5, 1, 4096, 8, RmaRefusal::OutOfBounds, 4096);
  EXPECT_EQ(s.code(), chorusInvalidArgument);
  for (std::string_view part : {"from rank 0 to rank 3", "region 5", "offset 4096", "length 8", "the region has 4096 bytes"})
    EXPECT_NE(s.message().find(part), std::string::npos) << s.message();
}

}  // namespace
}  // namespace chorus::transport
