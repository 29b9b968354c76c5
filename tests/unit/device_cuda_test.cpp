// Collectives on CUDA device memory (docs/device.md, "CUDA") through the C
// API, ranks as threads, each with a CUDA context and stream of its own (as
// separate processes would have), checked element by element against the
// independent reference of support/collective_check.
//
// This machine has no GPU: the driver here is the test double of
// tests/fake_cuda (CHORUS_CUDA_DRIVER points at it; ctest sets it), which
// implements the driver API's documented semantics on host memory, with
// device pointers the host cannot dereference and streams that run in order
// on threads of their own.  It proves chorus's use of the driver API (stream
// order, staging, the gates, the error paths), not a GPU; bench/device_check.sh
// runs the same path over a real driver where a GPU is at hand.
#include <chorus/device.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "device/cuda_driver.hpp"
#include "device/memory.hpp"
#include "support/collective_check.hpp"
#include "support/rank_threads.hpp"
#include "toolkit/bench.hpp"

namespace chorus::testing {
namespace {

// Before main: the test double, unless the environment names a driver.
const bool kDriverNamed = [] {
  ::setenv("CHORUS_CUDA_DRIVER", CHORUS_FAKE_CUDA, /*overwrite=*/0);
  return true;
}();

using device::CUcontext;
using device::CUdeviceptr;
using device::CUresult;
using device::CUstream;

// The entry points the test uses beyond chorus's own (contexts, allocations),
// from the driver CHORUS_CUDA_DRIVER names.
struct TestDriver {
  void* lib = nullptr;
  CUresult (*cuCtxCreate)(CUcontext*, unsigned, int) = nullptr;
  CUresult (*cuCtxDestroy)(CUcontext) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuStreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuStreamQuery)(CUstream) = nullptr;
  CUresult (*cuStreamWaitValue32)(CUstream, CUdeviceptr, unsigned, unsigned) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned) = nullptr;
  CUresult (*cuMemFreeHost)(void*) = nullptr;
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t) = nullptr;
  int (*liveAllocations)() = nullptr;
  std::string error;

  TestDriver() {
    const char* path = std::getenv("CHORUS_CUDA_DRIVER");
    if (path == nullptr || *path == '\0') {
      error = "CHORUS_CUDA_DRIVER is not set (ctest points it at tests/fake_cuda's libcuda.so.1)";
      return;
    }
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      error = fmt::format("dlopen({}): {}", path, dlerror());
      return;
    }
    // The versioned name first, as chorus resolves them (a real driver's
    // unversioned cuMemAlloc is the old 32-bit ABI).
    auto sym = [&](const char* name, auto* out, bool required = true) {
      using F = std::remove_pointer_t<decltype(out)>;
      *out = reinterpret_cast<F>(dlsym(lib, (std::string(name) + "_v2").c_str()));
      if (*out == nullptr) *out = reinterpret_cast<F>(dlsym(lib, name));
      if (*out == nullptr && required && error.empty()) error = fmt::format("{} lacks {}", path, name);
    };
    sym("cuCtxCreate", &cuCtxCreate);
    sym("cuCtxDestroy", &cuCtxDestroy);
    sym("cuCtxSetCurrent", &cuCtxSetCurrent);
    sym("cuStreamCreate", &cuStreamCreate);
    sym("cuStreamDestroy", &cuStreamDestroy);
    sym("cuStreamSynchronize", &cuStreamSynchronize);
    sym("cuStreamQuery", &cuStreamQuery);
    sym("cuStreamWaitValue32", &cuStreamWaitValue32);
    sym("cuMemAlloc", &cuMemAlloc);
    sym("cuMemFree", &cuMemFree);
    sym("cuMemHostAlloc", &cuMemHostAlloc);
    sym("cuMemFreeHost", &cuMemFreeHost);
    sym("cuMemcpyHtoDAsync", &cuMemcpyHtoDAsync);
    sym("cuMemcpyDtoH", &cuMemcpyDtoH);
    sym("fakeCudaLiveAllocations", &liveAllocations, /*required=*/false);  // the test double only
  }
};
const TestDriver& drv() {
  static const TestDriver d;
  return d;
}

