// Kernels: every dtype x op against a scalar reference written here, on every
// ISA variant this CPU can run; exhaustive narrow-float round trips; ties to
// even; aliasing; vector tails; scale/divide; names; load/store.
//
// The references are independent of src/kernels: narrow floats are decoded by
// their defining formula (ldexp) and rounded with nearbyint (ties to even in
// the default FP environment); integers are combined in (unsigned) I128
// and truncated; fp64 is checked in long double on inputs whose sums and
// products it holds exactly.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/convert.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/exact.hpp"
#include "kernels/dtype.hpp"
#include "kernels/reduce.hpp"
#include "support/exact_reference.hpp"

namespace chorus::kernels {
namespace {

constexpr BinOp kOps[] = {BinOp::Sum, BinOp::Prod, BinOp::Max, BinOp::Min};
const char* opName(BinOp op) {
  switch (op) {
    case BinOp::Sum: return "sum";
    case BinOp::Prod: return "prod";
    case BinOp::Max: return "max";
    case BinOp::Min: return "min";
  }
  return "?";
}

// ---- reference narrow float formats ----

struct Fmt {
  int e;      // exponent bits
  int m;      // mantissa bits
  bool fn;    // e4m3 "FN": no inf, only S.1111.111 is NaN
  [[nodiscard]] int bias() const { return (1 << (e - 1)) - 1; }
  [[nodiscard]] int emin() const { return 1 - bias(); }
  [[nodiscard]] double maxFinite() const {
    const int top = (1 << e) - 1;  // all-ones exponent field
    return fn ? std::ldexp(2.0 - std::ldexp(1.0, 1 - m), top - bias())
              : std::ldexp(2.0 - std::ldexp(1.0, -m), top - 1 - bias());
  }
  [[nodiscard]] double decode(uint32_t v) const {
    const bool neg = (v >> (e + m)) & 1;
    const uint32_t ex = (v >> m) & ((1u << e) - 1);
    const uint32_t man = v & ((1u << m) - 1);
    double r;
    if (!fn && ex == (1u << e) - 1) {
      r = man == 0 ? INFINITY : NAN;
    } else if (fn && ex == (1u << e) - 1 && man == (1u << m) - 1) {
      r = NAN;
    } else if (ex == 0) {
      r = std::ldexp(static_cast<double>(man), emin() - m);
    } else {
      r = std::ldexp(static_cast<double>((1u << m) + man), static_cast<int>(ex) - bias() - m);
    }
    return neg ? -r : r;
  }
  // Round to nearest even into this format, returning the value.
  [[nodiscard]] double round(double x) const {
    if (std::isnan(x)) return NAN;
    if (std::isinf(x)) return fn ? NAN : x;
    const double a = std::fabs(x);
    if (a == 0) return x;
    const int ex = std::max(std::ilogb(a), emin());
    const double q = std::ldexp(1.0, ex - m);  // the spacing of values at this exponent
    const double r = std::nearbyint(a / q) * q;
    if (r > maxFinite()) return fn ? NAN : std::copysign(INFINITY, x);
    return std::copysign(r, x);
  }
};
constexpr Fmt kHalf{5, 10, false};
constexpr Fmt kBf16{8, 7, false};
constexpr Fmt kE4m3{4, 3, true};
constexpr Fmt kE5m2{5, 2, false};

const Fmt* narrowFmt(chorusDataType_t d) {
  switch (d) {
    case chorusFloat16: return &kHalf;
    case chorusBfloat16: return &kBf16;
    case chorusFloat8e4m3: return &kE4m3;
    case chorusFloat8e5m2: return &kE5m2;
    default: return nullptr;
  }
}

// __extension__: exact 128-bit integers are a GCC/Clang extension (-Wpedantic).
__extension__ typedef __int128 I128;
__extension__ typedef unsigned __int128 U128;

bool isSigned(chorusDataType_t d) { return d == chorusInt8 || d == chorusInt32 || d == chorusInt64; }
bool isInt(chorusDataType_t d) { return !isFloatType(d); }

uint64_t readBits(const unsigned char* p, size_t size) {
  uint64_t v = 0;
  std::memcpy(&v, p, size);  // little endian
  return v;
}

// Integer element as an exact I128 (sign-extended for signed types).
I128 readInt(const unsigned char* p, chorusDataType_t d) {
  const size_t size = dtypeSize(d);
  const uint64_t bits = readBits(p, size);
  if (!isSigned(d)) return static_cast<I128>(bits);
  const int shift = 64 - static_cast<int>(size) * 8;
  return static_cast<I128>(static_cast<int64_t>(bits << shift) >> shift);
}

double readFloat(const unsigned char* p, chorusDataType_t d) {
  if (const Fmt* f = narrowFmt(d)) return f->decode(static_cast<uint32_t>(readBits(p, dtypeSize(d))));
  if (d == chorusFloat32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  double v;
  std::memcpy(&v, p, 8);
  return v;
}

double nanMax(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : (a > b ? a : b); }
double nanMin(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : (a < b ? a : b); }

bool sameFloat(double want, double got, bool checkZeroSign) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (want != got) return false;
  return !checkZeroSign || std::signbit(want) == std::signbit(got);
}

// Does `got` equal a (op) b?  On failure fills *why.
bool checkElement(chorusDataType_t d, BinOp op, const unsigned char* a, const unsigned char* b,
                  const unsigned char* got, std::string* why) {
  const size_t size = dtypeSize(d);
  if (isInt(d)) {
    const I128 x = readInt(a, d), y = readInt(b, d);
    U128 r;
    switch (op) {
      case BinOp::Sum: r = static_cast<U128>(x) + static_cast<U128>(y); break;
      case BinOp::Prod: r = static_cast<U128>(x) * static_cast<U128>(y); break;
      case BinOp::Max: r = static_cast<U128>(x > y ? x : y); break;
      default: r = static_cast<U128>(x < y ? x : y); break;
    }
    const uint64_t mask = size == 8 ? ~uint64_t{0} : ((uint64_t{1} << (size * 8)) - 1);
    const uint64_t want = static_cast<uint64_t>(r) & mask;
    const uint64_t have = readBits(got, size);
    if (want == have) return true;
    *why = "want bits " + std::to_string(want) + " got " + std::to_string(have) + " from " +
           std::to_string(static_cast<int64_t>(x)) + ", " + std::to_string(static_cast<int64_t>(y));
    return false;
  }
  const double x = readFloat(a, d), y = readFloat(b, d);
  const double have = readFloat(got, d);
  double want;
  if (op == BinOp::Max || op == BinOp::Min) {
    want = op == BinOp::Max ? nanMax(x, y) : nanMin(x, y);
  } else if (d == chorusFloat64) {
    // Inputs are chosen so long double holds the exact result: one rounding.
    const long double lx = x, ly = y;
    want = static_cast<double>(op == BinOp::Sum ? lx + ly : lx * ly);
  } else {
    // Sum/product of two floats in double, then to float: double rounding is
    // innocuous (53 >= 2*24+2), so this is the correctly rounded fp32 result,
    // i.e. the "compute in fp32" step; narrow types then round once more.
    const double exact = op == BinOp::Sum ? x + y : x * y;
    want = static_cast<float>(exact);
    if (const Fmt* f = narrowFmt(d)) want = f->round(want);
  }
  const bool zeroSign = op == BinOp::Sum || op == BinOp::Prod;
  if (sameFloat(want, have, zeroSign)) return true;
  char buf[200];
  std::snprintf(buf, sizeof buf, "want %a got %a from %a, %a", want, have, x, y);
  *why = buf;
  return false;
}

// Random elements of dtype d: all bit patterns, except fp64, whose values
// keep 30-bit significands and small exponents (see checkElement).
void fillRandom(unsigned char* p, size_t count, chorusDataType_t d, std::mt19937_64& rng) {
  const size_t size = dtypeSize(d);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t r = rng();
    if (d == chorusFloat64) {
      double v;
      switch (r & 31) {
        case 0: v = NAN; break;
        case 1: v = (r & 32) ? INFINITY : -INFINITY; break;
        case 2: v = -0.0; break;
        default:
          v = std::ldexp(static_cast<double>(static_cast<int64_t>(r >> 34) - (int64_t{1} << 29)),
                         static_cast<int>((r >> 8) & 31) - 16);
      }
      std::memcpy(p + i * size, &v, 8);
    } else {
      std::memcpy(p + i * size, &r, size);
    }
  }
}

std::vector<const KernelTable*> availableTables() {
  std::vector<const KernelTable*> out;
  for (KernelIsa isa : {KernelIsa::Generic, KernelIsa::Avx2, KernelIsa::Avx512}) {
    if (const KernelTable* t = kernelTable(isa)) out.push_back(t);
  }
  return out;
}

enum class Alias { None, DstIsA, DstIsB, AllSame };

// Runs fn over `count` random elements (shifted by `offset` elements from an
// allocation's start) with the given aliasing, and checks every element.
::testing::AssertionResult runAndCheck(ReduceFn fn, chorusDataType_t d, BinOp op, size_t count, size_t offset,
                                       Alias alias, std::mt19937_64& rng) {
  const size_t size = dtypeSize(d);
  const size_t bytes = (count + offset) * size;
  std::vector<unsigned char> a(bytes + 1), b(bytes + 1), out(bytes + 1);
  fillRandom(a.data() + offset * size, count, d, rng);
  fillRandom(b.data() + offset * size, count, d, rng);
  const std::vector<unsigned char> origA = a, origB = alias == Alias::AllSame ? a : b;
  unsigned char* pa = a.data() + offset * size;
  unsigned char* pb = b.data() + offset * size;
  unsigned char* dst = out.data() + offset * size;
  switch (alias) {
    case Alias::None: break;
    case Alias::DstIsA: dst = pa; break;
    case Alias::DstIsB: dst = pb; break;
    case Alias::AllSame: pb = pa, dst = pa; break;
  }
  // A guard byte after the end must survive (no overrun in the vector tail).
  dst[count * size] = 0xa5;
  fn(dst, pa, pb, count);
  if (dst[count * size] != 0xa5) return ::testing::AssertionFailure() << "wrote past the end";
  for (size_t i = 0; i < count; ++i) {
    std::string why;
    const size_t o = (offset + i) * size;
    if (!checkElement(d, op, origA.data() + o, origB.data() + o, dst + i * size, &why)) {
      return ::testing::AssertionFailure() << dtypeName(d) << " " << opName(op) << " count=" << count
                                           << " offset=" << offset << " alias=" << static_cast<int>(alias)
                                           << " element " << i << ": " << why;
    }
  }
  return ::testing::AssertionSuccess();
}

// ---- the matrix ----

TEST(Kernels, EveryDtypeOpIsaAliasAndSmallCount) {
  const auto tables = availableTables();
  ASSERT_FALSE(tables.empty());
  std::mt19937_64 rng(1234);
  for (const KernelTable* t : tables) {
    SCOPED_TRACE(std::string(t->isa));
    for (int di = 0; di < chorusNumTypes; ++di) {
      const auto d = static_cast<chorusDataType_t>(di);
      for (BinOp op : kOps) {
        const ReduceFn fn = t->reduce[di][static_cast<int>(op)];
        ASSERT_NE(fn, nullptr);
        // 0, 1, 7, vector-width +/- 1 at every ISA, a few unrolled blocks plus a tail.
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{15}, size_t{17}, size_t{63}, size_t{65},
                             size_t{129}, size_t{1003}}) {
          for (size_t offset : {size_t{0}, size_t{1}}) {
            for (Alias alias : {Alias::None, Alias::DstIsA, Alias::DstIsB, Alias::AllSame}) {
              ASSERT_TRUE(runAndCheck(fn, d, op, count, offset, alias, rng));
            }
          }
        }
      }
    }
  }
}

