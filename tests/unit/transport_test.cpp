// Conformance suite for every Transport: ranks are threads of this process,
// each with its own transport, wired together through a MemoryStore.
//
// To cover a new transport, add one entry to factories() below.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <random>
#include <span>
#include <thread>

#include "bootstrap/memory_store.hpp"
#include "kernels/reduce.hpp"
#include "transport/shm/shm.hpp"
#include "transport/tcp/tcp.hpp"

namespace chorus::transport {
namespace {

using namespace std::chrono_literals;
using Transports = std::vector<std::unique_ptr<Transport>>;

// Runs fn(rank) on n threads and joins them.
void runRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// Calls make(rank) for every rank concurrently (setup is collective).
Result<Transports> buildOnThreads(int n, const std::function<Result<std::unique_ptr<Transport>>(int)>& make) {
  std::vector<std::optional<Result<std::unique_ptr<Transport>>>> out(n);
  runRanks(n, [&](int r) { out[r].emplace(make(r)); });
  Transports ts;
  for (int r = 0; r < n; ++r) {
    if (!out[r]->isOk()) return out[r]->status().withContext(fmt::format("rank {}: ", r));
    ts.push_back(std::move(out[r]->value()));
  }
  return ts;
}

std::string uniquePrefix() {
  static std::atomic<int> counter{0};  // test-only: distinct segment names within this process
  return fmt::format("/chorus-tt-{}-{}", getpid(), counter.fetch_add(1));
}

std::vector<int> othersThan(int rank, int n) {
  std::vector<int> v;
  for (int r = 0; r < n; ++r)
    if (r != rank) v.push_back(r);
  return v;
}

Result<Transports> makeShm(int n, bootstrap::MemoryStore& store, bool cma, size_t ring_bytes) {
  std::string prefix = uniquePrefix();
  return buildOnThreads(n, [&](int r) {
    ShmSetup s;
    s.rank = r;
    s.peers = othersThan(r, n);
    s.segment_prefix = prefix;
    s.ring_bytes = ring_bytes;
    s.allow_cma = cma;
    s.timeout = 20s;
    return createShmTransport(s, store);
  });
}

// One way to build N connected transports for N thread-ranks.
struct TransportFactory {
  std::string name;
  std::function<Result<Transports>(int nranks, bootstrap::MemoryStore& store)> make;
};

const std::vector<TransportFactory>& factories() {
  static const std::vector<TransportFactory> kFactories = {
      {"shm_cma", [](int n, bootstrap::MemoryStore& s) { return makeShm(n, s, true, 1 << 20); }},
      {"shm_nocma", [](int n, bootstrap::MemoryStore& s) { return makeShm(n, s, false, 1 << 20); }},
      // A small ring: every message above 64 KiB streams through it, wrapping many times.
      {"shm_ring64k", [](int n, bootstrap::MemoryStore& s) { return makeShm(n, s, false, 64 << 10); }},
      {"tcp",
       [](int n, bootstrap::MemoryStore& s) {
         return buildOnThreads(n, [&](int r) -> Result<std::unique_ptr<Transport>> {
           TcpSetup t;
           t.rank = r;
           t.peers = othersThan(r, n);
           t.comm_id = 0x7e57;
           CHORUS_ASSIGN_OR_RETURN(t.bind_addr, net::resolve("127.0.0.1", 0));
           t.timeout = 20s;
           return createTcpTransport(t, s);
         });
       }},
  };
  return kFactories;
}

// Drives t until every request in reqs finished; false after `limit` or on a
// poll error.  The executor loop every transport is written for.
testing::AssertionResult drive(Transport& t, std::span<Request* const> reqs, std::chrono::milliseconds limit = 60s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (true) {
    Result<bool> r = t.poll();
    if (!r.isOk()) return testing::AssertionFailure() << "poll: " << r.status().message();
    bool all = std::all_of(reqs.begin(), reqs.end(), [](Request* q) { return q->finished(); });
    if (all) return testing::AssertionSuccess();
    if (std::chrono::steady_clock::now() > deadline)
      return testing::AssertionFailure() << "requests not finished within " << limit.count() << " ms";
    if (!*r) t.wait(1000us);
  }
}

// Deterministic bytes that differ per seed (source rank, message index).
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

std::vector<std::byte> pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  fillPattern(v.data(), n, seed);
  return v;
}

struct Param {
  size_t factory;
  int nranks;
};

class TransportConformance : public testing::TestWithParam<Param> {
 protected:
  void build(int n) {
    auto r = factories()[GetParam().factory].make(n, store_);
    ASSERT_TRUE(r.isOk()) << r.status().message();
    ts_ = std::move(r.value());
  }
  bootstrap::MemoryStore store_;
  Transports ts_;
};

// The cases that need at least one peer (instantiated for 2 ranks and up).
class TransportConformanceWithPeers : public TransportConformance {};

TEST_P(TransportConformance, AllPairsExchange) {
  const int n = GetParam().nranks;
  build(n);
  ASSERT_EQ(static_cast<int>(ts_.size()), n);
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{65536 + 3}, size_t{1000003},
                       size_t{16} << 20}) {
    SCOPED_TRACE(fmt::format("{} bytes", bytes));
    std::vector<std::vector<std::byte>> send(n);
    for (int r = 0; r < n; ++r) send[r] = pattern(bytes, 1000 + r);
    runRanks(n, [&](int r) {
      std::vector<Request> sreq(n), rreq(n);
      std::vector<std::vector<std::byte>> recv(n);
      std::vector<Request*> all;
      // Receives first on even ranks, sends first on odd ones: order must not matter.
      for (int pass = 0; pass < 2; ++pass) {
        for (int q = 0; q < n; ++q) {
          if (q == r) continue;
          if ((pass == 0) == (r % 2 == 0)) {
            recv[q].assign(bytes, std::byte{0xEE});
            ASSERT_TRUE(ts_[r]->postRecv(q, RecvTarget{recv[q].data(), bytes}, &rreq[q]).isOk());
            all.push_back(&rreq[q]);
          } else {
            ASSERT_TRUE(ts_[r]->postSend(q, send[r].data(), bytes, &sreq[q]).isOk());
            all.push_back(&sreq[q]);
          }
        }
      }
      ASSERT_TRUE(drive(*ts_[r], all)) << "rank " << r;
      for (int q = 0; q < n; ++q) {
        if (q == r) continue;
        EXPECT_EQ(sreq[q].state.load(), Request::Done) << sreq[q].status.message();
        EXPECT_EQ(rreq[q].state.load(), Request::Done) << rreq[q].status.message();
        EXPECT_TRUE(recv[q] == send[q]) << "rank " << r << " got wrong bytes from rank " << q;
      }
    });
  }
}

