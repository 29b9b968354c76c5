// A call's arithmetic that is not a step of its plan, as data the
// communicator describes and exec runs (the communicator includes no kernel):
//
//  - a job's prologue and epilogue (exec::Job): local operations on whole
//    buffers that run before the batch's first step and after its last.
//    CHORUS_REPRODUCIBLE=exact's calls are made of them: the exponent-range
//    agreement scans the input (ExactRange), a call over converted buffers
//    converts its input into accumulator words (Scale first for PreMulSum,
//    ToExact) and rounds the summed words into the output (FromExact), and
//    an exact Avg divides the rounded sum (Divide).  A plan's own arithmetic
//    -- Scale, Divide, Encode, Decode, quantization -- is its steps
//    (plan/plan.hpp), which the executor and the board runner run;
//  - the reduction kernel of a (type, op), from a table built once
//    (reducerFor): the executor looks each job's up once per run.
//
// runLocalOp is also the board's scaled publish of a PreMulSum input
// (comm::BoardCalls, which writes the slot outside any executor run).
#pragma once

#include <chorus/chorus.h>

#include <cstdint>
#include <span>

#include "common/exact_layout.hpp"
#include "common/reduction.hpp"
#include "common/wire_format.hpp"

namespace chorus::kernels {
class Reducer;
}

namespace chorus::exec {

struct LocalOp {
  enum class Kind : uint8_t {
    Scale,       // dst[i] = src[i] x *scalar, count elements of dtype (kernels::scale)
    Divide,      // dst[i] = dst[i] / divisor, count elements of dtype (kernels::divide)
    ToExact,     // dst (int64 words) = the accumulators of src's count elements (*layout; kernels::toExact)
    FromExact,   // dst = src's count accumulators rounded to layout->dtype (kernels::fromExact)
    ExactRange,  // dst (2 x int64) = {hi, neg_lo} of src's count elements of dtype (kernels::exactRange)
    // MoE combine (prim/ep_combine.cpp), dtype float32 or bfloat16:
    Accumulate,  // dst (float32)[i] += weight x float(src[i]): the product rounded to float32, then the sum
    FromFloat,   // dst[i] = src (float32)[i] rounded to dtype (nearest even)
    ToFloat,     // dst (float32)[i] = src[i] (float32 or bfloat16), exactly
    Quantize,    // dst (wire bytes) = src (float32), count elements in `wire` (kernels::quantize)
    Dequantize,  // dst (float32) = src (wire bytes) decoded, count elements (kernels::dequantize)
  };
  Kind kind = Kind::Scale;
  chorusDataType_t dtype = chorusFloat32;
  const void* src = nullptr;
  void* dst = nullptr;
  uint64_t count = 0;
  const Scalar* scalar = nullptr;       // Scale
  const ExactLayout* layout = nullptr;  // ToExact, FromExact
  uint64_t divisor = 1;                 // Divide
  float weight = 1.0f;                  // Accumulate
  WireFormat wire{};                    // Quantize, Dequantize

  static LocalOp scale(void* dst, const void* src, uint64_t count, chorusDataType_t dtype, const Scalar* s) {
    return {.kind = Kind::Scale, .dtype = dtype, .src = src, .dst = dst, .count = count, .scalar = s};
  }
  static LocalOp divide(void* dst, uint64_t count, chorusDataType_t dtype, uint64_t divisor) {
    return {.kind = Kind::Divide, .dtype = dtype, .dst = dst, .count = count, .divisor = divisor};
  }
  static LocalOp toExact(int64_t* dst, const void* src, uint64_t count, const ExactLayout* l) {
    return {.kind = Kind::ToExact, .dtype = l->dtype, .src = src, .dst = dst, .count = count, .layout = l};
  }
  static LocalOp fromExact(void* dst, const int64_t* src, uint64_t count, const ExactLayout* l) {
    return {.kind = Kind::FromExact, .dtype = l->dtype, .src = src, .dst = dst, .count = count, .layout = l};
  }
  static LocalOp accumulate(float* dst, const void* src, uint64_t count, chorusDataType_t dtype, float weight) {
    return {.kind = Kind::Accumulate, .dtype = dtype, .src = src, .dst = dst, .count = count, .weight = weight};
  }
  static LocalOp fromFloat(void* dst, const float* src, uint64_t count, chorusDataType_t dtype) {
    return {.kind = Kind::FromFloat, .dtype = dtype, .src = src, .dst = dst, .count = count};
  }
  static LocalOp toFloat(float* dst, const void* src, uint64_t count, chorusDataType_t dtype) {
    return {.kind = Kind::ToFloat, .dtype = dtype, .src = src, .dst = dst, .count = count};
  }
  static LocalOp quantize(void* dst, const float* src, uint64_t count, const WireFormat& w) {
    return {.kind = Kind::Quantize, .dtype = chorusFloat32, .src = src, .dst = dst, .count = count, .wire = w};
  }
  static LocalOp dequantize(float* dst, const void* src, uint64_t count, const WireFormat& w) {
    return {.kind = Kind::Dequantize, .dtype = chorusFloat32, .src = src, .dst = dst, .count = count, .wire = w};
  }
  static LocalOp exactRange(int64_t* hi_neg_lo, const void* src, uint64_t count, chorusDataType_t dtype) {
    return {.kind = Kind::ExactRange, .dtype = dtype, .src = src, .dst = hi_neg_lo, .count = count};
  }
};

void runLocalOp(const LocalOp& op);
inline void runLocalOps(std::span<const LocalOp> ops) {
  for (const LocalOp& op : ops) runLocalOp(op);
}

// The reduction kernel combining elements of dtype with op, from a table
// built at the first use; nullptr for an invalid type or op.
const kernels::Reducer* reducerFor(chorusDataType_t dtype, BinOp op);

}  // namespace chorus::exec
