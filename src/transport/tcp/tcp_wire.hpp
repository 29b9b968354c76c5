// Private to the TCP transport: wire records, the striping layout both ends
// compute, and a reusable FIFO.  tcp_transport.cpp documents the frame format,
// tcp_setup.cpp the connection protocol.
#pragma once

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace chorus::transport::tcp {

// Records go on the wire in host byte order; every supported host is little
// endian, and the static_assert keeps a big-endian port from silently
// speaking a different protocol.
static_assert(std::endian::native == std::endian::little, "the TCP wire format assumes a little-endian host");

constexpr uint32_t kFrameMagic = 0x31465443;  // "CTF1"
constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 48;
// The sender aborted its communicator: the payload (length <= kMaxAbortReason)
// is the reason, as text, and the connection closes after it.  Sent only at a
// message boundary.
constexpr uint32_t kFlagAbort = 1;
constexpr uint64_t kMaxAbortReason = 256;
// Rendezvous (large messages, CHORUS_TCP_RENDEZVOUS_BYTES): the sender first
// writes only a header with kFlagRts (length = the message's length) in the
// message's place on socket 0, and streams the payload — socket 0 starting
// with a kFlagData header of the same length, the other sockets their shares
// as usual — only once the receiver has granted the message with a kFlagCts
// header.  A CTS header's length is a cumulative grant: every message of the
// pair's stream with index < length (counting all messages, eager ones too,
// from 0) may stream.  The receiver grants when it posts a receive of at least
// its threshold, or when it reads an RTS header whose message it has not
// granted yet (a threshold that differs, or a length mismatch).  CTS headers
// travel on socket 0 of the reverse direction at any frame boundary, including
// between an RTS header and its kFlagData header; they carry no payload.
// Receivers reject an RTS shorter than kMinRendezvousBytes, a CTS that does
// not raise the grant, and a kFlagData header that does not continue the
// message announced by the RTS before it.
constexpr uint32_t kFlagRts = 2;
constexpr uint32_t kFlagCts = 4;
constexpr uint32_t kFlagData = 8;
constexpr uint64_t kMinRendezvousBytes = 4096;
// Striping unit: piece k of a message travels on socket k % nsockets.  A
// multiple of every element size, so a reduction never splits an element
// across sockets.
constexpr uint64_t kPieceBytes = 256 * 1024;

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint32_t flags = 0;  // 0, kFlagAbort, kFlagRts, kFlagCts or kFlagData; a receiver rejects any other
  uint64_t length = 0;
  // A message (flags 0, kFlagRts, kFlagData): its call's signature
  // (Request::sig), which the matched receive must share, else the receive
  // fails with chorusMismatch.  An abort: the sender's chorusResult_t, so the
  // root cause keeps its code on every rank.  A CTS: 0.
  uint64_t sig = 0;
};
static_assert(sizeof(FrameHeader) == 24);
constexpr size_t kHeaderBytes = sizeof(FrameHeader);

// The authenticated hello of each data connection (auth.hpp's hello payload).
constexpr uint32_t kHelloMagic = 0x4c484354;  // "TCHL"
struct Hello {
  uint64_t comm_id = 0;
  int32_t rank = 0;      // the connecting (lower) rank
  int32_t index = 0;     // which of the pair's sockets this is
  int32_t nsockets = 0;  // sockets per peer the connector uses; both ends must agree
  uint32_t magic = kHelloMagic;
};
static_assert(sizeof(Hello) == 24);
// Set in Hello::nsockets when the connector opens the one-sided connection
// too (TcpSetup::rma), so that ranks that disagree on it fail at the first
// hello with a message that says so.
constexpr int32_t kHelloRmaBit = 1 << 30;
// Hello::nsockets bits 28-29: the connector's wire protection
// (TcpSetup::protect: 0 off, 1 mac, 2 encrypt); ranks that disagree fail at
// the first hello, naming both settings.
constexpr int kHelloProtectShift = 28;
constexpr int32_t kHelloProtectMask = 3 << kHelloProtectShift;

// Sent by the acceptor once it has accepted a hello, so a connector whose
// hello is refused fails at setup instead of at its first message.
constexpr uint32_t kAck = 0x4b4f5443;  // "CTOK"

// ---- One-sided operations (rma.hpp; docs/rma.md) ----
//
// With TcpSetup::rma each pair has one more connection, opened after the
// message sockets with the hello index sockets_per_peer, that carries only
// one-sided frames: a message no receive has claimed yet then never holds up
// a put, and an unused capability costs the message path nothing.  Each
// side writes its requests (put, get, notify) and its answers to the other
// side's requests on it; every frame is an RmaFrame header, then for a put
// and a get's data `length` payload bytes.  A target serves requests in
// order and answers each one exactly once, after reading all of it (a put's
// payload included), so answers come back in request order:
//   put    -> kRmaAck once the payload is in the region, or kRmaError (the
//             payload is read and dropped: the stream stays in step);
//   get    -> kRmaGetData with the bytes, or kRmaError;
//   notify -> kRmaAck once the notification is queued for takeNotification.
// The target checks a put's or get's region, generation, bounds (overflow
// safe) and access in its table before a payload byte lands in or leaves its
// memory; the origin checks that an answer names its oldest request awaiting
// one and that a get's data has the length it asked for.  A header that
// fails rmaFrameProblem, or one that breaks those orders, is a corrupt
// connection: the peer is failed, as for a bad message header.
constexpr uint32_t kRmaMagic = 0x31525443;  // "CTR1"
enum RmaKind : uint16_t {
  kRmaPut = 1,      // request; `length` payload bytes follow
  kRmaGet = 2,      // request; `length` is the bytes asked
  kRmaNotify = 3,   // request; `generation` is the value
  kRmaAck = 4,      // answer: a put landed, or a notification is queued
  kRmaError = 5,    // answer: refused; `reason` an RmaRefusal, `generation` its detail
  kRmaGetData = 6,  // answer: a get's `length` bytes follow
};
constexpr uint16_t kRmaMaxReason = 7;  // RmaRefusal::Last

