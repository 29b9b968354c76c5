// libFuzzer target: an MSCCL XML algorithm file (CHORUS_PLAN_PATH, chorus-sim
// --plan, chorus-plan import) as plan::parseMscclXml reads it, and the XML
// subset reader under it (common/xml.hpp), which NCCL topology files reach too.
//
// Properties checked: neither reader reads outside the buffer or crashes
// (ASan, UBSan); every error names the origin; what the importer accepts
// keeps the plan format's rules (checkPlanSpec agrees); and a small accepted
// plan goes through the load-time proof without a sanitizer report.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/xml.hpp"
#include "plan/plan_file.hpp"

using namespace chorus;
using namespace chorus::plan;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  XmlLimits lim;
  lim.max_depth = 8;
  auto doc = parseXml(text, "fuzz.xml", lim);
  if (!doc.isOk() && doc.status().message().rfind("fuzz.xml:", 0) != 0) std::abort();
  auto spec = parseMscclXml(text, "fuzz.xml");
  if (!spec.isOk()) {
    if (spec.status().message().rfind("fuzz.xml", 0) != 0) std::abort();  // every error names the file
    return 0;
  }
  if (!doc.isOk()) std::abort();  // the importer read XML the reader refused
  if (!checkPlanSpec(*spec).isOk()) std::abort();  // the importer and the spec check agree
  size_t steps = 0;
  for (const auto& p : spec->programs) steps += p.size();
  if (steps > 256 || spec->nranks > 16 || spec->chunks > 64) return 0;  // the proof is quadratic by design
  (void)buildPlan(*spec);  // accepted or refused, never a crash
  return 0;
}
