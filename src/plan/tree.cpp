// Binomial-tree algorithms: broadcast, reduce, gather, scatter.
//
// Ranks are renumbered relative to the root (virtual rank vr = r - root mod
// n).  In a binomial tree the parent of vr is vr minus its lowest set bit, and
// its children are vr + m for the powers of two m below that bit (the root:
// below n).  The subtree of vr covers the virtual ranks [vr, vr + lowbit(vr))
// clipped to n.  Broadcast and reduce are pipelined in slices; gather and
// scatter move whole subtrees of blocks, split where the virtual order wraps
// past the last real rank so every message is contiguous on both sides.
#include "plan/partition.hpp"
#include "plan/plan.hpp"

namespace chorus::plan {
namespace {

struct Tree {
  int n, root, vr;
  [[nodiscard]] int real(int v) const { return mod(v + root, n); }
  // One past the largest child offset: lowbit(vr), or pof2Ceil(n) at the root.
  [[nodiscard]] int span() const { return vr == 0 ? pof2Ceil(n) : lowBit(vr); }
  [[nodiscard]] int parent() const { return real(vr - lowBit(vr)); }
  // Subtree end (exclusive) in virtual ranks.
  [[nodiscard]] int subtreeEnd() const { return std::min(vr + span(), n); }
};

// Binomial levels: down (root first: largest offset first) or up (leaves first).
std::vector<Round> treeRounds(int n, int root, Peers dir, uint64_t elems, bool subtree, bool reduce) {
  std::vector<Round> rs;
  if (n == 1 || elems == 0) return rs;
  for (int m = 1; m < n; m *= 2)
    rs.push_back({.peers = dir, .arg = m, .root = root, .elems = elems, .subtree = subtree, .reduce = reduce});
  if (dir == Peers::TreeDown) std::reverse(rs.begin(), rs.end());
  return rs;
}

Region sliceOf(Buf buf, uint64_t begin, uint64_t len, uint64_t S, uint64_t s) {
  uint64_t a = partBegin(len, S, s), e = partBegin(len, S, s + 1);
  return {buf, begin + a, e - a};
}

class BinomialBroadcast final : public Algorithm {
 public:
  std::string_view name() const override { return "binomial"; }
  Collective collective() const override { return Collective::Broadcast; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    return treeRounds(sh.nranks, sh.root, Peers::TreeDown, sh.count, false, false);
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const Tree t{sh.nranks, sh.root, mod(r - sh.root, sh.nranks)};
    const uint64_t N = sh.count;
    if (t.vr == 0) b.copy(out(0, N), in(0, N));
    if (t.n == 1 || N == 0) return;
    const uint64_t S = numSlices(N, sh.chunk_elems);
    for (uint64_t s = 0; s < S; ++s) {
      Region o = sliceOf(Buf::Output, 0, N, S, s);
      if (t.vr != 0) b.recv(t.parent(), o);
      Region src = t.vr == 0 ? sliceOf(Buf::Input, 0, N, S, s) : o;
      for (int m = t.span() / 2; m >= 1; m /= 2)  // largest subtree first
        if (t.vr + m < t.n) b.send(t.real(t.vr + m), src);
    }
  }
};

class BinomialReduce final : public Algorithm {
 public:
  std::string_view name() const override { return "binomial"; }
  Collective collective() const override { return Collective::Reduce; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    return treeRounds(sh.nranks, sh.root, Peers::TreeUp, sh.count, false, true);
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const Tree t{sh.nranks, sh.root, mod(r - sh.root, sh.nranks)};
    const uint64_t N = sh.count;
    if (N == 0) return;
    bool has_child = t.n > 1 && t.vr + 1 < t.n && t.span() > 1;
    Region acc = t.vr == 0 ? out(0, N) : (has_child ? b.scratch(N) : Region{});
    if (t.n == 1) return b.copy(out(0, N), in(0, N));
    const uint64_t S = numSlices(N, sh.chunk_elems);
    for (uint64_t s = 0; s < S; ++s) {
      Region cur = sliceOf(Buf::Input, 0, N, S, s);
      const Region dst = sliceOf(acc.buf, acc.offset, N, S, s);
      for (int m = 1; m < t.span() && t.vr + m < t.n; m *= 2) {
        b.recvReduce(t.real(t.vr + m), dst, cur);
        cur = dst;
      }
      if (t.vr != 0) {
        b.send(t.parent(), cur);
      } else if (cur.buf != Buf::Output) {
        b.copy(dst, cur);  // a root without children (cannot happen for n > 1)
      }
    }
  }
};

// Emits f(a, b) for the contiguous pieces of virtual block range [a, b): the
// range is split where the real rank order wraps (virtual n - root).
template <typename F>
void pieces(const Tree& t, int a, int e, F&& f) {
  const int wrap = t.n - t.root;
  if (a < wrap && wrap < e) {
    f(a, wrap);
    f(wrap, e);
  } else {
    f(a, e);
  }
}

// Where virtual block v lives on one rank during a gather or scatter: at the
// root, in its user buffer in real rank order; at a leaf, in its own one-block
// user buffer; at an inner rank, in a staging area in virtual order.
struct BlockLayout {
  Tree t;
  uint64_t c;
  Buf root_buf, leaf_buf;
  int end;  // subtree end (virtual, exclusive)
  Region stage;

