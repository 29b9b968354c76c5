// The UCX transport (src/transport/ucx/, docs/ucx.md): its place in the
// registry; messages of many sizes in FIFO order, reductions, mismatches;
// one-sided operations with every refusal checked on the target; faults (a
// peer that closes, a peer process that is killed, an abort, a rank with
// another secret, strangers during the handshake), each failing within a
// bound and naming the rank; and the whole collective matrix over it, ranks
// as threads of this process (one UCP context and worker each).
//
// Built without UCX, the file checks that the transport is reported absent
// by name.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "api/config.hpp"
#include "transport/registry.hpp"

#if CHORUS_HAVE_UCX
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <optional>
#include <random>
#include <thread>

#include "bootstrap/memory_store.hpp"
#include "bootstrap/store.hpp"
#include "kernels/reduce.hpp"
#include "plan/plan.hpp"
#include "support/collective_check.hpp"
#include "support/rank_threads.hpp"
#include "transport/rma.hpp"
#include "transport/ucx/ucx.hpp"
#include "transport/ucx/ucx_api.hpp"
#include "transport/ucx/ucx_wire.hpp"
#endif

namespace chorus::transport {
namespace {

Result<Config> parseTransport(const char* value) {
  return api::parseConfig([value](std::string_view k) -> std::optional<std::string> {
    if (k == "CHORUS_TRANSPORT") return std::string(value);
    return std::nullopt;
  });
}

#if !CHORUS_HAVE_UCX

// Without UCX the transport is not registered, and forcing it says which
// transports there are.
TEST(UcxRegistry, AbsentWithoutUcxAndNamedAsSuch) {
  EXPECT_EQ(registry().find("ucx"), nullptr);
  auto c = parseTransport("ucx");
  ASSERT_FALSE(c.isOk());
  EXPECT_NE(c.status().message().find("CHORUS_TRANSPORT='ucx' is not a registered transport (accepted: auto, shm, tcp"),
            std::string::npos)
      << c.status().message();
}

#else  // CHORUS_HAVE_UCX

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using TransportPtr = std::unique_ptr<Transport>;

constexpr uint64_t kCommId = 0xc0ffee;
constexpr size_t kMiB = size_t{1} << 20;

auth::Secret testSecret(uint8_t seed = 7) {
  auth::Secret s;
  for (size_t i = 0; i < s.bytes.size(); ++i) s.bytes[i] = std::byte(seed + i);
  s.present = true;
  return s;
}

UcxSetup setupFor(int rank, int nranks, uint8_t seed = 7) {
  UcxSetup s;
  s.rank = rank;
  for (int r = 0; r < nranks; ++r)
    if (r != rank) s.peers.push_back(r);
  s.comm_id = kCommId;
  s.secret = testSecret(seed);
  s.timeout = 20s;
  return s;
}

void runRanks(int nranks, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// Destroys the transports concurrently, as ranks leave together (a
// transport's teardown flushes its endpoints, a round trip to the peer,
// which the peer answers while it progresses: in its own teardown).
void destroyAll(std::vector<TransportPtr>& ts) {
  std::vector<std::thread> threads;
  for (auto& t : ts) threads.emplace_back([&t] { t.reset(); });
  for (auto& th : threads) th.join();
}

// One transport per rank, destroyed concurrently at the end of the scope.
struct Ranks : std::vector<TransportPtr> {
  using std::vector<TransportPtr>::vector;
  Ranks(Ranks&&) = default;
  ~Ranks() { destroyAll(*this); }
};

// One transport per rank, created concurrently (setup is collective).
Ranks createAll(int nranks, bootstrap::Store& store) {
  Ranks out(static_cast<size_t>(nranks));
  runRanks(nranks, [&](int r) {
    auto t = createUcxTransport(setupFor(r, nranks), store);
    EXPECT_TRUE(t.isOk()) << "rank " << r << ": " << t.status().message();
    if (t.isOk()) out[static_cast<size_t>(r)] = std::move(*t);
  });
  return out;
}

struct Driven {
  bool all_finished = false;
  Status poll_error;  // the first error poll() returned
};

Driven drive(Transport& t, const std::vector<Request*>& reqs, std::chrono::milliseconds limit = 30s) {
  Driven out;
  const auto deadline = Clock::now() + limit;
  for (;;) {
    auto r = t.poll();
    if (!r.isOk() && out.poll_error.isOk()) out.poll_error = r.status();
    if (std::all_of(reqs.begin(), reqs.end(), [](Request* q) { return q->finished(); })) {
      out.all_finished = true;
      return out;
    }
    if (Clock::now() > deadline) return out;
    if (r.isOk() && !*r) t.wait(2ms);
  }
}

std::vector<Request*> pointers(std::deque<Request>& reqs) {
  std::vector<Request*> out;
  for (auto& r : reqs) out.push_back(&r);
  return out;
}

std::vector<std::byte> pattern(size_t n, int from, int to, int msg) {
  std::vector<std::byte> v(n);
  uint64_t x = static_cast<uint64_t>(from * 1000003 + to * 1009 + msg * 7 + 1) * 0x9E3779B97F4A7C15ULL;
  for (size_t i = 0; i < n; ++i) {
    if ((i & 7) == 0) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    v[i] = std::byte(x >> (8 * (i & 7)));
  }
  return v;
}

// ---------------------------------------------------------------------------
// The registry

TEST(UcxRegistry, ComesAfterShmAndTcpAndRunsOnlyWhereForced) {
  const TransportInfo* u = registry().find("ucx");
  ASSERT_NE(u, nullptr);
  EXPECT_TRUE(u->caps.rma);
  EXPECT_TRUE(u->caps.registered_memory);
  EXPECT_FALSE(u->caps.board);
  EXPECT_FALSE(u->host_local);
  EXPECT_GT(u->preference, registry().find("tcp")->preference);
  EXPECT_GT(u->preference, registry().find("shm")->preference);
  bootstrap::HostIdentity a, b;
  std::snprintf(a.hostname, sizeof a.hostname, "a");
  std::snprintf(b.hostname, sizeof b.hostname, "b");
  const std::vector<RankRecord> ranks = {{0, 1, a}, {1, 2, a}, {2, 3, b}};
  Config cfg;
  const WireView view{0, ranks, &cfg};
  EXPECT_EQ(registry().routeFor(view, 0, 1, "auto")->name, "shm");
  EXPECT_EQ(registry().routeFor(view, 0, 2, "auto")->name, "tcp");
  EXPECT_EQ(registry().routeFor(view, 0, 1, "ucx")->name, "ucx");
  EXPECT_EQ(registry().routeFor(view, 0, 2, "ucx")->name, "ucx");
  auto forced = parseTransport("ucx");
  ASSERT_TRUE(forced.isOk()) << forced.status().message();
  EXPECT_EQ(forced->net.transport, "ucx");
  auto bad = parseTransport("ucxx");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("accepted: auto, shm, tcp, ucx"), std::string::npos) << bad.status().message();
}

// ---------------------------------------------------------------------------
// Two-sided messages

// Every rank sends `sizes` (in order) to every other and receives the same;
// every byte is checked.
void exchangeAll(std::vector<TransportPtr>& ts, const std::vector<size_t>& sizes) {
  const int n = static_cast<int>(ts.size());
  runRanks(n, [&](int me) {
    Transport& t = *ts[static_cast<size_t>(me)];
    std::deque<Request> reqs;
    std::deque<std::vector<std::byte>> sendbufs, recvbufs;
    struct Expect {
      int from, msg;
      std::vector<std::byte>* buf;
      Request* req;
    };
    std::vector<Expect> expects;
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      for (size_t m = 0; m < sizes.size(); ++m) {
        auto& rb = recvbufs.emplace_back(sizes[m]);
        Request& rr = reqs.emplace_back();
        ASSERT_TRUE(t.postRecv(p, RecvTarget{rb.data(), rb.size()}, &rr).isOk());
        expects.push_back({p, static_cast<int>(m), &rb, &rr});
        auto& sb = sendbufs.emplace_back(pattern(sizes[m], me, p, static_cast<int>(m)));
        ASSERT_TRUE(t.postSend(p, sb.data(), sb.size(), &reqs.emplace_back()).isOk());
      }
    }
    Driven d = drive(t, pointers(reqs));
    ASSERT_TRUE(d.all_finished) << "rank " << me << " timed out";
    EXPECT_TRUE(d.poll_error.isOk()) << d.poll_error.message();
    for (Request& r : reqs) EXPECT_EQ(r.state.load(), Request::Done) << r.status.message();
    for (const Expect& e : expects)
      EXPECT_TRUE(*e.buf == pattern(e.buf->size(), e.from, me, e.msg))
          << "rank " << me << ": message " << e.msg << " from rank " << e.from << " (" << e.buf->size() << " bytes)";
  });
}

TEST(UcxTransport, ManySizesKeepFifoOrderBetweenThreeRanks) {
  bootstrap::MemoryStore store;
  auto ts = createAll(3, store);
  ASSERT_TRUE(ts[0] && ts[1] && ts[2]);
  // Around the inline limit, UCX's eager and rendezvous sizes, and large.
  exchangeAll(ts, {0, 1, ucx::kInlineBytes, ucx::kInlineBytes + 1, 100, 65536, 3 * kMiB + 5, 7, 0, 20000});
}

// Rank 1 reduces rank 0's floats into its buffer: dst = accum + incoming.
void checkReduce(size_t count, bool in_place) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  kernels::Reducer sum(chorusFloat32, kernels::BinOp::Sum);
  ASSERT_TRUE(sum.valid());
  std::vector<float> src(count), accum(count), dst(count, -1.0f);
  for (size_t i = 0; i < count; ++i) {
    src[i] = static_cast<float>(i % 1000);
    accum[i] = static_cast<float>((i * 3) % 777);
  }
  if (in_place) dst = accum;
  runRanks(2, [&](int me) {
    Request req;
    if (me == 0) {
      ASSERT_TRUE(ts[0]->postSend(1, src.data(), count * sizeof(float), &req).isOk());
    } else {
      RecvTarget tgt{reinterpret_cast<std::byte*>(dst.data()), count * sizeof(float),
                     reinterpret_cast<const std::byte*>(in_place ? dst.data() : accum.data()), &sum};
      ASSERT_TRUE(ts[1]->postRecv(0, tgt, &req).isOk());
    }
    Driven d = drive(*ts[static_cast<size_t>(me)], {&req});
    ASSERT_TRUE(d.all_finished);
    EXPECT_EQ(req.state.load(), Request::Done) << req.status.message();
  });
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i)
    if (dst[i] != src[i] + accum[i] && bad++ < 5) ADD_FAILURE() << "element " << i << ": " << dst[i];
  EXPECT_EQ(bad, 0u);
}

TEST(UcxTransport, ReducesInlineAndSeparatePayloads) {
  checkReduce(7, false);
  checkReduce(300001, false);
  checkReduce(300001, true);
}