#define REQUIRE_DRIVER()                                   \
  do {                                                     \
    ASSERT_EQ(drv().error, "");                            \
    int available_ = 0;                                    \
    char why_[512] = {};                                   \
    chorusMemSpaceQuery(chorusMemCuda, &available_, why_, sizeof why_); \
    ASSERT_EQ(available_, 1) << why_;                      \
  } while (0)

void* asPtr(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }
CUdeviceptr asDev(const void* p) { return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p)); }

// One rank's device: a context (current on the rank's thread) and a stream.
struct CudaRank {
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  chorusStream_t chorus = nullptr;
  std::string error;

  CudaRank() {
    const TestDriver& d = drv();
    if (CUresult r = d.cuCtxCreate(&ctx, 0, 0); r != 0) {
      error = fmt::format("cuCtxCreate: {}", r);
      return;
    }
    if (CUresult r = d.cuStreamCreate(&stream, 0); r != 0) {
      error = fmt::format("cuStreamCreate: {}", r);
      return;
    }
    if (chorusStreamCreateCuda(&chorus, stream) != chorusSuccess)
      error = fmt::format("chorusStreamCreateCuda: {}", chorusGetLastError(nullptr));
  }
  ~CudaRank() {
    const TestDriver& d = drv();
    if (chorus) chorusStreamDestroy(chorus);
    if (stream) d.cuStreamDestroy(stream);
    if (ctx) d.cuCtxDestroy(ctx);
  }
  CudaRank(const CudaRank&) = delete;
  CudaRank& operator=(const CudaRank&) = delete;
};

// The case's host buffers mirrored into cuMemAlloc buffers.  Uploads are
// asynchronous copies on the rank's stream, so the call must read its input
// after them in stream order; downloads wait for the stream.
class CudaMirror final : public DeviceMirror {
 public:
  explicit CudaMirror(CudaRank& rank) : rank_(rank) {}
  ~CudaMirror() override { clear(); }
  void* upload(std::byte* host, size_t bytes) override {
    const TestDriver& d = drv();
    CUdeviceptr p = 0;
    if (d.cuMemAlloc(&p, std::max<size_t>(bytes, 1)) != 0) return nullptr;
    if (bytes > 0) d.cuMemcpyHtoDAsync(p, host, bytes, rank_.stream);
    allocs_.push_back({host, bytes, p});
    return asPtr(p);
  }
  std::string download() override {
    const TestDriver& d = drv();
    if (CUresult r = d.cuStreamSynchronize(rank_.stream); r != 0) return fmt::format("cuStreamSynchronize: {}", r);
    for (const Alloc& a : allocs_) {
      if (a.bytes == 0) continue;
      if (CUresult r = d.cuMemcpyDtoH(a.host, a.dev, a.bytes); r != 0) return fmt::format("cuMemcpyDtoH: {}", r);
    }
    return "";
  }
  void clear() override {
    const TestDriver& d = drv();
    d.cuStreamSynchronize(rank_.stream);
    for (const Alloc& a : allocs_) d.cuMemFree(a.dev);
    allocs_.clear();
  }

 private:
  struct Alloc {
    std::byte* host;
    size_t bytes;
    CUdeviceptr dev;
  };
  CudaRank& rank_;
  std::vector<Alloc> allocs_;
};

std::string runOnCuda(int rank, chorusComm_t comm, const std::vector<Case>& cases) {
  CudaRank dev;
  if (!dev.error.empty()) return dev.error;
  CudaMirror mirror(dev);
  for (const Case& c : cases) {
    std::string err = runCase(comm, c, dev.chorus, &mirror);
    if (!err.empty()) return fmt::format("rank {}: {}", rank, err);
  }
  return "";
}

// Every collective x every dtype x op (bf16 and fp8 included), in place and
// not, v-forms and send/recv in a group, at small ragged counts (0 included).
class CudaRanks : public ::testing::TestWithParam<int> {};
TEST_P(CudaRanks, AllDtypesAllOps) {
  REQUIRE_DRIVER();
  const int n = GetParam();
  auto cases = standardCases(n, {0, 1, 7}, /*all_dtypes=*/true);
  auto msgs = runRanks(n, [&](int r, chorusComm_t c) { return runOnCuda(r, c, cases); });
  EXPECT_EQ(failures(msgs), "");
}
INSTANTIATE_TEST_SUITE_P(Shm, CudaRanks, ::testing::Values(2, 4),
                         [](const auto& info) { return fmt::format("n{}", info.param); });

