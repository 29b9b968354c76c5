// libFuzzer target: a plan file (CHORUS_PLAN_PATH, chorus-sim --plan) as
// plan::parsePlanText reads it (docs/plan-format.md).
//
// Plan files are untrusted: whoever can write a directory on the plan path
// can hand the library any bytes.  Properties checked: the parser never
// reads outside the buffer or crashes (ASan, UBSan); every error names the
// origin; what it accepts keeps the format's rules (checkPlanSpec, the
// loader's check for other readers, agrees); and a small accepted plan can
// be expanded, written back and re-read to the same steps, and put through
// the load-time proof without a sanitizer report.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "plan/plan_file.hpp"

using namespace chorus::plan;

namespace {
bool sameRef(const ChunkRef& a, const ChunkRef& b) { return a.buf == b.buf && a.chunk == b.chunk; }
// The steps of a, but copies of a run onto itself (which expansion drops),
// equal to b's.
bool sameSteps(const PlanSpec& a, const PlanSpec& b) {
  if (a.programs.size() != b.programs.size()) return false;
  for (size_t r = 0; r < a.programs.size(); ++r) {
    size_t j = 0;
    for (const ChunkStep& x : a.programs[r]) {
      if (x.op == StepOp::Copy && sameRef(x.dst, x.src)) continue;
      if (j == b.programs[r].size()) return false;
      const ChunkStep& y = b.programs[r][j++];
      const bool peer = !isLocal(x.op), dst = x.op != StepOp::Send, src = x.op != StepOp::Recv,
                 src2 = x.op == StepOp::Reduce;
      if (x.op != y.op || x.n != y.n || (peer && x.peer != y.peer) || (dst && !sameRef(x.dst, y.dst)) ||
          (src && !sameRef(x.src, y.src)) || (src2 && !sameRef(x.src2, y.src2)))
        return false;
    }
    if (j != b.programs[r].size()) return false;
  }
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = parsePlanText(text, "fuzz.plan");
  if (!spec.isOk()) {
    if (spec.status().message().rfind("fuzz.plan", 0) != 0) std::abort();  // every error names the file
    return 0;
  }
  if (!checkPlanSpec(*spec).isOk()) std::abort();  // the parser and the spec check agree
  size_t steps = 0;
  for (const auto& p : spec->programs) steps += p.size();
  // Small plans only: the proof is quadratic in a rank's steps by design.
  if (steps > 256 || spec->nranks > 16 || spec->chunks > 64) return 0;
  FileAlgorithm algo(*spec);
  auto dumped = dumpPlanText(algo, spec->nranks, static_cast<int>(spec->chunks),
                             {.name = spec->name, .root = spec->root, .inplace = spec->inplace});
  if (dumped.isOk()) {
    auto again = parsePlanText(*dumped, "dumped.plan");
    // Written back, the plan reads as the same steps.
    if (!again.isOk() || !sameSteps(*spec, *again)) std::abort();
  }
  (void)buildPlan(*spec);  // the proof: accepted or refused, never a crash
  return 0;
}
