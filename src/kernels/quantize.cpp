// Compressed wire formats: bf16 and fp8 e4m3 with per-block fp32 scales (see
// quantize.hpp for the layout, the scale rule and the error bounds).
//
// Speed: these run over every byte of a compressed collective, so the inner
// loops are written for GCC's auto-vectoriser at -O2, whose "very cheap" cost
// model only vectorises a loop it can replace entirely: the work goes in
// fixed chunks of kChunk elements (a constant trip count, a multiple of every
// vector width) with a scalar tail, branch-free (selects, integer bit
// arithmetic, no calls).  The e4m3 encoder and decoder are therefore written
// here rather than taken from convert.hpp, whose general encoder has
// data-dependent shifts and early returns; the tests check them against it
// on every code and on the rounding edges.  On x86-64 GCC the three loops are
// cloned for AVX2 (target_clones: the loader picks the clone once per process
// by CPU), so no dispatch table is needed for this layer.
#include "kernels/quantize.hpp"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/convert.hpp"

static_assert(std::endian::native == std::endian::little, "the wire layout is little-endian; a big-endian host needs byte swaps");

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define CHORUS_QUANT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CHORUS_QUANT_CLONES
#endif

namespace chorus::kernels {

float fp8ScaleFor(float amax) { return amax >= kFp8MinAmax ? amax * (1.0f / kFp8Target) : 0.0f; }

float fp8Scale(const std::byte* wire, size_t j) {
  float s;
  std::memcpy(&s, wire + 4 * j, 4);
  return s;
}

double bf16ErrorBound(float x) {
  const double a = std::fabs(static_cast<double>(x));
  if (!(a < 0x1.ffp127)) return std::numeric_limits<double>::infinity();
  return std::max(0x1p-8 * a, 0x1p-134);
}

double fp8ErrorBound(float x, float block_amax) {
  const double a = std::fabs(static_cast<double>(x));
  if (!(block_amax >= kFp8MinAmax)) return a;  // a zeroed block
  const double scale = static_cast<double>(fp8ScaleFor(block_amax));
  return std::max(0x1p-4 * a, 0x1p-10 * scale) * (1 + 0x1p-20) + 0x1p-21 * a;
}

namespace {

constexpr size_t kChunk = 32;
// Helpers are always inlined, so each target clone compiles them for its ISA.
#define CHORUS_ALWAYS_INLINE inline __attribute__((always_inline))

// All ones when c, else 0.
CHORUS_ALWAYS_INLINE uint32_t maskIf(bool c) { return 0u - static_cast<uint32_t>(c); }

// ---- bf16 ----------------------------------------------------------------

CHORUS_ALWAYS_INLINE uint16_t bf16Encode(float f) { return convert::floatToBf16(f); }
CHORUS_ALWAYS_INLINE float bf16Decode(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// ---- e4m3, branch-free, for |y| <= 256 (1 + 2^-22) or non-finite ---------

// Code of y = x * inv.  Normal range (|y| >= 2^-6): round the fp32 bits to 3
// fraction bits (nearest, ties to even: add 0x7ffff plus the kept lsb, carry
// into the exponent is correct), then rebias the exponent from 127 to 7
// (subtract 120 << 3 from the top 12 bits).  Subnormal range: |y| + 2^14 in
// fp32 has an ulp of 2^-9, so the addition itself rounds |y| to e4m3's
// subnormal spacing, ties to even (the default rounding mode), and the low
// bits of the sum are the code (8 = 2^-6 when it rounds up into the normal
// range, which is the right code too).  Non-finite x: NaN (0x7f).
CHORUS_ALWAYS_INLINE uint8_t e4m3Encode(float x, float inv) {
  const uint32_t xb = std::bit_cast<uint32_t>(x);
  const float a = std::fabs(x * inv);
  const uint32_t u = std::bit_cast<uint32_t>(a);
  const uint32_t normal = ((u + 0x7ffffu + ((u >> 20) & 1u)) >> 20) - (120u << 3);
  const uint32_t sub = std::bit_cast<uint32_t>(a + 16384.0f) - std::bit_cast<uint32_t>(16384.0f);
  // Selects as masks on integers (a's bits order like a): GCC's -O2
  // vectoriser gives up on these loops when they are written as ?: .
  const uint32_t is_sub = maskIf(u < 0x3c800000u /* 2^-6 */);
  const uint32_t is_bad = maskIf((xb & 0x7fffffffu) >= 0x7f800000u);
  const uint32_t code = (((sub & is_sub) | (normal & ~is_sub)) & ~is_bad) | (0x7fu & is_bad);
  return static_cast<uint8_t>(code | ((xb >> 24) & 0x80u));
}

// Value of a code.  Normal (exponent field >= 1): move the 7 magnitude bits
// into fp32's exponent/fraction and add 120 to the exponent.  Subnormal: the
// same bits with exponent field 1 give 2^-6 (1 + m/8); minus 2^-6 that is
// m 2^-9 exactly.  0x7f/0xff: NaN.
CHORUS_ALWAYS_INLINE float e4m3Decode(uint8_t c) {
  const uint32_t m = c & 0x7fu;
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t normal = (m << 20) + (120u << 23);
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>((121u << 23) | ((m & 7u) << 20)) - 0x1p-6f);
  const uint32_t is_sub = maskIf(m < 8);
  const uint32_t is_nan = maskIf(m == 0x7fu);
  const uint32_t v = (((sub & is_sub) | (normal & ~is_sub)) & ~is_nan) | (0x7fc00000u & is_nan);
  return std::bit_cast<float>(v | sign);
}

// Largest finite |x| as fp32 bits (0 when none): integer max of the
// magnitude bits orders non-negative floats; NaN/inf bits are masked to 0.
CHORUS_ALWAYS_INLINE uint32_t finiteMagBits(float x) {
  const uint32_t m = std::bit_cast<uint32_t>(x) & 0x7fffffffu;
  return m & maskIf(m < 0x7f800000u);
}

// Each kernel is a plain loop over whole chunks of kChunk (constant trip
// count: the vectoriser's case) plus a scalar tail.

CHORUS_ALWAYS_INLINE void bf16QuantizeChunk(const float* __restrict src, uint8_t* __restrict out) {
  uint16_t tmp[kChunk];
  for (size_t k = 0; k < kChunk; ++k) tmp[k] = bf16Encode(src[k]);
  std::memcpy(out, tmp, sizeof tmp);
}

CHORUS_QUANT_CLONES
void bf16Quantize(const float* __restrict src, size_t n, uint8_t* __restrict out) {
  size_t i = 0;
  for (; i + kChunk <= n; i += kChunk) bf16QuantizeChunk(src + i, out + 2 * i);
  for (; i < n; ++i) {
    const uint16_t v = bf16Encode(src[i]);
    std::memcpy(out + 2 * i, &v, 2);
  }
}

template <bool kAdd>
CHORUS_ALWAYS_INLINE void put(float* d, float v) {
  if constexpr (kAdd) {
    *d += v;
  } else {
    *d = v;
  }
}

template <bool kAdd>
CHORUS_ALWAYS_INLINE void bf16DequantizeLoop(const uint8_t* __restrict in, size_t n, float* __restrict dst) {
  size_t i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    uint16_t tmp[kChunk];
    std::memcpy(tmp, in + 2 * i, sizeof tmp);
    for (size_t k = 0; k < kChunk; ++k) put<kAdd>(dst + i + k, bf16Decode(tmp[k]));
  }
  for (; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, in + 2 * i, 2);
    put<kAdd>(dst + i, bf16Decode(v));
  }
}

