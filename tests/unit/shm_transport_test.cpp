// Shared-memory transport specifics: segment hygiene, real processes (fork),
// a killed peer, and which data path carried the bytes.  The behaviour every
// transport shares is in transport_test.cpp.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <thread>

#include "bootstrap/memory_store.hpp"
#include "kernels/reduce.hpp"
#include "transport/shm/shm.hpp"
#include "transport/shm/shm_detail.hpp"

namespace chorus::transport {
namespace {

using namespace std::chrono_literals;

// A Store in MAP_SHARED anonymous memory, so a parent and its forked children
// share it: a small table under a process-shared mutex and condition variable.
class SharedStore final : public bootstrap::Store {
 public:
  SharedStore() {
    void* p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();  // test setup
    s_ = new (p) Shared{};
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&s_->mu, &ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s_->cv, &ca);
  }
  ~SharedStore() override { munmap(s_, sizeof(Shared)); }

  Status set(std::string_view key, std::span<const std::byte> value) override {
    pthread_mutex_lock(&s_->mu);
    Status st = setLocked(key, value);
    pthread_mutex_unlock(&s_->mu);
    return st;
  }
  Result<bootstrap::Bytes> get(std::string_view key, std::chrono::milliseconds timeout) override {
    timespec deadline{};
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeout.count() / 1000 + 1;
    pthread_mutex_lock(&s_->mu);
    Entry* e = nullptr;
    while ((e = find(key)) == nullptr)
      if (pthread_cond_timedwait(&s_->cv, &s_->mu, &deadline) == ETIMEDOUT) break;
    bootstrap::Bytes out;
    if (e != nullptr) out.assign(e->value, e->value + e->len);
    pthread_mutex_unlock(&s_->mu);
    if (e == nullptr) return makeError(chorusTimeout, "key {} missing", key);
    return out;
  }
  Result<int64_t> add(std::string_view key, int64_t delta) override {
    pthread_mutex_lock(&s_->mu);
    Entry* e = find(key);
    int64_t v = delta;
    if (e != nullptr) v += std::stoll(std::string(reinterpret_cast<char*>(e->value), e->len));
    Status st = setLocked(key, bootstrap::toBytes(std::to_string(v)));
    pthread_mutex_unlock(&s_->mu);
    if (!st.isOk()) return st;
    return v;
  }

