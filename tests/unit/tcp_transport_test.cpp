// TCP transport over loopback, ranks as threads sharing a MemoryStore:
// exchange patterns, FIFO order across sizes, reductions, striping, length
// mismatches, strangers during setup, peer close, abort and wake.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <array>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <future>
#include <thread>
#include <vector>

#include "bootstrap/auth.hpp"
#include "support/relay.hpp"
#include "support/wrapping_store.hpp"
#include "bootstrap/memory_store.hpp"
#include "kernels/reduce.hpp"
#include "transport/tcp/tcp.hpp"
#include "transport/tcp/tcp_wire.hpp"

namespace chorus::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using TransportPtr = std::unique_ptr<Transport>;

constexpr uint64_t kCommId = 0x5eed;
constexpr size_t kMiB = size_t{1} << 20;

auth::Secret testSecret(uint8_t seed = 7) {
  auth::Secret s;
  for (size_t i = 0; i < s.bytes.size(); ++i) s.bytes[i] = std::byte(seed + i);
  s.present = true;
  return s;
}

TcpSetup setupFor(int rank, int nranks, int sockets = 1, uint64_t rendezvous_bytes = 65536) {
  TcpSetup s;
  s.rank = rank;
  for (int r = 0; r < nranks; ++r)
    if (r != rank) s.peers.push_back(r);
  s.comm_id = kCommId;
  s.secret = testSecret();
  auto addr = net::resolve("127.0.0.1", 0);
  EXPECT_TRUE(addr.isOk()) << addr.status().message();
  s.bind_addr = *addr;
  s.sockets_per_peer = sockets;
  s.rendezvous_bytes = rendezvous_bytes;
  s.timeout = 20s;
  return s;
}

// Creates one transport per rank, concurrently (setup is collective).
// rendezvous: per rank CHORUS_TCP_RENDEZVOUS_BYTES (empty: the default).
// tweak (optional) changes each rank's setup before it is used.
std::vector<TransportPtr> createAll(int nranks, bootstrap::Store& store, int sockets = 1,
                                    std::vector<uint64_t> rendezvous = {},
                                    const std::function<void(TcpSetup&)>& tweak = {}) {
  std::vector<TransportPtr> out(static_cast<size_t>(nranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r)
    threads.emplace_back([&, r] {
      uint64_t rdv = rendezvous.empty() ? 65536 : rendezvous[static_cast<size_t>(r)];
      TcpSetup setup = setupFor(r, nranks, sockets, rdv);
      if (tweak) tweak(setup);
      auto t = createTcpTransport(setup, store);
      EXPECT_TRUE(t.isOk()) << "rank " << r << ": " << t.status().message();
      if (t.isOk()) out[static_cast<size_t>(r)] = std::move(*t);
    });
  for (auto& t : threads) t.join();
  return out;
}

// Runs fn(rank) on one thread per rank.
void runRanks(int nranks, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

struct Driven {
  bool all_finished = false;
  Status poll_error;  // the first error poll() returned
};

// Drives reqs to completion (done or failed) with poll()/wait(), bounded by limit.
Driven drive(Transport& t, const std::vector<Request*>& reqs, std::chrono::milliseconds limit = 30s) {
  Driven out;
  auto deadline = Clock::now() + limit;
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

uint8_t patternByte(size_t i, int from, int to, int msg) {
  return static_cast<uint8_t>(i * 131 + static_cast<size_t>(from) * 17 + static_cast<size_t>(to) * 29 +
                              static_cast<size_t>(msg) * 7 + (i >> 16));
}

std::vector<std::byte> pattern(size_t n, int from, int to, int msg) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(patternByte(i, from, to, msg));
  return v;
}

// Index of the first byte that differs from the pattern, or -1.
int64_t firstBad(const std::vector<std::byte>& v, int from, int to, int msg) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != std::byte(patternByte(i, from, to, msg))) return static_cast<int64_t>(i);
  return -1;
}

// Every rank sends `sizes` (in order) to every other rank and receives the
// same from each; checks every byte and that nothing failed.
void exchangeAll(std::vector<TransportPtr>& ts, const std::vector<size_t>& sizes) {
  int n = static_cast<int>(ts.size());
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
    for (auto& r : reqs) EXPECT_EQ(r.state.load(), Request::Done) << r.status.message();
    for (auto& e : expects)
      EXPECT_EQ(firstBad(*e.buf, e.from, me, e.msg), -1)
          << "rank " << me << " message " << e.msg << " (" << e.buf->size() << " bytes) from " << e.from;
  });
}

class TcpAllToAll : public ::testing::TestWithParam<int> {};

TEST_P(TcpAllToAll, EveryPairExchangesInFifoOrder) {
  bootstrap::MemoryStore store;
  auto ts = createAll(GetParam(), store);
  ASSERT_TRUE(std::all_of(ts.begin(), ts.end(), [](auto& t) { return t != nullptr; }));
  EXPECT_EQ(ts[0]->name(), "tcp");
  exchangeAll(ts, {0, 1, 7, 4096, 70000});
}

INSTANTIATE_TEST_SUITE_P(Ranks, TcpAllToAll, ::testing::Values(2, 3, 5));

TEST(TcpTransport, ManySizesKeepFifoOrderBothWays) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  std::vector<size_t> sizes;
  for (int rep = 0; rep < 3; ++rep)
    for (size_t s : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{1000003}, 16 * kMiB}) sizes.push_back(s);
  exchangeAll(ts, sizes);
}

TEST(TcpTransport, StripesAcrossThreeSocketsPerPeer) {
  bootstrap::MemoryStore store;
  auto ts = createAll(3, store, /*sockets=*/3);
  ASSERT_TRUE(ts[0] && ts[1] && ts[2]);
  constexpr size_t kPiece = 256 * 1024;
  exchangeAll(ts, {0, 1, kPiece - 1, kPiece, kPiece + 1, 3 * kPiece + 5, 4096, 16 * kMiB + 3, 100});
}

// Rank 1 reduces rank 0's floats into its buffer: dst = accum + incoming.
void checkReduce(int sockets, size_t count, bool in_place) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store, sockets);
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

TEST(TcpTransport, ReducesFloatSumSmall) { checkReduce(1, 7, false); }
TEST(TcpTransport, ReducesFloatSumLarge) { checkReduce(1, 1000003, false); }
TEST(TcpTransport, ReducesFloatSumInPlace) { checkReduce(1, 300001, true); }
TEST(TcpTransport, ReducesFloatSumStriped) { checkReduce(3, 1000003, false); }

