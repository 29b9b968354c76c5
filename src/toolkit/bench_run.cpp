// runBench: the measuring loop of chorus-bench, over the C API.
#include <chorus/device.h>

#include <cmath>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "common/env.hpp"
#include "device/cl_device.hpp"
#include "kernels/dtype.hpp"
#include "plan/plan.hpp"
#include "toolkit/bench.hpp"
#include "toolkit/launcher.hpp"

namespace chorus::tools::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::byte[], FreeDeleter>;

// Page-aligned and zeroed, so the first timed iteration does not pay the page faults.
Result<Buffer> allocate(size_t bytes) {
  constexpr size_t kAlign = 4096;
  size_t rounded = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kAlign, rounded));
  if (p == nullptr)
    return systemError("chorus-bench: cannot allocate {} bytes for the benchmark buffers (lower -e)", rounded);
  std::memset(p, 0, rounded);
  return Buffer(p);
}

// One call of the collective: blocking with a NULL stream, queued on st otherwise.
chorusResult_t issue(Collective c, const void* send, void* recv, const Shape& s, chorusDataType_t d,
                     chorusRedOp_t op, int root, int rank, int nranks, chorusComm_t comm, chorusStream_t st) {
  switch (c) {
    case Collective::AllReduce: return chorusAllReduce(send, recv, s.count, d, op, comm, st);
    case Collective::Broadcast: return chorusBroadcast(send, recv, s.count, d, root, comm, st);
    case Collective::Reduce: return chorusReduce(send, recv, s.count, d, op, root, comm, st);
    case Collective::AllGather: return chorusAllGather(send, recv, s.count, d, comm, st);
    case Collective::ReduceScatter: return chorusReduceScatter(send, recv, s.count, d, op, comm, st);
    case Collective::AllToAll: return chorusAllToAll(send, recv, s.count, d, comm, st);
    case Collective::Gather: return chorusGather(send, recv, s.count, d, root, comm, st);
    case Collective::Scatter: return chorusScatter(send, recv, s.count, d, root, comm, st);
    case Collective::SendRecv: {
      chorusResult_t r = chorusGroupStart();
      if (r != chorusSuccess) return r;
      chorusResult_t sr = chorusSend(send, s.count, d, (rank + 1) % nranks, comm, st);
      chorusResult_t rr = sr == chorusSuccess ? chorusRecv(recv, s.count, d, (rank + nranks - 1) % nranks, comm, st)
                                              : sr;
      r = chorusGroupEnd();  // always close the group, even after a failed post
      return rr != chorusSuccess ? rr : r;
    }
    case Collective::Barrier: return chorusBarrier(comm, st);
  }
  return chorusInvalidArgument;
}

// Destroys a stream on every return path.
struct StreamGuard {
  chorusStream_t stream = nullptr;
  ~StreamGuard() {
    if (stream != nullptr) (void)chorusStreamDestroy(stream);
  }
};

Status apiError(chorusComm_t comm, int rank, std::string_view what, chorusResult_t r) {
  return Status(r, fmt::format("chorus-bench: rank {}: {} failed: {}: {}", rank, what, chorusGetErrorString(r),
                               chorusGetLastError(comm)));
}

// Where the input goes and where the output lands, for one placement
// (in-place offsets as in NCCL).
struct Placement {
  std::byte* input;   // filled by the check
  const void* send;   // sendbuff argument
  void* recv;         // recvbuff argument
  const std::byte* output;  // what the check reads
};

Placement place(Collective c, bool in_place, std::byte* sendbuf, std::byte* recvbuf, const Shape& s, size_t elem,
                int rank) {
  if (!in_place) return {sendbuf, sendbuf, recvbuf, recvbuf};
  const size_t block = s.count * elem * static_cast<size_t>(rank);
  switch (c) {
    case Collective::AllGather:
    case Collective::Gather: return {recvbuf + block, recvbuf + block, recvbuf, recvbuf};
    case Collective::ReduceScatter:
    case Collective::Scatter: return {sendbuf, sendbuf, sendbuf + block, sendbuf + block};
    default: return {recvbuf, recvbuf, recvbuf, recvbuf};
  }
}