TEST(Kernels, LargeCountThroughReducer) {
  std::mt19937_64 rng(99);
  for (int di = 0; di < chorusNumTypes; ++di) {
    const auto d = static_cast<chorusDataType_t>(di);
    for (BinOp op : kOps) {
      const Reducer r(d, op);
      ASSERT_TRUE(r.valid());
      EXPECT_EQ(r.dtype(), d);
      EXPECT_EQ(r.op(), op);
      EXPECT_EQ(r.elemSize(), dtypeSize(d));
      const ReduceFn fn = activeKernels().reduce[di][static_cast<int>(op)];
      // The Reducer is bound to the active table's function.
      std::vector<unsigned char> a(64 * 8), b(64 * 8), x(64 * 8), y(64 * 8);
      fillRandom(a.data(), 64, d, rng);
      fillRandom(b.data(), 64, d, rng);
      r(x.data(), a.data(), b.data(), 64);
      fn(y.data(), a.data(), b.data(), 64);
      EXPECT_EQ(0, std::memcmp(x.data(), y.data(), 64 * dtypeSize(d)));
      ASSERT_TRUE(runAndCheck(fn, d, op, 1000003, di % 2, di % 3 == 0 ? Alias::DstIsA : Alias::None, rng));
    }
  }
}

TEST(Kernels, ActiveIsaIsTheBestAvailable) {
  const auto tables = availableTables();
  EXPECT_EQ(activeKernels().isa, tables.back()->isa);
  std::printf("kernels: active ISA %.*s (%zu variants runnable here)\n",
              static_cast<int>(activeKernels().isa.size()), activeKernels().isa.data(), tables.size());
}