TEST_P(TransportConformanceWithPeers, FifoOrderOfManyMessages) {
  const int n = GetParam().nranks;
  build(n);
  constexpr int kMsgs = 300;
  // Sizes from a seeded generator every rank reproduces: mostly small, some
  // above the large-message thresholds of the transports.
  auto sizeOf = [](int src, int dst, int i) {
    std::mt19937 g(static_cast<uint32_t>(src * 7919 + dst * 104729 + i));
    return (i % 50 == 7) ? size_t{70000} + g() % 5000 : size_t{g() % 3000};
  };
  runRanks(n, [&](int r) {
    std::vector<std::vector<std::byte>> out, in;
    std::vector<Request> reqs(2 * kMsgs * (n - 1));
    std::vector<Request*> all;
    size_t k = 0;
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      for (int i = 0; i < kMsgs; ++i) {
        out.push_back(pattern(sizeOf(r, q, i), (uint64_t(r) << 40) | (uint64_t(q) << 20) | i));
        ASSERT_TRUE(ts_[r]->postSend(q, out.back().data(), out.back().size(), &reqs[k]).isOk());
        all.push_back(&reqs[k++]);
        in.emplace_back(sizeOf(q, r, i));
        ASSERT_TRUE(ts_[r]->postRecv(q, RecvTarget{in.back().data(), in.back().size()}, &reqs[k]).isOk());
        all.push_back(&reqs[k++]);
      }
    }
    ASSERT_TRUE(drive(*ts_[r], all)) << "rank " << r;
    size_t m = 0;
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      for (int i = 0; i < kMsgs; ++i, ++m) {
        ASSERT_EQ(in[m], pattern(sizeOf(q, r, i), (uint64_t(q) << 40) | (uint64_t(r) << 20) | i))
            << "rank " << r << ": message " << i << " from rank " << q << " out of order or corrupt";
      }
    }
    for (Request* q : all) EXPECT_EQ(q->state.load(), Request::Done) << q->status.message();
  });
}

