// libFuzzer target: the TCP transport's one-sided connection (TcpSetup::rma,
// tcp_wire.hpp's RmaFrame) fed by a hostile peer over loopback.
//
// Each input sets up a real TcpTransport with one-sided operations for rank 1
// of a 2-rank communicator; the harness plays rank 0 with raw sockets (its
// message socket and its one-sided connection, properly authenticated).
// Rank 1 registers two regions (their bytes sit inside guard bytes of an
// exact-size heap buffer) and publishes their keys to the harness, and posts
// one-sided operations of its own to rank 0 (a put, a get into an exact-size
// buffer, a notification), so that answers the harness forges are matched
// against real operations.  The harness then writes frames built from the
// input to the one-sided connection while rank 1 polls, and closes.
//
// Input layout (little endian; a short input ends the layout early):
//   u8  cfg   bits 0-1: access of region A (0 and 3: read|write, 1 read, 2
//             write); bits 2-3: rank 1's get length (0, 1, 5000, 70000)
//   records until the end: u8 ctl, then
//     ctl bit 7 set: u16 n, then n raw bytes;
//     else a frame: u8 kind (raw), u8 reason, u8 which (bits 0-1: region A,
//     B, a deregistered one or index 7; bit 2: a wrong generation; bit 3: op
//     number raw (u8 follows) instead of the next expected), u32 offset
//     (bit 31 set: offset = 2^64 - (offset & 0xffff); a notification's
//     value), u24 length, then min(length, what is left) payload bytes for a
//     put or get-data.  Answers name rank 1's op 1 + (ctl & 3).
//
// Properties: no write outside a region or a get's buffer, no read out of
// bounds (ASan on exact-size buffers), no UB (UBSan); the guard bytes around
// the regions are intact; a refused put changes nothing in its region; once
// the peer closed its sockets every operation rank 1 posted finishes within
// 5 s.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/memory_store.hpp"
#include "common/log.hpp"
#include "transport/rma.hpp"
#include "transport/tcp/tcp.hpp"
#include "transport/tcp/tcp_wire.hpp"

namespace {

using namespace std::chrono_literals;
using chorus::Status;
using chorus::net::Clock;
namespace tcp = chorus::transport::tcp;
namespace tr = chorus::transport;

constexpr uint64_t kCommId = 0xf022f033;
constexpr size_t kGuard = 64;
constexpr size_t kRegionBytes = 8192;
constexpr std::byte kGuardByte{0xA5};

struct Reader {
  std::span<const uint8_t> in;
  uint64_t le(size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n && !in.empty(); ++i) {
      v |= uint64_t{in[0]} << (8 * i);
      in = in.subspan(1);
    }
    return v;
  }
  std::span<const uint8_t> take(size_t n) {
    n = std::min(n, in.size());
    auto out = in.first(n);
    in = in.subspan(n);
    return out;
  }
};

chorus::auth::Secret secret() {
  chorus::auth::Secret s;
  for (size_t i = 0; i < s.bytes.size(); ++i) s.bytes[i] = std::byte(0x3c ^ i);
  s.present = true;
  return s;
}

