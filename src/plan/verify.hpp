// The verifier: executes every rank's program of a plan symbolically and
// checks that the result is the collective's definition.
//
// Each element carries where it came from: the set of ranks whose inputs were
// combined into it (a bitmask, so up to 64 ranks) and the index of the element
// in the input it derives from.  Reducing two values whose rank sets overlap
// (counting a rank twice) or whose indices differ (mixing elements) poisons the
// value.  Messages are matched FIFO per ordered pair of ranks, as the
// transports do; a program that cannot finish is reported as a deadlock.
//
// Each element also records its combination tree (which two values each
// reduction combined, recursively).  With Shape::canonical set, every element
// of a reduction's result must be the canonical tree of the rank count
// (plan/canonical.hpp): the proof that the plan's bits do not depend on the
// algorithm, chunk size, transport or placement.
//
// With Shape::scaling (a reducing collective's PreMulSum or Avg) each element
// also records which contributions were scaled and how often it was divided:
// a Scale step may only scale this rank's own, unscaled input; nothing may
// send, quantize or combine a contribution before it is scaled; a Divide
// step may only divide a final sum (all ranks) not divided yet; and every
// output must hold every contribution scaled once (PreMulSum) or be divided
// once (Avg).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.hpp"
#include "plan/plan.hpp"

namespace chorus::plan {

struct VerifyCase {
  Shape shape;  // shape.nranks <= 64
  // v-collectives: per-rank arrays.  allgatherv uses counts/displs (same on
  // every rank); alltoallv uses send_counts[r][p], send_displs, recv_counts,
  // recv_displs.
  std::vector<size_t> counts, displs;
  std::vector<std::vector<size_t>> send_counts, send_displs, recv_counts, recv_displs;
  // Host of every rank (Shape::hosts); empty leaves shape.hosts as it is.
  std::vector<int> hosts;
};

// Ok, or chorusInternalError naming the algorithm, the rank count, the rank and
// the first wrong element (what it holds and what it should hold).
Status verify(const Algorithm& algo, const VerifyCase& vc);
// The same check of given programs (progs[r] is rank r's), named `name` in
// messages: for tests that build broken plans by hand.
Status verifyPrograms(std::string_view name, const VerifyCase& vc, std::vector<Program> progs);

}  // namespace chorus::plan
