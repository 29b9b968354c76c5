// Collectives on OpenCL buffers (docs/device.md) through the C API, ranks as
// threads, each rank with its own OpenCL context and in-order queue (as
// separate processes would have), checked element by element against the
// independent reference of support/collective_check.  Runs on any OpenCL
// platform; here POCL's CPU device (scripts/setup.sh installs it).  Skipped,
// saying why, only where no OpenCL platform exists or chorus was built
// without OpenCL.
#include <chorus/device.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <tuple>
#include <mutex>
#include <condition_variable>
#include <chrono>
#include <thread>
#include <dlfcn.h>
#include <string>
#include <vector>

#include <cmath>
#include <random>

#include "device/cl_reduce.hpp"
#include "device/memory.hpp"
#include "kernels/dtype.hpp"
#include "kernels/reduce.hpp"
#include "support/collective_check.hpp"
#include "toolkit/bench.hpp"
#include "support/rank_threads.hpp"

#ifdef CHORUS_HAVE_OPENCL
#include <CL/cl.h>
#endif

namespace chorus::testing {
namespace {

// Why the OpenCL tests cannot run here, or "".
std::string skipReason() {
  int available = 0;
  char why[512] = {};
  if (chorusMemSpaceQuery(chorusMemOpenCL, &available, why, sizeof why) != chorusSuccess)
    return "chorusMemSpaceQuery failed";
  return available ? "" : why;
}

#define SKIP_WITHOUT_OPENCL()                                                 \
  do {                                                                        \
    const std::string reason_ = skipReason();                                 \
    if (!reason_.empty()) GTEST_SKIP() << "OpenCL unavailable: " << reason_; \
  } while (0)

TEST(DeviceSpaces, QueryNamesEachSpace) {
  int available = -1;
  char why[512] = {};
  ASSERT_EQ(chorusMemSpaceQuery(chorusMemHost, &available, why, sizeof why), chorusSuccess);
  EXPECT_EQ(available, 1);
  EXPECT_STREQ(why, "");
  // CUDA: whatever this machine has, the answer is consistent with the
  // driver's presence, and a missing driver is named.
  ASSERT_EQ(chorusMemSpaceQuery(chorusMemCuda, &available, why, sizeof why), chorusSuccess);
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    EXPECT_EQ(available, 0);
    EXPECT_NE(std::string(why).find("no CUDA driver"), std::string::npos) << why;
  } else {
    dlclose(lib);
    if (available == 0) {
      EXPECT_NE(std::string(why).find("CUDA"), std::string::npos) << why;
    }
  }
  // A value outside the enum is refused, naming the argument.
  EXPECT_EQ(chorusMemSpaceQuery(static_cast<chorusMemSpace_t>(7), &available, why, sizeof why), chorusInvalidArgument);
  EXPECT_NE(std::string(chorusGetLastError(nullptr)).find("space=7"), std::string::npos);
  chorusStream_t s = nullptr;
  ASSERT_EQ(chorusStreamCreate(&s), chorusSuccess);
  chorusMemSpace_t space = chorusMemOpenCL;
  EXPECT_EQ(chorusStreamGetMemSpace(s, &space), chorusSuccess);
  EXPECT_EQ(space, chorusMemHost);
  chorusStreamDestroy(s);
}

#ifdef CHORUS_HAVE_OPENCL

// One rank's OpenCL device: a context and an in-order queue of its own.
struct ClRank {
  cl_context ctx = nullptr;
  cl_command_queue queue = nullptr;
  chorusStream_t stream = nullptr;
  std::string error;

  // Seen with POCL here: a rank's first clCreateBuffer failed when another
  // thread created its context at the same time, so ranks-as-threads set up
  // (and tear down) their OpenCL objects one at a time; processes need not.
  static std::mutex& setupMutex() {
    static std::mutex mu;
    return mu;
  }
  ClRank() {
    std::lock_guard lock(setupMutex());
    cl_platform_id platform = nullptr;
    cl_device_id dev = nullptr;
    cl_int e = clGetPlatformIDs(1, &platform, nullptr);
    if (e == CL_SUCCESS) e = clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &dev, nullptr);
    if (e == CL_SUCCESS) ctx = clCreateContext(nullptr, 1, &dev, nullptr, nullptr, &e);
    if (e == CL_SUCCESS) queue = clCreateCommandQueue(ctx, dev, 0, &e);
    if (e != CL_SUCCESS) {
      error = fmt::format("OpenCL setup failed: {}", e);
      return;
    }
    if (chorusStreamCreateOpenCL(&stream, queue) != chorusSuccess)
      error = fmt::format("chorusStreamCreateOpenCL: {}", chorusGetLastError(nullptr));
  }
  ~ClRank() {
    std::lock_guard lock(setupMutex());
    if (stream) chorusStreamDestroy(stream);
    if (queue) clReleaseCommandQueue(queue);
    if (ctx) clReleaseContext(ctx);
  }
  ClRank(const ClRank&) = delete;
  ClRank& operator=(const ClRank&) = delete;
};