// One placement of one row's call, issued as -z says.
struct Issue {
  Collective c;
  Placement p;
  const Shape& shape;
  chorusDataType_t d;
  chorusRedOp_t op;
  int root, rank, nranks;
  chorusComm_t comm;
  chorusStream_t stream;  // nullptr: blocking calls
  const std::string& where;
  chorusStream_t device = nullptr;  // --memory opencl|cuda: every call goes to this device stream

  Status once() const {
    chorusResult_t r = issue(c, p.send, p.recv, shape, d, op, root, rank, nranks, comm, device);
    return r == chorusSuccess ? Status::ok() : apiError(comm, rank, where, r);
  }

  // k timed calls: blocking, or (-z 0) queued on the stream and waited for once;
  // on a device, issued on its stream and waited for once (the queue drained).
  Status timed(int k) const {
    if (device != nullptr) {
      for (int i = 0; i < k; ++i) CHORUS_RETURN_IF_ERROR(once());
      chorusResult_t r = chorusStreamSynchronize(device);
      return r == chorusSuccess ? Status::ok() : apiError(comm, rank, where + " (device stream)", r);
    }
    if (stream == nullptr) {
      for (int i = 0; i < k; ++i) CHORUS_RETURN_IF_ERROR(once());
      return {};
    }
    for (int i = 0; i < k; ++i)
      if (chorusResult_t r = issue(c, p.send, p.recv, shape, d, op, root, rank, nranks, comm, stream);
          r != chorusSuccess)
        return apiError(comm, rank, where, r);
    chorusResult_t r = chorusStreamSynchronize(stream);
    return r == chorusSuccess ? Status::ok() : apiError(comm, rank, where + " (stream)", r);
  }
};

// One run of the sweep as one rank: the job, the buffers, and the totals that
// every row adds to.
class Bench {
 public:
  Bench(const BenchOptions& o, chorusComm_t comm, std::FILE* out)
      : o_(o),
        c_(o.collective),
        comm_(comm),
        // The benchmark's own collectives go to a communicator of their own
        // when given one, so traces of comm hold only the measured calls.
        book_(o.bookkeeping != nullptr ? o.bookkeeping : comm),
        out_(out) {}

  Status checkJob() {
    if (chorusResult_t r = chorusCommCount(comm_, &nranks_); r != chorusSuccess)
      return apiError(comm_, -1, "chorusCommCount", r);
    if (chorusResult_t r = chorusCommUserRank(comm_, &rank_); r != chorusSuccess)
      return apiError(comm_, -1, "chorusCommUserRank", r);
    if (takesRoot(c_) && (o_.root < 0 || o_.root >= nranks_))
      return invalidArgument("chorus-bench: root {} (-r) is not a rank of this {}-rank job", o_.root, nranks_);
    if (o_.iters < 1 || o_.warmup < 0)
      return invalidArgument("chorus-bench: -n {} / -w {}: need at least 1 iteration and no negative warmup",
                             o_.iters, o_.warmup);
    if (o_.average < 0 || o_.average > 3)
      return invalidArgument("chorus-bench: -a {} is not 0 (rank 0's time), 1 (mean), 2 (min) or 3 (max)",
                             o_.average);
    return {};
  }