// A message of another length fails its receive with chorusMismatch naming
// both lengths (inline and separate payloads alike), nothing lands in the
// receive's buffer, and the next message still matches.
TEST(UcxTransport, MismatchedLengthsFailTheReceiveAndTheStreamGoesOn) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  const std::vector<size_t> sent = {100, 50000, 64};
  const std::vector<size_t> posted = {200, 60000, 64};
  std::deque<std::vector<std::byte>> bufs;
  runRanks(2, [&](int me) {
    std::deque<Request> reqs;
    for (size_t i = 0; i < sent.size(); ++i) {
      if (me == 0) {
        auto& b = bufs.emplace_back(pattern(sent[i], 0, 1, static_cast<int>(i)));
        ASSERT_TRUE(ts[0]->postSend(1, b.data(), b.size(), &reqs.emplace_back()).isOk());
      }
    }
    if (me == 1) {
      std::vector<std::vector<std::byte>> in;
      for (size_t i = 0; i < posted.size(); ++i) in.emplace_back(posted[i], std::byte{0x77});
      for (size_t i = 0; i < posted.size(); ++i)
        ASSERT_TRUE(ts[1]->postRecv(0, RecvTarget{in[i].data(), in[i].size()}, &reqs.emplace_back()).isOk());
      Driven d = drive(*ts[1], pointers(reqs));
      ASSERT_TRUE(d.all_finished);
      for (size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(reqs[i].state.load(), Request::Failed);
        EXPECT_EQ(reqs[i].status.code(), chorusMismatch);
        EXPECT_NE(reqs[i].status.message().find(fmt::format("has {} bytes but the receive expects {}", sent[i],
                                                            posted[i])),
                  std::string::npos)
            << reqs[i].status.message();
        EXPECT_TRUE(std::all_of(in[i].begin(), in[i].end(), [](std::byte b) { return b == std::byte{0x77}; }))
            << "a mismatched message wrote into the receive's buffer";
      }
      EXPECT_EQ(reqs[2].state.load(), Request::Done) << reqs[2].status.message();
      EXPECT_TRUE(in[2] == pattern(64, 0, 1, 2));
      return;
    }
    Driven d = drive(*ts[0], pointers(reqs));
    ASSERT_TRUE(d.all_finished);
  });
}

// A message of another call (its signature) fails the receive that takes
// it with chorusMismatch; a held message of the same call number but another
// signature is a mismatch even before any receive claims it.
TEST(UcxTransport, SignaturesAreCheckedOnEveryMessage) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  std::vector<std::byte> out = pattern(32, 0, 1, 0), in(32);
  Request send, recv;
  send.sig = 0x1111;
  recv.sig = 0x2222;
  ASSERT_TRUE(ts[0]->postSend(1, out.data(), out.size(), &send).isOk());
  ASSERT_TRUE(ts[1]->postRecv(0, RecvTarget{in.data(), in.size()}, &recv).isOk());
  ASSERT_TRUE(drive(*ts[0], {&send}).all_finished);
  ASSERT_TRUE(drive(*ts[1], {&recv}).all_finished);
  EXPECT_EQ(recv.state.load(), Request::Failed);
  EXPECT_EQ(recv.status.code(), chorusMismatch);
  EXPECT_NE(recv.status.message().find("collective mismatch: rank 0 sent"), std::string::npos) << recv.status.message();

  // Both ranks only send in call 3 (bits 16..31), with different roots
  // (another signature): rank 1 notices when it starts its own call.
  const uint64_t mine = (uint64_t{3} << 16) | 0x10, theirs = (uint64_t{3} << 16) | 0x20;
  Request s0, s1;
  s0.sig = theirs;
  ASSERT_TRUE(ts[0]->postSend(1, out.data(), out.size(), &s0).isOk());
  ASSERT_TRUE(drive(*ts[0], {&s0}).all_finished);
  // Let rank 1 take the header in (it is held: no receive claims it).
  for (auto until = Clock::now() + 200ms; Clock::now() < until;) ASSERT_TRUE(ts[1]->poll().isOk());
  s1.sig = mine;
  std::vector<std::byte> other(8);
  (void)ts[1]->postSend(0, other.data(), other.size(), &s1);
  Request later;
  const Status st = ts[1]->postRecv(0, RecvTarget{in.data(), in.size()}, &later);
  EXPECT_EQ(st.code(), chorusMismatch) << st.message();
  EXPECT_NE(st.message().find("collective mismatch"), std::string::npos) << st.message();
}

TEST(UcxTransport, WaitEndsForWakeAndForArrivingData) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  std::vector<std::byte> buf(8);
  Request recv;  // pending work, but nothing will arrive yet
  ASSERT_TRUE(ts[0]->postRecv(1, RecvTarget{buf.data(), buf.size()}, &recv).isOk());
  ts[0]->wake();  // before the wait: not lost
  auto start = Clock::now();
  ts[0]->wait(60s);
  EXPECT_LT(Clock::now() - start, 10s);
  std::thread waker([&] {
    std::this_thread::sleep_for(50ms);
    ts[0]->wake();
  });
  start = Clock::now();
  ts[0]->wait(60s);
  EXPECT_LT(Clock::now() - start, 10s);
  waker.join();
  EXPECT_FALSE(recv.finished());
  // Data arriving ends a long wait too.
  ASSERT_TRUE(ts[0]->poll().isOk());
  std::thread sender([&] {
    std::this_thread::sleep_for(100ms);
    uint64_t v = 42;
    Request send;
    ASSERT_TRUE(ts[1]->postSend(0, &v, sizeof v, &send).isOk());
    EXPECT_TRUE(drive(*ts[1], {&send}).all_finished);
  });
  start = Clock::now();
  while (!recv.finished() && Clock::now() - start < 20s) {
    ts[0]->wait(60s);
    ASSERT_TRUE(ts[0]->poll().isOk());
  }
  EXPECT_LT(Clock::now() - start, 10s);
  sender.join();
  EXPECT_EQ(recv.state.load(), Request::Done) << recv.status.message();
  uint64_t got = 0;
  std::memcpy(&got, buf.data(), sizeof got);
  EXPECT_EQ(got, 42u);
}

// A rank waiting for a message that does not come sleeps on the worker's
// event fd after its spin: it uses little CPU, and a wait without a wake
// lasts its timeout (or ends early; never spins it away).
TEST(UcxTransport, AnIdleWaitSleepsOnTheEventFd) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  std::vector<std::byte> buf(8);
  Request recv;
  ASSERT_TRUE(ts[0]->postRecv(1, RecvTarget{buf.data(), buf.size()}, &recv).isOk());
  auto cpu = [] {
    timespec t{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return std::chrono::seconds(t.tv_sec) + std::chrono::nanoseconds(t.tv_nsec);
  };
  const auto cpu0 = cpu();
  const auto start = Clock::now();
  int waits = 0;
  while (Clock::now() - start < 1s) {
    ASSERT_TRUE(ts[0]->poll().isOk());
    ts[0]->wait(100ms);
    ++waits;
  }
  const auto used = cpu() - cpu0;
  EXPECT_LT(used, 300ms) << waits << " waits in 1 s";
  EXPECT_LT(waits, 1000) << "waits return at once: the worker never sleeps";
  EXPECT_FALSE(recv.finished());
}

// ---------------------------------------------------------------------------
// Faults

TEST(UcxTransport, AbortFailsEverythingAndThePeerLearnsTheReason) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  std::vector<std::byte> buf(64);
  std::vector<std::byte> big(8 * kMiB);  // a rendezvous send nobody receives: stays pending
  Request recv, send;
  ASSERT_TRUE(ts[0]->postRecv(1, RecvTarget{buf.data(), buf.size()}, &recv).isOk());
  ASSERT_TRUE(ts[0]->postSend(1, big.data(), big.size(), &send).isOk());
  ASSERT_TRUE(ts[0]->poll().isOk());
  // Rank 1 progresses meanwhile (posting nothing), as a rank waiting on
  // rank 0 would.
  std::atomic<bool> aborted{false};
  std::thread peer([&] {
    while (!aborted.load()) {
      ASSERT_TRUE(ts[1]->poll().isOk());
      ts[1]->wait(1ms);
    }
    // Then it wants rank 0's message: it learns of the abort instead.
    std::vector<std::byte> in(big.size());
    Request peer_recv;
    const auto start = Clock::now();
    Status posted = ts[1]->postRecv(0, RecvTarget{in.data(), in.size()}, &peer_recv);
    if (posted.isOk()) {
      EXPECT_TRUE(drive(*ts[1], {&peer_recv}, 10s).all_finished);
    }
    EXPECT_LT(Clock::now() - start, 5s);
    EXPECT_EQ(peer_recv.state.load(), Request::Failed);
    EXPECT_EQ(peer_recv.status.code(), chorusRemoteError);
    EXPECT_NE(peer_recv.status.message().find("peer rank 0 aborted its communicator: test abort: rank 3 died"),
              std::string::npos)
        << peer_recv.status.message();
  });
  std::thread aborter([&] { ts[0]->abort(makeError(chorusRemoteError, "test abort: rank 3 died")); });
  auto start = Clock::now();
  ts[0]->wait(60s);  // returns on the abort's wake (or at once, if that came first)
  EXPECT_LT(Clock::now() - start, 10s);
  aborter.join();
  auto r = ts[0]->poll();
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("test abort"), std::string::npos);
  for (Request* q : {&recv, &send}) {
    EXPECT_EQ(q->state.load(), Request::Failed);
    EXPECT_NE(q->status.message().find("test abort"), std::string::npos) << q->status.message();
  }
  Request later;
  EXPECT_FALSE(ts[0]->postSend(1, buf.data(), 1, &later).isOk());
  EXPECT_EQ(later.state.load(), Request::Failed);
  aborted.store(true);
  peer.join();
}

// A peer that destroys its transport: what it sent before still arrives, a
// receive that can no longer be satisfied fails within the bound naming the
// rank, and later posts fail at once.
TEST(UcxTransport, APeerThatClosesFailsWhatItCanNoLongerSatisfyNamingIt) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  // A payload of its own (over the inline limit), yet eager on every lane
  // here (UCP's rendezvous starts at about 8 KiB on shared memory, 20 KiB on
  // tcp): the send is done once UCP has it.
  std::vector<std::byte> last = pattern(6000, 0, 1, 9);
  Request sent;
  ASSERT_TRUE(ts[0]->postSend(1, last.data(), last.size(), &sent).isOk());
  ASSERT_TRUE(ts[1]->poll().isOk());
  ASSERT_TRUE(drive(*ts[0], {&sent}).all_finished);
  ts[0].reset();
  std::vector<std::byte> in(last.size()), more(64);
  Request got, never;
  ASSERT_TRUE(ts[1]->postRecv(0, RecvTarget{in.data(), in.size()}, &got).isOk());
  ASSERT_TRUE(ts[1]->postRecv(0, RecvTarget{more.data(), more.size()}, &never).isOk());
  const auto start = Clock::now();
  Driven d = drive(*ts[1], {&got, &never}, 10s);
  ASSERT_TRUE(d.all_finished) << "the receive did not fail within 10 s of the peer closing";
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_EQ(got.state.load(), Request::Done) << got.status.message();
  EXPECT_TRUE(in == last);
  EXPECT_EQ(never.state.load(), Request::Failed);
  EXPECT_EQ(never.status.code(), chorusRemoteError);
  EXPECT_NE(never.status.message().find("rank 0"), std::string::npos) << never.status.message();
  EXPECT_EQ(d.poll_error.code(), chorusRemoteError);
  Request again;
  EXPECT_EQ(ts[1]->postRecv(0, RecvTarget{more.data(), more.size()}, &again).code(), chorusRemoteError);
  EXPECT_EQ(again.state.load(), Request::Failed);
  EXPECT_EQ(ts[1]->postSend(0, more.data(), more.size(), &again).code(), chorusRemoteError);
}

// A peer process killed outright (no close, no abort): UCP's peer error
// handling fails what waits for it within the bound, naming the rank.  The
// peer is this test binary run again (fork and exec: a forked copy of a
// process with UCX's threads, or a sanitizer's, must not go on running UCX)
// with CHORUS_UCX_TEST_PEER set; it plays rank 1 from a static initializer
// (runPeerIfAsked, below) and never reaches the tests.
constexpr size_t kPeerBigBytes = 8 * kMiB;

