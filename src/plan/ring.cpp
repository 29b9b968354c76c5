// Ring algorithms: allreduce (reduce-scatter then allgather), allgather(v),
// reduce-scatter, and the pipelined chain broadcast.
//
// Vocabulary: the data is cut into one *block* per rank; each block is cut
// into S *slices* (pipeline chunks).  Step k of the ring moves one slice of
// one block from every rank to its successor.  Steps are emitted in
// wavefront order (slice s of step k at time s + k) and every rank uses the
// same order, so the i-th message from a rank to its successor is the i-th
// the successor expects (the FIFO matching rule of plan.hpp), and the
// executor can keep slices of consecutive steps in flight at once.
#include "plan/slicing.hpp"

namespace chorus::plan {
namespace {

class RingAllReduce final : public Algorithm {
 public:
  std::string_view name() const override { return "ring"; }
  Collective collective() const override { return Collective::AllReduce; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    const int n = sh.nranks;
    if (n == 1 || sh.count == 0) return std::vector<Round>{};
    const uint64_t blk = partBegin(sh.count, n, 1);  // the largest block
    return std::vector<Round>{{.repeat = uint64_t(n - 1), .peers = Peers::Shift, .arg = 1, .elems = blk, .reduce = true},
                              {.repeat = uint64_t(n - 1), .peers = Peers::Shift, .arg = 1, .elems = blk}};
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t N = sh.count;
    if (n == 1) return b.copy(out(0, N), in(0, N));
    if (N == 0) return;
    const int next = mod(r + 1, n), prev = mod(r - 1, n);
    auto bo = [&](int blk) { return partBegin(N, n, blk); };
    auto bs = [&](int blk) { return bo(blk + 1) - bo(blk); };
    const Slicer sl{numSlices(bs(0), sh.chunk_elems)};
    const uint64_t steps = 2 * (n - 1);
    wavefront(steps, sl.S, [&](uint64_t k, uint64_t s) {
      const int kk = static_cast<int>(k);
      if (kk < n - 1) {  // reduce-scatter: after n-1 steps rank r owns block r+1
        const int sb = mod(r - kk, n), rb = mod(r - kk - 1, n);
        Region snd = sl.of(kk == 0 ? Buf::Input : Buf::Output, bo(sb), bs(sb), s);
        if (snd.count) b.send(next, snd);
        Region dst = sl.of(Buf::Output, bo(rb), bs(rb), s);
        if (dst.count) b.recvReduce(prev, dst, sl.of(Buf::Input, bo(rb), bs(rb), s));
      } else {  // allgather of the reduced blocks
        const int j = kk - (n - 1);
        const int sb = mod(r + 1 - j, n), rb = mod(r - j, n);
        Region snd = sl.of(Buf::Output, bo(sb), bs(sb), s);
        if (snd.count) b.send(next, snd);
        Region dst = sl.of(Buf::Output, bo(rb), bs(rb), s);
        if (dst.count) b.recv(prev, dst);
      }
    });
  }
};

// Allgather and allgatherv share one ring: block b has counts[b] elements at
// displs[b] in the output.
void ringAllGatherBlocks(const Shape& sh, int r, ProgramBuilder& b, auto&& count, auto&& displ) {
  const int n = sh.nranks;
  b.copy(out(displ(r), count(r)), in(0, count(r)));
  if (n == 1) return;
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  uint64_t maxc = 0;
  for (int i = 0; i < n; ++i) maxc = std::max<uint64_t>(maxc, count(i));
  if (maxc == 0) return;
  const Slicer sl{numSlices(maxc, sh.chunk_elems)};
  wavefront(n - 1, sl.S, [&](uint64_t k, uint64_t s) {
    const int kk = static_cast<int>(k);
    const int sb = mod(r - kk, n), rb = mod(r - kk - 1, n);
    Region snd = kk == 0 ? sl.of(Buf::Input, 0, count(r), s) : sl.of(Buf::Output, displ(sb), count(sb), s);
    if (snd.count) b.send(next, snd);
    Region dst = sl.of(Buf::Output, displ(rb), count(rb), s);
    if (dst.count) b.recv(prev, dst);
  });
}

class RingAllGather final : public Algorithm {
 public:
  std::string_view name() const override { return "ring"; }
  Collective collective() const override { return Collective::AllGather; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    if (sh.nranks == 1 || sh.count == 0) return std::vector<Round>{};
    return std::vector<Round>{{.repeat = uint64_t(sh.nranks - 1), .peers = Peers::Shift, .arg = 1, .elems = sh.count}};
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const uint64_t c = sh.count;
    ringAllGatherBlocks(sh, r, b, [c](int) { return c; }, [c](int i) { return c * i; });
  }
};

class RingAllGatherV final : public Algorithm {
 public:
  std::string_view name() const override { return "ring"; }
  Collective collective() const override { return Collective::AllGatherV; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    uint64_t maxc = 0;
    for (size_t c : sh.counts) maxc = std::max<uint64_t>(maxc, c);
    if (sh.nranks == 1 || maxc == 0) return std::vector<Round>{};
    return std::vector<Round>{{.repeat = uint64_t(sh.nranks - 1), .peers = Peers::Shift, .arg = 1, .elems = maxc}};
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    ringAllGatherBlocks(
        sh, r, b, [&](int i) { return static_cast<uint64_t>(sh.counts[i]); },
        [&](int i) { return static_cast<uint64_t>(sh.displs[i]); });
  }
};

// Reduce-scatter: partial sums travel the ring and land, fully reduced, on
// their owner after n-1 steps.  Two scratch slots alternate between steps.
class RingReduceScatter final : public Algorithm {
 public:
  std::string_view name() const override { return "ring"; }
  Collective collective() const override { return Collective::ReduceScatter; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    if (sh.nranks == 1 || sh.count == 0) return std::vector<Round>{};
    return std::vector<Round>{
        {.repeat = uint64_t(sh.nranks - 1), .peers = Peers::Shift, .arg = 1, .elems = sh.count, .reduce = true}};
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t c = sh.count;
    if (n == 1) return b.copy(out(0, c), in(0, c));
    if (c == 0) return;
    const int next = mod(r + 1, n), prev = mod(r - 1, n);
    const Slicer sl{numSlices(c, sh.chunk_elems)};
    const Region slots = n > 2 ? b.scratch(2 * c) : Region{};
    auto slot = [&](int k) { return slots.offset + static_cast<uint64_t>(k % 2) * c; };
    wavefront(n - 1, sl.S, [&](uint64_t k, uint64_t s) {
      const int kk = static_cast<int>(k);
      const int sb = mod(r - kk - 1, n), rb = mod(r - kk - 2, n);
      Region snd = kk == 0 ? sl.of(Buf::Input, sb * c, c, s) : sl.of(Buf::Scratch, slot(kk - 1), c, s);
      if (snd.count) b.send(next, snd);
      Region acc = sl.of(Buf::Input, rb * c, c, s);
      Region dst = kk == n - 2 ? sl.of(Buf::Output, 0, c, s) : sl.of(Buf::Scratch, slot(kk), c, s);
      if (dst.count) b.recvReduce(prev, dst, acc);
    });
  }
};

// Broadcast down a chain root -> root+1 -> ...: each slice is forwarded as
// soon as it arrives, so large messages stream at link speed.
class ChainBroadcast final : public Algorithm {
 public:
  std::string_view name() const override { return "ring"; }
  Collective collective() const override { return Collective::Broadcast; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    if (sh.nranks == 1 || sh.count == 0) return std::vector<Round>{};
    return std::vector<Round>{{.peers = Peers::Chain, .root = sh.root, .elems = sh.count}};
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t N = sh.count;
    const int vr = mod(r - sh.root, n);
    if (vr == 0) b.copy(out(0, N), in(0, N));
    if (n == 1 || N == 0) return;
    const Slicer sl{numSlices(N, sh.chunk_elems)};
    const int next = mod(r + 1, n), prev = mod(r - 1, n);
    for (uint64_t s = 0; s < sl.S; ++s) {
      Region o = sl.of(Buf::Output, 0, N, s);
      if (vr == 0) {
        b.send(next, sl.of(Buf::Input, 0, N, s));
        continue;
      }
      b.recv(prev, o);
      if (vr != n - 1) b.send(next, o);
    }
  }
};

}  // namespace

void addRingAlgorithms(Registry& r) {
  r.add(std::make_unique<RingAllReduce>());
  r.add(std::make_unique<RingAllGather>());
  r.add(std::make_unique<RingAllGatherV>());
  r.add(std::make_unique<RingReduceScatter>());
  r.add(std::make_unique<ChainBroadcast>());
}

}  // namespace chorus::plan