TEST(TcpTransport, ReducingReceiveRejectsPartialElements) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  kernels::Reducer sum(chorusFloat32, kernels::BinOp::Sum);
  std::vector<std::byte> buf(10);
  Request req;
  Status s = ts[1]->postRecv(0, RecvTarget{buf.data(), 10, buf.data(), &sum}, &req);
  EXPECT_EQ(s.code(), chorusInvalidArgument);
  EXPECT_EQ(req.state.load(), Request::Failed);
}

// Sends `sent` (each completes before the receiver posts, so a small
// receive's staged read can run past a short frame), then receives with
// lengths `expected`; returns the receive requests' final states.
struct MismatchCase {
  std::vector<size_t> sent, expected;
};

std::vector<Status> runMismatch(const MismatchCase& c, std::vector<std::vector<std::byte>>& got) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  EXPECT_TRUE(ts[0] && ts[1]);
  if (!ts[0] || !ts[1]) return {};
  std::deque<Request> sends;
  std::vector<std::vector<std::byte>> sendbufs;
  for (size_t m = 0; m < c.sent.size(); ++m) sendbufs.push_back(pattern(c.sent[m], 0, 1, static_cast<int>(m)));
  for (size_t m = 0; m < c.sent.size(); ++m)
    EXPECT_TRUE(ts[0]->postSend(1, sendbufs[m].data(), sendbufs[m].size(), &sends.emplace_back()).isOk());
  std::deque<Request> recvs;
  got.clear();
  for (size_t n : c.expected) got.emplace_back(n);
  std::promise<void> sent;
  std::thread sender([&] {
    // Small sends finish without the receiver (socket buffers take them);
    // large ones need it, so then only their posting is waited for.
    bool all_small = std::all_of(c.sent.begin(), c.sent.end(), [](size_t n) { return n < 65536; });
    Driven d = drive(*ts[0], all_small ? pointers(sends) : std::vector<Request*>{});
    EXPECT_TRUE(d.all_finished);
    sent.set_value();
    d = drive(*ts[0], pointers(sends));
    EXPECT_TRUE(d.all_finished);
  });
  EXPECT_EQ(sent.get_future().wait_for(30s), std::future_status::ready);
  for (auto& g : got) EXPECT_TRUE(ts[1]->postRecv(0, RecvTarget{g.data(), g.size()}, &recvs.emplace_back()).isOk());
  Driven d = drive(*ts[1], pointers(recvs));
  EXPECT_TRUE(d.all_finished);
  EXPECT_TRUE(d.poll_error.isOk()) << "a mismatch fails the receive, not the connection: " << d.poll_error.message();
  sender.join();
  std::vector<Status> out;
  for (auto& r : recvs) out.push_back(r.state.load() == Request::Done ? Status() : r.status);
  return out;
}

TEST(TcpTransport, LongerMessageFailsReceiveWithMismatchAndStreamContinues) {
  std::vector<std::vector<std::byte>> got;
  auto st = runMismatch({{100, 50}, {64, 50}}, got);
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].code(), chorusMismatch);
  EXPECT_NE(st[0].message().find("rank 0 has 100 bytes but the receive expects 64"), std::string::npos)
      << st[0].message();
  EXPECT_TRUE(st[1].isOk()) << st[1].message();
  EXPECT_EQ(firstBad(got[1], 0, 1, 1), -1);
}

TEST(TcpTransport, ShorterMessageFailsReceiveAndOverreadBytesAreKept) {
  std::vector<std::vector<std::byte>> got;
  auto st = runMismatch({{10, 20, 0, 3}, {30, 20, 0, 3}}, got);
  ASSERT_EQ(st.size(), 4u);
  EXPECT_EQ(st[0].code(), chorusMismatch) << st[0].message();
  for (size_t i = 1; i < 4; ++i) EXPECT_TRUE(st[i].isOk()) << st[i].message();
  EXPECT_EQ(firstBad(got[1], 0, 1, 1), -1);
  EXPECT_EQ(firstBad(got[3], 0, 1, 3), -1);
}

TEST(TcpTransport, LargeMismatchIsDiscardedAndStreamContinues) {
  std::vector<std::vector<std::byte>> got;
  auto st = runMismatch({{3 * kMiB, 4096, kMiB}, {2 * kMiB, 4096, kMiB}}, got);
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[0].code(), chorusMismatch);
  EXPECT_TRUE(st[1].isOk()) << st[1].message();
  EXPECT_TRUE(st[2].isOk()) << st[2].message();
  EXPECT_EQ(firstBad(got[1], 0, 1, 1), -1);
  EXPECT_EQ(firstBad(got[2], 0, 1, 2), -1);
}

// Rank 1 as a real transport, rank 0 played by hand: the connection
// protocol of tcp_setup.cpp, then raw frame bytes the test controls.
struct RawPair {
  TransportPtr rank1;
  net::Fd rank0;
};

RawPair rawPair(bootstrap::MemoryStore& store) {
  RawPair out;
  std::thread t1([&] {
    auto t = createTcpTransport(setupFor(1, 2), store);
    EXPECT_TRUE(t.isOk()) << t.status().message();
    if (t.isOk()) out.rank1 = std::move(*t);
  });
  auto deadline = Clock::now() + 10s;
  auto raw = store.get("tcp/1", 10s);
  EXPECT_TRUE(raw.isOk());
  net::SockAddr addr;
  if (raw.isOk() && raw->size() == sizeof addr) std::memcpy(&addr, raw->data(), sizeof addr);
  auto fd = net::connectTo(addr, deadline);
  EXPECT_TRUE(fd.isOk()) << fd.status().message();
  if (fd.isOk()) {
    tcp::Hello h;
    h.comm_id = kCommId;
    h.rank = 0;
    h.index = 0;
    h.nsockets = 1;
    EXPECT_TRUE(auth::clientHandshake(fd->get(), testSecret(), std::as_bytes(std::span(&h, 1)), deadline).isOk());
    uint32_t ack = 0;
    EXPECT_TRUE(net::readAll(fd->get(), std::as_writable_bytes(std::span(&ack, 1)), deadline).isOk());
    EXPECT_EQ(ack, tcp::kAck);
    out.rank0 = std::move(*fd);
  }
  t1.join();
  return out;
}