// The case's host buffers mirrored into registered cl_mem buffers.  Uploads
// are non-blocking writes on the rank's queue, so the call must read its
// input after them in queue order; downloads are blocking reads on the same
// queue.
class ClMirror final : public DeviceMirror {
 public:
  explicit ClMirror(ClRank& rank) : rank_(rank) {}
  ~ClMirror() override { clear(); }
  void* upload(std::byte* host, size_t bytes) override {
    Alloc a{host, bytes, nullptr, nullptr};
    cl_int e = CL_SUCCESS;
    a.mem = clCreateBuffer(rank_.ctx, CL_MEM_READ_WRITE, std::max<size_t>(bytes, 1), nullptr, &e);
    if (e != CL_SUCCESS) return nullptr;
    if (bytes > 0) clEnqueueWriteBuffer(rank_.queue, a.mem, CL_FALSE, 0, bytes, host, 0, nullptr, nullptr);
    chorusMemRegisterOpenCL(a.mem, &a.dev);
    allocs_.push_back(a);
    return a.dev;
  }
  std::string download() override {
    for (const Alloc& a : allocs_) {
      if (a.bytes == 0) continue;
      const cl_int e = clEnqueueReadBuffer(rank_.queue, a.mem, CL_TRUE, 0, a.bytes, a.host, 0, nullptr, nullptr);
      if (e != CL_SUCCESS) return fmt::format("clEnqueueReadBuffer: {}", e);
    }
    return "";
  }
  void clear() override {
    clFinish(rank_.queue);
    for (const Alloc& a : allocs_) {
      chorusMemDeregister(a.dev);
      clReleaseMemObject(a.mem);
    }
    allocs_.clear();
  }

 private:
  struct Alloc {
    std::byte* host;
    size_t bytes;
    cl_mem mem;
    void* dev;
  };
  ClRank& rank_;
  std::vector<Alloc> allocs_;
};

// Sets an environment variable for a scope (the main thread, before the ranks
// start: a stream reads CHORUS_DEVICE_STAGING when it is made).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Every collective of the matrix: the v-forms and send/recv (a ring shift
// inside chorusGroupStart/End) included.
std::vector<Case> deviceCases(int n, const std::vector<size_t>& counts, bool all_dtypes) {
  return standardCases(n, counts, all_dtypes);
}

std::string runOnDevice(int rank, chorusComm_t comm, const std::vector<Case>& cases) {
  ClRank cl;
  if (!cl.error.empty()) return cl.error;
  ClMirror mirror(cl);
  for (const Case& c : cases) {
    std::string err = runCase(comm, c, cl.stream, &mirror);
    if (!err.empty()) return fmt::format("rank {}: {}", rank, err);
  }
  return "";
}

class DeviceRanks : public ::testing::TestWithParam<int> {};

// Every collective x every dtype x op, in place and not, at small ragged
// counts (0 included), under the default staging (auto: map on POCL).
TEST_P(DeviceRanks, AllDtypesAllOps) {
  SKIP_WITHOUT_OPENCL();
  const int n = GetParam();
  auto cases = deviceCases(n, {0, 1, 7}, /*all_dtypes=*/true);
  auto msgs = runRanks(n, [&](int r, chorusComm_t c) { return runOnDevice(r, c, cases); });
  EXPECT_EQ(failures(msgs), "");
}

INSTANTIATE_TEST_SUITE_P(Shm, DeviceRanks, ::testing::Values(2, 4), [](const auto& info) {
  return fmt::format("n{}", info.param);
});

// 1, 3 and 8 ranks: every collective on float32, in place and not.
class DeviceRanksFloat : public ::testing::TestWithParam<int> {};
TEST_P(DeviceRanksFloat, EveryCollective) {
  SKIP_WITHOUT_OPENCL();
  const int n = GetParam();
  auto cases = deviceCases(n, {0, 7}, /*all_dtypes=*/false);
  auto msgs = runRanks(n, [&](int r, chorusComm_t c) { return runOnDevice(r, c, cases); });
  EXPECT_EQ(failures(msgs), "");
}
INSTANTIATE_TEST_SUITE_P(Shm, DeviceRanksFloat, ::testing::Values(1, 3, 8), [](const auto& info) {
  return fmt::format("n{}", info.param);
});

// Larger, non-divisible counts under each staging mode (docs/device.md):
// map, pipeline (256 KiB chunks: 300007 floats are 5 chunks, the last one
// short) and whole.
class DeviceStaging : public ::testing::TestWithParam<std::tuple<int, std::string>> {};
TEST_P(DeviceStaging, LargerCountsFloat) {
  SKIP_WITHOUT_OPENCL();
  const auto& [n, mode] = GetParam();
  ScopedEnv staging("CHORUS_DEVICE_STAGING", mode);
  ScopedEnv chunk("CHORUS_DEVICE_CHUNK_BYTES", "262144");
  auto cases = deviceCases(n, {4099, 300007}, /*all_dtypes=*/false);
  auto msgs = runRanks(n, [&](int r, chorusComm_t c) { return runOnDevice(r, c, cases); });
  EXPECT_EQ(failures(msgs), "");
}
INSTANTIATE_TEST_SUITE_P(Shm, DeviceStaging,
                         ::testing::Values(std::tuple<int, std::string>{4, "map"},
                                           std::tuple<int, std::string>{3, "pipeline"},
                                           std::tuple<int, std::string>{2, "whole"}),
                         [](const auto& info) {
                           return fmt::format("n{}_{}", std::get<0>(info.param), std::get<1>(info.param));
                         });

