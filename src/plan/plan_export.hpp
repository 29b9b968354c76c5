// Writing chorus's plans for other runtimes (docs/msccl.md): MSCCL's XML, so
// RCCL's MSCCL runtime (or msccl-executor-nccl) can run a chorus algorithm,
// and chorus's own plan text.  Every chorus algorithm whose steps are plain
// sends, receives, copies and reductions (not the compressed or exact
// plans) can be written, for one rank count and chunking.
#pragma once

#include <string>

#include "common/status.hpp"
#include "plan/plan.hpp"

namespace chorus::plan {

struct ExportOptions {
  std::string collective = "allreduce";
  std::string algo;        // a built-in algorithm of the collective
  int ranks = 0;
  int chunks = 0;          // chunks per rank block; 0: the rank count
  std::string format = "msccl-xml";  // msccl-xml, mscclpp-json (or msccl++-json), chorus
  std::string name;        // "" = algo and rank count
  std::string proto = "Simple";  // MSCCL's protocol attribute
};

// The algorithm's programs for `ranks` ranks, expanded at count = chunks (every
// region whole chunks), as MSCCL XML: a <gpu> per rank; in each, one thread
// block per peer for its sends, one per peer for its receives (and reductions
// of received data), one for local copies and reductions, all on channel 0;
// every dependency of chorus's program that crosses thread blocks as a nop
// step with depid/deps before the step that waits (MSCCL's steps name one
// dependency each).  A reduce(dst, a, b) whose destination is neither operand
// becomes cpy + re.  The plan claims the out-of-place form only.
Result<std::string> writeMscclXml(const Algorithm& algo, int nranks, int chunks, const ExportOptions& opt);

// The same programs as an MSCCL++ execution plan (JSON, the schema of
// MSCCL++'s executor, src/plan/mscclpp_file.cpp): per GPU one thread block
// running the rank's program in order, one memory channel to each peer and
// the peer's scratch as a remote buffer.  A send is a put into a scratch run
// of the receiver's that no other message uses (after the algorithm's own
// scratch), then a signal; a receive is a wait, then a copy (or, for a
// receive-reduce, an re) from that run.  Out-of-place form, protocol Simple.
Result<std::string> writeMscclppJson(const Algorithm& algo, int nranks, int chunks, const ExportOptions& opt);

// ExportOptions resolved against the built-in registry, in the chosen format.
Result<std::string> exportPlan(const ExportOptions& opt);

}  // namespace chorus::plan