Status sendRaw(const net::Fd& fd, const void* p, size_t n) {
  return net::writeAll(fd.get(), {static_cast<const std::byte*>(p), n}, Clock::now() + 10s);
}

TEST(TcpTransport, ReductionCarriesPartialElementsAcrossReads) {
  bootstrap::MemoryStore store;
  RawPair rp = rawPair(store);
  ASSERT_TRUE(rp.rank1 && rp.rank0.valid());
  constexpr size_t kCount = 3001;  // over the small-message staging size
  std::vector<float> src(kCount), accum(kCount), dst(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    src[i] = static_cast<float>(i % 513);
    accum[i] = static_cast<float>(i % 97);
  }
  kernels::Reducer sum(chorusFloat32, kernels::BinOp::Sum);
  Request req;
  const size_t bytes = kCount * sizeof(float);
  ASSERT_TRUE(rp.rank1
                  ->postRecv(0,
                             RecvTarget{reinterpret_cast<std::byte*>(dst.data()), bytes,
                                        reinterpret_cast<const std::byte*>(accum.data()), &sum},
                             &req)
                  .isOk());
  tcp::FrameHeader h{tcp::kFrameMagic, 0, bytes};
  ASSERT_TRUE(sendRaw(rp.rank0, &h, sizeof h).isOk());
  // Odd-sized pieces, each polled in before the next is sent: most reads end
  // inside an element.
  const size_t kChunks[] = {1, 2, 3, 5, 7, 13, 64, 1001};
  const auto* p = reinterpret_cast<const std::byte*>(src.data());
  for (size_t off = 0, k = 0; off < bytes; ++k) {
    size_t n = std::min(kChunks[k % std::size(kChunks)], bytes - off);
    ASSERT_TRUE(sendRaw(rp.rank0, p + off, n).isOk());
    off += n;
    ASSERT_TRUE(rp.rank1->poll().isOk());
  }
  ASSERT_TRUE(drive(*rp.rank1, {&req}).all_finished);
  ASSERT_EQ(req.state.load(), Request::Done) << req.status.message();
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(dst[i], src[i] + accum[i]) << "element " << i;
}

TEST(TcpTransport, CorruptHeaderBreaksTheConnectionBeforeTouchingMemory) {
  for (tcp::FrameHeader bad : {tcp::FrameHeader{0xdeadbeef, 0, 8}, tcp::FrameHeader{tcp::kFrameMagic, 0, ~uint64_t{0}},
                               tcp::FrameHeader{tcp::kFrameMagic, 16, 8},
                               // rendezvous control headers that no honest peer sends here
                               tcp::FrameHeader{tcp::kFrameMagic, tcp::kFlagRts, 8},
                               tcp::FrameHeader{tcp::kFrameMagic, tcp::kFlagCts, 0},
                               tcp::FrameHeader{tcp::kFrameMagic, tcp::kFlagData, 8}}) {
    bootstrap::MemoryStore store;
    RawPair rp = rawPair(store);
    ASSERT_TRUE(rp.rank1 && rp.rank0.valid());
    std::vector<std::byte> dst(8, std::byte{0x55});
    Request req;
    ASSERT_TRUE(rp.rank1->postRecv(0, RecvTarget{dst.data(), dst.size()}, &req).isOk());
    uint64_t payload = 0;
    ASSERT_TRUE(sendRaw(rp.rank0, &bad, sizeof bad).isOk());
    ASSERT_TRUE(sendRaw(rp.rank0, &payload, sizeof payload).isOk());
    Driven d = drive(*rp.rank1, {&req}, 10s);
    ASSERT_TRUE(d.all_finished);
    EXPECT_EQ(req.state.load(), Request::Failed);
    EXPECT_EQ(req.status.code(), chorusRemoteError);
    EXPECT_NE(req.status.message().find("corrupt"), std::string::npos) << req.status.message();
    EXPECT_EQ(d.poll_error.code(), chorusRemoteError);
    EXPECT_EQ(dst, std::vector<std::byte>(8, std::byte{0x55}));
  }
}

// An aborting peer says why in an abort frame; the receive fails naming the
// peer and carrying the reason (control characters scrubbed), memory untouched.
TEST(TcpTransport, AbortFrameCarriesThePeersReason) {
  bootstrap::MemoryStore store;
  RawPair rp = rawPair(store);
  ASSERT_TRUE(rp.rank1 && rp.rank0.valid());
  std::vector<std::byte> dst(64, std::byte{0x55});
  Request req;
  ASSERT_TRUE(rp.rank1->postRecv(0, RecvTarget{dst.data(), dst.size()}, &req).isOk());
  const std::string reason = "rank 7 died\n(pid 42)";
  tcp::FrameHeader h{tcp::kFrameMagic, tcp::kFlagAbort, reason.size()};
  ASSERT_TRUE(sendRaw(rp.rank0, &h, sizeof h).isOk());
  ASSERT_TRUE(sendRaw(rp.rank0, reason.data(), reason.size()).isOk());
  Driven d = drive(*rp.rank1, {&req}, 10s);
  ASSERT_TRUE(d.all_finished);
  EXPECT_EQ(req.status.code(), chorusRemoteError);
  EXPECT_NE(req.status.message().find("peer rank 0"), std::string::npos) << req.status.message();
  EXPECT_NE(req.status.message().find("aborted its communicator: rank 7 died (pid 42)"), std::string::npos)
      << req.status.message();
  EXPECT_EQ(dst, std::vector<std::byte>(64, std::byte{0x55}));
}

// ---- rendezvous (these tests use a 64 KiB threshold: setupFor) ----

// Reads exactly n bytes from the raw peer's socket (bounded).
std::vector<std::byte> readRaw(const net::Fd& fd, size_t n) {
  std::vector<std::byte> out(n);
  Status s = net::readAll(fd.get(), out, Clock::now() + 10s);
  EXPECT_TRUE(s.isOk()) << s.message();
  return out;
}

// Bytes waiting on the raw peer's socket right now (0 if none).
size_t rawPending(const net::Fd& fd) {
  std::array<std::byte, 64> buf;
  ssize_t n = ::recv(fd.get(), buf.data(), buf.size(), MSG_PEEK | MSG_DONTWAIT);
  return n > 0 ? static_cast<size_t>(n) : 0;
}