// Rank 1 as another process: a store served here, this binary run again as
// its peer (fork and exec), this rank's store connection; the peer is killed
// and reaped when the test ends.  start() reports a failure through gtest.
struct PeerProcess {
  std::unique_ptr<bootstrap::StoreServer> server;
  std::shared_ptr<bootstrap::Store> store;
  pid_t pid = -1;

  void start() {
    const auth::Secret secret = testSecret();
    auto bind = net::resolve("127.0.0.1", 0);
    ASSERT_TRUE(bind.isOk());
    auto started = bootstrap::StoreServer::start(*bind, secret);
    ASSERT_TRUE(started.isOk()) << started.status().message();
    server = std::move(*started);
    const std::string peer_env = "CHORUS_UCX_TEST_PEER=" + std::to_string(server->address().port());
    std::vector<char*> envp;
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    envp.push_back(const_cast<char*>(peer_env.c_str()));
    envp.push_back(nullptr);
    char exe[] = "/proc/self/exe";
    char* argv[] = {exe, nullptr};
    pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::execve(exe, argv, envp.data());
      ::_exit(127);
    }
    auto connected = bootstrap::connectStore(server->address(), secret, 20s);
    ASSERT_TRUE(connected.isOk()) << connected.status().message();
    store = std::move(*connected);
  }
  PeerProcess() = default;
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;
  ~PeerProcess() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

TEST(UcxTransport, AKilledPeerProcessFailsPendingWorkNamingItsRank) {
  PeerProcess peer;
  ASSERT_NO_FATAL_FAILURE(peer.start());
  auto t = createUcxTransport(setupFor(0, 2), *peer.store);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  uint64_t v = 41, back = 0;
  Request send, recv;
  ASSERT_TRUE((*t)->postSend(1, &v, sizeof v, &send).isOk());
  ASSERT_TRUE((*t)->postRecv(1, RecvTarget{reinterpret_cast<std::byte*>(&back), sizeof back}, &recv).isOk());
  ASSERT_TRUE(drive(**t, {&send, &recv}).all_finished);
  ASSERT_EQ(recv.state.load(), Request::Done) << recv.status.message();
  EXPECT_EQ(back, 42u);
  // The peer has also sent a large message (a rendezvous: its bytes stay
  // with the sender until a receive takes them); let its header arrive.
  for (auto until = Clock::now() + 300ms; Clock::now() < until;) {
    ASSERT_TRUE((*t)->poll().isOk());
    (*t)->wait(1ms);
  }
  ASSERT_EQ(::kill(peer.pid, SIGKILL), 0);
  ::waitpid(peer.pid, nullptr, 0);
  peer.pid = -1;
  std::vector<std::byte> big(kPeerBigBytes), in(64);
  Request large, pending;
  ASSERT_TRUE((*t)->postRecv(1, RecvTarget{big.data(), big.size()}, &large).isOk());
  ASSERT_TRUE((*t)->postRecv(1, RecvTarget{in.data(), in.size()}, &pending).isOk());
  const auto start = Clock::now();
  Driven d = drive(**t, {&large, &pending}, 15s);
  ASSERT_TRUE(d.all_finished) << "the receives from the killed rank did not fail within 15 s";
  EXPECT_LT(Clock::now() - start, 5s);
  for (Request* q : {&large, &pending}) {
    EXPECT_EQ(q->state.load(), Request::Failed);
    EXPECT_EQ(q->status.code(), chorusRemoteError) << q->status.message();
    EXPECT_NE(q->status.message().find("rank 1"), std::string::npos) << q->status.message();
  }
}

// A peer whose process stops (SIGSTOP: as a host cut off the network, its
// connections stay open and nothing resets them, so UCP reports nothing) is
// found by the transport's heartbeat within 3 x CHORUS_HEARTBEAT_MS: the
// receives from it fail naming it and the silence, instead of waiting for
// the operation's timeout.  Without the heartbeat they would wait forever
// (the drive's 15 s limit).  The same peer (runPeerIfAsked) as above.
TEST(UcxTransport, AStoppedPeerIsFoundByTheHeartbeatNamingItsRank) {
  PeerProcess peer;
  ASSERT_NO_FATAL_FAILURE(peer.start());
  UcxSetup s = setupFor(0, 2);
  s.heartbeat_ms = 300;  // silent for 900 ms: unreachable
  auto t = createUcxTransport(s, *peer.store);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  uint64_t v = 41, back = 0;
  Request send, recv;
  ASSERT_TRUE((*t)->postSend(1, &v, sizeof v, &send).isOk());
  ASSERT_TRUE((*t)->postRecv(1, RecvTarget{reinterpret_cast<std::byte*>(&back), sizeof back}, &recv).isOk());
  ASSERT_TRUE(drive(**t, {&send, &recv}).all_finished);
  ASSERT_EQ(recv.state.load(), Request::Done) << recv.status.message();
  EXPECT_EQ(back, 42u);
  // Alive and beating: nothing is declared while the peer runs (1.5 s, over
  // the 900 ms bound).
  for (auto until = Clock::now() + 1500ms; Clock::now() < until;) {
    auto r = (*t)->poll();
    ASSERT_TRUE(r.isOk()) << r.status().message();
    (*t)->wait(1ms);
  }
  ASSERT_EQ(::kill(peer.pid, SIGSTOP), 0);
  std::vector<std::byte> big(kPeerBigBytes), in(64);
  Request large, pending;
  ASSERT_TRUE((*t)->postRecv(1, RecvTarget{big.data(), big.size()}, &large).isOk());
  ASSERT_TRUE((*t)->postRecv(1, RecvTarget{in.data(), in.size()}, &pending).isOk());
  Driven d = drive(**t, {&large, &pending}, 15s);
  ASSERT_TRUE(d.all_finished) << "the receives from the stopped rank did not fail within 15 s";
  for (Request* q : {&large, &pending}) {
    EXPECT_EQ(q->state.load(), Request::Failed);
    EXPECT_EQ(q->status.code(), chorusRemoteError) << q->status.message();
  }
  EXPECT_NE(pending.status.message().find("rank 1 is unreachable: nothing heard from it"), std::string::npos)
      << pending.status.message();
  EXPECT_NE(d.poll_error.message().find("rank 1"), std::string::npos) << d.poll_error.message();
}

// Rank 1 of the test above, in the re-executed binary: connects to the
// test's store (its port in CHORUS_UCX_TEST_PEER), echoes one message, sends
// a large one, then waits to be killed.  Exits (never returning into gtest)
// when asked to run.
int runPeerIfAsked() {
  const char* port = std::getenv("CHORUS_UCX_TEST_PEER");
  if (port == nullptr) return 0;
  ::alarm(60);
  auto addr = net::resolve("127.0.0.1", static_cast<uint16_t>(std::atoi(port)));
  if (!addr.isOk()) ::_exit(2);
  auto store = bootstrap::connectStore(*addr, testSecret(), 20s);
  if (!store.isOk()) ::_exit(3);
  auto t = createUcxTransport(setupFor(1, 2), **store);
  if (!t.isOk()) ::_exit(4);
  uint64_t v = 0;
  Request recv, send;
  if (!(*t)->postRecv(0, RecvTarget{reinterpret_cast<std::byte*>(&v), sizeof v}, &recv).isOk()) ::_exit(5);
  if (!drive(**t, {&recv}).all_finished) ::_exit(6);
  ++v;
  if (!(*t)->postSend(0, &v, sizeof v, &send).isOk()) ::_exit(7);
  static std::vector<std::byte> big(kPeerBigBytes);
  Request large;
  if (!(*t)->postSend(0, big.data(), big.size(), &large).isOk()) ::_exit(8);
  for (;;) {
    (void)(*t)->poll();
    (*t)->wait(std::chrono::milliseconds(10));
  }
}
[[maybe_unused]] const int g_peer_role = runPeerIfAsked();

// A rank that runs with another secret fails the handshake on both sides,
// at once, naming the other rank (not a timeout).
TEST(UcxTransport, ARankWithAnotherSecretIsRefusedNamingIt) {
  bootstrap::MemoryStore store;
  std::vector<Status> results(2);
  const auto start = Clock::now();
  runRanks(2, [&](int r) {
    auto t = createUcxTransport(setupFor(r, 2, r == 1 ? 9 : 7), store);
    results[static_cast<size_t>(r)] = t.isOk() ? Status() : t.status();
  });
  EXPECT_LT(Clock::now() - start, 10s) << "refused by a timeout, not by the proof";
  for (int r = 0; r < 2; ++r) {
    const Status& s = results[static_cast<size_t>(r)];
    ASSERT_FALSE(s.isOk()) << "rank " << r << " accepted a peer with another secret";
    EXPECT_EQ(s.code(), chorusRemoteError) << s.message();
    EXPECT_NE(s.message().find(fmt::format("authentication failed: rank {} does not prove this job's secret", 1 - r)),
              std::string::npos)
        << s.message();
  }
}

// A stranger that reached rank 0's worker (it read the address) sends
// forged handshake records in rank 1's name and garbage on guessed tags
// before rank 1 even starts: both ranks still complete the handshake and
// exchange messages.
TEST(UcxTransport, StrangersCannotJoinOrBreakTheHandshake) {
  bootstrap::MemoryStore store;
  auto apiOr = ucx::ucpApi();
  ASSERT_TRUE(apiOr.isOk()) << apiOr.status().message();
  const ucx::UcpApi& api = **apiOr;
  std::atomic<bool> sent{false}, stop{false};
  std::thread stranger([&] {
    auto addr = store.get("ucx/0", 20s);
    ASSERT_TRUE(addr.isOk());
    ucp_config_t* cfg = nullptr;
    ASSERT_EQ(api.ucp_config_read(nullptr, nullptr, &cfg), UCS_OK);
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_TAG;
    ucp_context_h ctx = nullptr;
    ASSERT_EQ(api.init(&p, cfg, &ctx), UCS_OK);
    api.ucp_config_release(cfg);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucp_worker_h worker = nullptr;
    ASSERT_EQ(api.ucp_worker_create(ctx, &wp, &worker), UCS_OK);
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = reinterpret_cast<const ucp_address_t*>(addr->data());
    ucp_ep_h to0 = nullptr;
    ASSERT_EQ(api.ucp_ep_create(worker, &ep, &to0), UCS_OK);
    std::vector<void*> reqs;
    std::deque<std::vector<std::byte>> bufs;
    auto send = [&](uint64_t tag, std::vector<std::byte> bytes) {
      bufs.push_back(std::move(bytes));
      ucp_request_param_t rp{};
      ucs_status_ptr_t r = api.ucp_tag_send_nbx(to0, bufs.back().data(), bufs.back().size(), tag, &rp);
      if (r != nullptr && !UCS_PTR_IS_ERR(r)) reqs.push_back(r);
    };
    std::mt19937_64 rng(5);
    auto random = [&](size_t n) {
      std::vector<std::byte> v(n);
      for (auto& b : v) b = std::byte(rng());
      return v;
    };
    // A well-formed hello and a proof in rank 1's name (the proof can echo
    // no challenge it has seen, and its MAC is made up).
    ucx::Hello h;
    h.from = 1;
    h.to = 0;
    h.comm_id = kCommId;
    auto hb = std::as_bytes(std::span(&h, 1));
    send(ucx::makeTag(1, ucx::kChanCtl, ucx::kHelloSeq), {hb.begin(), hb.end()});
    ucx::Proof pr;
    pr.from = 1;
    pr.to = 0;
    pr.comm_id = kCommId;
    auto pb = std::as_bytes(std::span(&pr, 1));
    send(ucx::makeTag(1, ucx::kChanCtl, ucx::kProofSeq), {pb.begin(), pb.end()});
    // Garbage: records of the wrong size on the handshake's tags, message
    // headers on unkeyed tags, random tags.
    send(ucx::makeTag(1, ucx::kChanCtl, ucx::kHelloSeq), random(13));
    send(ucx::makeTag(1, ucx::kChanCtl, ucx::kProofSeq), random(5000));
    for (uint64_t s = 0; s < 4; ++s) send(ucx::makeTag(1, ucx::kChanMsg, s), random(40));
    for (int i = 0; i < 16; ++i) send(rng(), random(static_cast<size_t>(rng() % 9000)));
    sent.store(true);
    while (!stop.load()) api.ucp_worker_progress(worker);
    for (void* r : reqs) api.ucp_request_free(r);
    ucp_request_param_t cp{};
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t c = api.ucp_ep_close_nbx(to0, &cp);
    if (c != nullptr && !UCS_PTR_IS_ERR(c)) {
      while (api.ucp_request_check_status(c) == UCS_INPROGRESS) api.ucp_worker_progress(worker);
      api.ucp_request_free(c);
    }
    api.ucp_worker_destroy(worker);
    api.ucp_cleanup(ctx);
  });
  Ranks ts(2);
  runRanks(2, [&](int r) {
    if (r == 1)
      while (!sent.load()) std::this_thread::sleep_for(1ms);
    auto t = createUcxTransport(setupFor(r, 2), store);
    EXPECT_TRUE(t.isOk()) << "rank " << r << ": " << t.status().message();
    if (t.isOk()) ts[static_cast<size_t>(r)] = std::move(*t);
  });
  if (ts[0] && ts[1]) exchangeAll(ts, {8, 100000});
  destroyAll(ts);
  stop.store(true);
  stranger.join();
}

