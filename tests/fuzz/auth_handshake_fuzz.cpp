// libFuzzer target: the job-secret handshake (bootstrap/auth.hpp) on
// arbitrary bytes, from both ends.
//
// The first input byte picks the mode; the rest is the peer's bytes:
//  0..1  server: ServerHandshakeMachine fed the bytes in pieces whose sizes
//        also come from the input (as a slow or chatty client delivers them);
//        mode 1 patches the client MAC to the correct one for whatever nonce
//        and hello the input holds, so the accepting path runs too.
//  2     client: clientHandshake on a socketpair whose other end has already
//        sent the bytes and shut down (a fake or hostile server).
//
// Properties checked: nothing reads or writes out of bounds (ASan/UBSan);
// consume() never accepts more than wanted(); a failure is sticky and leaves
// wanted() == 0; the machine completes only when the client MAC is right
// (never in mode 0: forging HMAC-SHA256 is out of the fuzzer's reach), and
// then the hello it returns is exactly the one the MAC covered and its proof
// is the server MAC for the two nonces; the client never accepts a server it
// cannot authenticate, and returns within its deadline.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "bootstrap/auth.hpp"

namespace {

using chorus::auth::Secret;

// The wire layout of auth.hpp, restated so the harness can build a valid MAC.
constexpr size_t kNonce = 32;
constexpr size_t kHead = kNonce + 2;
constexpr size_t kMac = 32;

Secret fixedSecret() {
  Secret s;
  for (size_t i = 0; i < s.bytes.size(); ++i) s.bytes[i] = std::byte(0x5a ^ i);
  s.present = true;
  return s;
}

std::span<const std::byte> label(const char* s) { return {reinterpret_cast<const std::byte*>(s), std::strlen(s)}; }

void fuzzServer(std::span<const std::byte> in, bool patch_mac) {
  const Secret secret = fixedSecret();
  chorus::auth::ServerHandshakeMachine m(secret, "fuzz peer");
  if (m.greeting().size() != 4 + 1 + kNonce) std::abort();
  std::span<const std::byte> nonce_s = m.greeting().subspan(5, kNonce);

  // The client message as the harness will deliver it.
  std::vector<std::byte> msg(in.begin(), in.end());
  size_t hello_len = 0;
  bool well_formed = false;
  if (msg.size() >= kHead) {
    hello_len = std::to_integer<size_t>(msg[kNonce]) | std::to_integer<size_t>(msg[kNonce + 1]) << 8;
    well_formed = hello_len <= chorus::auth::kMaxHello && msg.size() >= kHead + hello_len + kMac;
  }
  if (patch_mac && well_formed) {
    std::span<const std::byte> nonce_c(msg.data(), kNonce);
    std::span<const std::byte> hello(msg.data() + kHead, hello_len);
    const std::span<const std::byte> parts[] = {label("client"), nonce_s, nonce_c, hello};
    auto mac = chorus::auth::hmac(secret, parts);
    std::memcpy(msg.data() + kHead + hello_len, mac.data(), kMac);
  }

  // Deliver in pieces: each piece's size is taken from the next message byte
  // (mod 41), so the fuzzer explores splits across every field boundary.
  size_t off = 0, split_seed = 0;
  bool failed = false;
  while (!m.done() && off < msg.size()) {
    size_t want = m.wanted();
    if (want == 0) std::abort();  // neither done nor failed, yet wants nothing
    size_t piece = 1 + std::to_integer<size_t>(msg[split_seed++ % msg.size()]) % 41;
    piece = std::min({piece, want, msg.size() - off});
    chorus::Status s = m.consume(std::span(msg).subspan(off, piece));
    off += piece;
    if (!s.isOk()) {
      failed = true;
      if (m.wanted() != 0 || m.done()) std::abort();
      if (m.consume({}).isOk()) std::abort();  // failures are sticky
      break;
    }
  }
  // Offering more than wanted is refused, whatever the state.
  std::array<std::byte, 1> extra{};
  if (m.wanted() == 0 && m.consume(extra).isOk()) std::abort();

  if (m.done()) {
    if (failed || !well_formed || (!patch_mac && msg.size() < kHead + hello_len + kMac)) std::abort();
    std::span<const std::byte> nonce_c(msg.data(), kNonce);
    std::span<const std::byte> hello(msg.data() + kHead, hello_len);
    // Only a correct MAC completes the handshake.
    const std::span<const std::byte> cparts[] = {label("client"), nonce_s, nonce_c, hello};
    auto expect = chorus::auth::hmac(secret, cparts);
    if (std::memcmp(expect.data(), msg.data() + kHead + hello_len, kMac) != 0) std::abort();
    const std::span<const std::byte> sparts[] = {label("server"), nonce_c, nonce_s};
    auto proof = chorus::auth::hmac(secret, sparts);
    if (m.proof().size() != kMac || std::memcmp(proof.data(), m.proof().data(), kMac) != 0) std::abort();
    std::vector<std::byte> got = m.takeHello();
    if (got.size() != hello_len || !std::equal(got.begin(), got.end(), hello.begin())) std::abort();
  } else if (patch_mac && well_formed && !failed) {
    std::abort();  // a well-formed message with the right MAC must be accepted
  }
}

void fuzzClient(std::span<const std::byte> in) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
  // The input is capped (-max_len) well below the socket buffer, so this
  // write and the client's own never block.
  size_t n = std::min<size_t>(in.size(), 8192);
  if (n > 0 && ::write(sv[1], in.data(), n) != static_cast<ssize_t>(n)) std::abort();
  ::shutdown(sv[1], SHUT_WR);
  const std::array<std::byte, 8> hello{std::byte{1}, std::byte{2}};
  auto start = std::chrono::steady_clock::now();
  chorus::Status s = chorus::auth::clientHandshake(sv[0], fixedSecret(), hello, start + std::chrono::seconds(2));
  // The fake server never saw our nonce before it spoke, so it cannot have
  // produced a valid proof.
  if (s.isOk()) std::abort();
  if (std::chrono::steady_clock::now() - start > std::chrono::seconds(5)) std::abort();
  ::close(sv[0]);
  ::close(sv[1]);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0: fuzzServer(in, false); break;
    case 1: fuzzServer(in, true); break;
    default: fuzzClient(in); break;
  }
  return 0;
}