tcp::FrameHeader headerOf(const std::vector<std::byte>& b) {
  tcp::FrameHeader h;
  EXPECT_GE(b.size(), sizeof h);
  std::memcpy(&h, b.data(), sizeof h);
  return h;
}

// A large send puts only its 16-byte announcement on the wire until the
// receiver grants it; then a payload header and exactly the payload follow.
TEST(TcpTransport, RendezvousSendWritesNoPayloadBeforeTheGrant) {
  bootstrap::MemoryStore store;
  RawPair rp = rawPair(store);
  ASSERT_TRUE(rp.rank1 && rp.rank0.valid());
  const size_t kBytes = 1 * kMiB;
  auto src = pattern(kBytes, 1, 0, 0);
  Request req;
  ASSERT_TRUE(rp.rank1->postSend(0, src.data(), src.size(), &req).isOk());
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(rp.rank1->poll().isOk());
  tcp::FrameHeader rts = headerOf(readRaw(rp.rank0, sizeof(tcp::FrameHeader)));
  EXPECT_EQ(rts.magic, tcp::kFrameMagic);
  EXPECT_EQ(rts.flags, tcp::kFlagRts);
  EXPECT_EQ(rts.length, kBytes);
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(rp.rank1->poll().isOk());
  EXPECT_EQ(rawPending(rp.rank0), 0u) << "payload bytes went out before the clear-to-send";
  EXPECT_FALSE(req.finished());
  // Grant message 0.
  tcp::FrameHeader cts{tcp::kFrameMagic, tcp::kFlagCts, 1};
  ASSERT_TRUE(sendRaw(rp.rank0, &cts, sizeof cts).isOk());
  std::vector<std::byte> got;
  auto deadline = Clock::now() + 20s;
  while (got.size() < sizeof(tcp::FrameHeader) + kBytes && Clock::now() < deadline) {
    ASSERT_TRUE(rp.rank1->poll().isOk());
    std::array<std::byte, 65536> buf;
    ssize_t n = ::recv(rp.rank0.get(), buf.data(), buf.size(), MSG_DONTWAIT);
    if (n > 0) got.insert(got.end(), buf.begin(), buf.begin() + n);
  }
  ASSERT_EQ(got.size(), sizeof(tcp::FrameHeader) + kBytes);
  tcp::FrameHeader data = headerOf(got);
  EXPECT_EQ(data.flags, tcp::kFlagData);
  EXPECT_EQ(data.length, kBytes);
  EXPECT_TRUE(std::equal(src.begin(), src.end(), got.begin() + sizeof data));
  ASSERT_TRUE(drive(*rp.rank1, {&req}, 10s).all_finished);
  EXPECT_EQ(req.state.load(), Request::Done) << req.status.message();
}

// Posting a large receive grants the message at once (before its
// announcement arrives); a small receive does not, and small sends stay eager.
TEST(TcpTransport, LargeReceiveGrantsAtOnceAndSmallMessagesStayEager) {
  bootstrap::MemoryStore store;
  RawPair rp = rawPair(store);
  ASSERT_TRUE(rp.rank1 && rp.rank0.valid());
  // A small send: header and payload go at once, with no receive anywhere.
  auto small = pattern(1000, 1, 0, 0);
  Request sreq;
  ASSERT_TRUE(rp.rank1->postSend(0, small.data(), small.size(), &sreq).isOk());
  ASSERT_TRUE(drive(*rp.rank1, {&sreq}, 10s).all_finished);
  EXPECT_EQ(sreq.state.load(), Request::Done);
  auto got = readRaw(rp.rank0, sizeof(tcp::FrameHeader) + small.size());
  EXPECT_EQ(headerOf(got).flags, 0u);
  EXPECT_TRUE(std::equal(small.begin(), small.end(), got.begin() + sizeof(tcp::FrameHeader)));
  // A small receive (message 0) sends nothing; the large one (message 1) its grant.
  std::vector<std::byte> d0(100), d1(kMiB);
  Request r0, r1;
  ASSERT_TRUE(rp.rank1->postRecv(0, RecvTarget{d0.data(), d0.size()}, &r0).isOk());
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(rp.rank1->poll().isOk());
  EXPECT_EQ(rawPending(rp.rank0), 0u);
  ASSERT_TRUE(rp.rank1->postRecv(0, RecvTarget{d1.data(), d1.size()}, &r1).isOk());
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(rp.rank1->poll().isOk());
  tcp::FrameHeader cts = headerOf(readRaw(rp.rank0, sizeof(tcp::FrameHeader)));
  EXPECT_EQ(cts.flags, tcp::kFlagCts);
  EXPECT_EQ(cts.length, 2u);  // messages 0 and 1 may stream
  // Rank 0 sends both: the small one eagerly, the large one announced, then its payload.
  auto m0 = pattern(d0.size(), 0, 1, 0), m1 = pattern(d1.size(), 0, 1, 1);
  tcp::FrameHeader h0{tcp::kFrameMagic, 0, m0.size()}, rts{tcp::kFrameMagic, tcp::kFlagRts, m1.size()},
      data{tcp::kFrameMagic, tcp::kFlagData, m1.size()};
  std::thread writer([&] {
    EXPECT_TRUE(sendRaw(rp.rank0, &h0, sizeof h0).isOk());
    EXPECT_TRUE(sendRaw(rp.rank0, m0.data(), m0.size()).isOk());
    EXPECT_TRUE(sendRaw(rp.rank0, &rts, sizeof rts).isOk());
    EXPECT_TRUE(sendRaw(rp.rank0, &data, sizeof data).isOk());
    EXPECT_TRUE(sendRaw(rp.rank0, m1.data(), m1.size()).isOk());
  });
  Driven d = drive(*rp.rank1, {&r0, &r1}, 20s);
  writer.join();
  ASSERT_TRUE(d.all_finished);
  EXPECT_EQ(r0.state.load(), Request::Done) << r0.status.message();
  EXPECT_EQ(r1.state.load(), Request::Done) << r1.status.message();
  EXPECT_EQ(d0, m0);
  EXPECT_EQ(d1, m1);
  EXPECT_EQ(rawPending(rp.rank0), 0u) << "the announcement needed no second grant";
}

