// The canonical plans (canonical.hpp): a direct reduce-scatter whose block
// owners combine the n contributions in the canonical tree, then the
// collective's distribution of the reduced blocks.
#include "plan/canonical.hpp"

#include "plan/partition.hpp"

namespace chorus::plan {
namespace {

// The blocks of a reduction: block q (owned by rank q) of the vector, cut
// into S pipeline slices; reduce-scatter's blocks are the per-rank counts.
struct Blocks {
  int n;
  uint64_t total;     // elements of the vector
  bool equal;         // reduce-scatter: every block has `per` elements
  uint64_t per;
  [[nodiscard]] uint64_t begin(int q) const { return equal ? per * static_cast<uint64_t>(q) : partBegin(total, n, q); }
  [[nodiscard]] uint64_t size(int q) const { return begin(q + 1) - begin(q); }
};

// Slice s of the block q in buffer buf at base (the block's first element in
// that buffer), S slices per block.
Region sliceOf(Buf buf, uint64_t base, uint64_t len, uint64_t S, uint64_t s) {
  const uint64_t a = partBegin(len, S, s), e = partBegin(len, S, s + 1);
  return {buf, base + a, e - a};
}

// What the three canonical plans share: every rank sends slice s of block q
// of its input to q, and combines slice s of its own block in tree order
// into `into(s)`.  Scratch: n slots of the largest block, plus a copy of
// the own contribution in place (the output then overlaps it).
class CanonicalBase : public Algorithm {
 public:
  std::string_view name() const override { return "canonical"; }
  // The prologue every canonical plan has (one rank copies its input, an
  // empty call does nothing, else the blocks, their slices and the scratch
  // of reduceSlice), then the plan's own slices (slices()).
  void generate(const Shape& sh, int r, ProgramBuilder& b) const final {
    if (sh.nranks == 1) return b.copy(out(0, sh.count), in(0, sh.count));
    if (sh.count == 0) return;
    Layout l{blocks(sh), 0, {}, {}};
    l.S = numSlices(l.bl.size(0), sh.chunk_elems);
    l.slots = b.scratch(static_cast<uint64_t>(sh.nranks) * l.bl.size(0));
    l.keep = sh.inplace ? b.scratch(l.bl.size(r)) : Region{Buf::Scratch, 0, 0};
    slices(sh, r, b, l);
  }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    const int n = sh.nranks;
    if (n == 1 || sh.count == 0) return std::vector<Round>{};
    const Blocks bl = blocks(sh);
    const uint64_t blk = bl.size(0);  // the largest block
    std::vector<Round> rs{{.peers = Peers::AllPairs, .elems = blk, .reduce = true, .staged = n > 2}};
    if (sh.coll == Collective::AllReduce) rs.push_back({.peers = Peers::AllPairs, .elems = blk});
    if (sh.coll == Collective::Reduce) {
      Round g{.peers = Peers::Explicit, .elems = blk};
      for (int q = 0; q < n; ++q)
        if (q != sh.root && bl.size(q)) g.msgs.push_back({q, sh.root, bl.size(q)});
      rs.push_back(std::move(g));
    }
    return rs;
  }

 protected:
  static Blocks blocks(const Shape& sh) {
    if (sh.coll == Collective::ReduceScatter) return {sh.nranks, sh.count * sh.nranks, true, sh.count};
    return {sh.nranks, sh.count, false, 0};
  }
  // What generate() set up: the blocks, S slices per block, and the scratch
  // of reduceSlice (n slots of the largest block; in place, a copy of the
  // own block, else empty).
  struct Layout {
    Blocks bl;
    uint64_t S;
    Region slots, keep;
  };
  // The plan after the prologue: 2 or more ranks, a non-empty call.
  virtual void slices(const Shape& sh, int r, ProgramBuilder& b, const Layout& l) const = 0;
  // Emits the reduce-scatter of slice s; `into` is where this rank's reduced
  // slice goes.
  static void reduceSlice(const Shape& sh, int r, ProgramBuilder& b, const Layout& l, uint64_t s, Region into) {
    const int n = sh.nranks;
    const Blocks& bl = l.bl;
    const uint64_t S = l.S;
    const Region slots = l.slots;
    const Region keep = l.keep;
    for (int k = 1; k < n; ++k) {
      const int to = mod(r + k, n);
      if (Region x = sliceOf(Buf::Input, bl.begin(to), bl.size(to), S, s); x.count) b.send(to, x);
    }
    if (into.count == 0) return;
    const uint64_t blk = bl.size(0);
    Region own = sliceOf(Buf::Input, bl.begin(r), bl.size(r), S, s);
    const uint64_t at = own.offset - bl.begin(r);  // the slice's offset in its block
    if (keep.count) {  // in place: into overlaps own
      const Region k{Buf::Scratch, keep.offset + at, own.count};
      b.copy(k, own);
      own = k;
    }
    auto slot = [&](int q) { return Region{Buf::Scratch, slots.offset + static_cast<uint64_t>(q) * blk + at, into.count}; };
    combineCanonical(b, n, r, own, into, slot);
  }
};

class CanonicalAllReduce final : public CanonicalBase {
 public:
  Collective collective() const override { return Collective::AllReduce; }

