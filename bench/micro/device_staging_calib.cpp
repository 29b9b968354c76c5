// The calibration of the staging term (src/sim/device_staging.hpp; issue 41,
// item 5), measured on the first OpenCL device, never on a collective:
//
//   command_us: the per-call chain of a staged call with no collective in it,
//               in --procs processes at once (as many as the collective's
//               ranks, each its own context and queue): a thread enqueues,
//               per call, a non-blocking map of a 64-byte buffer, a user
//               event and the unmap behind it, and a second thread (the
//               device worker's place) waits for the map and completes the
//               user event; the time per call of --reps calls, the mean over
//               the processes;
//   marker_us:  for reference, one bare round trip (marker + wait, median);
//   copy_gbps:  clEnqueueReadBuffer + clEnqueueWriteBuffer of --copy-bytes,
//               blocking, their round trips taken out (median of --reps / 20);
//   unified:    CL_DEVICE_HOST_UNIFIED_MEMORY.
//
//   device_staging_calib calibrate [--procs 2] [--reps 2000] [--copy-bytes 67108864]   -> one JSON object
//   device_staging_calib predict --calib FILE --mode map|pipeline|whole --in B --out B
//                        [--chunk B] [--elementwise 0|1] --host-us H [--host-chunk-us h]
//                        -> {"total_us": .., "staging_us": .., ...}
// predict prices a call with the host collective's time H for the whole
// buffer and h for one chunk (a short last chunk is h scaled by its bytes).
// A plain program (no Google Benchmark loop): bench/device_staging.sh runs it.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "sim/device_staging.hpp"

#ifdef CHORUS_HAVE_OPENCL
#include <CL/cl.h>
#endif

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

const char* argOf(int argc, char** argv, const char* name, const char* dflt) {
  for (int i = 2; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return dflt;
}

#ifdef CHORUS_HAVE_OPENCL
struct Cl {
  cl_context ctx = nullptr;
  cl_command_queue q = nullptr;
  cl_bool unified = CL_FALSE;
  bool ok = false;
  Cl() {
    cl_platform_id p = nullptr;
    cl_device_id d = nullptr;
    cl_int e = clGetPlatformIDs(1, &p, nullptr);
    if (e == CL_SUCCESS) e = clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, nullptr);
    if (e == CL_SUCCESS) ctx = clCreateContext(nullptr, 1, &d, nullptr, nullptr, &e);
    if (e == CL_SUCCESS) q = clCreateCommandQueue(ctx, d, 0, &e);
    if (e == CL_SUCCESS) clGetDeviceInfo(d, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof unified, &unified, nullptr);
    ok = e == CL_SUCCESS;
  }
  ~Cl() {
    if (q) clReleaseCommandQueue(q);
    if (ctx) clReleaseContext(ctx);
  }
};
using clk = std::chrono::steady_clock;
double usOf(clk::duration x) { return std::chrono::duration<double, std::micro>(x).count(); }

// The staged call's chain without a collective: us per call.
double chainUs(Cl& cl, int reps) {
  cl_int e = CL_SUCCESS;
  cl_mem mem = clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE, 64, nullptr, &e);
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<cl_event, cl_event>> work;  // (map's event, gate)
  bool done = false;
  std::thread worker([&] {
    for (;;) {
      std::unique_lock l(mu);
      cv.wait(l, [&] { return done || !work.empty(); });
      if (work.empty()) return;
      auto [ready, gate] = work.front();
      work.pop_front();
      l.unlock();
      clWaitForEvents(1, &ready);
      clSetUserEventStatus(gate, CL_COMPLETE);
      clReleaseEvent(ready);
      clReleaseEvent(gate);
    }
  });
  auto one = [&] {
    cl_event ready = nullptr;
    void* p = clEnqueueMapBuffer(cl.q, mem, CL_FALSE, CL_MAP_READ | CL_MAP_WRITE, 0, 64, 0, nullptr, &ready, &e);
    cl_event gate = clCreateUserEvent(cl.ctx, &e);
    clEnqueueUnmapMemObject(cl.q, mem, p, 1, &gate, nullptr);
    clFlush(cl.q);
    {
      std::lock_guard l(mu);
      work.emplace_back(ready, gate);
    }
    cv.notify_one();
  };
  for (int i = 0; i < reps / 10; ++i) one();  // warm up
  clFinish(cl.q);
  const auto t0 = clk::now();
  for (int i = 0; i < reps; ++i) one();
  clFinish(cl.q);
  const double t = usOf(clk::now() - t0) / reps;
  {
    std::lock_guard l(mu);
    done = true;
  }
  cv.notify_one();
  worker.join();
  clReleaseMemObject(mem);
  return t;
}
#endif

