// Compressed wire formats (kernels/quantize.hpp): the layout and its size,
// the e4m3 encoder and decoder against convert.hpp's general conversions (on
// every code and on every rounding tie), round trips that must be exact, the
// error bounds on random, outlier-heavy, all-equal, zero, tiny, mixed-sign
// and huge data for every block size and for n off the block grid,
// dequantizeAdd against acc + dequantize, NaN/inf, and bad formats.
//
// Block amax and the bounds' inputs are recomputed here from the data, not
// read from the wire, so a wrong scale on the wire fails the bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/convert.hpp"
#include "kernels/quantize.hpp"

namespace chorus::kernels {
namespace {

constexpr int kBlocks[] = {32, 64, 128, 256, 512, 1024};
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

WireFormat fp8(int block) { return WireFormat{WireFormat::Fp8E4m3, block}; }
const WireFormat kBf16{WireFormat::Bf16, kFp8DefaultBlock};

std::vector<float> roundTrip(const WireFormat& fmt, const std::vector<float>& x) {
  std::vector<std::byte> wire(wireBytes(fmt, x.size()));
  quantize(fmt, x.data(), x.size(), wire.data());
  std::vector<float> y(x.size(), -12345.0f);
  dequantize(fmt, wire.data(), x.size(), y.data());
  return y;
}

// e4m3 value by its defining formula (independent of both encoders).
double e4m3Value(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return s ? -v : v;
}

// Checks every element against its bound; returns the largest err / bound
// over elements with a nonzero bound (how tight the bound is).
double checkBounds(const WireFormat& fmt, const std::vector<float>& x, const std::vector<float>& y,
                   const std::string& what) {
  double worst = 0;
  const size_t b = static_cast<size_t>(fmt.block);
  for (size_t i = 0; i < x.size(); ++i) {
    double bound;
    if (fmt.kind == WireFormat::Bf16) {
      bound = bf16ErrorBound(x[i]);
    } else {
      float amax = 0;
      const size_t lo = i / b * b;
      for (size_t k = lo; k < std::min(lo + b, x.size()); ++k) {
        if (std::isfinite(x[k])) amax = std::max(amax, std::fabs(x[k]));
      }
      bound = fp8ErrorBound(x[i], amax);
    }
    const double err = std::fabs(static_cast<double>(y[i]) - static_cast<double>(x[i]));
    if (!(err <= bound)) {
      ADD_FAILURE() << what << " " << wireFormatName(fmt) << " n=" << x.size() << " element " << i << ": x=" << x[i]
                    << " decoded " << y[i] << " error " << err << " > bound " << bound;
      return worst;
    }
    if (bound > 0) worst = std::max(worst, err / bound);
  }
  return worst;
}

struct DataSet {
  std::string name;
  std::vector<float> (*make)(size_t n, std::mt19937& rng);
};

const DataSet kDataSets[] = {
    {"normal",
     [](size_t n, std::mt19937& rng) {
       std::normal_distribution<float> d(0.0f, 1.0f);
       std::vector<float> v(n);
       for (float& x : v) x = d(rng);
       return v;
     }},
    {"outliers",  // one 1e6 in every 97 among 1e-3-sized values: most blocks hold one
     [](size_t n, std::mt19937& rng) {
       std::uniform_real_distribution<float> d(-1e-3f, 1e-3f);
       std::vector<float> v(n);
       for (size_t i = 0; i < n; ++i) v[i] = i % 97 == 5 ? (i % 2 ? 1e6f : -1e6f) : d(rng);
       return v;
     }},
    {"all-equal",
     [](size_t n, std::mt19937&) { return std::vector<float>(n, -0.3f); }},
    {"zeros", [](size_t n, std::mt19937&) { return std::vector<float>(n, 0.0f); }},
    {"tiny",  // 1e-9 next to 1: e4m3's subnormal range relative to the scale
     [](size_t n, std::mt19937& rng) {
       std::uniform_real_distribution<float> d(-1e-6f, 1e-6f);
       std::vector<float> v(n);
       for (size_t i = 0; i < n; ++i) v[i] = i % 32 == 0 ? 1.0f : d(rng);
       return v;
     }},
    {"fp32-subnormal",  // whole blocks below 2^-118: sent as zeros
     [](size_t n, std::mt19937& rng) {
       std::uniform_real_distribution<float> d(-1e-38f, 1e-38f);
       std::vector<float> v(n);
       for (float& x : v) x = d(rng);
       return v;
     }},
    {"mixed-magnitudes",  // log-uniform over 2^-40..2^40, both signs
     [](size_t n, std::mt19937& rng) {
       std::uniform_real_distribution<float> e(-40.0f, 40.0f);
       std::vector<float> v(n);
       for (size_t i = 0; i < n; ++i) v[i] = (i % 3 ? 1.0f : -1.0f) * std::exp2(e(rng));
       return v;
     }},
    {"huge",
     [](size_t n, std::mt19937& rng) {
       std::uniform_real_distribution<float> d(-1.0f, 1.0f);  // scaled after: the width 6.6e38 would be inf
       std::vector<float> v(n);
       for (float& x : v) x = d(rng) * 3.3e38f;
       if (n > 0) v[0] = std::numeric_limits<float>::max();
       return v;
     }},
};

TEST(Quantize, WireBytesCountScalesPerStartedBlock) {
  EXPECT_EQ(wireBytes(kBf16, 0), 0u);
  EXPECT_EQ(wireBytes(kBf16, 1000), 2000u);
  EXPECT_EQ(wireBytes(fp8(128), 0), 0u);
  EXPECT_EQ(wireBytes(fp8(128), 1), 5u);
  EXPECT_EQ(wireBytes(fp8(128), 128), 132u);
  EXPECT_EQ(wireBytes(fp8(128), 129), 137u);
  EXPECT_EQ(wireBytes(fp8(32), 1 << 20), (1u << 20) + 4 * (1u << 15));
  EXPECT_EQ(wireBytes(fp8(100), 250), 250u + 12);
  EXPECT_EQ(wireScales(fp8(100), 250), 3u);
  EXPECT_EQ(wireScales(kBf16, 250), 0u);
}

TEST(Quantize, LayoutIsScalesThenCodes) {
  // Block 32, 40 elements: two scales (8 bytes), then 40 codes.
  std::vector<float> x(40, 0.0f);
  x[0] = 512.0f;  // block 0: amax 512, scale 2, x/scale = 256
  x[1] = -2.0f;   // -1 in units of the scale: code 0xb8
  x[33] = 3.0f;   // block 1: amax 3
  std::vector<std::byte> wire(wireBytes(fp8(32), x.size()));
  quantize(fp8(32), x.data(), x.size(), wire.data());
  ASSERT_EQ(wire.size(), 48u);
  EXPECT_EQ(fp8Scale(wire.data(), 0), 2.0f);
  EXPECT_EQ(fp8Scale(wire.data(), 1), 3.0f / 256.0f);
  EXPECT_EQ(static_cast<uint8_t>(wire[8 + 0]), 0x78);  // 256 = 1.000b * 2^8
  EXPECT_EQ(static_cast<uint8_t>(wire[8 + 1]), 0xb8);
  EXPECT_EQ(static_cast<uint8_t>(wire[8 + 33]), 0x78);
  EXPECT_EQ(static_cast<uint8_t>(wire[8 + 2]), 0x00);
  // bf16: the top halves of the fp32s, little-endian.
  const float v[2] = {1.0f, -2.5f};
  std::byte b[4];
  quantize(kBf16, v, 2, b);
  EXPECT_EQ(static_cast<uint8_t>(b[0]), 0x80);
  EXPECT_EQ(static_cast<uint8_t>(b[1]), 0x3f);
  EXPECT_EQ(static_cast<uint8_t>(b[2]), 0x20);
  EXPECT_EQ(static_cast<uint8_t>(b[3]), 0xc0);
}

TEST(Quantize, DecoderMatchesTheFormatOnEveryCode) {
  // Scale 1: the decoded value is the code's value.
  std::vector<std::byte> wire(4 + 256);
  const float one = 1.0f;
  std::memcpy(wire.data(), &one, 4);
  for (int c = 0; c < 256; ++c) wire[4 + c] = static_cast<std::byte>(c);
  std::vector<float> y(256);
  dequantize(fp8(256), wire.data(), 256, y.data());
  for (int c = 0; c < 256; ++c) {
    const double want = e4m3Value(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(y[c])) << "code " << c;
    } else {
      EXPECT_EQ(static_cast<double>(y[c]), want) << "code " << c;
      EXPECT_EQ(std::signbit(y[c]), (c & 0x80) != 0) << "code " << c;
      EXPECT_EQ(y[c], convert::fp8e4m3ToFloat(static_cast<uint8_t>(c))) << "code " << c;
    }
  }
}

TEST(Quantize, EncoderMatchesConvertIncludingTies) {
  // A block whose amax is 256 has scale 1 and multiplier 1, so each code must
  // be convert.hpp's e4m3 rounding of the value itself: every finite e4m3
  // value up to 256, every midpoint between neighbours (ties to even), the
  // points one fp32 ulp either side of each midpoint, and random values.
  std::vector<float> vals;
  std::vector<double> pos;
  for (int c = 0; c < 0x7f; ++c) {
    if (e4m3Value(static_cast<uint8_t>(c)) <= 256) pos.push_back(e4m3Value(static_cast<uint8_t>(c)));
  }
  for (size_t i = 0; i + 1 < pos.size(); ++i) {
    const float mid = static_cast<float>((pos[i] + pos[i + 1]) / 2);
    vals.insert(vals.end(), {static_cast<float>(pos[i]), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)});
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> e(-16.0f, 8.0f);
  for (int i = 0; i < 20000; ++i) vals.push_back(std::exp2(e(rng)));
  vals.push_back(std::nextafter(std::exp2(-10.0f), 0.0f));  // just under the smallest subnormal's half
  vals.push_back(std::exp2(-10.0f));                        // exactly half: ties to 0
  vals.push_back(std::nextafter(std::exp2(-10.0f), 1.0f));  // rounds up to 2^-9
  const size_t per = 31;  // plus the 256 that fixes the scale
  for (size_t start = 0; start < vals.size(); start += per) {
    for (float sign : {1.0f, -1.0f}) {
      std::vector<float> blk{256.0f};
      for (size_t i = start; i < std::min(start + per, vals.size()); ++i) blk.push_back(sign * vals[i]);
      std::vector<std::byte> wire(wireBytes(fp8(32), blk.size()));
      quantize(fp8(32), blk.data(), blk.size(), wire.data());
      ASSERT_EQ(fp8Scale(wire.data(), 0), 1.0f);
      for (size_t i = 0; i < blk.size(); ++i) {
        ASSERT_EQ(static_cast<uint8_t>(wire[4 + i]), convert::floatToFp8e4m3(blk[i])) << "x = " << blk[i];
      }
    }
  }
}

TEST(Quantize, Bf16RoundTripIsExactOnBf16Values) {
  std::mt19937 rng(1);
  std::vector<float> x;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = std::bit_cast<float>(h << 16);
    if (!std::isnan(f)) x.push_back(f);
  }
  const std::vector<float> y = roundTrip(kBf16, x);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(x[i])) << x[i];
}

