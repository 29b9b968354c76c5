// libFuzzer target: a trace file (CHORUS_TRACE) as chorus-trace reads it.
//
// The files come from every rank of a job, possibly from other machines, so
// chorus-trace treats them as untrusted.  Properties checked: the parser never
// reads outside the buffer (ASan); what it accepts has a rank inside
// nranks, algorithm ids that were defined before use and peers inside
// nranks; and the report and the Chrome trace built from it (what `report`
// and `merge` do) finish without a sanitizer report.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "trace/analysis.hpp"
#include "trace/record.hpp"

using namespace chorus::trace;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto t = parseTrace(std::as_bytes(std::span(data, size)));
  if (!t.isOk()) return 0;
  const TraceFile& f = *t;
  if (f.header.rank < 0 || f.header.rank >= f.header.nranks) std::abort();
  for (const OpRecord& o : f.ops)
    if (o.algo >= f.algos.size()) std::abort();
  for (const StepRecord& s : f.steps)
    if (s.kind <= static_cast<uint8_t>(StepKind::RecvReduce) && (s.peer < 0 || s.peer >= f.header.nranks)) std::abort();
  // Small communicators only: the analysis is O(ranks) by design.
  if (f.header.nranks > 4096) return 0;
  std::vector<TraceFile> files{f};
  auto comms = groupTraces(std::move(files));
  if (!comms.isOk()) std::abort();  // one valid file always groups
  (void)analyse(comms->front());
  (void)chromeTrace(*comms);
  return 0;
}
