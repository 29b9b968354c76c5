// Reduction kernel throughput: fp32, bf16 and fp16 sums at 1 MiB (cache
// resident on most CPUs) and 64 MiB (memory bound), for every ISA variant the
// CPU can run, plus the dispatched Reducer.
//
// Bytes counted per call: 3 x buffer (read a, read b, write dst), so the
// reported bytes_per_second compares directly to memory bandwidth.  dst == a,
// the executor's accumulate-in-place pattern.
//
//   reduce_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/dispatch.hpp"
#include "kernels/dtype.hpp"
#include "kernels/reduce.hpp"

namespace {

using chorus::kernels::BinOp;
using chorus::kernels::ReduceFn;

void fillValues(std::vector<unsigned char>& buf, chorusDataType_t d, double base) {
  const size_t size = chorus::kernels::dtypeSize(d);
  for (size_t i = 0; i < buf.size() / size; ++i) {
    chorus::kernels::storeFromDouble(buf.data() + i * size, d, base + static_cast<double>(i % 97) * 0.25);
  }
}

template <class Fn>
void runReduce(benchmark::State& state, const Fn& fn, chorusDataType_t d, size_t bytes) {
  const size_t count = bytes / chorus::kernels::dtypeSize(d);
  std::vector<unsigned char> a(bytes), b(bytes);
  fillValues(a, d, 1.0);
  fillValues(b, d, 2.0);
  for (auto _ : state) {
    // a grows by b each pass until b drops below half an ulp of a; it never
    // reaches inf or subnormals, whose handling could cost differently.
    fn(a.data(), a.data(), b.data(), count);
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(3 * bytes));
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  struct Variant {
    std::string name;
    const chorus::kernels::KernelTable* table;
  };
  std::vector<Variant> variants;
  for (auto isa : {chorus::kernels::KernelIsa::Generic, chorus::kernels::KernelIsa::Avx2,
                   chorus::kernels::KernelIsa::Avx512}) {
    if (const auto* t = chorus::kernels::kernelTable(isa)) variants.push_back({std::string(t->isa), t});
  }
  const chorusDataType_t dtypes[] = {chorusFloat32, chorusBfloat16, chorusFloat16};
  const size_t sizes[] = {size_t{1} << 20, size_t{64} << 20};

  for (chorusDataType_t d : dtypes) {
    for (size_t bytes : sizes) {
      const std::string suffix =
          std::string(chorus::kernels::dtypeName(d)) + "/" + std::to_string(bytes >> 20) + "MiB";
      // The dispatched path, as the executor calls it.
      const chorus::kernels::Reducer reducer(d, BinOp::Sum);
      benchmark::RegisterBenchmark(("sum/dispatched/" + suffix).c_str(),
                                   [reducer, d, bytes](benchmark::State& s) { runReduce(s, reducer, d, bytes); })
          ->UseRealTime();
      for (const Variant& v : variants) {
        const ReduceFn fn = v.table->reduce[d][static_cast<int>(BinOp::Sum)];
        benchmark::RegisterBenchmark(("sum/" + v.name + "/" + suffix).c_str(),
                                     [fn, d, bytes](benchmark::State& s) { runReduce(s, fn, d, bytes); })
            ->UseRealTime();
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