TEST(Quantize, Fp8RoundTripIsExactOnAllEqualBlocksAndOnCodeMultiplesOfTheScale) {
  std::mt19937 rng(2);
  std::normal_distribution<float> d(0.0f, 100.0f);
  for (int block : kBlocks) {
    // Every block all equal, a different value per block.
    const size_t n = 5 * static_cast<size_t>(block) + 3;
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i += static_cast<size_t>(block)) {
      const float v = d(rng);
      std::fill(x.begin() + static_cast<std::ptrdiff_t>(i), x.begin() + static_cast<std::ptrdiff_t>(std::min(n, i + block)), v);
    }
    std::vector<float> y = roundTrip(fp8(block), x);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], x[i]) << "block " << block << " element " << i;
    // Multiples of 2^m by e4m3 values, with 256 * 2^m present: exact.
    for (int m : {-20, -3, 0, 7, 30}) {
      std::uniform_int_distribution<int> code(0, 0x7e);
      for (size_t i = 0; i < n; ++i) {
        double v;
        do {
          v = e4m3Value(static_cast<uint8_t>(code(rng) | (i % 2 ? 0x80 : 0)));
        } while (std::fabs(v) > 256);
        x[i] = static_cast<float>(std::ldexp(v, m));
      }
      for (size_t i = 0; i < n; i += static_cast<size_t>(block)) x[i] = std::ldexp(256.0f, m);
      y = roundTrip(fp8(block), x);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(y[i], x[i]) << "block " << block << " 2^" << m << " element " << i;
    }
  }
}

