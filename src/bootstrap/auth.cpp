// Job-secret handshake (wire format in auth.hpp).  hello_len is little endian.
//
// Every read has a fixed size known before it is issued (the only variable
// length, hello_len, is bounds-checked against kMaxHello first), and every
// read and write runs against the caller's deadline, so a garbage, slow or
// silent peer costs at most one deadline and never an unbounded allocation.
// The "client"/"server" labels in the MACs stop a reflection attack (echoing
// the server's own proof back to it), and the fresh nonces from both sides
// stop replay of a recorded handshake.
#include "bootstrap/auth.hpp"

#include "bootstrap/wire_protect.hpp"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/random.h>

#include <algorithm>
#include <cstring>
#include <thread>

namespace chorus::auth {
namespace {

constexpr char kMagic[4] = {'C', 'H', 'R', 'S'};
constexpr uint8_t kVersion = 1;
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
constexpr size_t kServerHelloBytes = sizeof kMagic + 1 + kNonceBytes;     // 37
constexpr size_t kClientHeadBytes = kNonceBytes + 2;                       // nonce_c | hello_len
constexpr std::string_view kHint = "do all ranks use the same CHORUS_SECRET / unique id?";

using Nonce = std::array<std::byte, kNonceBytes>;

// OpenSSL frees its state in an atexit handler unless told not to.  The
// library's background threads may still draw nonces while a process exits:
// a rank whose main returned while strangers still knock on its store has
// the store's gate answering them, and RAND_bytes then runs on freed locks
// (SIGSEGV; caught in cluster.netns_strangers' flood job, a core's backtrace:
// exit -> OPENSSL_cleanup in one thread, Gate::acceptReady -> RAND_bytes in
// the other).  Initialised here, before the library's first OpenSSL call,
// without that handler: the OS reclaims the memory at exit anyway.
[[maybe_unused]] const bool kOpenSslWithoutAtexit = OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr) == 1;

std::string peerName(int fd) {
  net::SockAddr a;
  a.len = sizeof a.ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a.ss), &a.len) != 0) return "<unknown peer>";
  return a.toString();
}

// Fills `out` from the CSPRNG.  OpenSSL first; the kernel's getrandom() if
// OpenSSL's DRBG cannot be seeded (it uses the same source, so this only
// changes which layer reports the failure).
bool fillRandom(std::span<std::byte> out) {
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(out.size())) == 1) return true;
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::getrandom(out.data() + done, out.size() - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

// An I/O failure during the handshake: a timeout keeps its code (callers
// retry or report differently), anything else is an authentication failure.
Status handshakeIoError(const Status& s, std::string_view side, const std::string& peer) {
  if (s.code() == chorusTimeout)
    return makeError(chorusTimeout, "authentication ({}) with {} did not complete before the deadline: {}", side, peer,
                     s.message());
  return remoteError("authentication failed ({}) with {}: {} ({})", side, peer, s.message(), kHint);
}

std::span<const std::byte> asBytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

}  // namespace

Secret Secret::random() {
  Secret s;
  // fillRandom fails only when the kernel refuses randomness; a zero key
  // marked present would silently weaken the job, so report absence instead.
  s.present = fillRandom(s.bytes);
  if (!s.present) s.bytes.fill(std::byte{0});
  return s;
}

Result<Secret> Secret::fromHex(std::string_view hex) {
  if (hex.size() != 2 * kSecretBytes)
    return invalidArgument("job secret must be {} hex characters, got {} (generate one with `openssl rand -hex {}`)",
                           2 * kSecretBytes, hex.size(), kSecretBytes);
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  Secret s;
  for (size_t i = 0; i < kSecretBytes; ++i) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return invalidArgument("job secret has a non-hex character at position {} (expected 0-9, a-f)",
                             hi < 0 ? 2 * i : 2 * i + 1);
    s.bytes[i] = static_cast<std::byte>(hi << 4 | lo);
  }
  s.present = true;
  return s;
}

std::string Secret::toHex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * kSecretBytes);
  for (std::byte b : bytes) {
    out.push_back(kDigits[std::to_integer<unsigned>(b) >> 4]);
    out.push_back(kDigits[std::to_integer<unsigned>(b) & 0xf]);
  }
  return out;
}

