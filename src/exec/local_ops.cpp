#include "exec/local_ops.hpp"

#include <array>
#include <cstring>

#include "common/dtype.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/exact.hpp"
#include "kernels/quantize.hpp"
#include "kernels/reduce.hpp"

namespace chorus::exec {

void runLocalOp(const LocalOp& op) {
  switch (op.kind) {
    case LocalOp::Kind::Scale:
      if (op.count) kernels::scale(op.dst, op.src, op.count, op.dtype, *op.scalar);
      break;
    case LocalOp::Kind::Divide:
      if (op.count) kernels::divide(op.dst, op.dst, op.count, op.dtype, op.divisor);
      break;
    case LocalOp::Kind::ToExact:
      if (op.count) kernels::toExact(*op.layout, static_cast<int64_t*>(op.dst), op.src, op.count);
      break;
    case LocalOp::Kind::FromExact:
      if (op.count) kernels::fromExact(*op.layout, op.dst, static_cast<const int64_t*>(op.src), op.count);
      break;
    case LocalOp::Kind::Accumulate: {
      // Two roundings per element, never fused into one (this file and the
      // kernel tables are built with -ffp-contract=off): the order MoE
      // combine documents.  bfloat16 otherwise (the caller checked).
      const auto& k = kernels::activeKernels().accum;
      if (op.dtype == chorusFloat32) k.accumulate_f32(static_cast<float*>(op.dst), static_cast<const float*>(op.src), op.count, op.weight);
      else k.accumulate_bf16(static_cast<float*>(op.dst), static_cast<const uint16_t*>(op.src), op.count, op.weight);
      break;
    }
    case LocalOp::Kind::FromFloat: {
      const auto* s = static_cast<const float*>(op.src);
      if (op.dtype == chorusFloat32) {
        if (op.count && op.dst != op.src) std::memcpy(op.dst, s, op.count * sizeof(float));
      } else {
        kernels::activeKernels().accum.float_to_bf16(static_cast<uint16_t*>(op.dst), s, op.count);
      }
      break;
    }
    case LocalOp::Kind::ToFloat: {
      auto* d = static_cast<float*>(op.dst);
      if (op.dtype == chorusFloat32) {
        if (op.count && op.dst != op.src) std::memcpy(d, op.src, op.count * sizeof(float));
      } else {
        kernels::activeKernels().accum.bf16_to_float(d, static_cast<const uint16_t*>(op.src), op.count);
      }
      break;
    }
    case LocalOp::Kind::Quantize:
      if (op.count) kernels::quantize(op.wire, static_cast<const float*>(op.src), op.count, static_cast<std::byte*>(op.dst));
      break;
    case LocalOp::Kind::Dequantize:
      if (op.count) kernels::dequantize(op.wire, static_cast<const std::byte*>(op.src), op.count, static_cast<float*>(op.dst));
      break;
    case LocalOp::Kind::ExactRange: {
      auto* r = static_cast<int64_t*>(op.dst);
      kernels::exactRange(op.dtype, op.src, op.count, &r[0], &r[1]);  // no element: both kNoExponent
      break;
    }
  }
}

const kernels::Reducer* reducerFor(chorusDataType_t dtype, BinOp op) {
  using Table = std::array<std::array<kernels::Reducer, kNumBinOps>, chorusNumTypes>;
  static const Table kTable = [] {
    Table t;
    for (int d = 0; d < chorusNumTypes; ++d)
      for (int o = 0; o < kNumBinOps; ++o)
        t[static_cast<size_t>(d)][static_cast<size_t>(o)] =
            kernels::Reducer(static_cast<chorusDataType_t>(d), static_cast<BinOp>(o));
    return t;
  }();
  const auto o = static_cast<size_t>(op);
  if (!isValidDtype(dtype) || o >= static_cast<size_t>(kNumBinOps)) return nullptr;
  return &kTable[static_cast<size_t>(dtype)][o];
}

}  // namespace chorus::exec
