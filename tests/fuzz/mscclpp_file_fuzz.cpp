// libFuzzer target: an MSCCL++ JSON execution plan (CHORUS_PLAN_PATH,
// chorus-sim --plan, chorus-plan import) as plan::parseMscclppJson reads it.
//
// Properties checked: the reader never reads outside the buffer or crashes
// (ASan, UBSan), whatever the JSON (the nesting bound keeps the parser's
// depth small); every error names the origin; what it accepts keeps the plan
// format's rules (checkPlanSpec agrees); and a small accepted plan goes
// through the load-time proof without a sanitizer report.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "plan/plan_file.hpp"

using namespace chorus;
using namespace chorus::plan;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = parseMscclppJson(text, "fuzz.json");
  if (!spec.isOk()) {
    if (spec.status().message().rfind("fuzz.json", 0) != 0) std::abort();  // every error names the file
    return 0;
  }
  if (!checkPlanSpec(*spec).isOk()) std::abort();  // the reader and the spec check agree
  size_t steps = 0;
  for (const auto& p : spec->programs) steps += p.size();
  if (steps > 256 || spec->nranks > 16 || spec->chunks > 64) return 0;  // the proof is quadratic by design
  (void)buildPlan(*spec);  // accepted or refused, never a crash
  return 0;
}