TEST(Kernels, InvalidReducer) {
  EXPECT_FALSE(Reducer().valid());
  EXPECT_FALSE(Reducer(static_cast<chorusDataType_t>(chorusNumTypes), BinOp::Sum).valid());
  EXPECT_FALSE(Reducer(chorusFloat32, static_cast<BinOp>(7)).valid());
}

// Special values straight through every ISA (random bits hit them rarely for fp32).
TEST(Kernels, FloatMaxMinPropagateNan) {
  for (const KernelTable* t : availableTables()) {
    std::vector<float> a(37, 1.0f), b(37, 2.0f), out(37);
    a[3] = NAN;
    b[20] = NAN;
    a[36] = NAN;
    for (BinOp op : {BinOp::Max, BinOp::Min}) {
      t->reduce[chorusFloat32][static_cast<int>(op)](out.data(), a.data(), b.data(), out.size());
      for (size_t i = 0; i < out.size(); ++i) {
        const bool nan = i == 3 || i == 20 || i == 36;
        EXPECT_EQ(std::isnan(out[i]), nan) << t->isa << " " << opName(op) << " " << i;
        if (!nan) {
          EXPECT_EQ(out[i], op == BinOp::Max ? 2.0f : 1.0f);
        }
      }
    }
  }
}

// ---- conversions ----

TEST(Conversions, ExhaustiveHalfAndBf16) {
  for (uint32_t v = 0; v < 65536; ++v) {
    const auto h = static_cast<uint16_t>(v);
    const float f = halfToFloat(h);
    const double want = kHalf.decode(h);
    ASSERT_TRUE(sameFloat(want, f, true)) << std::hex << v;
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(halfToFloat(floatToHalf(f)))) << std::hex << v;
    } else {
      ASSERT_EQ(floatToHalf(f), h) << std::hex << v;
    }
    const float g = bf16ToFloat(h);
    ASSERT_TRUE(sameFloat(kBf16.decode(h), g, true)) << std::hex << v;
    if (std::isnan(g)) {
      ASSERT_TRUE(std::isnan(bf16ToFloat(floatToBf16(g)))) << std::hex << v;
    } else {
      ASSERT_EQ(floatToBf16(g), h) << std::hex << v;
    }
  }
}

