// Private to the UCX transport: tags, wire records and their checks.
// ucx_transport.cpp documents the protocol, ucx_setup.cpp the handshake.
//
// Every record is validated before any byte it describes reaches user or
// region memory; the checks that need no connection state are the constexpr
// functions here (a fuzzer can drive them alone).
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace chorus::transport::ucx {

static_assert(std::endian::native == std::endian::little, "the UCX wire format assumes a little-endian host");

// ---- tags ----
//
// A UCP tag is matched per worker, not per endpoint, so it names the sender:
//   bits 63..42  the sender's rank (22 bits)
//   bits 41..40  the channel
//   bits 39..0   the sequence number of the channel's stream from that
//                sender to this rank, plus a 40-bit offset both ends derive
//                from the job secret at the handshake (keyed: a stranger that
//                reached the worker cannot guess a tag that a posted receive
//                would take), modulo 2^40.
// Receives are posted with the full mask for one exact tag, so messages of
// different senders, channels or positions in a stream can never match each
// other's receives: FIFO per pair comes from the sequence numbers, not from
// the order in which UCX delivers.
constexpr int kRankBits = 22;
constexpr int kSeqBits = 40;
constexpr int kMaxRanks = 1 << kRankBits;
constexpr uint64_t kSeqMask = (uint64_t{1} << kSeqBits) - 1;
constexpr uint64_t kFullMask = ~uint64_t{0};

enum Channel : uint64_t {
  kChanMsg = 0,   // message headers (and the payload of small messages)
  kChanData = 1,  // the payload of large messages, same sequence as its header
  kChanRma = 2,   // one-sided requests and answers
  kChanCtl = 3,   // the handshake (clear sequences 0 and 1), then abort and close (keyed)
};

[[nodiscard]] constexpr uint64_t makeTag(int sender, Channel ch, uint64_t seq) {
  return (static_cast<uint64_t>(sender) << (kSeqBits + 2)) | (static_cast<uint64_t>(ch) << kSeqBits) | (seq & kSeqMask);
}
constexpr uint64_t kHelloSeq = 0;
constexpr uint64_t kProofSeq = 1;
// The keyed control sequence always has bit 39 set, so it is never 0 or 1.
constexpr uint64_t kCtlKeyBit = uint64_t{1} << (kSeqBits - 1);

// ---- handshake (ucx_setup.cpp) ----

constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
constexpr uint16_t kWireVersion = 1;
constexpr uint32_t kHelloMagic = 0x31485543;  // "CUH1"
constexpr uint32_t kProofMagic = 0x31505543;  // "CUP1"

struct Hello {
  uint32_t magic = kHelloMagic;
  uint16_t version = kWireVersion;
  uint16_t zero = 0;
  int32_t from = 0;
  int32_t to = 0;
  uint64_t comm_id = 0;
  std::array<std::byte, kNonceBytes> nonce{};  // the sender's challenge for `to`
};
static_assert(sizeof(Hello) == 56);

struct Proof {
  uint32_t magic = kProofMagic;
  uint16_t version = kWireVersion;
  uint16_t protect = 0;  // the prover's CHORUS_WIRE_PROTECT (0 off, 1 mac, 2 encrypt), bound by the MAC
  int32_t from = 0;
  int32_t to = 0;
  uint64_t comm_id = 0;
  std::array<std::byte, kNonceBytes> echo{};   // the challenge of `to` this answers
  std::array<std::byte, kNonceBytes> nonce{};  // the prover's own challenge (authenticated by the MAC)
  std::array<std::byte, kMacBytes> mac{};      // HMAC(secret, "chorus-ucx-proof" | from | to | comm_id | protect | echo | nonce)
};
static_assert(sizeof(Proof) == 120);
constexpr uint16_t kMaxProtect = 2;

// ---- sealing (CHORUS_WIRE_PROTECT=mac|encrypt; auth::MessageSealer) ----
//
// With protection, every keyed message ends in a 16-byte AES-GCM tag over
// its clear part (the record: header, control or one-sided record;
// authenticated only) and its body (an inline payload, an abort's reason, a
// one-sided record's bytes; encrypted with `encrypt`).  The nonce is the
// channel and the sequence the receiver posted the receive for.  A header
// whose payload travels separately also carries the payload's own tag, in
// front of its own (the payload message is the payload alone):
//   header message   MsgHeader | inline payload | [payload tag] | tag
//   payload message  payload (ciphertext with `encrypt`)
//   control          CtlMsg | tag          (clear: the first 32 bytes)
//   one-sided        RmaMsg | extra | tag
constexpr size_t kSealTagBytes = 16;
// The control message's clear part: everything but the reason.
constexpr size_t kCtlClearBytes = 32;

// ---- two-sided messages (ucx_transport.cpp) ----

constexpr uint32_t kMsgMagic = 0x314d5543;  // "CUM1"
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 48;
// Messages up to this long travel inside their header's message; longer ones
// as a second message on the data channel.  Small enough that a header
// message stays eager on every UCX lane (UCP's rendezvous starts at about
// 8 KiB on shared memory), so a header never waits for its receiver.
constexpr uint64_t kInlineBytes = 4096;
enum MsgFlags : uint32_t {
  kMsgInline = 1,  // `length` payload bytes follow the header
  kMsgData = 2,    // the payload is the data channel's message of the same sequence
};

struct MsgHeader {
  uint32_t magic = kMsgMagic;
  uint32_t flags = 0;
  uint64_t length = 0;  // payload bytes
  uint64_t sig = 0;     // the call's signature (Request::sig)
  uint64_t token = 0;   // the pair's token (derived at the handshake): proves the sender
};
static_assert(sizeof(MsgHeader) == 32);
constexpr size_t kMsgStageBytes = sizeof(MsgHeader) + kInlineBytes;
// What a sealed header message carries after its payload: its own tag, and
// for a separate payload that payload's tag.
[[nodiscard]] constexpr size_t msgTrailerBytes(uint32_t flags, bool sealed) {
  return !sealed ? 0 : kSealTagBytes + (flags == kMsgData ? kSealTagBytes : 0);
}
constexpr size_t kMsgSealedStageBytes = kMsgStageBytes + 2 * kSealTagBytes;

// Where the parts of a sealed keyed message of `n` bytes lie:
//   [0, clear)               authenticated only (the record, a payload's tag)
//   [body_at, body_at+body)  the body (encrypted with `encrypt`)
//   [tag_at, n)              the message's tag
// and its length without the trailer (what msgHeaderProblem and rmaProblem
// check).  For a header message `flags` is its header's (not trusted yet:
// the tag covers it); false when `n` cannot hold the layout.
struct SealedLayout {
  size_t clear = 0;
  size_t body_at = 0;
  size_t body = 0;
  size_t tag_at = 0;
  size_t unsealed = 0;
};
[[nodiscard]] constexpr bool sealedMsgLayout(uint32_t flags, size_t n, SealedLayout* out) {
  const bool data = flags == kMsgData;
  const size_t trailer = msgTrailerBytes(data ? kMsgData : kMsgInline, true);
  if (n < sizeof(MsgHeader) + trailer) return false;
  out->clear = sizeof(MsgHeader) + (data ? kSealTagBytes : 0);
  out->body_at = sizeof(MsgHeader);
  out->body = n - sizeof(MsgHeader) - trailer;
  out->tag_at = n - kSealTagBytes;
  out->unsealed = n - trailer;
  // A separate payload's header carries no inline bytes: its tag follows the header.
  if (data && out->body != 0) return false;
  if (data) out->body_at = out->clear;
  return true;
}
// Control and one-sided records: the record's first `clear` bytes, then the
// body, then the tag.
[[nodiscard]] constexpr bool sealedRecordLayout(size_t clear, size_t n, SealedLayout* out) {
  if (n < clear + kSealTagBytes) return false;
  out->clear = clear;
  out->body_at = clear;
  out->body = n - clear - kSealTagBytes;
  out->tag_at = n - kSealTagBytes;
  out->unsealed = n - kSealTagBytes;
  return true;
}

// What is wrong with a header (its token already checked) that arrived as a
// `received`-byte message: nullptr when nothing is.
[[nodiscard]] constexpr const char* msgHeaderProblem(const MsgHeader& h, uint64_t received) {
  if (h.magic != kMsgMagic) return "bad magic";
  if (h.length > kMaxMessageBytes) return "length over 2^48";
  if (h.flags == kMsgInline) {
    if (h.length > kInlineBytes) return "an inline payload over the inline limit";
    if (received != sizeof(MsgHeader) + h.length) return "an inline payload of another length than its header says";
    return nullptr;
  }
  if (h.flags == kMsgData) {
    if (h.length <= kInlineBytes) return "a separate payload for a message that fits inline";
    if (received != sizeof(MsgHeader)) return "bytes after a header whose payload travels separately";
    return nullptr;
  }
  return "unknown flags";
}

// ---- control: abort and close (keyed, one stream per pair) ----

constexpr uint32_t kCtlMagic = 0x31435543;  // "CUC1"
constexpr size_t kMaxAbortReason = 256;
enum CtlKind : uint32_t {
  kCtlAbort = 1,  // the sender aborted its communicator: `code`, and the reason's text
  kCtlClose = 2,  // the sender destroyed its transport: it sends nothing more
};
struct CtlMsg {
  uint32_t magic = kCtlMagic;
  uint32_t kind = 0;
  uint64_t token = 0;
  uint64_t code = 0;  // abort: the sender's chorusResult_t
  uint32_t reason_len = 0;
  uint32_t zero = 0;
  std::array<char, kMaxAbortReason> reason{};
};
static_assert(sizeof(CtlMsg) == 32 + kMaxAbortReason);

[[nodiscard]] constexpr const char* ctlProblem(const CtlMsg& m, uint64_t received) {
  if (received != sizeof(CtlMsg)) return "a control message of the wrong size";
  if (m.magic != kCtlMagic) return "bad magic";
  if (m.kind != kCtlAbort && m.kind != kCtlClose) return "unknown kind";
  if (m.zero != 0 || m.reason_len > kMaxAbortReason) return "a bad reason length";
  if (m.kind == kCtlClose && (m.reason_len != 0 || m.code != 0)) return "a close with a reason";
  return nullptr;
}

// ---- one-sided operations (rma.hpp; ucx_transport.cpp, "one-sided") ----
//
// Requests and answers of one ordered pair travel on its RMA channel, in
// one stream per direction.  Small puts carry their bytes, small gets are
// answered with them.  A large put or get carries the origin's buffer
// address and a UCP remote key for exactly that buffer: the target checks the
// access in its region table and only then moves the bytes itself, a
// ucp_get_nbx from the origin's buffer into its region (put) or a
// ucp_put_nbx from its region into the origin's buffer (get), so nothing
// reaches the target's memory that the target did not check.
constexpr uint32_t kRmaMagic = 0x31525543;  // "CUR1"
constexpr uint64_t kRmaInlineBytes = 4096;
constexpr uint32_t kMaxRkeyBytes = 4096;
enum RmaKind : uint16_t {
  kRmaPut = 1,        // request; `extra` bytes of payload follow
  kRmaPutRkey = 2,    // request; the origin's buffer at `addr`, its `extra`-byte remote key follows
  kRmaGet = 3,        // request; answered with kRmaGetData
  kRmaGetRkey = 4,    // request; into the origin's buffer at `addr`, its `extra`-byte remote key follows
  kRmaNotify = 5,     // request; `generation` is the value
  kRmaAck = 6,        // answer: done (a put landed, a get's bytes are in the origin's buffer, a notify is queued)
  kRmaError = 7,      // answer: refused; `reason` an RmaRefusal, `generation` its detail
  kRmaGetData = 8,    // answer: a small get's `extra` bytes follow
};
constexpr uint16_t kRmaMaxReason = 7;  // RmaRefusal::Last

struct RmaMsg {
  uint32_t magic = kRmaMagic;
  uint16_t kind = 0;
  uint16_t reason = 0;      // kRmaError: the refusal; else 0
  uint32_t region = 0;      // put, get: the key's region index; else 0
  uint32_t extra = 0;       // bytes after the record (payload or remote key)
  uint64_t op = 0;          // requests: the origin's op number (1, 2, ... per ordered pair); answers: the op answered
  uint64_t generation = 0;  // put, get: the key's generation; notify: the value; kRmaError: the detail
  uint64_t offset = 0;      // put, get: offset into the region
  uint64_t length = 0;      // put, get: bytes
  uint64_t addr = 0;        // kRmaPutRkey, kRmaGetRkey: the origin's buffer
  uint64_t token = 0;       // the pair's token
};
static_assert(sizeof(RmaMsg) == 64);
constexpr size_t kRmaStageBytes = sizeof(RmaMsg) + (kRmaInlineBytes > kMaxRkeyBytes ? kRmaInlineBytes : kMaxRkeyBytes);

[[nodiscard]] constexpr bool rmaIsRequest(uint16_t kind) { return kind >= kRmaPut && kind <= kRmaNotify; }

// The checks of a one-sided record (its token already checked) that arrived
// as a `received`-byte message: nullptr when it passes.
[[nodiscard]] constexpr const char* rmaProblem(const RmaMsg& m, uint64_t received) {
  if (m.magic != kRmaMagic) return "bad magic";
  if (m.kind < kRmaPut || m.kind > kRmaGetData) return "unknown kind";
  if (m.op == 0) return "op number 0";
  if (received != sizeof(RmaMsg) + m.extra) return "a record of another length than it says";
  if (m.length > kMaxMessageBytes) return "length over 2^48";
  if (m.kind == kRmaError) {
    if (m.reason == 0 || m.reason > kRmaMaxReason) return "unknown refusal";
  } else if (m.reason != 0) {
    return "a refusal in a record that carries none";
  }
  const bool access = m.kind == kRmaPut || m.kind == kRmaPutRkey || m.kind == kRmaGet || m.kind == kRmaGetRkey;
  if (!access && (m.region != 0 || m.offset != 0 || m.length != 0)) return "a region in a record that names none";
  const bool rkey = m.kind == kRmaPutRkey || m.kind == kRmaGetRkey;
  if (!rkey && m.addr != 0) return "an address in a record that has none";
  switch (m.kind) {
    case kRmaPut:
      if (m.length > kRmaInlineBytes || m.extra != m.length) return "an inline put whose payload is not its length";
      break;
    case kRmaGet:
      if (m.length > kRmaInlineBytes || m.extra != 0) return "a small get over the inline limit";
      break;
    case kRmaPutRkey:
    case kRmaGetRkey:
      if (m.length <= kRmaInlineBytes) return "a remote key for an access that fits inline";
      if (m.extra == 0 || m.extra > kMaxRkeyBytes) return "a remote key of a bad size";
      break;
    case kRmaGetData:
      if (m.extra > kRmaInlineBytes || m.generation != 0) return "get data over the inline limit";
      break;
    default:
      if (m.extra != 0) return "bytes after a record that has none";
      if ((m.kind == kRmaAck) && m.generation != 0) return "a value in an acknowledgement";
      break;
  }
  return nullptr;
}

// Keys of one direction of a pair, derived at the handshake.
struct PairKeys {
  uint64_t token = 0;
  uint64_t msg = 0;   // sequence offsets (40 bits)
  uint64_t data = 0;
  uint64_t rma = 0;
  uint64_t ctl = 0;   // the control sequence (bit 39 set)
};

}  // namespace chorus::transport::ucx