// ---------------------------------------------------------------------------
// One-sided operations (rma.hpp): the contract rma_test checks on shm and tcp.

struct Guarded {
  static constexpr size_t kGuard = 4096;
  static constexpr std::byte kGuardByte{0xA5};
  explicit Guarded(size_t bytes, std::byte fill = std::byte{0x5C}) : n(bytes), mem(bytes + 2 * kGuard, kGuardByte) {
    std::fill(data(), data() + n, fill);
  }
  std::byte* data() { return mem.data() + kGuard; }
  [[nodiscard]] bool guardsIntact() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (mem[i] != kGuardByte || mem[kGuard + n + i] != kGuardByte) return false;
    return true;
  }
  size_t n;
  std::vector<std::byte> mem;
};

// Keeps t progressing (serving peers' one-sided requests) until `stop`.
void serveUntil(Transport& t, const std::atomic<bool>& stop) {
  while (!stop.load(std::memory_order_acquire)) {
    Result<bool> r = t.poll();
    ASSERT_TRUE(r.isOk()) << r.status().message();
    if (!*r) t.wait(1ms);
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

// ---------------------------------------------------------------------------
// CHORUS_WIRE_PROTECT on UCX (bootstrap/wire_protect.hpp, ucx_wire.hpp
// "sealing"): every keyed message sealed per pair and direction.

using auth::WireProtect;

// One MessageSealer pair: what one end seals the other opens, and nothing
// else: another byte, stream, sequence or key fails, and `encrypt` leaves
// no plaintext byte on the wire.
TEST(UcxSealing, MessagesOpenOnlyWhereAndAsTheyWereSealed) {
  const auth::Secret secret = testSecret();
  std::array<std::byte, 32> na{}, nb{};
  na.fill(std::byte{1});
  nb.fill(std::byte{2});
  const std::array<std::byte, 3> ctx{std::byte{'u'}, std::byte{'c'}, std::byte{'x'}};
  const auth::SessionKeys ka = auth::deriveMessageKeys(secret, na, nb, ctx, true);
  const auth::SessionKeys kb = auth::deriveMessageKeys(secret, na, nb, ctx, false);
  EXPECT_EQ(ka.send, kb.recv);
  EXPECT_EQ(ka.recv, kb.send);
  EXPECT_NE(ka.send, ka.recv);
  const std::array<std::byte, 3> other_ctx{std::byte{'u'}, std::byte{'c'}, std::byte{'y'}};
  EXPECT_NE(auth::deriveMessageKeys(secret, na, nb, other_ctx, true).send, ka.send);
  for (WireProtect mode : {WireProtect::kMac, WireProtect::kEncrypt}) {
    SCOPED_TRACE(std::string(auth::wireProtectName(mode)));
    auth::MessageSealer tx(mode, ka.send, true), rx(mode, kb.recv, false);
    const std::vector<std::byte> head = pattern(32, 1, 2, 3), body = pattern(5000, 4, 5, 6);
    std::vector<std::byte> wire_body = body;
    std::array<std::byte, 16> tag{};
    ASSERT_TRUE(tx.seal(1, 7, head, wire_body, wire_body.data(), tag.data()));
    EXPECT_EQ(wire_body == body, mode == WireProtect::kMac) << "mac leaves the body readable, encrypt does not";
    auto opens = [&](uint32_t stream, uint64_t seq, std::vector<std::byte> h, std::vector<std::byte> b,
                     std::array<std::byte, 16> t) {
      const bool ok = rx.open(stream, seq, h, b, b.data(), t.data());
      if (ok) {
        EXPECT_TRUE(b == body);
      }
      return ok;
    };
    EXPECT_TRUE(opens(1, 7, head, wire_body, tag));
    EXPECT_FALSE(opens(1, 8, head, wire_body, tag)) << "another sequence (a replay or reorder)";
    EXPECT_FALSE(opens(2, 7, head, wire_body, tag)) << "another stream";
    auto h2 = head;
    h2[5] ^= std::byte{1};
    EXPECT_FALSE(opens(1, 7, h2, wire_body, tag)) << "a changed clear byte";
    auto b2 = wire_body;
    b2[4321] ^= std::byte{0x80};
    EXPECT_FALSE(opens(1, 7, head, b2, tag)) << "a changed body byte";
    auto t2 = tag;
    t2[0] ^= std::byte{1};
    EXPECT_FALSE(opens(1, 7, head, wire_body, t2)) << "a changed tag";
    auth::MessageSealer foreign(mode, ka.recv, false);  // the other direction's key
    auto b3 = wire_body;
    EXPECT_FALSE(foreign.open(1, 7, head, b3, b3.data(), tag.data()));
  }
}

UcxSetup protectedSetup(int rank, int nranks, WireProtect mode) {
  UcxSetup s = setupFor(rank, nranks);
  s.protect = mode;
  return s;
}

Ranks createProtected(int nranks, bootstrap::Store& store, WireProtect mode,
                      const std::function<void(UcxSetup&)>& tweak = {}) {
  Ranks out(static_cast<size_t>(nranks));
  runRanks(nranks, [&](int r) {
    UcxSetup s = protectedSetup(r, nranks, mode);
    if (tweak) tweak(s);
    auto t = createUcxTransport(s, store);
    EXPECT_TRUE(t.isOk()) << "rank " << r << ": " << t.status().message();
    if (t.isOk()) out[static_cast<size_t>(r)] = std::move(*t);
  });
  return out;
}

class UcxProtected : public ::testing::TestWithParam<WireProtect> {};

// Every size (inline, separate, rendezvous) in FIFO order between three
// ranks, reductions out of the stage and a bounce buffer, small one-sided
// operations; a large one-sided access, whose bytes no message would carry,
// is refused naming the mode.
TEST_P(UcxProtected, MessagesReductionsAndSmallOneSidedOperationsRunSealed) {
  const WireProtect mode = GetParam();
  bootstrap::MemoryStore store;
  {
    auto ts = createProtected(3, store, mode);
    ASSERT_TRUE(ts[0] && ts[1] && ts[2]);
    exchangeAll(ts, {0, 1, ucx::kInlineBytes, ucx::kInlineBytes + 1, 100, 65536, 3 * kMiB + 5, 7, 0, 20000});
  }
  bootstrap::MemoryStore store2;
  auto ts = createProtected(2, store2, mode);
  ASSERT_TRUE(ts[0] && ts[1]);
  kernels::Reducer sum(chorusFloat32, kernels::BinOp::Sum);
  for (size_t count : {size_t{7}, size_t{300001}}) {
    std::vector<float> src(count), accum(count), dst(count, -1.0f);
    for (size_t i = 0; i < count; ++i) {
      src[i] = static_cast<float>(i % 1000);
      accum[i] = static_cast<float>((i * 3) % 777);
    }
    runRanks(2, [&](int me) {
      Request req;
      if (me == 0) {
        ASSERT_TRUE(ts[0]->postSend(1, src.data(), count * sizeof(float), &req).isOk());
      } else {
        RecvTarget tgt{reinterpret_cast<std::byte*>(dst.data()), count * sizeof(float),
                       reinterpret_cast<const std::byte*>(accum.data()), &sum};
        ASSERT_TRUE(ts[1]->postRecv(0, tgt, &req).isOk());
      }
      ASSERT_TRUE(drive(*ts[static_cast<size_t>(me)], {&req}).all_finished);
      EXPECT_EQ(req.state.load(), Request::Done) << req.status.message();
    });
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(dst[i], src[i] + accum[i]) << "element " << i;
    }
  }
  // One-sided: rank 1's region, rank 0 puts, gets and notifies.
  std::atomic<bool> stop{false};
  runRanks(2, [&](int me) {
    Transport& t = *ts[static_cast<size_t>(me)];
    Rma* rma = t.rma();
    if (me == 1) {
      Guarded region(8192);
      auto id = rma->registerRegion(region.data(), region.n, Access::ReadWrite);
      ASSERT_TRUE(id.isOk());
      publishKey(store2, "sealed", 1, *rma->packKey(*id));
      const auto deadline = Clock::now() + 30s;
      int from = -1;
      uint64_t value = 0;
      for (;;) {
        auto r = t.poll();
        ASSERT_TRUE(r.isOk()) << r.status().message();
        if (*rma->takeNotification(&from, &value)) break;
        ASSERT_LT(Clock::now(), deadline);
        if (!*r) t.wait(1ms);
      }
      EXPECT_EQ(value, 42u);
      EXPECT_EQ(std::memcmp(region.data() + 100, pattern(4000, 0, 1, 9).data(), 4000), 0);
      EXPECT_TRUE(region.guardsIntact());
      serveUntil(t, stop);
      return;
    }
    auto key = rma->unpackKey(1, fetchKey(store2, "sealed", 1));
    ASSERT_TRUE(key.isOk()) << key.status().message();
    const auto data = pattern(4000, 0, 1, 9);
    std::vector<std::byte> back(4000);
    std::deque<Request> reqs;
    ASSERT_TRUE(rma->put(1, data.data(), data.size(), *key, 100, &reqs.emplace_back()).isOk());
    ASSERT_TRUE(rma->get(1, back.data(), back.size(), *key, 100, &reqs.emplace_back()).isOk());
    ASSERT_TRUE(rma->notify(1, 42, &reqs.emplace_back()).isOk());
    ASSERT_TRUE(drive(t, pointers(reqs)).all_finished);
    for (Request& q : reqs) EXPECT_EQ(q.state.load(), Request::Done) << q.status.message();
    EXPECT_TRUE(back == data);
    std::vector<std::byte> big(8000);
    Request refused;
    EXPECT_FALSE(rma->put(1, big.data(), big.size(), *key, 0, &refused).isOk());
    EXPECT_EQ(refused.state.load(), Request::Failed);
    EXPECT_NE(refused.status.message().find("CHORUS_WIRE_PROTECT"), std::string::npos) << refused.status.message();
    stop.store(true);
  });
}

// The communicator over sealed ucx: every collective at 3 ranks (every
// dtype at small counts, one large count) against the reference.
TEST_P(UcxProtected, CollectivesMatchTheReference) {
  Config cfg;
  cfg.net.transport = "ucx";
  cfg.net.wire_protect = GetParam();
  cfg.timeout = std::chrono::milliseconds(60000);
  auto cases = testing::standardCases(3, {0, 7}, /*all_dtypes=*/true);
  for (const testing::Case& c : testing::standardCases(3, {100003}, /*all_dtypes=*/false)) cases.push_back(c);
  auto msgs = testing::runRanks(3, cfg, [&](int r, chorusComm_t c) -> std::string {
    if (api::commTransports(c) != std::vector<std::string>{"ucx"}) return fmt::format("rank {}: not ucx alone", r);
    for (const testing::Case& k : cases)
      if (std::string err = testing::runCase(c, k); !err.empty()) return err;
    return "";
  });
  EXPECT_EQ(testing::failures(msgs), "");
}
INSTANTIATE_TEST_SUITE_P(Modes, UcxProtected, ::testing::Values(WireProtect::kMac, WireProtect::kEncrypt),
                         [](const auto& info) { return std::string(auth::wireProtectName(info.param)); });

// An on-path change of one byte: rank 1's receive hook (the test's attacker)
// flips a byte of rank 0's first message, or swaps in an earlier message of
// the same size (a replay).  Unprotected, the wrong bytes are delivered
// silently; sealed, rank 1's receive fails naming rank 0 and the integrity
// check, and rank 0's next operation with rank 1 fails naming rank 1 and it.
struct Attack {
  const char* name;
  size_t bytes;  // each of the two messages
  int channel;   // where the flip lands
  bool replay;   // the second message replaced by the first
};

TEST(UcxSealing, ATamperedOrReplayedMessageIsAnErrorOnBothSidesNeverAWrongResult) {
  const Attack attacks[] = {
      {"flip in an inline payload", 1000, ucx::kChanMsg, false},
      {"flip in a message header", 1000, ucx::kChanMsg, false},
      {"flip in a separate payload", 200000, ucx::kChanData, false},
      {"replayed inline message", 1000, ucx::kChanMsg, true},
  };
  for (const Attack& a : attacks) {
    for (WireProtect mode : {WireProtect::kOff, WireProtect::kMac, WireProtect::kEncrypt}) {
      SCOPED_TRACE(fmt::format("{}, {}", a.name, auth::wireProtectName(mode)));
      const bool header_flip = std::string_view(a.name).find("header") != std::string_view::npos;
      if (header_flip && mode == WireProtect::kOff) continue;  // every header field is checked even then
      std::atomic<int> hits{0};
      std::vector<std::byte> first;  // the replay's recording
      bootstrap::MemoryStore store;
      auto ts = createProtected(2, store, mode, [&](UcxSetup& s) {
        if (s.rank != 1) return;
        s.test_received = [&, a, header_flip](int peer, int channel, std::span<std::byte> b) {
          if (peer != 0 || channel != a.channel) return;
          const int n = hits++;
          if (a.replay) {
            if (n == 0) first.assign(b.begin(), b.end());
            if (n == 1 && first.size() == b.size()) std::memcpy(b.data(), first.data(), b.size());
            return;
          }
          if (n != 0) return;
          const size_t at = header_flip ? 8 : a.channel == ucx::kChanData ? b.size() / 2 : 32 + 500;  // length / payload
          b[at] ^= std::byte{0x04};
        };
      });
      ASSERT_TRUE(ts[0] && ts[1]);
      const auto m0 = pattern(a.bytes, 0, 1, 0), m1 = pattern(a.bytes, 0, 1, 1);
      std::vector<std::byte> r0(a.bytes), r1(a.bytes);
      Status rank0_later, rank1_first;
      runRanks(2, [&](int me) {
        Transport& t = *ts[static_cast<size_t>(me)];
        std::deque<Request> reqs;
        if (me == 0) {
          ASSERT_TRUE(t.postSend(1, m0.data(), m0.size(), &reqs.emplace_back()).isOk());
          ASSERT_TRUE(t.postSend(1, m1.data(), m1.size(), &reqs.emplace_back()).isOk());
          EXPECT_TRUE(drive(t, pointers(reqs), 10s).all_finished);
          // Rank 0's next operation with rank 1: a receive rank 1 answers
          // with 8 bytes when it saw nothing wrong.
          std::vector<std::byte> in(8);
          Request& later = reqs.emplace_back();
          (void)t.postRecv(1, RecvTarget{in.data(), in.size()}, &later);
          EXPECT_TRUE(drive(t, {&later}, 10s).all_finished) << "rank 0 hangs instead of failing";
          rank0_later = later.finished() && later.state.load() == Request::Failed ? later.status : Status();
        } else {
          Request& q0 = reqs.emplace_back();
          Request& q1 = reqs.emplace_back();
          ASSERT_TRUE(t.postRecv(0, RecvTarget{r0.data(), r0.size()}, &q0).isOk());
          (void)t.postRecv(0, RecvTarget{r1.data(), r1.size()}, &q1);
          EXPECT_TRUE(drive(t, pointers(reqs), 10s).all_finished) << "rank 1 hangs instead of failing";
          for (Request* q : {&q0, &q1})
            if (q->state.load() == Request::Failed && rank1_first.isOk()) rank1_first = q->status;
          if (rank1_first.isOk()) {
            std::vector<std::byte> ok(8);
            Request reply;
            ASSERT_TRUE(t.postSend(0, ok.data(), ok.size(), &reply).isOk());
            EXPECT_TRUE(drive(t, {&reply}, 10s).all_finished);
          }
        }
      });
      if (mode == WireProtect::kOff) {
        EXPECT_TRUE(rank1_first.isOk()) << rank1_first.message();
        EXPECT_TRUE(rank0_later.isOk()) << rank0_later.message();
        EXPECT_FALSE(r0 == m0 && r1 == m1) << "the attack changed nothing: the test does not test";
        continue;
      }
      ASSERT_FALSE(rank1_first.isOk()) << "rank 1 took a tampered message";
      EXPECT_NE(rank1_first.message().find("from rank 0 failed its integrity check"), std::string::npos)
          << rank1_first.message();
      EXPECT_FALSE(r0 == m0 && r1 == m1 && rank1_first.isOk());
      // What was delivered is what was sent: nothing of a failed message.
      if (!(r0 == m0)) {
        EXPECT_TRUE(std::all_of(r0.begin(), r0.end(), [](std::byte b) { return b == std::byte{0}; }));
      }
      ASSERT_FALSE(rank0_later.isOk()) << "rank 0 did not learn of it";
      EXPECT_NE(rank0_later.message().find("rank 1"), std::string::npos) << rank0_later.message();
      EXPECT_NE(rank0_later.message().find("integrity check"), std::string::npos) << rank0_later.message();
    }
  }
}

// Rank 0 sends three messages to rank 1, one of which its test hook loses,
// then posts a receive from rank 1 and returns how that ended (failed: its
// status; else OK); rank 1 posts a receive for each message into `got`.
// Both sides' waits are bounded by 10 s: a receive left waiting for the lost
// message until then fails the test (the check is that it fails at once).
Status sendThreeOneLost(Ranks& ts, const std::array<const std::vector<std::byte>*, 3>& sent,
                        const std::array<std::vector<std::byte>*, 3>& into, std::deque<Request>& got) {
  Status rank0_later;
  runRanks(2, [&](int me) {
    Transport& t = *ts[static_cast<size_t>(me)];
    if (me == 0) {
      std::deque<Request> reqs;
      for (const auto* m : sent) ASSERT_TRUE(t.postSend(1, m->data(), m->size(), &reqs.emplace_back()).isOk());
      EXPECT_TRUE(drive(t, pointers(reqs), 10s).all_finished);
      std::vector<std::byte> in(8);
      Request& later = reqs.emplace_back();
      (void)t.postRecv(1, RecvTarget{in.data(), in.size()}, &later);
      EXPECT_TRUE(drive(t, {&later}, 10s).all_finished) << "rank 0 hangs instead of failing";
      rank0_later = later.finished() && later.state.load() == Request::Failed ? later.status : Status();
    } else {
      for (auto* r : into) (void)t.postRecv(0, RecvTarget{r->data(), r->size()}, &got.emplace_back());
      EXPECT_TRUE(drive(t, pointers(got), 10s).all_finished) << "rank 1 waits for what was lost";
    }
  });
  return rank0_later;
}

// A message lost on the way (the sender's test hook drops the second of
// three): the receive that waits for it fails as soon as the third has
// arrived, naming the sender and the missing message, and the sender's next
// operation with the receiver fails naming it (its abort notice), on the
// clear wire and sealed alike.  Without the check both would wait for the
// call's timeout (here: the drive's 10 s limit).
TEST(UcxTransport, ALostMessageFailsTheWaitingReceiveAtOnceNamingThePeer) {
  for (WireProtect mode : {WireProtect::kOff, WireProtect::kMac}) {
    SCOPED_TRACE(auth::wireProtectName(mode));
    bootstrap::MemoryStore store;
    auto ts = createProtected(2, store, mode, [](UcxSetup& s) {
      if (s.rank == 0) s.test_drop_send = [](int peer, uint64_t seq) { return peer == 1 && seq == 1; };
    });
    ASSERT_TRUE(ts[0] && ts[1]);
    const auto m0 = pattern(100, 0, 1, 0), m1 = pattern(100, 0, 1, 1), m2 = pattern(100, 0, 1, 2);
    std::vector<std::byte> r0(100), r1(100), r2(100);
    std::deque<Request> got;
    const Status rank0_later = sendThreeOneLost(ts, {&m0, &m1, &m2}, {&r0, &r1, &r2}, got);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[0].state.load(), Request::Done) << got[0].status.message();
    EXPECT_EQ(r0, m0);
    ASSERT_EQ(got[1].state.load(), Request::Failed);
    EXPECT_NE(got[1].status.message().find("message #1 from rank 0 is missing"), std::string::npos)
        << got[1].status.message();
    EXPECT_EQ(got[2].state.load(), Request::Failed);
    ASSERT_FALSE(rank0_later.isOk()) << "rank 0 did not learn of it";
    EXPECT_NE(rank0_later.message().find("rank 1"), std::string::npos) << rank0_later.message();
    EXPECT_NE(rank0_later.message().find("is missing"), std::string::npos) << rank0_later.message();
  }
}