  // The stream, the sizes, the buffers and the --json file; prints the header.
  Status prepare() {
    if (!o_.blocking)
      if (chorusResult_t r = chorusStreamCreate(&stream_.stream); r != chorusSuccess)
        return apiError(comm_, rank_, "chorusStreamCreate (for -z 0)", r);
    if (const std::optional<plan::Collective> pc = planCollective(c_)) {
      known_to_plans_ = true;
      plan_collective_ = *pc;
    }
    CHORUS_ASSIGN_OR_RETURN(sizes_, sizeSweep(o_.sweep));
    if (c_ == Collective::Barrier) sizes_.resize(1);  // moves no data: one row says it all

    // Buffers are allocated once, at the largest size any (dtype, size) needs.
    size_t max_bytes = 0;
    for (chorusDataType_t d : o_.dtypes)
      for (uint64_t size : sizes_) {
        Shape s = shapeFor(c_, size, kernels::dtypeSize(d), nranks_);
        max_bytes = std::max(max_bytes, std::max(s.send_count, s.recv_count) * kernels::dtypeSize(d));
      }
    CHORUS_ASSIGN_OR_RETURN(sendbuf_, allocate(max_bytes));
    CHORUS_ASSIGN_OR_RETURN(recvbuf_, allocate(max_bytes));
    max_bytes_ = max_bytes;
    if (o_.memory == "opencl" || o_.memory == "cuda") {
      const bool cuda = o_.memory == "cuda";
      int available = 0;
      char why[512] = {};
      chorusMemSpaceQuery(cuda ? chorusMemCuda : chorusMemOpenCL, &available, why, sizeof why);
      if (available == 0) return makeError(chorusSystemError, "chorus-bench --memory {}: {}", o_.memory, why);
      auto dev = cuda ? device::openCudaDevice() : device::openClDevice();
      if (!dev.isOk()) return dev.status().withContext(fmt::format("chorus-bench --memory {}: ", o_.memory));
      cl_ = std::move(dev).value();
      CHORUS_ASSIGN_OR_RETURN(dev_send_, cl_->allocate(max_bytes));
      CHORUS_ASSIGN_OR_RETURN(dev_recv_, cl_->allocate(max_bytes));
      const chorusResult_t r = cuda ? chorusStreamCreateCuda(&device_stream_.stream, cl_->queue())
                                    : chorusStreamCreateOpenCL(&device_stream_.stream, cl_->queue());
      if (r != chorusSuccess)
        return apiError(comm_, rank_, fmt::format("chorusStreamCreate{} (--memory {})", cuda ? "Cuda" : "OpenCL",
                                                  o_.memory),
                        r);
    }

    if (rank_ == 0 && !o_.json_path.empty()) {
      json_.open(o_.json_path, std::ios::out | std::ios::trunc);
      if (!json_) return systemError("chorus-bench: cannot open --json file '{}' for writing", o_.json_path);
    }
    algo_ = o_.algos.empty() ? algoFor(o_.algo_spec, c_) : "all";
    print(fmt::format("# chorus-bench {}  nranks {}  minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} "
                      "validation: {} algo: {} average: {}({}) blocking: {}\n",
                      collectiveName(c_), nranks_, o_.sweep.min_bytes, o_.sweep.max_bytes,
                      o_.sweep.step_factor > 1 ? fmt::format("{}(factor)", o_.sweep.step_factor)
                                               : fmt::format("{}(bytes)", o_.sweep.step_bytes),
                      o_.warmup, o_.iters, o_.check ? 1 : 0, algo_, o_.average, averageName(o_.average),
                      o_.blocking ? 1 : 0));
    print(formatMemorySpaces("# "));
    print(fmt::format("# buffers: {}\n", cl_ ? o_.memory + " (" + cl_->name() + "), calls on " +
                                                  (o_.memory == "cuda" ? "a CUDA" : "an OpenCL") +
                                                  " stream (staging: CHORUS_DEVICE_STAGING, docs/device.md)"
                                            : "host"));
    print(formatHeader());
    return {};
  }

  Status sweep() {
    std::vector<std::optional<chorusRedOp_t>> ops;
    if (takesOp(c_)) {
      for (chorusRedOp_t op : o_.ops) ops.emplace_back(op);
    } else {
      ops.emplace_back(std::nullopt);
    }
    // Every forced algorithm (--algo all) at each size in turn, so that the
    // algorithms compared at a size are measured within moments of each other
    // (this VM's speed changes over minutes); or the configured one.
    std::vector<std::string> sweep_algos = o_.algos;
    if (sweep_algos.empty()) sweep_algos.emplace_back();
    for (chorusDataType_t d : o_.dtypes)
      for (const std::optional<chorusRedOp_t>& op : ops) {
        const Pattern pattern(d, op, nranks_);
        for (uint64_t size : sizes_)
          for (const std::string& forced : sweep_algos)
            CHORUS_RETURN_IF_ERROR(measureRow(d, op, pattern, size, forced));
      }
    return {};
  }

