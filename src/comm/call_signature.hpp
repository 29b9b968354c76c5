// What every rank of a collective call must agree on, in the three forms the
// communicator uses: the Signature a CHORUS_CHECK exchange sends whole, the
// CallSignature every board slot carries (transport.hpp), and the 64-bit word
// every message header carries.  A mismatch found in any of them is
// chorusMismatch naming the ranks and the fields that differ.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "plan/plan.hpp"
#include "transport/transport.hpp"

namespace chorus {
struct OpDesc;  // comm/op.hpp
}

namespace chorus::comm {

// A batch of operations: its first collective, the number of collectives and
// a hash over all of them (point-to-point operations are left out: their
// peers differ by design).
struct Signature {
  uint64_t seq = 0;
  uint32_t coll = 0;
  int32_t dtype = 0;
  uint64_t count = 0;
  int32_t op = 0;  // chorusRedOp_t; PreMulSum ops as chorusNumOps
  int32_t root = 0;
  uint32_t nops = 0;  // collectives in the batch
  uint32_t wire = 0;  // the first collective's compression: 0 none, else 1 + kind + (fp8 block << 8)
  uint64_t hash = 0;  // of every collective in the batch
  bool operator==(const Signature&) const = default;
};

Signature signatureOf(std::span<const OpDesc> ops, uint64_t seq);
// Whether the collective has a root (broadcast, reduce, gather, scatter).
bool rooted(plan::Collective c);
// A Signature read back from a board word (boardBase below): count and root
// exact up to 8191 and 4095, saturated beyond; the hash keeps 16 bits of the
// rest; with sequence number seq.
Signature fromCallSignature(const transport::CallSignature& c, uint64_t seq);

// "allreduce #5 count=100 dtype=float32 op=0", and the fields in which a
// differs from b ("count, dtype"); a compressed call adds "compress=bf16".
std::string describe(const Signature& s);
std::string differing(const Signature& a, const Signature& b);
// Signature::wire of a compressed call's wire format (0: uncompressed).
uint32_t wireCode(const OpDesc& op);

// The message word: collective, dtype and op exactly, the low 16 bits of the
// sequence number, and 31 bits of a hash of the rest (count, root, the whole
// group).  Point-to-point messages carry kPointToPointWire (no collective's
// word: point-to-point operations have no signature).  Never 0 (the
// transports' default for unsigned messages).  In two steps, so a loop of
// equal calls hashes once: the word without its sequence bits, then those.
uint64_t wireBase(const Signature& s);
inline uint64_t wireAt(uint64_t base, uint64_t seq) {
  uint64_t w = base | ((seq & 0xffff) << 16);
  if (w == 0) w = uint64_t{1} << 32;  // 0 is the transports' unsigned default
  return w;
}
// The board word without and with its board-call bits.
uint64_t boardBase(const Signature& s);
inline uint64_t boardAt(uint64_t base, uint64_t k) { return base | ((k & 0xff) << 40); }
inline constexpr uint64_t kPointToPointWire = transport::kWirePointToPoint;

// Installs the describer of message mismatches into the transports (once).
void installWireMismatchText();

}  // namespace chorus::comm