CHORUS_QUANT_CLONES
void bf16Dequantize(const uint8_t* __restrict in, size_t n, float* __restrict dst) { bf16DequantizeLoop<false>(in, n, dst); }
CHORUS_QUANT_CLONES
void bf16DequantizeAdd(const uint8_t* __restrict in, size_t n, float* __restrict acc) { bf16DequantizeLoop<true>(in, n, acc); }

CHORUS_ALWAYS_INLINE uint32_t chunkMaxBits(const float* __restrict x) {
  uint32_t m = 0;
  for (size_t k = 0; k < kChunk; ++k) {
    const uint32_t v = finiteMagBits(x[k]);
    m = v > m ? v : m;
  }
  return m;
}

CHORUS_ALWAYS_INLINE void e4m3EncodeChunk(const float* __restrict x, float inv, uint8_t* __restrict c) {
  for (size_t k = 0; k < kChunk; ++k) c[k] = e4m3Encode(x[k], inv);
}

CHORUS_QUANT_CLONES
void fp8Quantize(size_t b, const float* __restrict src, size_t n, uint8_t* __restrict wire) {
  const size_t nb = (n + b - 1) / b;
  uint8_t* __restrict codes = wire + 4 * nb;
  for (size_t j = 0; j < nb; ++j) {
    const size_t lo = j * b;
    const size_t len = std::min(b, n - lo);
    const float* __restrict x = src + lo;
    uint32_t mx = 0;
    size_t i = 0;
    for (; i + kChunk <= len; i += kChunk) mx = std::max(mx, chunkMaxBits(x + i));
    for (; i < len; ++i) mx = std::max(mx, finiteMagBits(x[i]));
    const float amax = std::bit_cast<float>(mx);
    const float scale = fp8ScaleFor(amax);
    // 0 for a zero or tiny block: every finite x then encodes as (signed) 0.
    const float inv = scale > 0.0f ? kFp8Target / amax : 0.0f;
    std::memcpy(wire + 4 * j, &scale, 4);
    uint8_t* __restrict c = codes + lo;
    for (i = 0; i + kChunk <= len; i += kChunk) e4m3EncodeChunk(x + i, inv, c + i);
    for (; i < len; ++i) c[i] = e4m3Encode(x[i], inv);
  }
}

