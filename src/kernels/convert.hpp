// Scalar conversions between fp32 and the narrow float formats, as constexpr
// bit manipulation (internal to src/kernels; the public names are in
// dtype.hpp).  Inline so the kernels' scalar tails and the fp8 loops inline them.
//
// One generic encoder/decoder covers fp16 (E5M10), fp8 e5m2 (E5M2) and fp8
// e4m3 (E4M3, "FN": no infinities, only S.1111.111 is NaN).  bf16 is the top
// half of an fp32, so it has its own two-line rules.
//
// Rounding is to nearest, ties to even, with correct subnormals.  Overflow
// (a finite value whose rounded magnitude exceeds the format's largest finite
// value) gives infinity for the IEEE-like formats and NaN for e4m3: this is
// what NVIDIA's cuda_fp8 does with __NV_NOSAT (no saturation), so chorus and a
// GPU peer agree bit for bit.  For e4m3 that means |x| > 464 -> NaN, while
// exactly 464 (the tie between 448 = 1.110b*2^8 and 480) rounds to even, 448.
// Infinities become NaN in e4m3.  NaN inputs give a quiet NaN of the same sign.
#pragma once

#include <bit>
#include <cstdint>

namespace chorus::kernels::convert {

// value = (-1)^s * 2^(exp-bias) * 1.man   (exp field 1..max)
//       = (-1)^s * 2^(1-bias)   * 0.man   (exp field 0)
template <int E, int M, bool kFn>
constexpr uint32_t narrowToFloatBits(uint32_t v) {
  constexpr int kBias = (1 << (E - 1)) - 1;
  constexpr uint32_t kExpMax = (1u << E) - 1;
  constexpr uint32_t kManMask = (1u << M) - 1;
  const uint32_t sign = ((v >> (E + M)) & 1u) << 31;
  const uint32_t exp = (v >> M) & kExpMax;
  uint32_t man = v & kManMask;
  if constexpr (kFn) {
    if (exp == kExpMax && man == kManMask) return sign | 0x7fc00000u;
  } else {
    if (exp == kExpMax) {
      // Infinity, or NaN made quiet (as vcvtph2ps does).
      return man == 0 ? (sign | 0x7f800000u) : (sign | 0x7fc00000u | (man << (23 - M)));
    }
  }
  if (exp == 0) {
    if (man == 0) return sign;
    // Subnormal: normalise so the leading one becomes fp32's implicit bit.
    int e = 1 - kBias;
    while ((man & (1u << M)) == 0) {
      man <<= 1;
      --e;
    }
    man &= kManMask;
    return sign | (static_cast<uint32_t>(e + 127) << 23) | (man << (23 - M));
  }
  return sign | (static_cast<uint32_t>(static_cast<int>(exp) - kBias + 127) << 23) | (man << (23 - M));
}

template <int E, int M, bool kFn>
constexpr uint32_t floatBitsToNarrow(uint32_t u) {
  static_assert(E < 8 && M >= 1 && M < 23, "bf16 has its own rules");
  constexpr int kBias = (1 << (E - 1)) - 1;
  constexpr int kEmin = 1 - kBias;
  constexpr uint32_t kExpMax = (1u << E) - 1;
  constexpr uint32_t kManMask = (1u << M) - 1;
  constexpr uint32_t kNan = kFn ? ((kExpMax << M) | kManMask) : ((kExpMax << M) | (1u << (M - 1)));
  constexpr uint32_t kInf = kFn ? kNan : (kExpMax << M);
  // Largest finite encoding: e4m3 0x7e (448); IEEE-like: all-ones exponent minus one ulp.
  constexpr uint32_t kMaxFinite = kFn ? ((kExpMax << M) | (kManMask - 1)) : ((kExpMax << M) - 1);

  const uint32_t sign = (u >> 31) << (E + M);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | kNan | (kFn ? 0u : ((a >> (23 - M)) & kManMask));
  if (a == 0x7f800000u) return sign | kInf;
  const uint32_t fexp = a >> 23;
  // fp32 subnormals are < 2^-126, far below half the smallest narrow subnormal.
  if (fexp == 0) return sign;

  const int e = static_cast<int>(fexp) - 127;
  const uint32_t full = (a & 0x7fffffu) | 0x800000u;  // 24-bit significand, value = full * 2^(e-23)
  // Keep M fraction bits at exponent max(e, emin): drop `shift` low bits of full.
  const int shift = 23 - M + (e < kEmin ? kEmin - e : 0);
  uint32_t r = 0;
  if (shift <= 31) {
    r = full >> shift;
    const uint32_t rem = full & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
  }  // else the value is below 2^-8 of the smallest subnormal: it rounds to 0
  // Subnormal: r is the encoding itself (r == 2^M is the smallest normal).
  // Normal: r in [2^M, 2^(M+1)]; its implicit bit adds one to the biased
  // exponent e - emin, and a carry to 2^(M+1) bumps the exponent correctly.
  const uint32_t bits = e < kEmin ? r : ((static_cast<uint32_t>(e - kEmin) << M) + r);
  if (bits > kMaxFinite) return sign | kInf;
  return sign | bits;
}

constexpr float halfToFloat(uint16_t h) { return std::bit_cast<float>(narrowToFloatBits<5, 10, false>(h)); }
constexpr uint16_t floatToHalf(float f) {
  return static_cast<uint16_t>(floatBitsToNarrow<5, 10, false>(std::bit_cast<uint32_t>(f)));
}

constexpr float bf16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }
constexpr uint16_t floatToBf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  // NaN: keep sign and top payload, force the quiet bit so it cannot become inf.
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  // Round to nearest even on the 16 dropped bits; a carry walks into the
  // exponent, and past the largest finite value it lands exactly on inf.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

constexpr float fp8e4m3ToFloat(uint8_t v) { return std::bit_cast<float>(narrowToFloatBits<4, 3, true>(v)); }
constexpr uint8_t floatToFp8e4m3(float f) {
  return static_cast<uint8_t>(floatBitsToNarrow<4, 3, true>(std::bit_cast<uint32_t>(f)));
}
constexpr float fp8e5m2ToFloat(uint8_t v) { return std::bit_cast<float>(narrowToFloatBits<5, 2, false>(v)); }
constexpr uint8_t floatToFp8e5m2(float f) {
  return static_cast<uint8_t>(floatBitsToNarrow<5, 2, false>(std::bit_cast<uint32_t>(f)));
}

// Compile-time spot checks (the exhaustive ones are in tests/unit/kernels_test.cpp).
static_assert(floatToHalf(1.0f) == 0x3c00 && halfToFloat(0x3c00) == 1.0f);
static_assert(floatToHalf(65504.0f) == 0x7bff && floatToHalf(65520.0f) == 0x7c00);
static_assert(floatToFp8e4m3(448.0f) == 0x7e && floatToFp8e4m3(464.0f) == 0x7e && floatToFp8e4m3(465.0f) == 0x7f);
static_assert(floatToFp8e5m2(57344.0f) == 0x7b && floatToFp8e5m2(61440.0f) == 0x7c);
static_assert(floatToBf16(1.0f) == 0x3f80);

}  // namespace chorus::kernels::convert