TEST(Quantize, MeasuredErrorStaysUnderTheBound) {
  std::mt19937 rng(3);
  double worst_fp8_normal = 0, worst_bf16_normal = 0;
  for (const DataSet& ds : kDataSets) {
    for (int block : kBlocks) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{31}, static_cast<size_t>(block), static_cast<size_t>(block) * 7 + 13,
                       size_t{10000}}) {
        const std::vector<float> x = ds.make(n, rng);
        const double w8 = checkBounds(fp8(block), x, roundTrip(fp8(block), x), ds.name);
        const double w16 = checkBounds(kBf16, x, roundTrip(kBf16, x), ds.name);
        if (ds.name == "normal") {
          worst_fp8_normal = std::max(worst_fp8_normal, w8);
          worst_bf16_normal = std::max(worst_bf16_normal, w16);
        }
      }
    }
  }
  // The bounds are tight: random data come close to them (so a bound loose
  // by 2x, or a test that measures nothing, would show here).
  EXPECT_GT(worst_fp8_normal, 0.9);
  EXPECT_GT(worst_bf16_normal, 0.9);
  std::printf("worst error / bound on normal data: fp8 %.4f, bf16 %.4f\n", worst_fp8_normal, worst_bf16_normal);
}

TEST(Quantize, OutlierBlocksKeepTheOutlierExactAndTheRestUnderTheBound) {
  // One 1e6 per block among 1e-3 values: the small ones fall into e4m3's
  // subnormal range (1e-3 / (1e6 / 256) ~ 2.6e-7 < 2^-9 = 1.95e-3) and
  // become 0 -- allowed by the bound's 2^-10 scale term, which is what it is for.
  for (int block : kBlocks) {
    std::vector<float> x(static_cast<size_t>(block) * 3);
    for (size_t i = 0; i < x.size(); ++i) x[i] = i % static_cast<size_t>(block) == 3 ? 1e6f : 1e-3f;
    const std::vector<float> y = roundTrip(fp8(block), x);
    checkBounds(fp8(block), x, y, "outliers");
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i] == 1e6f) {
        EXPECT_EQ(y[i], 1e6f);
      }
    }
  }
}

