// Integrity and optional confidentiality for a connection's bytes after the
// job-secret handshake (CHORUS_WIRE_PROTECT=off|mac|encrypt; docs/security.md).
//
// Keys: the handshake (auth.hpp) ends with both sides knowing the job secret
// and both fresh nonces; each derives two 32-byte keys with HKDF-SHA256
// (key = the secret, salt = nonce_c | nonce_s, info = "chorus wire v1 c2s" /
// "... s2c"), one per direction, so every connection and direction has keys
// of its own and a recorded session is useless on another connection.
//
// Records: the byte stream is cut into records of at most kMaxRecord bytes:
//   length u32 (little endian, 1..kMaxRecord) | body[length] | tag[16]
// sealed with AES-256-GCM under the direction's key, the nonce being the
// record's sequence number in this direction (8 bytes little endian, then 4
// zero bytes) and the length the additional data.  `encrypt`: the body is the
// ciphertext.  `mac`: the body is the plaintext, authenticated as additional
// data (GMAC), so it is readable on the wire but cannot be changed.  Both
// ends count records, so a changed, dropped, replayed or reordered record
// fails its tag: the stream reports EBADMSG and the connection is broken
// with an error naming the peer, never a wrong result.
//
// SealedStream is the record layer over one non-blocking socket, with the
// semantics of readv/sendmsg so a transport can call it in their place:
//  - writev() takes plaintext: it first flushes sealed bytes still pending;
//    then seals what it can and sends; bytes it returns as taken are sealed
//    and will go out on later writev()/flush() calls (outPending() says so:
//    the caller must keep asking for POLLOUT until it is false);
//  - readv() gives plaintext from verified records only; what it read ahead
//    stays buffered (inBuffered(): readable without the socket).
// Single-threaded, one per socket.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bootstrap/auth.hpp"
#include "common/config.hpp"
#include "common/status.hpp"

namespace chorus::auth {

using WireProtect = ::chorus::WireProtect;

Result<WireProtect> parseWireProtect(std::string_view text);  // "off", "mac", "encrypt"
std::string_view wireProtectName(WireProtect p);

// One direction's keys of a connection.
struct SessionKeys {
  std::array<std::byte, 32> send{};
  std::array<std::byte, 32> recv{};
  bool valid = false;
};

// HKDF of the handshake's inputs (see above); `client` picks which key is
// which on this end.
SessionKeys deriveSessionKeys(const Secret& secret, std::span<const std::byte> nonce_c,
                              std::span<const std::byte> nonce_s, bool client);

// Keys of one pair of message endpoints that are not one connection (the
// UCX transport: one pair of ranks, its handshake's two authenticated
// nonces).  HKDF-SHA256 as above, with salt = nonce_a | nonce_b and info
// "chorus wire v1 msg a2b" / "... b2a" followed by `context` (what names the
// pair: transport, communicator, ranks), so keys of different pairs,
// communicators and transports never coincide.  `a`: this end is the one
// whose nonce is nonce_a (its send key is a2b).
SessionKeys deriveMessageKeys(const Secret& secret, std::span<const std::byte> nonce_a,
                              std::span<const std::byte> nonce_b, std::span<const std::byte> context, bool a);

// Message-level protection, for a transport whose messages arrive whole and
// each in a known place of a known stream (the UCX transport: a tagged
// message of sequence k on channel c).  Each message is sealed on its own
// with AES-256-GCM under the direction's key; the nonce is (stream u32,
// sequence u64), which the receiver takes from where it expects the message,
// never from the message: a message replayed, reordered, moved to another
// stream or sealed under other keys fails its tag.  A message is a `clear`
// part (authenticated only: headers the receiver parses first) and a `body`
// (encrypted with `encrypt`, authenticated as additional data with `mac`),
// then a 16-byte tag.  The caller never uses a (stream, sequence) twice
// under one key (GCM's requirement).  Not thread-safe: one per direction.
class MessageSealer {
 public:
  static constexpr size_t kTagBytes = 16;
  // GCM's limit on one message's encrypted bytes (2^39 - 256 bits).
  static constexpr uint64_t kMaxBody = (uint64_t{1} << 36) - 32;

