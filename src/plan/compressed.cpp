// Compressed allreduce, reduce-scatter and allgather (issue 19): fp32 data
// crosses the wire as bf16 or block-scaled fp8 (Shape::wire,
// kernels/quantize.hpp) and is accumulated in fp32 wherever contributions
// combine.
//
// Why direct (all-pairs) plans: each quantization adds an error relative to
// the value quantized (docs/algorithms.md, "Compressed reductions"), so a plan
// that re-quantizes partial sums at every hop (a ring: n - 1 times) would give
// a bound that grows with the rank count.  Here every contribution is
// quantized once, by its owner, and combined in fp32 at the rank that owns
// its block; the owner's fp32 sum is quantized once more for the allgather:
//
//   allreduce       2 quantizations per element (reduce-scatter + allgather)
//   reduce-scatter  1 (the contributions)
//   allgather       1 (the rank's own block)
//
// Algorithm::quantizations() declares these counts and the verifier proves
// them for every element of every output.  Every rank ends with the same
// bits: the owner of a block decodes its own quantized sum (allreduce) or its
// own quantized block (allgather) rather than keeping the fp32 value, so its
// output equals what its peers decoded.
//
// Messages: each quantized run gets its own wire region (Buf::Wire), so that
// the sends to different peers and the receives from them are independent
// steps, pipelined per slice (Shape::chunk_elems) as the direct allreduce is.
// Blocks of fp8 scales are counted from each run's first element, and both
// ends quantize and decode the same run, so the layouts agree.
#include "plan/host_layout.hpp"
#include "plan/partition.hpp"
#include "plan/plan.hpp"

namespace chorus::plan {
namespace {

// The shared parts: block b of N elements over n ranks, cut into slices.
class CompressedBase : public Algorithm {
 public:
  std::string_view name() const override { return "compressed_direct"; }
  bool compressed() const override { return true; }
  bool supports(const Shape& sh) const override {
    return sh.wire.has_value() && kernels::checkWireFormat(*sh.wire).isOk() && sh.elem_size == 4;
  }
  std::string_view requirement() const override { return "a compressed call (fp32 data with a wire format)"; }