// 1, 3 and 8 ranks: every collective on float32, small and larger counts.
class CudaRanksFloat : public ::testing::TestWithParam<int> {};
TEST_P(CudaRanksFloat, EveryCollective) {
  REQUIRE_DRIVER();
  const int n = GetParam();
  auto cases = standardCases(n, {0, 7, 4099}, /*all_dtypes=*/false);
  auto msgs = runRanks(n, [&](int r, chorusComm_t c) { return runOnCuda(r, c, cases); });
  EXPECT_EQ(failures(msgs), "");
}
INSTANTIATE_TEST_SUITE_P(Shm, CudaRanksFloat, ::testing::Values(1, 3, 8),
                         [](const auto& info) { return fmt::format("n{}", info.param); });

// NCCL's stream semantics: with the stream held (a wait on a word the test
// owns, ahead of the inputs' upload), the calls return, a group included,
// and the stream is still busy; released, the results are there in stream
// order.  Without the gates, the host part would read the inputs before
// their upload ran (wrong sums), or the calls would block until the release
// (the rescue thread would have to open it).
TEST(DeviceCuda, CallReturnsBeforeTheStreamRuns) {
  REQUIRE_DRIVER();
  auto msgs = runRanks(2, [&](int r, chorusComm_t comm) -> std::string {
    const TestDriver& d = drv();
    CudaRank dev;
    if (!dev.error.empty()) return dev.error;
    const size_t count = 3 * 4096 + 5;
    std::vector<float> host(count), host2(count);
    for (size_t i = 0; i < count; ++i) {
      host[i] = static_cast<float>(i % 1000) + static_cast<float>(r);
      host2[i] = 3.0f * static_cast<float>(i % 1000) + static_cast<float>(r);
    }
    CUdeviceptr mem = 0, mem2 = 0;
    void* word = nullptr;
    if (d.cuMemAlloc(&mem, count * 4) != 0 || d.cuMemAlloc(&mem2, count * 4) != 0) return "cuMemAlloc";
    if (d.cuMemHostAlloc(&word, 64, 2 /* DEVICEMAP */) != 0) return "cuMemHostAlloc";
    std::memset(word, 0, 64);
    // The inputs arrive only once the word says 1 (in stream order).
    d.cuStreamWaitValue32(dev.stream, asDev(word), 1, 0 /* GEQ */);
    d.cuMemcpyHtoDAsync(mem, host.data(), count * 4, dev.stream);
    d.cuMemcpyHtoDAsync(mem2, host2.data(), count * 4, dev.stream);
    auto release = [&] { __atomic_store_n(static_cast<uint32_t*>(word), 1u, __ATOMIC_RELEASE); };

    std::atomic<bool> returned{false}, rescued{false};
    std::thread rescue([&] {
      for (int i = 0; i < 3000 && !returned.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!returned.load()) {
        rescued = true;
        release();
      }
    });
    std::string err;
    for (int k = 0; k < 2 && err.empty(); ++k)
      if (chorusAllReduce(asPtr(mem), asPtr(mem), count, chorusFloat32, chorusSum, comm, dev.chorus) != chorusSuccess)
        err = chorusGetLastError(comm);
    if (err.empty()) {
      chorusGroupStart();
      if (chorusAllReduce(asPtr(mem), asPtr(mem), count, chorusFloat32, chorusSum, comm, dev.chorus) != chorusSuccess ||
          chorusAllReduce(asPtr(mem2), asPtr(mem2), count, chorusFloat32, chorusSum, comm, dev.chorus) != chorusSuccess)
        err = chorusGetLastError(comm);
      if (chorusGroupEnd() != chorusSuccess && err.empty()) err = chorusGetLastError(nullptr);
    }
    returned = true;
    rescue.join();
    if (rescued && err.empty()) err = "a call on the held stream returned only after the stream was released";
    if (err.empty()) {
      if (chorusStreamQuery(dev.chorus) != chorusInProgress) err = "chorusStreamQuery on the held stream: not in progress";
      else if (d.cuStreamQuery(dev.stream) != device::kCudaErrorNotReady) err = "cuStreamQuery on the held stream: idle";
    }
    release();
    if (chorusStreamSynchronize(dev.chorus) != chorusSuccess && err.empty())
      err = fmt::format("chorusStreamSynchronize: {}", chorusGetLastError(nullptr));
    std::vector<float> out(count, -1.0f);
    d.cuMemcpyDtoH(out.data(), mem, count * 4);
    for (size_t i = 0; i < count && err.empty(); ++i) {
      const float want = 8.0f * static_cast<float>(i % 1000) + 4.0f;
      if (out[i] != want) err = fmt::format("rank {} element {}: {} (expected {})", r, i, out[i], want);
    }
    d.cuMemcpyDtoH(out.data(), mem2, count * 4);
    for (size_t i = 0; i < count && err.empty(); ++i) {
      const float want = 6.0f * static_cast<float>(i % 1000) + 1.0f;
      if (out[i] != want) err = fmt::format("rank {} second buffer element {}: {} (expected {})", r, i, out[i], want);
    }
    if (err.empty() && chorusStreamQuery(dev.chorus) != chorusSuccess) err = "chorusStreamQuery after synchronize";
    d.cuMemFree(mem);
    d.cuMemFree(mem2);
    d.cuMemFreeHost(word);
    return err;
  });
  EXPECT_EQ(failures(msgs), "");
}