// Hostile rendezvous control: a grant that does not grow, a payload header
// that continues a different length, break the connection untouched.
TEST(TcpTransport, BadRendezvousControlBreaksTheConnection) {
  for (int variant = 0; variant < 2; ++variant) {
    bootstrap::MemoryStore store;
    RawPair rp = rawPair(store);
    ASSERT_TRUE(rp.rank1 && rp.rank0.valid());
    std::vector<std::byte> dst(kMiB, std::byte{0x55});
    Request req;
    ASSERT_TRUE(rp.rank1->postRecv(0, RecvTarget{dst.data(), dst.size()}, &req).isOk());
    std::vector<tcp::FrameHeader> hs;
    if (variant == 0) {
      hs = {{tcp::kFrameMagic, tcp::kFlagCts, 5}, {tcp::kFrameMagic, tcp::kFlagCts, 5}};
    } else {
      hs = {{tcp::kFrameMagic, tcp::kFlagRts, kMiB}, {tcp::kFrameMagic, tcp::kFlagData, kMiB + 8}};
    }
    for (auto& h : hs) ASSERT_TRUE(sendRaw(rp.rank0, &h, sizeof h).isOk());
    uint64_t payload = 0;
    ASSERT_TRUE(sendRaw(rp.rank0, &payload, sizeof payload).isOk());
    Driven d = drive(*rp.rank1, {&req}, 10s);
    ASSERT_TRUE(d.all_finished);
    EXPECT_EQ(req.status.code(), chorusRemoteError) << variant;
    EXPECT_NE(req.status.message().find("corrupt"), std::string::npos) << req.status.message();
    EXPECT_EQ(dst, std::vector<std::byte>(kMiB, std::byte{0x55}));
  }
}

// Both ranks send a large message to each other before posting the receive
// (an exchange round), each posting its receive only after polling a while:
// the grants cross the announcements and both complete; with 1 and 3 sockets.
TEST(TcpTransport, SimultaneousLargeExchangeCompletes) {
  for (int sockets : {1, 3}) {
    bootstrap::MemoryStore store;
    auto ts = createAll(2, store, sockets);
    ASSERT_TRUE(ts[0] && ts[1]);
    runRanks(2, [&](int me) {
      Transport& t = *ts[static_cast<size_t>(me)];
      const int peer = 1 - me;
      std::deque<Request> reqs;
      std::vector<std::vector<std::byte>> src, dst;
      const size_t sizes[] = {3 * kMiB + 5, 70000, 100, 2 * kMiB};
      for (size_t m = 0; m < std::size(sizes); ++m) {
        src.push_back(pattern(sizes[m], me, peer, static_cast<int>(m)));
        dst.emplace_back(sizes[m]);
      }
      std::vector<Request*> all;
      for (size_t m = 0; m < std::size(sizes); ++m) {
        Request& s = reqs.emplace_back();
        ASSERT_TRUE(t.postSend(peer, src[m].data(), src[m].size(), &s).isOk());
        for (int i = 0; i < 20; ++i) ASSERT_TRUE(t.poll().isOk());
        Request& r = reqs.emplace_back();
        ASSERT_TRUE(t.postRecv(peer, RecvTarget{dst[m].data(), dst[m].size()}, &r).isOk());
        all.push_back(&s);
        all.push_back(&r);
      }
      Driven d = drive(t, all, 30s);
      ASSERT_TRUE(d.all_finished) << "rank " << me << " sockets " << sockets;
      EXPECT_TRUE(d.poll_error.isOk()) << d.poll_error.message();
      for (Request* q : all) EXPECT_EQ(q->state.load(), Request::Done) << q->status.message();
      for (size_t m = 0; m < std::size(sizes); ++m) EXPECT_EQ(firstBad(dst[m], peer, me, static_cast<int>(m)), -1);
    });
  }
}

// The ranks disagree on the threshold (one eager, one rendezvous): the
// announcement itself makes the receiver grant; both directions work.
TEST(TcpTransport, RendezvousWorksWhenRanksDisagreeOnTheThreshold) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store, 2, {0, 65536});
  ASSERT_TRUE(ts[0] && ts[1]);
  exchangeAll(ts, {kMiB, 100, 300000, 65536, 65535});
}

// A rendezvous message meets a small receive (no grant was sent ahead), and
// an eager one a large receive: both fail with a mismatch, the stream goes on.
TEST(TcpTransport, MismatchAcrossTheRendezvousThreshold) {
  // Only the first of three messages mismatches; the two after it arrive intact.
  for (const MismatchCase& c : {MismatchCase{{kMiB, 100, 200000}, {1000, 100, 200000}},
                                MismatchCase{{1000, 100, 200000}, {kMiB, 100, 200000}}}) {
    SCOPED_TRACE(c.sent[0] == kMiB ? "rendezvous message, small receive" : "eager message, large receive");
    std::vector<std::vector<std::byte>> got;
    auto st = runMismatch(c, got);
    ASSERT_EQ(st.size(), 3u);
    EXPECT_EQ(st[0].code(), chorusMismatch) << st[0].message();
    EXPECT_TRUE(st[1].isOk()) << st[1].message();
    EXPECT_TRUE(st[2].isOk()) << st[2].message();
    EXPECT_EQ(firstBad(got[1], 0, 1, 1), -1);
    EXPECT_EQ(firstBad(got[2], 0, 1, 2), -1);
  }
}


TEST(TcpTransport, StrangersDuringSetupAreRejectedAndSetupCompletes) {
  bootstrap::MemoryStore store;
  std::promise<TransportPtr> rank1;
  std::thread t1([&] {
    auto t = createTcpTransport(setupFor(1, 2), store);
    EXPECT_TRUE(t.isOk()) << t.status().message();
    rank1.set_value(t.isOk() ? std::move(*t) : nullptr);
  });
  auto raw = store.get("tcp/1", 20s);
  ASSERT_TRUE(raw.isOk());
  net::SockAddr addr;
  ASSERT_EQ(raw->size(), sizeof addr);
  std::memcpy(&addr, raw->data(), sizeof addr);
  auto deadline = Clock::now() + 10s;
  {  // Wrong secret: the handshake fails on both sides.
    auto fd = net::connectTo(addr, deadline);
    ASSERT_TRUE(fd.isOk()) << fd.status().message();
    std::byte hello[24] = {};
    EXPECT_FALSE(auth::clientHandshake(fd->get(), testSecret(99), hello, deadline).isOk());
  }
  {  // Right secret, wrong communicator: authenticated but refused (no ack, closed).
    auto fd = net::connectTo(addr, deadline);
    ASSERT_TRUE(fd.isOk());
    struct {
      uint64_t comm_id = kCommId + 1;
      int32_t rank = 0, index = 0, nsockets = 1;
      uint32_t magic = 0x4c484354;
    } hello;
    ASSERT_TRUE(auth::clientHandshake(fd->get(), testSecret(), std::as_bytes(std::span(&hello, 1)), deadline).isOk());
    uint32_t ack = 0;
    EXPECT_FALSE(net::readAll(fd->get(), std::as_writable_bytes(std::span(&ack, 1)), deadline).isOk());
  }
  auto t0 = createTcpTransport(setupFor(0, 2), store);
  ASSERT_TRUE(t0.isOk()) << t0.status().message();
  TransportPtr t1p = rank1.get_future().get();
  t1.join();
  ASSERT_TRUE(t1p);
  std::vector<TransportPtr> ts;
  ts.push_back(std::move(*t0));
  ts.push_back(std::move(t1p));
  exchangeAll(ts, {5, 4096});
}

