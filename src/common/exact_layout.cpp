#include "common/exact_layout.hpp"

#include <algorithm>
#include <string_view>

#include "common/dtype.hpp"

namespace chorus {
namespace {

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

// The layout of values spanning exponents [lsb_exp, msb_exp] (msb_exp: the
// largest leading bit) for sums of nranks of them.
Result<ExactLayout> layoutFor(chorusDataType_t dtype, const Format& f, int nranks, int lsb_exp, int msb_exp) {
  ExactLayout l;
  l.dtype = dtype;
  l.lsb_exp = lsb_exp;
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
  const int bits = std::max(msb_exp - lsb_exp + 1, 1);  // of the largest magnitude
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

Status unsupported(chorusDataType_t dtype) {
  return invalidArgument("datatype={} has no exact accumulator (CHORUS_REPRODUCIBLE=exact supports chorusFloat32, "
                         "chorusBfloat16, chorusFloat16, chorusFloat8e4m3, chorusFloat8e5m2 and chorusFloat64)",
                         isValidDtype(dtype) ? dtypeName(dtype) : std::string_view("?"));
}

}  // namespace

Result<ExactLayout> exactLayout(chorusDataType_t dtype, int nranks) {
  Format f;
  if (!formatOf(dtype, &f)) return unsupported(dtype);
  return layoutFor(dtype, f, nranks, f.lsb_exp, f.msb_exp);
}

Result<ExactLayout> exactLayout(chorusDataType_t dtype, int nranks, int64_t lsb_exp, int64_t msb_exp) {
  Format f;
  if (!formatOf(dtype, &f)) return unsupported(dtype);
  // No finite nonzero value anywhere (kNoExponent): one bit at the bottom.
  const int64_t lo = std::clamp<int64_t>(lsb_exp, f.lsb_exp, f.msb_exp);
  const int64_t hi = std::clamp<int64_t>(msb_exp, lo, f.msb_exp);
  return layoutFor(dtype, f, nranks, static_cast<int>(lo), static_cast<int>(hi));
}

}  // namespace chorus
