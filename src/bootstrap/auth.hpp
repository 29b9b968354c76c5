// Job-secret authentication: every store and data connection proves that
// both ends know the job secret, with an HMAC-SHA256 challenge-response
// (libcrypto).  Fresh nonces from both sides make a recorded handshake useless
// on a new connection (no replay).
//
// Wire (all fixed sizes, so a garbage or slow peer is rejected by bounds and
// by the deadline, never by trusting a length it sent):
//   server -> client: "CHRS" | version u8 | nonce_s[32]
//   client -> server: nonce_c[32] | hello_len u16 | hello[hello_len <= 256] |
//                     mac_c = HMAC(secret, "client" | nonce_s | nonce_c | hello)
//   server -> client: mac_s = HMAC(secret, "server" | nonce_c | nonce_s)
// The hello is an authenticated payload (the TCP transport sends its rank and
// communicator id in it).  Without a secret (unauthenticated env init) the
// MACs are computed with an all-zero key: the handshake still runs, so the
// wire format is one.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "bootstrap/socket.hpp"
#include "common/status.hpp"

namespace chorus::auth {

constexpr size_t kSecretBytes = 32;
constexpr size_t kMaxHello = 256;

struct Secret {
  std::array<std::byte, kSecretBytes> bytes{};
  bool present = false;  // false: unauthenticated job (zero key)

  static Secret random();  // from the OS CSPRNG
  // From 64 hex characters (CHORUS_SECRET).
  static Result<Secret> fromHex(std::string_view hex);
  [[nodiscard]] std::string toHex() const;
};

// Run on an accepted connection.  Returns the client's authenticated hello.
// Fails (chorusRemoteError "authentication failed ...", or chorusTimeout) on a
// wrong MAC, malformed data, or when the deadline passes.
Result<std::vector<std::byte>> serverHandshake(int fd, const Secret& secret, net::Clock::time_point deadline);

// This end's keys for the connection's later bytes (wire_protect.hpp),
// derived from the secret and both nonces.
struct SessionKeys;

// What a server that must drop a connection before its handshake completes
// (auth::Gate, under a flood of unauthenticated connections) writes in place
// of its proof: 32 bytes of 0xff (a real proof is an HMAC: never this).  The
// client then reports chorusInProgress, and connect loops retry.  A stranger
// can send it too, which only costs the client a retry.
constexpr std::byte kBusyByte{0xff};
constexpr size_t kBusyBytes = 32;
// The handshake failed because the server was busy: connect again.
bool serverBusy(const Status& s);
// Runs `attempt` (a connect and its client handshake) again while it ends in
// serverBusy and the deadline has not passed, pausing 1, 2, 4 ... 50 ms
// between tries; returns the last attempt's status.
Status retryWhileBusy(net::Clock::time_point deadline, const std::function<Status()>& attempt);

// Run on a connected socket.  Fails if the server does not prove the secret;
// chorusInProgress (serverBusy) when the server dropped it for being busy.
// With `keys`, also derives this (client) end's session keys.
Status clientHandshake(int fd, const Secret& secret, std::span<const std::byte> hello,
                       net::Clock::time_point deadline, SessionKeys* keys = nullptr);

// The server side of the handshake as a state machine, for event loops that
// must not block on one peer (the store server serves many clients on one
// thread).  The caller moves the bytes: send greeting(); then, while !done(),
// read exactly wanted() bytes (or fewer, repeatedly) and consume() them; then
// send proof().  serverHandshake() is this machine driven by blocking I/O, so
// there is one implementation of the protocol.  Single-threaded use.
class ServerHandshakeMachine {
 public:
  // `peer` is only used in error messages.
  ServerHandshakeMachine(const Secret& secret, std::string peer);
  ~ServerHandshakeMachine();
  ServerHandshakeMachine(const ServerHandshakeMachine&) = delete;
  ServerHandshakeMachine& operator=(const ServerHandshakeMachine&) = delete;

  [[nodiscard]] std::span<const std::byte> greeting() const { return greeting_; }
  // Bytes still needed before the next step; 0 when done or failed.
  [[nodiscard]] size_t wanted() const;
  // Feeds received bytes; more than wanted() is an invalid-usage error.
  // Returns the failure (authentication failed ...) once the data is bad;
  // after a failure every call returns it again.
  Status consume(std::span<const std::byte> data);
  [[nodiscard]] bool done() const { return done_; }
  // The server's proof to send once done().
  [[nodiscard]] std::span<const std::byte> proof() const { return proof_; }
  // The client's authenticated hello, once done().
  std::vector<std::byte> takeHello() { return std::move(hello_); }
  // This (server) end's session keys, once done().
  [[nodiscard]] SessionKeys sessionKeys() const;

 private:
  std::array<std::byte, kSecretBytes> key_{};
  bool key_present_ = false;
  std::string peer_;
  std::vector<std::byte> greeting_;  // "CHRS" | version | nonce_s
  std::vector<std::byte> buf_;       // client bytes received so far
  size_t need_ = 0;                  // total client bytes needed for the current step
  bool done_ = false;
  Status failed_;
  std::array<std::byte, 32> proof_{};
  std::vector<std::byte> hello_;
  std::array<std::byte, 32> nonce_c_{};
};

// HMAC-SHA256 of the concatenated parts (exposed for tests and the fuzzers).
std::array<std::byte, 32> hmac(const Secret& secret, std::span<const std::span<const std::byte>> parts);
// Constant-time comparison.
bool equalMac(std::span<const std::byte> a, std::span<const std::byte> b);

}  // namespace chorus::auth