// A store that, as each rank publishes its listener, points strangers at it
// first: silent sockets, slow ones (a byte now and then), garbage.  They
// reach the listener's backlog before any honest peer can read the address.
class StrangerStore final : public chorus::testing::WrappingStore {
 public:
  Status set(std::string_view key, std::span<const std::byte> value) override {
    if (key.starts_with("tcp/") && value.size() == sizeof(net::SockAddr)) {
      net::SockAddr addr;
      std::memcpy(&addr, value.data(), sizeof addr);
      std::lock_guard lock(mu_);
      for (int i = 0; i < 6; ++i) strangers_.push_back(open(addr));  // silent
      for (int i = 0; i < 3; ++i) {                                 // slow
        strangers_.push_back(open(addr));
        slow_.push_back(strangers_.back().get());
      }
      for (int i = 0; i < 3; ++i) {  // garbage
        net::Fd g = open(addr);
        std::vector<std::byte> junk(200, std::byte{0x5a});
        (void)net::writeAll(g.get(), junk, Clock::now() + 1s);
        strangers_.push_back(std::move(g));
      }
    }
    return base_.set(key, value);
  }
  Result<bootstrap::Bytes> get(std::string_view key, std::chrono::milliseconds timeout) override {
    {
      std::lock_guard lock(mu_);
      std::byte b{1};
      for (int fd : slow_) (void)::send(fd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    return WrappingStore::get(key, timeout);
  }
  size_t strangers() {
    std::lock_guard lock(mu_);
    return strangers_.size();
  }

 private:
  static net::Fd open(const net::SockAddr& a) {
    auto fd = net::connectTo(a, Clock::now() + 5s);
    EXPECT_TRUE(fd.isOk()) << fd.status().message();
    return fd.isOk() ? std::move(*fd) : net::Fd();
  }
  std::mutex mu_;
  std::vector<net::Fd> strangers_;
  std::vector<int> slow_;
};

// Silent, slow and garbage sockets on every rank's listener during setup
// leave setup time within 1 s of a clean one (they used to be served one at
// a time, each silent socket costing 10 s).
TEST(TcpTransport, StrangersOnEveryListenerDoNotDelaySetup) {
  constexpr int kRanks = 4;
  auto timed = [&](bootstrap::Store& store) {
    auto t0 = Clock::now();
    auto ts = createAll(kRanks, store);
    for (auto& t : ts) EXPECT_TRUE(t);
    auto took = Clock::now() - t0;
    if (std::all_of(ts.begin(), ts.end(), [](auto& t) { return t != nullptr; })) exchangeAll(ts, {5, 4096});
    return took;
  };
  bootstrap::MemoryStore clean;
  auto clean_took = timed(clean);
  StrangerStore hostile;
  auto hostile_took = timed(hostile);
  EXPECT_EQ(hostile.strangers(), size_t{kRanks} * 12);
  EXPECT_LT(hostile_took, clean_took + 1s)
      << "clean setup " << std::chrono::duration_cast<std::chrono::milliseconds>(clean_took).count()
      << " ms, with strangers " << std::chrono::duration_cast<std::chrono::milliseconds>(hostile_took).count() << " ms";
}

// When setup does time out, the error names what else knocked, besides the
// rank that never came.
TEST(TcpTransport, SetupTimeoutNamesTheStrangersSeen) {
  StrangerStore store;
  TcpSetup s = setupFor(1, 2);
  s.timeout = 600ms;
  auto t = createTcpTransport(s, store);
  ASSERT_FALSE(t.isOk());
  EXPECT_EQ(t.status().code(), chorusTimeout);
  const std::string& m = t.status().message();
  EXPECT_NE(m.find("ranks 0"), std::string::npos) << m;
  EXPECT_NE(m.find("refused"), std::string::npos) << m;
  EXPECT_NE(m.find("failed authentication"), std::string::npos) << m;
}

// ---- CHORUS_WIRE_PROTECT (bootstrap/wire_protect.hpp) ----

using auth::WireProtect;

// Sealed connections carry every size, striped over several sockets, eager
// and through rendezvous, in both modes.
class TcpProtected : public ::testing::TestWithParam<std::tuple<WireProtect, int>> {};

TEST_P(TcpProtected, EveryPairExchangesEverySize) {
  const auto [mode, sockets] = GetParam();
  bootstrap::MemoryStore store;
  auto ts = createAll(3, store, sockets, {}, [mode = mode](TcpSetup& s) { s.protect = mode; });
  ASSERT_TRUE(std::all_of(ts.begin(), ts.end(), [](auto& t) { return t != nullptr; }));
  exchangeAll(ts, {0, 1, 7, 4096, 70000, 300000, size_t{3} << 20});
}

INSTANTIATE_TEST_SUITE_P(Modes, TcpProtected,
                         ::testing::Combine(::testing::Values(WireProtect::kMac, WireProtect::kEncrypt),
                                            ::testing::Values(1, 2)));

TEST(TcpTransport, RanksThatDisagreeOnWireProtectionFailNamingIt) {
  bootstrap::MemoryStore store;
  std::vector<Status> st(2);
  runRanks(2, [&](int r) {
    TcpSetup s = setupFor(r, 2);
    s.protect = r == 0 ? WireProtect::kMac : WireProtect::kOff;
    s.timeout = 3s;
    auto t = createTcpTransport(s, store);
    st[static_cast<size_t>(r)] = t.status();
  });
  EXPECT_FALSE(st[0].isOk());
  EXPECT_FALSE(st[1].isOk());
  EXPECT_NE((st[0].message() + st[1].message()).find("CHORUS_WIRE_PROTECT"), std::string::npos)
      << st[0].message() << " / " << st[1].message();
  TcpSetup nosecret = setupFor(0, 2);
  nosecret.secret = auth::Secret();
  nosecret.protect = WireProtect::kEncrypt;
  auto t = createTcpTransport(nosecret, store);
  ASSERT_FALSE(t.isOk());
  EXPECT_NE(t.status().message().find("needs a job secret"), std::string::npos) << t.status().message();
}

// The store rank 0 reads rank 1's address from: it hands out the relay's.
class RelayStore final : public chorus::testing::WrappingStore {
 public:
  explicit RelayStore(size_t flip_at) : flip_at_(flip_at) {}
  Status set(std::string_view key, std::span<const std::byte> value) override {
    if (key == "tcp/1" && value.size() == sizeof(net::SockAddr)) {
      net::SockAddr real;
      std::memcpy(&real, value.data(), sizeof real);
      relay_ = std::make_unique<chorus::testing::Relay>(real, flip_at_, chorus::testing::Relay::kClientToServer);
      net::SockAddr fake = relay_->address();
      return base_.set(key, std::as_bytes(std::span(&fake, 1)));
    }
    return base_.set(key, value);
  }
  [[nodiscard]] bool flipped() const { return relay_ && relay_->flipped(); }

 private:
  size_t flip_at_;
  std::unique_ptr<chorus::testing::Relay> relay_;
};

// What the attack does: without protection the flipped bit lands in rank
// 1's buffer silently; with mac or encrypt rank 1's receive fails naming
// rank 0 and the integrity check, and rank 0's next receive fails naming
// rank 1 (the connection is gone).
TEST(TcpTransport, AnOnPathBitFlipIsSilentWithoutProtectionAndAnErrorWithIt) {
  // Connector's stream: the handshake's 90 bytes (nonce 32, length 2, hello
  // 24, MAC 32), then the first message: a 24-byte header and its payload.
  constexpr size_t kFlipAt = 90 + 24 + 1000;
  for (WireProtect mode : {WireProtect::kOff, WireProtect::kMac, WireProtect::kEncrypt}) {
    SCOPED_TRACE(std::string(auth::wireProtectName(mode)));
    RelayStore store(kFlipAt);
    auto ts = createAll(2, store, 1, {}, [mode](TcpSetup& s) { s.protect = mode; });
    ASSERT_TRUE(ts[0] && ts[1]);
    auto data = pattern(60000, 0, 1, 0);  // eager (below the 65536-byte rendezvous): one header
    std::vector<std::byte> got(data.size());
    Request send, recv;
    ASSERT_TRUE(ts[0]->postSend(1, data.data(), data.size(), &send).isOk());
    ASSERT_TRUE(ts[1]->postRecv(0, RecvTarget{got.data(), got.size()}, &recv).isOk());
    Driven d0, d1;
    std::thread t0([&] { d0 = drive(*ts[0], {&send}, 10s); });
    d1 = drive(*ts[1], {&recv}, 10s);
    t0.join();
    ASSERT_TRUE(store.flipped()) << "the relay did not see the byte it flips";
    ASSERT_TRUE(d1.all_finished);
    if (mode == WireProtect::kOff) {
      EXPECT_EQ(recv.state.load(), Request::Done);
      EXPECT_EQ(firstBad(got, 0, 1, 0), 1000) << "the flipped bit arrives unnoticed";
      continue;
    }
    EXPECT_EQ(recv.state.load(), Request::Failed);
    EXPECT_NE(recv.status.message().find("rank 0"), std::string::npos) << recv.status.message();
    EXPECT_NE(recv.status.message().find("integrity check"), std::string::npos) << recv.status.message();
    // Rank 0 learns it too: its next receive from rank 1 fails naming rank 1.
    std::vector<std::byte> back(16);
    Request again;
    (void)ts[0]->postRecv(1, RecvTarget{back.data(), back.size()}, &again);
    ts[1].reset();  // rank 1 gives up on the broken connection
    Driven d = drive(*ts[0], {&again}, 10s);
    ASSERT_TRUE(d.all_finished);
    EXPECT_EQ(again.state.load(), Request::Failed);
    EXPECT_NE(again.status.message().find("rank 1"), std::string::npos) << again.status.message();
  }
}

TEST(TcpTransport, SetupTimesOutNamingTheMissingRank) {
  bootstrap::MemoryStore store;
  TcpSetup s = setupFor(1, 2);
  s.timeout = 300ms;
  auto t = createTcpTransport(s, store);
  ASSERT_FALSE(t.isOk());
  EXPECT_EQ(t.status().code(), chorusTimeout);
  EXPECT_NE(t.status().message().find("ranks 0"), std::string::npos) << t.status().message();
}

TEST(TcpTransport, PeerCloseFailsPendingReceiveWithRemoteError) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  std::vector<std::byte> buf(64);
  Request req;
  ASSERT_TRUE(ts[1]->postRecv(0, RecvTarget{buf.data(), buf.size()}, &req).isOk());
  auto r = ts[1]->poll();
  ASSERT_TRUE(r.isOk());
  ts[0].reset();
  Driven d = drive(*ts[1], {&req}, 10s);
  ASSERT_TRUE(d.all_finished) << "the receive did not fail within 10 s of the peer closing";
  EXPECT_EQ(req.state.load(), Request::Failed);
  EXPECT_EQ(req.status.code(), chorusRemoteError);
  EXPECT_NE(req.status.message().find("connection to rank 0"), std::string::npos) << req.status.message();
  EXPECT_EQ(d.poll_error.code(), chorusRemoteError);
  // Later posts to the dead peer fail at once.
  Request again;
  EXPECT_EQ(ts[1]->postRecv(0, RecvTarget{buf.data(), buf.size()}, &again).code(), chorusRemoteError);
  EXPECT_EQ(again.state.load(), Request::Failed);
}

// A live peer that does not read for many heartbeat periods (a rank
// computing while a large message waits for it) is not declared dead: its
// kernel keeps acknowledging and answering window probes.  (TCP_USER_TIMEOUT,
// used before, failed this send after 3 heartbeats.)
TEST(TcpTransport, APeerThatDoesNotReadForLongIsNotDeclaredDead) {
  bootstrap::MemoryStore store;
  std::vector<TransportPtr> ts(2);
  runRanks(2, [&](int r) {
    TcpSetup s = setupFor(r, 2);
    s.heartbeat_ms = 100;  // dead after 300 ms of silence
    s.rendezvous_bytes = 0;  // eager: the payload fills the window while rank 1 does not read
    auto t = createTcpTransport(s, store);
    EXPECT_TRUE(t.isOk()) << t.status().message();
    if (t.isOk()) ts[static_cast<size_t>(r)] = std::move(*t);
  });
  ASSERT_TRUE(ts[0] && ts[1]);
  const size_t n = 48 * kMiB;  // far more than the socket buffers hold
  auto data = pattern(n, 0, 1, 0);
  std::vector<std::byte> got(n);
  Request send, recv;
  runRanks(2, [&](int r) {
    if (r == 0) {
      ASSERT_TRUE(ts[0]->postSend(1, data.data(), n, &send).isOk());
      Driven d = drive(*ts[0], {&send}, 30s);
      EXPECT_TRUE(d.all_finished);
      EXPECT_TRUE(d.poll_error.isOk()) << d.poll_error.message();
    } else {
      // The injected condition: this rank reads nothing for 15 heartbeats.
      std::this_thread::sleep_for(1500ms);
      ASSERT_TRUE(ts[1]->postRecv(0, RecvTarget{got.data(), n}, &recv).isOk());
      Driven d = drive(*ts[1], {&recv}, 30s);
      EXPECT_TRUE(d.all_finished);
      EXPECT_TRUE(d.poll_error.isOk()) << d.poll_error.message();
    }
  });
  EXPECT_EQ(send.state.load(), Request::Done) << send.status.message();
  EXPECT_EQ(recv.state.load(), Request::Done) << recv.status.message();
  EXPECT_TRUE(got == data);
}

TEST(TcpTransport, AbortFromAnotherThreadFailsRequestsAndEndsWait) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  std::vector<std::byte> buf(64);
  std::vector<std::byte> big(32 * kMiB);  // more than the socket buffers take: stays pending
  Request recv, send;
  ASSERT_TRUE(ts[0]->postRecv(1, RecvTarget{buf.data(), buf.size()}, &recv).isOk());
  ASSERT_TRUE(ts[0]->postSend(1, big.data(), big.size(), &send).isOk());
  ASSERT_TRUE(ts[0]->poll().isOk());
  std::thread aborter([&] { ts[0]->abort(makeError(chorusRemoteError, "test abort: rank 3 died")); });
  auto start = Clock::now();
  ts[0]->wait(60s);  // returns on the abort's wake (or at once, if that came first)
  EXPECT_LT(Clock::now() - start, 20s);
  aborter.join();
  auto r = ts[0]->poll();
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("test abort"), std::string::npos);
  for (Request* q : {&recv, &send}) {
    EXPECT_EQ(q->state.load(), Request::Failed);
    EXPECT_NE(q->status.message().find("test abort"), std::string::npos);
  }
  Request later;
  EXPECT_FALSE(ts[0]->postSend(1, buf.data(), 1, &later).isOk());
  EXPECT_EQ(later.state.load(), Request::Failed);
  // The aborted rank closed its connections: the peer's pending work fails too.
  std::vector<std::byte> big_in(big.size());
  Request peer_recv;
  ASSERT_TRUE(ts[1]->postRecv(0, RecvTarget{big_in.data(), big_in.size()}, &peer_recv).isOk());
  Driven d = drive(*ts[1], {&peer_recv}, 10s);
  EXPECT_TRUE(d.all_finished);
  EXPECT_EQ(peer_recv.status.code(), chorusRemoteError);
}

