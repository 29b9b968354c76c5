// runBench: the measuring loop of chorus-bench, over the C API.
#include <cmath>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "common/env.hpp"
#include "kernels/dtype.hpp"
#include "plan/plan.hpp"
#include "tools/bench.hpp"

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
    case Collective::AllGatherV:  // not benched (allCollectives())
    case Collective::AllToAllV: break;
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
  int nranks = 0, rank = 0;
  if (chorusResult_t r = chorusCommCount(comm, &nranks); r != chorusSuccess)
    return apiError(comm, -1, "chorusCommCount", r);
  if (chorusResult_t r = chorusCommUserRank(comm, &rank); r != chorusSuccess)
    return apiError(comm, -1, "chorusCommUserRank", r);
  const Collective c = o.collective;
  if (takesRoot(c) && (o.root < 0 || o.root >= nranks))
    return invalidArgument("chorus-bench: root {} (-r) is not a rank of this {}-rank job", o.root, nranks);
  if (o.iters < 1 || o.warmup < 0)
    return invalidArgument("chorus-bench: -n {} / -w {}: need at least 1 iteration and no negative warmup", o.iters,
                           o.warmup);
  if (o.average < 0 || o.average > 3)
    return invalidArgument("chorus-bench: -a {} is not 0 (rank 0's time), 1 (mean), 2 (min) or 3 (max)", o.average);
  // The benchmark's own collectives go to a communicator of their own when
  // given one, so traces of comm hold only the measured calls.
  chorusComm_t book = o.bookkeeping != nullptr ? o.bookkeeping : comm;
  StreamGuard stream;
  if (!o.blocking)
    if (chorusResult_t r = chorusStreamCreate(&stream.stream); r != chorusSuccess)
      return apiError(comm, rank, "chorusStreamCreate (for -z 0)", r);
  plan::Collective plan_collective{};
  const bool known_to_plans = plan::parseCollective(collectiveName(c), &plan_collective);
  const plan::Registry registry = plan::Registry::builtin();
  CHORUS_ASSIGN_OR_RETURN(std::vector<uint64_t> sizes, sizeSweep(o.sweep));
  if (c == Collective::Barrier) sizes.resize(1);  // moves no data: one row says it all

  // Buffers are allocated once, at the largest size any (dtype, size) needs.
  size_t max_bytes = 0;
  for (chorusDataType_t d : o.dtypes)
    for (uint64_t size : sizes) {
      Shape s = shapeFor(c, size, kernels::dtypeSize(d), nranks);
      max_bytes = std::max(max_bytes, std::max(s.send_count, s.recv_count) * kernels::dtypeSize(d));
    }
  CHORUS_ASSIGN_OR_RETURN(Buffer sendbuf, allocate(max_bytes));
  CHORUS_ASSIGN_OR_RETURN(Buffer recvbuf, allocate(max_bytes));

  std::ofstream json;
  if (rank == 0 && !o.json_path.empty()) {
    json.open(o.json_path, std::ios::out | std::ios::trunc);
    if (!json) return systemError("chorus-bench: cannot open --json file '{}' for writing", o.json_path);
  }
  const std::string& chorus_algo = o.algo_spec;
  const std::string algo = o.algos.empty() ? algoFor(chorus_algo, c) : "all";
  auto print = [&](const std::string& s) {
    if (rank != 0) return;
    std::fputs(s.c_str(), out);
    std::fflush(out);
  };
  print(fmt::format("# chorus-bench {}  nranks {}  minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} "
                    "validation: {} algo: {} average: {}({}) blocking: {}\n",
                    collectiveName(c), nranks, o.sweep.min_bytes, o.sweep.max_bytes,
                    o.sweep.step_factor > 1 ? fmt::format("{}(factor)", o.sweep.step_factor)
                                            : fmt::format("{}(bytes)", o.sweep.step_bytes),
                    o.warmup, o.iters, o.check ? 1 : 0, algo, o.average, averageName(o.average),
                    o.blocking ? 1 : 0));
  print(formatHeader());

  uint64_t wrong_total = 0;
  double busbw_sum = 0;
  int busbw_n = 0;
  std::vector<std::optional<chorusRedOp_t>> ops;
  if (takesOp(c)) {
    for (chorusRedOp_t op : o.ops) ops.emplace_back(op);
  } else {
    ops.emplace_back(std::nullopt);
  }

  // Every forced algorithm (--algo all) at each size in turn, so that the
  // algorithms compared at a size are measured within moments of each other
  // (this VM's speed changes over minutes); or the configured one.
  std::vector<std::string> sweep_algos = o.algos;
  if (sweep_algos.empty()) sweep_algos.emplace_back();
  for (chorusDataType_t d : o.dtypes) {
    const size_t elem = kernels::dtypeSize(d);
    for (const std::optional<chorusRedOp_t>& op : ops) {
      const Pattern pattern(d, op, nranks);
      for (uint64_t size : sizes)
      for (const std::string& forced : sweep_algos) {
        if (!forced.empty()) {
          const std::string spec = withAlgo(chorus_algo, c, forced);
          if (chorusResult_t r = chorusCommSetAlgo(comm, spec.c_str()); r != chorusSuccess)
            return apiError(comm, rank, "forcing " + spec, r);
        }
        Row row;
        row.collective = c;
        row.shape = shapeFor(c, size, elem, nranks);
        row.dtype = d;
        row.op = op;
        if (takesRoot(c)) row.root = o.root;
        const std::string what = fmt::format("{} of {} {} elements", collectiveName(c), row.shape.count,
                                             kernels::dtypeName(d));
        bool skipped = false;
        std::string skip_why;
        for (bool in_place : {false, true}) {
          if (in_place && (!hasInPlace(c) || !o.in_place)) break;
          const std::string where = fmt::format("{} ({})", what, in_place ? "in-place" : "out-of-place");
          // What the tuner chose and what its cost model predicted.
          char chosen[64] = {};
          double predicted = 0;
          const bool priced = c != Collective::SendRecv &&
                              chorusCommPredict(comm, std::string(collectiveName(c)).c_str(), row.shape.count, d,
                                                in_place ? 1 : 0, chosen, sizeof chosen, &predicted) == chorusSuccess;
          // A forced algorithm that does not handle the shape falls back to
          // the tuner's choice: not a row of this algorithm (every rank
          // prices alike, so all skip together).
          const std::string& want = forced.empty() ? o.forced_algo : forced;
          if (!want.empty() && priced && want != chosen) {
            skipped = true;
            const plan::Algorithm* a = known_to_plans ? registry.find(plan_collective, want) : nullptr;
            const std::string_view needs = a != nullptr ? a->requirement() : std::string_view();
            skip_why = fmt::format("{} ({}): {}; the tuner would run '{}' instead", what,
                                   in_place ? "in-place" : "out-of-place",
                                   needs.empty() ? std::string("it does not handle this shape")
                                                 : fmt::format("it needs {}", needs),
                                   chosen);
            break;
          }
          Placement p = place(c, in_place, sendbuf.get(), recvbuf.get(), row.shape, elem, rank);
          auto run = [&]() -> Status {
            chorusResult_t r =
                issue(c, p.send, p.recv, row.shape, d, op.value_or(chorusSum), o.root, rank, nranks, comm, nullptr);
            return r == chorusSuccess ? Status::ok() : apiError(comm, rank, where, r);
          };
          // k timed calls: blocking, or (-z 0) queued on the stream and waited for once.
          auto runTimed = [&](int k) -> Status {
            if (o.blocking) {
              for (int i = 0; i < k; ++i) CHORUS_RETURN_IF_ERROR(run());
              return {};
            }
            for (int i = 0; i < k; ++i)
              if (chorusResult_t r = issue(c, p.send, p.recv, row.shape, d, op.value_or(chorusSum), o.root, rank,
                                           nranks, comm, stream.stream);
                  r != chorusSuccess)
                return apiError(comm, rank, where, r);
            chorusResult_t r = chorusStreamSynchronize(stream.stream);
            return r == chorusSuccess ? Status::ok() : apiError(comm, rank, where + " (stream)", r);
          };
          Measurement m;
          if (o.check) {
            pattern.fill(p.input, rank, row.shape.send_count);
            CHORUS_RETURN_IF_ERROR(run());
            // Summed as float64 (exact below 2^53): CHORUS_REPRODUCIBLE=exact
            // refuses integer sums, and the bench must run in every mode.
            const uint64_t wrong_here = countWrong(c, pattern, row.shape, o.root, rank, p.output);
            double wrong_sum = static_cast<double>(wrong_here);
            if (chorusResult_t r = chorusAllReduce(&wrong_sum, &wrong_sum, 1, chorusFloat64, chorusSum, book, nullptr);
                r != chorusSuccess)
              return apiError(comm, rank, "summing the wrong-element counts", r);
            const auto wrong = static_cast<uint64_t>(wrong_sum);
            m.wrong = wrong;
            wrong_total += wrong;
          }
          for (int i = 0; i < o.warmup; ++i) CHORUS_RETURN_IF_ERROR(run());
          // The ranks' mean time over k calls combined as -a says (every
          // rank gets the same value): 0 rank 0's, 1 the mean, 2 min, 3 max.
          auto combined = [&](auto t0, int k, int average, double* out) -> Status {
            const double mine = std::chrono::duration<double>(Clock::now() - t0).count() / std::max(k, 1);
            *out = average == 0 && rank != 0 ? 0.0 : mine;
            const chorusRedOp_t how = average == 2 ? chorusMin : average == 3 ? chorusMax : chorusSum;
            if (chorusResult_t r = chorusAllReduce(out, out, 1, chorusFloat64, how, book, nullptr); r != chorusSuccess)
              return apiError(comm, rank, "reducing the timings", r);
            if (average == 1) *out /= nranks;
            return {};
          };
          auto slowest = [&](auto t0, int k, double* out) { return combined(t0, k, 3, out); };
          // --warmup-ms: keep warming up, in batches, until the slowest rank
          // has spent that long (a CPU that idled in the set-up runs slowly
          // for milliseconds: 1 KiB allreduce 2 us after 5 calls, 0.8 after 5000).
          if (o.warmup_ms > 0) {
            const auto w0 = Clock::now();
            for (double spent = 0; spent * 1e3 < o.warmup_ms;) {
              const int batch = std::max(1, o.warmup);
              for (int i = 0; i < batch; ++i) CHORUS_RETURN_IF_ERROR(run());
              CHORUS_RETURN_IF_ERROR(slowest(w0, 1, &spent));
            }
          }
          if (chorusResult_t r = chorusBarrier(book, nullptr); r != chorusSuccess)
            return apiError(comm, rank, "the barrier before " + where, r);
          int iters = o.iters;
          double seconds = 0;
          {
            auto t0 = Clock::now();
            CHORUS_RETURN_IF_ERROR(runTimed(iters));
            // By default (-a 3) the slowest rank's mean sets the collective's
            // time (MPI-style max).
            CHORUS_RETURN_IF_ERROR(combined(t0, iters, o.average, &seconds));
          }
          // --min-ms: too short a window for the timer and the scheduler's
          // hiccups; time one uninterrupted window of enough calls instead.
          if (o.min_time_ms > 0 && seconds * iters * 1e3 < o.min_time_ms) {
            iters = static_cast<int>(std::min(1e6, std::ceil(o.min_time_ms * 1e-3 / std::max(seconds, 1e-9))));
            if (chorusResult_t r = chorusBarrier(book, nullptr); r != chorusSuccess)
              return apiError(comm, rank, "the barrier before " + where, r);
            auto t0 = Clock::now();
            CHORUS_RETURN_IF_ERROR(runTimed(iters));
            CHORUS_RETURN_IF_ERROR(combined(t0, iters, o.average, &seconds));
          }
          m.time_us = seconds * 1e6;
          if (priced) {
            m.algo = chosen;
            m.predicted_us = predicted;
          }
          m.bw = bandwidth(c, row.shape, elem, nranks, seconds);
          busbw_sum += m.bw.busbw_gbps;
          ++busbw_n;
          if (in_place) {
            row.in_place = m;
          } else {
            row.out_of_place = m;
          }
        }
        if (skipped) {
          const std::string& want = forced.empty() ? o.forced_algo : forced;
          print(fmt::format("# {}: algorithm '{}' does not handle {} bytes on {} ranks, not measured: {}\n",
                            collectiveName(c), want, size, nranks, skip_why));
          if (forced.empty() && o.unsupported != nullptr) ++*o.unsupported;
          continue;
        }
        print(formatRow(row));
        if (o.rows != nullptr) o.rows->push_back(row);
        if (json.is_open()) {
          json << rowJson(row, false, nranks, algo).dump() << '\n';
          if (row.in_place) json << rowJson(row, true, nranks, algo).dump() << '\n';
          json.flush();
        }
      }
    }
  }
  if (!o.algos.empty())
    if (chorusResult_t r = chorusCommSetAlgo(comm, chorus_algo.c_str()); r != chorusSuccess)
      return apiError(comm, rank, "restoring CHORUS_ALGO", r);
  print(formatFooter(wrong_total, busbw_n ? busbw_sum / busbw_n : 0));
  if (json.is_open() && !json) return systemError("chorus-bench: writing --json file '{}' failed", o.json_path);
  return wrong_total;
}

}  // namespace chorus::tools::bench