// A v-collective writes its blocks, not the gaps between them: the gaps keep
// the device's bytes in every staging mode (whole and pipeline stage the
// output, so they must start from the device's copy).
TEST(DeviceOpenCL, VCollectiveGapsKeepDeviceBytes) {
  SKIP_WITHOUT_OPENCL();
  for (const char* mode : {"map", "pipeline", "whole"}) {
    ScopedEnv staging("CHORUS_DEVICE_STAGING", mode);
    auto msgs = runRanks(2, [&](int r, chorusComm_t comm) -> std::string {
      ClRank cl;
      if (!cl.error.empty()) return cl.error;
      // Blocks of 5 and 3 floats at displacements 1 and 9 of 16: gaps at 0, 6-8, 12-15.
      const size_t counts[2] = {5, 3}, displs[2] = {1, 9}, total = 16;
      std::vector<float> in(counts[r]), out(total, -3.0f);
      for (size_t i = 0; i < counts[r]; ++i) in[i] = static_cast<float>(100 * r + i);
      cl_int e = CL_SUCCESS;
      cl_mem mi = clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE, 64, nullptr, &e);
      cl_mem mo = clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE, total * 4, nullptr, &e);
      if (e != CL_SUCCESS) return fmt::format("clCreateBuffer: {}", e);
      clEnqueueWriteBuffer(cl.queue, mi, CL_FALSE, 0, counts[r] * 4, in.data(), 0, nullptr, nullptr);
      clEnqueueWriteBuffer(cl.queue, mo, CL_FALSE, 0, total * 4, out.data(), 0, nullptr, nullptr);
      void *di = nullptr, *dout = nullptr;
      chorusMemRegisterOpenCL(mi, &di);
      chorusMemRegisterOpenCL(mo, &dout);
      std::string err;
      // Twice: the second call's staging holds the first call's bytes.
      for (int round = 0; round < 2 && err.empty(); ++round) {
        if (chorusAllGatherV(di, counts[r], dout, counts, displs, chorusFloat32, comm, cl.stream) != chorusSuccess)
          err = fmt::format("{}: {}", mode, chorusGetLastError(comm));
        if (round == 0 && err.empty()) {
          std::vector<float> junk(total, 55.0f);  // the gaps change on the device between the calls
          clEnqueueWriteBuffer(cl.queue, mo, CL_TRUE, 0, total * 4, junk.data(), 0, nullptr, nullptr);
        }
      }
      if (err.empty()) {
        clEnqueueReadBuffer(cl.queue, mo, CL_TRUE, 0, total * 4, out.data(), 0, nullptr, nullptr);
        for (size_t i = 0; i < total && err.empty(); ++i) {
          float want = 55.0f;
          for (int j = 0; j < 2; ++j)
            if (i >= displs[j] && i < displs[j] + counts[j]) want = static_cast<float>(100 * j + (i - displs[j]));
          if (out[i] != want) err = fmt::format("{}: element {} is {}, expected {}", mode, i, out[i], want);
        }
      }
      chorusMemDeregister(di);
      chorusMemDeregister(dout);
      clReleaseMemObject(mi);
      clReleaseMemObject(mo);
      return err;
    });
    EXPECT_EQ(failures(msgs), "");
  }
}

// A group of several calls on device buffers (two allreduces on one stream, a
// broadcast on another, and a host call on a host stream, one chorusGroupEnd),
// each mode: every result lands.
TEST(DeviceOpenCL, GroupOfDeviceCalls) {
  SKIP_WITHOUT_OPENCL();
  for (const char* mode : {"map", "pipeline"}) {
    ScopedEnv staging("CHORUS_DEVICE_STAGING", mode);
    auto msgs = runRanks(3, [&](int r, chorusComm_t comm) -> std::string {
      ClRank cl, cl2;
      if (!cl.error.empty()) return cl.error;
      if (!cl2.error.empty()) return cl2.error;
      const size_t count = 1000;
      std::vector<float> a(count), b(count), c(count);
      for (size_t i = 0; i < count; ++i) {
        a[i] = static_cast<float>(i + r);
        b[i] = static_cast<float>(r + 1) * 0.5f;
        c[i] = r == 1 ? static_cast<float>(i) * 3.0f : -1.0f;
      }
      cl_int e = CL_SUCCESS;
      cl_mem ma = clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE, count * 4, nullptr, &e);
      cl_mem mb = clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE, count * 4, nullptr, &e);
      cl_mem mc = clCreateBuffer(cl2.ctx, CL_MEM_READ_WRITE, count * 4, nullptr, &e);
      if (e != CL_SUCCESS) return fmt::format("clCreateBuffer: {}", e);
      clEnqueueWriteBuffer(cl.queue, ma, CL_FALSE, 0, count * 4, a.data(), 0, nullptr, nullptr);
      clEnqueueWriteBuffer(cl.queue, mb, CL_FALSE, 0, count * 4, b.data(), 0, nullptr, nullptr);
      clEnqueueWriteBuffer(cl2.queue, mc, CL_FALSE, 0, count * 4, c.data(), 0, nullptr, nullptr);
      void *da = nullptr, *db = nullptr, *dc = nullptr;
      chorusMemRegisterOpenCL(ma, &da);
      chorusMemRegisterOpenCL(mb, &db);
      chorusMemRegisterOpenCL(mc, &dc);
      std::string err;
      // A host call on a host stream in the same group: the batch runs on that
      // stream, and chorusGroupEnd waits for it before unmapping.
      chorusStream_t hs = nullptr;
      chorusStreamCreate(&hs);
      std::vector<int32_t> h(count, r + 1);
      chorusGroupStart();
      chorusResult_t r0 = chorusAllReduce(h.data(), h.data(), count, chorusInt32, chorusSum, comm, hs);
      chorusResult_t r1 = chorusAllReduce(da, da, count, chorusFloat32, chorusSum, comm, cl.stream);
      chorusResult_t r2 = chorusAllReduce(db, db, count, chorusFloat32, chorusMax, comm, cl.stream);
      chorusResult_t r3 = chorusBroadcast(dc, dc, count, chorusFloat32, 1, comm, cl2.stream);
      chorusResult_t r4 = chorusGroupEnd();
      if (r0 != chorusSuccess || chorusStreamSynchronize(hs) != chorusSuccess)
        err = fmt::format("{}: the host call of the group: {}", mode, chorusGetLastError(comm));
      else if (h[0] != 6 || h[count - 1] != 6)
        err = fmt::format("{}: the host call of the group gave {} (expected 6)", mode, h[0]);
      chorusStreamDestroy(hs);
      if (r1 != chorusSuccess || r2 != chorusSuccess || r3 != chorusSuccess || r4 != chorusSuccess)
        err = fmt::format("{}: group returned {} {} {} {}: {}", mode, static_cast<int>(r1), static_cast<int>(r2),
                          static_cast<int>(r3), static_cast<int>(r4), chorusGetLastError(comm));
      if (err.empty()) {
        clEnqueueReadBuffer(cl.queue, ma, CL_TRUE, 0, count * 4, a.data(), 0, nullptr, nullptr);
        clEnqueueReadBuffer(cl.queue, mb, CL_TRUE, 0, count * 4, b.data(), 0, nullptr, nullptr);
        clEnqueueReadBuffer(cl2.queue, mc, CL_TRUE, 0, count * 4, c.data(), 0, nullptr, nullptr);
        for (size_t i = 0; i < count && err.empty(); ++i) {
          const float want_a = 3.0f * static_cast<float>(i) + 3.0f;  // (i+0) + (i+1) + (i+2)
          if (a[i] != want_a || b[i] != 1.5f || c[i] != static_cast<float>(i) * 3.0f)
            err = fmt::format("{}: element {}: {} {} {} (expected {} 1.5 {})", mode, i, a[i], b[i], c[i], want_a,
                              static_cast<float>(i) * 3.0f);
        }
      }
      chorusMemDeregister(da);
      chorusMemDeregister(db);
      chorusMemDeregister(dc);
      clReleaseMemObject(ma);
      clReleaseMemObject(mb);
      clReleaseMemObject(mc);
      return err;
    });
    EXPECT_EQ(failures(msgs), "");
  }
}