// The error of a host part that runs after its call returned is the
// stream's: a call returns on a held stream, the communicator is aborted,
// the stream is released; the worker's collective fails, and
// chorusStreamSynchronize and chorusStreamQuery say so, while the stream
// still drains (its gate opens after the failure too).
TEST(DeviceCuda, LateErrorIsTheStreams) {
  REQUIRE_DRIVER();
  auto msgs = runRanks(2, [&](int r, chorusComm_t comm) -> std::string {
    const TestDriver& d = drv();
    CudaRank dev;
    if (!dev.error.empty()) return dev.error;
    const size_t count = 1000;
    CUdeviceptr mem = 0;
    void* word = nullptr;
    if (d.cuMemAlloc(&mem, count * 4) != 0) return "cuMemAlloc";
    if (d.cuMemHostAlloc(&word, 64, 2) != 0) return "cuMemHostAlloc";
    std::memset(word, 0, 64);
    d.cuStreamWaitValue32(dev.stream, asDev(word), 1, 0);
    std::string err;
    if (chorusAllReduce(asPtr(mem), asPtr(mem), count, chorusFloat32, chorusSum, comm, dev.chorus) != chorusSuccess)
      err = fmt::format("rank {}: the call failed at once: {}", r, chorusGetLastError(comm));
    chorusCommAbort(comm);
    __atomic_store_n(static_cast<uint32_t*>(word), 1u, __ATOMIC_RELEASE);
    if (err.empty()) {
      const chorusResult_t sync = chorusStreamSynchronize(dev.chorus);
      const std::string msg = chorusGetLastError(nullptr);
      if (sync == chorusSuccess) err = fmt::format("rank {}: chorusStreamSynchronize succeeded after the abort", r);
      else if (msg.find("abort") == std::string::npos)
        err = fmt::format("rank {}: chorusStreamSynchronize's error does not name the abort: {}", r, msg);
      else if (chorusStreamQuery(dev.chorus) == chorusSuccess)
        err = fmt::format("rank {}: chorusStreamQuery succeeded after the late error", r);
      else if (d.cuStreamQuery(dev.stream) != 0)
        err = fmt::format("rank {}: the CUDA stream did not drain after the late error", r);
    }
    d.cuMemFree(mem);
    d.cuMemFreeHost(word);
    return err;
  });
  EXPECT_EQ(failures(msgs), "");
}

