// libFuzzer target: the UCX transport's wire records (src/transport/ucx/
// ucx_wire.hpp) as a hostile sender makes them: message headers, control
// and one-sided records, and the sealed layout of CHORUS_WIRE_PROTECT.
//
// The checks that need no connection state are constexpr functions of the
// record and the length UCP reports (msgHeaderProblem, ctlProblem,
// rmaProblem, sealedMsgLayout, sealedRecordLayout); the transport calls them
// before any byte a record describes reaches user or region memory.  The
// harness feeds them records and lengths built from the input and checks
// what the transport relies on when they pass:
//   - a header: its length is at most 2^48; an inline payload fits the stage
//     and is exactly what arrived after the header; a separate payload is
//     longer than the inline limit and nothing followed its header;
//   - a control record: exactly its size, a reason within its array;
//   - a one-sided record: what follows it is exactly `extra` bytes and fits
//     the stage; only the kinds that carry bytes or a remote key have any,
//     within their limits; an inline access is within the inline limit;
//   - a sealed layout: every part lies inside the message, the parts do not
//     overlap, and the unsealed length is what the record checks get;
//   - sealing: a header message sealed with auth::MessageSealer (mode, flags
//     and payload from the input), then changed by the input's flips, opens
//     only if no byte changed, and then gives back exactly what was sealed.
//
// Input layout (little endian; a short input is zero-padded):
//   u32 received    the length UCP reports (taken modulo the stage + 64)
//   u8  mode        bit 0: mac/encrypt; bit 1: a separate payload's header
//   u16 payload     inline payload bytes for the sealing round (mod 4097)
//   64 bytes        the record (MsgHeader, CtlMsg head, RmaMsg)
//   then pairs (u16 position, u8 mask): flips of the sealed message.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/wire_protect.hpp"
#include "transport/ucx/ucx_wire.hpp"

namespace {

namespace ucx = chorus::transport::ucx;
using chorus::auth::MessageSealer;
using chorus::auth::WireProtect;

#define CHECK(cond)                                                                      \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      __builtin_trap();                                                                  \
    }                                                                                    \
  } while (0)

struct Reader {
  std::span<const uint8_t> in;
  uint64_t le(size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!in.empty()) {
        v |= uint64_t{in[0]} << (8 * i);
        in = in.subspan(1);
      }
    }
    return v;
  }
  void bytes(void* out, size_t n) {
    auto* o = static_cast<uint8_t*>(out);
    for (size_t i = 0; i < n; ++i) o[i] = static_cast<uint8_t>(le(1));
  }
};

void checkHeader(const ucx::MsgHeader& h, uint64_t received) {
  if (ucx::msgHeaderProblem(h, received) != nullptr) return;
  CHECK(h.magic == ucx::kMsgMagic);
  CHECK(h.length <= ucx::kMaxMessageBytes);
  if (h.flags == ucx::kMsgInline) {
    CHECK(h.length <= ucx::kInlineBytes);
    CHECK(received == sizeof h + h.length);
    CHECK(received <= ucx::kMsgStageBytes);
  } else {
    CHECK(h.flags == ucx::kMsgData);
    CHECK(h.length > ucx::kInlineBytes);
    CHECK(received == sizeof h);
  }
}

void checkCtl(const ucx::CtlMsg& m, uint64_t received) {
  if (ucx::ctlProblem(m, received) != nullptr) return;
  CHECK(received == sizeof m);
  CHECK(m.reason_len <= m.reason.size());
  CHECK(m.kind == ucx::kCtlAbort || m.kind == ucx::kCtlClose);
}

void checkRma(const ucx::RmaMsg& m, uint64_t received) {
  if (ucx::rmaProblem(m, received) != nullptr) return;
  CHECK(received == sizeof m + m.extra);
  CHECK(received <= ucx::kRmaStageBytes);
  CHECK(m.op != 0);
  CHECK(m.length <= ucx::kMaxMessageBytes);
  switch (m.kind) {
    case ucx::kRmaPut: CHECK(m.extra == m.length && m.length <= ucx::kRmaInlineBytes); break;
    case ucx::kRmaGet: CHECK(m.extra == 0 && m.length <= ucx::kRmaInlineBytes); break;
    case ucx::kRmaPutRkey:
    case ucx::kRmaGetRkey:
      CHECK(m.extra > 0 && m.extra <= ucx::kMaxRkeyBytes && m.length > ucx::kRmaInlineBytes);
      break;
    case ucx::kRmaGetData: CHECK(m.extra <= ucx::kRmaInlineBytes && m.addr == 0); break;
    case ucx::kRmaError: CHECK(m.reason >= 1 && m.reason <= ucx::kRmaMaxReason && m.extra == 0); break;
    default: CHECK(m.extra == 0 && m.addr == 0); break;
  }
  if (m.kind != ucx::kRmaError) CHECK(m.reason == 0);
}

void checkLayout(const ucx::SealedLayout& at, size_t n) {
  CHECK(at.clear <= at.body_at);
  CHECK(at.body_at + at.body <= at.tag_at);
  CHECK(at.tag_at + ucx::kSealTagBytes == n);
  CHECK(at.unsealed <= n);
}