// A large message whose header arrived but whose payload never does (the
// sender's test hook drops the payload alone): once the sender's next
// message arrived, the receive waiting for the payload fails at once naming
// the sender and the missing payload (the next message, already received,
// stays received), and the sender's next operation fails naming the
// receiver; on the clear wire and under mac.
TEST(UcxTransport, ALostPayloadFailsTheWaitingReceiveAtOnceNamingThePeer) {
  // 64 KiB: an eager payload on UCX's tcp lane; 2 MiB: a rendezvous one.
  for (const auto& [mode, bytes] : {std::pair{WireProtect::kOff, 64 * 1024}, std::pair{WireProtect::kMac, 64 * 1024},
                                    std::pair{WireProtect::kOff, 2 << 20}}) {
    SCOPED_TRACE(fmt::format("{}, {} bytes", auth::wireProtectName(mode), bytes));
    bootstrap::MemoryStore store;
    auto ts = createProtected(2, store, mode, [](UcxSetup& s) {
      if (s.rank == 0) s.test_drop_payload = [](int peer, uint64_t seq) { return peer == 1 && seq == 1; };
    });
    ASSERT_TRUE(ts[0] && ts[1]);
    const auto m0 = pattern(100, 0, 1, 0), m1 = pattern(static_cast<size_t>(bytes), 0, 1, 1),
               m2 = pattern(100, 0, 1, 2);
    std::vector<std::byte> r0(m0.size()), r1(m1.size()), r2(m2.size());
    std::deque<Request> got;
    const Status rank0_later = sendThreeOneLost(ts, {&m0, &m1, &m2}, {&r0, &r1, &r2}, got);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[0].state.load(), Request::Done) << got[0].status.message();
    EXPECT_EQ(r0, m0);
    ASSERT_EQ(got[1].state.load(), Request::Failed);
    EXPECT_NE(got[1].status.message().find("the payload of message #1 from rank 0 is missing"), std::string::npos)
        << got[1].status.message();
    // The next message, whose arrival showed the gap, had arrived whole and
    // met its receive before.
    EXPECT_EQ(got[2].state.load(), Request::Done) << got[2].status.message();
    EXPECT_EQ(r2, m2);
    ASSERT_FALSE(rank0_later.isOk()) << "rank 0 did not learn of it";
    EXPECT_NE(rank0_later.message().find("rank 1"), std::string::npos) << rank0_later.message();
    EXPECT_NE(rank0_later.message().find("is missing"), std::string::npos) << rank0_later.message();
  }
}