TEST(Conversions, ExhaustiveFp8) {
  for (uint32_t v = 0; v < 256; ++v) {
    const auto b = static_cast<uint8_t>(v);
    const float f4 = fp8e4m3ToFloat(b), f5 = fp8e5m2ToFloat(b);
    ASSERT_TRUE(sameFloat(kE4m3.decode(b), f4, true)) << v;
    ASSERT_TRUE(sameFloat(kE5m2.decode(b), f5, true)) << v;
    if (std::isnan(f4)) {
      ASSERT_TRUE((v & 0x7f) == 0x7f) << v;
      ASSERT_TRUE(std::isnan(fp8e4m3ToFloat(floatToFp8e4m3(f4))));
    } else {
      ASSERT_EQ(floatToFp8e4m3(f4), b) << v;
    }
    if (std::isnan(f5)) {
      ASSERT_TRUE(std::isnan(fp8e5m2ToFloat(floatToFp8e5m2(f5))));
    } else {
      ASSERT_EQ(floatToFp8e5m2(f5), b) << v;
    }
  }
  EXPECT_EQ(fp8e4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(fp8e5m2ToFloat(0x7b), 57344.0f);
  EXPECT_TRUE(std::isinf(fp8e5m2ToFloat(0x7c)));
}

// Every encoder against the reference rounding, on random fp32 bit patterns
// and on values near every narrow tie.
TEST(Conversions, RoundingMatchesReference) {
  struct Enc {
    const Fmt* fmt;
    uint32_t (*encode)(float);
  };
  const Enc encs[] = {
      {&kHalf, [](float f) -> uint32_t { return floatToHalf(f); }},
      {&kBf16, [](float f) -> uint32_t { return floatToBf16(f); }},
      {&kE4m3, [](float f) -> uint32_t { return floatToFp8e4m3(f); }},
      {&kE5m2, [](float f) -> uint32_t { return floatToFp8e5m2(f); }},
  };
  std::mt19937_64 rng(7);
  for (const Enc& e : encs) {
    auto check = [&](float f) {
      const double want = e.fmt->round(f);
      const double got = e.fmt->decode(e.encode(f));
      return sameFloat(want, got, true);
    };
    for (int i = 0; i < 300000; ++i) {
      const auto bits = static_cast<uint32_t>(rng());
      float f;
      std::memcpy(&f, &bits, 4);
      ASSERT_TRUE(check(f)) << std::hexfloat << f;
      // Scale into the format's range so normals, subnormals and overflow all occur.
      const float g = std::ldexp(1.0f + static_cast<float>(bits & 0xffffff) / 16777216.0f,
                                 static_cast<int>(bits >> 26) - 40 + (e.fmt == &kBf16 ? 0 : 24)) *
                      ((bits & 0x800000) ? -1.0f : 1.0f);
      ASSERT_TRUE(check(g)) << std::hexfloat << g;
    }
    // Exact ties and their neighbours: midpoints between consecutive values.
    for (uint32_t v = 0; v + 1 < (1u << (e.fmt->e + e.fmt->m)); ++v) {
      const double lo = e.fmt->decode(v), hi = e.fmt->decode(v + 1);
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      const auto mid = static_cast<float>((lo + hi) / 2);  // exact: fp32 has room
      ASSERT_TRUE(check(mid)) << std::hexfloat << mid;
      ASSERT_TRUE(check(std::nextafter(mid, 0.0f))) << std::hexfloat << mid;
      ASSERT_TRUE(check(std::nextafter(mid, INFINITY))) << std::hexfloat << mid;
    }
  }
}

// Hand-derived ties (round half to even).  ulp(x) is the spacing at x.
TEST(Conversions, TiesToEvenHandDerived) {
  // fp16 has 10 fraction bits, so ulp(1) = 2^-10.
  //   1 + 2^-11 is halfway between 1 (fraction 0, even) and 1 + 2^-10 (odd) -> 1 = 0x3c00.
  EXPECT_EQ(floatToHalf(1.0f + 0x1p-11f), 0x3c00);
  //   1 + 3*2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (fraction 2, even) -> 0x3c02.
  EXPECT_EQ(floatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);
  //   Subnormal spacing is 2^-24: 2^-25 is halfway between 0 (even) and 2^-24 (odd) -> 0;
  //   3*2^-25 is halfway between 2^-24 (odd) and 2^-23 (even) -> 0x0002.
  EXPECT_EQ(floatToHalf(0x1p-25f), 0x0000);
  EXPECT_EQ(floatToHalf(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(floatToHalf(-0x1p-25f), 0x8000);  // the sign survives underflow
  //   65504 = 0x7bff (fraction all ones, odd); the next step 65536 overflows, so the tie 65520 goes
  //   "up" to the even one -> inf.  Just below the tie stays finite.
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(floatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  // bf16 has 7 fraction bits: ulp(1) = 2^-7.
  //   1 + 2^-8 -> 1 (0x3f80, even); 1 + 3*2^-8 -> 1 + 2^-6 (0x3f82, even).
  EXPECT_EQ(floatToBf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(floatToBf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  //   bf16 keeps fp32's subnormals: 0x00008000 (half of 0x0001 << 16) ties to 0; 0x00018000 -> 0x0002.
  EXPECT_EQ(floatToBf16(std::bit_cast<float>(0x00008000u)), 0x0000);
  EXPECT_EQ(floatToBf16(std::bit_cast<float>(0x00018000u)), 0x0002);
  // e4m3: bias 7, 3 fraction bits.  16 = 1.000b*2^4 is 0x58 (exponent field 4+7 = 1011b); ulp = 2.
  //   17 ties between 16 (even) and 18 (odd) -> 16 = 0x58; 19 ties between 18 and 20 (even) -> 0x5a.
  EXPECT_EQ(floatToFp8e4m3(17.0f), 0x58);
  EXPECT_EQ(floatToFp8e4m3(19.0f), 0x5a);
  //   448 = 1.110b*2^8 = 0x7e is the largest; 1.111b*2^8 is NaN, so ulp there is 32 and 464 is a
  //   tie between 448 (even) and "480" -> 448.  Anything above 464 overflows -> NaN (no saturation).
  EXPECT_EQ(floatToFp8e4m3(464.0f), 0x7e);
  EXPECT_EQ(floatToFp8e4m3(std::nextafter(464.0f, INFINITY)) & 0x7f, 0x7f);
  EXPECT_EQ(floatToFp8e4m3(-1000.0f), 0xff);
  EXPECT_EQ(floatToFp8e4m3(INFINITY) & 0x7f, 0x7f);
  //   Subnormals are multiples of 2^-9: 2^-10 ties to 0; 3*2^-10 ties to 2*2^-9 = 0x02.
  EXPECT_EQ(floatToFp8e4m3(0x1p-10f), 0x00);
  EXPECT_EQ(floatToFp8e4m3(3 * 0x1p-10f), 0x02);
  // e5m2: 2 fraction bits, ulp(1) = 0.25.  1.125 -> 1 (0x3c); 1.375 -> 1.5 (0x3e).
  EXPECT_EQ(floatToFp8e5m2(1.125f), 0x3c);
  EXPECT_EQ(floatToFp8e5m2(1.375f), 0x3e);
  //   Largest 57344 = 1.11b*2^15 (0x7b, odd); the tie 61440 rounds to the even "2^16" -> inf 0x7c.
  EXPECT_EQ(floatToFp8e5m2(61440.0f), 0x7c);
  EXPECT_EQ(floatToFp8e5m2(std::nextafter(61440.0f, 0.0f)), 0x7b);
  EXPECT_EQ(floatToFp8e5m2(-INFINITY), 0xfc);
}

// The same ties through the vector kernels (64 lanes reach every ISA's vector loop).
TEST(Kernels, VectorPathsRoundTiesToEven) {
  struct TieCase {
    chorusDataType_t d;
    uint16_t a, b, want;
  };
  const TieCase cases[] = {
      {chorusFloat16, 0x3c00, 0x1000, 0x3c00},  // 1 + 2^-11 -> 1
      {chorusFloat16, 0x3c00, 0x1600, 0x3c02},  // 1 + 3*2^-11 (1.1b*2^-10) -> 1 + 2^-9
      {chorusFloat16, 0x0001, 0x8000, 0x0001},  // subnormal + (-0) stays
      {chorusFloat16, 0x7bff, 0x4c00, 0x7c00},  // 65504 + 16 = 65520, the tie -> inf
      {chorusBfloat16, 0x3f80, 0x3b80, 0x3f80},  // 1 + 2^-8 -> 1
      {chorusBfloat16, 0x3f80, 0x3c40, 0x3f82},  // 1 + 3*2^-8 -> 1 + 2^-6
  };
  for (const KernelTable* t : availableTables()) {
    for (const TieCase& c : cases) {
      std::vector<uint16_t> a(64, c.a), b(64, c.b), out(64);
      t->reduce[c.d][0](out.data(), a.data(), b.data(), out.size());
      for (uint16_t v : out) ASSERT_EQ(v, c.want) << t->isa << " " << dtypeName(c.d) << " " << c.a << "+" << c.b;
    }
  }
}

// ---- scale and divide ----

TEST(Kernels, ScaleAndDivide) {
  std::mt19937_64 rng(5);
  for (int di = 0; di < chorusNumTypes; ++di) {
    const auto d = static_cast<chorusDataType_t>(di);
    const size_t size = dtypeSize(d);
    const size_t n = 77;
    std::vector<unsigned char> src(n * size), dst(n * size), inplace;
    fillRandom(src.data(), n, d, rng);
    // scale by 3 (same dtype scalar) and, for floats, by 0.5 given as fp64.
    Scalar three{d};
    storeFromDouble(three.bytes, d, 3.0);
    scale(dst.data(), src.data(), n, d, three);
    inplace = src;
    scale(inplace.data(), inplace.data(), n, d, three);
    EXPECT_EQ(dst, inplace) << dtypeName(d);
    for (size_t i = 0; i < n; ++i) {
      std::string why;
      ASSERT_TRUE(checkElement(d, BinOp::Prod, src.data() + i * size, three.bytes, dst.data() + i * size, &why))
          << dtypeName(d) << " scale element " << i << ": " << why;
    }
    if (isFloatType(d)) {
      Scalar half{chorusFloat64};
      const double h = 0.5;
      std::memcpy(half.bytes, &h, 8);
      scale(dst.data(), src.data(), n, d, half);
      Scalar halfSame{d};
      storeFromDouble(halfSame.bytes, d, 0.5);
      for (size_t i = 0; i < n; ++i) {
        std::string why;
        ASSERT_TRUE(
            checkElement(d, BinOp::Prod, src.data() + i * size, halfSame.bytes, dst.data() + i * size, &why))
            << dtypeName(d) << " scale by fp64 0.5, element " << i << ": " << why;
      }
    }
    // divide by 3 (and by 2^40 for integers: everything but the large 64-bit values -> 0).
    for (uint64_t by : {uint64_t{3}, uint64_t{1} << 40}) {
      divide(dst.data(), src.data(), n, d, by);
      for (size_t i = 0; i < n; ++i) {
        const unsigned char* s = src.data() + i * size;
        const unsigned char* g = dst.data() + i * size;
        if (isInt(d)) {
          const I128 x = readInt(s, d);
          const I128 want = x / static_cast<I128>(by);  // C truncates toward zero
          ASSERT_TRUE(readInt(g, d) == want) << dtypeName(d) << " " << static_cast<int64_t>(x) << "/" << by;
        } else {
          const double x = readFloat(s, d);
          double want;
          if (d == chorusFloat64) {
            // Only the power of two has an independent reference (exact); fp32 covers the /3 code path.
            if (by == 3) continue;
            want = std::ldexp(x, -40);
          } else {
            want = static_cast<float>(x / static_cast<double>(static_cast<float>(by)));  // innocuous
            if (const Fmt* f = narrowFmt(d)) want = f->round(want);
          }
          ASSERT_TRUE(sameFloat(want, readFloat(g, d), true))
              << dtypeName(d) << " " << x << "/" << by << " element " << i;
        }
      }
    }
  }
  // Signed division truncates toward zero.
  int32_t v[3] = {-7, 7, -1};
  divide(v, v, 3, chorusInt32, 2);
  EXPECT_EQ(v[0], -3);
  EXPECT_EQ(v[1], 3);
  EXPECT_EQ(v[2], 0);
}

// ---- names, load/store ----

TEST(Dtype, NamesAndAliases) {
  for (int di = 0; di < chorusNumTypes; ++di) {
    const auto d = static_cast<chorusDataType_t>(di);
    auto back = static_cast<chorusDataType_t>((di + 1) % chorusNumTypes);
    ASSERT_TRUE(parseDtype(dtypeName(d), &back)) << dtypeName(d);
    EXPECT_EQ(back, d);
  }
  const std::pair<const char*, chorusDataType_t> aliases[] = {
      {"float", chorusFloat32},       {"half", chorusFloat16},        {"double", chorusFloat64},
      {"int", chorusInt32},           {"uint", chorusUint32},         {"int64", chorusInt64},
      {"uint64", chorusUint64},       {"char", chorusInt8},           {"bf16", chorusBfloat16},
      {"fp8_e4m3", chorusFloat8e4m3}, {"fp8_e5m2", chorusFloat8e5m2}, {"e4m3", chorusFloat8e4m3},
      {"e5m2", chorusFloat8e5m2},     {"BFLOAT16", chorusBfloat16},   {"uint8", chorusUint8},
  };
  for (const auto& [name, want] : aliases) {
    chorusDataType_t got = chorusInt8;
    ASSERT_TRUE(parseDtype(name, &got)) << name;
    EXPECT_EQ(got, want) << name;
  }
  chorusDataType_t untouched = chorusInt64;
  EXPECT_FALSE(parseDtype("float128", &untouched));
  EXPECT_FALSE(parseDtype("", &untouched));
  EXPECT_EQ(untouched, chorusInt64);
  EXPECT_EQ(dtypeName(chorusBfloat16), "bfloat16");
  EXPECT_EQ(dtypeName(chorusFloat8e4m3), "float8e4m3");
}

TEST(Dtype, LoadStoreDouble) {
  for (int di = 0; di < chorusNumTypes; ++di) {
    const auto d = static_cast<chorusDataType_t>(di);
    alignas(8) unsigned char buf[8] = {};
    for (double v : {0.0, 1.0, 3.0, 96.0, -2.0, 0.5, -0.25}) {
      const bool representable = (isFloatType(d) || v == std::trunc(v)) && (isSigned(d) || isFloatType(d) || v >= 0);
      if (!representable) continue;
      storeFromDouble(buf, d, v);
      EXPECT_EQ(loadAsDouble(buf, d), v) << dtypeName(d) << " " << v;
    }
  }
  alignas(8) unsigned char buf[8];
  storeFromDouble(buf, chorusInt8, 1000.0);
  EXPECT_EQ(loadAsDouble(buf, chorusInt8), 127.0);
  storeFromDouble(buf, chorusUint8, -5.0);
  EXPECT_EQ(loadAsDouble(buf, chorusUint8), 0.0);
  storeFromDouble(buf, chorusInt32, NAN);
  EXPECT_EQ(loadAsDouble(buf, chorusInt32), 0.0);
  storeFromDouble(buf, chorusInt64, 1e30);
  int64_t i64;
  std::memcpy(&i64, buf, 8);
  EXPECT_EQ(i64, std::numeric_limits<int64_t>::max());
  storeFromDouble(buf, chorusUint64, 18446744073709549568.0);  // 2^64 - 2048, the largest double below 2^64
  uint64_t u64;
  std::memcpy(&u64, buf, 8);
  EXPECT_EQ(u64, 18446744073709549568ull);
  storeFromDouble(buf, chorusInt32, -7.9);
  EXPECT_EQ(loadAsDouble(buf, chorusInt32), -7.0);  // truncation toward zero
  // Narrow stores round: 1 + 2^-11 ties to 1 in fp16; 1000 overflows e4m3 to NaN.
  storeFromDouble(buf, chorusFloat16, 1.0 + std::ldexp(1.0, -11));
  EXPECT_EQ(loadAsDouble(buf, chorusFloat16), 1.0);
  storeFromDouble(buf, chorusFloat8e4m3, 1000.0);
  EXPECT_TRUE(std::isnan(loadAsDouble(buf, chorusFloat8e4m3)));
  storeFromDouble(buf, chorusFloat8e5m2, 1e6);
  EXPECT_TRUE(std::isinf(loadAsDouble(buf, chorusFloat8e5m2)));
}

// ---- The exact accumulator (CHORUS_REPRODUCIBLE=exact) ----
//
// Checked against support/exact_reference.hpp: the exact sum as a 2304-bit
// integer, and the result against its neighbours.

double decodeBits(chorusDataType_t d, uint64_t bits) { return testing::exactDecode(d, bits); }
int signBit(chorusDataType_t d) { return testing::exactSignBit(d); }

// A random finite value of d with |v| below `limit`, with a random exponent
// over the type's range (mixed magnitudes, subnormals included).
uint64_t randomBits(chorusDataType_t d, std::mt19937_64& rng, double limit) {
  for (;;) {
    uint64_t b = rng();
    if (d == chorusFloat64) {
      // Exponent field in a band around 1 most of the time, anywhere at times.
      const uint64_t ex = rng() % 4 == 0 ? rng() % 2046 : 1023 - 60 + rng() % 120;
      b = (b & 0x800fffffffffffffull) | (ex << 52);
    } else {
      b &= (uint64_t{1} << (signBit(d) + 1)) - 1;
    }
    const double v = decodeBits(d, b);
    if (std::isfinite(v) && std::fabs(v) < limit) return b;
  }
}

void checkCorrectlyRounded(chorusDataType_t d, const std::vector<double>& addends, uint64_t got_bits,
                           const std::string& what) {
  const std::string why = testing::exactCheck(d, addends, got_bits);
  ASSERT_EQ(why, "") << what;
}

TEST(ExactAccumulator, CorrectlyRoundedAndIndependentOfRankCount) {
  std::mt19937_64 rng(20261202);
  for (chorusDataType_t d : {chorusFloat32, chorusBfloat16, chorusFloat16, chorusFloat8e4m3, chorusFloat8e5m2,
                             chorusFloat64}) {
    const size_t es = dtypeSize(d);
    // Sums of up to 16 addends must stay finite: the largest finite / 32.
    const double limit = d == chorusFloat64 ? 1e300 : d == chorusFloat32 || d == chorusBfloat16 ? 1e37
                         : d == chorusFloat16                                                   ? 2000
                         : d == chorusFloat8e4m3                                                ? 14
                                                                                                : 1792;
    for (int trial = 0; trial < 400; ++trial) {
      const int k = 1 + trial % 16;
      std::vector<uint64_t> bits;
      for (int j = 0; j < k; ++j) {
        if (j > 0 && rng() % 3 == 0) {
          // Cancellation: the negation of an earlier addend, or its neighbour.
          const uint64_t flip = (bits[rng() % bits.size()] ^ (uint64_t{1} << signBit(d)));
          bits.push_back(rng() % 2 ? flip : (flip & ((uint64_t{1} << signBit(d)) - 1)) == 0 ? flip : flip - 1);
        } else {
          bits.push_back(randomBits(d, rng, limit));
        }
      }
      std::vector<double> values;
      for (uint64_t b : bits) values.push_back(decodeBits(d, b));
      // The same addends summed under the layouts of k, 16 and 4096 ranks
      // (narrower digits: fp64's rounding then takes the bit-by-bit path),
      // and under the narrow layout of the exponents they span (exactRange).
      int64_t hi = kNoExponent, neg_lo = kNoExponent;
      for (uint64_t b : bits) {
        int64_t h = 0, nl = 0;
        exactRange(d, &b, 1, &h, &nl);  // little-endian: the value's bytes come first
        hi = std::max(hi, h);
        neg_lo = std::max(neg_lo, nl);
      }
      uint64_t result[4] = {};
      for (int li = 0; li < 4; ++li) {
        auto layout = li == 3 ? exactLayout(d, k, -neg_lo, hi)
                              : exactLayout(d, li == 0 ? k : li == 1 ? 16 : 4096);
        ASSERT_TRUE(layout.isOk());
        const ExactLayout& l = layout.value();
        std::vector<int64_t> acc(l.words), one(l.words);
        for (uint64_t b : bits) {
          unsigned char raw[8];
          std::memcpy(raw, &b, 8);
          toExact(l, one.data(), raw, 1);
          for (int w = 0; w < l.words; ++w) acc[w] += one[w];
        }
        unsigned char out[8] = {};
        fromExact(l, out, acc.data(), 1);
        std::memcpy(&result[li], out, es);
      }
      const std::string what = fmt::format("{} with {} addends (trial {})", dtypeName(d), k, trial);
      ASSERT_EQ(result[0], result[1]) << what << ": the rank count changed the result";
      ASSERT_EQ(result[0], result[2]) << what << ": the rank count changed the result";
      ASSERT_EQ(result[0], result[3]) << what << ": the narrow layout changed the result";
      checkCorrectlyRounded(d, values, result[0], what);
    }
  }
}

// Narrow ranges (the layout exactRange agrees on) take one word, and float32
// and float64 results then take the one-word path: still correctly rounded,
// subnormal and overflowing ends included.
TEST(ExactAccumulator, NarrowRangesInOneWord) {
  std::mt19937_64 rng(7);
  for (chorusDataType_t d : {chorusFloat32, chorusFloat64}) {
    const std::vector<int> centres = d == chorusFloat32 ? std::vector<int>{-140, -126, -20, 0, 20, 100, 126}
                                                        : std::vector<int>{-1070, -1000, 0, 1000};
    for (int c : centres)
      for (int trial = 0; trial < 200; ++trial) {
        const int k = 1 + trial % 16;
        std::vector<double> values;
        std::vector<uint64_t> bits;
        for (int j = 0; j < k; ++j) {
          // 20 significant bits at an exponent within 6 of the centre.
          const double m = static_cast<double>((rng() & 0xfffff) | 0x80000) * ((rng() & 1) ? -1 : 1);
          double v = std::ldexp(m, c - 19 - static_cast<int>(rng() % 6));
          if (d == chorusFloat32) v = static_cast<float>(v);  // below 2^-149 it rounds: then it is what we sum
          values.push_back(v);
          if (d == chorusFloat32) {
            bits.push_back(std::bit_cast<uint32_t>(static_cast<float>(v)));
          } else {
            bits.push_back(std::bit_cast<uint64_t>(v));
          }
        }
        int64_t hi = kNoExponent, neg_lo = kNoExponent;
        std::vector<unsigned char> raw(bits.size() * 8);
        const size_t es = dtypeSize(d);
        for (size_t j = 0; j < bits.size(); ++j) std::memcpy(raw.data() + j * es, &bits[j], es);
        exactRange(d, raw.data(), bits.size(), &hi, &neg_lo);
        auto layout = exactLayout(d, k, -neg_lo, hi);
        ASSERT_TRUE(layout.isOk());
        const ExactLayout& l = layout.value();
        if (d == chorusFloat32) {
          ASSERT_EQ(l.words, 1) << "centre " << c;
        }
        std::vector<int64_t> acc(l.words), one(l.words * bits.size());
        toExact(l, one.data(), raw.data(), bits.size());
        for (size_t j = 0; j < bits.size(); ++j)
          for (int w = 0; w < l.words; ++w) acc[w] += one[j * l.words + w];
        uint64_t out = 0;
        fromExact(l, &out, acc.data(), 1);
        const std::string what = fmt::format("{} centre {} with {} addends (trial {})", dtypeName(d), c, k, trial);
        std::vector<double> decoded;
        for (uint64_t b : bits) decoded.push_back(decodeBits(d, b));
        const double got = decodeBits(d, out);
        if (!std::isfinite(got)) continue;  // overflow at the top centres: the type's infinity
        checkCorrectlyRounded(d, decoded, out, what);
      }
  }
}

TEST(ExactAccumulator, InfinitiesAndNaNs) {
  ExactLayout l = exactLayout(chorusFloat32, 8).value();
  auto sum = [&](std::vector<float> xs) {
    std::vector<int64_t> acc(l.words), one(l.words);
    for (float x : xs) {
      toExact(l, one.data(), &x, 1);
      for (int w = 0; w < l.words; ++w) acc[w] += one[w];
    }
    float r = 0;
    fromExact(l, &r, acc.data(), 1);
    return r;
  };
  EXPECT_EQ(sum({1.0f, INFINITY, -3.0f}), INFINITY);
  EXPECT_EQ(sum({-INFINITY, 5.0f}), -INFINITY);
  EXPECT_TRUE(std::isnan(sum({INFINITY, -INFINITY})));
  EXPECT_TRUE(std::isnan(sum({1.0f, NAN})));
  EXPECT_EQ(sum({3.4e38f, 3.4e38f}), INFINITY);  // overflow of the exact sum
  EXPECT_EQ(sum({1e30f, 1.0f, -1e30f}), 1.0f);   // no absorption
  EXPECT_EQ(sum({-0.0f, -0.0f}), 0.0f);
  // The narrow layout of {1, 2, 3} (one word), with infinities in the data:
  // the one-word fast paths hand those over to the general ones.
  std::vector<float> data = {1.0f, INFINITY, 2.0f, 3.0f, -INFINITY, NAN};
  int64_t hi = 0, neg_lo = 0;
  exactRange(chorusFloat32, data.data(), data.size(), &hi, &neg_lo);
  l = exactLayout(chorusFloat32, 8, -neg_lo, hi).value();
  ASSERT_EQ(l.words, 1);
  EXPECT_EQ(sum({1.0f, 2.0f}), 3.0f);
  EXPECT_EQ(sum({1.0f, INFINITY}), INFINITY);
  EXPECT_EQ(sum({-INFINITY, 3.0f}), -INFINITY);
  EXPECT_TRUE(std::isnan(sum({INFINITY, -INFINITY})));
  EXPECT_TRUE(std::isnan(sum({2.0f, NAN})));
  std::vector<int64_t> words(data.size());
  std::vector<float> back(data.size());
  toExact(l, words.data(), data.data(), data.size());
  fromExact(l, back.data(), words.data(), data.size());
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], INFINITY);
  EXPECT_EQ(back[3], 3.0f);
  EXPECT_EQ(back[4], -INFINITY);
  EXPECT_TRUE(std::isnan(back[5]));
}

// The vectorised one-word conversions of every kernel table this CPU runs:
// words equal to the integers the floats are, the rounding back equal to
// the scalar double path, the non-representable cases refused, the exponent
// range equal to a scalar scan; lengths that leave vector tails.
TEST(ExactAccumulator, VectorConversionsOfEveryTableMatchTheScalarDefinition) {
  std::mt19937_64 rng(77);
  for (const KernelTable* t : availableTables()) {
    SCOPED_TRACE(std::string(t->isa));
    for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{7}, size_t{8}, size_t{9}, size_t{17}, size_t{1000}}) {
      for (int lsb : {-149, -140, -30, 0, 40}) {
        SCOPED_TRACE(fmt::format("n {} lsb {}", n, lsb));
        std::vector<float> x(n);
        std::vector<int64_t> k(n), w(n);
        for (size_t i = 0; i < n; ++i) {
          // Integers of up to 22 bits (a quarter of them zero) times 2^lsb.
          k[i] = rng() % 4 == 0 ? 0 : static_cast<int64_t>(rng() % (1u << 22)) - (1 << 21);
          x[i] = static_cast<float>(std::ldexp(static_cast<double>(k[i]), lsb));
        }
        ASSERT_TRUE(t->exact.to_word(w.data(), x.data(), n, lsb));
        EXPECT_EQ(w, k);
        uint32_t hi = 7, lo = 7;
        t->exact.range(x.data(), n, &hi, &lo);
        uint32_t ref_hi = 0, ref_lo = 256;
        for (float v : x) {
          const uint32_t b = std::bit_cast<uint32_t>(v), e = (b >> 23) & 0xff;
          if ((b & 0x7fffffff) == 0 || e == 0xff) continue;
          ref_hi = std::max(ref_hi, std::max(e, 1u)), ref_lo = std::min(ref_lo, std::max(e, 1u));
        }
        EXPECT_EQ(hi, ref_hi);
        EXPECT_EQ(lo, ref_lo);
        if (n == 0) continue;
        // Refused: a non-finite value, or one below the word's lowest bit.
        std::vector<float> y = x;
        y[rng() % n] = rng() % 2 ? INFINITY : NAN;
        EXPECT_FALSE(t->exact.to_word(w.data(), y.data(), n, lsb));
        y = x;
        y[rng() % n] = std::ldexp(1.0f, lsb - 1);
        if (lsb - 1 >= -149) {
          EXPECT_FALSE(t->exact.to_word(w.data(), y.data(), n, lsb));
        }
        // The word limit: below 2^62 taken (a word wider than a double's
        // 53 bits, split in two), 2^62 (either sign) refused.
        y = x;
        const size_t at = rng() % n;
        y[at] = -static_cast<float>(std::ldexp(double{(1 << 23) + 1}, lsb + 38));  // -(2^61 + 2^38) words
        ASSERT_TRUE(t->exact.to_word(w.data(), y.data(), n, lsb));
        EXPECT_EQ(w[at], -((int64_t{1} << 61) + (int64_t{1} << 38)));
        y[at] = (rng() % 2 ? 1.0f : -1.0f) * std::ldexp(1.0f, lsb + 62);
        EXPECT_FALSE(t->exact.to_word(w.data(), y.data(), n, lsb));
        // Back: any word below 2^62, rounded once.  The reference holds the
        // word exactly (a long double's 64-bit significand) and rounds it to
        // float in one step.  Among random words of every width, the traps
        // of rounding twice (to a double, then to float): a word just above
        // a float tie, 2^K + 2^(K-24) + 1 for K >= 53, whose double is the
        // tie itself; and exact ties, which go to even.
        std::vector<int64_t> sums(n);
        std::vector<float> back(n);
        for (size_t i = 0; i < n; ++i) {
          const int width = static_cast<int>(rng() % 62), k_top = 53 + static_cast<int>(rng() % 9);
          int64_t v = static_cast<int64_t>(rng() >> (64 - width - 1) >> 1);
          switch (i % 4) {
            case 1: v = (int64_t{1} << k_top) + (int64_t{1} << (k_top - 24)) + 1; break;
            case 2: v = (int64_t{1} << k_top) + (int64_t{1} << (k_top - 24)) + (int64_t{1} << (k_top - 23)); break;
            case 3: v = (int64_t{1} << k_top) + (int64_t{1} << (k_top - 24)) - 1; break;
            default: break;
          }
          sums[i] = rng() % 2 ? -v : v;
        }
        const int out_lsb = std::max(lsb, -1022);
        const int64_t lim = int64_t{1} << 62;
        ASSERT_TRUE(t->exact.from_word(back.data(), sums.data(), n, out_lsb, lim));
        for (size_t i = 0; i < n; ++i)
          ASSERT_EQ(std::bit_cast<uint32_t>(back[i]),
                    std::bit_cast<uint32_t>(static_cast<float>(std::ldexp(static_cast<long double>(sums[i]), out_lsb))))
              << i << ": word " << sums[i];
        sums[rng() % n] = -lim;
        EXPECT_FALSE(t->exact.from_word(back.data(), sums.data(), n, out_lsb, lim));
      }
    }
  }
}

TEST(ExactAccumulator, RejectsIntegersAndHugeCommunicators) {
  auto st = exactLayout(chorusInt32, 4);
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.status().message().find("datatype=int32"), std::string::npos) << st.status().message();
  EXPECT_NE(st.status().message().find("chorusFloat32"), std::string::npos);
  EXPECT_FALSE(exactLayout(chorusFloat32, 1 << 15).isOk());
  EXPECT_TRUE(exactLayout(chorusFloat32, 1 << 14).isOk());
}

}  // namespace
}  // namespace chorus::kernels

