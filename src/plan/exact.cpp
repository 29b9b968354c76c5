// Exact plans (CHORUS_REPRODUCIBLE=exact, issue 19; docs/algorithms.md,
// "Reproducible reductions"): the ring allreduce and reduce-scatter with the
// exact accumulator (kernels/exact.hpp) fused into their steps.
//
// The general exact path converts the whole input into accumulator words,
// runs any int64 plan over them and rounds the whole output back: three
// passes over buffers two to six times the data's size, and a working set
// that leaves the cache.  Here the words exist only in small wire slices on
// their way round the ring:
//
//   reduce-scatter, step k of n - 1 (block b, slice s):
//     step 0:   Recv F <- the predecessor's block as it is (its type: a
//               single rank's input is exact, so it travels unconverted),
//               EncodeAdd W <- words of F + words of this rank's block
//     step k:   Encode W <- words of this rank's block b        (local)
//               RecvReduce W <- W + the predecessor's words      (int64 add, from the transport)
//     and Send W to the successor (step 0 sends this rank's block itself);
//   at the last step
//               Recv W (or, on two ranks, F), DecodeAdd: output block <-
//               (W + words of the own block) rounded once;
//   allreduce: then a plain ring all-gather of the rounded floats.
//
// Every sum is a sum of int64 words, exact and order-free, and each output
// element is rounded exactly once (the verifier proves both: an exact plan
// combines only words and encodes only a single rank's input as it is, never
// a rounded value), so the result is the correctly rounded sum of all inputs,
// bit-identical to the general exact path and across communicator sizes.
// Bytes per element on the wire: the type's on the reduce-scatter's first hop
// (two ranks: its only one), 8 x words on the others, the type's in the
// all-gather.
//
// Wire slots: steps are emitted in wavefront order (slice s of step k at
// time k + s), and the words encoded at time t are sent (or decoded) at time
// t + 1, so at most two times' words are live: a slot per (time's parity,
// step), 2n slices' words whatever the count, instead of the whole vector's
// (with one slice per block, the plan takes fewer: one region per step).
#include "plan/slicing.hpp"

namespace chorus::plan {
namespace {

class ExactRingBase : public Algorithm {
 public:
  std::string_view name() const override { return "exact_ring"; }
  bool exact() const override { return true; }
  bool supports(const Shape& sh) const override {
    return sh.exact_words > 0 && !sh.wire && !sh.canonical && sh.scaling == Scaling::None && sh.elem_size > 0;
  }
  std::string_view requirement() const override {
    return "an exact call (CHORUS_REPRODUCIBLE=exact, a float sum) with the accumulator's word count";
  }