TEST(TcpTransport, WakeEndsWaitEarly) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  std::vector<std::byte> buf(8);
  Request recv;  // pending work, but nothing will arrive
  ASSERT_TRUE(ts[0]->postRecv(1, RecvTarget{buf.data(), buf.size()}, &recv).isOk());
  ts[0]->wake();  // before the wait: not lost
  auto start = Clock::now();
  ts[0]->wait(60s);
  EXPECT_LT(Clock::now() - start, 20s);
  std::thread waker([&] { ts[0]->wake(); });
  start = Clock::now();
  ts[0]->wait(60s);
  EXPECT_LT(Clock::now() - start, 20s);
  waker.join();
  EXPECT_FALSE(recv.finished());
  // A wait without work or wake just times out.
  start = Clock::now();
  ts[1]->wait(20ms);
  EXPECT_GE(Clock::now() - start, 20ms);
}

TEST(TcpTransport, DataArrivingEndsWait) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  uint64_t v = 42, got = 0;
  Request recv, send;
  ASSERT_TRUE(ts[1]->postRecv(0, RecvTarget{reinterpret_cast<std::byte*>(&got), sizeof got}, &recv).isOk());
  ASSERT_TRUE(ts[1]->poll().isOk());
  ASSERT_TRUE(ts[0]->postSend(1, &v, sizeof v, &send).isOk());
  ASSERT_TRUE(drive(*ts[0], {&send}).all_finished);
  auto start = Clock::now();
  ts[1]->wait(60s);
  EXPECT_LT(Clock::now() - start, 20s);
  ASSERT_TRUE(drive(*ts[1], {&recv}).all_finished);
  EXPECT_EQ(got, 42u);
}

TEST(TcpTransport, RejectsUnknownPeerAndBadSetup) {
  bootstrap::MemoryStore store;
  auto ts = createAll(2, store);
  ASSERT_TRUE(ts[0] && ts[1]);
  Request req;
  std::byte b{};
  EXPECT_EQ(ts[0]->postSend(5, &b, 1, &req).code(), chorusInvalidArgument);
  EXPECT_EQ(ts[0]->postSend(0, &b, 1, &req).code(), chorusInvalidArgument);
  TcpSetup s = setupFor(0, 2);
  s.sockets_per_peer = 0;
  EXPECT_EQ(createTcpTransport(s, store).status().code(), chorusInvalidArgument);
  s = setupFor(0, 2);
  s.peers.push_back(1);
  EXPECT_EQ(createTcpTransport(s, store).status().code(), chorusInvalidArgument);
}

}  // namespace
}  // namespace chorus::transport
