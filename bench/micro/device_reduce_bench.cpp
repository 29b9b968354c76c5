// Where a reduction of device data should run on this machine (issue 41, item
// 3): the OpenCL reduction kernel (device::enqueueReduce, waited for) against
// the host kernel (kernels::Reducer) on the same bytes, fp32 sum, dst == a.
// On POCL both run on the CPU: the device kernel pays the queue's round trip
// and the runtime's work-group scheduling on top of the same arithmetic.
//
// Bytes counted per call: 3 x buffer (read a, read b, write dst).
//
//   device_reduce_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <vector>

#include "device/cl_reduce.hpp"
#include "kernels/reduce.hpp"

#ifdef CHORUS_HAVE_OPENCL
#include <CL/cl.h>
#endif

namespace {

void hostSum(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t n = bytes / 4;
  std::vector<float> a(n, 1.0f), b(n, 0.5f);
  chorus::kernels::Reducer r(chorusFloat32, chorus::BinOp::Sum);
  for (auto _ : state) {
    r(a.data(), a.data(), b.data(), n);
    benchmark::DoNotOptimize(a.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(3 * bytes));
}
BENCHMARK(hostSum)->Arg(8)->Arg(64 << 10)->Arg(1 << 20)->Arg(16 << 20)->UseRealTime();

#ifdef CHORUS_HAVE_OPENCL
void deviceSum(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  cl_platform_id p = nullptr;
  cl_device_id d = nullptr;
  cl_int e = clGetPlatformIDs(1, &p, nullptr);
  if (e == CL_SUCCESS) e = clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, nullptr);
  if (e != CL_SUCCESS) {
    state.SkipWithError("no OpenCL device");
    return;
  }
  cl_context ctx = clCreateContext(nullptr, 1, &d, nullptr, nullptr, &e);
  cl_command_queue q = clCreateCommandQueue(ctx, d, 0, &e);
  std::vector<float> a(bytes / 4, 1.0f), b(bytes / 4, 0.5f);
  cl_mem ma = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes, a.data(), &e);
  cl_mem mb = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes, b.data(), &e);
  // The first call compiles the program (cached for the process): not timed.
  auto st = chorus::device::enqueueReduce(q, chorusFloat32, chorus::BinOp::Sum, ma, 0, ma, 0, mb, 0, bytes / 4);
  clFinish(q);
  if (!st.isOk()) {
    state.SkipWithError(st.message().c_str());
  } else {
    for (auto _ : state) {
      (void)chorus::device::enqueueReduce(q, chorusFloat32, chorus::BinOp::Sum, ma, 0, ma, 0, mb, 0, bytes / 4);
      clFinish(q);
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(3 * bytes));
  }
  clReleaseMemObject(ma);
  clReleaseMemObject(mb);
  clReleaseCommandQueue(q);
  clReleaseContext(ctx);
}
BENCHMARK(deviceSum)->Arg(8)->Arg(64 << 10)->Arg(1 << 20)->Arg(16 << 20)->UseRealTime();
#endif

}  // namespace

BENCHMARK_MAIN();