// Misuse is named: a host pointer on a CUDA stream, pinned host memory, a
// length past the allocation, a buffer of another context, device memory on
// a host stream, a primitive on a CUDA stream, and a stream argument that is
// not a stream.
TEST(DeviceCuda, MisuseIsNamed) {
  REQUIRE_DRIVER();
  auto msgs = runRanks(1, [&](int, chorusComm_t comm) -> std::string {
    const TestDriver& d = drv();
    CudaRank dev;
    if (!dev.error.empty()) return dev.error;
    CUdeviceptr mem = 0;
    if (d.cuMemAlloc(&mem, 64 * 4) != 0) return "cuMemAlloc";
    void* pinned = nullptr;
    d.cuMemHostAlloc(&pinned, 256, 0);
    std::vector<float> host(64, 1.0f);
    std::string err;
    auto expect = [&](chorusResult_t got, chorusResult_t want, const std::string& needle, const char* what) {
      if (!err.empty()) return;
      const std::string msg = chorusGetLastError(nullptr);  // this thread's last error, of any call
      if (got != want) err = fmt::format("{}: result {} (expected {}): {}", what, got, want, msg);
      else if (msg.find(needle) == std::string::npos) err = fmt::format("{}: '{}' lacks '{}'", what, msg, needle);
    };
    expect(chorusAllReduce(host.data(), asPtr(mem), 64, chorusFloat32, chorusSum, comm, dev.chorus),
           chorusInvalidArgument, "sendbuff", "a host pointer on a CUDA stream");
    expect(chorusAllReduce(pinned, asPtr(mem), 64, chorusFloat32, chorusSum, comm, dev.chorus), chorusInvalidArgument,
           "page-locked host memory", "pinned host memory on a CUDA stream");
    expect(chorusAllReduce(asPtr(mem + 16), asPtr(mem + 16), 64, chorusFloat32, chorusSum, comm, dev.chorus),
           chorusInvalidArgument, "pass the end of its CUDA allocation", "a length past the allocation");
    expect(chorusAllReduce(asPtr(mem), asPtr(mem), 64, chorusFloat32, chorusSum, comm, nullptr), chorusInvalidArgument,
           "CUDA device memory, but the call is on a host stream", "device memory on a host stream");
    expect(chorusAllReduce(host.data(), host.data(), 64, chorusFloat32, chorusSum, comm, nullptr), chorusSuccess, "",
           "host memory on a host stream still works");
    {
      // Another context's buffer (made on this thread, then the rank's context back).
      CUcontext other = nullptr;
      CUdeviceptr foreign = 0;
      d.cuCtxCreate(&other, 0, 0);
      d.cuMemAlloc(&foreign, 64 * 4);
      d.cuCtxSetCurrent(dev.ctx);
      expect(chorusAllReduce(asPtr(foreign), asPtr(foreign), 64, chorusFloat32, chorusSum, comm, dev.chorus),
             chorusInvalidArgument, "memory of CUDA context", "a buffer of another context");
      d.cuCtxSetCurrent(other);
      d.cuMemFree(foreign);
      d.cuCtxDestroy(other);
      d.cuCtxSetCurrent(dev.ctx);
    }
    chorusMemSpace_t space = chorusMemHost;
    if (err.empty() && (chorusStreamGetMemSpace(dev.chorus, &space) != chorusSuccess || space != chorusMemCuda))
      err = "chorusStreamGetMemSpace does not say cuda";
    void* ev = nullptr;
    expect(chorusStreamGetEventOpenCL(dev.chorus, &ev), chorusInvalidArgument, "not an OpenCL stream",
           "an OpenCL event of a CUDA stream");
    chorusStream_t bogus = nullptr;
    int not_a_stream = 0;
    expect(chorusStreamCreateCuda(&bogus, &not_a_stream), chorusInvalidArgument, "is not a stream of a CUDA context",
           "a stream argument that is not a CUstream");
    // The stream still works after all that.
    std::vector<float> ones(64, 1.0f);
    d.cuMemcpyHtoDAsync(mem, ones.data(), 64 * 4, dev.stream);
    expect(chorusAllReduce(asPtr(mem), asPtr(mem), 64, chorusFloat32, chorusSum, comm, dev.chorus), chorusSuccess, "",
           "a good call after the refused ones");
    if (err.empty() && chorusStreamSynchronize(dev.chorus) != chorusSuccess) err = "chorusStreamSynchronize";
    d.cuMemcpyDtoH(ones.data(), mem, 64 * 4);
    if (err.empty() && ones[5] != 1.0f) err = fmt::format("one rank's sum: {}", ones[5]);
    d.cuMemFree(mem);
    d.cuMemFreeHost(pinned);
    return err;
  });
  EXPECT_EQ(failures(msgs), "");
}