template <bool kAdd>
CHORUS_ALWAYS_INLINE void fp8DequantizeLoop(size_t b, const uint8_t* __restrict wire, size_t n, float* __restrict dst) {
  const size_t nb = (n + b - 1) / b;
  const uint8_t* __restrict codes = wire + 4 * nb;
  for (size_t j = 0; j < nb; ++j) {
    const size_t lo = j * b;
    const size_t len = std::min(b, n - lo);
    float scale;
    std::memcpy(&scale, wire + 4 * j, 4);
    const uint8_t* __restrict c = codes + lo;
    float* __restrict d = dst + lo;
    size_t i = 0;
    for (; i + kChunk <= len; i += kChunk) {
      for (size_t k = 0; k < kChunk; ++k) put<kAdd>(d + i + k, e4m3Decode(c[i + k]) * scale);
    }
    for (; i < len; ++i) put<kAdd>(d + i, e4m3Decode(c[i]) * scale);
  }
}

CHORUS_QUANT_CLONES
void fp8Dequantize(size_t b, const uint8_t* __restrict wire, size_t n, float* __restrict dst) { fp8DequantizeLoop<false>(b, wire, n, dst); }
CHORUS_QUANT_CLONES
void fp8DequantizeAdd(size_t b, const uint8_t* __restrict wire, size_t n, float* __restrict acc) { fp8DequantizeLoop<true>(b, wire, n, acc); }

}  // namespace

void quantize(const WireFormat& fmt, const float* src, size_t n, std::byte* wire) {
  assert(checkWireFormat(fmt).isOk());
  auto* out = reinterpret_cast<uint8_t*>(wire);
  if (fmt.kind == WireFormat::Bf16) {
    bf16Quantize(src, n, out);
  } else {
    fp8Quantize(static_cast<size_t>(fmt.block), src, n, out);
  }
}

void dequantize(const WireFormat& fmt, const std::byte* wire, size_t n, float* dst) {
  assert(checkWireFormat(fmt).isOk());
  const auto* in = reinterpret_cast<const uint8_t*>(wire);
  if (fmt.kind == WireFormat::Bf16) {
    bf16Dequantize(in, n, dst);
  } else {
    fp8Dequantize(static_cast<size_t>(fmt.block), in, n, dst);
  }
}

void dequantizeAdd(const WireFormat& fmt, const std::byte* wire, size_t n, float* acc) {
  assert(checkWireFormat(fmt).isOk());
  const auto* in = reinterpret_cast<const uint8_t*>(wire);
  if (fmt.kind == WireFormat::Bf16) {
    bf16DequantizeAdd(in, n, acc);
  } else {
    fp8DequantizeAdd(static_cast<size_t>(fmt.block), in, n, acc);
  }
}

}  // namespace chorus::kernels