  MessageSealer(WireProtect mode, const std::array<std::byte, 32>& key, bool sealing);
  ~MessageSealer();
  MessageSealer(const MessageSealer&) = delete;
  MessageSealer& operator=(const MessageSealer&) = delete;

  [[nodiscard]] WireProtect mode() const { return mode_; }

  // Seals one message.  `encrypt`: body_out (body.size() bytes; may be
  // body.data() itself) gets the ciphertext; `mac`: body_out is not used.
  // False on a libcrypto failure or a body over kMaxBody.
  bool seal(uint32_t stream, uint64_t seq, std::span<const std::byte> clear, std::span<const std::byte> body,
            std::byte* body_out, std::byte* tag);
  // Opens one message: true when its tag verifies.  `encrypt`: body_out
  // (may be body.data()) gets the plaintext, wiped when the tag fails; `mac`:
  // body_out is not used, the body is the plaintext.
  bool open(uint32_t stream, uint64_t seq, std::span<const std::byte> clear, std::span<const std::byte> body,
            std::byte* body_out, const std::byte* tag);

 private:
  struct Ctx;
  WireProtect mode_;
  bool sealing_;
  std::unique_ptr<Ctx> ctx_;
};

class SealedStream {
 public:
  static constexpr size_t kMaxRecord = 64 * 1024;
  static constexpr size_t kOverhead = 4 + 16;

  SealedStream(WireProtect mode, const SessionKeys& keys);
  ~SealedStream();
  SealedStream(const SealedStream&) = delete;
  SealedStream& operator=(const SealedStream&) = delete;

  [[nodiscard]] WireProtect mode() const { return mode_; }

  // As sendmsg(MSG_DONTWAIT): plaintext bytes taken (sealed), or -1 with
  // errno (EAGAIN: nothing taken; EPIPE, ECONNRESET, ...).
  ssize_t writev(int fd, const iovec* iov, int cnt);
  // Sends pending sealed bytes: 1 when none remain, 0 when the socket is
  // full, -1 with errno on an error.
  int flush(int fd);
  [[nodiscard]] bool outPending() const { return out_off_ < out_.size(); }

  // As readv: plaintext bytes, 0 at the end of the stream (a clean end, at a
  // record boundary), or -1 with errno (EAGAIN; EBADMSG: a record failed
  // its check, error() says which; EPROTO: a malformed or truncated record).
  ssize_t readv(int fd, const iovec* iov, int cnt);
  // Plaintext or a whole record waits in the buffer: readv() can return
  // data without the socket being readable.
  [[nodiscard]] bool inBuffered() const;
  // Copies up to out.size() plaintext bytes that readv() would return next,
  // without consuming them (reads and verifies at most what the socket has
  // now).  For looking at an abort frame before a connection is failed.
  size_t peek(int fd, std::span<std::byte> out);

  // What the last EBADMSG/EPROTO was.
  [[nodiscard]] const std::string& error() const { return error_; }
  [[nodiscard]] uint64_t recordsSent() const { return send_seq_; }
  [[nodiscard]] uint64_t recordsReceived() const { return recv_seq_; }

 private:
  struct Cipher;
  bool seal(const iovec* iov, int cnt, size_t skip, size_t take);
  // Reads from fd into in_ (up to what fits); -1/errno on error, 0 on EOF, else 1.
  int fill(int fd);
  // Opens the record at the head of in_ when it is whole, into `into` (room
  // for the record's plaintext) or, when null, into plain_: 1 opened, 0 not
  // whole, -1 bad (errno set).
  int openOne(std::byte* into = nullptr);
  // The plaintext length of the record at the head of in_ if it is whole and
  // well-formed, else 0.
  [[nodiscard]] size_t wholeRecord() const;

  WireProtect mode_;
  std::unique_ptr<Cipher> tx_, rx_;
  uint64_t send_seq_ = 0, recv_seq_ = 0;
  std::vector<std::byte> out_;  // sealed, not yet sent
  size_t out_off_ = 0;
  std::vector<std::byte> in_;  // raw bytes read, not yet opened
  size_t in_off_ = 0, in_len_ = 0;
  std::vector<std::byte> plain_;  // opened, not yet returned
  size_t plain_off_ = 0, plain_len_ = 0;
  bool eof_ = false;
  bool broken_ = false;
  int broken_errno_ = 0;
  std::string error_;
};

}  // namespace chorus::auth