struct RmaFrame {
  uint32_t magic = kRmaMagic;
  uint16_t kind = 0;
  uint16_t reason = 0;      // kRmaError: the refusal (1..kRmaMaxReason); else 0
  uint32_t region = 0;      // put, get: the key's region index; else 0
  uint32_t zero = 0;        // always 0
  uint64_t op = 0;          // requests: the origin's op number (1, 2, ... per ordered pair); answers: the op answered
  uint64_t generation = 0;  // put, get: the key's generation; notify: the value; kRmaError: the detail; else 0
  uint64_t offset = 0;      // put, get: offset into the region; else 0
  uint64_t length = 0;      // put, kRmaGetData: payload bytes that follow; get: bytes asked; else 0
};
static_assert(sizeof(RmaFrame) == 48);
constexpr size_t kRmaFrameBytes = sizeof(RmaFrame);

// The checks of a one-sided header that need no connection state: nullptr
// when it passes, else what is wrong with it.
[[nodiscard]] constexpr const char* rmaFrameProblem(const RmaFrame& f) {
  if (f.magic != kRmaMagic) return "bad magic";
  if (f.kind < kRmaPut || f.kind > kRmaGetData) return "unknown kind";
  if (f.zero != 0) return "a reserved field is not zero";
  if (f.op == 0) return "op number 0";
  if (f.length > kMaxFrameBytes) return "length over 2^48";
  const bool access = f.kind == kRmaPut || f.kind == kRmaGet;
  if (f.kind == kRmaError) {
    if (f.reason == 0 || f.reason > kRmaMaxReason) return "unknown refusal";
  } else if (f.reason != 0) {
    return "a refusal in a frame that carries none";
  }
  if (!access && (f.region != 0 || f.offset != 0)) return "a region in a frame that names none";
  if ((f.kind == kRmaNotify || f.kind == kRmaAck || f.kind == kRmaError) && f.length != 0)
    return "a length in a frame that has none";
  if ((f.kind == kRmaAck || f.kind == kRmaGetData) && f.generation != 0) return "a value in an answer";
  return nullptr;
}

// Payload bytes of a `len`-byte message carried by socket s of n.
[[nodiscard]] constexpr uint64_t shareBytes(uint64_t len, int n, int s) {
  if (n == 1) return len;
  uint64_t pieces = (len + kPieceBytes - 1) / kPieceBytes;
  auto un = static_cast<uint64_t>(n), us = static_cast<uint64_t>(s);
  if (pieces <= us) return 0;
  uint64_t mine = (pieces - us + un - 1) / un;
  uint64_t bytes = mine * kPieceBytes;
  if ((pieces - 1) % un == us) bytes -= pieces * kPieceBytes - len;  // the short last piece is ours
  return bytes;
}

// The contiguous run of the message that socket s's payload byte `off` (an
// offset into that socket's share) starts: message offset and run length.
struct Run {
  uint64_t msg_off;
  uint64_t bytes;
};
[[nodiscard]] constexpr Run payloadRun(uint64_t len, int n, int s, uint64_t off) {
  if (n == 1) return {off, len - off};
  uint64_t q = off / kPieceBytes, r = off % kPieceBytes;
  uint64_t msg_off = (q * static_cast<uint64_t>(n) + static_cast<uint64_t>(s)) * kPieceBytes + r;
  return {msg_off, std::min(kPieceBytes - r, len - msg_off)};
}

// A FIFO over a power-of-two ring that only allocates when it grows, so a
// steady stream of messages reuses its storage.
template <typename T>
class Ring {
 public:
  explicit Ring(size_t capacity = 16) : buf_(std::bit_ceil(std::max<size_t>(capacity, 2))) {}
  [[nodiscard]] bool empty() const { return size_ == 0; }
  [[nodiscard]] size_t size() const { return size_; }
  T& front() { return buf_[head_]; }
  T& operator[](size_t i) { return buf_[(head_ + i) & (buf_.size() - 1)]; }
  const T& operator[](size_t i) const { return buf_[(head_ + i) & (buf_.size() - 1)]; }
  void push(T v) {
    if (size_ == buf_.size()) grow();
    buf_[(head_ + size_) & (buf_.size() - 1)] = std::move(v);
    ++size_;
  }
  void pop() {
    assert(size_ > 0);
    head_ = (head_ + 1) & (buf_.size() - 1);
    --size_;
  }
  void clear() { head_ = size_ = 0; }

 private:
  void grow() {
    std::vector<T> bigger(buf_.size() * 2);
    for (size_t i = 0; i < size_; ++i) bigger[i] = std::move((*this)[i]);
    buf_ = std::move(bigger);
    head_ = 0;
  }
  std::vector<T> buf_;
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace chorus::transport::tcp