  Result<uint64_t> finish() {
    if (!o_.algos.empty())
      if (chorusResult_t r = chorusCommSetAlgo(comm_, o_.algo_spec.c_str()); r != chorusSuccess)
        return apiError(comm_, rank_, "restoring CHORUS_ALGO", r);
    print(formatFooter(wrong_total_, busbw_n_ ? busbw_sum_ / busbw_n_ : 0));
    if (json_.is_open() && !json_) return systemError("chorus-bench: writing --json file '{}' failed", o_.json_path);
    return wrong_total_;
  }

 private:
  void print(const std::string& s) const {
    if (rank_ != 0) return;
    std::fputs(s.c_str(), out_);
    std::fflush(out_);
  }

  // One row: both placements of one (dtype, op, size) under one algorithm.
  Status measureRow(chorusDataType_t d, const std::optional<chorusRedOp_t>& op, const Pattern& pattern, uint64_t size,
                    const std::string& forced) {
    if (!forced.empty()) {
      const std::string spec = withAlgo(o_.algo_spec, c_, forced);
      if (chorusResult_t r = chorusCommSetAlgo(comm_, spec.c_str()); r != chorusSuccess)
        return apiError(comm_, rank_, "forcing " + spec, r);
    }
    Row row;
    row.collective = c_;
    row.shape = shapeFor(c_, size, kernels::dtypeSize(d), nranks_);
    row.dtype = d;
    row.op = op;
    if (takesRoot(c_)) row.root = o_.root;
    bool skipped = false;
    std::string skip_why;
    for (bool in_place : {false, true}) {
      if (in_place && (!hasInPlace(c_) || !o_.in_place)) break;
      CHORUS_ASSIGN_OR_RETURN(const bool measured, measurePlacement(row, in_place, forced, pattern, &skip_why));
      if (!measured) {
        skipped = true;
        break;
      }
    }
    if (skipped) {
      const std::string& want = forced.empty() ? o_.forced_algo : forced;
      print(fmt::format("# {}: algorithm '{}' does not handle {} bytes on {} ranks, not measured: {}\n",
                        collectiveName(c_), want, size, nranks_, skip_why));
      if (forced.empty() && o_.unsupported != nullptr) ++*o_.unsupported;
      return {};
    }
    print(formatRow(row));
    if (o_.rows != nullptr) o_.rows->push_back(row);
    if (json_.is_open()) {
      json_ << rowJson(row, false, nranks_, algo_).dump() << '\n';
      if (row.in_place) json_ << rowJson(row, true, nranks_, algo_).dump() << '\n';
      json_.flush();
    }
    return {};
  }