  BlockLayout(const Tree& tree, uint64_t count, Buf root, Buf leaf, ProgramBuilder& b)
      : t(tree), c(count), root_buf(root), leaf_buf(leaf), end(tree.subtreeEnd()) {
    if (!isRoot() && !isLeaf()) stage = b.scratch(static_cast<uint64_t>(end - t.vr) * c);
  }
  [[nodiscard]] bool isRoot() const { return t.vr == 0; }
  [[nodiscard]] bool isLeaf() const { return end == t.vr + 1; }
  [[nodiscard]] Region place(int v, int count) const {
    const uint64_t len = static_cast<uint64_t>(count) * c;
    if (isRoot()) return {root_buf, static_cast<uint64_t>(t.real(v)) * c, len};
    if (isLeaf()) return {leaf_buf, 0, len};
    return scr(stage.offset + static_cast<uint64_t>(v - t.vr) * c, len);
  }
};

class BinomialGather final : public Algorithm {
 public:
  std::string_view name() const override { return "binomial"; }
  Collective collective() const override { return Collective::Gather; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    return treeRounds(sh.nranks, sh.root, Peers::TreeUp, sh.count, true, false);
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const Tree t{sh.nranks, sh.root, mod(r - sh.root, sh.nranks)};
    const uint64_t c = sh.count;
    if (c == 0) return;
    const BlockLayout L(t, c, Buf::Output, Buf::Input, b);
    if (L.isRoot() || !L.isLeaf()) b.copy(L.place(t.vr, 1), in(0, c));
    for (int m = 1; m < t.span() && t.vr + m < t.n; m *= 2) {
      const int child = t.vr + m;
      pieces(t, child, std::min(child + m, t.n), [&](int a, int e) { b.recv(t.real(child), L.place(a, e - a)); });
    }
    if (!L.isRoot()) pieces(t, t.vr, L.end, [&](int a, int e) { b.send(t.parent(), L.place(a, e - a)); });
  }
};

class BinomialScatter final : public Algorithm {
 public:
  std::string_view name() const override { return "binomial"; }
  Collective collective() const override { return Collective::Scatter; }
  Result<std::vector<Round>> rounds(const Shape& sh) const override {
    return treeRounds(sh.nranks, sh.root, Peers::TreeDown, sh.count, true, false);
  }
  void generate(const Shape& sh, int r, ProgramBuilder& b) const override {
    const Tree t{sh.nranks, sh.root, mod(r - sh.root, sh.nranks)};
    const uint64_t c = sh.count;
    if (c == 0) return;
    const BlockLayout L(t, c, Buf::Input, Buf::Output, b);
    if (!L.isRoot()) pieces(t, t.vr, L.end, [&](int a, int e) { b.recv(t.parent(), L.place(a, e - a)); });
    for (int m = t.span() / 2; m >= 1; m /= 2) {
      const int child = t.vr + m;
      if (child >= t.n) continue;
      pieces(t, child, std::min(child + m, t.n), [&](int a, int e) { b.send(t.real(child), L.place(a, e - a)); });
    }
    if (L.isRoot() || !L.isLeaf()) b.copy(out(0, c), L.place(t.vr, 1));
  }
};

}  // namespace

void addTreeAlgorithms(Registry& r) {
  r.add(std::make_unique<BinomialBroadcast>());
  r.add(std::make_unique<BinomialReduce>());
  r.add(std::make_unique<BinomialGather>());
  r.add(std::make_unique<BinomialScatter>());
}

}  // namespace chorus::plan
