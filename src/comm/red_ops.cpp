#include "comm/red_ops.hpp"

#include <cstring>

#include "common/dtype.hpp"
#include "common/exact_layout.hpp"

namespace chorus::comm {

BinOp binOpOf(chorusRedOp_t op) {
  switch (op) {
    case chorusProd: return BinOp::Prod;
    case chorusMax: return BinOp::Max;
    case chorusMin: return BinOp::Min;
    default: return BinOp::Sum;  // Sum, Avg, PreMulSum
  }
}

plan::Scaling scalingOf(const OpDesc& op, bool exact) {
  if (!op.reduces() || exact) return plan::Scaling::None;
  if (op.op >= chorusNumOps) return plan::Scaling::PreMulSum;
  return op.op == chorusAvg ? plan::Scaling::Avg : plan::Scaling::None;
}

Status RedOps::validate(chorusRedOp_t op, chorusDataType_t dtype) const {
  // Exact mode: integers are exact already (a wrapping sum, product, max or
  // min does not depend on the order), so asking for an exact accumulator
  // there is a mistake, and an exact product would need unbounded width.
  if (repro_ == Reproducible::Exact) {
    if (!isFloatType(dtype))
      return invalidArgument("datatype={} under CHORUS_REPRODUCIBLE=exact: exact mode needs a floating-point type "
                             "(supported: chorusFloat32, chorusBfloat16, chorusFloat16, chorusFloat8e4m3, "
                             "chorusFloat8e5m2, chorusFloat64; integer reductions are order-independent already: use "
                             "CHORUS_REPRODUCIBLE=off or canonical)",
                             isValidDtype(dtype) ? dtypeName(dtype) : std::string_view("?"));
    if (op == chorusProd)
      return invalidArgument("op=chorusProd under CHORUS_REPRODUCIBLE=exact: exact mode supports chorusSum, chorusAvg, "
                             "PreMulSum ops (exactly summed) and chorusMax, chorusMin (exact already); use "
                             "CHORUS_REPRODUCIBLE=canonical for a reproducible product");
    CHORUS_RETURN_IF_ERROR(exactLayout(dtype, nranks_).status());
  }
  if (static_cast<int>(op) >= 0 && op < chorusNumOps) return {};
  size_t idx = static_cast<size_t>(op) - chorusNumOps;
  if (static_cast<int>(op) < 0 || idx >= premul_.size() || !premul_[idx].live)
    return invalidArgument("op={} is not a valid reduction op (use chorusSum/Prod/Max/Min/Avg or one made by "
                           "chorusRedOpCreatePreMulSum on this communicator)",
                           static_cast<int>(op));
  if (premul_[idx].scalar.dtype != dtype)
    return invalidArgument("op={} was created for {} but the call uses {}", static_cast<int>(op),
                           dtypeName(premul_[idx].scalar.dtype), dtypeName(dtype));
  return {};
}

Result<chorusRedOp_t> RedOps::createPreMulSum(const Scalar& s, const void* device_scalar) {
  for (size_t i = 0; i < premul_.size(); ++i)
    if (!premul_[i].live) {
      premul_[i] = {s, device_scalar, true};
      return static_cast<chorusRedOp_t>(chorusNumOps + i);
    }
  premul_.push_back({s, device_scalar, true});
  return static_cast<chorusRedOp_t>(chorusNumOps + premul_.size() - 1);
}

Status RedOps::destroy(chorusRedOp_t op) {
  size_t idx = static_cast<size_t>(op) - chorusNumOps;
  if (op < chorusNumOps || idx >= premul_.size() || !premul_[idx].live)
    return invalidArgument("op={} is not a reduction op created by chorusRedOpCreatePreMulSum", static_cast<int>(op));
  premul_[idx].live = false;
  return {};
}

Scalar RedOps::scalarOf(const OpDesc& op) const {
  const PreMulSumOp& pm = premul_[static_cast<size_t>(op.op) - chorusNumOps];
  Scalar s = pm.scalar;
  if (pm.device_scalar) std::memcpy(s.bytes, pm.device_scalar, dtypeSize(op.dtype));
  return s;
}

}  // namespace chorus::comm