// CHORUS_DEVICE_STAGING=map is refused by name: a CUDA stream stages
// through pinned host memory (pipelined chunks or whole buffers).
TEST(DeviceCuda, StagingModesNamed) {
  REQUIRE_DRIVER();
  ::setenv("CHORUS_DEVICE_STAGING", "map", 1);
  CudaRank dev;
  ::unsetenv("CHORUS_DEVICE_STAGING");
  EXPECT_NE(dev.error.find("stages through pinned host memory"), std::string::npos) << dev.error;
}

// Larger, non-divisible counts under each staging mode: pipeline (256 KiB
// chunks: 300007 floats are 5 chunks, the last one short; also auto's
// choice) and whole.
class CudaStaging : public ::testing::TestWithParam<std::tuple<int, std::string>> {};
TEST_P(CudaStaging, LargerCountsFloat) {
  REQUIRE_DRIVER();
  const auto& [n, mode] = GetParam();
  ::setenv("CHORUS_DEVICE_STAGING", mode.c_str(), 1);
  ::setenv("CHORUS_DEVICE_CHUNK_BYTES", "262144", 1);
  auto cases = standardCases(n, {4099, 300007}, /*all_dtypes=*/false);
  auto msgs = runRanks(n, [&](int r, chorusComm_t c) { return runOnCuda(r, c, cases); });
  ::unsetenv("CHORUS_DEVICE_STAGING");
  ::unsetenv("CHORUS_DEVICE_CHUNK_BYTES");
  EXPECT_EQ(failures(msgs), "");
}
INSTANTIATE_TEST_SUITE_P(Shm, CudaStaging,
                         ::testing::Values(std::tuple<int, std::string>{3, "pipeline"},
                                           std::tuple<int, std::string>{2, "whole"}),
                         [](const auto& info) {
                           return fmt::format("n{}_{}", std::get<0>(info.param), std::get<1>(info.param));
                         });

// The pipeline on one stream, without a communicator: a host call that
// computes out[i] = 2 * in[i] + 1 sees every chunk in order with the right
// length (10000 floats in 4 KiB chunks: nine of 1024 and one of 784) and
// the right input, and the device buffer holds every chunk's result, out
// of place and in place.
TEST(DeviceCuda, PipelineChunksInOrder) {
  REQUIRE_DRIVER();
  const TestDriver& d = drv();
  CudaRank dev;
  ASSERT_EQ(dev.error, "");
  const uint64_t count = 10000;
  CUdeviceptr in = 0, out = 0;
  ASSERT_EQ(d.cuMemAlloc(&in, count * 4), 0);
  ASSERT_EQ(d.cuMemAlloc(&out, count * 4), 0);
  std::vector<float> host(count);
  for (uint64_t i = 0; i < count; ++i) host[i] = static_cast<float>(i);
  for (const bool inplace : {false, true}) {
    d.cuMemcpyHtoDAsync(in, host.data(), count * 4, dev.stream);
    device::StagingOptions o;
    o.mode = device::Staging::Pipeline;
    o.chunk_bytes = 4096;
    o.async = false;
    auto stream = device::makeCudaStream(dev.stream, o);
    ASSERT_TRUE(stream.isOk()) << stream.status().message();
    device::StagedCall c;
    c.fn = "test";
    c.send = asPtr(in);
    c.send_bytes = count * 4;
    c.recv = asPtr(inplace ? in : out);
    c.recv_bytes = count * 4;
    c.recv_written = true;
    c.elementwise = true;
    c.count = count;
    c.elem_bytes = 4;
    std::vector<uint64_t> lengths;
    uint64_t seen = 0;
    std::string wrong;
    Status st = (*stream)->run(c, [&](const void* s, void* r, uint64_t n) -> Status {
      const auto* a = static_cast<const float*>(s);
      auto* b = static_cast<float*>(r);
      for (uint64_t i = 0; i < n; ++i) {
        if (a[i] != static_cast<float>(seen + i) && wrong.empty())
          wrong = fmt::format("chunk at {}: input {} is {}", seen, i, a[i]);
        b[i] = 2.0f * a[i] + 1.0f;
      }
      seen += n;
      lengths.push_back(n);
      return Status();
    });
    ASSERT_TRUE(st.isOk()) << st.message();
    ASSERT_TRUE((*stream)->synchronize().isOk());
    EXPECT_EQ(wrong, "");
    std::vector<uint64_t> want(9, 1024);
    want.push_back(784);
    EXPECT_EQ(lengths, want);
    EXPECT_EQ((*stream)->stats().pipelined_calls, 1u);
    EXPECT_EQ((*stream)->stats().chunks, 10u);
    std::vector<float> got(count);
    d.cuMemcpyDtoH(got.data(), inplace ? in : out, count * 4);
    for (uint64_t i = 0; i < count; ++i)
      ASSERT_EQ(got[i], 2.0f * static_cast<float>(i) + 1.0f) << "element " << i << (inplace ? " in place" : "");
  }
  d.cuMemFree(in);
  d.cuMemFree(out);
}