std::array<std::byte, 32> hmac(const Secret& secret, std::span<const std::span<const std::byte>> parts) {
  // The fetched algorithm is immutable and reference counted; fetching it once
  // avoids a provider lookup per handshake.
  static EVP_MAC* const kMac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  std::array<std::byte, 32> out{};
  std::array<std::byte, kSecretBytes> key{};
  if (secret.present) key = secret.bytes;
  EVP_MAC_CTX* ctx = kMac ? EVP_MAC_CTX_new(kMac) : nullptr;
  bool ok = ctx != nullptr;
  if (ok) {
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_construct_end()};
    ok = EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key.data()), key.size(), params) == 1;
    for (auto p : parts)
      if (ok) ok = EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(p.data()), p.size()) == 1;
    size_t len = 0;
    if (ok) ok = EVP_MAC_final(ctx, reinterpret_cast<unsigned char*>(out.data()), &len, out.size()) == 1 && len == 32;
  }
  EVP_MAC_CTX_free(ctx);
  OPENSSL_cleanse(key.data(), key.size());
  // On an (unexpected) libcrypto failure, return a random value: it matches
  // no peer's MAC, so the handshake fails closed instead of accepting.
  if (!ok) fillRandom(out);
  return out;
}

bool equalMac(std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

ServerHandshakeMachine::ServerHandshakeMachine(const Secret& secret, std::string peer)
    : key_present_(secret.present), peer_(std::move(peer)), need_(kClientHeadBytes) {
  if (secret.present) key_ = secret.bytes;
  Nonce nonce_s;
  if (!fillRandom(nonce_s)) failed_ = systemError("authentication: cannot draw a random nonce (getrandom failed)");
  greeting_.resize(kServerHelloBytes);
  std::memcpy(greeting_.data(), kMagic, sizeof kMagic);
  greeting_[4] = std::byte{kVersion};
  std::memcpy(greeting_.data() + 5, nonce_s.data(), kNonceBytes);
  buf_.reserve(kClientHeadBytes);
}

ServerHandshakeMachine::~ServerHandshakeMachine() { OPENSSL_cleanse(key_.data(), key_.size()); }

size_t ServerHandshakeMachine::wanted() const {
  if (done_ || !failed_.isOk()) return 0;
  return need_ - buf_.size();
}

Status ServerHandshakeMachine::consume(std::span<const std::byte> data) {
  if (!failed_.isOk()) return failed_;
  if (data.size() > wanted())
    return invalidUsage("ServerHandshakeMachine::consume: {} bytes offered but only {} wanted", data.size(), wanted());
  buf_.insert(buf_.end(), data.begin(), data.end());
  if (buf_.size() < need_) return {};
  if (need_ == kClientHeadBytes) {
    size_t hello_len =
        std::to_integer<size_t>(buf_[kNonceBytes]) | std::to_integer<size_t>(buf_[kNonceBytes + 1]) << 8;
    if (hello_len > kMaxHello) {
      failed_ = remoteError(
          "authentication failed (server) with {}: hello of {} bytes exceeds the limit of {} (not a chorus peer, or a "
          "different chorus version? {})",
          peer_, hello_len, kMaxHello, kHint);
      return failed_;
    }
    need_ = kClientHeadBytes + hello_len + kMacBytes;
    buf_.reserve(need_);
    return {};
  }
  // The whole client message is here: nonce_c | hello_len | hello | mac_c.
  Secret secret;
  secret.bytes = key_;
  secret.present = key_present_;
  std::span<const std::byte> nonce_s(greeting_.data() + 5, kNonceBytes);
  std::span<const std::byte> nonce_c(buf_.data(), kNonceBytes);
  std::span<const std::byte> hello(buf_.data() + kClientHeadBytes, need_ - kClientHeadBytes - kMacBytes);
  std::span<const std::byte> mac_c(buf_.data() + need_ - kMacBytes, kMacBytes);
  const std::span<const std::byte> client_parts[] = {asBytes("client"), nonce_s, nonce_c, hello};
  auto expect = hmac(secret, client_parts);
  bool ok = equalMac(expect, mac_c);
  if (ok) {
    const std::span<const std::byte> server_parts[] = {asBytes("server"), nonce_c, nonce_s};
    proof_ = hmac(secret, server_parts);
    hello_.assign(hello.begin(), hello.end());
    std::memcpy(nonce_c_.data(), nonce_c.data(), kNonceBytes);
  }
  OPENSSL_cleanse(secret.bytes.data(), secret.bytes.size());
  if (!ok) {
    failed_ = remoteError("authentication failed (server): peer {} did not prove the job secret ({})", peer_, kHint);
    return failed_;
  }
  done_ = true;
  return {};
}

SessionKeys ServerHandshakeMachine::sessionKeys() const {
  if (!done_) return {};
  Secret secret;
  secret.bytes = key_;
  secret.present = key_present_;
  SessionKeys k =
      deriveSessionKeys(secret, nonce_c_, std::span<const std::byte>(greeting_.data() + 5, kNonceBytes), false);
  OPENSSL_cleanse(secret.bytes.data(), secret.bytes.size());
  return k;
}

Result<std::vector<std::byte>> serverHandshake(int fd, const Secret& secret, net::Clock::time_point deadline) {
  ServerHandshakeMachine m(secret, peerName(fd));
  CHORUS_RETURN_IF_ERROR(m.consume({}));  // reports a failed nonce draw
  if (Status s = net::writeAll(fd, m.greeting(), deadline); !s.isOk())
    return handshakeIoError(s, "server", peerName(fd));
  std::vector<std::byte> buf;
  while (!m.done()) {
    buf.resize(m.wanted());
    if (Status s = net::readAll(fd, buf, deadline); !s.isOk()) return handshakeIoError(s, "server", peerName(fd));
    CHORUS_RETURN_IF_ERROR(m.consume(buf));
  }
  if (Status s = net::writeAll(fd, m.proof(), deadline); !s.isOk())
    return handshakeIoError(s, "server", peerName(fd));
  return m.takeHello();
}

bool serverBusy(const Status& s) { return s.code() == chorusInProgress; }

Status retryWhileBusy(net::Clock::time_point deadline, const std::function<Status()>& attempt) {
  Status s = attempt();
  for (int n = 0; serverBusy(s) && net::Clock::now() < deadline; ++n) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(1 << std::min(n, 6), 50)));
    s = attempt();
  }
  return s;
}

