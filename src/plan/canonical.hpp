// Reproducible reductions, canonical mode (CHORUS_REPRODUCIBLE=canonical,
// docs/algorithms.md "Reproducible reductions").
//
// The canonical tree of n ranks is fixed by n alone: the node over ranks
// [lo, hi) combines its left child [lo, mid) with its right child [mid, hi),
// mid = lo + ceil((hi - lo) / 2).  For a power of two it is the balanced
// binary tree that recursive halving with partners at distance 1, 2, 4, ...
// builds; otherwise the left halves take the odd rank.  IEEE addition is
// commutative, so a node's two operands may come in either order; only the
// association is fixed, and with it every bit of the result.
//
// A plan is canonical when every element of its result is that tree (the
// verifier checks it when Shape::canonical is set).  The one-shot plans
// combine in tree order when asked to; every other reducing algorithm is
// replaced by the canonical plan of its collective (canonicalPlanFor): a
// direct reduce-scatter in which each block's owner receives the n
// unreduced contributions and combines them in tree order, then, for
// allreduce, a direct allgather, for reduce, a gather of the blocks at the
// root.  It moves (n-1)/n of the data per rank and phase, as a ring does.
#pragma once

#include "plan/plan.hpp"

namespace chorus::plan {

// The split of the canonical tree's node [lo, hi) (hi - lo >= 2).
constexpr int canonicalSplit(int lo, int hi) { return lo + (hi - lo + 1) / 2; }

// Emits, on rank `self` of n, the canonical combination of the n ranks'
// contributions into dst.  `own` holds self's contribution (it must not
// overlap dst or any slot); every other rank q sends this rank exactly one
// message of dst.count elements, its contribution, which is received here
// (posted in tree order).  slot(q) is a scratch region of dst.count elements
// for the subtree starting at rank q; slots of different q must not overlap.
// Leaves next to a peer's leaf are combined straight out of the transport
// (RecvReduce), other nodes by a local Reduce.
template <typename Slot>
void combineCanonical(ProgramBuilder& b, int n, int self, Region own, Region dst, Slot&& slot) {
  if (dst.count == 0) return;
  if (n == 1) return b.copy(dst, own);
  // The node [lo, hi) into `target`; returns the region holding it (own for
  // self's leaf, else target).
  auto node = [&](auto&& rec, int lo, int hi, Region target) -> Region {
    if (hi - lo == 1) {
      if (lo == self) return own;
      b.recv(lo, target);
      return target;
    }
    const int mid = canonicalSplit(lo, hi);
    if (hi - mid == 1 && mid != self) {  // right child: a peer's leaf
      const Region left = rec(rec, lo, mid, target);
      b.recvReduce(mid, target, left);
      return target;
    }
    if (mid - lo == 1 && lo != self) {  // left child: a peer's leaf
      const Region right = rec(rec, mid, hi, target);
      b.recvReduce(lo, target, right);
      return target;
    }
    const Region left = rec(rec, lo, mid, target);
    const Region right = rec(rec, mid, hi, slot(mid));
    b.reduce(target, left, right);
    return target;
  };
  const Region res = node(node, 0, n, dst);
  if (res.buf != dst.buf || res.offset != dst.offset) b.copy(dst, res);  // n == 1 handled above; defensive
}

// The canonical plan of a reducing collective (allreduce, reduce,
// reducescatter), or nullptr for another collective.  Not in the registry:
// the tuner never offers them; the communicator runs them under canonical.
const Algorithm* canonicalAlgorithm(Collective c);

// The plan a reducing call runs under canonical mode: `chosen` when it
// combines in canonical order for sh (the one-shot plans, sh.canonical set),
// else canonicalAlgorithm(sh.coll).
const Algorithm* canonicalPlanFor(const Algorithm* chosen, const Shape& sh);

}  // namespace chorus::plan