TEST(Quantize, ZerosAndTinyBlocksDecodeToZero) {
  for (float v : {0.0f, -0.0f, 1e-36f, -3e-39f, std::nextafter(kFp8MinAmax, 0.0f)}) {
    const std::vector<float> x(100, v);
    std::vector<std::byte> wire(wireBytes(fp8(64), x.size()));
    quantize(fp8(64), x.data(), x.size(), wire.data());
    EXPECT_EQ(fp8Scale(wire.data(), 0), 0.0f);
    std::vector<float> y(x.size());
    dequantize(fp8(64), wire.data(), x.size(), y.data());
    for (float f : y) EXPECT_EQ(f, 0.0f) << v;
  }
  // At 2^-118 the scale is exact (2^-126) and the block survives.
  const std::vector<float> x(40, kFp8MinAmax);
  EXPECT_EQ(roundTrip(fp8(32), x), x);
}

TEST(Quantize, DequantizeAddIsAccPlusDequantize) {
  std::mt19937 rng(4);
  std::normal_distribution<float> d(0.0f, 3.0f);
  for (const WireFormat& fmt : {kBf16, fp8(32), fp8(100), fp8(1024)}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{33}, size_t{5000}}) {
      std::vector<float> x(n), acc(n);
      for (float& v : x) v = d(rng);
      for (float& v : acc) v = d(rng);
      std::vector<std::byte> wire(wireBytes(fmt, n));
      quantize(fmt, x.data(), n, wire.data());
      std::vector<float> dq(n), sum = acc;
      dequantize(fmt, wire.data(), n, dq.data());
      dequantizeAdd(fmt, wire.data(), n, sum.data());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(sum[i]), std::bit_cast<uint32_t>(acc[i] + dq[i])) << wireFormatName(fmt) << " " << i;
      }
    }
  }
}

TEST(Quantize, EmptyInputWritesNothing) {
  std::byte wire[8];
  std::memset(wire, 0xab, sizeof wire);
  float dst[2] = {7.0f, 8.0f};
  for (const WireFormat& fmt : {kBf16, fp8(128)}) {
    quantize(fmt, dst, 0, wire);
    dequantize(fmt, wire, 0, dst);
    dequantizeAdd(fmt, wire, 0, dst);
  }
  for (std::byte b : wire) EXPECT_EQ(static_cast<uint8_t>(b), 0xab);
  EXPECT_EQ(dst[0], 7.0f);
  EXPECT_EQ(dst[1], 8.0f);
}

