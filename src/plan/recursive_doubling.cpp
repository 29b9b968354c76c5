// Recursive doubling: log2(n) rounds of pairwise exchange with partner
// r xor 2^k.  Latency-optimal for small messages.
//
// Allreduce handles any n with the standard fold: with p = the largest power
// of two <= n and rem = n - p, each even rank below 2*rem hands its input to
// the odd rank above it and sits out; the p remaining ranks run the doubling;
// the odd ranks hand the result back.  Every rank computes a op b with the
// same operands in the same pairing, so all ranks end bitwise identical.
#include "plan/partition.hpp"
#include "plan/plan.hpp"

namespace chorus::plan {
namespace {

class RecursiveDoublingAllReduce final : public Algorithm {
 public:
  std::string_view name() const override { return "recursive_doubling"; }
  Collective collective() const override { return Collective::AllReduce; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    const int n = sh.nranks;
    const uint64_t N = sh.count;
    std::vector<Round> rs;
    if (n == 1 || N == 0) return rs;
    const int p = pof2Floor(n), rem = n - p;
    if (rem) rs.push_back({.peers = Peers::FoldIn, .fold = rem, .elems = N, .reduce = true, .staged = true});
    // The first round reduces straight out of the transport out of place
    // when no rank folded (generate()).
    for (int mask = 1; mask < p; mask <<= 1)
      rs.push_back({.peers = Peers::Xor, .arg = mask, .fold = rem, .elems = N, .reduce = true,
                    .staged = mask > 1 || sh.inplace || rem > 0});
    if (rem) rs.push_back({.peers = Peers::FoldOut, .fold = rem, .elems = N});
    return rs;
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t N = sh.count;
    if (n == 1) return b.copy(out(0, N), in(0, N));
    if (N == 0) return;
    const int p = pof2Floor(n), rem = n - p;
    const Region all = out(0, N);
    const Region tmp = b.scratch(N);
    int newrank;
    if (r < 2 * rem) {
      if (r % 2 == 0) {
        b.send(r + 1, in(0, N));
        newrank = -1;
      } else {
        b.recv(r - 1, tmp);
        b.reduce(all, in(0, N), tmp);
        newrank = r / 2;
      }
    } else {
      newrank = r - rem;
      // Out of place, a rank that did not fold sends its input in the first
      // round and reduces the partner's straight into the output: no copy,
      // no scratch pass.  (In place the output is the input: receiving into
      // it must wait for the send, and a large send completes only when the
      // partner has read it, so both would wait; later rounds stage through
      // scratch for the same reason.)
      if (!sh.inplace && p > 1) {
        const int pn = newrank ^ 1;
        const int partner = pn < rem ? pn * 2 + 1 : pn + rem;
        b.send(partner, in(0, N));
        b.recvReduce(partner, all, in(0, N));
      } else {
        b.copy(all, in(0, N));
      }
    }
    if (newrank >= 0) {
      const bool first_done = r >= 2 * rem && !sh.inplace;
      for (int mask = first_done ? 2 : 1; mask < p; mask <<= 1) {
        const int pn = newrank ^ mask;
        const int partner = pn < rem ? pn * 2 + 1 : pn + rem;
        b.send(partner, all);
        b.recv(partner, tmp);
        b.reduce(all, all, tmp);
      }
    }
    if (r < 2 * rem) {
      if (r % 2 == 1)
        b.send(r - 1, all);
      else
        b.recv(r + 1, all);
    }
  }
};

// Allgather for power-of-two n: in round k each rank swaps the 2^k blocks it
// has with its partner's 2^k blocks.
class RecursiveDoublingAllGather final : public Algorithm {
 public:
  std::string_view name() const override { return "recursive_doubling"; }
  Collective collective() const override { return Collective::AllGather; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    std::vector<Round> rs;
    if (sh.count == 0) return rs;
    for (int mask = 1; mask < sh.nranks; mask <<= 1)
      rs.push_back({.peers = Peers::Xor, .arg = mask, .elems = mask * sh.count});
    return rs;
  }
  bool supports(const Shape& sh) const override { return std::has_single_bit(static_cast<unsigned>(sh.nranks)); }
  std::string_view requirement() const override { return "a power-of-two number of ranks"; }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t c = sh.count;
    b.copy(out(static_cast<uint64_t>(r) * c, c), in(0, c));
    if (c == 0) return;
    for (int mask = 1; mask < n; mask <<= 1) {
      const int partner = r ^ mask;
      const uint64_t mine = static_cast<uint64_t>(r & ~(mask - 1)) * c;
      const uint64_t theirs = static_cast<uint64_t>(partner & ~(mask - 1)) * c;
      b.send(partner, out(mine, mask * c));
      b.recv(partner, out(theirs, mask * c));
    }
  }
};

}  // namespace

void addRecursiveDoublingAlgorithms(Registry& r) {
  r.add(std::make_unique<RecursiveDoublingAllReduce>());
  r.add(std::make_unique<RecursiveDoublingAllGather>());
}

}  // namespace chorus::plan
