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

// Sent by the acceptor once it has accepted a hello, so a connector whose
// hello is refused fails at setup instead of at its first message.
constexpr uint32_t kAck = 0x4b4f5443;  // "CTOK"

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
