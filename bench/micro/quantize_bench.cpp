// Compressed-wire kernel throughput (kernels/quantize.hpp): quantize,
// dequantize and dequantizeAdd for bf16 and fp8 (block 128) at 1 MiB (cache
// resident on most CPUs) and 64 MiB (memory bound) of fp32 data.
//
// bytes_per_second counts the fp32 side only (4 B per element), so it reads
// as "data compressed (or decompressed) per second", comparable across
// formats; the wire side adds 1/2 (bf16) or ~1/4 (fp8) of that in traffic,
// and dequantizeAdd also reads the accumulator.
//
//   quantize_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "kernels/quantize.hpp"

namespace {

using chorus::kernels::WireFormat;

enum class Kernel { Quantize, Dequantize, DequantizeAdd };

void run(benchmark::State& state, WireFormat fmt, Kernel k, size_t bytes) {
  const size_t n = bytes / 4;
  std::vector<float> x(n), acc(n, 0.0f);
  // Gradient-like data: a spread of magnitudes and signs, no non-finites.
  for (size_t i = 0; i < n; ++i) x[i] = std::sin(static_cast<float>(i) * 0.37f) * static_cast<float>(1 + i % 13);
  std::vector<std::byte> wire(chorus::kernels::wireBytes(fmt, n));
  chorus::kernels::quantize(fmt, x.data(), n, wire.data());
  for (auto _ : state) {
    switch (k) {
      case Kernel::Quantize: chorus::kernels::quantize(fmt, x.data(), n, wire.data()); break;
      case Kernel::Dequantize: chorus::kernels::dequantize(fmt, wire.data(), n, x.data()); break;
      case Kernel::DequantizeAdd: chorus::kernels::dequantizeAdd(fmt, wire.data(), n, acc.data()); break;
    }
    benchmark::DoNotOptimize(wire.data());
    benchmark::DoNotOptimize(x.data());
    benchmark::DoNotOptimize(acc.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(4 * n));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const WireFormat formats[] = {{WireFormat::Bf16, 128}, {WireFormat::Fp8E4m3, 128}};
  const std::pair<Kernel, const char*> kernels[] = {
      {Kernel::Quantize, "quantize"}, {Kernel::Dequantize, "dequantize"}, {Kernel::DequantizeAdd, "dequantizeAdd"}};
  for (const WireFormat& fmt : formats) {
    for (const auto& [k, kname] : kernels) {
      for (size_t bytes : {size_t{1} << 20, size_t{64} << 20}) {
        const std::string name =
            std::string(kname) + "/" + chorus::kernels::wireFormatName(fmt) + "/" + std::to_string(bytes >> 20) + "MiB";
        benchmark::RegisterBenchmark(name.c_str(), [fmt, k = k, bytes](benchmark::State& s) { run(s, fmt, k, bytes); })
            ->UseRealTime();
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