int calibrate(int argc, char** argv) {
#ifdef CHORUS_HAVE_OPENCL
  const int reps = std::atoi(argOf(argc, argv, "--reps", "2000"));
  const int procs = std::max(1, std::atoi(argOf(argc, argv, "--procs", "1")));
  const size_t copy = std::strtoull(argOf(argc, argv, "--copy-bytes", "67108864"), nullptr, 10);
  // The chain in `procs` processes at once (forked before any OpenCL call);
  // each writes its us per call into a pipe.
  int fds[2];
  if (pipe(fds) != 0) return 2;
  std::vector<pid_t> kids;
  for (int i = 0; i < procs; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      Cl cl;
      double t = cl.ok ? chainUs(cl, reps) : -1;
      if (write(fds[1], &t, sizeof t) != sizeof t) _exit(1);
      _exit(0);
    }
    kids.push_back(pid);
  }
  close(fds[1]);
  double sum = 0;
  int got = 0;
  for (double t; read(fds[0], &t, sizeof t) == sizeof t;) {
    if (t < 0) {
      std::fprintf(stderr, "device_staging_calib: no OpenCL device in a child\n");
      return 2;
    }
    sum += t;
    ++got;
  }
  for (pid_t k : kids) waitpid(k, nullptr, 0);
  if (got != procs) return 2;
  const double command = sum / got;
  Cl cl;
  if (!cl.ok) {
    std::fprintf(stderr, "device_staging_calib: no OpenCL device\n");
    return 2;
  }
  std::vector<double> rt;
  for (int i = 0; i < reps + reps / 10; ++i) {
    const auto t0 = clk::now();
    cl_event ev = nullptr;
    clEnqueueMarkerWithWaitList(cl.q, 0, nullptr, &ev);
    clWaitForEvents(1, &ev);
    const auto t1 = clk::now();
    clReleaseEvent(ev);
    if (i >= reps / 10) rt.push_back(usOf(t1 - t0));  // the first tenth warms up
  }
  const double marker = median(rt);
  cl_int e = CL_SUCCESS;
  cl_mem mem = clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE, copy, nullptr, &e);
  std::vector<char> host(copy, 1);
  std::vector<double> per_byte;
  for (int i = 0; i < std::max(3, reps / 200); ++i) {
    const auto t0 = clk::now();
    clEnqueueWriteBuffer(cl.q, mem, CL_TRUE, 0, copy, host.data(), 0, nullptr, nullptr);
    clEnqueueReadBuffer(cl.q, mem, CL_TRUE, 0, copy, host.data(), 0, nullptr, nullptr);
    const double t = usOf(clk::now() - t0) - 2 * marker;
    if (i > 0) per_byte.push_back(t / (2.0 * static_cast<double>(copy)));
  }
  const double gbps = 1.0 / (median(per_byte) * 1e3);  // bytes/us -> GB/s
  std::printf("{\"command_us\": %.3f, \"marker_us\": %.3f, \"copy_gbps\": %.3f, \"unified\": %s, \"procs\": %d, "
              "\"reps\": %d, \"copy_bytes\": %zu}\n",
              command, marker, gbps, cl.unified ? "true" : "false", procs, reps, copy);
  clReleaseMemObject(mem);
  return 0;
#else
  (void)argc;
  (void)argv;
  std::fprintf(stderr, "device_staging_calib: chorus was built without OpenCL\n");
  return 2;
#endif
}

int predict(int argc, char** argv) {
  using namespace chorus::sim;
  std::ifstream f(argOf(argc, argv, "--calib", ""));
  std::stringstream ss;
  ss << f.rdbuf();
  auto calib = parseDeviceStagingCalibration(ss.str());
  if (!calib.isOk()) {
    std::fprintf(stderr, "device_staging_calib: %s\n", calib.status().message().c_str());
    return 2;
  }
  StagedShape s;
  const std::string mode = argOf(argc, argv, "--mode", "map");
  s.mode = mode == "whole" ? StagingModel::Whole : mode == "pipeline" ? StagingModel::Pipeline : StagingModel::Map;
  s.in_bytes = std::strtoull(argOf(argc, argv, "--in", "0"), nullptr, 10);
  s.out_bytes = std::strtoull(argOf(argc, argv, "--out", "0"), nullptr, 10);
  s.chunk_bytes = std::strtoull(argOf(argc, argv, "--chunk", "1048576"), nullptr, 10);
  s.elementwise = std::atoi(argOf(argc, argv, "--elementwise", "1")) != 0;
  const double host_all = std::atof(argOf(argc, argv, "--host-us", "0"));
  const double host_chunk = std::atof(argOf(argc, argv, "--host-chunk-us", "0"));
  const uint64_t total = std::max(s.in_bytes, s.out_bytes);
  const StagedPrice pr = priceStaged(s, *calib, [&](uint64_t b) {
    if (b == total) return host_all;
    return host_chunk * static_cast<double>(b) / static_cast<double>(std::max<uint64_t>(s.chunk_bytes, 1));
  });
  std::printf("{\"mode\": \"%s\", \"ran_as\": \"%s\", \"total_us\": %.3f, \"host_us\": %.3f, \"staging_us\": %.3f, "
              "\"chunks\": %llu}\n",
              mode.c_str(), stagingModelName(pr.ran_as), pr.total_us, pr.host_us, pr.staging_us,
              static_cast<unsigned long long>(pr.chunks));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "calibrate") == 0) return calibrate(argc, argv);
  if (argc >= 2 && std::strcmp(argv[1], "predict") == 0) return predict(argc, argv);
  std::fprintf(stderr, "usage: device_staging_calib calibrate|predict ... (see the file's header)\n");
  return 2;
}