  // Measures one placement into row; false (and why in *skip_why) when the
  // algorithm forced for it would not run it.
  Result<bool> measurePlacement(Row& row, bool in_place, const std::string& forced, const Pattern& pattern,
                                std::string* skip_why) {
    const chorusDataType_t d = row.dtype;
    const size_t elem = kernels::dtypeSize(d);
    const std::string what =
        fmt::format("{} of {} {} elements", collectiveName(c_), row.shape.count, kernels::dtypeName(d));
    const std::string where = fmt::format("{} ({})", what, in_place ? "in-place" : "out-of-place");
    // What the tuner chose and what its cost model predicted.
    char chosen[64] = {};
    double predicted = 0;
    const bool priced = known_to_plans_ &&
                        chorusCommPredict(comm_, std::string(collectiveName(c_)).c_str(), row.shape.count, d,
                                          in_place ? 1 : 0, chosen, sizeof chosen, &predicted) == chorusSuccess;
    // A forced algorithm that does not handle the shape falls back to the
    // tuner's choice: not a row of this algorithm (every rank prices alike,
    // so all skip together).
    const std::string& want = forced.empty() ? o_.forced_algo : forced;
    if (!want.empty() && priced && want != chosen) {
      const plan::Algorithm* a = known_to_plans_ ? registry_.find(plan_collective_, want) : nullptr;
      const std::string_view needs = a != nullptr ? a->requirement() : std::string_view();
      *skip_why = fmt::format("{} ({}): {}; the tuner would run '{}' instead", what,
                              in_place ? "in-place" : "out-of-place",
                              needs.empty() ? std::string("it does not handle this shape")
                                            : fmt::format("it needs {}", needs),
                              chosen);
      return false;
    }
    Issue call{c_,
                     place(c_, in_place, sendbuf_.get(), recvbuf_.get(), row.shape, elem, rank_),
                     row.shape,
                     d,
                     row.op.value_or(chorusSum),
                     o_.root,
                     rank_,
                     nranks_,
                     comm_,
                     o_.blocking ? nullptr : stream_.stream,
                     where};
    if (cl_) {
      // The same placement in the device buffers (device addresses keep the offsets).
      auto onDevice = [&](const void* host) -> std::byte* {
        auto* h = static_cast<const std::byte*>(host);
        if (h >= sendbuf_.get() && h < sendbuf_.get() + max_bytes_) return dev_send_ + (h - sendbuf_.get());
        return dev_recv_ + (h - recvbuf_.get());
      };
      call.p.send = onDevice(call.p.send);
      call.p.recv = onDevice(call.p.recv);
      call.device = device_stream_.stream;
    }
    Measurement m;
    if (o_.check) {
      pattern.fill(call.p.input, rank_, row.shape.send_count);
      if (cl_) {
        CHORUS_RETURN_IF_ERROR(cl_->upload(dev_send_, sendbuf_.get(), max_bytes_));
        CHORUS_RETURN_IF_ERROR(cl_->upload(dev_recv_, recvbuf_.get(), max_bytes_));
      }
      CHORUS_RETURN_IF_ERROR(call.once());
      if (cl_) {
        if (chorusResult_t r = chorusStreamSynchronize(call.device); r != chorusSuccess)
          return apiError(comm_, rank_, "chorusStreamSynchronize (device stream)", r);
        CHORUS_RETURN_IF_ERROR(cl_->download(sendbuf_.get(), dev_send_, max_bytes_));
        CHORUS_RETURN_IF_ERROR(cl_->download(recvbuf_.get(), dev_recv_, max_bytes_));
      }
      // Summed as float64 (exact below 2^53): CHORUS_REPRODUCIBLE=exact
      // refuses integer sums, and the bench must run in every mode.
      double wrong_sum = static_cast<double>(countWrong(c_, pattern, row.shape, o_.root, rank_, call.p.output));
      if (chorusResult_t r = chorusAllReduce(&wrong_sum, &wrong_sum, 1, chorusFloat64, chorusSum, book_, nullptr);
          r != chorusSuccess)
        return apiError(comm_, rank_, "summing the wrong-element counts", r);
      const auto wrong = static_cast<uint64_t>(wrong_sum);
      m.wrong = wrong;
      wrong_total_ += wrong;
    }
    CHORUS_ASSIGN_OR_RETURN(const double seconds, timeCalls(call));
    m.time_us = seconds * 1e6;
    if (priced) {
      m.algo = chosen;
      m.predicted_us = predicted;
    }
    m.bw = bandwidth(c_, row.shape, elem, nranks_, seconds);
    busbw_sum_ += m.bw.busbw_gbps;
    ++busbw_n_;
    if (in_place) {
      row.in_place = m;
    } else {
      row.out_of_place = m;
    }
    return true;
  }