// Ranks that disagree on the mode fail at setup, on both sides, naming
// CHORUS_WIRE_PROTECT (not a timeout); a mode without a secret is refused.
TEST(UcxSealing, RanksThatDisagreeOnTheModeFailAtSetupNamingIt) {
  for (WireProtect other : {WireProtect::kOff, WireProtect::kEncrypt}) {
    bootstrap::MemoryStore store;
    std::vector<Status> results(2);
    const auto start = Clock::now();
    runRanks(2, [&](int r) {
      auto t = createUcxTransport(protectedSetup(r, 2, r == 0 ? WireProtect::kMac : other), store);
      results[static_cast<size_t>(r)] = t.isOk() ? Status() : t.status();
    });
    EXPECT_LT(Clock::now() - start, 10s) << "refused by a timeout, not by the proof";
    for (int r = 0; r < 2; ++r) {
      const Status& s = results[static_cast<size_t>(r)];
      ASSERT_FALSE(s.isOk()) << "rank " << r << " accepted a peer of another mode";
      EXPECT_NE(s.message().find(fmt::format("rank {} protects its messages with CHORUS_WIRE_PROTECT=", 1 - r)),
                std::string::npos)
          << s.message();
    }
  }
  bootstrap::MemoryStore store;
  UcxSetup s = protectedSetup(0, 1, WireProtect::kMac);
  s.secret = auth::Secret{};
  auto t = createUcxTransport(s, store);
  ASSERT_FALSE(t.isOk());
  EXPECT_NE(t.status().message().find("needs a job secret"), std::string::npos) << t.status().message();
}

class UcxRma : public ::testing::TestWithParam<int> {};

// Every rank puts ranges of many sizes (inline and through the origin's
// remote key) into its own area of every peer's region and notifies; the
// target finds the data in place when the notification arrives; then every
// rank gets the ranges back.
TEST_P(UcxRma, PutsAndGetsOfManySizesLandExactlyAndNotificationsFollowThem) {
  const int n = GetParam();
  bootstrap::MemoryStore store;
  auto ts = createAll(n, store);
  for (auto& t : ts) ASSERT_TRUE(t);
  struct Range {
    uint64_t off;
    size_t bytes;
  };
  const std::vector<Range> ranges = {{0, 0},          {7, 1},           {4097, 4095},    {8200, 4096},
                                     {12345, kMiB},   {kMiB + 65536, 3 * kMiB}, {5 * kMiB, 3}};
  constexpr size_t kArea = 6 * kMiB;
  std::atomic<int> finished{0};
  runRanks(n, [&](int me) {
    Transport& t = *ts[static_cast<size_t>(me)];
    Rma* rma = t.rma();
    ASSERT_NE(rma, nullptr);
    std::vector<int> peers;
    for (int p = 0; p < n; ++p)
      if (p != me) peers.push_back(p);
    Guarded region(peers.size() * kArea);
    auto id = rma->registerRegion(region.data(), region.n, Access::ReadWrite);
    ASSERT_TRUE(id.isOk()) << id.status().message();
    publishKey(store, "sizes", me, *rma->packKey(*id));
    auto areaAt = [&](int origin, int target) {
      return static_cast<uint64_t>(origin < target ? origin : origin - 1) * kArea;
    };
    std::vector<std::vector<std::byte>> src(static_cast<size_t>(n));
    std::vector<RemoteKey> keys(static_cast<size_t>(n));
    for (int p : peers) {
      src[static_cast<size_t>(p)] = pattern(kArea, me, p, 1);
      auto k = rma->unpackKey(p, fetchKey(store, "sizes", p));
      ASSERT_TRUE(k.isOk()) << k.status().message();
      keys[static_cast<size_t>(p)] = *k;
    }
    std::deque<Request> reqs;
    std::vector<Request*> ptrs;
    for (int p : peers) {
      for (const Range& r : ranges) {
        ASSERT_TRUE(rma->put(p, src[static_cast<size_t>(p)].data() + r.off, r.bytes, keys[static_cast<size_t>(p)],
                             areaAt(me, p) + r.off, &reqs.emplace_back())
                        .isOk());
        ptrs.push_back(&reqs.back());
      }
      ASSERT_TRUE(rma->notify(p, 1000 + static_cast<uint64_t>(me), &reqs.emplace_back()).isOk());
      ptrs.push_back(&reqs.back());
    }
    int notes = 0;
    const auto deadline = Clock::now() + 60s;
    while (notes < static_cast<int>(peers.size()) ||
           !std::all_of(ptrs.begin(), ptrs.end(), [](Request* q) { return q->finished(); })) {
      auto r = t.poll();
      ASSERT_TRUE(r.isOk()) << r.status().message();
      int from = -1;
      uint64_t value = 0;
      auto got = rma->takeNotification(&from, &value);
      ASSERT_TRUE(got.isOk());
      if (*got) {
        EXPECT_EQ(value, 1000 + static_cast<uint64_t>(from));
        const std::vector<std::byte> want = pattern(kArea, from, me, 1);
        const std::byte* area = region.data() + areaAt(from, me);
        for (const Range& rg : ranges)
          EXPECT_EQ(std::memcmp(area + rg.off, want.data() + rg.off, rg.bytes), 0)
              << "rank " << me << ": data of rank " << from << " at " << rg.off << " (" << rg.bytes
              << " bytes) not in place when its notification arrived";
        ++notes;
        continue;
      }
      ASSERT_LT(Clock::now(), deadline) << "rank " << me << ": puts or notifications did not finish";
      if (!*r) t.wait(1ms);
    }
    for (Request* q : ptrs) EXPECT_EQ(q->state.load(), Request::Done) << q->status.message();
    EXPECT_TRUE(region.guardsIntact()) << "rank " << me << ": a put wrote outside the region";
    std::deque<Guarded> dsts;
    std::vector<Request*> gets;
    for (int p : peers)
      for (const Range& r : ranges) {
        dsts.emplace_back(r.bytes, std::byte{0x11});
        ASSERT_TRUE(rma->get(p, dsts.back().data(), r.bytes, keys[static_cast<size_t>(p)], areaAt(me, p) + r.off,
                             &reqs.emplace_back())
                        .isOk());
        gets.push_back(&reqs.back());
      }
    ASSERT_TRUE(drive(t, gets).all_finished);
    size_t i = 0;
    for (int p : peers)
      for (const Range& r : ranges) {
        EXPECT_EQ(gets[i]->state.load(), Request::Done) << gets[i]->status.message();
        EXPECT_EQ(std::memcmp(dsts[i].data(), src[static_cast<size_t>(p)].data() + r.off, r.bytes), 0)
            << "rank " << me << ": get of " << r.bytes << " bytes at " << r.off << " from rank " << p;
        EXPECT_TRUE(dsts[i].guardsIntact()) << "a get wrote outside its buffer";
        ++i;
      }
    finished.fetch_add(1);
    while (finished.load() < n) {
      auto r = t.poll();
      ASSERT_TRUE(r.isOk()) << r.status().message();
      if (!*r) t.wait(1ms);
    }
    EXPECT_TRUE(rma->deregisterRegion(*id).isOk());
    EXPECT_FALSE(rma->deregisterRegion(*id).isOk()) << "a second deregistration must be refused";
  });
}
INSTANTIATE_TEST_SUITE_P(Ranks, UcxRma, ::testing::Values(2, 3));

// Rounds of puts in an order that is not the address order, each followed
// at once by a notification: the round's data is all there when it arrives.
TEST(UcxRmaPair, NotificationArrivesAfterEveryEarlierPut) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  constexpr int kRounds = 16;
  constexpr size_t kSmall = 3000, kSmalls = 6, kBig = 200 * 1024;
  constexpr size_t kRound = kSmall * kSmalls + kBig;
  std::atomic<bool> stop{false};
  runRanks(2, [&](int me) {
    Transport& t = *ts[static_cast<size_t>(me)];
    Rma* rma = t.rma();
    if (me == 1) {
      Guarded region(kRounds * kRound);
      auto id = rma->registerRegion(region.data(), region.n, Access::Write);
      ASSERT_TRUE(id.isOk());
      publishKey(store, "rounds", me, *rma->packKey(*id));
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
          EXPECT_EQ(std::memcmp(region.data() + round * kRound, pattern(kRound, 0, 1, round).data(), kRound), 0)
              << "round " << round << "'s data was not all there when its notification arrived";
          ++round;
          continue;
        }
        ASSERT_LT(Clock::now(), deadline);
        if (!*r) t.wait(1ms);
      }
      EXPECT_TRUE(region.guardsIntact());
      stop.store(true);
      return;
    }
    auto key = rma->unpackKey(1, fetchKey(store, "rounds", 1));
    ASSERT_TRUE(key.isOk()) << key.status().message();
    std::vector<std::vector<std::byte>> data;
    std::deque<Request> reqs;
    for (int round = 0; round < kRounds; ++round) {
      data.push_back(pattern(kRound, 0, 1, round));
      for (size_t s = kSmalls; s-- > 0;)
        ASSERT_TRUE(rma->put(1, data.back().data() + kBig + s * kSmall, kSmall, *key,
                             round * kRound + kBig + s * kSmall, &reqs.emplace_back())
                        .isOk());
      ASSERT_TRUE(rma->put(1, data.back().data(), kBig, *key, round * kRound, &reqs.emplace_back()).isOk());
      ASSERT_TRUE(rma->notify(1, static_cast<uint64_t>(round), &reqs.emplace_back()).isOk());
    }
    ASSERT_TRUE(drive(t, pointers(reqs)).all_finished);
    for (Request& q : reqs) EXPECT_EQ(q.state.load(), Request::Done) << q.status.message();
    serveUntil(t, stop);
  });
}