// The call's result is written in the queue's order: a blocking read on the
// same queue right after the call (no chorusStreamSynchronize) sees it, and
// the call's event completes.
TEST(DeviceOpenCL, ResultInQueueOrderAndEvent) {
  SKIP_WITHOUT_OPENCL();
  auto msgs = runRanks(2, [&](int r, chorusComm_t comm) -> std::string {
    ClRank cl;
    if (!cl.error.empty()) return cl.error;
    const size_t count = 1 << 18;
    std::vector<float> host(count);
    for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>(i % 1000) + static_cast<float>(r);
    cl_int e = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE, count * 4, nullptr, &e);
    if (e != CL_SUCCESS) return fmt::format("clCreateBuffer: {}", e);
    clEnqueueWriteBuffer(cl.queue, mem, CL_FALSE, 0, count * 4, host.data(), 0, nullptr, nullptr);
    void* dev = nullptr;
    if (chorusMemRegisterOpenCL(mem, &dev) != chorusSuccess) return chorusGetLastError(nullptr);
    std::string err;
    if (chorusAllReduce(dev, dev, count, chorusFloat32, chorusSum, comm, cl.stream) != chorusSuccess)
      err = chorusGetLastError(comm);
    void* ev = nullptr;
    if (err.empty() && (chorusStreamGetEventOpenCL(cl.stream, &ev) != chorusSuccess || ev == nullptr))
      err = "no event for the call";
    std::vector<float> out(count, -1.0f);
    if (err.empty()) {
      clEnqueueReadBuffer(cl.queue, mem, CL_TRUE, 0, count * 4, out.data(), 0, nullptr, nullptr);
      auto event = static_cast<cl_event>(ev);
      cl_int st = -1;
      clGetEventInfo(event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, nullptr);
      if (st != CL_COMPLETE) err = fmt::format("the call's event is not complete after a later read ({})", st);
      clReleaseEvent(event);
      for (size_t i = 0; i < count && err.empty(); ++i)
        if (out[i] != 2.0f * static_cast<float>(i % 1000) + 1.0f)
          err = fmt::format("element {}: {} (expected {})", i, out[i], 2.0f * static_cast<float>(i % 1000) + 1.0f);
    }
    if (err.empty() && chorusStreamQuery(cl.stream) != chorusSuccess) err = "chorusStreamQuery after the read";
    chorusMemDeregister(dev);
    clReleaseMemObject(mem);
    return err;
  });
  EXPECT_EQ(failures(msgs), "");
}

// NCCL's stream semantics (docs/device.md, "Returning before the queue"): a
// call returns once its commands are enqueued, not when its result is there.
// Each rank holds its queue behind a user event and writes the input behind
// it; two in-place allreduces and then a group of two (one more on that
// buffer, one on a second buffer) on the held queue must all return (a call
// that waited for the queue would block until the rescue thread, after 30 s,
// releases the event and says so), the stream must still be in progress, and
// once the event is released the queue must see the results in order: three
// sums of x + r on 2 ranks = 8x + 4, and one of 3x + r = 6x + 1.  Under each
// staging mode (calls in a group are always mapped).
class DeviceAsync : public ::testing::TestWithParam<const char*> {};

