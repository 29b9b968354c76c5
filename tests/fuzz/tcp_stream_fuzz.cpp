// libFuzzer target: the TCP transport's receive side (connection hello and
// frame stream, src/transport/tcp) fed by a hostile peer over loopback.
//
// Each input sets up a real TcpTransport for rank 1 of a 2-rank communicator;
// the harness plays rank 0 with raw sockets: it may first open a connection
// whose authenticated hello is taken from the input (a peer that knows the
// secret but lies about who it is), then connects properly, and writes the
// input's byte stream to the sockets while rank 1 has receives posted.
// Finally it closes its sockets.
//
// Input layout (all little endian, every field optional: a short input ends
// the layout early):
//   u8  cfg      bits 0-1: sockets per peer - 1 (1..3, mod 3); bit 6: rank 1's rendezvous
//                threshold 4 KiB instead of 64 KiB; bit 7: hostile hello first
//   [24 bytes]   the hostile hello, when bit 7 is set
//   u8  nrecv    1..4 receives (mod 4 + 1), then per receive:
//     u24 bytes  receive length (mod 600 KiB, so messages stripe across sockets)
//     u8  mode   0 copy, 1 int32 sum, 2 float32 max, 3 uint8 sum (reduce into dst)
//   records until the end: u8 ctl, u16 n, n bytes
//     ctl bits 0-1: socket index (mod sockets); bit 2: first write a frame
//     header whose length is receive ((ctl >> 4) & 3) % nrecv's length, or
//     with bit 3 also set a header with length n, and whose flags are, by
//     bits 6-7, 0 (data), kFlagRts, kFlagCts or kFlagData (the rendezvous
//     announcement, grant and payload headers); then the n bytes raw.
//
// Properties checked: the transport never writes outside a receive's buffer
// nor reads out of bounds (ASan on exact-size heap buffers), no UB (UBSan);
// setup succeeds whenever the hello is refused and fails never; a hello is
// acknowledged only if it is exactly valid; and once the peer has closed its
// sockets every posted receive finishes (done or failed) within 5 s: garbage
// never leaves a receive hanging.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/memory_store.hpp"
#include "common/log.hpp"
#include "kernels/reduce.hpp"
#include "transport/tcp/tcp.hpp"
#include "transport/tcp/tcp_wire.hpp"

namespace {

using namespace std::chrono_literals;
using chorus::Status;
using chorus::net::Clock;
namespace tcp = chorus::transport::tcp;
namespace tr = chorus::transport;

constexpr uint64_t kCommId = 0xf022f022;
constexpr size_t kMaxRecv = 600 << 10;

// Reads the input front to back; past the end every read yields zeros and
// sets `ended`, so a short input is a valid (shorter) test case.
struct Reader {
  std::span<const uint8_t> in;
  bool ended = false;
  uint64_t le(size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) {
      if (in.empty()) {
        ended = true;
        return v;
      }
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
  for (size_t i = 0; i < s.bytes.size(); ++i) s.bytes[i] = std::byte(0xc3 ^ i);
  s.present = true;
  return s;
}

// Connects to rank 1 and authenticates with `hello`.  Returns the socket, or
// -1 when the connection or the handshake failed; *acked tells whether rank 1
// acknowledged the hello.
int connectWithHello(const chorus::net::SockAddr& addr, std::span<const std::byte> hello, bool* acked) {
  *acked = false;
  auto deadline = Clock::now() + 5s;
  auto fd = chorus::net::connectTo(addr, deadline);
  if (!fd.isOk()) return -1;
  if (!chorus::auth::clientHandshake(fd->get(), secret(), hello, deadline).isOk()) return -1;
  uint32_t ack = 0;
  Status s = chorus::net::readAll(fd->get(), std::as_writable_bytes(std::span(&ack, 1)), deadline);
  *acked = s.isOk() && ack == tcp::kAck;
  return fd->release();
}

struct Recv {
  std::vector<std::byte> dst;  // exact size: ASan flags any write past it
  std::vector<std::byte> accum;
  chorus::kernels::Reducer reducer;
  tr::Request req;
  bool posted = false;
};

// With CHORUS_FUZZ_STATS=1 in the environment, how many receives completed
// and failed over the run is printed at exit: a check that the fuzzer does
// reach delivery, not only the error paths.
struct Stats {
  uint64_t done = 0, failed = 0;
  ~Stats() {
    if (std::getenv("CHORUS_FUZZ_STATS"))
      std::fprintf(stderr, "tcp_stream_fuzz: %llu receives done, %llu failed\n",
                   static_cast<unsigned long long>(done), static_cast<unsigned long long>(failed));
  }
};
Stats stats;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  chorus::log::setLevel(chorus::log::Level::None);  // rejected hellos are logged as warnings otherwise
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader rd{std::span(data, size)};
  uint8_t cfg = static_cast<uint8_t>(rd.le(1));
  const int nsockets = 1 + cfg % 4 % 3;
  const bool hostile = (cfg & 0x80) != 0;
  std::array<std::byte, sizeof(tcp::Hello)> bad_hello{};
  if (hostile) {
    auto b = rd.take(bad_hello.size());
    std::memcpy(bad_hello.data(), b.data(), b.size());
  }