// A driver that cannot wait on memory (cuStreamWaitValue32 refused): the
// stream runs each call before returning, still in stream order and right.
TEST(DeviceCuda, DriverWithoutStreamMemOpsIsSynchronous) {
  REQUIRE_DRIVER();
  ::setenv("FAKE_CUDA_NO_STREAM_MEMOPS", "1", 1);
  auto cases = standardCases(2, {7, 4099}, /*all_dtypes=*/false);
  auto msgs = runRanks(2, [&](int r, chorusComm_t c) { return runOnCuda(r, c, cases); });
  ::unsetenv("FAKE_CUDA_NO_STREAM_MEMOPS");
  EXPECT_EQ(failures(msgs), "");
}

// Nothing leaks: every allocation chorus made (staging, gate words) is freed
// with its stream.
TEST(DeviceCuda, StreamsFreeTheirStaging) {
  REQUIRE_DRIVER();
  if (drv().liveAllocations == nullptr) GTEST_SKIP() << "a real driver: no count of live allocations";
  const int before = drv().liveAllocations();
  auto cases = standardCases(2, {7}, /*all_dtypes=*/false);
  auto msgs = runRanks(2, [&](int r, chorusComm_t c) { return runOnCuda(r, c, cases); });
  ASSERT_EQ(failures(msgs), "");
  EXPECT_EQ(drv().liveAllocations(), before);
}

// chorus-bench --memory cuda: the sweep runs on device buffers and its
// check finds every element right.
TEST(DeviceCuda, BenchOnDeviceBuffers) {
  REQUIRE_DRIVER();
  for (auto c : {tools::bench::Collective::AllReduce, tools::bench::Collective::AllGather}) {
    tools::bench::BenchOptions o;
    o.collective = c;
    o.sweep = {64, 65536, 32, 0};
    o.iters = 2;
    o.warmup = 1;
    o.memory = "cuda";
    std::vector<std::string> tables(2);
    auto msgs = runRanks(2, [&](int rank, chorusComm_t comm) -> std::string {
      char* buf = nullptr;
      size_t len = 0;
      std::FILE* out = ::open_memstream(&buf, &len);
      auto wrong = tools::bench::runBench(o, comm, out);
      std::fclose(out);
      tables[rank].assign(buf, len);
      std::free(buf);
      if (!wrong.isOk()) return wrong.status().message();
      return *wrong == 0 ? "" : fmt::format("rank {}: {} wrong elements", rank, *wrong);
    });
    ASSERT_EQ(failures(msgs), "");
    EXPECT_NE(tables[0].find("# buffers: cuda (CUDA device 0: "), std::string::npos)
        << tables[0];
    EXPECT_NE(tables[0].find("# Out of bounds values : 0 OK"), std::string::npos) << tables[0];
  }
}

}  // namespace
}  // namespace chorus::testing