int connectAs(const chorus::net::SockAddr& addr, int index) {
  auto deadline = Clock::now() + 5s;
  auto fd = chorus::net::connectTo(addr, deadline);
  if (!fd.isOk()) std::abort();
  tcp::Hello h;
  h.comm_id = kCommId;
  h.rank = 0;
  h.index = index;
  h.nsockets = 1 | tcp::kHelloRmaBit;
  if (!chorus::auth::clientHandshake(fd->get(), secret(), std::as_bytes(std::span(&h, 1)), deadline).isOk())
    std::abort();
  uint32_t ack = 0;
  Status s = chorus::net::readAll(fd->get(), std::as_writable_bytes(std::span(&ack, 1)), deadline);
  if (!s.isOk() || ack != tcp::kAck) std::abort();
  return fd->release();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  chorus::log::setLevel(chorus::log::Level::None);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader rd{std::span(data, size)};
  const auto cfg = static_cast<uint8_t>(rd.le(1));

  chorus::bootstrap::MemoryStore store;
  tr::TcpSetup setup;
  setup.rank = 1;
  setup.peers = {0};
  setup.comm_id = kCommId;
  setup.secret = secret();
  setup.bind_addr = *chorus::net::resolve("127.0.0.1", 0);
  setup.timeout = 10s;
  setup.rma = true;
  std::unique_ptr<tr::Transport> t;
  std::thread setup_thread([&] {
    auto r = tr::createTcpTransport(setup, store);
    if (r.isOk()) t = std::move(*r);
  });
  auto raw = store.get("tcp/1", 10s);
  if (!raw.isOk() || raw->size() != sizeof(chorus::net::SockAddr)) std::abort();
  chorus::net::SockAddr addr;
  std::memcpy(&addr, raw->data(), sizeof addr);
  int msg_sock = connectAs(addr, 0);
  int rma_sock = connectAs(addr, 1);
  setup_thread.join();
  if (!t || t->rma() == nullptr) std::abort();
  ::fcntl(rma_sock, F_SETFL, ::fcntl(rma_sock, F_GETFL) | O_NONBLOCK);
  tr::Rma& rma = *t->rma();

  // Two regions in one exact-size buffer, guard bytes around each; a third
  // registered and deregistered (its key is stale).
  std::vector<std::byte> mem(3 * kGuard + 2 * kRegionBytes, kGuardByte);
  std::byte* a = mem.data() + kGuard;
  std::byte* b = a + kRegionBytes + kGuard;
  std::fill(a, a + kRegionBytes, std::byte{1});
  std::fill(b, b + kRegionBytes, std::byte{2});
  static constexpr tr::Access kAccess[] = {tr::Access::ReadWrite, tr::Access::Read, tr::Access::Write,
                                           tr::Access::ReadWrite};
  const tr::Access a_access = kAccess[cfg & 3];
  auto ida = rma.registerRegion(a, kRegionBytes, a_access);
  auto idb = rma.registerRegion(b, kRegionBytes, tr::Access::Read);
  std::vector<std::byte> gone_mem(16);
  auto idc = rma.registerRegion(gone_mem.data(), gone_mem.size(), tr::Access::ReadWrite);
  if (!ida.isOk() || !idb.isOk() || !idc.isOk() || !rma.deregisterRegion(*idc).isOk()) std::abort();
  const tr::RegionId ids[4] = {*ida, *idb, *idc, {7, 1}};

  // Rank 1's own operations to rank 0; their answers come from the input.
  static constexpr size_t kGetLen[] = {0, 1, 5000, 70000};
  const size_t get_len = kGetLen[(cfg >> 2) & 3];
  std::vector<std::byte> get_buf(get_len);  // exact size: ASan flags a write past it
  std::vector<std::byte> put_src(3000, std::byte{9});
  tr::RemoteKey peer_key;
  peer_key.owner = 0;
  peer_key.region = 0;
  peer_key.generation = 1;
  peer_key.bytes = 1 << 20;
  peer_key.access = tr::Access::ReadWrite;
  peer_key.transport = tr::rmaTransportTag("tcp");
  tr::Request reqs[3];
  (void)rma.put(0, put_src.data(), put_src.size(), peer_key, 0, &reqs[0]);
  (void)rma.get(0, get_buf.data(), get_buf.size(), peer_key, 0, &reqs[1]);
  (void)rma.notify(0, 5, &reqs[2]);

  // The frames.
  std::vector<uint8_t> stream;
  uint64_t next_op = 1;
  while (!rd.in.empty()) {
    const auto ctl = static_cast<uint8_t>(rd.le(1));
    if (ctl & 0x80) {
      auto bytes = rd.take(rd.le(2));
      stream.insert(stream.end(), bytes.begin(), bytes.end());
      continue;
    }
    tcp::RmaFrame f;
    f.kind = static_cast<uint16_t>(rd.le(1));
    f.reason = static_cast<uint16_t>(rd.le(1) % 9);
    const auto which = static_cast<uint8_t>(rd.le(1));
    const tr::RegionId& id = ids[which & 3];
    if (f.kind == tcp::kRmaPut || f.kind == tcp::kRmaGet) {
      f.region = id.index;
      f.generation = id.generation ^ ((which & 4) ? 0x100 : 0);
    }
    f.op = (which & 8) ? rd.le(1) : (f.kind <= tcp::kRmaNotify ? next_op++ : 1 + (ctl & 3));
    const auto off = static_cast<uint32_t>(rd.le(4));
    f.offset = (off & 0x80000000u) ? uint64_t{0} - (off & 0xffff) : off;
    if (f.kind != tcp::kRmaPut && f.kind != tcp::kRmaGet) f.offset = 0;
    f.length = rd.le(3);
    if (f.kind == tcp::kRmaNotify) f.generation = off;
    auto* hb = reinterpret_cast<const uint8_t*>(&f);
    stream.insert(stream.end(), hb, hb + sizeof f);
    if (f.kind == tcp::kRmaPut || f.kind == tcp::kRmaGetData) {
      auto payload = rd.take(f.length);
      stream.insert(stream.end(), payload.begin(), payload.end());
    }
  }

  // What a refused put must not change: region A when it is not writable,
  // region B (read-only) always.
  const std::vector<std::byte> b_before(b, b + kRegionBytes);
  const bool a_writable = tr::allows(a_access, tr::Access::Write);

  auto all_finished = [&] { return std::all_of(std::begin(reqs), std::end(reqs), [](auto& r) { return r.finished(); }); };
  auto deadline = Clock::now() + 5s;
  size_t off = 0;
  bool closed = false;
  std::vector<std::byte> sink(1 << 16);
  while (true) {
    while (off < stream.size()) {
      ssize_t w = ::send(rma_sock, stream.data() + off, stream.size() - off, MSG_NOSIGNAL);
      if (w > 0) {
        off += static_cast<size_t>(w);
        continue;
      }
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      off = stream.size();  // rank 1 closed on us
    }
    // Read (and drop) rank 1's requests and answers so it never blocks.
    while (::recv(rma_sock, sink.data(), sink.size(), MSG_DONTWAIT) > 0) {
    }
    if (!closed && Clock::now() > deadline) off = stream.size();
    if (off == stream.size() && !closed) {
      ::close(rma_sock);
      ::close(msg_sock);
      closed = true;
      deadline = Clock::now() + 5s;
    }
    (void)t->poll();
    int from = 0;
    uint64_t value = 0;
    for (;;) {  // notifications the harness sent: taken, nothing to check
      auto more = rma.takeNotification(&from, &value);
      if (!more.isOk() || !*more) break;
    }
    if (closed && all_finished()) break;
    if (Clock::now() > deadline) std::abort();  // an operation hangs after its peer closed
    t->wait(std::chrono::microseconds(closed ? 1000 : 100));
  }

  for (size_t i = 0; i < kGuard; ++i)
    if (mem[i] != kGuardByte || mem[kGuard + kRegionBytes + i] != kGuardByte ||
        mem[2 * kGuard + 2 * kRegionBytes + i] != kGuardByte)
      std::abort();  // a write outside a region
  if (std::memcmp(b, b_before.data(), kRegionBytes) != 0) std::abort();  // a put into a read-only region
  if (!a_writable && std::any_of(a, a + kRegionBytes, [](std::byte x) { return x != std::byte{1}; })) std::abort();
  t.reset();
  return 0;
}
