// CHORUS_REPRODUCIBLE=exact's float32 <-> one-word conversions (the exact
// plan's Encode and Decode steps, kernels/exact.hpp) for every ISA table the
// CPU can run: 256 KiB of floats (a pipeline slice, cache resident) and
// 16 MiB (memory bound).  Bytes counted per call: the float bytes only, the
// unit the cost model's kExactEncodeBytesPerS / kExactDecodeBytesPerS use
// (src/tune/cost_model.cpp).
//
//   exact_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dispatch.hpp"

namespace {

// Floats spanning 36 binades (chorus-bench's pattern's width): one word at
// lsb = -53 (words below 2^59).
constexpr int kLsb = -53;
std::vector<float> values(size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i)
    x[i] = std::ldexp(1.0f + static_cast<float>(i % 1021) / 1021.0f, static_cast<int>(i % 36) - 30) * (i % 3 ? 1 : -1);
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  for (auto isa : {chorus::kernels::KernelIsa::Generic, chorus::kernels::KernelIsa::Avx2,
                   chorus::kernels::KernelIsa::Avx512}) {
    const auto* t = chorus::kernels::kernelTable(isa);
    if (t == nullptr) continue;
    for (size_t bytes : {size_t{256} << 10, size_t{16} << 20}) {
      const size_t n = bytes / 4;
      const std::string suffix = std::string(t->isa) + "/" + std::to_string(bytes >> 10) + "KiB";
      benchmark::RegisterBenchmark(("encode/" + suffix).c_str(), [t, n, bytes](benchmark::State& s) {
        const std::vector<float> x = values(n);
        std::vector<int64_t> w(n);
        for (auto _ : s) {
          if (!t->exact.to_word(w.data(), x.data(), n, kLsb)) s.SkipWithError("not representable");
          benchmark::DoNotOptimize(w.data());
          benchmark::ClobberMemory();
        }
        s.SetBytesProcessed(static_cast<int64_t>(s.iterations() * bytes));
      })->UseRealTime();
      benchmark::RegisterBenchmark(("decode/" + suffix).c_str(), [t, n, bytes](benchmark::State& s) {
        const std::vector<float> x = values(n);
        std::vector<int64_t> w(n);
        std::vector<float> y(n);
        t->exact.to_word(w.data(), x.data(), n, kLsb);
        for (auto _ : s) {
          if (!t->exact.from_word(y.data(), w.data(), n, kLsb, int64_t{1} << 62)) s.SkipWithError("out of range");
          benchmark::DoNotOptimize(y.data());
          benchmark::ClobberMemory();
        }
        s.SetBytesProcessed(static_cast<int64_t>(s.iterations() * bytes));
      })->UseRealTime();
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