// Seals a header message as postSend does, flips bytes, opens it as
// onHeader does.
void sealRound(Reader& r, bool encrypt, bool data, size_t payload, const ucx::MsgHeader& head) {
  chorus::auth::Secret secret;
  secret.present = true;
  for (size_t i = 0; i < secret.bytes.size(); ++i) secret.bytes[i] = std::byte(i * 7 + 1);
  std::array<std::byte, 32> na{}, nb{};
  na.fill(std::byte{3});
  nb.fill(std::byte{4});
  const auto ka = chorus::auth::deriveMessageKeys(secret, na, nb, {}, true);
  const auto kb = chorus::auth::deriveMessageKeys(secret, na, nb, {}, false);
  const WireProtect mode = encrypt ? WireProtect::kEncrypt : WireProtect::kMac;
  MessageSealer tx(mode, ka.send, true), rx(mode, kb.recv, false);

  ucx::MsgHeader h = head;
  h.flags = data ? ucx::kMsgData : ucx::kMsgInline;
  if (data) payload = 0;
  const size_t trailer = ucx::msgTrailerBytes(h.flags, true);
  std::vector<std::byte> msg(sizeof h + payload + trailer);
  std::memcpy(msg.data(), &h, sizeof h);
  for (size_t i = 0; i < payload; ++i) msg[sizeof h + i] = std::byte(i * 31 + 5);
  if (data) {  // a payload's tag, as the payload's seal leaves it
    for (size_t i = 0; i < ucx::kSealTagBytes; ++i) msg[sizeof h + i] = std::byte(0xd0 + i);
  }
  const std::vector<std::byte> plain = msg;
  const size_t clear = sizeof h + (data ? ucx::kSealTagBytes : 0);
  CHECK(tx.seal(ucx::kChanMsg, 9, std::span(msg.data(), clear), std::span(msg.data() + sizeof h, payload),
                msg.data() + sizeof h, msg.data() + msg.size() - ucx::kSealTagBytes));
  const std::vector<std::byte> sealed = msg;
  while (!r.in.empty()) {
    const size_t pos = static_cast<size_t>(r.le(2)) % msg.size();
    msg[pos] ^= std::byte(static_cast<uint8_t>(r.le(1)));
  }
  const bool changed = msg != sealed;
  ucx::MsgHeader got;
  std::memcpy(&got, msg.data(), sizeof got);
  ucx::SealedLayout at;
  if (!ucx::sealedMsgLayout(got.flags, msg.size(), &at)) {
    CHECK(changed);  // the sender's own layout always fits
    return;
  }
  checkLayout(at, msg.size());
  const bool opened = rx.open(ucx::kChanMsg, 9, std::span(msg.data(), at.clear),
                              std::span(msg.data() + at.body_at, at.body), msg.data() + at.body_at,
                              msg.data() + at.tag_at);
  CHECK(opened != changed);
  if (opened) CHECK(std::memcmp(msg.data(), plain.data(), at.tag_at) == 0);
  // The same message at another place of its stream is refused (a replay).
  if (!changed) {
    std::vector<std::byte> again = sealed;
    CHECK(!rx.open(ucx::kChanMsg, 10, std::span(again.data(), at.clear),
                   std::span(again.data() + at.body_at, at.body), again.data() + at.body_at,
                   again.data() + at.tag_at));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader r{std::span(data, size)};
  const uint64_t received = r.le(4) % (ucx::kMsgSealedStageBytes + 64);
  const uint8_t mode = static_cast<uint8_t>(r.le(1));
  const size_t payload = static_cast<size_t>(r.le(2)) % (ucx::kInlineBytes + 1);
  std::array<uint8_t, 64> rec{};
  r.bytes(rec.data(), rec.size());

  ucx::MsgHeader h;
  std::memcpy(&h, rec.data(), sizeof h);
  checkHeader(h, received);
  // The same header with its magic and flags made right: deeper checks.
  ucx::MsgHeader good = h;
  good.magic = ucx::kMsgMagic;
  good.flags = (mode & 2) != 0 ? ucx::kMsgData : ucx::kMsgInline;
  checkHeader(good, received);
  good.length = received >= sizeof good ? received - sizeof good : 0;
  checkHeader(good, received);

  ucx::CtlMsg c;
  std::memcpy(&c, rec.data(), 32);
  checkCtl(c, received);
  c.magic = ucx::kCtlMagic;
  checkCtl(c, sizeof c);

  ucx::RmaMsg m;
  std::memcpy(&m, rec.data(), sizeof m);
  checkRma(m, received);
  m.magic = ucx::kRmaMagic;
  checkRma(m, received);
  checkRma(m, sizeof m + m.extra);

  ucx::SealedLayout at;
  if (ucx::sealedMsgLayout(h.flags, received, &at)) checkLayout(at, received);
  if (ucx::sealedRecordLayout(ucx::kCtlClearBytes, received, &at)) checkLayout(at, received);
  if (ucx::sealedRecordLayout(sizeof(ucx::RmaMsg), received, &at)) checkLayout(at, received);

  sealRound(r, (mode & 1) != 0, (mode & 2) != 0, payload, h);
  return 0;
}
