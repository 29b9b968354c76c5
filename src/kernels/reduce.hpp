// Reduction kernels for every data type x op.
//
// Contracts:
//  - dst may alias a or b exactly (in-place), but must not partially overlap.
//  - Integers wrap as C unsigned arithmetic does (signed types are reduced
//    through their unsigned twin for sum/prod).
//  - fp16/bf16/fp8 are widened to fp32, combined, and rounded to nearest even.
//  - Max/Min of floats: if either operand is NaN the result is NaN.
//  - The loops are vectorised (compiled for several ISAs and dispatched once
//    at first use).
#pragma once

#include <chorus/chorus.h>

#include <cstddef>
#include <cstdint>

#include "common/reduction.hpp"

namespace chorus::kernels {

// BinOp (the elementwise combiners; Avg and PreMulSum are built from Sum plus
// scale()/divide() by the executor) and Scalar are common/reduction.hpp's.
using chorus::BinOp;
using chorus::Scalar;

class Reducer {
 public:
  using Fn = void (*)(void* dst, const void* a, const void* b, size_t count);

  Reducer() = default;
  Reducer(chorusDataType_t dtype, BinOp op);

  // dst[i] = a[i] (op) b[i] for i < count.
  void operator()(void* dst, const void* a, const void* b, size_t count) const { fn_(dst, a, b, count); }

  [[nodiscard]] chorusDataType_t dtype() const { return dtype_; }
  [[nodiscard]] BinOp op() const { return op_; }
  [[nodiscard]] size_t elemSize() const { return elem_size_; }
  [[nodiscard]] bool valid() const { return fn_ != nullptr; }

 private:
  Fn fn_ = nullptr;
  chorusDataType_t dtype_ = chorusFloat32;
  BinOp op_ = BinOp::Sum;
  size_t elem_size_ = 0;
};

// dst[i] = src[i] * s, computed in the type's compute precision (fp32 for the
// narrow floats, the type itself otherwise; integers wrap).  dst may alias src.
void scale(void* dst, const void* src, size_t count, chorusDataType_t dtype, const Scalar& s);

// dst[i] = src[i] / n: floats divide in their compute precision, integers use C
// integer division (truncation toward zero).  dst may alias src.  Used by Avg.
void divide(void* dst, const void* src, size_t count, chorusDataType_t dtype, uint64_t n);

}  // namespace chorus::kernels
