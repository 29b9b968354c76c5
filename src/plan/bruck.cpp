// Bruck's algorithms: ceil(log2 n) rounds for any n, the latency-optimal
// choice for small allgather and all-to-all messages.
//
// Allgather: in round k (distance d = 2^k) a rank sends the min(d, n - d)
// blocks it has gathered so far — real blocks r, r+1, ... — to r - d and
// receives r + d's to place after them.  Blocks go straight to their final
// place in the output; a range that wraps past the last rank is sent as two
// messages, split where both sides agree (the same real block index).
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
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t c = sh.count;
    b.copy(out(r * c, c), in(0, c));
    if (n == 1 || c == 0) return;
    for (int d = 1; d < n; d <<= 1) {
      const int cnt = std::min(d, n - d);
      const int to = mod(r - d, n), from = mod(r + d, n);
      if (d == 1)
        b.send(to, in(0, c));
      else
        wrapped(n, r, cnt, [&](int blk, int k) { b.send(to, out(blk * c, k * c)); });
      wrapped(n, from, cnt, [&](int blk, int k) { b.recv(from, out(blk * c, k * c)); });
    }
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
