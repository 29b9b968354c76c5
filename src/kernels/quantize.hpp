// Compressed wire formats for reductions (issue 19 sec. 2): the kernels a
// compressed collective calls to put fp32 data on the wire narrower than it
// is, and to take it off again with fp32 accumulation at the combining rank.
//
// Two formats, the ones src/sim/compress.hpp prices:
//
//   bf16       2 B per element: each fp32 rounded to bf16 (nearest, ties to
//              even; convert.hpp's rule, so NaN stays NaN and overflow is inf).
//   fp8 e4m3   1 B per element plus one fp32 scale per block of `block`
//              consecutive elements (32 <= block <= 1024, any integer, as the
//              simulator accepts; default 128).  e4m3 is the "FN" variant
//              (no infinities, S.1111.111 is NaN, largest finite 448).
//
// Wire layout (little-endian; two ranks must agree, so it is fixed):
//
//   bf16:  n x uint16 (the bf16 bits), element i at byte 2i.
//   fp8:   nb = ceil(n / block) fp32 scales first (scale of block j at byte
//          4j), then the n e4m3 codes (element i at byte 4 nb + i).  A partial
//          last block has a scale of its own.  Scales first, so a buffer that
//          is 4-byte aligned has aligned scales and the codes are one
//          contiguous run; the kernels themselves assume no alignment.
//   wireBytes() is exactly this size.  Blocks are counted from the first
//   element of the call, so quantize and dequantize must be called on the
//   same range (a plan that splits a shard must split the wire buffers too,
//   or split at block boundaries and call once per piece).
//
// fp8 block scale (the rule both ranks need, and the error bound's base):
//   amax  = the largest |x| over the block's finite elements (NaN and inf
//           are left out);
//   scale = amax / 256  (exact: a power-of-two division) when amax >= 2^-118,
//           else 0 (the block is sent as zeros).
//   code  = e4m3(x * (256 / amax)), round to nearest even; decoded value =
//           e4m3value(code) * scale, in fp32.
// Why 256 rather than 448 (the format's largest finite value): the block's
// largest element maps to 256 * (1 +- 2^-23), which rounds to exactly 256 and
// decodes to exactly amax, so a block's extreme and all-equal data survive
// bit for bit, the codes never come near the overflow edge (|code| <= 256 <
// 448, no clamp needed, never NaN for finite input), and relative precision
// in e4m3's normal range is the same (4 significant bits) -- the cost is
// 0.8 of a binade less range below amax before e4m3 goes subnormal.
// Below 2^-118 the scale would be an fp32 subnormal (inexact), and 256 / amax
// would overflow soon after; such blocks (all |x| < 3.3e-36) become zeros.
//
// Non-finite inputs: a NaN or +-inf element is sent as e4m3 NaN (sign kept)
// and decodes to NaN -- e4m3 has no infinity, so inf becomes NaN rather than
// a finite value; the block's other elements are quantized normally (the
// non-finite ones do not enter amax).  bf16 keeps inf and NaN as such.  Either
// way a non-finite contribution makes the reduced element non-finite, as it
// would uncompressed (inf becomes NaN with fp8).
//
// Error bounds (derived in docs/algorithms.md, "Compressed wire formats
// (kernels)"; the tests check them on random, outlier-heavy, all-equal and
// tiny data):
//   bf16:  |q(x) - x| <= max(2^-8 |x|, 2^-134)   for |x| < 0x1.ffp127
//          (bf16 keeps 8 significant bits: half an ulp is at most 2^-8 of the
//          value; 2^-134 is half bf16's smallest subnormal; at or above
//          0x1.ffp127 = (2 - 2^-8) 2^127 x rounds to inf).
//   fp8:   |q(x) - x| <= max(2^-4 |x|, 2^-10 scale) (1 + 2^-20) + 2^-21 |x|
//          (e4m3 keeps 4 significant bits in its normal range, |y| >= 2^-6:
//          half an ulp <= 2^-4 |y|; below it the spacing is 2^-9, half of it
//          2^-10, in units of the scale; the last terms cover the fp32
//          roundings of 256 / amax, x * that, and code * scale), with
//          scale = amax / 256; and |q(x) - x| = |x| < 2^-118 in a zeroed block.
// An element quantized k times along a plan accumulates at most k such
// errors, each relative to the value quantized at that step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.hpp"
#include "common/wire_format.hpp"

namespace chorus::kernels {

// The format as a value -- WireFormat, its spellings and sizes -- is
// common/wire_format.hpp's.
using chorus::checkWireFormat;
using chorus::kFp8DefaultBlock;
using chorus::kFp8MaxBlock;
using chorus::kFp8MinBlock;
using chorus::parseWireFormat;
using chorus::WireFormat;
using chorus::wireBytes;
using chorus::wireFormatName;
using chorus::wireScales;

// Largest-magnitude elements map to this e4m3 value (see above).
inline constexpr float kFp8Target = 256.0f;
// Blocks whose amax is below this are sent as zeros: 2^-118.
inline constexpr float kFp8MinAmax = 0x1p-118f;

// The kernels.  `fmt` must pass checkWireFormat (asserted, not re-checked:
// the plan validated it once).  `wire` holds wireBytes(fmt, n) bytes and must
// not overlap src/dst/acc; no alignment is required of any pointer.
void quantize(const WireFormat& fmt, const float* src, size_t n, std::byte* wire);
// dst[i] = the decoded value of element i.
void dequantize(const WireFormat& fmt, const std::byte* wire, size_t n, float* dst);
// acc[i] += the decoded value of element i (the combining rank's step: fp32
// accumulation, one rounding per add; bit-identical to acc + dequantize).
void dequantizeAdd(const WireFormat& fmt, const std::byte* wire, size_t n, float* acc);

// The scale of fp8 block `j` of a wire buffer (for tests and tracing).
float fp8Scale(const std::byte* wire, size_t j);
// The scale quantize() gives a block whose finite amax is `amax`.
float fp8ScaleFor(float amax);

// The per-element bounds above, as the tests and the verifier's error
// analysis use them.  `block_amax` is the finite amax of x's block.
double bf16ErrorBound(float x);
double fp8ErrorBound(float x, float block_amax);

// Compile-time facts the layout relies on.
static_assert(sizeof(float) == 4);

}  // namespace chorus::kernels