 private:
  static constexpr int kEntries = 32;
  struct Entry {
    char key[128];
    uint32_t len;
    std::byte value[512];
  };
  struct Shared {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
    Entry e[kEntries];
  };
  Status setLocked(std::string_view key, std::span<const std::byte> value) {
    if (key.size() >= sizeof(Entry::key) || value.size() > sizeof(Entry::value)) return invalidArgument("too big");
    Entry* e = find(key);
    if (e == nullptr && s_->n < kEntries) e = &s_->e[s_->n++];
    if (e == nullptr) return invalidArgument("store full");
    std::memcpy(e->key, key.data(), key.size());
    e->key[key.size()] = '\0';
    e->len = static_cast<uint32_t>(value.size());
    std::memcpy(e->value, value.data(), value.size());
    pthread_cond_broadcast(&s_->cv);
    return {};
  }
  Entry* find(std::string_view key) {
    for (int i = 0; i < s_->n; ++i)
      if (key == s_->e[i].key) return &s_->e[i];
    return nullptr;
  }
  Shared* s_ = nullptr;
};

std::string uniquePrefix() {
  static std::atomic<int> counter{0};
  return fmt::format("/chorus-st-{}-{}", getpid(), counter.fetch_add(1));
}

ShmSetup setupFor(int rank, std::vector<int> peers, const std::string& prefix, bool cma = true) {
  ShmSetup s;
  s.rank = rank;
  s.peers = std::move(peers);
  s.segment_prefix = prefix;
  s.allow_cma = cma;
  s.timeout = 20s;
  return s;
}

// Drives t until req finished or `limit`; returns the last poll error, if any.
Status driveOne(Transport& t, Request& req, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  Status last;
  while (!req.finished() && std::chrono::steady_clock::now() < deadline) {
    Result<bool> r = t.poll();
    if (!r.isOk())
      last = r.status();
    else if (!*r)
      t.wait(10ms);
  }
  return last;
}

bool shmExists(const std::string& name) {
  struct stat st {};
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

TEST(ShmTransport, SegmentIsPrivateAndGoneAfterSetup) {
  bootstrap::MemoryStore store;
  const std::string prefix = uniquePrefix();
  std::optional<Result<std::unique_ptr<Transport>>> t0;
  std::thread rank0([&] { t0.emplace(createShmTransport(setupFor(0, {1}, prefix), store)); });
  // Rank 0 publishes its record once its segment exists, then waits for rank 1.
  ASSERT_TRUE(store.get("shm/0", 20s).isOk());
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm" + prefix + "-r0").c_str(), &st), 0) << "segment not found under /dev/shm";
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto t1 = createShmTransport(setupFor(1, {0}, prefix), store);
  rank0.join();
  ASSERT_TRUE(t1.isOk()) << t1.status().message();
  ASSERT_TRUE(t0->isOk()) << t0->status().message();
  EXPECT_FALSE(shmExists(prefix + "-r0"));
  EXPECT_FALSE(shmExists(prefix + "-r1"));
}

TEST(ShmTransport, StaleSegmentFromKilledRunIsReplaced) {
  const std::string prefix = uniquePrefix();
  int fd = shm_open((prefix + "-r0").c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 100), 0);
  close(fd);
  bootstrap::MemoryStore store;
  auto t = createShmTransport(setupFor(0, {}, prefix), store);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_FALSE(shmExists(prefix + "-r0"));
}

TEST(ShmTransport, BadSetupIsRejected) {
  bootstrap::MemoryStore store;
  ShmSetup s = setupFor(0, {1, 1}, uniquePrefix());
  EXPECT_EQ(createShmTransport(s, store).status().code(), chorusInvalidArgument);
  s = setupFor(0, {0}, uniquePrefix());
  EXPECT_EQ(createShmTransport(s, store).status().code(), chorusInvalidArgument);
  s = setupFor(0, {}, uniquePrefix());
  s.ring_bytes = 5000;
  EXPECT_EQ(createShmTransport(s, store).status().code(), chorusInvalidArgument);
}

TEST(ShmTransport, RingAndCmaPathsAreBothUsed) {
  for (bool cma : {true, false}) {
    SCOPED_TRACE(cma ? "CMA allowed" : "CMA off");
    bootstrap::MemoryStore store;
    const std::string prefix = uniquePrefix();
    std::optional<Result<std::unique_ptr<Transport>>> r1;
    std::thread th([&] { r1.emplace(createShmTransport(setupFor(1, {0}, prefix, cma), store)); });
    auto r0 = createShmTransport(setupFor(0, {1}, prefix, cma), store);
    th.join();
    ASSERT_TRUE(r0.isOk() && r1->isOk());
    Transport& a = *r0.value();
    Transport& b = *r1->value();
    std::vector<std::byte> small(8, std::byte{1}), big(1 << 20, std::byte{2}), rs(8), rb(1 << 20);
    Request s1, s2, q1, q2;
    ASSERT_TRUE(a.postSend(1, small.data(), small.size(), &s1).isOk());
    ASSERT_TRUE(a.postSend(1, big.data(), big.size(), &s2).isOk());
    ASSERT_TRUE(b.postRecv(0, RecvTarget{rs.data(), rs.size()}, &q1).isOk());
    ASSERT_TRUE(b.postRecv(0, RecvTarget{rb.data(), rb.size()}, &q2).isOk());
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (!(s1.finished() && s2.finished() && q1.finished() && q2.finished()) &&
           std::chrono::steady_clock::now() < deadline) {
      ASSERT_TRUE(a.poll().isOk());
      ASSERT_TRUE(b.poll().isOk());
    }
    ASSERT_EQ(q2.state.load(), Request::Done);
    EXPECT_EQ(rb, big);
    auto sa = shm_detail::shmStats(a), sb = shm_detail::shmStats(b);
    ASSERT_TRUE(sa && sb);
    EXPECT_GE(sa->inline_sends, 1u);
    EXPECT_GE(sb->inline_recvs, 1u);
    EXPECT_EQ(sa->cma_sends, cma ? 1u : 0u);
    EXPECT_EQ(sb->cma_recvs, cma ? 1u : 0u);
    EXPECT_EQ(sa->inline_sends, cma ? 1u : 2u);
  }
}

// Runs `child` in a forked process (exit code = its return value) and returns its pid.
template <typename F>
pid_t forkChild(F&& child) {
  pid_t pid = fork();
  if (pid == 0) {
    alarm(60);  // never outlive a broken test
    _exit(child());
  }
  return pid;
}

int waitExit(pid_t pid) {
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

TEST(ShmTransport, KilledPeerFailsPendingRequestsPromptly) {
  for (bool pending_send : {false, true}) {
    SCOPED_TRACE(pending_send ? "pending CMA send" : "pending receive");
    SharedStore store;
    const std::string prefix = uniquePrefix();
    pid_t child = forkChild([&] {
      auto t = createShmTransport(setupFor(1, {0}, prefix), store);
      if (!t.isOk()) return 2;
      while (true) pause();  // until killed
    });
    ASSERT_GT(child, 0);
    auto t = createShmTransport(setupFor(0, {1}, prefix), store);
    ASSERT_TRUE(t.isOk()) << t.status().message();
    // Both names are gone once any rank passed setup, whatever happens to the others.
    EXPECT_FALSE(shmExists(prefix + "-r0"));
    EXPECT_FALSE(shmExists(prefix + "-r1"));
    std::vector<std::byte> buf(1 << 20);
    Request req;
    if (pending_send)
      ASSERT_TRUE(t.value()->postSend(1, buf.data(), buf.size(), &req).isOk());  // waits for the child's CMA ack
    else
      ASSERT_TRUE(t.value()->postRecv(1, RecvTarget{buf.data(), 64}, &req).isOk());
    ASSERT_EQ(kill(child, SIGKILL), 0);
    const auto t0 = std::chrono::steady_clock::now();
    Status polled = driveOne(*t.value(), req, 10s);
    const auto elapsed = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(waitExit(child), 128 + SIGKILL);
    ASSERT_EQ(req.state.load(), Request::Failed);
    EXPECT_EQ(req.status.code(), chorusRemoteError);
    EXPECT_NE(req.status.message().find("rank 1"), std::string::npos) << req.status.message();
    EXPECT_NE(req.status.message().find(std::to_string(child)), std::string::npos) << req.status.message();
    EXPECT_EQ(polled.code(), chorusRemoteError);
    EXPECT_LT(elapsed, 2s);
    // Later posts to the dead peer fail at once.
    Request later;
    EXPECT_EQ(t.value()->postRecv(1, RecvTarget{buf.data(), 8}, &later).code(), chorusRemoteError);
  }
}

// Two processes move bytes both ways through every path: small, ring-streamed,
// CMA copy and CMA/ring reduce.
TEST(ShmTransport, CrossProcessExchange) {
  const kernels::Reducer sum(chorusFloat32, kernels::BinOp::Sum);
  for (bool cma : {true, false}) {
    SCOPED_TRACE(cma ? "CMA allowed" : "CMA off");
    SharedStore store;
    const std::string prefix = uniquePrefix();
    const std::vector<size_t> sizes = {8, 4100, 300004, 16 << 20};  // multiples of 4 (floats)
    auto fill = [](std::vector<float>& v, float base) {
      for (size_t i = 0; i < v.size(); ++i) v[i] = base + static_cast<float>(i % 1024);
    };
    // The child receives each size (copy, then reduce) and echoes the copy back.
    pid_t child = forkChild([&]() -> int {
      auto t = createShmTransport(setupFor(1, {0}, prefix, cma), store);
      if (!t.isOk()) return 2;
      for (size_t bytes : sizes) {
        std::vector<float> got(bytes / 4), acc(bytes / 4), expect(bytes / 4);
        fill(acc, 1000.0f);
        Request r1, r2, s1;
        if (!t.value()->postRecv(0, RecvTarget{reinterpret_cast<std::byte*>(got.data()), bytes}, &r1).isOk()) return 3;
        if (!driveOne(*t.value(), r1, 20s).isOk() || r1.state.load() != Request::Done) return 4;
        RecvTarget rt{reinterpret_cast<std::byte*>(acc.data()), bytes, reinterpret_cast<std::byte*>(acc.data()), &sum};
        if (!t.value()->postRecv(0, rt, &r2).isOk()) return 5;
        if (!driveOne(*t.value(), r2, 20s).isOk() || r2.state.load() != Request::Done) return 6;
        for (size_t i = 0; i < got.size(); ++i)
          if (acc[i] != got[i] + 1000.0f + static_cast<float>(i % 1024)) return 7;
        if (!t.value()->postSend(0, got.data(), bytes, &s1).isOk()) return 8;
        if (!driveOne(*t.value(), s1, 20s).isOk() || s1.state.load() != Request::Done) return 9;
      }
      return 0;
    });
    ASSERT_GT(child, 0);
    auto t = createShmTransport(setupFor(0, {1}, prefix, cma), store);
    ASSERT_TRUE(t.isOk()) << t.status().message();
    for (size_t bytes : sizes) {
      std::vector<float> out(bytes / 4), back(bytes / 4);
      fill(out, 3.0f);
      Request s1, s2, r1;
      ASSERT_TRUE(t.value()->postSend(1, out.data(), bytes, &s1).isOk());
      ASSERT_TRUE(t.value()->postSend(1, out.data(), bytes, &s2).isOk());
      ASSERT_TRUE(t.value()->postRecv(1, RecvTarget{reinterpret_cast<std::byte*>(back.data()), bytes}, &r1).isOk());
      for (Request* q : {&s1, &s2, &r1}) {
        EXPECT_TRUE(driveOne(*t.value(), *q, 20s).isOk());
        ASSERT_EQ(q->state.load(), Request::Done) << bytes << " bytes: " << q->status.message();
      }
      EXPECT_TRUE(back == out) << bytes << " bytes echoed wrong";
    }
    EXPECT_EQ(waitExit(child), 0) << "the child's checks failed (exit code names the step)";
    auto st = shm_detail::shmStats(*t.value());
    ASSERT_TRUE(st.has_value());
    EXPECT_EQ(st->cma_sends > 0, cma);
    EXPECT_EQ(st->cma_recvs > 0, cma);
  }
}

// Whether process pid is asleep (state S in /proc/pid/stat), polled up to `limit`.
bool waitUntilAsleep(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    std::FILE* f = std::fopen(fmt::format("/proc/{}/stat", pid).c_str(), "r");
    if (f == nullptr) return false;
    char buf[512] = {};
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    const char* close = std::strrchr(buf, ')');  // the state follows the parenthesised name
    if (n > 0 && close != nullptr && close[1] == ' ' && close[2] == 'S') return true;
    std::this_thread::yield();
  }
  return false;
}

// The wait policy (SpinPolicy, shm_detail.hpp) on a made-up clock: a late
// yield puts the waits in contended mode for kContendedHold, where they spin
// a few times the recent spin-satisfied waits (within [10 us, spin]) and do
// not yield, until a peer rank shows up on our core; an oversubscribed
// transport never enters it.
TEST(ShmTransport, SpinPolicyShortensTheSpinAfterAYieldLostTheCore) {
  using shm_detail::SpinPolicy;
  const SpinPolicy::Clock::time_point t0{std::chrono::seconds(100)};
  const auto kStranger = [] { return false; };  // no peer rank yields on our CPU
  SpinPolicy p(50us, false);
  bool contended = true;
  int asked = 0;
  EXPECT_FALSE(p.yielded(t0, t0 + 5us, [&] { return ++asked, true; }));
  EXPECT_EQ(asked, 0) << "a prompt yield is no question of who ran";
  EXPECT_FALSE(p.yielded(t0, t0 + 2ms, [&] { return ++asked, true; })) << "a late yield that ran a peer rank";
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(p.budget(t0 + 3ms, &contended, [&] { return ++asked, true; }), 50us);
  EXPECT_FALSE(contended) << "handing the core to a peer rank is no contention";
  EXPECT_EQ(asked, 1) << "outside contended mode nobody asks where the peer ranks are";
  EXPECT_EQ(p.budget(t0, &contended, kStranger), 50us);
  EXPECT_FALSE(contended);
  EXPECT_FALSE(p.yielded(t0, t0 + 5us, kStranger)) << "a yield nobody took the core in";
  EXPECT_EQ(p.stolenYields(), 0u);
  EXPECT_TRUE(p.yielded(t0, t0 + 2ms, kStranger)) << "a yield that lost the core for 2 ms";
  EXPECT_EQ(p.stolenYields(), 1u);
  EXPECT_EQ(p.budget(t0 + 3ms, &contended, kStranger), 10us) << "no recent waits: the floor";
  EXPECT_TRUE(contended);
  for (int i = 0; i < 64; ++i) p.satisfied(8us);  // waits have been taking 8 us
  EXPECT_EQ(p.budget(t0 + 4ms, &contended, kStranger), 31us) << "four times the recent waits (the average is just under 8 us)";
  for (int i = 0; i < 64; ++i) p.satisfied(40us);
  EXPECT_EQ(p.budget(t0 + 5ms, &contended, kStranger), 50us) << "never above the configured spin";
  EXPECT_EQ(p.budget(t0 + 2ms + SpinPolicy::kContendedHold + 1us, &contended, kStranger), 50us);
  EXPECT_FALSE(contended) << "the mode ends kContendedHold after the last late yield";
  // Contended again; then a peer rank turns up on our core (the placement
  // changed under the mode): the mode ends at once, the spin and its yields
  // come back, and a later stranger starts it again.
  ASSERT_TRUE(p.yielded(t0 + 30ms, t0 + 32ms, kStranger));
  EXPECT_EQ(p.budget(t0 + 33ms, &contended, kStranger), 50us);  // the 40 us waits, times four, capped
  EXPECT_TRUE(contended);
  EXPECT_EQ(p.budget(t0 + 33ms, &contended, [] { return true; }), 50us);
  EXPECT_FALSE(contended) << "a peer rank on our core: no contended mode";
  EXPECT_EQ(p.budget(t0 + 33ms, &contended, kStranger), 50us);
  EXPECT_FALSE(contended) << "and it stays ended";
  ASSERT_TRUE(p.yielded(t0 + 40ms, t0 + 42ms, kStranger));
  EXPECT_EQ(p.stolenYields(), 3u);
  EXPECT_EQ(p.budget(t0 + 43ms, &contended, kStranger), 50us);
  EXPECT_TRUE(contended);
  SpinPolicy small(5us, false);
  ASSERT_TRUE(small.yielded(t0, t0 + 1ms, kStranger));
  EXPECT_EQ(small.budget(t0 + 1ms, &contended, kStranger), 5us) << "a spin set below the floor stays";
  SpinPolicy over(50us, true);
  EXPECT_FALSE(over.yielded(t0, t0 + 5ms, kStranger)) << "with more ranks than cores a long yield ran a peer rank";
  EXPECT_EQ(over.budget(t0 + 5ms, &contended, kStranger), 50us);
  EXPECT_FALSE(contended);
}

// Pins the calling process to one CPU; false when the kernel refuses.
bool pinTo(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return sched_setaffinity(0, sizeof one, &one) == 0;
}

// A child process that spins on `cpu` until killed (SIGKILL).
pid_t forkBusyOn(int cpu) {
  return forkChild([cpu]() -> int {
    if (!pinTo(cpu)) return 2;
    volatile uint64_t x = 0;
    for (;;) {
      const uint64_t v = x;
      x = v + 1;
    }
  });
}

// A busy process shares this rank's core while the peer (another core when
// there is one) answers every few milliseconds: every message arrives, and
// the waits notice that their yields lose the core to it.
TEST(ShmTransport, AWaitBesideABusyProcessOnItsCoreNoticesTheLostYields) {
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  // This rank and the busy process share the first CPU of the affinity set;
  // the peer takes the next one when there is one.
  int mine = -1, other = -1;
  for (int c = 0; c < CPU_SETSIZE && other < 0; ++c)
    if (CPU_ISSET(c, &before)) (mine < 0 ? mine : other) = c;
  ASSERT_GE(mine, 0);
  if (other < 0) other = mine;
  SharedStore store;
  const std::string prefix = uniquePrefix();
  constexpr int kMessages = 20;
  pid_t busy = forkBusyOn(mine);
  ASSERT_GT(busy, 0);
  pid_t peer = forkChild([&]() -> int {
    if (!pinTo(other)) return 2;
    auto t = createShmTransport(setupFor(1, {0}, prefix), store);
    if (!t.isOk()) return 3;
    for (int k = 0; k < kMessages; ++k) {
      std::this_thread::sleep_for(3ms);
      uint64_t v = 1000 + static_cast<uint64_t>(k);
      Request s;
      if (!t.value()->postSend(0, &v, sizeof v, &s).isOk() || !driveOne(*t.value(), s, 20s).isOk()) return 4;
    }
    return 0;
  });
  ASSERT_GT(peer, 0);
  // Set up before pinning: with one core in its affinity set the transport
  // would count itself oversubscribed, where long yields are the point.
  auto t = createShmTransport(setupFor(0, {1}, prefix), store);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  ASSERT_TRUE(pinTo(mine));
  int right = 0;
  for (int k = 0; k < kMessages; ++k) {
    uint64_t v = 0;
    Request r;
    ASSERT_TRUE(t.value()->postRecv(1, RecvTarget{reinterpret_cast<std::byte*>(&v), sizeof v}, &r).isOk());
    EXPECT_TRUE(driveOne(*t.value(), r, 20s).isOk()) << k;
    right += v == 1000 + static_cast<uint64_t>(k);
  }
  sched_setaffinity(0, sizeof before, &before);
  kill(busy, SIGKILL);
  waitpid(busy, nullptr, 0);
  EXPECT_EQ(waitExit(peer), 0);
  EXPECT_EQ(right, kMessages);
  auto st = shm_detail::shmStats(*t.value());
  ASSERT_TRUE(st.has_value());
  EXPECT_GE(st->stolen_yields, 1u) << "no yield was seen losing the core to the busy process";
  std::printf("[ info ] %d messages, %llu futex sleeps, %llu yields lost to the busy process\n", kMessages,
              static_cast<unsigned long long>(st->futex_waits), static_cast<unsigned long long>(st->stolen_yields));
}

// Two ranks of one job on one core (as the kernel starts them, before it
// spreads them): a wait's yield runs the peer rank, which may take a while
// (here it computes 300 us before it answers), and that is the hand-over the
// wait wants, not a stranger taking the core.  The late yields must not be
// counted as lost (contended mode would sleep on the futex and pay a
// wake-up per message).
TEST(ShmTransport, ALateYieldToAPeerRankOnTheSameCoreIsNotALostYield) {
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  int cpu = -1;
  for (int c = 0; c < CPU_SETSIZE && cpu < 0; ++c)
    if (CPU_ISSET(c, &before)) cpu = c;
  ASSERT_GE(cpu, 0);
  auto pin = [cpu] { return pinTo(cpu); };
  SharedStore store;
  const std::string prefix = uniquePrefix();
  constexpr int kRounds = 20;
  pid_t peer = forkChild([&]() -> int {
    auto t = createShmTransport(setupFor(1, {0}, prefix), store);
    if (!t.isOk()) return 3;
    if (!pin()) return 2;
    uint64_t v = 0;
    Request r;
    if (!t.value()->postRecv(0, RecvTarget{reinterpret_cast<std::byte*>(&v), sizeof v}, &r).isOk() ||
        !driveOne(*t.value(), r, 20s).isOk())
      return 4;
    for (int k = 0; k < kRounds; ++k) {
      const auto until = std::chrono::steady_clock::now() + 300us;
      while (std::chrono::steady_clock::now() < until) {
      }
      v = 1000 + static_cast<uint64_t>(k);
      Request s, a;
      if (!t.value()->postSend(0, &v, sizeof v, &s).isOk() || !driveOne(*t.value(), s, 20s).isOk()) return 5;
      if (!t.value()->postRecv(0, RecvTarget{reinterpret_cast<std::byte*>(&v), sizeof v}, &a).isOk() ||
          !driveOne(*t.value(), a, 20s).isOk())
        return 6;
    }
    return 0;
  });
  ASSERT_GT(peer, 0);
  // Set up before pinning, as the test above.
  auto t = createShmTransport(setupFor(0, {1}, prefix), store);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  ASSERT_TRUE(pin());
  std::this_thread::sleep_for(50ms);  // the peer's first wait yields here and says on which CPU
  uint64_t go = 1;
  Request g;
  ASSERT_TRUE(t.value()->postSend(1, &go, sizeof go, &g).isOk());
  ASSERT_TRUE(driveOne(*t.value(), g, 20s).isOk());
  int right = 0;
  for (int k = 0; k < kRounds; ++k) {
    uint64_t v = 0;
    Request r, a;
    ASSERT_TRUE(t.value()->postRecv(1, RecvTarget{reinterpret_cast<std::byte*>(&v), sizeof v}, &r).isOk());
    ASSERT_TRUE(driveOne(*t.value(), r, 20s).isOk()) << k;
    right += v == 1000 + static_cast<uint64_t>(k);
    ASSERT_TRUE(t.value()->postSend(1, &v, sizeof v, &a).isOk());
    ASSERT_TRUE(driveOne(*t.value(), a, 20s).isOk()) << k;
  }
  sched_setaffinity(0, sizeof before, &before);
  EXPECT_EQ(waitExit(peer), 0);
  EXPECT_EQ(right, kRounds);
  auto st = shm_detail::shmStats(*t.value());
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->stolen_yields, 0u) << "yields that ran the peer rank were counted as lost to a stranger";
  std::printf("[ info ] %d rounds, %llu futex sleeps, %llu yields counted as lost\n", kRounds,
              static_cast<unsigned long long>(st->futex_waits), static_cast<unsigned long long>(st->stolen_yields));
}

