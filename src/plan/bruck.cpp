// Bruck's algorithms: ceil(log2 n) rounds for any n, the latency-optimal
// choice for small allgather and all-to-all messages.
//
// Allgather (Bruck et al. 1997): every rank gathers the blocks in rotated
// order in scratch, slot j holding block r + j (its own block in slot 0).  In
// round k (distance d = 2^k) a rank sends its first min(d, n - d) slots as
// one message to r - d and receives as many from r + d into slot d: the
// sender's slot i is block r + d + i, the receiver's slot d + i.  Every rank
// sends the same amount to the same relative peer, so a round is one Shift
// pattern for any n.  Finally the slots are rotated into the output in two
// copies (slots [1, n - r) to blocks r + 1.., slots [n - r, n) to blocks
// 0..r - 1); the own block is copied from the input directly (nothing to do
// in place, where the input is output block r).
//
// All-to-all: rotate the input so that local block j is the one for rank
// r + j; in round k send every block whose index has bit k set to r + 2^k
// (packed into one message) and receive the same positions from r - 2^k;
// finally block j holds what rank r - j sent to r.
#include "plan/partition.hpp"
#include "plan/plan.hpp"

namespace chorus::plan {
namespace {

// Calls f(first_block, count) for the pieces of real blocks [s, s + cnt) mod n.
template <typename F>
void wrapped(int n, int s, int cnt, F&& f) {
  if (s + cnt <= n) return f(s, cnt);
  f(s, n - s);
  f(0, s + cnt - n);
}

class BruckAllGather final : public Algorithm {
 public:
  std::string_view name() const override { return "bruck"; }
  Collective collective() const override { return Collective::AllGather; }
  // Round d: every rank r sends min(d, n - d) blocks to r - d (Shift by n - d).
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    std::vector<Round> rs;
    const int n = sh.nranks;
    if (n == 1 || sh.count == 0) return rs;
    for (int d = 1; d < n; d *= 2)
      rs.push_back({.peers = Peers::Shift, .arg = n - d, .elems = sh.count * static_cast<uint64_t>(std::min(d, n - d))});
    return rs;
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t c = sh.count;
    b.copy(out(r * c, c), in(0, c));  // nothing in place
    if (n == 1 || c == 0) return;
    const Region tmp = b.scratch(n * c);
    auto slots = [&](uint64_t j, uint64_t k) { return Region{Buf::Scratch, tmp.offset + j * c, k * c}; };
    b.copy(slots(0, 1), in(0, c));
    for (int d = 1; d < n; d *= 2) {
      const uint64_t cnt = static_cast<uint64_t>(std::min(d, n - d));
      b.send(mod(r - d, n), d == 1 ? in(0, c) : slots(0, cnt));
      b.recv(mod(r + d, n), slots(d, cnt));
    }
    const uint64_t tail = static_cast<uint64_t>(n - r);  // slots [0, n - r) are blocks r..n-1
    if (tail > 1) b.copy(out((r + 1) * c, (tail - 1) * c), slots(1, tail - 1));
    if (r > 0) b.copy(out(0, r * c), slots(tail, r));
  }
};

class BruckAllToAll final : public Algorithm {
 public:
  std::string_view name() const override { return "bruck"; }
  Collective collective() const override { return Collective::AllToAll; }
  // Round `bit`: every rank sends the blocks whose index has that bit, packed,
  // to r + bit: the same count for every rank.
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    std::vector<Round> rs;
    const int n = sh.nranks;
    if (n == 1 || sh.count == 0) return rs;
    for (int bit = 1; bit < n; bit <<= 1) {
      // j in [1, n) with bit set: full periods of 2 bit contribute bit each.
      const int64_t m = static_cast<int64_t>(n / (2 * bit)) * bit + std::max(0, n % (2 * bit) - bit);
      rs.push_back({.peers = Peers::Shift, .arg = bit, .elems = sh.count * static_cast<uint64_t>(m)});
    }
    return rs;
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t c = sh.count;
    if (c == 0) return;
    if (n == 1) return b.copy(out(0, c), in(0, c));
    const Region tmp = b.scratch(n * c);
    auto slot = [&](int j) { return Region{Buf::Scratch, tmp.offset + j * c, c}; };
    // Local block j is the one destined to rank r + j.
    wrapped(n, r, n, [&](int blk, int k) {
      b.copy({Buf::Scratch, tmp.offset + mod(blk - r, n) * c, k * c}, in(blk * c, k * c));
    });
    const Region pack = b.scratch((n / 2 + 1) * c), unpack = b.scratch((n / 2 + 1) * c);
    for (int bit = 1; bit < n; bit <<= 1) {
      int m = 0;
      for (int j = 1; j < n; ++j)
        if (j & bit) b.copy({Buf::Scratch, pack.offset + m++ * c, c}, slot(j));
      b.send(mod(r + bit, n), {Buf::Scratch, pack.offset, m * c});
      b.recv(mod(r - bit, n), {Buf::Scratch, unpack.offset, m * c});
      m = 0;
      for (int j = 1; j < n; ++j)
        if (j & bit) b.copy(slot(j), {Buf::Scratch, unpack.offset + m++ * c, c});
    }
    // Now local block j came from rank r - j.
    for (int j = 0; j < n; ++j) b.copy(out(mod(r - j, n) * c, c), slot(j));
  }
};

}  // namespace

void addBruckAlgorithms(Registry& r) {
  r.add(std::make_unique<BruckAllGather>());
  r.add(std::make_unique<BruckAllToAll>());
}

}  // namespace chorus::plan