TEST_P(DeviceAsync, CallReturnsBeforeTheQueueRuns) {
  SKIP_WITHOUT_OPENCL();
  ScopedEnv mode("CHORUS_DEVICE_STAGING", GetParam());
  ScopedEnv chunk("CHORUS_DEVICE_CHUNK_BYTES", "16384");
  auto msgs = runRanks(2, [&](int r, chorusComm_t comm) -> std::string {
    ClRank cl;
    if (!cl.error.empty()) return cl.error;
    const size_t count = 3 * 4096 + 5;  // pipeline: four 16 KiB chunks, the last one short
    std::vector<float> host(count);
    for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>(i % 1000) + static_cast<float>(r);
    cl_int e = CL_SUCCESS;
    std::vector<float> host2(count);
    for (size_t i = 0; i < count; ++i) host2[i] = 3.0f * static_cast<float>(i % 1000) + static_cast<float>(r);
    cl_mem mem = clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE, count * 4, nullptr, &e);
    if (e != CL_SUCCESS) return fmt::format("clCreateBuffer: {}", e);
    cl_mem mem2 = clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE, count * 4, nullptr, &e);
    if (e != CL_SUCCESS) return fmt::format("clCreateBuffer: {}", e);
    cl_event hold = clCreateUserEvent(cl.ctx, &e);
    if (e != CL_SUCCESS) return fmt::format("clCreateUserEvent: {}", e);
    // The inputs arrive only once hold is released (in queue order).
    clEnqueueWriteBuffer(cl.queue, mem, CL_FALSE, 0, count * 4, host.data(), 1, &hold, nullptr);
    clEnqueueWriteBuffer(cl.queue, mem2, CL_FALSE, 0, count * 4, host2.data(), 0, nullptr, nullptr);
    clFlush(cl.queue);
    void* dev = nullptr;
    void* dev2 = nullptr;
    if (chorusMemRegisterOpenCL(mem, &dev) != chorusSuccess) return chorusGetLastError(nullptr);
    if (chorusMemRegisterOpenCL(mem2, &dev2) != chorusSuccess) return chorusGetLastError(nullptr);

    std::mutex mu;
    std::condition_variable cv;
    bool returned = false, rescued = false;
    std::thread rescue([&] {
      std::unique_lock l(mu);
      if (!cv.wait_for(l, std::chrono::seconds(30), [&] { return returned; })) {
        rescued = true;
        clSetUserEventStatus(hold, CL_COMPLETE);
      }
    });
    std::string err;
    for (int k = 0; k < 2 && err.empty(); ++k)
      if (chorusAllReduce(dev, dev, count, chorusFloat32, chorusSum, comm, cl.stream) != chorusSuccess)
        err = chorusGetLastError(comm);
    if (err.empty()) {
      chorusGroupStart();
      if (chorusAllReduce(dev, dev, count, chorusFloat32, chorusSum, comm, cl.stream) != chorusSuccess ||
          chorusAllReduce(dev2, dev2, count, chorusFloat32, chorusSum, comm, cl.stream) != chorusSuccess)
        err = chorusGetLastError(comm);
      if (chorusGroupEnd() != chorusSuccess && err.empty()) err = chorusGetLastError(nullptr);
    }
    {
      std::lock_guard l(mu);
      returned = true;
      if (rescued) err = "a call on the held queue returned only after the queue was released (it waited for it)";
    }
    cv.notify_all();
    rescue.join();
    if (err.empty()) {
      const chorusResult_t q = chorusStreamQuery(cl.stream);
      if (q != chorusInProgress) err = fmt::format("chorusStreamQuery on the held queue: {} (expected in progress)", q);
    }
    clSetUserEventStatus(hold, CL_COMPLETE);  // no-op after a rescue
    std::vector<float> out(count, -1.0f);
    clEnqueueReadBuffer(cl.queue, mem, CL_TRUE, 0, count * 4, out.data(), 0, nullptr, nullptr);
    for (size_t i = 0; i < count && err.empty(); ++i) {
      const float want = 8.0f * static_cast<float>(i % 1000) + 4.0f;
      if (out[i] != want) err = fmt::format("rank {} element {}: {} (expected {})", r, i, out[i], want);
    }
    clEnqueueReadBuffer(cl.queue, mem2, CL_TRUE, 0, count * 4, out.data(), 0, nullptr, nullptr);
    for (size_t i = 0; i < count && err.empty(); ++i) {
      const float want = 6.0f * static_cast<float>(i % 1000) + 1.0f;
      if (out[i] != want) err = fmt::format("rank {} second buffer element {}: {} (expected {})", r, i, out[i], want);
    }
    if (chorusStreamSynchronize(cl.stream) != chorusSuccess && err.empty())
      err = fmt::format("chorusStreamSynchronize: {}", chorusGetLastError(nullptr));
    if (err.empty() && chorusStreamQuery(cl.stream) != chorusSuccess) err = "chorusStreamQuery after the read";
    chorusMemDeregister(dev);
    chorusMemDeregister(dev2);
    clReleaseMemObject(mem);
    clReleaseMemObject(mem2);
    clReleaseEvent(hold);
    return err;
  });
  EXPECT_EQ(failures(msgs), "");
}
INSTANTIATE_TEST_SUITE_P(Shm, DeviceAsync, ::testing::Values("map", "pipeline", "whole"),
                         [](const auto& info) { return std::string(info.param); });

// The error of a host part that runs after its call returned is the
// stream's: a call returns on a held queue, the communicator is aborted, the
// queue is released; the worker's collective fails, and chorusStreamSynchronize
// (and chorusStreamQuery) say so by name, while the queue still drains.
TEST(DeviceOpenCL, LateErrorIsTheStreams) {
  SKIP_WITHOUT_OPENCL();
  auto msgs = runRanks(2, [&](int r, chorusComm_t comm) -> std::string {
    ClRank cl;
    if (!cl.error.empty()) return cl.error;
    const size_t count = 1000;
    cl_int e = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE, count * 4, nullptr, &e);
    if (e != CL_SUCCESS) return fmt::format("clCreateBuffer: {}", e);
    cl_event hold = clCreateUserEvent(cl.ctx, &e);
    clEnqueueMarkerWithWaitList(cl.queue, 1, &hold, nullptr);
    clFlush(cl.queue);
    void* dev = nullptr;
    if (chorusMemRegisterOpenCL(mem, &dev) != chorusSuccess) return chorusGetLastError(nullptr);
    std::string err;
    if (chorusAllReduce(dev, dev, count, chorusFloat32, chorusSum, comm, cl.stream) != chorusSuccess)
      err = fmt::format("rank {}: the call failed at once: {}", r, chorusGetLastError(comm));
    chorusCommAbort(comm);
    clSetUserEventStatus(hold, CL_COMPLETE);
    if (err.empty()) {
      const chorusResult_t sync = chorusStreamSynchronize(cl.stream);
      const std::string msg = chorusGetLastError(nullptr);
      if (sync == chorusSuccess) err = fmt::format("rank {}: chorusStreamSynchronize succeeded after the abort", r);
      else if (msg.find("abort") == std::string::npos)
        err = fmt::format("rank {}: chorusStreamSynchronize's error does not name the abort: {}", r, msg);
      else if (chorusStreamQuery(cl.stream) == chorusSuccess)
        err = fmt::format("rank {}: chorusStreamQuery succeeded after the late error", r);
    }
    chorusMemDeregister(dev);
    clReleaseMemObject(mem);
    clReleaseEvent(hold);
    return err;
  });
  EXPECT_EQ(failures(msgs), "");
}