// Where a rank that shares its core with a peer rank moves (spreadTarget):
// only the higher-numbered of the two, to an allowed CPU no peer was seen on.
TEST(ShmTransport, SpreadTargetMovesTheHigherRankToAFreeAllowedCpu) {
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int c = 0; c < 4; ++c) CPU_SET(c, &all);
  using shm_detail::spreadTarget;
  EXPECT_EQ(spreadTarget(0, 1, {{0, 0}}, all), 1) << "rank 1 beside rank 0 on CPU 0 moves to CPU 1";
  EXPECT_EQ(spreadTarget(0, 0, {{1, 0}}, all), -1) << "the lower rank stays";
  EXPECT_EQ(spreadTarget(0, 2, {{0, 0}, {1, 1}}, all), 2) << "CPU 1 is taken by rank 1";
  EXPECT_EQ(spreadTarget(0, 1, {{0, 2}}, all), -1) << "no peer on this CPU";
  EXPECT_EQ(spreadTarget(0, 1, {{0, -1}}, all), -1) << "a peer not seen yet";
  EXPECT_EQ(spreadTarget(-1, 1, {{0, 0}}, all), -1);
  cpu_set_t two;
  CPU_ZERO(&two);
  CPU_SET(0, &two);
  CPU_SET(3, &two);
  EXPECT_EQ(spreadTarget(0, 1, {{0, 0}}, two), 3) << "only CPUs of the mask";
  EXPECT_EQ(spreadTarget(0, 2, {{0, 0}, {1, 3}}, two), -1) << "every allowed CPU taken";
}