namespace chorus::kernels {
namespace {

// fromExactAdd (the exact plan's DecodeAdd): the own input's words added to
// the accumulator's, then rounded, is fromExact of the explicit sum, for full
// (several words) and narrow (one word) layouts, in and out of place, over
// more elements than one of its pieces.
TEST(ExactAccumulator, DecodeAddEqualsEncodeAddDecode) {
  std::mt19937_64 rng(11);
  for (chorusDataType_t d : {chorusFloat32, chorusBfloat16, chorusFloat64}) {
    const size_t es = dtypeSize(d), n = 3000;
    std::vector<unsigned char> own(n * es), peer(n * es);
    for (size_t i = 0; i < n; ++i) {
      const double a = std::ldexp(static_cast<double>(rng() % 100000) - 50000, static_cast<int>(rng() % 40) - 20);
      const double b = std::ldexp(static_cast<double>(rng() % 100000) - 50000, static_cast<int>(rng() % 40) - 20);
      storeFromDouble(own.data() + i * es, d, a);
      storeFromDouble(peer.data() + i * es, d, b);
    }
    for (bool narrow : {false, true}) {
      int64_t h1, l1, h2, l2;
      exactRange(d, own.data(), n, &h1, &l1);
      exactRange(d, peer.data(), n, &h2, &l2);
      auto layout = narrow ? exactLayout(d, 2, -std::max(l1, l2), std::max(h1, h2)) : exactLayout(d, 2);
      ASSERT_TRUE(layout.isOk());
      const ExactLayout& l = *layout;
      std::vector<int64_t> wo(n * l.words), wp(n * l.words);
      toExact(l, wo.data(), own.data(), n);
      toExact(l, wp.data(), peer.data(), n);
      for (size_t i = 0; i < wo.size(); ++i) wo[i] += wp[i];
      std::vector<unsigned char> want(n * es), got(n * es), inplace(own);
      fromExact(l, want.data(), wo.data(), n);
      fromExactAdd(l, got.data(), own.data(), wp.data(), n);
      fromExactAdd(l, inplace.data(), inplace.data(), wp.data(), n);
      EXPECT_EQ(want, got) << dtypeName(d) << (narrow ? " narrow" : " full") << " words " << l.words;
      EXPECT_EQ(want, inplace) << dtypeName(d) << " in place";
    }
  }
}

}  // namespace
}  // namespace chorus::kernels

