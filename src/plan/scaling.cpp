// A reducing plan's op arithmetic as steps (plan.hpp, Scaling): PreMulSum's
// scale of this rank's input before anything reads it, Avg's division of
// the output after its last write.  Added around any algorithm's steps by
// expand(), so the builder derives their dependencies like any other step's,
// the verifier proves them (every contribution scaled once, every result
// divided once, neither at the wrong time), the executors run them and the
// models price them, instead of the communicator doing them out of sight.
#include "plan/plan.hpp"

namespace chorus::plan {
namespace {

// Whether this rank's input is its output (the in-place allreduce or reduce):
// then scaling it in place writes only what the call overwrites anyway.  A
// reduce-scatter's output is one block of its input, so scaling in place
// would change the user's other blocks: it is staged.
bool inputIsOutput(const Shape& sh, int rank) {
  const Alias al = inplaceAlias(sh, rank);
  return al.from == Buf::Input && al.to == Buf::Output && al.offset == 0;
}

bool scales(const Shape& sh) { return sh.scaling != Scaling::None && reduces(sh.coll); }

}  // namespace

void beginScaling(const Shape& sh, int rank, ProgramBuilder& b) {
  if (!scales(sh) || sh.scaling != Scaling::PreMulSum) return;
  const uint64_t n = sh.inputElems(rank);
  if (n == 0) return;
  if (inputIsOutput(sh, rank)) {
    b.scale(in(0, n), in(0, n));
    return;
  }
  // Scratch first: the algorithm's own scratch comes after it (bump order).
  const Region staged = b.scratch(n);
  b.scale(staged, in(0, n));
  b.redirectInput(staged);
}

void endScaling(const Shape& sh, int rank, ProgramBuilder& b) {
  if (!scales(sh) || sh.scaling != Scaling::Avg) return;
  // The output holds the final sum wherever it has elements: every rank's
  // but a reduce's non-roots (outputElems 0).
  if (const uint64_t n = sh.outputElems(rank); n != 0) b.divide(out(0, n));
}

uint64_t scalingElems(const Shape& sh, int rank) {
  if (!scales(sh)) return 0;
  return sh.scaling == Scaling::PreMulSum ? sh.inputElems(rank) : sh.outputElems(rank);
}

}  // namespace chorus::plan