// The staging modes on one stream, without a communicator: a host call that
// computes out[i] = 2 * in[i] + 1 (or out[i] = i with no input) sees the
// right bytes in every chunk, chunks come in order with the right lengths
// (10000 floats in 4 KiB chunks: nine of 1024 and one of 784), and the
// device buffer holds every chunk's result.
TEST(DeviceOpenCL, StagingModesChunkAndMap) {
  SKIP_WITHOUT_OPENCL();
  ClRank cl;
  ASSERT_EQ(cl.error, "");
  const uint64_t count = 10000;
  std::vector<float> in(count), out(count);
  for (uint64_t i = 0; i < count; ++i) in[i] = static_cast<float>(i % 977);
  cl_int e = CL_SUCCESS;
  cl_mem ma = clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE, count * 4, nullptr, &e);
  cl_mem mb = clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE, count * 4, nullptr, &e);
  ASSERT_EQ(e, CL_SUCCESS);
  void *da = nullptr, *db = nullptr;
  ASSERT_EQ(chorusMemRegisterOpenCL(ma, &da), chorusSuccess);
  ASSERT_EQ(chorusMemRegisterOpenCL(mb, &db), chorusSuccess);
  enum class Shape { OutOfPlace, InPlace, NoInput, NoOutput };
  for (device::Staging mode : {device::Staging::Pipeline, device::Staging::Map, device::Staging::Whole}) {
    for (Shape shape : {Shape::OutOfPlace, Shape::InPlace, Shape::NoInput, Shape::NoOutput}) {
      const std::string what = fmt::format("{} shape {}", device::stagingName(mode), static_cast<int>(shape));
      auto made = device::makeClStream(cl.queue, device::StagingOptions{mode, 4096});
      ASSERT_TRUE(made.isOk()) << made.status().message();
      device::DeviceStream& stream = **made;
      clEnqueueWriteBuffer(cl.queue, ma, CL_FALSE, 0, count * 4, in.data(), 0, nullptr, nullptr);
      std::vector<float> poison(count, -7.0f);
      clEnqueueWriteBuffer(cl.queue, mb, CL_FALSE, 0, count * 4, poison.data(), 0, nullptr, nullptr);
      device::StagedCall call;
      call.fn = "test";
      call.elementwise = true;
      call.count = count;
      call.elem_bytes = 4;
      call.send = shape == Shape::InPlace ? db : da;
      call.recv = db;
      if (shape == Shape::InPlace)
        clEnqueueWriteBuffer(cl.queue, mb, CL_FALSE, 0, count * 4, in.data(), 0, nullptr, nullptr);
      call.send_bytes = shape == Shape::NoInput ? 0 : count * 4;
      call.recv_bytes = shape == Shape::NoOutput ? 0 : count * 4;
      call.recv_written = shape != Shape::NoOutput;
      std::vector<uint64_t> chunks;
      uint64_t first = 0;
      Status st = stream.run(call, [&](const void* send, void* recv, uint64_t n) -> Status {
        chunks.push_back(n);
        const auto* s = static_cast<const float*>(send);
        auto* r = static_cast<float*>(recv);
        if (shape == Shape::NoInput && s != nullptr) return invalidArgument("a send pointer without input");
        for (uint64_t i = 0; i < n; ++i) {
          if (s != nullptr && s[i] != in[first + i])
            return invalidArgument("element {} of the input reads {}", first + i, s[i]);
          if (shape != Shape::NoOutput) r[i] = s != nullptr ? 2.0f * s[i] + 1.0f : static_cast<float>(first + i);
        }
        first += n;
        return {};
      });
      ASSERT_TRUE(st.isOk()) << what << ": " << st.message();
      ASSERT_EQ(first, count) << what;
      const device::StagingStats stats = stream.stats();
      if (mode == device::Staging::Pipeline) {
        EXPECT_EQ(chunks.size(), 10u) << what;
        EXPECT_EQ(chunks.front(), 1024u) << what;
        EXPECT_EQ(chunks.back(), 784u) << what;
        EXPECT_EQ(stats.pipelined_calls, 1u) << what;
        EXPECT_EQ(stats.chunks, 10u) << what;
      } else {
        EXPECT_EQ(chunks.size(), 1u) << what;
        EXPECT_EQ(mode == device::Staging::Map ? stats.mapped_calls : stats.whole_calls, 1u) << what;
      }
      // In queue order: a blocking read right after the call sees it.
      clEnqueueReadBuffer(cl.queue, mb, CL_TRUE, 0, count * 4, out.data(), 0, nullptr, nullptr);
      for (uint64_t i = 0; i < count; ++i) {
        const float want = shape == Shape::NoOutput ? -7.0f
                           : shape == Shape::NoInput ? static_cast<float>(i)
                                                     : 2.0f * in[i] + 1.0f;
        if (out[i] != want) {
          ADD_FAILURE() << what << ": element " << i << " is " << out[i] << ", expected " << want;
          break;
        }
      }
    }
  }
  // Auto: map where the device's memory is the host's (POCL's CPU device).
  cl_device_id dev_id = nullptr;
  clGetCommandQueueInfo(cl.queue, CL_QUEUE_DEVICE, sizeof dev_id, &dev_id, nullptr);
  cl_bool unified = CL_FALSE;
  clGetDeviceInfo(dev_id, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof unified, &unified, nullptr);
  auto made = device::makeClStream(cl.queue);
  ASSERT_TRUE(made.isOk());
  EXPECT_EQ((*made)->stats().resolved, unified == CL_TRUE ? device::Staging::Map : device::Staging::Pipeline);
  chorusMemDeregister(da);
  chorusMemDeregister(db);
  clReleaseMemObject(ma);
  clReleaseMemObject(mb);
}

