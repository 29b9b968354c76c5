// Runs collectives on a communicator and checks every output element against
// an independent reference computed here (not with chorus's kernels: integers
// in wrapping 64-bit arithmetic truncated to the type's width, floats in
// double with a tolerance that only the narrow types need).
//
// Used both by the threads-as-ranks unit tests and by the multi-process
// integration program, so a rank-as-thread and a rank-as-process run the same
// checks.
#pragma once

#include <chorus/chorus.h>

#include <string>
#include <vector>

namespace chorus::testing {

enum class Coll { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AllToAll, AllGatherV, AllToAllV, Gather, Scatter, SendRecv, Barrier };
const char* collName(Coll c);
bool collHasOp(Coll c);
bool collHasRoot(Coll c);

struct Case {
  Coll coll = Coll::AllReduce;
  chorusDataType_t dtype = chorusFloat32;
  chorusRedOp_t op = chorusSum;  // chorusNumOps = PreMulSum with scalar 2
  size_t count = 7;
  int root = 0;
  bool inplace = false;
  [[nodiscard]] std::string name() const;
};

// Runs one case on comm (every rank calls it with the same case; stream may
// be NULL).  Returns "" when every element is right, else a description of
// the first wrong element.
std::string runCase(chorusComm_t comm, const Case& c, chorusStream_t stream = nullptr);

// The standard matrix: every collective x dtype x op (with in-place and
// out-of-place) at small counts, plus float32 at the given large counts.
std::vector<Case> standardCases(int nranks, const std::vector<size_t>& counts, bool all_dtypes);

}  // namespace chorus::testing
