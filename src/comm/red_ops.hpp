// The reduction ops of a communicator: the built-in ones and those made by
// chorusRedOpCreatePreMulSum (a scalar, read once or, for a "device" scalar,
// at every call), and whether an op may reduce a type under the
// communicator's reproducibility mode.  What the op's arithmetic becomes is
// the plan's business (plan::Scaling: PreMulSum's Scale step, Avg's Divide).
#pragma once

#include <chorus/chorus.h>

#include <vector>

#include "comm/op.hpp"
#include "common/config.hpp"
#include "common/status.hpp"
#include "common/reduction.hpp"
#include "plan/plan.hpp"

namespace chorus::comm {

class RedOps {
 public:
  void bind(int nranks, Reproducible repro) {
    nranks_ = nranks;
    repro_ = repro;
  }
  Result<chorusRedOp_t> createPreMulSum(const Scalar& s, const void* device_scalar);
  Status destroy(chorusRedOp_t op);
  // Whether op may reduce dtype here (a live PreMulSum op of that type, an
  // exact-mode op on a floating-point type, ...); the error names the fix.
  [[nodiscard]] Status validate(chorusRedOp_t op, chorusDataType_t dtype) const;
  // A PreMulSum op's scalar for this call: a device scalar is read now (the
  // user may change it between calls).
  [[nodiscard]] Scalar scalarOf(const OpDesc& op) const;

 private:
  int nranks_ = 1;
  Reproducible repro_ = Reproducible::Off;
  std::vector<PreMulSumOp> premul_;
};

// The op as the elementwise combiner (Avg and PreMulSum sum).
BinOp binOpOf(chorusRedOp_t op);
// The op's arithmetic as steps of a plain or canonical plan (plan::Scaling);
// None for non-reducing operations and for exact calls (`exact`), which
// scale their input as they convert it and divide the rounded result.
plan::Scaling scalingOf(const OpDesc& op, bool exact);

}  // namespace chorus::comm
