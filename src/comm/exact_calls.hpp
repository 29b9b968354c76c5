// CHORUS_REPRODUCIBLE=exact's path through the call planner
// (docs/algorithms.md, "Reproducible reductions"): the ranks agree on the
// exponents their inputs span (a max-allreduce of two integers before the
// call's own plan), which fixes the exact accumulator's layout; then either
// an exact plan converts in its steps (plan/exact.cpp: an allreduce or
// reduce-scatter of at least kExactPlanMinBytes, or one forced), or the call
// converts the whole input into accumulator words, any plan sums the int64
// words, and the result is rounded once into the output.  PreMulSum scales a
// staged copy of the input before converting it; Avg divides the rounded sum
// (accumulator words cannot be divided).  The arithmetic is described here
// and run by the executor (exec/local_ops.hpp): the range scan is the
// agreement job's prologue, the scaling and the conversion into words a
// call's job's prologue, the rounding and Avg's division its epilogue.
//
// Per job of the running batch; the jobs point into its state, so the batch
// is reserved before any job is bound.  Runs on the executing thread.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "comm/op.hpp"
#include "common/exact_layout.hpp"
#include "common/reduction.hpp"
#include "common/status.hpp"
#include "exec/executor.hpp"
#include "exec/local_ops.hpp"
#include "plan/plan.hpp"
#include "tune/tuner.hpp"

namespace chorus::comm {

// CHORUS_REPRODUCIBLE=exact: an allreduce or reduce-scatter of at least this
// many bytes of its own type runs an exact plan (plan/exact.cpp), which
// converts to and from the accumulator's words in its steps; smaller calls
// convert whole buffers around the tuner's int64 plan (its one-shot and
// board plans win on latency there).  docs/algorithms.md has the figures.
inline constexpr uint64_t kExactPlanMinBytes = 64u << 10;

class ExactCalls {
 public:
  struct Job {
    bool on = false;
    bool fused = false;  // run by an exact plan (plan/exact.cpp), not over converted buffers
    ExactLayout layout;
    std::vector<int64_t> in, out;    // the converted path's accumulators
    std::vector<std::byte> staging;  // PreMulSum's scaled input
    // The local work around the plan (exec::Job::prologue, epilogue).
    std::array<exec::LocalOp, 2> pre, post;
    uint8_t npre = 0, npost = 0;
    [[nodiscard]] std::span<const exec::LocalOp> prologue() const { return {pre.data(), npre}; }
    [[nodiscard]] std::span<const exec::LocalOp> epilogue() const { return {post.data(), npost}; }
  };

  void bind(int rank, int nranks, std::chrono::milliseconds timeout, tune::Tuner* tuner, exec::Executor* executor);
  // Room for a batch of n jobs, before any is bound (jobs point into it).
  void reserve(size_t n) {
    if (jobs_.size() < n) jobs_.resize(n);
  }
  [[nodiscard]] Job& operator[](size_t i) { return jobs_[i]; }

  // Job i's state for op: off unless `on`; else the agreed layout (the
  // exponent-range agreement runs now, traced under op's number with
  // `wire_word`, the batch's message word) and whether an exact plan runs it.
  Status begin(const OpDesc& op, size_t i, bool on, uint64_t wire_word);
  // Exact PreMulSum: job i's n_in input elements scaled by *s (which
  // outlives the batch's run) into its staging buffer, in its prologue;
  // returns the staging buffer, the input to convert or the plan's.
  const std::byte* premulInput(const OpDesc& op, size_t i, uint64_t n_in, const Scalar* s);
  // Converted path: job i's input converted into its input accumulator (its
  // prologue) and its output accumulator rounded into op's output (its
  // epilogue); returns the accumulators the plan reads and writes {in, out}.
  std::array<std::byte*, 2> convert(const OpDesc& op, size_t i, const std::byte* input, uint64_t in_elems,
                                    uint64_t out_elems);
  // Exact Avg: job i's out_elems output elements divided by the rank count
  // once rounded (its epilogue); nothing for other ops.
  void average(const OpDesc& op, size_t i, uint64_t out_elems);

 private:
  Result<ExactLayout> layoutFor(const OpDesc& op, uint64_t wire_word);
  [[nodiscard]] bool fused(const OpDesc& op, const ExactLayout& l) const;

  int rank_ = 0, nranks_ = 1;
  std::chrono::milliseconds timeout_{0};
  tune::Tuner* tuner_ = nullptr;
  exec::Executor* executor_ = nullptr;
  std::vector<const plan::Algorithm*> algos_;  // the registry's exact plans, found at bind
  std::vector<Job> jobs_;
  plan::Program range_prog_;  // the exponent-range agreement (2 int64, max); no step on one rank
  std::vector<std::byte> range_scratch_;
};

}  // namespace chorus::comm