  // Rank 1: the transport under test, set up on its own thread (setup blocks
  // until rank 0 has connected).
  chorus::bootstrap::MemoryStore store;
  chorus::transport::TcpSetup setup;
  setup.rank = 1;
  setup.peers = {0};
  setup.comm_id = kCommId;
  setup.secret = secret();
  setup.bind_addr = *chorus::net::resolve("127.0.0.1", 0);
  setup.sockets_per_peer = nsockets;
  setup.timeout = 10s;
  setup.rendezvous_bytes = (cfg & 0x40) != 0 ? 4096 : 65536;
  std::unique_ptr<tr::Transport> t;
  Status setup_status;
  std::thread setup_thread([&] {
    auto r = chorus::transport::createTcpTransport(setup, store);
    if (r.isOk()) t = std::move(*r);
    else setup_status = r.status();
  });

  // Rank 0, played by the harness.
  auto raw = store.get("tcp/1", 10s);
  if (!raw.isOk() || raw->size() != sizeof(chorus::net::SockAddr)) std::abort();
  chorus::net::SockAddr addr;
  std::memcpy(&addr, raw->data(), sizeof addr);
  std::vector<int> socks(static_cast<size_t>(nsockets), -1);
  if (hostile) {
    bool acked = false;
    int fd = connectWithHello(addr, bad_hello, &acked);
    tcp::Hello h;
    std::memcpy(&h, bad_hello.data(), sizeof h);
    bool valid = h.magic == tcp::kHelloMagic && h.comm_id == kCommId && h.rank == 0 && h.nsockets == nsockets &&
                 h.index >= 0 && h.index < nsockets;
    if (acked != valid) std::abort();  // a lying hello was acknowledged, or a true one refused
    if (acked) socks[static_cast<size_t>(h.index)] = fd;
    else if (fd >= 0) ::close(fd);
  }
  for (int k = 0; k < nsockets; ++k) {
    if (socks[static_cast<size_t>(k)] >= 0) continue;
    tcp::Hello h;
    h.comm_id = kCommId;
    h.rank = 0;
    h.index = k;
    h.nsockets = nsockets;
    bool acked = false;
    socks[static_cast<size_t>(k)] = connectWithHello(addr, std::as_bytes(std::span(&h, 1)), &acked);
    if (!acked) std::abort();  // the real peer must get in, whatever a stranger did before
  }
  setup_thread.join();
  if (!t) std::abort();  // setup must survive a refused stranger
  for (int fd : socks) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);