TEST_P(TransportConformanceWithPeers, ReduceFloatSum) {
  const int n = GetParam().nranks;
  build(n);
  const kernels::Reducer sum(chorusFloat32, kernels::BinOp::Sum);
  // Counts that are not multiples of ring pieces or of CMA bounce sizes.
  for (size_t count : {size_t{1}, size_t{7}, size_t{1023}, size_t{16385}, size_t{262147}, size_t{1000003}}) {
    SCOPED_TRACE(fmt::format("{} floats", count));
    const size_t bytes = count * sizeof(float);
    // Small integers: sums are exact in float32.
    auto values = [count](int r) {
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>((i * 31 + r * 7) % 1000);
      return v;
    };
    std::vector<std::vector<float>> send(n);
    for (int r = 0; r < n; ++r) send[r] = values(r);
    runRanks(n, [&](int r) {
      std::vector<Request> sreq(n), rreq(n);
      std::vector<std::vector<float>> dst(n);
      std::vector<Request*> all;
      const std::vector<float> own = values(100 + r);
      for (int q = 0; q < n; ++q) {
        if (q == r) continue;
        ASSERT_TRUE(ts_[r]->postSend(q, send[r].data(), bytes, &sreq[q]).isOk());
        all.push_back(&sreq[q]);
        // Odd peers: in place (accum == dst); even peers: separate accum.
        dst[q] = (q % 2 == 1) ? own : std::vector<float>(count, -1.0f);
        RecvTarget t{reinterpret_cast<std::byte*>(dst[q].data()), bytes,
                     reinterpret_cast<const std::byte*>(q % 2 == 1 ? dst[q].data() : own.data()), &sum};
        ASSERT_TRUE(ts_[r]->postRecv(q, t, &rreq[q]).isOk());
        all.push_back(&rreq[q]);
      }
      ASSERT_TRUE(drive(*ts_[r], all)) << "rank " << r;
      for (int q = 0; q < n; ++q) {
        if (q == r) continue;
        ASSERT_EQ(rreq[q].state.load(), Request::Done) << rreq[q].status.message();
        size_t bad = 0;
        while (bad < count && dst[q][bad] == own[bad] + send[q][bad]) ++bad;
        ASSERT_EQ(bad, count) << "rank " << r << " from " << q << ": first wrong element " << bad;
      }
    });
  }
}

// Behaviour of one pair of ranks, per factory.
class TransportPair : public testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    auto r = factories()[GetParam()].make(2, store_);
    ASSERT_TRUE(r.isOk()) << r.status().message();
    ts_ = std::move(r.value());
  }
  bootstrap::MemoryStore store_;
  Transports ts_;
};

TEST_P(TransportPair, LengthMismatchFailsTheReceive) {
  auto small = pattern(100, 1), tiny = pattern(8, 2), big = pattern(1 << 20, 3), tiny2 = pattern(8, 4);
  std::vector<std::byte> r64(64), r8(8), r512k(512 << 10), r8b(8);
  Request s[4], r[4];
  std::thread sender([&] {
    ASSERT_TRUE(ts_[0]->postSend(1, small.data(), small.size(), &s[0]).isOk());
    ASSERT_TRUE(ts_[0]->postSend(1, tiny.data(), tiny.size(), &s[1]).isOk());
    ASSERT_TRUE(ts_[0]->postSend(1, big.data(), big.size(), &s[2]).isOk());
    ASSERT_TRUE(ts_[0]->postSend(1, tiny2.data(), tiny2.size(), &s[3]).isOk());
    Request* all[] = {&s[0], &s[1], &s[2], &s[3]};
    EXPECT_TRUE(drive(*ts_[0], all));
  });
  ASSERT_TRUE(ts_[1]->postRecv(0, RecvTarget{r64.data(), r64.size()}, &r[0]).isOk());
  ASSERT_TRUE(ts_[1]->postRecv(0, RecvTarget{r8.data(), r8.size()}, &r[1]).isOk());
  ASSERT_TRUE(ts_[1]->postRecv(0, RecvTarget{r512k.data(), r512k.size()}, &r[2]).isOk());
  ASSERT_TRUE(ts_[1]->postRecv(0, RecvTarget{r8b.data(), r8b.size()}, &r[3]).isOk());
  Request* all[] = {&r[0], &r[1], &r[2], &r[3]};
  EXPECT_TRUE(drive(*ts_[1], all));
  sender.join();
  ASSERT_EQ(r[0].state.load(), Request::Failed);
  EXPECT_EQ(r[0].status.code(), chorusMismatch);
  EXPECT_NE(r[0].status.message().find("100"), std::string::npos) << r[0].status.message();
  EXPECT_NE(r[0].status.message().find("64"), std::string::npos) << r[0].status.message();
  ASSERT_EQ(r[2].state.load(), Request::Failed);
  EXPECT_EQ(r[2].status.code(), chorusMismatch);
  EXPECT_NE(r[2].status.message().find(std::to_string(1 << 20)), std::string::npos) << r[2].status.message();
  // The stream stays in step: the messages after a rejected one arrive intact.
  ASSERT_EQ(r[1].state.load(), Request::Done) << r[1].status.message();
  EXPECT_EQ(r8, tiny);
  ASSERT_EQ(r[3].state.load(), Request::Done) << r[3].status.message();
  EXPECT_EQ(r8b, tiny2);
}