// Two ranks that start on one core (as a launcher's children do) with a
// mask of several, a busy process on the next CPU: the kernel leaves the
// ranks together for tens of milliseconds (2 CPUs, docs/performance.md), but
// the waits notice that their yields run the peer rank and the higher rank
// moves, so the ranks end on different CPUs.
TEST(ShmTransport, TwoRanksStartedOnOneCoreEndOnTwo) {
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  if (CPU_COUNT(&before) < 2) GTEST_SKIP() << "needs two CPUs in the affinity mask";
  int first = -1, second = -1;
  for (int c = 0; c < CPU_SETSIZE && second < 0; ++c)
    if (CPU_ISSET(c, &before)) (first < 0 ? first : second) = c;
  struct Seen {
    std::atomic<int> cpu{-1};
    std::atomic<uint64_t> spreads{0};
  };
  void* mem = mmap(nullptr, sizeof(Seen), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* seen = new (mem) Seen;
  SharedStore store;
  const std::string prefix = uniquePrefix();
  constexpr int kRounds = 2000;
  pid_t busy = forkBusyOn(second);
  ASSERT_GT(busy, 0);
  // Onto the first CPU, the whole mask kept: where the kernel put them.
  auto gather = [&] { return pinTo(first) && sched_setaffinity(0, sizeof before, &before) == 0; };
  pid_t peer = forkChild([&]() -> int {
    auto t = createShmTransport(setupFor(1, {0}, prefix), store);
    if (!t.isOk()) return 3;
    if (!gather()) return 2;
    for (int k = 0; k < kRounds; ++k) {
      uint64_t v = 0;
      Request r, s;
      if (!t.value()->postRecv(0, RecvTarget{reinterpret_cast<std::byte*>(&v), sizeof v}, &r).isOk() ||
          !driveOne(*t.value(), r, 20s).isOk() || !t.value()->postSend(0, &v, sizeof v, &s).isOk() ||
          !driveOne(*t.value(), s, 20s).isOk())
        return 4;
    }
    seen->cpu = sched_getcpu();
    seen->spreads = shm_detail::shmStats(*t.value())->spreads;
    return 0;
  });
  ASSERT_GT(peer, 0);
  auto t = createShmTransport(setupFor(0, {1}, prefix), store);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  ASSERT_TRUE(gather());
  int right = 0;
  for (int k = 0; k < kRounds; ++k) {
    uint64_t v = static_cast<uint64_t>(k), w = 0;
    Request s, r;
    ASSERT_TRUE(t.value()->postSend(1, &v, sizeof v, &s).isOk());
    ASSERT_TRUE(driveOne(*t.value(), s, 20s).isOk()) << k;
    ASSERT_TRUE(t.value()->postRecv(1, RecvTarget{reinterpret_cast<std::byte*>(&w), sizeof w}, &r).isOk());
    ASSERT_TRUE(driveOne(*t.value(), r, 20s).isOk()) << k;
    right += w == v;
  }
  const int mine = sched_getcpu();
  sched_setaffinity(0, sizeof before, &before);
  EXPECT_EQ(waitExit(peer), 0);
  kill(busy, SIGKILL);
  waitpid(busy, nullptr, 0);
  EXPECT_EQ(right, kRounds);
  // Rank 1 moved, or the kernel parted them: under other load it may part
  // them first, or put them back together after a move (seen under TSan
  // with the other tests running).  Without spreading they end on one CPU,
  // never moved, in 3 of 4 runs here.
  EXPECT_TRUE(seen->spreads.load() >= 1 || seen->cpu.load() != mine)
      << "the ranks still share CPU " << mine << " and rank 1 never moved";
  EXPECT_EQ(shm_detail::shmStats(*t.value())->spreads, 0u) << "rank 0, the lower, moved";
  std::printf("[ info ] rank 1 moved %llu time(s); the ranks ended on CPUs %d and %d\n",
              static_cast<unsigned long long>(seen->spreads.load()), mine, seen->cpu.load());
  munmap(mem, sizeof(Seen));
}

// The board (transport.hpp): two processes exchange 3000 calls through their
// slots, each checking every byte of the other's payload for that call.  Every
// 500th call the child publishes only once the parent is asleep (its await
// went through the spinning phases into the futex), so the parent must be
// woken by the child's publish and settle.
TEST(ShmTransport, BoardExchangesEveryCallAcrossProcesses) {
  SharedStore store;
  const std::string prefix = uniquePrefix();
  constexpr uint64_t kCalls = 3000;
  auto payload = [](int rank, uint64_t k, size_t i) { return static_cast<uint8_t>(rank * 131 + k * 7 + i * 13); };
  auto sizeOf = [](uint64_t k) { return size_t{1} + (k * 977) % kBoardSlotBytes; };
  // Runs the calls on t as `rank`; 0 or the failing call's number.
  int slept = 0;  // late publishes that found the parent asleep (child)
  auto run = [&](Board* b, int rank, bool late) -> uint64_t {
    if (b == nullptr) return ~uint64_t{0};
    for (uint64_t k = 1; k <= kCalls; ++k) {
      if (late && k % 500 == 0 && waitUntilAsleep(getppid(), 10s)) ++slept;
      std::byte* mine = b->slot(k);
      for (size_t i = 0; i < sizeOf(k); ++i) mine[i] = std::byte{payload(rank, k, i)};
      b->publish(k, CallSignature{});
      auto got = b->await(1 - rank, k, 20s);
      if (!got.isOk()) return k;
      for (size_t i = 0; i < sizeOf(k); ++i)
        if ((*got)[i] != std::byte{payload(1 - rank, k, i)}) return k;
      b->settle();
    }
    return 0;
  };
  pid_t child = forkChild([&]() -> int {
    Board* board = nullptr;
    auto t = createShmTransport(setupFor(1, {0}, prefix), store, &board);
    if (!t.isOk()) return 2;
    if (run(board, 1, true) != 0) return 3;
    return slept == static_cast<int>(kCalls / 500) ? 0 : 4;
  });
  ASSERT_GT(child, 0);
  Board* board = nullptr;
  auto t = createShmTransport(setupFor(0, {1}, prefix), store, &board);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  EXPECT_EQ(run(board, 0, false), 0u) << "the call whose payload was wrong or whose await failed";
  EXPECT_EQ(waitExit(child), 0) << "3: the child's payload check failed; 4: the parent was not seen asleep";
  auto st = shm_detail::shmStats(*t.value());
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->board_calls, kCalls);
  EXPECT_GE(st->futex_waits, kCalls / 500) << "the parent's waits for the late publishes did not sleep";
}

