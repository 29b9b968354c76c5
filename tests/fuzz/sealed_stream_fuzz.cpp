// libFuzzer target: the record layer of CHORUS_WIRE_PROTECT
// (src/bootstrap/wire_protect.hpp) reading what an on-path attacker sends.
//
// Input: u8 cfg (bit 0: encrypt, else mac; bit 1: raw), then
//   raw:     the bytes the receiver reads, as they are (garbage, lengths out
//            of range, truncated records);
//   sealed:  u8 nchunks (1..8), u16 per chunk (its plaintext length, mod
//            20000), then u8 nflips and per flip u16 offset, u8 xor; the
//            plaintext is the rest of the input repeated.  The harness seals
//            the chunks with the sender's keys, applies the flips to the
//            bytes on the wire, and feeds them to the receiver.
// The receiver reads with iovec sizes taken from the input, to the end.
//
// Properties: no crash, no out-of-bounds access (ASan), no UB (UBSan); every
// plaintext byte the receiver returns equals the sender's byte at that
// position; and when a flip changed a byte of the wire, the stream ends in
// an error (EBADMSG or EPROTO), never in a clean end with all bytes
// delivered.
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bootstrap/socket.hpp"
#include "bootstrap/wire_protect.hpp"

namespace {

using chorus::auth::SealedStream;
using chorus::auth::WireProtect;

chorus::auth::SessionKeys keys(bool client) {
  chorus::auth::Secret s;
  for (size_t i = 0; i < s.bytes.size(); ++i) s.bytes[i] = std::byte(i * 3 + 1);
  s.present = true;
  std::byte nc[32] = {}, ns[32] = {};
  for (size_t i = 0; i < 32; ++i) nc[i] = std::byte(i), ns[i] = std::byte(255 - i);
  return chorus::auth::deriveSessionKeys(s, nc, ns, client);
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "sealed_stream_fuzz: %s\n", what);
  std::abort();
}

struct Reader {
  const uint8_t* p;
  size_t n;
  uint32_t u8() { return n > 0 ? (--n, *p++) : 0; }
  uint32_t u16() { return u8() | u8() << 8; }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Reader in{data + 1, size - 1};
  const WireProtect mode = data[0] & 1 ? WireProtect::kEncrypt : WireProtect::kMac;
  const bool raw = data[0] & 2;

  std::vector<std::byte> wire, plain;
  size_t first_flip = SIZE_MAX;  // wire offset of the first changed byte
  if (raw) {
    wire.assign(reinterpret_cast<const std::byte*>(in.p), reinterpret_cast<const std::byte*>(in.p) + in.n);
  } else {
    int a[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, a) != 0) return 0;
    SealedStream tx(mode, keys(true));
    const uint32_t nchunks = in.u8() % 8 + 1;
    std::vector<size_t> lens;
    for (uint32_t i = 0; i < nchunks; ++i) lens.push_back(in.u16() % 20000);
    const uint32_t nflips = in.u8() % 8;
    std::vector<std::pair<size_t, uint8_t>> flips;
    for (uint32_t i = 0; i < nflips; ++i) flips.emplace_back(in.u16(), static_cast<uint8_t>(in.u8()));
    for (size_t len : lens) {
      std::vector<std::byte> chunk(len);
      for (size_t i = 0; i < len; ++i) chunk[i] = in.n > 0 ? std::byte(in.p[i % in.n]) : std::byte(i);
      iovec iov{chunk.data(), chunk.size()};
      size_t off = 0;
      while (off < len) {  // the pair's buffer may fill: drain it into `wire`
        iov = {chunk.data() + off, len - off};
        ssize_t w = tx.writev(a[0], &iov, 1);
        if (w > 0) off += static_cast<size_t>(w);
        std::byte buf[65536];
        ssize_t r;
        while ((r = ::recv(a[1], buf, sizeof buf, MSG_DONTWAIT)) > 0) wire.insert(wire.end(), buf, buf + r);
      }
      plain.insert(plain.end(), chunk.begin(), chunk.end());
    }
    while (tx.outPending()) {
      (void)tx.flush(a[0]);
      std::byte buf[65536];
      ssize_t r;
      while ((r = ::recv(a[1], buf, sizeof buf, MSG_DONTWAIT)) > 0) wire.insert(wire.end(), buf, buf + r);
    }
    ::close(a[0]);
    ::close(a[1]);
    const std::vector<std::byte> sent = wire;
    for (auto [at, x] : flips)
      if (at < wire.size()) wire[at] ^= std::byte(x);
    // Flips of one byte may cancel out: what counts is what differs.
    for (size_t i = 0; i < wire.size() && first_flip == SIZE_MAX; ++i)
      if (wire[i] != sent[i]) first_flip = i;
  }

  // Feed the receiver through a pair it reads from (the writer closes at the end).
  int b[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, b) != 0) return 0;
  (void)chorus::net::setNonBlocking(b[1], true);
  SealedStream rx(mode, keys(false));
  std::vector<std::byte> got;
  size_t fed = 0;
  int end_errno = 0;
  bool clean_end = false;
  std::vector<std::byte> buf(70000);
  for (int guard = 0; guard < 100000; ++guard) {
    if (fed < wire.size()) {
      ssize_t w = ::send(b[0], wire.data() + fed, std::min<size_t>(wire.size() - fed, 4096), MSG_DONTWAIT);
      if (w > 0) fed += static_cast<size_t>(w);
      if (fed == wire.size()) ::shutdown(b[0], SHUT_WR);
    } else if (wire.empty() && fed == 0) {
      ::shutdown(b[0], SHUT_WR);
    }
    const size_t ask = 1 + (guard * 7919 + 13) % buf.size();
    iovec iov[2] = {{buf.data(), ask / 3}, {buf.data() + ask / 3, ask - ask / 3}};
    ssize_t n = rx.readv(b[1], iov, 2);
    if (n > 0) {
      got.insert(got.end(), buf.begin(), buf.begin() + n);
      continue;
    }
    if (n == 0) {
      clean_end = true;
      break;
    }
    if (errno == EAGAIN) continue;
    end_errno = errno;
    break;
  }
  ::close(b[0]);
  ::close(b[1]);

  if (!raw) {
    if (got.size() > plain.size() || (!got.empty() && std::memcmp(got.data(), plain.data(), got.size()) != 0))
      fail("returned plaintext that differs from what was sealed");
    if (first_flip != SIZE_MAX && clean_end && got.size() == plain.size())
      fail("a changed byte on the wire ended in a clean stream with every byte delivered");
    if (first_flip == SIZE_MAX && (end_errno != 0 || got.size() != plain.size()))
      fail("an untouched stream did not deliver its plaintext");
  } else if (clean_end && !wire.empty() && got.empty() && end_errno == 0) {
    // Raw bytes: a clean end with nothing delivered means the input held no
    // bytes of a record, which only an empty input can do.
    fail("raw bytes vanished without an error");
  }
  return 0;
}