// Misuse: each is chorusInvalidArgument naming the argument, before any data
// moves (so a one-rank communicator shows it).
TEST(DeviceOpenCL, MisuseIsNamed) {
  SKIP_WITHOUT_OPENCL();
  auto msgs = runRanks(1, [&](int, chorusComm_t comm) -> std::string {
    ClRank a, b;
    if (!a.error.empty()) return a.error;
    if (!b.error.empty()) return b.error;
    cl_int e = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(a.ctx, CL_MEM_READ_WRITE, 256, nullptr, &e);
    cl_mem other = clCreateBuffer(b.ctx, CL_MEM_READ_WRITE, 256, nullptr, &e);
    void *dev = nullptr, *dev_other = nullptr;
    chorusMemRegisterOpenCL(mem, &dev);
    chorusMemRegisterOpenCL(other, &dev_other);
    std::vector<std::string> errs;
    auto expect = [&](const char* what, chorusResult_t got, std::initializer_list<const char*> needles) {
      const std::string msg = chorusGetLastError(comm);
      if (got != chorusInvalidArgument) {
        errs.push_back(fmt::format("{}: returned {} ({})", what, static_cast<int>(got), msg));
        return;
      }
      for (const char* n : needles)
        if (msg.find(n) == std::string::npos) errs.push_back(fmt::format("{}: '{}' lacks '{}'", what, msg, n));
    };
    float host[64] = {};
    auto* d = static_cast<std::byte*>(dev);
    // A host pointer on an OpenCL stream.
    expect("host pointer", chorusAllReduce(host, dev, 64, chorusFloat32, chorusSum, comm, a.stream),
           {"chorusAllReduce", "sendbuff", "not in a registered OpenCL buffer"});
    // Past the end of the cl_mem (256 bytes): 64 floats at offset 4.
    expect("past the end", chorusAllReduce(d + 4, d + 4, 64, chorusFloat32, chorusSum, comm, a.stream),
           {"sendbuff", "256 bytes at offset 4", "CL_MEM_SIZE"});
    expect("allgather output past the end",
           chorusAllGather(d, d + 128, 40, chorusFloat32, comm, a.stream), {"recvbuff", "160 bytes at offset 128"});
    // A buffer of another context than the queue's.
    expect("other context", chorusBroadcast(dev_other, dev, 8, chorusFloat32, 0, comm, a.stream),
           {"sendbuff", "context"});
    // A device address on a host stream.
    expect("host stream", chorusAllReduce(dev, dev, 8, chorusFloat32, chorusSum, comm, nullptr),
           {"chorusAllReduce", "sendbuff", "opencl device address", "host stream"});
    // Registration and streams.
    void* p = nullptr;
    if (chorusMemRegisterOpenCL(nullptr, &p) != chorusInvalidArgument) errs.push_back("register NULL accepted");
    if (chorusMemDeregister(host) != chorusInvalidArgument) errs.push_back("deregister of a host pointer accepted");
    if (chorusMemDeregister(d + 4) != chorusInvalidArgument) errs.push_back("deregister inside a buffer accepted");
    chorusStream_t s = nullptr;
    if (chorusStreamCreateOpenCL(&s, nullptr) != chorusInvalidArgument) errs.push_back("a NULL queue accepted");
    cl_device_id dev_id = nullptr;
    clGetCommandQueueInfo(a.queue, CL_QUEUE_DEVICE, sizeof dev_id, &dev_id, nullptr);
    cl_command_queue ooo = clCreateCommandQueue(a.ctx, dev_id, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &e);
    if (e == CL_SUCCESS) {
      if (chorusStreamCreateOpenCL(&s, ooo) != chorusInvalidArgument ||
          std::string(chorusGetLastError(nullptr)).find("out-of-order") == std::string::npos)
        errs.push_back("an out-of-order queue accepted");
      clReleaseCommandQueue(ooo);
    }
    // Not on a device stream: refused by name, not run on wrong memory.
    chorusPrimitiveArgs_t pa = CHORUS_PRIMITIVE_ARGS_INITIALIZER;
    pa.sendbuff = dev;
    pa.recvbuff = dev;
    pa.count = 4;
    if (chorusPrimitive("allreduce", &pa, comm, a.stream) != chorusInvalidUsage ||
        std::string(chorusGetLastError(comm)).find("OpenCL stream") == std::string::npos)
      errs.push_back(fmt::format("a primitive on an OpenCL stream was not refused ({})", chorusGetLastError(comm)));
    if (chorusPrimitive("allreduce", &pa, comm, nullptr) != chorusInvalidUsage ||
        std::string(chorusGetLastError(comm)).find("args->sendbuff") == std::string::npos)
      errs.push_back(fmt::format("a primitive on device addresses was not refused ({})", chorusGetLastError(comm)));
    // A v-collective's extent past the end: 40 floats at displacement 40 of 64.
    size_t counts[1] = {40}, displs[1] = {40};
    expect("allgatherv past the end", chorusAllGatherV(dev, 40, d + 64, counts, displs, chorusFloat32, comm, a.stream),
           {"recvbuff", "CL_MEM_SIZE"});
    chorusMemDeregister(dev);
    chorusMemDeregister(dev_other);
    clReleaseMemObject(mem);
    clReleaseMemObject(other);
    std::string all;
    for (const auto& m : errs) all += m + "\n";
    return all;
  });
  EXPECT_EQ(failures(msgs), "");
}

