// The per-operator compute model (src/sim/compute.hpp, configs/gpus/*.json):
// every data file parses; GEMM efficiency follows tiles, waves, K and dtype;
// grouped GEMMs with few tokens per expert lose to padding; attention by head
// dim, length and mask; nothing beats the peak.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "sim/compute.hpp"

namespace chorus::sim {
namespace {

GpuSpec gpu(const std::string& name, double peak16, double hbm) {
  GpuSpec g;
  g.name = name;
  g.peak16 = tflops(peak16);
  g.peak8 = tflops(2 * peak16);
  g.hbm = gib(80);
  g.hbm_bw = gbytePerS(hbm);
  return g;
}

TEST(SimCompute, EveryDataFileParsesAndIsFound) {
  ASSERT_EQ(gpuDataFiles().size(), 3u);
  for (const auto& [name, text] : gpuDataFiles()) {
    auto s = parseComputeSpec(text, name);
    ASSERT_TRUE(s.isOk()) << s.status().message();
  }
  EXPECT_EQ(computeSpecFor(gpu("A100-SXM4-80GB", 312, 2039))->arch, "ampere");
  EXPECT_EQ(computeSpecFor(gpu("H200-SXM-141GB", 989, 4800))->arch, "hopper");
  EXPECT_EQ(computeSpecFor(gpu("GB200", 2500, 8000))->arch, "blackwell");
  EXPECT_EQ(computeSpecFor(gpu("TPUv4-like", 275, 1200)), nullptr);
  // A bad file is refused with the key named.
  auto bad = parseComputeSpec(R"({"arch": "x", "sms": 0})", "x.json");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("'sms'"), std::string::npos) << bad.status().message();
}

TEST(SimCompute, GemmEfficiencyFollowsShape) {
  const GpuSpec h = gpu("H100-SXM5", 989, 3350);
  const Compute c(h, false);
  // Large, well-shaped: close to the fitted maximum, never above 1.
  const double big = c.gemmEfficiency(8192, 8192, 8192);
  EXPECT_GT(big, 0.75);
  EXPECT_LE(big, 0.86);
  // K dependence: the same output with a shallow K runs at a lower fraction.
  EXPECT_LT(c.gemmEfficiency(8192, 8192, 256), 0.7 * big);
  // Wave quantisation: 133 output tiles of 128 x 256 on 132 SMs need two
  // waves, 132 need one: one more row of tiles nearly halves the efficiency.
  const double one = c.gemmEfficiency(128 * 132, 256, 8192), two = c.gemmEfficiency(128 * 133, 256, 8192);
  EXPECT_LT(two, 0.8 * one);
  // fp8 is faster in time but not at a higher fraction of its (2x) peak.
  const Compute c8(h, true);
  EXPECT_LT(c8.gemm(8192, 8192, 8192).value(), 0.75 * c.gemm(8192, 8192, 8192).value());
  EXPECT_GT(c8.gemm(8192, 8192, 8192).value(), 0.5 * c.gemm(8192, 8192, 8192).value());
  // Against XLA's measured sm_90 table (calibration data): 4096^3 bf16 780
  // TFLOPS, 2048 x 2048 x 256 220 TFLOPS; the fitted model within 15 %.
  auto tf = [&](double m, double n, double k) { return 2 * m * n * k / c.gemm(m, n, k).value() / 1e12; };
  EXPECT_NEAR(tf(4096, 4096, 4096) / 780, 1, 0.15);
  EXPECT_NEAR(tf(2048, 2048, 256) / 220, 1, 0.15);
  // Every shape stays under the peak, and bf16 under the most any shape was
  // measured to reach (ml-engineering's MAMF for H100 SXM, 792.1 of 989
  // TFLOPS), which the fit's asymptote alone would pass for large GEMMs.
  for (double m : {1.0, 64.0, 1000.0, 8192.0, 65536.0})
    for (double k : {16.0, 512.0, 16384.0, 65536.0}) {
      EXPECT_LE(c.gemmEfficiency(m, 4096, k), 1.0);
      EXPECT_LE(c.gemmEfficiency(m, 53248, k), 0.801);
    }
  EXPECT_NEAR(tf(6144, 17920, 2816) / 792.1, 1, 0.02);  // MAMF's best shape
  EXPECT_LE(tf(16384, 53248, 16384), 792.1);
  EXPECT_GT(c8.gemmEfficiency(16384, 53248, 16384), 0.0);  // fp8 has its own fit, uncapped
}

// A training step runs at the sustained clock of a power-saturated node
// (sustained_clock_ratio: mamf-finder's MSMF over MAMF), a burst at the clock
// of the benchmarks the curves come from: tensor-core kernels slow by the
// ratio, memory-bound ones do not; the caps hold in both.
TEST(SimCompute, SustainedLoadRunsTensorCoresAtTheSustainedClock) {
  for (const auto& [name, peak, ratio] : {std::tuple{"H100-SXM5", 989.0, 0.848}, std::tuple{"B200", 2250.0, 0.815},
                                          std::tuple{"A100-SXM4-80GB", 312.0, 0.926}}) {
    const GpuSpec g = gpu(name, peak, 3350);
    ASSERT_NE(computeSpecFor(g), nullptr) << name;
    EXPECT_DOUBLE_EQ(computeSpecFor(g)->sustained, ratio) << name;
    for (bool fp8 : {false, true}) {
      const Compute burst(g, fp8), held(g, fp8, "", Compute::Load::Sustained);
      // A large GEMM is tensor-bound: its time (less the fixed launch cost)
      // grows by 1 / ratio.
      const double fixed = computeSpecFor(g)->gemm_fixed.value();
      const double tb = burst.gemm(8192, 8192, 8192).value() - fixed, th = held.gemm(8192, 8192, 8192).value() - fixed;
      EXPECT_NEAR(th / tb, 1 / ratio, 1e-9) << name << (fp8 ? " fp8" : " bf16");
      // Never above the measured maximum, burst or not.
      const double cap = fp8 ? computeSpecFor(g)->cap8 : computeSpecFor(g)->cap16;
      EXPECT_LE(burst.gemmEfficiency(16384, 16384, 16384), cap + 1e-12);
      // The attention core too; an HBM-bound kernel not at all.
      const double ab = burst.attention(64, 8192, 8192, 128, 128, true).value();
      const double ah = held.attention(64, 8192, 8192, 128, 128, true).value();
      EXPECT_GT(ah, ab * (1 / ratio - 0.01)) << name;
      EXPECT_DOUBLE_EQ(held.mem(1e9).value(), burst.mem(1e9).value());
    }
  }
  // No data file, no measurement, no change.
  const GpuSpec a = gpu("MI250X", 383, 3277);
  ASSERT_EQ(computeSpecFor(a), nullptr);
  EXPECT_DOUBLE_EQ(Compute(a, false, "", Compute::Load::Sustained).gemm(8192, 8192, 8192).value(),
                   Compute(a, false).gemm(8192, 8192, 8192).value());
}

// Ampere's GEMM curve against the kernel microbenchmarks it was fitted to
// (LLMCompass's A100 cuBLAS table, calibration) and one it was not
// (mamf-finder's best A100 SXM shape); A100 has no fp8, so --fp8 GEMMs run
// at the 16-bit rate.
TEST(SimCompute, AmpereGemmFollowsItsKernelMeasurements) {
  const GpuSpec a = gpu("A100-SXM4-80GB", 312, 2039);
  ASSERT_NE(computeSpecFor(a), nullptr);
  ASSERT_TRUE(computeSpecFor(a)->has_gemm);
  const Compute c(a, false);
  auto tf = [&](const Compute& x, double m, double n, double k) { return 2 * m * n * k / x.gemm(m, n, k).value() / 1e12; };
  // LLMCompass matmul_A100.csv: (m, n, k, TFLOPS) from M 64 to 32768 and N = K 1024 to 32768.
  for (auto [m, n, k, want] : {std::tuple{64.0, 12288.0, 12288.0, 101.7}, std::tuple{256.0, 12288.0, 12288.0, 242.7},
                               std::tuple{2048.0, 12288.0, 12288.0, 262.2}, std::tuple{8192.0, 2048.0, 2048.0, 243.8},
                               std::tuple{8192.0, 4096.0, 4096.0, 269.2}, std::tuple{8192.0, 32768.0, 32768.0, 287.8}})
    EXPECT_NEAR(tf(c, m, n, k) / want, 1, 0.08) << m << " x " << n << " x " << k;
  EXPECT_NEAR(tf(c, 1024, 10240, 5120) / 271.2, 1, 0.02);  // MAMF's best shape: not in the fit
  // Never above the peak; an M of 64 reads the whole weight for few rows and
  // runs at a fraction of a large GEMM's rate (measured: 0.35).
  for (double m : {1.0, 64.0, 8192.0, 65536.0}) EXPECT_LE(c.gemmEfficiency(m, 53248, 16384), 1.0);
  EXPECT_LT(tf(c, 64, 12288, 12288), 0.45 * tf(c, 8192, 12288, 12288));
  EXPECT_DOUBLE_EQ(Compute(a, true).gemm(8192, 8192, 8192).value(), c.gemm(8192, 8192, 8192).value());
}

TEST(SimCompute, GroupedGemmWithFewTokensPerExpertPaysForPadding) {
  const GpuSpec h = gpu("H100-SXM5", 989, 3350);
  const Compute c(h, false);
  // 64 experts with 100 tokens each pad every 64- or 128-row tile; with 1024
  // each they are close to one big GEMM of the same FLOPs.
  const double few = c.gemmEfficiency(100, 4096, 7168, 64), many = c.gemmEfficiency(1024, 4096, 7168, 64);
  EXPECT_LT(few, 0.85 * many);
  EXPECT_NEAR(many / c.gemmEfficiency(1024 * 64, 4096, 7168), 1, 0.05);
  EXPECT_DOUBLE_EQ(c.groupedGemm(64, 100, 4096, 7168).value(), c.gemm(100, 4096, 7168, 64).value());
}

TEST(SimCompute, AttentionByHeadDimLengthAndMask) {
  const GpuSpec h = gpu("H100-SXM5", 989, 3350);
  const Compute c(h, false);
  // TFLOPS as FlashAttention counts them (4 s^2 d per head forward, half causal).
  auto tf = [&](double s, double d, bool causal) {
    const double heads = 16384 / s * 16;  // batch x seq = 16k, 16 heads: FA3's benchmark shape
    const double fl = 4 * heads * s * s * d * (causal ? 0.5 : 1);
    return fl / c.attention(heads, s, s, d, d, causal).value() / 1e12;
  };
  // FA3 Fig. 5 (calibration data), hd128 non-causal: 467 at 512, 648 at 16k.
  EXPECT_NEAR(tf(16384, 128, false) / 648, 1, 0.03);
  EXPECT_NEAR(tf(512, 128, false) / 467, 1, 0.05);
  EXPECT_GT(tf(8192, 128, false), tf(1024, 128, false));  // rises with length
  EXPECT_GT(tf(8192, 128, false), tf(8192, 64, false));   // and with head dim
  EXPECT_LT(tf(1024, 128, true), tf(1024, 128, false));   // causal wastes the diagonal tiles at short lengths
  // Backward costs 2.5x the forward's FLOPs at a lower rate.
  EXPECT_GT(c.attention(16, 4096, 4096, 128, 128, true, 0, true).value(),
            2.5 * c.attention(16, 4096, 4096, 128, 128, true).value());
  // A sliding window of 1024 keys costs what 1024 keys cost.
  EXPECT_LT(c.attention(16, 8192, 8192, 128, 128, false, 1024).value(),
            0.25 * c.attention(16, 8192, 8192, 128, 128, false).value());
  // Ampere (FA2 at up to 73 % of 312 TFLOPS) is slower in time than Hopper (FA3).
  const GpuSpec a = gpu("A100-SXM4", 312, 2039);
  const Compute ca(a, false);
  const double fl = 4 * 16.0 * 4096 * 4096 * 128;
  EXPECT_GT(ca.attention(16, 4096, 4096, 128, 128, false).value(), 2 * c.attention(16, 4096, 4096, 128, 128, false).value());
  EXPECT_LE(fl / ca.attention(16, 4096, 4096, 128, 128, false).value(), 312e12);
}

// --attention-kernel: Hopper's file has FlashAttention-2 curves beside its
// default FlashAttention-3 (FA3 paper Fig. 5/6, the FlashAttention-2 bars);
// an unknown name is refused naming the kernels the file has.
TEST(SimCompute, AttentionKernelChoosesItsCurves) {
  const GpuSpec h = gpu("H100-SXM5", 989, 3350);
  const Compute fa3(h, false), fa2(h, false, "fa2"), named3(h, false, "fa3");
  auto tf = [](const Compute& c, double s, bool causal, bool backward = false) {
    const double heads = 16384 / s * 16;
    const double fl = 4 * heads * s * s * 128 * (causal ? 0.5 : 1) * (backward ? 2.5 : 1);
    return fl / c.attention(heads, s, s, 128, 128, causal, 0, backward).value() / 1e12;
  };
  // Fig. 5, FlashAttention-2 hd128: non-causal 309 at 512 and 370 at 16k, causal 335 at 16k;
  // Fig. 6 backward non-causal 322 at 16k.
  EXPECT_NEAR(tf(fa2, 16384, false) / 370, 1, 0.03);
  EXPECT_NEAR(tf(fa2, 512, false) / 309, 1, 0.05);
  EXPECT_NEAR(tf(fa2, 16384, true) / 335, 1, 0.03);
  EXPECT_NEAR(tf(fa2, 16384, false, true) / 322, 1, 0.03);
  EXPECT_GT(tf(fa3, 4096, true), 1.5 * tf(fa2, 4096, true));
  EXPECT_EQ(tf(named3, 4096, true), tf(fa3, 4096, true));  // "fa3" is the default, by name
  EXPECT_TRUE(checkAttentionKernel(h, "").isOk());
  EXPECT_TRUE(checkAttentionKernel(h, "fa2").isOk());
  const Status bad = checkAttentionKernel(h, "fa1");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.message().find("fa3, fa2"), std::string::npos) << bad.message();
  EXPECT_FALSE(checkAttentionKernel(gpu("A100-SXM4", 312, 2039), "fa3").isOk());  // Ampere has FlashAttention-2 only
  EXPECT_FALSE(checkAttentionKernel(gpu("TPUv4-like", 275, 1200), "fa2").isOk());  // no data file
  // A file whose alternative kernel is filed under another name is refused.
  auto text = std::string(R"({"arch": "x", "sms": 1, "attention": )") +
              R"({"name": "a", "kernel": "A", "fixed_us": 1, "forward": [{"head_dim": 128, "causal": false, "efficiency": 0.5, "seq_half": 1}],)" +
              R"( "backward": [{"head_dim": 128, "causal": false, "efficiency": 0.5, "seq_half": 1}]},)" +
              R"( "attention_kernels": {"b": {"name": "c", "kernel": "C", "fixed_us": 1,)" +
              R"( "forward": [{"head_dim": 128, "causal": false, "efficiency": 0.5, "seq_half": 1}],)" +
              R"( "backward": [{"head_dim": 128, "causal": false, "efficiency": 0.5, "seq_half": 1}]}}})";
  auto s = parseComputeSpec(text, "x.json");
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.status().message().find("attention_kernels.b is named 'c'"), std::string::npos) << s.status().message();
}

}  // namespace
}  // namespace chorus::sim
