// The exact accumulator of CHORUS_REPRODUCIBLE=exact (docs/algorithms.md,
// "Reproducible reductions").
//
// Every finite value of a floating-point type is an integer multiple of the
// type's smallest subnormal 2^lsb_exp, below 2^(msb_exp + 1).  The
// accumulator holds that integer in `words` int64 words in carry-save form:
// word j weighs 2^(lsb_exp + digit_bits * j), and one value puts a signed
// digit of magnitude < 2^digit_bits in each.  The digit width leaves
// log2(nranks) bits of headroom, so the sum of nranks accumulators is the
// plain int64 sum of their words, word by word: no carries between words,
// hence associative and commutative, so any plan (chunked, pipelined,
// through any transport, reduced in any piece) gives the same words, and one
// rounding at the end gives the correctly rounded sum, identical for every
// communicator size.  Infinities and NaNs are counted in three fields of the
// top word above its finite part (+inf, -inf, NaN); the result is NaN for a
// NaN or for both infinities, else the infinity, as IEEE summation.
//
// Types: float32, bfloat16, float16, fp8 e4m3 and e5m2, float64.
//
// The full layout spans the type's whole range (10x the data for fp32); when
// the ranks first agree on the exponents their values actually span
// (exactRange, a max-allreduce of two integers), the accumulator starts at
// the smallest lowest bit instead of the smallest subnormal and needs only
// those bits: one or two words for typical data.
#pragma once

#include <chorus/chorus.h>

#include <cstddef>
#include <cstdint>

#include "common/exact_layout.hpp"
#include "common/status.hpp"

namespace chorus::kernels {

// The layout (ExactLayout, exactLayout(), kNoExponent) is
// common/exact_layout.hpp's.
using chorus::ExactLayout;
using chorus::exactLayout;
using chorus::kNoExponent;

// The exponents the finite nonzero values of src span: hi = the largest
// exponent of a leading bit, neg_lo = minus the smallest exponent of a
// lowest set bit (both kNoExponent when there is none), so that the ranks
// agree on a range by a max-allreduce of {hi, neg_lo}.
void exactRange(chorusDataType_t dtype, const void* src, size_t count, int64_t* hi, int64_t* neg_lo);

// acc[i * words .. ) = the accumulator of src[i], for i < count.
void toExact(const ExactLayout& l, int64_t* acc, const void* src, size_t count);

// dst[i] = the correctly rounded (to nearest, ties to even) value of the
// accumulator acc[i * words .. ), in l.dtype.  Out of range: as the type's
// conversion from float rounds it (infinity, or e4m3's NaN).
void fromExact(const ExactLayout& l, void* dst, const int64_t* acc, size_t count);

// dst[i] = the correctly rounded value of (acc[i * words .. ) + the
// accumulator of own[i]): an exact plan's last reduce-scatter step
// (plan::StepOp::DecodeAdd), the own input's words never stored.  own may
// not overlap acc; dst may equal own.
void fromExactAdd(const ExactLayout& l, void* dst, const void* own, const int64_t* acc, size_t count);
// dst[i] = the correctly rounded a[i] + b[i] (through the accumulator: the
// DecodeAdd of two ranks' inputs as they are); dst may equal a or b.
void fromExactSum(const ExactLayout& l, void* dst, const void* a, const void* b, size_t count);
// acc[i * words .. ) = the accumulator of a[i] + that of b[i] (EncodeAdd).
void toExactSum(const ExactLayout& l, int64_t* acc, const void* a, const void* b, size_t count);

}  // namespace chorus::kernels