 private:
  void slices(const Shape& sh, int r, ProgramBuilder& b, const Layout& l) const override {
    const int n = sh.nranks;
    const Blocks& bl = l.bl;
    const uint64_t S = l.S;
    // Slice by slice, so that the allgather of slice s overlaps the
    // reduce-scatter of slice s + 1 (as the direct plan).
    for (uint64_t s = 0; s < S; ++s) {
      const Region mine = sliceOf(Buf::Output, bl.begin(r), bl.size(r), S, s);
      reduceSlice(sh, r, b, l, s, mine);
      if (mine.count)
        for (int k = 1; k < n; ++k) b.send(mod(r + k, n), mine);
      for (int k = 1; k < n; ++k) {
        const int from = mod(r - k, n);
        if (Region x = sliceOf(Buf::Output, bl.begin(from), bl.size(from), S, s); x.count) b.recv(from, x);
      }
    }
  }
};

class CanonicalReduceScatter final : public CanonicalBase {
 public:
  Collective collective() const override { return Collective::ReduceScatter; }

 private:
  // The blocks are the per-rank counts: slice s of the own block is slice s
  // of the output.
  void slices(const Shape& sh, int r, ProgramBuilder& b, const Layout& l) const override {
    for (uint64_t s = 0; s < l.S; ++s) reduceSlice(sh, r, b, l, s, sliceOf(Buf::Output, 0, sh.count, l.S, s));
  }
};

// Reduce: the reduce-scatter, then every owner sends its reduced block to
// the root (non-roots reduce into scratch: they have no output).
class CanonicalReduce final : public CanonicalBase {
 public:
  Collective collective() const override { return Collective::Reduce; }

 private:
  void slices(const Shape& sh, int r, ProgramBuilder& b, const Layout& l) const override {
    const int n = sh.nranks;
    const Blocks& bl = l.bl;
    const uint64_t S = l.S;
    const Region red = r == sh.root ? Region{} : b.scratch(bl.size(r));
    for (uint64_t s = 0; s < S; ++s) {
      const Region mine = r == sh.root ? sliceOf(Buf::Output, bl.begin(r), bl.size(r), S, s)
                                       : sliceOf(Buf::Scratch, red.offset, bl.size(r), S, s);
      reduceSlice(sh, r, b, l, s, mine);
      if (r != sh.root) {
        if (mine.count) b.send(sh.root, mine);
        continue;
      }
      for (int k = 1; k < n; ++k) {
        const int from = mod(r - k, n);
        if (Region x = sliceOf(Buf::Output, bl.begin(from), bl.size(from), S, s); x.count) b.recv(from, x);
      }
    }
  }
};

}  // namespace

const Algorithm* canonicalAlgorithm(Collective c) {
  static const CanonicalAllReduce allreduce;
  static const CanonicalReduceScatter reducescatter;
  static const CanonicalReduce reduce;
  switch (c) {
    case Collective::AllReduce: return &allreduce;
    case Collective::ReduceScatter: return &reducescatter;
    case Collective::Reduce: return &reduce;
    default: return nullptr;
  }
}

const Algorithm* canonicalPlanFor(const Algorithm* chosen, const Shape& sh) {
  if (chosen != nullptr && chosen->oneShot() && sh.canonical && chosen->supports(sh)) return chosen;
  const Algorithm* a = canonicalAlgorithm(sh.coll);
  return a != nullptr ? a : chosen;
}

}  // namespace chorus::plan
