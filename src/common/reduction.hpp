// The vocabulary of reductions: the elementwise combiners and a scalar of any
// data type (PreMulSum's).  Plain data; the kernels that combine, scale and
// divide are kernels/reduce.hpp's (which also names these kernels::BinOp,
// kernels::Scalar).
#pragma once

#include <chorus/chorus.h>

#include <cstdint>

namespace chorus {

// The elementwise combiners.  Avg and PreMulSum are built from Sum plus a
// scaling of the input and a division of the sum.
enum class BinOp : uint8_t { Sum, Prod, Max, Min };
inline constexpr int kNumBinOps = 4;

// A scalar of any data type, stored as its raw bytes (for PreMulSum).
struct Scalar {
  chorusDataType_t dtype = chorusFloat32;
  alignas(8) unsigned char bytes[8] = {};
};

}  // namespace chorus