TEST_P(TransportPair, AbortFailsPostedRequestsAndEndsWait) {
  std::vector<std::byte> buf(64);
  Request recv, send;
  ASSERT_TRUE(ts_[0]->postRecv(1, RecvTarget{buf.data(), buf.size()}, &recv).isOk());
  std::promise<void> posted;
  auto executor = std::async(std::launch::async, [&] {
    posted.set_value();
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (!recv.finished() && std::chrono::steady_clock::now() < deadline) {
      Result<bool> r = ts_[0]->poll();
      if (r.isOk() && !*r) ts_[0]->wait(std::chrono::microseconds(20s));
    }
  });
  posted.get_future().wait();
  const auto t0 = std::chrono::steady_clock::now();
  ts_[0]->abort(makeError(chorusAborted, "test abort"));
  ASSERT_EQ(executor.wait_for(10s), std::future_status::ready) << "wait() did not end after abort()";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  ASSERT_EQ(recv.state.load(), Request::Failed);
  EXPECT_EQ(recv.status.code(), chorusAborted);
  EXPECT_FALSE(ts_[0]->poll().isOk());
  Status later = ts_[0]->postSend(1, buf.data(), buf.size(), &send);
  EXPECT_EQ(later.code(), chorusAborted);
}

TEST_P(TransportConformance, WakeEndsWaitEarly) {
  build(GetParam().nranks);
  Transport& t = *ts_[0];
  ASSERT_TRUE(t.poll().isOk());
  // A wake() before wait() ends the next wait.
  t.wake();
  auto t0 = std::chrono::steady_clock::now();
  t.wait(std::chrono::microseconds(30s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  // A wake() from another thread ends a current (or the next) wait.
  ASSERT_TRUE(t.poll().isOk());
  std::promise<void> go;
  auto waiter = std::async(std::launch::async, [&] {
    go.set_value();
    t.wait(std::chrono::microseconds(30s));
  });
  go.get_future().wait();
  t.wake();
  ASSERT_EQ(waiter.wait_for(10s), std::future_status::ready) << "wake() did not end wait()";
}

TEST_P(TransportConformance, PostToUnknownPeerFails) {
  const int n = GetParam().nranks;
  build(n);
  std::byte b{};
  Request req;
  EXPECT_FALSE(ts_[0]->postSend(n + 5, &b, 1, &req).isOk());
  EXPECT_FALSE(ts_[0]->postRecv(n + 5, RecvTarget{&b, 1}, &req).isOk());
}

std::vector<Param> allParams(int min_ranks) {
  std::vector<Param> v;
  for (size_t f = 0; f < factories().size(); ++f)
    for (int n : {1, 2, 3, 5, 8})
      if (n >= min_ranks) v.push_back({f, n});
  return v;
}

std::string paramName(const testing::TestParamInfo<Param>& p) {
  return fmt::format("{}_{}ranks", factories()[p.param.factory].name, p.param.nranks);
}

INSTANTIATE_TEST_SUITE_P(All, TransportConformance, testing::ValuesIn(allParams(1)), paramName);
INSTANTIATE_TEST_SUITE_P(All, TransportConformanceWithPeers, testing::ValuesIn(allParams(2)), paramName);
INSTANTIATE_TEST_SUITE_P(All, TransportPair, testing::Range(size_t{0}, factories().size()),
                         [](const testing::TestParamInfo<size_t>& p) { return factories()[p.param].name; });

}  // namespace
}  // namespace chorus::transport