 protected:
  // Elements of a fp32 message of `elems` on the wire, rounded up (the cost
  // models count elements of elem_size bytes).  The rounds of these plans
  // carry no reduction: the fp32 accumulation happens in DequantizeReduce,
  // which the tuner's cost model prices with the other (de)quantize passes
  // (src/tune/cost_model.cpp, compressWork).
  static uint64_t wireElems(const Shape& sh, uint64_t elems) {
    return (kernels::wireBytes(*sh.wire, elems) + sh.elem_size - 1) / sh.elem_size;
  }
  struct Blocks {
    uint64_t total;
    int n;
    uint64_t chunk;
    uint64_t begin(int b) const { return partBegin(total, static_cast<uint64_t>(n), static_cast<uint64_t>(b)); }
    uint64_t size(int b) const { return begin(b + 1) - begin(b); }
    uint64_t slices() const { return numSlices(size(0), chunk); }
    // Slice s of block b of `buf`, which starts at element `base`.
    Region slice(Buf buf, uint64_t base, int b, uint64_t s) const {
      const uint64_t S = slices(), a = partBegin(size(b), S, s), e = partBegin(size(b), S, s + 1);
      return Region{buf, base + begin(b) + a, e - a};
    }
  };
  // One all-pairs round of the call's count of fp32 elements on the wire:
  // the reduce-scatter's and all-gather's whole exchange.
  static Result<std::vector<Round>> allPairs(const Shape& sh) {
    if (sh.nranks == 1 || sh.count == 0) return std::vector<Round>{};
    return std::vector<Round>{{.peers = Peers::AllPairs, .elems = wireElems(sh, sh.count)}};
  }
  // The cases with nothing to exchange: one rank copies its input, an empty
  // call does nothing.  True (the program written) when `sh` is one of them.
  static bool trivial(const Shape& sh, ProgramBuilder& b) {
    if (sh.nranks == 1) b.copy(out(0, sh.count), in(0, sh.count));
    return sh.nranks == 1 || sh.count == 0;
  }
  // Quantizes x into a fresh wire region and sends it to `to`.
  static void quantizeSend(ProgramBuilder& b, const Shape& sh, int to, Region x) {
    const Region w = b.wire(kernels::wireBytes(*sh.wire, x.count));
    b.quantize(w, x);
    b.send(to, w);
  }
  // Receives a quantized run of dst.count elements from `from` into a fresh
  // wire region, then decodes it into dst, or adds it to accum into dst.
  static void recvDecode(ProgramBuilder& b, const Shape& sh, int from, Region dst, const Region* accum) {
    const Region w = b.wire(kernels::wireBytes(*sh.wire, dst.count));
    b.recv(from, w);
    if (accum != nullptr)
      b.dequantizeReduce(dst, *accum, w);
    else
      b.dequantize(dst, w);
  }
  // The reduce-scatter half for slice s: quantized input block j to rank j,
  // and the n - 1 quantized contributions to this rank's block summed in fp32
  // into `mine` (starting from the rank's own, unquantized, input block).
  static void reduceScatterSlice(ProgramBuilder& b, const Shape& sh, const Blocks& bl, uint64_t in_base, int r,
                                 uint64_t s, Region mine) {
    const int n = bl.n;
    for (int k = 1; k < n; ++k) {
      const int to = mod(r + k, n);
      if (Region x = bl.slice(Buf::Input, in_base, to, s); x.count) quantizeSend(b, sh, to, x);
    }
    if (mine.count == 0) return;
    const Region own = bl.slice(Buf::Input, in_base, r, s);
    for (int k = 1; k < n; ++k) recvDecode(b, sh, mod(r - k, n), mine, k == 1 ? &own : &mine);
  }
};

class CompressedAllReduce final : public CompressedBase {
 public:
  Collective collective() const override { return Collective::AllReduce; }
  int quantizations(const Shape& sh) const override { return sh.nranks > 1 ? 2 : 0; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    if (sh.nranks == 1 || sh.count == 0) return std::vector<Round>{};
    const uint64_t blk = wireElems(sh, partBegin(sh.count, sh.nranks, 1));
    return std::vector<Round>{{.peers = Peers::AllPairs, .elems = blk},
                              {.repeat = uint64_t(sh.nranks - 1), .peers = Peers::Shift, .arg = 1, .elems = blk}};
  }
  // Reduce-scatter all-pairs, then the owners' quantized sums around a ring:
  // each hop forwards the wire bytes it received, unchanged, so a block is
  // still quantized once for the all-gather, and each rank sends one stream
  // at a time (on a shaped 1 Gbit/s host link, n - 1 concurrent TCP flows
  // carried 85-88 % of it against a single flow's 96 %).
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    if (trivial(sh, b)) return;
    const Blocks bl{sh.count, n, sh.chunk_elems};
    const int next = mod(r + 1, n), prev = mod(r - 1, n);
    std::vector<Region> wires(static_cast<size_t>(n));
    for (uint64_t s = 0; s < bl.slices(); ++s) {
      const Region mine = bl.slice(Buf::Output, 0, r, s);
      reduceScatterSlice(b, sh, bl, 0, r, s, mine);
      if (mine.count) {
        // The fp32 sum, quantized once; this rank keeps what its peers will
        // decode.
        wires[static_cast<size_t>(r)] = b.wire(kernels::wireBytes(*sh.wire, mine.count));
        b.quantize(wires[static_cast<size_t>(r)], mine);
        b.dequantize(mine, wires[static_cast<size_t>(r)]);
      }
      for (int k = 1; k < n; ++k) {
        const int out_block = mod(r - k + 1, n), in_block = mod(r - k, n);
        if (bl.slice(Buf::Output, 0, out_block, s).count) b.send(next, wires[static_cast<size_t>(out_block)]);
        if (Region x = bl.slice(Buf::Output, 0, in_block, s); x.count) {
          Region& w = wires[static_cast<size_t>(in_block)];
          w = b.wire(kernels::wireBytes(*sh.wire, x.count));
          b.recv(prev, w);
          b.dequantize(x, w);
        }
      }
    }
  }
};

class CompressedReduceScatter final : public CompressedBase {
 public:
  Collective collective() const override { return Collective::ReduceScatter; }
  int quantizations(const Shape& sh) const override { return sh.nranks > 1 ? 1 : 0; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override { return allPairs(sh); }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t c = sh.count;
    if (trivial(sh, b)) return;
    // Block j of the input is [j c, (j + 1) c): Blocks over n c elements
    // with n parts gives exactly that.
    const Blocks bl{c * static_cast<uint64_t>(n), n, sh.chunk_elems};
    for (uint64_t s = 0; s < bl.slices(); ++s) {
      Region mine = bl.slice(Buf::Output, 0, r, s);
      mine.offset -= bl.begin(r);  // the output holds only block r
      reduceScatterSlice(b, sh, bl, 0, r, s, mine);
    }
  }
};

class CompressedAllGather final : public CompressedBase {
 public:
  Collective collective() const override { return Collective::AllGather; }
  int quantizations(const Shape& sh) const override { return sh.nranks > 1 ? 1 : 0; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override { return allPairs(sh); }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t c = sh.count;
    if (trivial(sh, b)) return;
    const uint64_t S = numSlices(c, sh.chunk_elems);
    auto piece = [&](Buf buf, uint64_t base, uint64_t s) {
      const uint64_t a = partBegin(c, S, s), e = partBegin(c, S, s + 1);
      return Region{buf, base + a, e - a};
    };
    for (uint64_t s = 0; s < S; ++s) {
      const Region x = piece(Buf::Input, 0, s);
      const Region w = b.wire(kernels::wireBytes(*sh.wire, x.count));
      b.quantize(w, x);
      for (int k = 1; k < n; ++k) b.send(mod(r + k, n), w);
      // This rank's block as its peers decode it (in place: over the input).
      b.dequantize(piece(Buf::Output, static_cast<uint64_t>(r) * c, s), w);
      for (int k = 1; k < n; ++k) {
        const int from = mod(r - k, n);
        recvDecode(b, sh, from, piece(Buf::Output, static_cast<uint64_t>(from) * c, s), nullptr);
      }
    }
  }
};

// Several ranks per host: the compressed direct allreduce would send every
// rank's quantized blocks to the other hosts' ranks, 2 N w bytes out of each
// host (w = wire bytes per fp32 byte), where an uncompressed two-level plan
// reduces inside the host first and sends N.  So, as the hierarchical
// allreduce does, in three phases per slice, with L ranks per host and H hosts:
//   (1) fp32 reduce-scatter inside the host (shared memory, no quantization):
//       local rank l sums part l of the vector over its host;
//   (2) the compressed direct allreduce of part l across hosts, between the
//       ranks with local index l (k = 2: the host sums quantized once, the
//       total once);
//   (3) fp32 allgather of the parts inside the host.
// Out of each host: 2 (H - 1)/H N w bytes.  Still 2 quantizations.
class CompressedHierarchicalAllReduce final : public CompressedBase {
 public:
  std::string_view name() const override { return "compressed_hierarchical"; }
  Collective collective() const override { return Collective::AllReduce; }
  bool supports(const Shape& sh) const override {
    const HostLayout lay(sh);
    return CompressedBase::supports(sh) && lay.ok() && lay.L >= 2;
  }
  std::string_view requirement() const override {
    return "a compressed call on two or more hosts with the same number (>= 2) of ranks each";
  }
  int quantizations(const Shape& sh) const override { return sh.nranks > 1 ? 2 : 0; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    const HostLayout lay(sh);
    if (!lay.ok()) return invalidArgument("compressed_hierarchical: the hosts do not all hold the same number of ranks");
    if (sh.count == 0) return std::vector<Round>{};
    const uint64_t part = partBegin(sh.count, lay.L, 1);  // the largest part
    const uint64_t sub = wireElems(sh, partBegin(part, lay.H, 1));
    Round intra{.peers = Peers::Explicit, .elems = part, .reduce = true};
    Round across{.peers = Peers::Explicit, .elems = sub};
    for (int g = 0; g < lay.H; ++g)
      for (int a = 0; a < lay.L; ++a)
        for (int d = 0; d < lay.L; ++d)
          if (a != d) intra.msgs.push_back({lay.rank(g, a), lay.rank(g, d), part});
    for (int l = 0; l < lay.L; ++l)
      for (int a = 0; a < lay.H; ++a)
        for (int d = 0; d < lay.H; ++d)
          if (a != d) across.msgs.push_back({lay.rank(a, l), lay.rank(d, l), sub});
    Round gather = intra;
    gather.reduce = false;
    return std::vector<Round>{intra, across, across, gather};
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const HostLayout lay(sh);
    const int H = lay.H, L = lay.L, g = lay.host[r], l = lay.local[r];
    if (sh.count == 0) return;
    // Part p of the vector (the one local rank p owns), slice s of it, and
    // sub-block h of that slice (the one host h's rank p owns).
    const Blocks parts{sh.count, L, sh.chunk_elems};
    auto subOf = [&](Region x, int h) {
      const uint64_t a = partBegin(x.count, H, h), e = partBegin(x.count, H, h + 1);
      return Region{x.buf, x.offset + a, e - a};
    };
    for (uint64_t s = 0; s < parts.slices(); ++s) {
      // (1) Inside the host, in fp32.
      for (int k = 1; k < L; ++k) {
        const int p = (l + k) % L;
        if (Region x = parts.slice(Buf::Input, 0, p, s); x.count) b.send(lay.rank(g, p), x);
      }
      const Region mine = parts.slice(Buf::Output, 0, l, s);
      if (mine.count) {
        for (int k = 1; k < L; ++k)
          b.recvReduce(lay.rank(g, (l - k + L) % L), mine, k == 1 ? parts.slice(Buf::Input, 0, l, s) : mine);
        // (2) Across hosts, compressed: sub-block h of my part to host h's rank l.
        for (int k = 1; k < H; ++k) {
          const int h = (g + k) % H;
          if (Region x = subOf(mine, h); x.count) quantizeSend(b, sh, lay.rank(h, l), x);
        }
        const Region own = subOf(mine, g);
        if (own.count) {
          for (int k = 1; k < H; ++k) recvDecode(b, sh, lay.rank((g - k + H) % H, l), own, &own);
          const Region w = b.wire(kernels::wireBytes(*sh.wire, own.count));
          b.quantize(w, own);
          for (int k = 1; k < H; ++k) b.send(lay.rank((g + k) % H, l), w);
          b.dequantize(own, w);
        }
        for (int k = 1; k < H; ++k) {
          const int h = (g - k + H) % H;
          if (Region x = subOf(mine, h); x.count) recvDecode(b, sh, lay.rank(h, l), x, nullptr);
        }
        // (3) My part, now final, to the host's other ranks.
        for (int k = 1; k < L; ++k) b.send(lay.rank(g, (l + k) % L), mine);
      }
      for (int k = 1; k < L; ++k) {
        const int p = (l - k + L) % L;
        if (Region x = parts.slice(Buf::Output, 0, p, s); x.count) b.recv(lay.rank(g, p), x);
      }
    }
  }
};

}  // namespace

void addCompressedAlgorithms(Registry& r) {
  r.add(std::make_unique<CompressedAllReduce>());
  r.add(std::make_unique<CompressedHierarchicalAllReduce>());
  r.add(std::make_unique<CompressedReduceScatter>());
  r.add(std::make_unique<CompressedAllGather>());
}

}  // namespace chorus::plan