// The origin's registration cache: puts and gets from one buffer map it once
// and reuse the mapping; once the buffer leaves the address space (munmap)
// and another is mapped at the same address, the next access maps it anew
// and carries the new bytes; exactly the same buffer only (another length
// or direction is its own mapping).
TEST(UcxRmaPair, TheRegistrationCacheReusesABufferAndForgetsItWhenItIsUnmapped) {
#if !CHORUS_UCX_REG_CACHE
  GTEST_SKIP() << "no registration cache under the sanitizers (UCX's memory hooks)";
#endif
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  constexpr size_t kBytes = 64 * 1024;
  std::atomic<bool> stop{false};
  Guarded region(kBytes);
  runRanks(2, [&](int me) {
    Transport& t = *ts[static_cast<size_t>(me)];
    Rma* rma = t.rma();
    if (me == 1) {
      auto id = rma->registerRegion(region.data(), region.n, Access::ReadWrite);
      ASSERT_TRUE(id.isOk());
      publishKey(store, "cache", 1, *rma->packKey(*id));
      serveUntil(t, stop);
      return;
    }
    auto key = rma->unpackKey(1, fetchKey(store, "cache", 1));
    ASSERT_TRUE(key.isOk()) << key.status().message();
    auto one = [&](bool put, void* buf, size_t n, uint64_t offset) {
      Request q;
      ASSERT_TRUE((put ? rma->put(1, buf, n, *key, offset, &q) : rma->get(1, buf, n, *key, offset, &q)).isOk());
      ASSERT_TRUE(drive(t, {&q}).all_finished);
      EXPECT_EQ(q.state.load(), Request::Done) << q.status.message();
    };
    constexpr size_t kBuf = 32 * 1024;
    void* mem = ::mmap(nullptr, kBuf, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(mem, MAP_FAILED);
    auto* buf = static_cast<std::byte*>(mem);
    const auto a = pattern(kBuf, 0, 1, 1);
    std::memcpy(buf, a.data(), kBuf);
    const UcxRegistrationStats s0 = ucxRegistrationStats(t);
    for (uint64_t off : {0u, 4096u, 8192u}) one(true, buf, kBuf, off);
    const UcxRegistrationStats s1 = ucxRegistrationStats(t);
    EXPECT_EQ(s1.maps - s0.maps, 1u) << "three puts from one buffer map it once";
    EXPECT_EQ(s1.hits - s0.hits, 2u);
    EXPECT_EQ(std::memcmp(region.data() + 8192, a.data(), kBuf), 0);
    one(true, buf, kBuf - 8, 0);  // another length: its own mapping
    one(false, buf, kBuf, 0);     // a get: another direction, its own mapping
    const UcxRegistrationStats s2 = ucxRegistrationStats(t);
    EXPECT_EQ(s2.maps - s1.maps, 2u);
    // The buffer goes; another is mapped at the same address with other bytes.
    ASSERT_EQ(::munmap(mem, kBuf), 0);
    void* again = ::mmap(mem, kBuf, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    ASSERT_EQ(again, mem) << "the address could not be mapped again";
    const auto b = pattern(kBuf, 0, 1, 2);
    std::memcpy(buf, b.data(), kBuf);
    one(true, buf, kBuf, 16384);
    const UcxRegistrationStats s3 = ucxRegistrationStats(t);
    EXPECT_EQ(s3.invalidated - s2.invalidated, 3u) << "the buffer's three mappings are dropped";
    EXPECT_EQ(s3.maps - s2.maps, 1u) << "the new buffer is mapped anew";
    EXPECT_EQ(s3.hits, s2.hits);
    EXPECT_EQ(std::memcmp(region.data() + 16384, b.data(), kBuf), 0) << "the put carried the old buffer's bytes";
    ASSERT_EQ(::munmap(mem, kBuf), 0);
    stop.store(true);
  });
  EXPECT_TRUE(region.guardsIntact());
}

void expectRefused(const Request& req, const std::vector<std::string_view>& parts, const char* what) {
  ASSERT_EQ(req.state.load(), Request::Failed) << what << ": not refused";
  EXPECT_EQ(req.status.code(), chorusInvalidArgument) << what << ": " << req.status.message();
  for (std::string_view part : parts)
    EXPECT_NE(req.status.message().find(part), std::string::npos)
        << what << ": the error does not say '" << part << "': " << req.status.message();
}

// Rank 1 owns regions; rank 0 tries every kind of bad access, small (inline)
// and large (through its remote key).  Each fails rank 0's request naming the
// problem, rank 1's memory (regions and guards) stays as it was, and both
// keep working.
TEST(UcxRmaPair, BadAccessesAreRefusedByTheTargetAndLeaveItsMemoryAlone) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  constexpr size_t kBytes = 64 * 1024;
  std::atomic<bool> stop{false};
  runRanks(2, [&](int me) {
    Transport& t = *ts[static_cast<size_t>(me)];
    Rma* rma = t.rma();
    if (me == 1) {
      Guarded rw(kBytes), ro(kBytes), wo(kBytes), gone(kBytes), reuse(kBytes);
      const std::vector<std::byte> ro_data = pattern(kBytes, 5, 5, 5);
      std::memcpy(ro.data(), ro_data.data(), kBytes);
      auto rw_id = rma->registerRegion(rw.data(), kBytes, Access::ReadWrite);
      auto ro_id = rma->registerRegion(ro.data(), kBytes, Access::Read);
      auto wo_id = rma->registerRegion(wo.data(), kBytes, Access::Write);
      auto gone_id = rma->registerRegion(gone.data(), kBytes, Access::ReadWrite);
      ASSERT_TRUE(rw_id.isOk() && ro_id.isOk() && wo_id.isOk() && gone_id.isOk());
      publishKey(store, "rw", me, *rma->packKey(*rw_id));
      publishKey(store, "ro", me, *rma->packKey(*ro_id));
      publishKey(store, "wo", me, *rma->packKey(*wo_id));
      publishKey(store, "gone", me, *rma->packKey(*gone_id));
      ASSERT_TRUE(rma->deregisterRegion(*gone_id).isOk());
      auto reuse_id = rma->registerRegion(reuse.data(), kBytes, Access::ReadWrite);
      ASSERT_TRUE(reuse_id.isOk());
      EXPECT_EQ(reuse_id->index, gone_id->index) << "the test wants the index reused";
      publishKey(store, "reuse", me, *rma->packKey(*reuse_id));
      serveUntil(t, stop);
      EXPECT_EQ(std::memcmp(ro.data(), ro_data.data(), kBytes), 0);
      for (Guarded* g : {&wo, &gone, &reuse})
        EXPECT_TRUE(std::all_of(g->data(), g->data() + kBytes, [](std::byte b) { return b == std::byte{0x5C}; }));
      std::vector<std::byte> expect_rw(kBytes, std::byte{0x5C});
      const std::vector<std::byte> part = pattern(50, 0, 1, 3), big = pattern(20000, 0, 1, 4);
      std::memcpy(expect_rw.data() + 100, part.data(), part.size());
      std::memcpy(expect_rw.data() + 30000, big.data(), big.size());
      EXPECT_EQ(std::memcmp(rw.data(), expect_rw.data(), kBytes), 0);
      for (Guarded* g : {&rw, &ro, &wo, &gone, &reuse}) EXPECT_TRUE(g->guardsIntact());
      int from = -1;
      uint64_t value = 0;
      auto note = rma->takeNotification(&from, &value);
      ASSERT_TRUE(note.isOk());
      EXPECT_TRUE(*note);
      EXPECT_EQ(value, 42u);
      return;
    }
    auto unpack = [&](const std::string& name) {
      auto k = rma->unpackKey(1, fetchKey(store, name, 1));
      EXPECT_TRUE(k.isOk()) << name << ": " << k.status().message();
      return k.isOk() ? *k : RemoteKey{};
    };
    const RemoteKey rw = unpack("rw"), ro = unpack("ro"), wo = unpack("wo"), gone = unpack("gone"),
                    reuse = unpack("reuse");
    std::vector<std::byte> buf = pattern(256 * 1024, 0, 1, 1);
    const std::vector<std::byte> buf_before = buf;
    struct Bad {
      const char* what;
      bool is_put;
      RemoteKey key;
      uint64_t offset;
      size_t bytes;
      std::vector<std::string_view> parts;
    };
    RemoteKey forged_len = rw;  // claims a larger region: the target's table knows better
    forged_len.bytes = 1 << 24;
    RemoteKey forged_region = rw;
    forged_region.region = 999;
    RemoteKey forged_gen = rw;
    forged_gen.generation ^= 0x10;
    RemoteKey forged_ro = ro;
    forged_ro.access = Access::ReadWrite;
    const std::vector<Bad> bads = {
        {"offset at the end", true, rw, kBytes, 1, {"out of bounds", "offset 65536", "length 1", "65536 bytes"}},
        {"crossing the end", true, rw, kBytes - 100, 200, {"out of bounds"}},
        {"a large put crossing the end", true, rw, 0, 200 * 1024, {"out of bounds", "length 204800"}},
        {"a large get crossing the end", false, rw, kBytes - 8000, 16000, {"out of bounds"}},
        {"a get past the end", false, rw, uint64_t{1} << 63, 8, {"out of bounds"}},
        {"offset + length overflow", true, rw, UINT64_MAX - 2, 16, {"overflows"}},
        {"put to a read-only region", true, ro, 0, 16, {"read access only", "write access"}},
        {"large put to a read-only region", true, forged_ro, 0, 64 * 1024, {"read access only"}},
        {"get from a write-only region", false, wo, 0, 16, {"write access only"}},
        {"large get from a write-only region", false, wo, 0, kBytes, {"write access only"}},
        {"a deregistered region", true, gone, 0, 16, {"deregistered", "stale"}},
        {"a large put to a deregistered region", true, gone, 0, 10000, {"deregistered"}},
        {"a forged length", true, forged_len, kBytes + 8192, 16, {"out of bounds", "65536 bytes"}},
        {"a large put with a forged length", true, forged_len, kBytes, 32768, {"out of bounds"}},
        {"a forged region", true, forged_region, 0, 16, {"no region 999"}},
        {"a forged generation", false, forged_gen, 0, 16, {"deregistered"}},
    };
    for (const Bad& b : bads) {
      Request req;
      const Status posted = b.is_put ? rma->put(1, buf.data(), b.bytes, b.key, b.offset, &req)
                                     : rma->get(1, buf.data(), b.bytes, b.key, b.offset, &req);
      ASSERT_TRUE(posted.isOk()) << b.what << ": " << posted.message();
      ASSERT_TRUE(drive(t, {&req}).all_finished) << b.what;
      expectRefused(req, b.parts, b.what);
      EXPECT_NE(req.status.message().find("rank 1"), std::string::npos) << req.status.message();
      EXPECT_NE(req.status.message().find(fmt::format("region {}", b.key.region)), std::string::npos)
          << req.status.message();
    }
    EXPECT_TRUE(buf == buf_before) << "a refused get wrote into its buffer";
    EXPECT_EQ(reuse.region, gone.region);
    {
      Request req;
      EXPECT_EQ(rma->put(0, buf.data(), 8, rw, 0, &req).code(), chorusInvalidArgument) << "to itself";
      Request req2;
      EXPECT_EQ(rma->put(1, nullptr, 8, rw, 0, &req2).code(), chorusInvalidArgument) << "null buffer";
      std::vector<std::byte> blob = fetchKey(store, "rw", 1);
      blob[20] ^= std::byte{1};
      EXPECT_FALSE(rma->unpackKey(1, blob).isOk()) << "a garbled key blob was accepted";
    }
    // Still working: a small and a large put, a get, a notification, a message.
    const std::vector<std::byte> part = pattern(50, 0, 1, 3), big = pattern(20000, 0, 1, 4);
    std::vector<std::byte> back(kBytes);
    std::deque<Request> reqs(5);
    ASSERT_TRUE(rma->put(1, part.data(), part.size(), rw, 100, &reqs[0]).isOk());
    ASSERT_TRUE(rma->put(1, big.data(), big.size(), rw, 30000, &reqs[1]).isOk());
    ASSERT_TRUE(rma->get(1, back.data(), kBytes, ro, 0, &reqs[2]).isOk());
    ASSERT_TRUE(rma->notify(1, 42, &reqs[3]).isOk());
    std::vector<std::byte> msg = pattern(100, 0, 1, 9);
    ASSERT_TRUE(t.postSend(1, msg.data(), msg.size(), &reqs[4]).isOk());
    ASSERT_TRUE(drive(t, pointers(reqs)).all_finished);
    for (Request& q : reqs) EXPECT_EQ(q.state.load(), Request::Done) << q.status.message();
    EXPECT_TRUE(back == pattern(kBytes, 5, 5, 5));
    stop.store(true);
  });
  // The message rank 0 sent at the end.
  std::vector<std::byte> msg(100);
  Request recv;
  ASSERT_TRUE(ts[1]->postRecv(0, RecvTarget{msg.data(), msg.size()}, &recv).isOk());
  ASSERT_TRUE(drive(*ts[1], {&recv}).all_finished);
  EXPECT_TRUE(msg == pattern(100, 0, 1, 9));
}

// A target asleep in wait() wakes for an incoming notification, with no
// receive posted.
TEST(UcxRmaPair, AWaitingTargetWakesForOneSidedTraffic) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  std::atomic<bool> stop{false};
  runRanks(2, [&](int me) {
    Transport& t = *ts[static_cast<size_t>(me)];
    if (me == 1) {
      for (int i = 0; i < 20; ++i) ASSERT_TRUE(t.poll().isOk());
      ASSERT_TRUE(store.set("rma/asleep", std::vector<std::byte>(1)).isOk());
      const auto start = Clock::now();
      int from = -1;
      uint64_t value = 0;
      while (true) {
        auto r = t.poll();
        ASSERT_TRUE(r.isOk()) << r.status().message();
        if (*t.rma()->takeNotification(&from, &value)) break;
        ASSERT_LT(Clock::now() - start, 20s);
        t.wait(10s);
      }
      EXPECT_LT(Clock::now() - start, 5s) << "the wait did not end for the notification";
      EXPECT_EQ(value, 7u);
      stop.store(true);
      return;
    }
    ASSERT_TRUE(store.get("rma/asleep", 20s).isOk());
    std::this_thread::sleep_for(100ms);
    Request req;
    ASSERT_TRUE(t.rma()->notify(1, 7, &req).isOk());
    ASSERT_TRUE(drive(t, {&req}).all_finished);
    EXPECT_EQ(req.state.load(), Request::Done) << req.status.message();
    serveUntil(t, stop);
  });
}

