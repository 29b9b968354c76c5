// chorus-bench: an nccl-tests-style collective benchmark.
//
// The pure parts (collective names, size sweeps, per-collective buffer shapes,
// bus-bandwidth factors, the input pattern and its expected outputs, the table
// and JSON rows) live here and are unit-tested without a communicator;
// runBench() (bench_run.cpp) drives them over the C API as one rank of a job.
//
// Conventions follow nccl-tests (doc/PERFORMANCE.md): sizes are bytes per
// rank's largest buffer; algbw = S / t with S the collective's data size;
// busbw = algbw * factor, the factor making an ideal implementation's busbw
// equal to the link bandwidth whatever the number of ranks.
#pragma once

#include <chorus/chorus.h>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.hpp"
#include "plan/plan.hpp"

namespace chorus::tools::bench {

// What chorus-bench runs, named as nccl-tests names its tests: plan's
// collectives but the v-variants (their facts, names, buffer shapes and busbw
// factors, are plan::kCollectiveFacts), and sendrecv, nccl-tests' point-to-
// point test: a group of a send to the next rank and a receive from the
// previous one (chorusSend/chorusRecv, not a collective of plan's; its facts
// are the bench's own).
enum class Collective : uint8_t {
  AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AllToAll, Gather, Scatter, SendRecv, Barrier,
};
// plan's collective, or nullopt for sendrecv.
std::optional<plan::Collective> planCollective(Collective c);
const plan::CollectiveFacts& facts(Collective c);
std::string_view collectiveName(Collective c);
double busBwFactor(Collective c, int64_t nranks);

std::span<const Collective> allCollectives();
Result<Collective> parseCollective(std::string_view name);
[[nodiscard]] bool takesOp(Collective c);       // allreduce, reduce, reducescatter
[[nodiscard]] bool takesRoot(Collective c);     // broadcast, reduce, gather, scatter
[[nodiscard]] bool hasInPlace(Collective c);    // all but sendrecv and barrier

std::string_view opName(chorusRedOp_t op);  // "sum", "prod", "max", "min", "avg"
Result<chorusRedOp_t> parseOp(std::string_view name);

struct SweepOptions {
  uint64_t min_bytes = 32ull << 20;
  uint64_t max_bytes = 32ull << 20;
  double step_factor = 1;      // > 1: multiply; otherwise add step_bytes
  uint64_t step_bytes = 1ull << 20;
};
// min, then min*f or min+step, ... while <= max (nccl-tests' loop).
Result<std::vector<uint64_t>> sizeSweep(const SweepOptions& o);

// The buffers of one call for a requested size, as nccl-tests' getCollByteCount
// computes them: per-rank blocks are rounded down to 16-byte multiples.
struct Shape {
  uint64_t bytes = 0;     // printed size: max(send, recv) bytes
  size_t count = 0;       // the count argument of the call (per-rank block for gather types)
  size_t send_count = 0;  // elements in the send buffer
  size_t recv_count = 0;  // elements in the receive buffer
};
Shape shapeFor(Collective c, uint64_t bytes, size_t elem_size, int nranks);

// S of algbw = S / t: count * elem for allreduce, broadcast, reduce, sendrecv;
// count * elem * n for allgather, reducescatter, alltoall, gather, scatter.
uint64_t algBytes(Collective c, const Shape& s, size_t elem_size, int nranks);

struct Bandwidth {
  double algbw_gbps = 0;  // 1e9 bytes per second
  double busbw_gbps = 0;
};
Bandwidth bandwidth(Collective c, const Shape& s, size_t elem_size, int nranks, double seconds);

// The input pattern of a check (-c 1) and the values it must produce.
//
// Element `index` of rank r's input is a small integer code chosen from a hash
// of (r, index), so a misplaced block shows up; codes are small enough that
// sums stay exact in wide types, and every expectation is computed from the
// value as stored in the data type (so fp16/bf16/fp8 rounding of the inputs
// is accounted for).  Integer types reduce in wrapping arithmetic exactly as
// the library's kernels do; float sums are compared with a tolerance that
// grows with the number of ranks in the type's precision (the reduction order
// is the algorithm's choice).
class Pattern {
 public:
  // op: the reduction, or nullopt for collectives that only move data.
  Pattern(chorusDataType_t dtype, std::optional<chorusRedOp_t> op, int nranks);

  // The value (as stored in the data type) of logical input element `index` of `rank`.
  [[nodiscard]] double input(int rank, uint64_t index) const;
  // All ranks' input(r, index) combined by the op.
  [[nodiscard]] double reduced(uint64_t index) const;
  // buf[i] = input(rank, i) for i < count.
  void fill(void* buf, int rank, size_t count) const;
  // Whether a received value is right, within the tolerance of the type and op.
  [[nodiscard]] bool matches(double got, double expected) const;

  [[nodiscard]] chorusDataType_t dtype() const { return dtype_; }
  [[nodiscard]] int nranks() const { return nranks_; }

 private:
  [[nodiscard]] uint32_t code(int rank, uint64_t index) const;

