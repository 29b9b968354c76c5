#include "common/size.hpp"

#include <array>
#include <cctype>
#include <charconv>
#include <bit>

namespace chorus {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

Result<uint64_t> parseSize(std::string_view text, std::string_view what) {
  constexpr std::string_view kExamples = "e.g. 8, 8K, 8KiB, 64M, 64MB, 1G; suffixes are powers of 1024";
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  // Digits, then optionally '.' and digits: no sign, no exponent, no spaces.
  const char* p = begin;
  while (p != end && std::isdigit(static_cast<unsigned char>(*p))) ++p;
  const char* int_end = p;
  const char* frac_begin = p;
  const char* frac_end = p;
  if (p != end && *p == '.') {
    frac_begin = ++p;
    while (p != end && std::isdigit(static_cast<unsigned char>(*p))) ++p;
    frac_end = p;
  }
  if (int_end == begin && frac_end == frac_begin)
    return invalidArgument("{} '{}' is not a size: it must start with a non-negative number ({})", what, text,
                           kExamples);
  const std::string suffix = lower(std::string_view(p, static_cast<size_t>(end - p)));
  int shift = -1;
  struct Unit {
    std::string_view a, b, c;
    int shift;
  };
  static constexpr std::array<Unit, 5> kUnits = {{{"", "b", "", 0},
                                                  {"k", "kb", "kib", 10},
                                                  {"m", "mb", "mib", 20},
                                                  {"g", "gb", "gib", 30},
                                                  {"t", "tb", "tib", 40}}};
  for (const Unit& u : kUnits)
    if (suffix == u.a || suffix == u.b || (!u.c.empty() && suffix == u.c)) shift = u.shift;
  if (shift < 0)
    return invalidArgument("{} '{}' has an unknown suffix '{}' (use B, K/KB/KiB, M/MB/MiB, G/GB/GiB or T/TB/TiB; {})",
                           what, text, std::string_view(p, static_cast<size_t>(end - p)), kExamples);

  uint64_t whole = 0;
  if (int_end != begin) {
    auto [q, ec] = std::from_chars(begin, int_end, whole);
    if (ec != std::errc() || q != int_end)
      return invalidArgument("{} '{}' is too large (at most 2^64 - 1 bytes)", what, text);
  }
  if (shift > 0 && whole > (UINT64_MAX >> shift))
    return invalidArgument("{} '{}' is too large (at most 2^64 - 1 bytes)", what, text);
  uint64_t bytes = whole << shift;
  if (frac_end != frac_begin) {
    // The fraction's d significant decimal digits f stand for f / 10^d; more
    // than 12 cannot make whole bytes with any suffix up to T (2^40 < 10^13).
    std::string_view digits(frac_begin, static_cast<size_t>(frac_end - frac_begin));
    while (!digits.empty() && digits.back() == '0') digits.remove_suffix(1);
    if (!digits.empty()) {
      if (digits.size() > 12)
        return invalidArgument("{} '{}' is not a whole number of bytes ({})", what, text, kExamples);
      uint64_t f = 0;
      for (char c : digits) f = f * 10 + static_cast<uint64_t>(c - '0');
      // f / 10^d * 2^shift is whole iff 5^d divides f and the 2s left in
      // f / 5^d and 2^shift cover 2^d.  The result is below 2^shift <= 2^40.
      uint64_t pow5 = 1;
      for (size_t i = 0; i < digits.size(); ++i) pow5 *= 5;
      const int d = static_cast<int>(digits.size());
      const uint64_t g = f / pow5;
      if (f % pow5 != 0 || std::countr_zero(g) + shift < d)
        return invalidArgument("{} '{}' is not a whole number of bytes (0.{} x 2^{} has a fraction)", what, text,
                               digits, shift);
      const uint64_t extra = shift >= d ? g << (shift - d) : g >> (d - shift);
      if (bytes > UINT64_MAX - extra)
        return invalidArgument("{} '{}' is too large (at most 2^64 - 1 bytes)", what, text);
      bytes += extra;
    }
  }
  return bytes;
}

}  // namespace chorus
