// Tree algorithms for large messages at scale.
//
// Double binary tree allreduce (as NCCL's): two binary trees over the ranks,
// the second the mirror image of the first, so that almost every rank is a
// leaf in one tree and an inner node in the other; each tree reduces and then
// broadcasts half the data, in pipelined slices.  Per rank that is at most
// two receives and one send per slice in each phase, and the depth is
// log2(n), so latency grows with log n instead of n as in a ring.
//
// Scatter-allgather broadcast (van de Geijn): a binomial scatter of n blocks
// from the root, then a ring allgather of the blocks; each rank sends about
// 2N(n-1)/n bytes instead of N log n for a binomial tree.
#include "plan/partition.hpp"
#include "plan/plan.hpp"

#include <algorithm>
#include <bit>

namespace chorus::plan {
namespace {

// A heap-shaped binary tree over virtual ranks; mirrored trees use
// virtual v = n - 1 - r.
uint64_t largerHalf(uint64_t count) {
  const uint64_t first = partBegin(count, 2, 1);
  return std::max(first, count - first);
}

struct HeapTree {
  int n;
  bool mirror;
  [[nodiscard]] int virt(int r) const { return mirror ? n - 1 - r : r; }
  [[nodiscard]] int real(int v) const { return mirror ? n - 1 - v : v; }
};

class DoubleTreeAllReduce final : public Algorithm {
 public:
  std::string_view name() const override { return "double_tree"; }
  Collective collective() const override { return Collective::AllReduce; }
  // Both trees reduce level by level from the deepest, then broadcast from
  // the root's children down; each message carries half the data (the larger
  // half when N is odd).  Sliced, these rounds are a pipeline
  // (pipelineSlices): every level works on some slice at once.
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    std::vector<Round> rs;
    const int n = sh.nranks;
    if (n == 1 || sh.count == 0) return rs;
    const uint64_t half = largerHalf(sh.count);
    const int depth = std::bit_width(static_cast<unsigned>(n)) - 1;  // of node n - 1
    for (int l = depth; l >= 1; --l) rs.push_back({.peers = Peers::HeapUp, .arg = l, .elems = half, .reduce = true});
    for (int l = 1; l <= depth; ++l) rs.push_back({.peers = Peers::HeapDown, .arg = l, .elems = half});
    return rs;
  }
  uint64_t pipelineSlices(const Shape& sh) const override {
    return sh.nranks > 1 ? numSlices(partBegin(sh.count, 2, 1), sh.chunk_elems) : 1;
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t N = sh.count;
    if (n == 1) return b.copy(out(0, N), in(0, N));
    if (N == 0) return;
    const HeapTree trees[2] = {{n, false}, {n, true}};
    const uint64_t half[3] = {0, partBegin(N, 2, 1), N};
    const uint64_t S = numSlices(half[1], sh.chunk_elems);
    auto slice = [&](int t, uint64_t s) {
      const uint64_t len = half[t + 1] - half[t];
      return std::pair{half[t] + partBegin(len, S, s), half[t] + partBegin(len, S, s + 1)};
    };
    // Reduce slice s of both trees up to their roots.
    auto up = [&](uint64_t s) {
      for (int t = 0; t < 2; ++t) {
        const auto [a, e] = slice(t, s);
        if (e == a) continue;
        const int v = trees[t].virt(r);
        Region cur = in(a, e - a);
        for (int child : {2 * v + 1, 2 * v + 2}) {
          if (child >= n) continue;
          b.recvReduce(trees[t].real(child), out(a, e - a), cur);
          cur = out(a, e - a);
        }
        if (v != 0) {
          b.send(trees[t].real((v - 1) / 2), cur);
        } else if (cur.buf != Buf::Output) {
          b.copy(out(a, e - a), cur);
        }
      }
    };
    // Broadcast slice s of both trees down from their roots.
    auto down = [&](uint64_t s) {
      for (int t = 0; t < 2; ++t) {
        const auto [a, e] = slice(t, s);
        if (e == a) continue;
        const int v = trees[t].virt(r);
        if (v != 0) b.recv(trees[t].real((v - 1) / 2), out(a, e - a));
        for (int child : {2 * v + 1, 2 * v + 2})
          if (child < n) b.send(trees[t].real(child), out(a, e - a));
      }
    };
    // Every rank walks the same sequence of (phase, slice, tree) events, so
    // the messages of each ordered pair appear in the same order on both
    // sides (plan.hpp's matching rule).  The broadcast of slice s comes after
    // the reduction of slice s + lag: a rank's input-ready sends up the tree
    // are not queued behind broadcasts that wait for the whole depth, and the
    // two trees do not wait for each other.
    const uint64_t lag = std::min<uint64_t>(S, static_cast<uint64_t>(std::bit_width(static_cast<unsigned>(n))));
    for (uint64_t k = 0; k < S + lag; ++k) {
      if (k < S) up(k);
      if (k >= lag) down(k - lag);
    }
  }
};

class ScatterAllGatherBroadcast final : public Algorithm {
 public:
  std::string_view name() const override { return "scatter_allgather"; }
  Collective collective() const override { return Collective::Broadcast; }
  // A binomial scatter of blocks (largest offset first, each message a
  // subtree of blocks), then n - 1 ring steps of one block.
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    std::vector<Round> rs;
    const int n = sh.nranks;
    if (n == 1 || sh.count == 0) return rs;
    const uint64_t block = partBegin(sh.count, n, 1);  // the first blocks are the large ones
    for (int m = pof2Ceil(n) / 2; m >= 1; m /= 2)
      rs.push_back({.peers = Peers::TreeDown, .arg = m, .root = sh.root, .elems = block, .subtree = true});
    rs.push_back({.repeat = static_cast<uint64_t>(n - 1), .peers = Peers::Shift, .arg = 1, .elems = block});
    return rs;
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const int n = sh.nranks;
    const uint64_t N = sh.count;
    const int v = mod(r - sh.root, n);
    auto real = [&](int vv) { return mod(vv + sh.root, n); };
    if (v == 0) b.copy(out(0, N), in(0, N));
    if (n == 1 || N == 0) return;
    auto bo = [&](int blk) { return partBegin(N, n, blk); };
    // The root's data is its input; everyone else's arrives in the output.
    auto data = [&](int lo, int hi) {
      return Region{v == 0 ? Buf::Input : Buf::Output, bo(lo), bo(hi) - bo(lo)};
    };
    // Binomial scatter: v receives blocks [v, v + lowbit(v)) from its parent.
    const int span = v == 0 ? pof2Ceil(n) : lowBit(v);
    if (v != 0) {
      const Region got = out(bo(v), bo(std::min(v + span, n)) - bo(v));
      if (got.count) b.recv(real(v - span), got);
    }
    for (int m = span / 2; m >= 1; m /= 2) {
      const int child = v + m;
      if (child >= n) continue;
      const Region give = data(child, std::min(child + m, n));
      if (give.count) b.send(real(child), give);
    }
    // Ring allgather of the blocks in virtual order.
    const int next = real(v + 1), prev = real(v - 1 + n);
    for (int k = 0; k < n - 1; ++k) {
      const int sb = mod(v - k, n), rb = mod(v - k - 1, n);
      const Region snd = data(sb, sb + 1);
      if (snd.count) b.send(next, snd);
      const Region dst = out(bo(rb), bo(rb + 1) - bo(rb));
      if (dst.count) b.recv(prev, dst);
    }
  }
};

}  // namespace

void addDoubleTreeAlgorithms(Registry& r) {
  r.add(std::make_unique<DoubleTreeAllReduce>());
  r.add(std::make_unique<ScatterAllGatherBroadcast>());
}

}  // namespace chorus::plan