// The device reduction kernels give the host kernels' results bit for bit
// (a NaN may differ in its payload only): every dtype x op, on random bit
// patterns (NaN, infinities and subnormals included) and, for fp8, every pair
// of values; out of place and in place.
TEST(DeviceOpenCL, ReductionKernelsMatchHost) {
  SKIP_WITHOUT_OPENCL();
  ClRank cl;
  ASSERT_EQ(cl.error, "");
  const chorusDataType_t dtypes[] = {chorusInt8,    chorusUint8,  chorusInt32,      chorusUint32,
                                     chorusInt64,   chorusUint64, chorusFloat16,    chorusBfloat16,
                                     chorusFloat32, chorusFloat64, chorusFloat8e4m3, chorusFloat8e5m2};
  std::mt19937_64 rng(41);
  for (chorusDataType_t d : dtypes) {
    const size_t es = kernels::dtypeSize(d);
    const size_t n = 65536 + 3;  // fp8: every pair (a, b), then 3 more
    std::vector<std::byte> a(n * es), b(n * es);
    for (size_t i = 0; i < n * es; ++i) {
      a[i] = static_cast<std::byte>(rng());
      b[i] = static_cast<std::byte>(rng());
    }
    if (es == 1)
      for (size_t i = 0; i < 65536; ++i) {
        a[i] = static_cast<std::byte>(i & 0xff);
        b[i] = static_cast<std::byte>(i >> 8);
      }
    cl_int e = CL_SUCCESS;
    // Offsets inside the buffers: one element of padding before each operand.
    cl_mem ma = clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE, (n + 1) * es, nullptr, &e);
    cl_mem mb = clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE, (n + 1) * es, nullptr, &e);
    cl_mem md = clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE, n * es, nullptr, &e);
    ASSERT_EQ(e, CL_SUCCESS);
    for (BinOp op : {BinOp::Sum, BinOp::Prod, BinOp::Max, BinOp::Min}) {
      const std::string what = fmt::format("{} op {}", kernels::dtypeName(d), static_cast<int>(op));
      clEnqueueWriteBuffer(cl.queue, ma, CL_TRUE, es, n * es, a.data(), 0, nullptr, nullptr);
      clEnqueueWriteBuffer(cl.queue, mb, CL_TRUE, es, n * es, b.data(), 0, nullptr, nullptr);
      std::vector<std::byte> want(n * es), got(n * es), got_inplace(n * es);
      kernels::Reducer(d, op)(want.data(), a.data(), b.data(), n);
      Status st = device::enqueueReduce(cl.queue, d, op, md, 0, ma, es, mb, es, n);
      ASSERT_TRUE(st.isOk()) << what << ": " << st.message();
      st = device::enqueueReduce(cl.queue, d, op, ma, es, ma, es, mb, es, n);  // in place: dst is a
      ASSERT_TRUE(st.isOk()) << what << ": " << st.message();
      clEnqueueReadBuffer(cl.queue, md, CL_TRUE, 0, n * es, got.data(), 0, nullptr, nullptr);
      clEnqueueReadBuffer(cl.queue, ma, CL_TRUE, es, n * es, got_inplace.data(), 0, nullptr, nullptr);
      size_t wrong = 0;
      std::string first;
      for (const auto* out : {&got, &got_inplace})
        for (size_t i = 0; i < n; ++i) {
          const std::byte* w = want.data() + i * es;
          const std::byte* g = out->data() + i * es;
          if (std::memcmp(w, g, es) == 0) continue;
          if (kernels::isFloatType(d) && std::isnan(kernels::loadAsDouble(w, d)) &&
              std::isnan(kernels::loadAsDouble(g, d)))
            continue;
          if (wrong++ == 0)
            first = fmt::format("element {}: {} op {} = {} on the device, {} on the host", i,
                                kernels::loadAsDouble(a.data() + i * es, d), kernels::loadAsDouble(b.data() + i * es, d),
                                kernels::loadAsDouble(g, d), kernels::loadAsDouble(w, d));
        }
      EXPECT_EQ(wrong, 0u) << what << ": " << first;
    }
    clReleaseMemObject(ma);
    clReleaseMemObject(mb);
    clReleaseMemObject(md);
  }
}

// chorus-bench --memory opencl: a sweep on device buffers measures and its
// check finds every element right (the check reads the device's output).
TEST(DeviceOpenCL, BenchOnDeviceBuffers) {
  SKIP_WITHOUT_OPENCL();
  for (auto c : {tools::bench::Collective::AllReduce, tools::bench::Collective::AllGather,
                 tools::bench::Collective::ReduceScatter}) {
    tools::bench::BenchOptions o;
    o.collective = c;
    o.sweep = {64, 65536, 32, 0};
    o.iters = 2;
    o.warmup = 1;
    o.memory = "opencl";
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
    EXPECT_NE(tables[0].find("# buffers: opencl ("), std::string::npos) << tables[0];
    EXPECT_NE(tables[0].find("# Out of bounds values : 0 OK"), std::string::npos) << tables[0];
  }
}

#else
TEST(DeviceOpenCL, NotBuilt) { GTEST_SKIP() << "chorus was built without OpenCL (" << skipReason() << ")"; }
#endif

}  // namespace
}  // namespace chorus::testing