// An await that cannot be satisfied ends: by the timeout (chorusTimeout naming
// the peer), by the peer's death (chorusRemoteError naming its pid, promptly),
// and by this transport's abort.
TEST(ShmTransport, BoardAwaitEndsOnTimeoutDeathAndAbort) {
  SharedStore store;
  const std::string prefix = uniquePrefix();
  pid_t child = forkChild([&] {
    auto t = createShmTransport(setupFor(1, {0}, prefix), store);
    if (!t.isOk()) return 2;
    while (true) pause();  // never publishes; until killed
  });
  ASSERT_GT(child, 0);
  Board* b = nullptr;
  auto t = createShmTransport(setupFor(0, {1}, prefix), store, &b);
  ASSERT_TRUE(t.isOk()) << t.status().message();
  ASSERT_NE(b, nullptr);
  b->publish(1, CallSignature{});
  auto r = b->await(1, 1, 150ms);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), chorusTimeout);
  EXPECT_NE(r.status().message().find("rank 1"), std::string::npos) << r.status().message();

  ASSERT_EQ(kill(child, SIGKILL), 0);
  EXPECT_EQ(waitExit(child), 128 + SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  r = b->await(1, 1, 10s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), chorusRemoteError);
  EXPECT_NE(r.status().message().find(std::to_string(child)), std::string::npos) << r.status().message();

  t.value()->abort(makeError(chorusAborted, "test abort"));
  r = b->await(1, 1, 10s);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), chorusAborted);
}

}  // namespace
}  // namespace chorus::transport
