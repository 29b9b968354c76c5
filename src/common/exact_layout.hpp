// The layout of CHORUS_REPRODUCIBLE=exact's accumulator (docs/algorithms.md,
// "Reproducible reductions") as a value: how many int64 words an element
// takes and how they are weighed, computed from the type, the rank count and
// the exponent range the ranks agreed on.  The accumulator itself -- the
// conversions into and out of the words, the range scan -- is
// kernels/exact.hpp's (which also names these kernels::ExactLayout,
// kernels::exactLayout, kernels::kNoExponent).
#pragma once

#include <chorus/chorus.h>

#include <cstddef>
#include <cstdint>

#include "common/status.hpp"

namespace chorus {

struct ExactLayout {
  chorusDataType_t dtype = chorusFloat32;
  int words = 0;          // int64 words per element
  int digit_bits = 0;     // D: bits of a digit (a word of one value)
  int lsb_exp = 0;        // weight of the lowest bit: the smallest subnormal's exponent
  int precision = 0;      // significand bits (with the implicit one)
  int special_shift = 0;  // the top word's special fields start at this bit
  int field_bits = 0;     // each special field's width
  [[nodiscard]] size_t bytes() const { return static_cast<size_t>(words) * 8; }
};

// The layout for dtype and a sum of at most nranks values; an error naming
// the datatype and the supported ones for a non-floating-point type.
Result<ExactLayout> exactLayout(chorusDataType_t dtype, int nranks);

// A narrower layout for values that are all multiples of 2^lsb_exp and below
// 2^(msb_exp + 1) in magnitude (an agreed exponent range): the same sums,
// fewer words.  Clamped to the type's range.
Result<ExactLayout> exactLayout(chorusDataType_t dtype, int nranks, int64_t lsb_exp, int64_t msb_exp);

// An exponent range's "no finite nonzero value" (kernels::exactRange's).
inline constexpr int64_t kNoExponent = -(int64_t{1} << 40);

}  // namespace chorus