  chorusDataType_t dtype_;
  std::optional<chorusRedOp_t> op_;
  int nranks_;
  uint32_t range_;            // codes are in [0, range_) (prod: {1, 2})
  std::vector<double> value_; // code -> value as stored in dtype_
};

// Expected value of element k of `rank`'s output buffer (recv_count elements,
// or count for reducescatter/scatter), nullopt where the collective leaves it
// undefined (non-root ranks of reduce and gather; barrier).
std::optional<double> expectedOutput(Collective c, const Pattern& p, const Shape& s, int root, int rank, size_t k);
// Number of wrong elements in `rank`'s output buffer.
size_t countWrong(Collective c, const Pattern& p, const Shape& s, int root, int rank, const void* out);
// Elements of the output buffer that countWrong reads.
size_t outputCount(Collective c, const Shape& s);

// The algorithm CHORUS_ALGO forces for a collective ("allreduce:ring;allgather:rd"),
// or "auto".
std::string algoFor(std::string_view chorus_algo, Collective c);

// chorus_algo with the entry for c replaced by "c:algo" (--algo), others kept.
std::string withAlgo(std::string_view chorus_algo, Collective c, std::string_view algo);

// One placement's measurement.
struct Measurement {
  double time_us = 0;
  Bandwidth bw;
  std::optional<uint64_t> wrong;  // nullopt: not checked
  std::string algo;                   // the algorithm that ran ("" = not known)
  std::optional<double> predicted_us;  // the tuner's cost model, when it prices the call
};

struct Row {
  Collective collective = Collective::AllReduce;
  Shape shape;
  chorusDataType_t dtype = chorusFloat32;
  std::optional<chorusRedOp_t> op;
  std::optional<int> root;
  Measurement out_of_place;
  std::optional<Measurement> in_place;  // nullopt: the collective has no in-place form
};

// nccl-tests' "%7.0f"/"%7.1f"/"%7.2f" by magnitude.
std::string formatTime(double us);
std::string formatHeader();  // the three "#" lines above the table
std::string formatRow(const Row& r);
// "# Out of bounds values : N OK|FAILED" and "# Avg bus bandwidth    : X".
std::string formatFooter(uint64_t wrong_total, double avg_busbw_gbps);

// One JSON Lines object per placement of a row.
nlohmann::json rowJson(const Row& r, bool in_place, int nranks, std::string_view algo);

// What runBench needs besides the communicator.
struct BenchOptions {
  Collective collective = Collective::AllReduce;
  SweepOptions sweep;
  int iters = 20;
  int warmup = 5;
  double warmup_ms = 0;    // > 0: warm up until the slowest rank has spent this long
  double min_time_ms = 0;  // > 0: time at least this long in one window (more calls than iters)
  std::vector<chorusDataType_t> dtypes = {chorusFloat32};
  std::vector<chorusRedOp_t> ops = {chorusSum};
  int root = 0;
  bool check = true;
  std::string json_path;  // "" = no JSON output (written by rank 0)
  // --algo all: the sweep runs once per algorithm named here (forced with
  // chorusCommSetAlgo; sizes an algorithm does not handle are skipped).
  // Empty: the algorithms CHORUS_ALGO or the tuner choose.
  std::vector<std::string> algos;
  // The communicator's algorithm overrides (its Config::tune.algo_spec,
  // CHORUS_ALGO's syntax): named in the header, and kept for the other
  // collectives when --algo all forces one.
  std::string algo_spec;
  bool in_place = true;            // also measure the in-place placement
  std::vector<Row>* rows = nullptr;  // when set, every measured row is appended here (every rank)
  // --algo NAME (one algorithm, already forced in algo_spec): a size
  // it cannot run is reported with the reason and not measured (the tuner
  // would run another plan), and counted in *unsupported.
  std::string forced_algo;
  // Plan files and directories the communicator loaded (Config::tune.plan_paths,
  // CHORUS_PLAN_PATH and --plan): their plans name sizes they cannot run too.
  std::vector<std::string> plan_paths;
  int* unsupported = nullptr;
  // The communicator of the benchmark's own bookkeeping (the barrier before
  // each timed window, the reductions of timings and of the check's counts),
  // so that a trace of `comm` (CHORUS_TRACE, chorus-trace report) holds only
  // the measured calls.  nullptr: comm itself.  Same ranks as comm.
  chorusComm_t bookkeeping = nullptr;
  // nccl-tests -a: the time reported for a size, from each rank's mean:
  // 0 rank 0's, 1 the mean over ranks, 2 the fastest rank's, 3 the slowest's.
  int average = 3;
  // nccl-tests -z: 1 each timed call returns when complete (a blocking call);
  // 0 the timed calls are queued on a chorus stream and waited for once.
  bool blocking = true;
  // --memory: "host", or "opencl" (the buffers are registered cl_mem buffers of
  // this process's first OpenCL device and every call goes to an OpenCL stream;
  // the check copies its input up and the output down, outside the timing).
  std::string memory = "host";
};

// The names of nccl-tests' -a values: "rank0", "avg", "min", "max".
std::string_view averageName(int average);

// Runs the sweep as one rank of comm.  Rank 0 prints the table to `out`.
// Returns the total number of wrong elements (all ranks), or the first error.
Result<uint64_t> runBench(const BenchOptions& o, chorusComm_t comm, std::FILE* out);

}  // namespace chorus::tools::bench