  // Post the receives.
  size_t nrecv = 1 + rd.le(1) % 4;
  std::vector<std::unique_ptr<Recv>> recvs;
  for (size_t i = 0; i < nrecv; ++i) {
    auto r = std::make_unique<Recv>();
    size_t bytes = rd.le(3) % kMaxRecv;
    uint8_t mode = static_cast<uint8_t>(rd.le(1) % 4);
    r->dst.resize(bytes);
    tr::RecvTarget target{r->dst.data(), bytes};
    if (mode != 0) {
      static constexpr chorusDataType_t kTypes[] = {chorusInt32, chorusFloat32, chorusUint8};
      static constexpr chorus::kernels::BinOp kOps[] = {chorus::kernels::BinOp::Sum, chorus::kernels::BinOp::Max,
                                                        chorus::kernels::BinOp::Sum};
      r->reducer = chorus::kernels::Reducer(kTypes[mode - 1], kOps[mode - 1]);
      r->accum.resize(bytes);
      target.accum = r->accum.data();
      target.reducer = &r->reducer;
    }
    // An invalid post (a length that is no whole number of elements) is
    // rejected up front; that is fine, the request then is not waited for.
    r->posted = t->postRecv(0, target, &r->req).isOk();
    if (r->posted && r->req.state.load() == tr::Request::Failed) r->posted = false;
    recvs.push_back(std::move(r));
  }

  // The stream, as (socket, bytes) pieces.
  struct Piece {
    int sock;
    std::vector<uint8_t> bytes;
  };
  std::vector<Piece> pieces;
  while (!rd.in.empty()) {
    uint8_t ctl = static_cast<uint8_t>(rd.le(1));
    size_t n = rd.le(2);
    Piece p{static_cast<int>(ctl & 3) % nsockets, {}};
    if (ctl & 4) {
      static constexpr uint32_t kFlags[] = {0, tcp::kFlagRts, tcp::kFlagCts, tcp::kFlagData};
      uint64_t len = (ctl & 8) ? n : recvs[((ctl >> 4) & 3) % nrecv]->dst.size();
      tcp::FrameHeader h{tcp::kFrameMagic, kFlags[ctl >> 6], len};
      auto* hb = reinterpret_cast<const uint8_t*>(&h);
      p.bytes.assign(hb, hb + sizeof h);
    }
    auto body = rd.take(n);
    p.bytes.insert(p.bytes.end(), body.begin(), body.end());
    pieces.push_back(std::move(p));
  }

  // Write everything, polling the transport in between so neither side's
  // buffers can fill up, then close; after that every receive must finish.
  auto all_finished = [&] {
    return std::all_of(recvs.begin(), recvs.end(), [](auto& r) { return !r->posted || r->req.finished(); });
  };
  auto deadline = Clock::now() + 5s;
  size_t piece = 0, off = 0;
  bool closed = false;
  while (true) {
    while (piece < pieces.size()) {
      Piece& p = pieces[piece];
      if (off == p.bytes.size()) {
        ++piece;
        off = 0;
        continue;
      }
      ssize_t w = ::send(socks[static_cast<size_t>(p.sock)], p.bytes.data() + off, p.bytes.size() - off, MSG_NOSIGNAL);
      if (w > 0) {
        off += static_cast<size_t>(w);
        continue;
      }
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;  // let the receiver drain
      piece = pieces.size();  // rank 1 closed on us (it found the stream corrupt): stop writing
    }
    // Inputs are capped (-max_len) below the loopback socket buffers, so
    // writing cannot stall; if it ever does, close and check as usual.
    if (!closed && Clock::now() > deadline) piece = pieces.size();
    if (piece == pieces.size() && !closed) {
      for (int& fd : socks) {
        ::close(fd);
        fd = -1;
      }
      closed = true;
      deadline = Clock::now() + 5s;
    }
    (void)t->poll();  // errors are expected; what matters is that requests finish
    if (closed && all_finished()) break;
    if (Clock::now() > deadline) std::abort();  // a receive hangs after its peer closed
    t->wait(std::chrono::microseconds(closed ? 1000 : 100));
  }
  for (auto& r : recvs)
    if (r->posted) ++(r->req.state.load() == tr::Request::Done ? stats.done : stats.failed);
  t.reset();  // the transport closes its sockets; requests are all finished
  return 0;
}
