#include "comm/call_signature.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "comm/communicator.hpp"

#include "common/dtype.hpp"
#include "common/wire_format.hpp"

namespace chorus::comm {

using plan::Collective;

bool rooted(Collective c) { return plan::facts(c).rooted; }

namespace {
uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

Signature signatureOf(std::span<const OpDesc> ops, uint64_t seq) {
  Signature s;
  s.seq = seq;
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  bool first = true;
  for (const OpDesc& o : ops) {
    if (o.pointToPoint()) continue;  // not collectives: their peers differ by design
    const bool reduces = plan::reduces(o.coll);
    const int32_t op = !reduces ? 0 : (o.op >= chorusNumOps ? static_cast<int32_t>(chorusNumOps) : o.op);
    // The v-collectives' own counts differ by rank by design (an allgatherv's
    // send count is the rank's block); what every rank must share is the
    // allgatherv's counts array, mixed in below.
    const uint64_t count = plan::variable(o.coll) ? 0 : o.count;
    if (first) {
      s.coll = static_cast<uint32_t>(o.coll);
      s.dtype = o.dtype;
      s.count = count;
      s.op = op;
      s.root = rooted(o.coll) ? o.root : 0;
      s.wire = wireCode(o);
      first = false;
    }
    ++s.nops;
    mix(static_cast<uint64_t>(o.coll));
    mix(static_cast<uint64_t>(o.dtype));
    mix(count);
    mix(static_cast<uint64_t>(op));
    mix(static_cast<uint64_t>(rooted(o.coll) ? o.root : 0));
    mix(wireCode(o));
    if (o.coll == Collective::AllGatherV)
      for (size_t v : o.counts) mix(v);
  }
  s.hash = h;
  return s;
}

// Board word: kind 5 bits | dtype 5 | op 5 | root 12 (saturating) | count 13
// (saturating: a board call's count is at most 4096) | board call 8 | hash 16.
namespace {
constexpr int kBRoot = 15, kBCount = 27, kBCall = 40, kBHash = 48;
uint64_t sat(uint64_t v, int bits) { return std::min<uint64_t>(v, (uint64_t{1} << bits) - 1); }
}  // namespace

uint64_t boardBase(const Signature& s) {
  const uint64_t rest =
      mix64(s.hash ^ mix64(s.count) ^ (static_cast<uint64_t>(static_cast<uint32_t>(s.root)) << 17) ^ s.nops);
  uint64_t w = (static_cast<uint64_t>(s.coll) & 31) | ((static_cast<uint64_t>(s.dtype) & 31) << 5) |
               ((static_cast<uint64_t>(s.op) & 31) << 10);
  w |= sat(static_cast<uint64_t>(static_cast<uint32_t>(s.root)), 12) << kBRoot;
  w |= sat(s.count, 13) << kBCount;
  w |= (rest >> 48) << kBHash;
  static_assert(kBCall == 40);
  return w;
}

Signature fromCallSignature(const transport::CallSignature& c, uint64_t seq) {
  const uint64_t w = c.word;
  Signature s;
  s.seq = seq;
  s.coll = static_cast<uint32_t>(w & 31);
  s.dtype = static_cast<int32_t>((w >> 5) & 31);
  s.op = static_cast<int32_t>((w >> 10) & 31);
  s.root = static_cast<int32_t>((w >> kBRoot) & 4095);
  s.count = (w >> kBCount) & 8191;
  s.hash = w >> kBHash;
  s.nops = 1;
  return s;
}

uint32_t wireCode(const OpDesc& op) {
  if (!op.wire) return 0;
  return 1 + static_cast<uint32_t>(op.wire->kind) +
         (op.wire->kind == WireFormat::Fp8E4m3 ? static_cast<uint32_t>(op.wire->block) << 8 : 0);
}

namespace {
std::string wireName(uint32_t code) {
  if (code == 0) return "off";
  WireFormat w;
  w.kind = static_cast<WireFormat::Kind>((code & 0xff) - 1);
  if (w.kind == WireFormat::Fp8E4m3) w.block = static_cast<int>(code >> 8);
  return wireFormatName(w);
}
}  // namespace

std::string describe(const Signature& s) {
  const auto coll = static_cast<Collective>(s.coll);
  std::string d = s.coll < plan::kNumCollectives ? std::string(plan::collectiveName(coll))
                                                 : fmt::format("collective kind {}", s.coll);
  d += fmt::format(" #{}", s.seq);
  if (coll != Collective::Barrier)
    d += fmt::format(" count={} dtype={}", s.count, dtypeName(static_cast<chorusDataType_t>(s.dtype)));
  if (plan::reduces(coll)) d += fmt::format(" op={}", s.op == chorusNumOps ? std::string("premulsum") : std::to_string(s.op));
  if (rooted(coll)) d += fmt::format(" root={}", s.root);
  if (s.wire != 0) d += fmt::format(" compress={}", wireName(s.wire));
  if (s.nops > 1) d += fmt::format(" (+{} more in the group)", s.nops - 1);
  return d;
}

std::string differing(const Signature& a, const Signature& b) {
  std::string f;
  auto add = [&](std::string_view name) { f += f.empty() ? std::string(name) : fmt::format(", {}", name); };
  if (a.seq != b.seq) add("sequence number");
  if (a.coll != b.coll) add("collective");
  if (a.count != b.count) add("count");
  if (a.dtype != b.dtype) add("dtype");
  if (a.op != b.op) add("op");
  if (a.root != b.root) add("root");
  if (a.wire != b.wire) add(fmt::format("compression ({} vs {})", wireName(a.wire), wireName(b.wire)));
  if (f.empty()) add("the rest of the group");
  return f;
}

namespace {
constexpr int kCollBits = 6, kDtypeBits = 5, kOpBits = 5, kSeqBits = 16;
constexpr int kDtypeShift = kCollBits, kOpShift = kDtypeShift + kDtypeBits, kSeqShift = kOpShift + kOpBits,
              kHashShift = kSeqShift + kSeqBits;
uint64_t field(uint64_t w, int shift, int bits) { return (w >> shift) & ((uint64_t{1} << bits) - 1); }

std::string describeWire(uint64_t w) {
  if (w == kPointToPointWire) return "a point-to-point send";
  if (w == 0) return "an unsigned message";
  const auto coll = static_cast<uint32_t>(field(w, 0, kCollBits));
  std::string d = coll < static_cast<uint32_t>(plan::kNumCollectives)
                      ? std::string(plan::collectiveName(static_cast<Collective>(coll)))
                      : fmt::format("collective kind {}", coll);
  d += fmt::format(" #{} (mod 2^16)", field(w, kSeqShift, kSeqBits));
  if (static_cast<Collective>(coll) != Collective::Barrier)
    d += fmt::format(" dtype={}", dtypeName(static_cast<chorusDataType_t>(field(w, kDtypeShift, kDtypeBits))));
  if (plan::reduces(static_cast<Collective>(coll))) {
    const uint64_t op = field(w, kOpShift, kOpBits);
    d += fmt::format(" op={}", op == chorusNumOps ? std::string("premulsum") : std::to_string(op));
  }
  return d;
}

std::string wireText(uint64_t want, uint64_t got) {
  std::string f;
  auto add = [&](const char* name) { f += f.empty() ? name : fmt::format(", {}", name); };
  if (want == kPointToPointWire || got == kPointToPointWire || want == 0 || got == 0) {
    add("collective");
  } else {
    if (field(want, 0, kCollBits) != field(got, 0, kCollBits)) add("collective");
    if (field(want, kSeqShift, kSeqBits) != field(got, kSeqShift, kSeqBits)) add("sequence number");
    if (field(want, kDtypeShift, kDtypeBits) != field(got, kDtypeShift, kDtypeBits)) add("dtype");
    if (field(want, kOpShift, kOpBits) != field(got, kOpShift, kOpBits)) add("op");
    if (f.empty()) add("count, root, compression or the rest of the group");
    // A message of an earlier call that no receive of that call took: the
    // ranks disagreed on that call (typically on its root, so that each only
    // sent), and this is where it shows.
    const auto seq_want = field(want, kSeqShift, kSeqBits), seq_got = field(got, kSeqShift, kSeqBits);
    if (seq_got != seq_want && ((seq_want - seq_got) & 0xffff) < 0x8000)
      return fmt::format("a message of {}, an earlier call that no receive took, while this rank is in {} (the ranks "
                         "disagreed on that earlier call: on its root, count or kind)",
                         describeWire(got), describeWire(want));
  }
  return fmt::format("a message of {} while this rank is in {} (differs in {})", describeWire(got), describeWire(want), f);
}
}  // namespace

uint64_t wireBase(const Signature& s) {
  const uint64_t rest =
      mix64(s.hash ^ mix64(s.count) ^ (static_cast<uint64_t>(static_cast<uint32_t>(s.root)) << 17) ^ s.nops);
  uint64_t w = static_cast<uint64_t>(s.coll) & ((1u << kCollBits) - 1);
  w |= (static_cast<uint64_t>(s.dtype) & ((1u << kDtypeBits) - 1)) << kDtypeShift;
  w |= (static_cast<uint64_t>(s.op) & ((1u << kOpBits) - 1)) << kOpShift;
  w |= (rest & 0x7fffffffull) << kHashShift;  // bit 63 stays clear: it marks point-to-point messages
  static_assert(kHashShift + 32 == 64 && kSeqShift == 16 && kSeqBits == 16);
  static_assert(transport::kWireSeqMask == ((uint64_t{1} << kSeqBits) - 1) << kSeqShift);
  static_assert(kPointToPointWire & transport::kWirePointToPoint);
  return w;
}

void installWireMismatchText() { transport::setWireMismatchText(&wireText); }

}  // namespace chorus::comm
