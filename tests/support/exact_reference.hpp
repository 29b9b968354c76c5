// An independent reference for exact sums (CHORUS_REPRODUCIBLE=exact):
// every finite value of chorus's float types is an integer multiple of
// 2^-1074, so a sum of them is that integer, kept here in a 2304-bit two's
// complement number (not the library's carry-save digits).  A result is
// correctly rounded when no neighbour (the values one step up and down in
// magnitude: these formats are sign-magnitude) is closer to the exact sum,
// and a tie went to the even one.  Values are decoded by their defining
// formulas, not by the library's conversions.
#pragma once

#include <chorus/chorus.h>
#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace chorus::testing {

struct ExactBig {
  static constexpr int kW = 72;  // 32-bit words
  uint32_t w[kW] = {};
  static ExactBig of(double v) {  // v * 2^1074, v finite
    ExactBig b;
    if (v == 0) return b;
    int e = 0;
    const double f = std::frexp(std::fabs(v), &e);  // |v| = f 2^e, f in [0.5, 1)
    uint64_t m = static_cast<uint64_t>(std::ldexp(f, 53));
    int sh = e - 53 + 1074;
    if (sh < 0) {  // subnormal doubles: the low bits are zero
      m >>= -sh;
      sh = 0;
    }
    for (int i = 0; i < 2; ++i) {  // m's two 32-bit halves, each shifted into place
      const uint64_t half = (m >> (32 * i)) & 0xffffffffu;
      const int bit = sh + 32 * i;
      b.addAt(bit / 32, (half << (bit % 32)) & 0xffffffffu);
      b.addAt(bit / 32 + 1, bit % 32 == 0 ? 0 : half >> (32 - bit % 32));
    }
    return v < 0 ? b.neg() : b;
  }
  void addAt(int i, uint64_t v) {
    for (; i < kW && v != 0; ++i) {
      const uint64_t t = uint64_t{w[i]} + v;
      w[i] = static_cast<uint32_t>(t);
      v = t >> 32;
    }
  }
  ExactBig operator+(const ExactBig& o) const {
    ExactBig r;
    uint64_t c = 0;
    for (int i = 0; i < kW; ++i) {
      const uint64_t t = uint64_t{w[i]} + o.w[i] + c;
      r.w[i] = static_cast<uint32_t>(t);
      c = t >> 32;
    }
    return r;
  }
  ExactBig neg() const {
    ExactBig r;
    for (int i = 0; i < kW; ++i) r.w[i] = ~w[i];
    r.addAt(0, 1);
    return r;
  }
  ExactBig operator-(const ExactBig& o) const { return *this + o.neg(); }
  bool negative() const { return w[kW - 1] >> 31; }
  ExactBig abs() const { return negative() ? neg() : *this; }
  static int cmp(const ExactBig& a, const ExactBig& b) {  // a, b >= 0
    for (int i = kW - 1; i >= 0; --i)
      if (a.w[i] != b.w[i]) return a.w[i] < b.w[i] ? -1 : 1;
    return 0;
  }
};

// Bits of the type's sign; the value of raw bits (the formulas of the formats).
inline int exactSignBit(chorusDataType_t d) {
  switch (d) {
    case chorusFloat8e4m3:
    case chorusFloat8e5m2: return 7;
    case chorusFloat16:
    case chorusBfloat16: return 15;
    case chorusFloat32: return 31;
    default: return 63;
  }
}
inline double exactDecode(chorusDataType_t d, uint64_t bits) {
  if (d == chorusFloat32) return std::bit_cast<float>(static_cast<uint32_t>(bits));
  if (d == chorusFloat64) return std::bit_cast<double>(bits);
  int e = 8, m = 7;
  bool fn = false;
  if (d == chorusFloat16) e = 5, m = 10;
  if (d == chorusFloat8e4m3) e = 4, m = 3, fn = true;
  if (d == chorusFloat8e5m2) e = 5, m = 2;
  const int bias = (1 << (e - 1)) - 1;
  const bool neg = (bits >> (e + m)) & 1;
  const uint32_t ex = static_cast<uint32_t>(bits >> m) & ((1u << e) - 1);
  const uint32_t man = static_cast<uint32_t>(bits) & ((1u << m) - 1);
  double r;
  if (!fn && ex == (1u << e) - 1)
    r = man == 0 ? INFINITY : NAN;
  else if (fn && ex == (1u << e) - 1 && man == (1u << m) - 1)
    r = NAN;
  else if (ex == 0)
    r = std::ldexp(static_cast<double>(man), 1 - bias - m);
  else
    r = std::ldexp(static_cast<double>((1u << m) + man), static_cast<int>(ex) - bias - m);
  return neg ? -r : r;
}

// "" when got_bits is the correctly rounded sum of the addends, else why not.
inline std::string exactCheck(chorusDataType_t d, const std::vector<double>& addends, uint64_t got_bits) {
  ExactBig sum;
  for (double a : addends) sum = sum + ExactBig::of(a);
  const double got = exactDecode(d, got_bits);
  if (!std::isfinite(got)) return fmt::format("the result {} is not finite", got);
  const ExactBig err = (sum - ExactBig::of(got)).abs();
  const uint64_t sign = uint64_t{1} << exactSignBit(d);
  const uint64_t mag = got_bits & (sign - 1);
  const std::vector<uint64_t> neighbours =
      mag == 0 ? std::vector<uint64_t>{1, sign | 1}
               : std::vector<uint64_t>{(got_bits & sign) | (mag - 1), (got_bits & sign) | (mag + 1)};
  for (uint64_t nb : neighbours) {
    const double v = exactDecode(d, nb);
    if (!std::isfinite(v)) continue;
    const int c = ExactBig::cmp(err, (sum - ExactBig::of(v)).abs());
    if (c > 0) return fmt::format("{} is farther from the exact sum than {}", got, v);
    if (c == 0 && (got_bits & 1) != 0) return fmt::format("a tie went to the odd {} (not {})", got, v);
  }
  return "";
}

}  // namespace chorus::testing
