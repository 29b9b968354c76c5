#include "kernels/exact.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/convert.hpp"
#include "kernels/dtype.hpp"

namespace chorus::kernels {
namespace {

// __extension__: 128-bit integers are a GCC/Clang extension (-Wpedantic).
__extension__ typedef unsigned __int128 U128;

struct Format {
  int lsb_exp;    // smallest subnormal = 2^lsb_exp
  int msb_exp;    // the largest finite value is below 2^(msb_exp + 1)
  int precision;  // significand bits
};

bool formatOf(chorusDataType_t d, Format* f) {
  switch (d) {
    case chorusFloat32: *f = {-149, 127, 24}; return true;
    case chorusBfloat16: *f = {-133, 127, 8}; return true;
    case chorusFloat16: *f = {-24, 15, 11}; return true;
    case chorusFloat8e4m3: *f = {-9, 8, 4}; return true;
    case chorusFloat8e5m2: *f = {-16, 15, 3}; return true;
    case chorusFloat64: *f = {-1074, 1023, 53}; return true;
    default: return false;
  }
}

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

}  // namespace

Result<ExactLayout> exactLayout(chorusDataType_t dtype, int nranks) {
  Format f;
  if (!formatOf(dtype, &f))
    return invalidArgument("datatype={} has no exact accumulator (CHORUS_REPRODUCIBLE=exact supports chorusFloat32, "
                           "chorusBfloat16, chorusFloat16, chorusFloat8e4m3, chorusFloat8e5m2 and chorusFloat64)",
                           isValidDtype(dtype) ? dtypeName(dtype) : std::string_view("?"));
  ExactLayout l;
  l.dtype = dtype;
  l.lsb_exp = f.lsb_exp;
  l.precision = f.precision;
  // h: bits of headroom for nranks addends; a word's sum stays below 2^62.
  int h = 1;
  while ((int64_t{1} << h) < nranks) ++h;
  // The top word holds its finite sum and three counts of h + 1 bits.
  if (h > 14)
    return invalidArgument("CHORUS_REPRODUCIBLE=exact supports at most 16384 ranks (the accumulator's headroom); this "
                           "communicator has {}", nranks);
  l.digit_bits = 62 - h;
  l.field_bits = h + 1;
  const int bits = f.msb_exp - f.lsb_exp + 1;  // of the largest magnitude
  // Fewest words whose top word also holds the three special fields above
  // the sum of its finite digits.
  for (int w = 1;; ++w) {
    const int used = std::max(0, bits - l.digit_bits * (w - 1));
    if (used > l.digit_bits) continue;
    const int fin = used + h;  // the top word's finite sum is below 2^fin in magnitude
    if (fin + 1 + 3 * l.field_bits <= 62) {
      l.words = w;
      l.special_shift = fin + 1;
      break;
    }
  }
  return l;
}

void toExact(const ExactLayout& l, int64_t* acc, const void* src, size_t count) {
  const int W = l.words, D = l.digit_bits;
  const uint64_t dmask = (uint64_t{1} << D) - 1;
  std::memset(acc, 0, count * l.bytes());
  for (size_t i = 0; i < count; ++i) {
    int64_t* a = acc + i * static_cast<size_t>(W);
    const double v = load(l.dtype, src, i);
    const uint64_t bits = std::bit_cast<uint64_t>(v);
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
    const int s = e - l.lsb_exp;  // position of m's lowest bit in the integer
    // m << o (< 2^(53 + D)) spans at most three digits: D >= 48 (h <= 14).
    const int j = s / D, o = s % D;
    const U128 x = static_cast<U128>(m) << o;
    for (int k = 0; k < 3 && j + k < W; ++k) {
      const auto d = static_cast<int64_t>(static_cast<uint64_t>(x >> (k * D)) & dmask);
      a[j + k] = neg ? -d : d;
    }
  }
}

void fromExact(const ExactLayout& l, void* dst, const int64_t* acc, size_t count) {
  const int W = l.words, D = l.digit_bits;
  const int64_t base = int64_t{1} << D;
  std::vector<int64_t> w(static_cast<size_t>(W));
  std::vector<uint64_t> mag(static_cast<size_t>(W));
  for (size_t i = 0; i < count; ++i) {
    const int64_t* a = acc + i * static_cast<size_t>(W);
    std::memcpy(w.data(), a, l.bytes());
    // The special fields: the top word's finite sum f has |f| < 2^(shift-1),
    // so (top + 2^(shift-1)) >> shift are the fields.
    const int64_t half = int64_t{1} << (l.special_shift - 1);
    const uint64_t fields = static_cast<uint64_t>(w[W - 1] + half) >> l.special_shift;
    if (fields != 0) {
      const uint64_t fm = (uint64_t{1} << l.field_bits) - 1;
      const uint64_t pinf = fields & fm, ninf = (fields >> l.field_bits) & fm, nan = fields >> (2 * l.field_bits);
      const double v = nan != 0 || (pinf != 0 && ninf != 0) ? std::nan("") : pinf != 0 ? HUGE_VAL : -HUGE_VAL;
      store(l.dtype, dst, i, v);
      continue;
    }
    // Normalise the carry-save words into D-bit digits and a sign.
    auto normalise = [&](bool negate) {
      int64_t carry = 0;
      for (int j = 0; j < W; ++j) {
        const int64_t c = (negate ? -w[j] : w[j]) + carry;
        const int64_t d = c & (base - 1);  // floor mod 2^D
        carry = (c - d) >> D;              // exact: c - d is a multiple of 2^D
        mag[static_cast<size_t>(j)] = static_cast<uint64_t>(d);
      }
      return carry;  // the sign: 0 (non-negative) or -1
    };
    bool neg = false;
    if (normalise(false) < 0) {
      neg = true;
      normalise(true);
    }
    int top = W - 1;
    while (top >= 0 && mag[static_cast<size_t>(top)] == 0) --top;
    if (top < 0) {
      store(l.dtype, dst, i, 0.0);  // an exact zero sum is +0 (round to nearest)
      continue;
    }
    const int64_t hb = int64_t{top} * D + (63 - std::countl_zero(mag[static_cast<size_t>(top)]));
    // Keep `precision` bits from the highest; below the normal range the
    // lowest bit (lsb_exp) is the type's subnormal step, so nothing rounds.
    const int64_t s = std::max<int64_t>(hb - (l.precision - 1), 0);
    uint64_t q = bitsAt(mag, D, s, static_cast<int>(hb - s + 1));
    if (s > 0 && bitsAt(mag, D, s - 1, 1) != 0 && (anyBelow(mag, D, s - 1) || (q & 1))) ++q;  // nearest, ties to even
    const double v = std::ldexp(static_cast<double>(q), static_cast<int>(l.lsb_exp + s));
    store(l.dtype, dst, i, neg ? -v : v);
  }
}

}  // namespace chorus::kernels