  // Warms up, then times the call: seconds per call as -a combines the ranks.
  Result<double> timeCalls(const Issue& call) {
    for (int i = 0; i < o_.warmup; ++i) CHORUS_RETURN_IF_ERROR(call.once());
    // --warmup-ms: keep warming up, in batches, until the slowest rank has
    // spent that long (a CPU that idled in the set-up runs slowly for
    // milliseconds: 1 KiB allreduce 2 us after 5 calls, 0.8 after 5000).
    if (o_.warmup_ms > 0) {
      const auto w0 = Clock::now();
      for (double spent = 0; spent * 1e3 < o_.warmup_ms;) {
        const int batch = std::max(1, o_.warmup);
        for (int i = 0; i < batch; ++i) CHORUS_RETURN_IF_ERROR(call.once());
        CHORUS_RETURN_IF_ERROR(combined(w0, 1, 3, &spent));
      }
    }
    if (chorusResult_t r = chorusBarrier(book_, nullptr); r != chorusSuccess)
      return apiError(comm_, rank_, "the barrier before " + call.where, r);
    int iters = o_.iters;
    double seconds = 0;
    {
      auto t0 = Clock::now();
      CHORUS_RETURN_IF_ERROR(call.timed(iters));
      // By default (-a 3) the slowest rank's mean sets the collective's time
      // (MPI-style max).
      CHORUS_RETURN_IF_ERROR(combined(t0, iters, o_.average, &seconds));
    }
    // --min-ms: too short a window for the timer and the scheduler's
    // hiccups; time one uninterrupted window of enough calls instead.
    if (o_.min_time_ms > 0 && seconds * iters * 1e3 < o_.min_time_ms) {
      iters = static_cast<int>(std::min(1e6, std::ceil(o_.min_time_ms * 1e-3 / std::max(seconds, 1e-9))));
      if (chorusResult_t r = chorusBarrier(book_, nullptr); r != chorusSuccess)
        return apiError(comm_, rank_, "the barrier before " + call.where, r);
      auto t0 = Clock::now();
      CHORUS_RETURN_IF_ERROR(call.timed(iters));
      CHORUS_RETURN_IF_ERROR(combined(t0, iters, o_.average, &seconds));
    }
    return seconds;
  }

  // The ranks' mean time over k calls since t0, combined as `average` says
  // (every rank gets the same value): 0 rank 0's, 1 the mean, 2 min, 3 max.
  Status combined(Clock::time_point t0, int k, int average, double* out) const {
    const double mine = std::chrono::duration<double>(Clock::now() - t0).count() / std::max(k, 1);
    *out = average == 0 && rank_ != 0 ? 0.0 : mine;
    const chorusRedOp_t how = average == 2 ? chorusMin : average == 3 ? chorusMax : chorusSum;
    if (chorusResult_t r = chorusAllReduce(out, out, 1, chorusFloat64, how, book_, nullptr); r != chorusSuccess)
      return apiError(comm_, rank_, "reducing the timings", r);
    if (average == 1) *out /= nranks_;
    return {};
  }

  const BenchOptions& o_;
  const Collective c_;
  const chorusComm_t comm_;
  const chorusComm_t book_;
  std::FILE* const out_;
  int nranks_ = 0;
  int rank_ = 0;
  StreamGuard stream_;
  // --memory opencl|cuda: the device, its buffers (device addresses) and stream.
  // device_stream_ is declared after cl_: it is destroyed before the device.
  std::unique_ptr<device::ToolDevice> cl_;
  std::byte* dev_send_ = nullptr;
  std::byte* dev_recv_ = nullptr;
  StreamGuard device_stream_;
  size_t max_bytes_ = 0;
  plan::Collective plan_collective_{};
  bool known_to_plans_ = false;
  // The communicator's plans (built-in and loaded), to say why a forced one
  // cannot run a size; the files were proven when the communicator loaded them.
  const plan::Registry registry_ = [this] {
    auto r = plan::Registry::withPlans(o_.plan_paths);
    return r.isOk() ? std::move(r.value()) : plan::Registry::builtin();
  }();
  std::vector<uint64_t> sizes_;
  Buffer sendbuf_;
  Buffer recvbuf_;
  std::ofstream json_;
  std::string algo_;  // as the header names it
  uint64_t wrong_total_ = 0;
  double busbw_sum_ = 0;
  int busbw_n_ = 0;
};

}  // namespace

std::string_view averageName(int average) {
  switch (average) {
    case 0: return "rank0";
    case 1: return "avg";
    case 2: return "min";
    case 3: return "max";
    default: return "?";
  }
}

Result<uint64_t> runBench(const BenchOptions& o, chorusComm_t comm, std::FILE* out) {
  Bench bench(o, comm, out);
  CHORUS_RETURN_IF_ERROR(bench.checkJob());
  CHORUS_RETURN_IF_ERROR(bench.prepare());
  CHORUS_RETURN_IF_ERROR(bench.sweep());
  return bench.finish();
}

}  // namespace chorus::tools::bench