namespace chorus::kernels {
namespace {

// ---- MoE combine's accumulators (FloatAccumFns) ----

// The definition, element by element: the product rounded, then the sum
// rounded (volatile keeps this file's compiler from fusing them).
float accumulateOne(float acc, float w, float x) {
  volatile float prod = w * x;
  volatile float sum = acc + prod;
  return sum;
}

TEST(Kernels, AccumulatorsOfEveryTableMatchTheScalarDefinition) {
  std::mt19937_64 rng(4242);
  auto anyFloat = [&rng]() {
    const uint64_t r = rng();
    switch (r % 16) {
      case 0: return std::bit_cast<float>(static_cast<uint32_t>(r >> 32));  // any bits: NaNs, subnormals, infinities
      case 1: return std::ldexp(static_cast<float>(static_cast<int>(r >> 40) % 1000), -140);  // subnormal range
      default: return std::ldexp(static_cast<float>(static_cast<int64_t>(r >> 40) - (int64_t{1} << 23)), static_cast<int>((r >> 8) % 41) - 30);
    }
  };
  for (const KernelTable* t : availableTables()) {
    SCOPED_TRACE(std::string(t->isa));
    for (size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{15}, size_t{16}, size_t{17}, size_t{33}, size_t{7168}}) {
      for (size_t shift : {size_t{0}, size_t{1}, size_t{3}}) {  // unaligned starts
        SCOPED_TRACE(fmt::format("n {} shift {}", n, shift));
        const float w = anyFloat();
        std::vector<float> acc(n + shift + 1), xf(n + shift), f(n + shift + 1);
        std::vector<uint16_t> xb(n + shift), b(n + shift + 1);
        for (auto& v : acc) v = anyFloat();
        for (auto& v : xf) v = anyFloat();
        for (auto& v : xb) v = static_cast<uint16_t>(rng());
        std::vector<float> acc2 = acc, ref32 = acc, ref16 = acc;
        for (size_t i = 0; i < n; ++i) {
          ref32[shift + i] = accumulateOne(acc[shift + i], w, xf[shift + i]);
          ref16[shift + i] = accumulateOne(acc[shift + i], w, convert::bf16ToFloat(xb[shift + i]));
        }
        t->accum.accumulate_f32(acc.data() + shift, xf.data() + shift, n, w);
        t->accum.accumulate_bf16(acc2.data() + shift, xb.data() + shift, n, w);
        // Bitwise, the guard element after the end included.
        EXPECT_EQ(0, std::memcmp(acc.data(), ref32.data(), acc.size() * 4)) << "float32";
        EXPECT_EQ(0, std::memcmp(acc2.data(), ref16.data(), acc2.size() * 4)) << "bfloat16";

        const float guard = 12345.0f;
        f.back() = guard;
        b.back() = 0xa5a5;
        t->accum.bf16_to_float(f.data() + shift, xb.data() + shift, n);
        t->accum.float_to_bf16(b.data() + shift, xf.data() + shift, n);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(f[shift + i]), static_cast<uint32_t>(xb[shift + i]) << 16) << i;
          ASSERT_EQ(b[shift + i], convert::floatToBf16(xf[shift + i])) << i;
        }
        EXPECT_EQ(f.back(), guard);
        EXPECT_EQ(b.back(), 0xa5a5);
      }
    }
  }
}

}  // namespace
}  // namespace chorus::kernels