TEST(Quantize, NonFiniteInputsStayNonFinite) {
  // fp8: NaN and +-inf become NaN; the rest of the block is quantized by the
  // finite amax, so one inf does not wipe out its neighbours.
  std::vector<float> x(64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.25f - 3.0f;
  x[5] = kNaN;
  x[6] = kInf;
  x[7] = -kInf;
  x[40] = -kNaN;
  const std::vector<float> y = roundTrip(fp8(32), x);
  for (size_t i : {5, 6, 7, 40}) EXPECT_TRUE(std::isnan(y[i])) << i;
  std::vector<float> finite_x = x, finite_y = y;
  for (size_t i : {5, 6, 7, 40}) finite_x[i] = finite_y[i] = 0.0f;
  checkBounds(fp8(32), finite_x, finite_y, "around non-finite");
  // A block of nothing but NaN/inf: all NaN (scale 0, still NaN).
  const std::vector<float> bad{kInf, kNaN, -kInf};
  for (float f : roundTrip(fp8(32), bad)) EXPECT_TRUE(std::isnan(f));
  // bf16 keeps inf as inf and NaN as NaN.
  const std::vector<float> yb = roundTrip(kBf16, x);
  EXPECT_TRUE(std::isnan(yb[5]));
  EXPECT_EQ(yb[6], kInf);
  EXPECT_EQ(yb[7], -kInf);
  EXPECT_TRUE(std::isnan(yb[40]));
  // A NaN contribution poisons the sum, as it would uncompressed.
  std::vector<std::byte> wire(wireBytes(fp8(32), x.size()));
  quantize(fp8(32), x.data(), x.size(), wire.data());
  std::vector<float> acc(x.size(), 1.0f);
  dequantizeAdd(fp8(32), wire.data(), x.size(), acc.data());
  EXPECT_TRUE(std::isnan(acc[6]));
  EXPECT_FALSE(std::isnan(acc[8]));
}

TEST(Quantize, BoundsAreTheDocumentedFunctions) {
  EXPECT_EQ(bf16ErrorBound(1.0f), 0x1p-8);
  EXPECT_EQ(bf16ErrorBound(0.0f), 0x1p-134);
  EXPECT_EQ(bf16ErrorBound(std::numeric_limits<float>::max()), std::numeric_limits<double>::infinity());
  // fp8, amax 256 (scale 1): 2^-4 |x| in the normal range, 2^-10 below.
  EXPECT_NEAR(fp8ErrorBound(64.0f, 256.0f), 4.0, 1e-4);
  EXPECT_NEAR(fp8ErrorBound(0.0f, 256.0f), 0x1p-10, 1e-9);
  EXPECT_EQ(fp8ErrorBound(1e-37f, 1e-37f), static_cast<double>(1e-37f));  // a zeroed block
  EXPECT_EQ(fp8ScaleFor(512.0f), 2.0f);
  EXPECT_EQ(fp8ScaleFor(0.0f), 0.0f);
}

TEST(Quantize, BadFormatsAreRefusedNamingTheArgumentAndTheSupportedValues) {
  for (int block : kBlocks) {
    auto f = parseWireFormat("fp8:" + std::to_string(block));
    ASSERT_TRUE(f.isOk());
    EXPECT_EQ(f.value(), fp8(block));
    EXPECT_EQ(wireFormatName(f.value()), "fp8:" + std::to_string(block));
  }
  ASSERT_TRUE(parseWireFormat("fp8").isOk());
  EXPECT_EQ(parseWireFormat("fp8").value().block, 128);
  ASSERT_TRUE(parseWireFormat("bf16").isOk());
  EXPECT_EQ(parseWireFormat("bf16").value().kind, WireFormat::Bf16);
  EXPECT_TRUE(parseWireFormat("fp8:100").isOk());  // any integer in range, as the simulator accepts

  for (const char* bad : {"fp8:16", "fp8:31", "fp8:1025", "fp8:4096", "fp8:-128", "fp8:", "fp8:12x", "fp16", "", "int8"}) {
    auto r = parseWireFormat(bad, "--compress");
    ASSERT_FALSE(r.isOk()) << bad;
    EXPECT_EQ(r.status().code(), chorusInvalidArgument) << bad;
    const std::string& m = r.status().message();
    EXPECT_NE(m.find("--compress"), std::string::npos) << m;
    EXPECT_NE(m.find("[32, 1024]"), std::string::npos) << m;
  }
  EXPECT_NE(parseWireFormat("fp16").status().message().find("bf16, fp8"), std::string::npos);
  const Status s = checkWireFormat(fp8(2048), "compression");
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("compression"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("2048"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("[32, 1024]"), std::string::npos) << s.message();
  EXPECT_TRUE(checkWireFormat(fp8(32)).isOk());
  EXPECT_TRUE(checkWireFormat(fp8(1024)).isOk());
  EXPECT_FALSE(checkWireFormat(fp8(0)).isOk());
}

}  // namespace
}  // namespace chorus::kernels