Status clientHandshake(int fd, const Secret& secret, std::span<const std::byte> hello,
                       net::Clock::time_point deadline, SessionKeys* keys) {
  if (hello.size() > kMaxHello)
    return invalidArgument("authentication hello of {} bytes exceeds the limit of {}", hello.size(), kMaxHello);
  const std::string peer = peerName(fd);

  std::array<std::byte, kServerHelloBytes> first;
  if (Status s = net::readAll(fd, first, deadline); !s.isOk()) return handshakeIoError(s, "client", peer);
  if (std::memcmp(first.data(), kMagic, sizeof kMagic) != 0 || first[4] != std::byte{kVersion})
    return remoteError("authentication failed (client): {} is not a chorus endpoint or speaks another handshake "
                       "version (got version {}, expected {}); check the address and that all ranks run the same "
                       "chorus",
                       peer, std::to_integer<int>(first[4]), kVersion);
  Nonce nonce_s, nonce_c;
  std::memcpy(nonce_s.data(), first.data() + 5, kNonceBytes);
  if (!fillRandom(nonce_c)) return systemError("authentication: cannot draw a random nonce (getrandom failed)");

  const std::span<const std::byte> client_parts[] = {asBytes("client"), nonce_s, nonce_c, hello};
  auto mac_c = hmac(secret, client_parts);
  // One write: the server reads fixed-size pieces, the split does not matter,
  // but one segment keeps the handshake to a single round trip on the wire.
  std::vector<std::byte> msg;
  msg.reserve(kClientHeadBytes + hello.size() + kMacBytes);
  msg.insert(msg.end(), nonce_c.begin(), nonce_c.end());
  msg.push_back(static_cast<std::byte>(hello.size() & 0xff));
  msg.push_back(static_cast<std::byte>(hello.size() >> 8));
  msg.insert(msg.end(), hello.begin(), hello.end());
  msg.insert(msg.end(), mac_c.begin(), mac_c.end());
  if (Status s = net::writeAll(fd, msg, deadline); !s.isOk()) return handshakeIoError(s, "client", peer);

  std::array<std::byte, kMacBytes> mac_s;
  if (Status s = net::readAll(fd, mac_s, deadline); !s.isOk()) {
    // The server closes without answering when our MAC was wrong.
    if (s.code() == chorusRemoteError)
      return remoteError("authentication failed (client): {} closed the connection instead of accepting our proof "
                         "of the job secret ({})",
                         peer, kHint);
    return handshakeIoError(s, "client", peer);
  }
  if (std::all_of(mac_s.begin(), mac_s.end(), [](std::byte b) { return b == kBusyByte; }))
    return makeError(chorusInProgress, "{} is busy (too many unauthenticated connections): connect again", peer);
  const std::span<const std::byte> server_parts[] = {asBytes("server"), nonce_c, nonce_s};
  auto expect = hmac(secret, server_parts);
  if (!equalMac(expect, mac_s))
    return remoteError("authentication failed (client): {} did not prove the job secret ({})", peer, kHint);
  if (keys != nullptr) *keys = deriveSessionKeys(secret, nonce_c, nonce_s, true);
  return {};
}

}  // namespace chorus::auth
