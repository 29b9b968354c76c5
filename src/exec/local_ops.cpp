#include "exec/local_ops.hpp"

#include <array>

#include "common/dtype.hpp"
#include "kernels/exact.hpp"
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
