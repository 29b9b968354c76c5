#include "kernels/exact.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/convert.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/dtype.hpp"
#include "kernels/reduce.hpp"

namespace chorus::kernels {
namespace {

// __extension__: 128-bit integers are a GCC/Clang extension (-Wpedantic).
__extension__ typedef unsigned __int128 U128;

// Value of element i of src as a double (exact for every supported type).
double load(chorusDataType_t d, const void* src, size_t i) {
  switch (d) {
    case chorusFloat32: return static_cast<const float*>(src)[i];
    case chorusFloat64: return static_cast<const double*>(src)[i];
    case chorusFloat16: return halfToFloat(static_cast<const uint16_t*>(src)[i]);
    case chorusBfloat16: return bf16ToFloat(static_cast<const uint16_t*>(src)[i]);
    case chorusFloat8e4m3: return fp8e4m3ToFloat(static_cast<const uint8_t*>(src)[i]);
    case chorusFloat8e5m2: return fp8e5m2ToFloat(static_cast<const uint8_t*>(src)[i]);
    default: return 0;
  }
}

void store(chorusDataType_t d, void* dst, size_t i, double v) {
  switch (d) {
    case chorusFloat32: static_cast<float*>(dst)[i] = static_cast<float>(v); break;
    case chorusFloat64: static_cast<double*>(dst)[i] = v; break;
    case chorusFloat16: static_cast<uint16_t*>(dst)[i] = floatToHalf(static_cast<float>(v)); break;
    case chorusBfloat16: static_cast<uint16_t*>(dst)[i] = floatToBf16(static_cast<float>(v)); break;
    case chorusFloat8e4m3: static_cast<uint8_t*>(dst)[i] = floatToFp8e4m3(static_cast<float>(v)); break;
    case chorusFloat8e5m2: static_cast<uint8_t*>(dst)[i] = floatToFp8e5m2(static_cast<float>(v)); break;
    default: break;
  }
}

// Bits [pos, pos + len) (len <= 64) of the magnitude held in D-bit digits.
inline uint64_t bitsAt(const std::vector<uint64_t>& mag, int D, int64_t pos, int len) {
  uint64_t r = 0;
  for (int got = 0; got < len;) {
    const int64_t b = pos + got;
    const int o = static_cast<int>(b % D);
    const int take = std::min(D - o, len - got);
    const uint64_t chunk = (mag[static_cast<size_t>(b / D)] >> o) & (take == 64 ? ~0ull : (uint64_t{1} << take) - 1);
    r |= chunk << got;
    got += take;
  }
  return r;
}

// Whether any bit below `pos` is set.
inline bool anyBelow(const std::vector<uint64_t>& mag, int D, int64_t pos) {
  if (pos <= 0) return false;
  const int64_t j = pos / D;
  const int o = static_cast<int>(pos % D);
  if (o != 0 && (mag[static_cast<size_t>(j)] & ((uint64_t{1} << o) - 1)) != 0) return true;
  for (int64_t k = 0; k < j; ++k)
    if (mag[static_cast<size_t>(k)] != 0) return true;
  return false;
}

// The conversions, written once over a loader / storer of the element type,
// so that the type is chosen once per call, not per element.

// One word (a narrow layout, or the small types): the whole integer is the
// word, m << s with s + 53 <= D.
template <typename Load>
void toExactOneWord(const ExactLayout& l, int64_t* acc, size_t count, Load&& load) {
  for (size_t i = 0; i < count; ++i) {
    const uint64_t bits = std::bit_cast<uint64_t>(static_cast<double>(load(i)));
    const bool neg = bits >> 63;
    const int be = static_cast<int>((bits >> 52) & 0x7ff);
    uint64_t m = bits & ((uint64_t{1} << 52) - 1);
    if (be == 0x7ff) {
      acc[i] = int64_t{1} << (l.special_shift + (m != 0 ? 2 : neg ? 1 : 0) * l.field_bits);
      continue;
    }
    if (be == 0 && m == 0) {
      acc[i] = 0;
      continue;
    }
    int e = be == 0 ? -1074 : be - 1075;
    if (be != 0) m |= uint64_t{1} << 52;
    if (e < l.lsb_exp) {  // the low bits are zero
      m >>= (l.lsb_exp - e);
      e = l.lsb_exp;
    }
    const auto d = static_cast<int64_t>(m << (e - l.lsb_exp));
    acc[i] = neg ? -d : d;
  }
}

template <typename Load>
void toExactT(const ExactLayout& l, int64_t* acc, size_t count, Load&& load) {
  const int W = l.words, D = l.digit_bits;
  const uint64_t dmask = (uint64_t{1} << D) - 1;
  // s / D by a multiply: exact for s < 2^32 / D (s < 2100 here).
  const uint64_t recip = ((uint64_t{1} << 32) + static_cast<uint64_t>(D) - 1) / static_cast<uint64_t>(D);
  if (W == 1) return toExactOneWord(l, acc, count, load);
  for (size_t i = 0; i < count; ++i) {
    int64_t* a = acc + i * static_cast<size_t>(W);
    for (int k = 0; k < W; ++k) a[k] = 0;
    const uint64_t bits = std::bit_cast<uint64_t>(static_cast<double>(load(i)));
    const bool neg = bits >> 63;
    const int be = static_cast<int>((bits >> 52) & 0x7ff);
    uint64_t m = bits & ((uint64_t{1} << 52) - 1);
    if (be == 0x7ff) {  // +inf, -inf, NaN: count it in the top word's fields
      const int field = m != 0 ? 2 : neg ? 1 : 0;
      a[W - 1] = int64_t{1} << (l.special_shift + field * l.field_bits);
      continue;
    }
    if (be == 0 && m == 0) continue;  // zero (either sign)
    int e = be == 0 ? -1074 : be - 1075;
    if (be != 0) m |= uint64_t{1} << 52;
    // |v| = m 2^e with e possibly below lsb_exp: the low bits are then zero.
    if (e < l.lsb_exp) {
      m >>= (l.lsb_exp - e);
      e = l.lsb_exp;
    }
    const auto s = static_cast<uint64_t>(e - l.lsb_exp);  // position of m's lowest bit in the integer
    const int j = static_cast<int>((s * recip) >> 32);
    const int o = static_cast<int>(s) - j * D;
    // m << o (< 2^(53 + D)) spans at most three digits: D >= 48 (h <= 14).
    const U128 x = static_cast<U128>(m) << o;
    for (int k = 0; k < 3 && j + k < W; ++k) {
      const auto d = static_cast<int64_t>(static_cast<uint64_t>(x >> (k * D)) & dmask);
      a[j + k] = neg ? -d : d;
    }
  }
}

// 2^k as a double, k in [-1022, 1023].
inline double pow2(int k) { return std::bit_cast<double>(static_cast<uint64_t>(k + 1023) << 52); }

// The magnitude digits mag[0..W) (D bits each, mag[top] != 0) rounded to
// `precision` bits: returns q and sets *s so that the result is q 2^(lsb + s).
uint64_t roundDigits(const ExactLayout& l, const uint64_t* mag, int top, int64_t* s_out) {
  const int D = l.digit_bits, p = l.precision;
  const int bl = 64 - std::countl_zero(mag[top]);
  const int64_t hb = int64_t{top} * D + bl - 1;
  // Below the normal range the lowest bit (lsb_exp) is the type's subnormal
  // step: nothing rounds.
  const int64_t s = std::max<int64_t>(hb - (p - 1), 0);
  *s_out = s;
  // The bits [s - 1, hb] lie in digits top and top - 1 when bl + D - 1 >= p
  // (always for D >= p, i.e. all but fp64 on > 512 ranks); else bit by bit.
  if (bl + D - 1 >= p) {
    const U128 win = (static_cast<U128>(mag[top]) << D) | (top >= 1 ? mag[top - 1] : 0);
    const int64_t base = int64_t{top - 1} * D;  // the value's bit b is win's bit b - base
    if (s == 0) return top == 0 ? mag[0] : static_cast<uint64_t>(win);  // < 2^precision: exact
    const int shift = static_cast<int>(s - base);
    uint64_t q = static_cast<uint64_t>(win >> shift);
    if ((win >> (shift - 1)) & 1) {  // round to nearest, ties to even
      bool sticky = (win & ((static_cast<U128>(1) << (shift - 1)) - 1)) != 0;
      for (int k = 0; k + 1 < top && !sticky; ++k) sticky = mag[k] != 0;
      if (sticky || (q & 1)) ++q;
    }
    return q;
  }
  std::vector<uint64_t> m(mag, mag + top + 1);
  uint64_t q = bitsAt(m, D, s, static_cast<int>(hb - s + 1));
  if (s > 0 && bitsAt(m, D, s - 1, 1) != 0 && (anyBelow(m, D, s - 1) || (q & 1))) ++q;
  return q;
}

// One word and a float32 or float64 result: the integer is the word; below
// 2^53 it and its scaling by 2^lsb_exp are exact in a double (fp64: when
// the result is normal), so the one rounding is the cast to the type.
// Returns false for an element it cannot take (the general path does).
template <typename Store>
bool fromOneWord(const ExactLayout& l, int64_t w, size_t i, Store&& store) {
  const int64_t half = int64_t{1} << (l.special_shift - 1);
  if ((static_cast<uint64_t>(w + half) >> l.special_shift) != 0) return false;  // a special
  if (w >= (int64_t{1} << 53) || w <= -(int64_t{1} << 53)) return false;
  if (l.lsb_exp < -1022 || l.lsb_exp + 53 > 1023) return false;
  store(i, static_cast<double>(w) * pow2(l.lsb_exp));
  return true;
}

template <typename Store>
void fromExactT(const ExactLayout& l, const int64_t* acc, size_t count, Store&& store) {
  const int W = l.words, D = l.digit_bits;
  const int64_t base = int64_t{1} << D;
  int64_t w[64];
  uint64_t mag[64];
  const int64_t half = int64_t{1} << (l.special_shift - 1);
  const uint64_t fm = (uint64_t{1} << l.field_bits) - 1;
  const bool one_word = W == 1 && (l.dtype == chorusFloat32 || l.dtype == chorusFloat64);
  for (size_t i = 0; i < count; ++i) {
    const int64_t* a = acc + i * static_cast<size_t>(W);
    if (one_word && fromOneWord(l, a[0], i, store)) continue;
    for (int k = 0; k < W; ++k) w[k] = a[k];
    // The special fields: the top word's finite sum f has |f| < 2^(shift-1),
    // so (top + 2^(shift-1)) >> shift are the fields.
    if (const uint64_t fields = static_cast<uint64_t>(w[W - 1] + half) >> l.special_shift; fields != 0) {
      const uint64_t pinf = fields & fm, ninf = (fields >> l.field_bits) & fm, nan = fields >> (2 * l.field_bits);
      store(i, nan != 0 || (pinf != 0 && ninf != 0) ? std::nan("") : pinf != 0 ? HUGE_VAL : -HUGE_VAL);
      continue;
    }
    // Normalise the carry-save words into D-bit digits and a sign.
    auto normalise = [&](bool negate) {
      int64_t carry = 0;
      for (int j = 0; j < W; ++j) {
        const int64_t c = (negate ? -w[j] : w[j]) + carry;
        const int64_t d = c & (base - 1);  // floor mod 2^D
        carry = (c - d) >> D;              // exact: c - d is a multiple of 2^D
        mag[j] = static_cast<uint64_t>(d);
      }
      return carry;  // the sign: 0 (non-negative) or -1
    };
    bool neg = false;
    if (normalise(false) < 0) {
      neg = true;
      normalise(true);
    }
    int top = W - 1;
    while (top >= 0 && mag[top] == 0) --top;
    if (top < 0) {
      store(i, 0.0);  // an exact zero sum is +0 (round to nearest)
      continue;
    }
    int64_t s = 0;
    const uint64_t q = roundDigits(l, mag, top, &s);
    const int64_t k = l.lsb_exp + s;
    // q 2^k: exact in a double (q <= 2^53); fp64's subnormal and overflowing
    // ends go through ldexp.
    const double v = k >= -1022 && k <= 1023 ? static_cast<double>(q) * pow2(static_cast<int>(k))
                                              : std::ldexp(static_cast<double>(q), static_cast<int>(k));
    store(i, neg ? -v : v);
  }
}

}  // namespace

namespace {
template <typename Load>
void rangeT(size_t count, int64_t* hi, int64_t* neg_lo, Load&& load) {
  int64_t h = kNoExponent, nl = kNoExponent;
  for (size_t i = 0; i < count; ++i) {
    const uint64_t bits = std::bit_cast<uint64_t>(static_cast<double>(load(i)));
    const int be = static_cast<int>((bits >> 52) & 0x7ff);
    uint64_t m = bits & ((uint64_t{1} << 52) - 1);
    if (be == 0x7ff || (be == 0 && m == 0)) continue;  // specials go to the top word's fields; zeros anywhere
    if (be != 0) m |= uint64_t{1} << 52;
    const int64_t e = be == 0 ? -1074 : be - 1075;  // |v| = m 2^e
    h = std::max<int64_t>(h, e + 63 - std::countl_zero(m));
    nl = std::max<int64_t>(nl, -(e + std::countr_zero(m)));
  }
  *hi = h;
  *neg_lo = nl;
}
}  // namespace

namespace {
// float32 from the exponent fields alone (the kernel table's vector loop,
// kernels/dispatch.hpp): every value is a multiple of 2^(E - 150) and below
// 2^(E - 126), so the smallest nonzero field bounds the lowest bit and the
// largest the leading one.  Up to 23 bits wider than rangeT's exact lowest
// bits: still one word for typical data, at a fraction of the cost.
void rangeFloat(const float* x, size_t count, int64_t* hi, int64_t* neg_lo) {
  uint32_t max_e = 0, min_e = 256;
  activeKernels().exact.range(x, count, &max_e, &min_e);
  if (max_e == 0) {
    *hi = *neg_lo = kNoExponent;
    return;
  }
  *hi = static_cast<int64_t>(max_e) - 127;
  *neg_lo = -(static_cast<int64_t>(min_e) - 150);
}
}  // namespace

void exactRange(chorusDataType_t dtype, const void* src, size_t count, int64_t* hi, int64_t* neg_lo) {
  switch (dtype) {
    case chorusFloat32: return rangeFloat(static_cast<const float*>(src), count, hi, neg_lo);
    case chorusFloat64: return rangeT(count, hi, neg_lo, [&](size_t i) { return static_cast<const double*>(src)[i]; });
    default: return rangeT(count, hi, neg_lo, [&](size_t i) { return load(dtype, src, i); });
  }
}

namespace {
// float32 into one word (the kernel table's vector loop): false (words to
// be redone) when a value is not finite or does not fit the word; the
// general loop takes those.
bool toExactFloatOneWord(const ExactLayout& l, int64_t* acc, const float* x, size_t count) {
  if (l.words != 1) return false;
  return activeKernels().exact.to_word(acc, x, count, l.lsb_exp);
}
}  // namespace

void toExact(const ExactLayout& l, int64_t* acc, const void* src, size_t count) {
  switch (l.dtype) {
    case chorusFloat32:
      if (toExactFloatOneWord(l, acc, static_cast<const float*>(src), count)) return;
      return toExactT(l, acc, count, [&](size_t i) { return static_cast<const float*>(src)[i]; });
    case chorusFloat64: return toExactT(l, acc, count, [&](size_t i) { return static_cast<const double*>(src)[i]; });
    default: return toExactT(l, acc, count, [&](size_t i) { return load(l.dtype, src, i); });
  }
}

namespace {
// float32 from one word when every word is a finite integer below 2^62 (the
// common case; the kernel table's vector loop): false (outputs to be redone
// by the general path) else.
bool fromExactFloatOneWord(const ExactLayout& l, float* y, const int64_t* acc, size_t count) {
  if (l.words != 1 || l.lsb_exp < -1022 || l.lsb_exp + 62 > 1023) return false;
  // Finite words are below 2^(special_shift - 1) in magnitude.
  const int64_t lim = int64_t{1} << std::min(62, l.special_shift - 1);
  return activeKernels().exact.from_word(y, acc, count, l.lsb_exp, lim);
}
}  // namespace

namespace {
// The conversions of two operands, in pieces that stay in L1: `first`
// fills a piece of words from one operand, `second` adds the other's words,
// `done` consumes the piece.
constexpr size_t kPieceWords = 2048;
template <typename First, typename Second, typename Done>
void inPieces(const ExactLayout& l, size_t count, First&& first, Second&& second, Done&& done) {
  const size_t w = static_cast<size_t>(l.words);
  const size_t piece = std::max<size_t>(1, kPieceWords / w);
  alignas(64) int64_t tmp[kPieceWords + 64];
  for (size_t at = 0; at < count; at += piece) {
    const size_t k = std::min(piece, count - at);
    first(tmp, at, k);
    second(tmp, at, k);
    done(tmp, at, k);
  }
}
ReduceFn addWords() { return activeKernels().reduce[chorusInt64][static_cast<int>(BinOp::Sum)]; }
}  // namespace

void fromExactAdd(const ExactLayout& l, void* dst, const void* own, const int64_t* acc, size_t count) {
  static const ReduceFn add = addWords();
  const size_t w = static_cast<size_t>(l.words), es = dtypeSize(l.dtype);
  inPieces(
      l, count, [&](int64_t* t, size_t at, size_t k) { toExact(l, t, static_cast<const std::byte*>(own) + at * es, k); },
      [&](int64_t* t, size_t at, size_t k) { add(t, t, acc + at * w, k * w); },
      [&](int64_t* t, size_t at, size_t k) { fromExact(l, static_cast<std::byte*>(dst) + at * es, t, k); });
}

void fromExactSum(const ExactLayout& l, void* dst, const void* a, const void* b, size_t count) {
  static const ReduceFn add = addWords();
  const size_t w = static_cast<size_t>(l.words), es = dtypeSize(l.dtype);
  alignas(64) int64_t other[kPieceWords + 64];
  inPieces(
      l, count, [&](int64_t* t, size_t at, size_t k) { toExact(l, t, static_cast<const std::byte*>(a) + at * es, k); },
      [&](int64_t* t, size_t at, size_t k) {
        toExact(l, other, static_cast<const std::byte*>(b) + at * es, k);
        add(t, t, other, k * w);
      },
      [&](int64_t* t, size_t at, size_t k) { fromExact(l, static_cast<std::byte*>(dst) + at * es, t, k); });
}

void toExactSum(const ExactLayout& l, int64_t* acc, const void* a, const void* b, size_t count) {
  static const ReduceFn add = addWords();
  const size_t w = static_cast<size_t>(l.words), es = dtypeSize(l.dtype);
  toExact(l, acc, a, count);
  inPieces(
      l, count, [&](int64_t* t, size_t at, size_t k) { toExact(l, t, static_cast<const std::byte*>(b) + at * es, k); },
      [&](int64_t*, size_t, size_t) {},
      [&](int64_t* t, size_t at, size_t k) { add(acc + at * w, acc + at * w, t, k * w); });
}

void fromExact(const ExactLayout& l, void* dst, const int64_t* acc, size_t count) {
  switch (l.dtype) {
    case chorusFloat32:
      if (fromExactFloatOneWord(l, static_cast<float*>(dst), acc, count)) return;
      return fromExactT(l, acc, count, [&](size_t i, double v) { static_cast<float*>(dst)[i] = static_cast<float>(v); });
    case chorusFloat64:
      return fromExactT(l, acc, count, [&](size_t i, double v) { static_cast<double*>(dst)[i] = v; });
    default: return fromExactT(l, acc, count, [&](size_t i, double v) { store(l.dtype, dst, i, v); });
  }
}

}  // namespace chorus::kernels
