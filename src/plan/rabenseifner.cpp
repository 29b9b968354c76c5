// Rabenseifner's allreduce: a reduce-scatter by recursive halving, then an
// allgather by recursive doubling, each log2(p) rounds.  Every rank sends
// about 2N(p-1)/p bytes, as a ring does, in log2(p) instead of 2(p-1) rounds:
// the algorithm of choice for mid-sized messages.
//
// Any n: with p the largest power of two <= n and rem = n - p, each even
// rank below 2*rem first hands its whole input to the odd rank above it,
// which reduces it into its own, and gets the result back at the end (the
// standard fold).  Data is cut into p blocks; after the halving rounds the
// rank with new number v owns block v fully reduced.
//
// Also the recursive-halving reduce-scatter (power-of-two n).
#include "plan/partition.hpp"
#include "plan/plan.hpp"

namespace chorus::plan {
namespace {

struct Fold {
  int n, p, rem;
  explicit Fold(int nranks) : n(nranks), p(pof2Floor(nranks)), rem(nranks - pof2Floor(nranks)) {}
  // New rank of r, or -1 for the ranks that sit out.
  [[nodiscard]] int newRank(int r) const {
    if (r < 2 * rem) return r % 2 == 0 ? -1 : r / 2;
    return r - rem;
  }
  [[nodiscard]] int realRank(int v) const { return v < rem ? v * 2 + 1 : v + rem; }
};

// Halving then doubling over blocks [0, p) of `all`, for new rank v.
// block(b) gives block b's region in the output.
void halvingDoubling(const Fold& f, int v, ProgramBuilder& b, uint64_t N, bool allgather) {
  auto bo = [&](int blk) { return partBegin(N, f.p, blk); };
  auto range = [&](int lo, int hi) { return out(bo(lo), bo(hi) - bo(lo)); };
  const Region tmp = b.scratch(bo(f.p / 2));  // the largest half (the first blocks are the big ones)
  int lo = 0, hi = f.p;
  for (int mask = f.p / 2; mask >= 1; mask /= 2) {
    const int partner = f.realRank(v ^ mask);
    const int mid = lo + (hi - lo) / 2;
    const bool upper = (v & mask) != 0;
    const Region give = upper ? range(lo, mid) : range(mid, hi);
    const Region keep = upper ? range(mid, hi) : range(lo, mid);
    if (give.count) b.send(partner, give);
    if (keep.count) {
      const Region t{Buf::Scratch, tmp.offset, keep.count};
      b.recv(partner, t);
      b.reduce(keep, keep, t);
    }
    if (upper)
      lo = mid;
    else
      hi = mid;
  }
  if (!allgather) return;
  for (int mask = 1; mask < f.p; mask *= 2) {
    const int partner = f.realRank(v ^ mask);
    const int mine = v & ~(mask - 1), theirs = (v ^ mask) & ~(mask - 1);
    const Region s = range(mine, mine + mask), r = range(theirs, theirs + mask);
    if (s.count) b.send(partner, s);
    if (r.count) b.recv(partner, r);
  }
}

class RabenseifnerAllReduce final : public Algorithm {
 public:
  std::string_view name() const override { return "rabenseifner"; }
  Collective collective() const override { return Collective::AllReduce; }
  // Fold in, log2(p) halving rounds (mask p/2 .. 1: `mask` blocks, reduced),
  // log2(p) doubling rounds (mask 1 .. p/2), fold out; blocks of N/p (the
  // first, larger ones when ragged).
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    std::vector<Round> rs;
    const Fold f(sh.nranks);
    const uint64_t N = sh.count;
    if (f.n == 1 || N == 0) return rs;
    if (f.rem) rs.push_back({.peers = Peers::FoldIn, .fold = f.rem, .elems = N, .reduce = true, .staged = true});
    for (int mask = f.p / 2; mask >= 1; mask /= 2)
      rs.push_back({.peers = Peers::Xor,
                    .arg = mask,
                    .fold = f.rem,
                    .elems = partBegin(N, f.p, mask),
                    .reduce = true,
                    .staged = true});
    for (int mask = 1; mask < f.p; mask *= 2)
      rs.push_back({.peers = Peers::Xor, .arg = mask, .fold = f.rem, .elems = partBegin(N, f.p, mask)});
    if (f.rem) rs.push_back({.peers = Peers::FoldOut, .fold = f.rem, .elems = N});
    return rs;
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const Fold f(sh.nranks);
    const uint64_t N = sh.count;
    if (f.n == 1) return b.copy(out(0, N), in(0, N));
    if (N == 0) return;
    const int v = f.newRank(r);
    if (r < 2 * f.rem) {
      if (v < 0) {
        b.send(r + 1, in(0, N));
        b.recv(r + 1, out(0, N));
        return;
      }
      const Region t = b.scratch(N);
      b.recv(r - 1, t);
      b.reduce(out(0, N), in(0, N), t);
    } else {
      b.copy(out(0, N), in(0, N));
    }
    halvingDoubling(f, v, b, N, /*allgather=*/true);
    if (r < 2 * f.rem) b.send(r - 1, out(0, N));
  }
};

// Reduce-scatter by recursive halving for power-of-two n: the output block of
// rank r ends in r's output.  Works on a scratch copy of the input.
class HalvingReduceScatter final : public Algorithm {
 public:
  std::string_view name() const override { return "recursive_halving"; }
  Collective collective() const override { return Collective::ReduceScatter; }
  bool supports(const Shape& sh) const override { return std::has_single_bit(static_cast<unsigned>(sh.nranks)); }
  std::string_view requirement() const override { return "a power-of-two number of ranks"; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    std::vector<Round> rs;
    if (sh.nranks == 1 || sh.count == 0) return rs;
    for (int mask = sh.nranks / 2; mask >= 1; mask /= 2)
      rs.push_back(
          {.peers = Peers::Xor, .arg = mask, .elems = sh.count * static_cast<uint64_t>(mask), .reduce = true, .staged = true});
    return rs;
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t c = sh.count;
    if (n == 1) return b.copy(out(0, c), in(0, c));
    if (c == 0) return;
    // Accumulate in scratch: the input is the caller's and the output holds one block.
    const Region acc = b.scratch(c * n);
    const Region tmp = b.scratch(c * n / 2);
    int lo = 0, hi = n;
    bool first = true;
    for (int mask = n / 2; mask >= 1; mask /= 2) {
      const int partner = r ^ mask;
      const int mid = lo + (hi - lo) / 2;
      const bool upper = (r & mask) != 0;
      const int glo = upper ? lo : mid, ghi = upper ? mid : hi;
      const int klo = upper ? mid : lo, khi = upper ? hi : mid;
      const Buf src = first ? Buf::Input : Buf::Scratch;
      const uint64_t base = first ? 0 : acc.offset;
      b.send(partner, {src, base + glo * c, (ghi - glo) * c});
      const Region t{Buf::Scratch, tmp.offset, (khi - klo) * c};
      b.recv(partner, t);
      const Region keep_src{src, base + klo * c, (khi - klo) * c};
      const Region keep_dst = khi - klo == 1 ? out(0, c) : Region{Buf::Scratch, acc.offset + klo * c, (khi - klo) * c};
      b.reduce(keep_dst, keep_src, t);
      first = false;
      if (upper)
        lo = mid;
      else
        hi = mid;
    }
  }
};

}  // namespace

void addRabenseifnerAlgorithms(Registry& r) {
  r.add(std::make_unique<RabenseifnerAllReduce>());
  r.add(std::make_unique<HalvingReduceScatter>());
}

}  // namespace chorus::plan