// An aborted transport fails the one-sided operations in flight (a large put
// the target never serves) and later posts.
TEST(UcxRmaPair, AbortFailsOneSidedOperations) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  Guarded region(kMiB);
  auto id = ts[1]->rma()->registerRegion(region.data(), region.n, Access::ReadWrite);
  ASSERT_TRUE(id.isOk());
  auto key = ts[0]->rma()->unpackKey(1, *ts[1]->rma()->packKey(*id));
  ASSERT_TRUE(key.isOk());
  std::vector<std::byte> src(kMiB);
  Request put, note;
  ASSERT_TRUE(ts[0]->rma()->put(1, src.data(), src.size(), *key, 0, &put).isOk());
  ASSERT_TRUE(ts[0]->rma()->notify(1, 1, &note).isOk());
  ASSERT_TRUE(ts[0]->poll().isOk());
  ts[0]->abort(makeError(chorusRemoteError, "test abort"));
  EXPECT_FALSE(ts[0]->poll().isOk());
  for (Request* q : {&put, &note}) {
    EXPECT_EQ(q->state.load(), Request::Failed);
    EXPECT_NE(q->status.message().find("test abort"), std::string::npos) << q->status.message();
  }
  Request later;
  EXPECT_FALSE(ts[0]->rma()->notify(1, 2, &later).isOk());
  EXPECT_EQ(later.state.load(), Request::Failed);
  int from = -1;
  uint64_t value = 0;
  EXPECT_FALSE(ts[0]->rma()->takeNotification(&from, &value).isOk());
  // The target learns of the abort and keeps its memory.
  Request peer;
  std::vector<std::byte> in(8);
  ASSERT_TRUE(ts[1]->postRecv(0, RecvTarget{in.data(), in.size()}, &peer).isOk());
  EXPECT_TRUE(drive(*ts[1], {&peer}, 10s).all_finished);
  EXPECT_NE(peer.status.message().find("test abort"), std::string::npos) << peer.status.message();
  EXPECT_TRUE(region.guardsIntact());
}

// ---------------------------------------------------------------------------
// The communicator over ucx alone: every collective x dtype x op x in place
// against the independent reference (tests/support/collective_check), as
// the loop transport's matrix runs it (transport_registry_test).

std::string runAll(chorusComm_t comm, const std::vector<testing::Case>& cases) {
  for (const testing::Case& c : cases)
    if (std::string err = testing::runCase(comm, c); !err.empty()) return err;
  return "";
}

Config ucxConfig() {
  Config cfg;
  cfg.net.transport = "ucx";
  cfg.timeout = std::chrono::milliseconds(60000);
  return cfg;
}

class UcxMatrix : public ::testing::TestWithParam<int> {};
TEST_P(UcxMatrix, EveryCollectiveMatchesTheReference) {
  const int n = GetParam();
  const Config cfg = ucxConfig();
  auto cases = testing::standardCases(n, {0, 1, 7}, /*all_dtypes=*/true);
  for (const testing::Case& c : testing::standardCases(n, {100003}, /*all_dtypes=*/false)) cases.push_back(c);
  auto msgs = testing::runRanks(n, cfg, [&](int r, chorusComm_t c) -> std::string {
    const std::vector<std::string> used = api::commTransports(c);
    if (n > 1 && used != std::vector<std::string>{"ucx"})
      return fmt::format("rank {}: transports {}, not ucx alone", r, fmt::join(used, ","));
    if (n > 1 && api::commRouteKey(c) != "ucx") return fmt::format("rank {}: route key {}", r, api::commRouteKey(c));
    return runAll(c, cases);
  });
  EXPECT_EQ(testing::failures(msgs), "");
}
INSTANTIATE_TEST_SUITE_P(Ranks, UcxMatrix, ::testing::Values(1, 2, 3, 5));

// Eight ranks (four per core here: every wait sleeps), small counts, every
// allreduce algorithm that takes the shape.
TEST(UcxCollectives, EightRanksSmallCountsAndEveryAllReduceAlgorithm) {
  const Config cfg = ucxConfig();
  auto cases = testing::standardCases(8, {0, 7}, /*all_dtypes=*/false);
  auto msgs = testing::runRanks(8, cfg, [&](int, chorusComm_t c) { return runAll(c, cases); });
  EXPECT_EQ(testing::failures(msgs), "");
  const plan::Registry reg = plan::Registry::builtin();
  std::vector<testing::Case> ar;
  for (const testing::Case& c : testing::standardCases(4, {1, 4099, 300007}, /*all_dtypes=*/false))
    if (c.coll == testing::Coll::AllReduce) ar.push_back(c);
  for (const plan::Algorithm* a : reg.forCollective(plan::Collective::AllReduce)) {
    if (a->compressed() || a->exact() || a->name() == "hierarchical") continue;  // need their own shapes / hosts
    Config c4 = cfg;
    c4.tune.algo_spec = fmt::format("allreduce:{}", a->name());
    auto m = testing::runRanks(4, c4, [&](int, chorusComm_t c) { return runAll(c, ar); });
    EXPECT_EQ(testing::failures(m), "") << a->name();
  }
}

// Ranks that disagree on the count: chorusMismatch on every rank, not
// corruption or a hang.
TEST(UcxCollectives, MismatchedCountsAreNamedNotCorrupted) {
  Config cfg = ucxConfig();
  cfg.timeout = std::chrono::milliseconds(20000);
  auto msgs = testing::runRanks(2, cfg, [&](int r, chorusComm_t c) -> std::string {
    std::vector<float> x(r == 0 ? 8 : 5000, 1.0f);
    const chorusResult_t res = chorusAllReduce(x.data(), x.data(), x.size(), chorusFloat32, chorusSum, c, nullptr);
    if (res != chorusMismatch)
      return fmt::format("rank {}: got {} ({})", r, static_cast<int>(res), chorusGetLastError(c));
    return "";
  });
  EXPECT_EQ(testing::failures(msgs), "");
}

// The largest size UCP sends as one eager short message on the endpoint
// ("tag_send: 0..<egr/short>..N..": N), 0 when the text does not say.
uint64_t eagerShortLimit(const std::string& info) {
  const std::string key = "tag_send: 0..<egr/short>..";
  const size_t at = info.find(key);
  if (at == std::string::npos) return 0;
  return std::strtoull(info.c_str() + at + key.size(), nullptr, 10);
}

// The transport's default for UCX's tcp lane (1 MiB receive segments) goes
// into UCP's configuration unless the user's UCX_TCP_RX_SEG_SIZE is set, and
// the send segment, UCP's eager limit on tcp, stays UCX's (8185 bytes).
TEST(UcxPair, TheTcpLaneGetsLargeReceiveSegmentsUnlessTheUserSetsThem) {
  auto pair = [](std::string& changes, std::string& info, std::vector<std::string> user_set = {}) {
    bootstrap::MemoryStore store;
    Ranks ts(2);
    runRanks(2, [&](int r) {
      UcxSetup s = setupFor(r, 2);
      s.tls = "tcp";
      s.heartbeat_ms = 0;
      s.user_set = user_set;
      auto t = createUcxTransport(s, store);
      ASSERT_TRUE(t.isOk()) << "rank " << r << ": " << t.status().message();
      ts[static_cast<size_t>(r)] = std::move(*t);
    });
    ASSERT_TRUE(ts[0] && ts[1]);
    changes = ucxConfigChanges(*ts[0]);
    info = ucxEndpointInfo(*ts[0], 1);
    EXPECT_EQ(ucxEndpointInfo(*ts[0], 0), "");  // not a peer
  };
  const char* was = std::getenv("UCX_TCP_RX_SEG_SIZE");
  const std::string saved = was != nullptr ? was : "";
  ::unsetenv("UCX_TCP_RX_SEG_SIZE");
  std::string ours, info;
  pair(ours, info);
  EXPECT_EQ(ours, "RX_SEG_SIZE=1M");
  if (std::getenv("UCX_TCP_TX_SEG_SIZE") == nullptr) {
    EXPECT_EQ(eagerShortLimit(info), 8185u) << info;
  }
  ::setenv("UCX_TCP_RX_SEG_SIZE", "64K", 1);
  std::string users;
  pair(users, info, {"UCX_TCP_RX_SEG_SIZE"});  // as Config::ucx.user_set says it
  if (was != nullptr)
    ::setenv("UCX_TCP_RX_SEG_SIZE", saved.c_str(), 1);
  else
    ::unsetenv("UCX_TCP_RX_SEG_SIZE");
  EXPECT_EQ(users, "");
}

// CHORUS_UCX_TLS reaches UCX: a list UCX has works, a name it has not fails
// the communicator's setup naming the knob.
TEST(UcxCollectives, TheTlsKnobReachesUcx) {
  Config cfg = ucxConfig();
  cfg.ucx.tls = "tcp";
  auto cases = testing::standardCases(2, {7, 100003}, /*all_dtypes=*/false);
  auto ok = testing::runRanks(2, cfg, [&](int, chorusComm_t c) { return runAll(c, cases); });
  EXPECT_EQ(testing::failures(ok), "");
  cfg.ucx.tls = "no_such_transport";
  cfg.timeout = std::chrono::milliseconds(10000);
  auto bad = testing::runRanks(2, cfg, [&](int, chorusComm_t) { return std::string(); });
  const std::string text = testing::failures(bad);
  EXPECT_NE(text.find("CHORUS_UCX_TLS='no_such_transport'"), std::string::npos) << text;
}

#endif  // CHORUS_HAVE_UCX

}  // namespace
}  // namespace chorus::transport