 protected:
  static uint64_t wordBytes(const Shape& sh) { return uint64_t{8} * sh.exact_words; }
  // A message of `elems` elements' words, in elements of elem_size (the cost
  // models count elements), rounded up.
  static uint64_t wireElems(const Shape& sh, uint64_t elems) {
    return (elems * wordBytes(sh) + sh.elem_size - 1) / sh.elem_size;
  }
  // The reduce-scatter's rounds for blocks of `blk` elements: the raw
  // inputs, then n - 2 hops of words.
  static std::vector<Round> reduceScatterRounds(const Shape& sh, uint64_t blk) {
    std::vector<Round> r{{.peers = Peers::Shift, .arg = 1, .elems = blk, .reduce = true}};
    if (sh.nranks > 2)
      r.push_back({.repeat = uint64_t(sh.nranks - 2), .peers = Peers::Shift, .arg = 1, .elems = wireElems(sh, blk),
                   .reduce = true});
    return r;
  }
  // One rank alone: its input rounded through the accumulator (so -0 and
  // NaN payloads come out as every other exact call gives them).
  static void alone(const Shape& sh, ProgramBuilder& b, Region src, Region dst) {
    if (src.count == 0) return;
    const Region w = b.wire(src.count * wordBytes(sh));
    b.encode(w, src);
    b.decode(dst, w);
  }
  // The reduce-scatter ring over n blocks (block j: `blockIn(j)` of the input,
  // cut into S slices); rank r ends with block r summed and rounded into
  // `mine(s)`, slice s of its output block.
  template <typename BlockIn, typename Mine>
  static void reduceScatter(const Shape& sh, int r, ProgramBuilder& b, uint64_t max_block, BlockIn&& blockIn,
                            Mine&& mine) {
    const int n = sh.nranks;
    const int next = mod(r + 1, n), prev = mod(r - 1, n);
    const Slicer sl{numSlices(max_block, sh.chunk_elems)};
    const uint64_t slot_bytes = partBegin(max_block, sl.S, 1) * wordBytes(sh);  // the largest slice's words
    const uint64_t times = std::min<uint64_t>(sl.S, 2);
    const Region slots = n > 2 ? b.wire(times * static_cast<uint64_t>(n - 1) * slot_bytes) : Region{};
    // The words of step k (>= 1 received, 0 the first sum), slice s, `elems` long.
    auto W = [&](int k, uint64_t s, uint64_t elems) {
      const uint64_t slot = ((static_cast<uint64_t>(k) + s) % times) * static_cast<uint64_t>(n - 1) + static_cast<uint64_t>(k);
      return Region{Buf::Wire, slots.offset + slot * slot_bytes, elems * wordBytes(sh)};
    };
    // The predecessor's raw input of step 0, slice s (a slot per time too).
    const uint64_t slice_elems = partBegin(max_block, sl.S, 1);
    const Region raw = b.scratch(times * slice_elems);
    auto F = [&](uint64_t s, uint64_t elems) { return Region{Buf::Scratch, raw.offset + (s % times) * slice_elems, elems}; };
    wavefront(static_cast<uint64_t>(n - 1), sl.S, [&](uint64_t k, uint64_t s) {
      const int kk = static_cast<int>(k);
      const int sb = mod(r - 1 - kk, n), rb = mod(r - 2 - kk, n);
      // Step 0 sends the input as it is (the type's bytes, not the words'):
      // the receiver encodes it, exactly as its owner would have.
      if (const Region snd = blockIn(sb, sl, s); snd.count) b.send(next, kk == 0 ? snd : W(kk - 1, s, snd.count));
      const Region own = blockIn(rb, sl, s);
      if (own.count == 0) return;
      const Region in = kk == 0 ? F(s, own.count) : W(kk, s, own.count);
      if (kk < n - 2) {
        if (kk == 0) {
          b.recv(prev, in);
          b.encodeAdd(W(0, s, own.count), own, in);
        } else {
          b.encode(in, own);
          b.recvReduce(prev, in, in);
        }
        return;
      }
      // The last step: the sum's last term is this rank's own, added as it is rounded.
      b.recv(prev, in);
      b.decodeAdd(mine(sl, s), own, in);
    });
  }
};

class ExactRingAllReduce final : public ExactRingBase {
 public:
  Collective collective() const override { return Collective::AllReduce; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    const int n = sh.nranks;
    if (n == 1 || sh.count == 0) return std::vector<Round>{};
    const uint64_t blk = partBegin(sh.count, n, 1);  // the largest block
    std::vector<Round> rs = reduceScatterRounds(sh, blk);
    rs.push_back({.repeat = uint64_t(n - 1), .peers = Peers::Shift, .arg = 1, .elems = blk});
    return rs;
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t N = sh.count;
    if (n == 1) return alone(sh, b, in(0, N), out(0, N));
    if (N == 0) return;
    auto bo = [&](int blk) { return partBegin(N, n, blk); };
    auto bs = [&](int blk) { return bo(blk + 1) - bo(blk); };
    reduceScatter(
        sh, r, b, bs(0), [&](int j, const Slicer& sl, uint64_t s) { return sl.of(Buf::Input, bo(j), bs(j), s); },
        [&](const Slicer& sl, uint64_t s) { return sl.of(Buf::Output, bo(r), bs(r), s); });
    // The rounded blocks around the ring (rank r owns block r).
    const int next = mod(r + 1, n), prev = mod(r - 1, n);
    const Slicer sl{numSlices(bs(0), sh.chunk_elems)};
    wavefront(static_cast<uint64_t>(n - 1), sl.S, [&](uint64_t k, uint64_t s) {
      const int kk = static_cast<int>(k);
      const int sb = mod(r - kk, n), rb = mod(r - kk - 1, n);
      if (Region snd = sl.of(Buf::Output, bo(sb), bs(sb), s); snd.count) b.send(next, snd);
      if (Region dst = sl.of(Buf::Output, bo(rb), bs(rb), s); dst.count) b.recv(prev, dst);
    });
  }
};

class ExactRingReduceScatter final : public ExactRingBase {
 public:
  Collective collective() const override { return Collective::ReduceScatter; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    if (sh.nranks == 1 || sh.count == 0) return std::vector<Round>{};
    return reduceScatterRounds(sh, sh.count);
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const uint64_t c = sh.count;
    if (sh.nranks == 1) return alone(sh, b, in(0, c), out(0, c));
    if (c == 0) return;
    reduceScatter(
        sh, r, b, c, [&](int j, const Slicer& sl, uint64_t s) { return sl.of(Buf::Input, uint64_t(j) * c, c, s); },
        [&](const Slicer& sl, uint64_t s) { return sl.of(Buf::Output, 0, c, s); });
  }
};

}  // namespace

void addExactAlgorithms(Registry& r) {
  r.add(std::make_unique<ExactRingAllReduce>());
  r.add(std::make_unique<ExactRingReduceScatter>());
}

}  // namespace chorus::plan
