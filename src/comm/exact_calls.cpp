#include "comm/exact_calls.hpp"

#include "common/dtype.hpp"

namespace chorus::comm {

using plan::Collective;

void ExactCalls::bind(int rank, int nranks, std::chrono::milliseconds timeout, tune::Tuner* tuner,
                      exec::Executor* executor) {
  rank_ = rank;
  nranks_ = nranks;
  timeout_ = timeout;
  tuner_ = tuner;
  executor_ = executor;
  algos_.clear();
  for (const auto& a : tuner->registry().all())
    if (a->exact()) algos_.push_back(a.get());
}

Status ExactCalls::begin(const OpDesc& op, size_t i, bool on, uint64_t wire_word) {
  Job& ex = jobs_[i];
  ex.on = on;
  ex.fused = false;
  ex.npre = ex.npost = 0;
  if (!on) return {};
  CHORUS_ASSIGN_OR_RETURN(ex.layout, layoutFor(op, wire_word));
  ex.fused = fused(op, ex.layout);
  return {};
}

// The accumulator layout of an exact call: the ranks first agree on the
// exponents their inputs span (a max-allreduce of two integers, run here
// before the call's own plan, in the same order on every rank; its job's
// prologue scans this rank's input), so the accumulator carries only those
// bits.  PreMulSum's inputs are scaled later (premulInput): it takes the
// type's full layout.
Result<ExactLayout> ExactCalls::layoutFor(const OpDesc& op, uint64_t wire_word) {
  if (op.op >= chorusNumOps) return exactLayout(op.dtype, nranks_);  // validated with the op
  const uint64_t in_elems = op.coll == Collective::ReduceScatter ? op.count * static_cast<uint64_t>(nranks_) : op.count;
  if (nranks_ > 1 && range_prog_.steps.empty()) {
    plan::Shape sh;
    sh.coll = Collective::AllReduce;
    sh.nranks = nranks_;
    sh.count = 2;
    sh.elem_size = 8;
    sh.inplace = true;
    sh.hosts = tuner_->topology().host_of;
    CHORUS_ASSIGN_OR_RETURN(tune::Choice ch, tuner_->choose(sh, chorusInt64));
    plan::expand(*ch.algo, sh, rank_, &range_prog_);
  }
  std::array<int64_t, 2> range{};  // {hi, -lo}: both agreed by max
  const exec::LocalOp scan = exec::LocalOp::exactRange(range.data(), op.send, in_elems, op.dtype);
  range_scratch_.resize(range_prog_.scratch_elems * 8);
  auto* buf = reinterpret_cast<std::byte*>(range.data());
  std::array<std::byte*, 3> bufs = {buf, buf, range_scratch_.data()};
  // Traced as a step of the call's own number, like a signature check's.
  const exec::Job job{.program = &range_prog_, .buffers = bufs, .elem_size = 8, .reduce_dtype = chorusInt64,
                      .reduce_op = BinOp::Max, .trace_seq = (uint64_t{1} << 62) | op.trace_seq, .sig = wire_word,
                      .prologue = std::span(&scan, 1)};
  CHORUS_RETURN_IF_ERROR(executor_->run(std::span<const exec::Job>(&job, 1), timeout_));
  return exactLayout(op.dtype, nranks_, -range[1], range[0]);
}

// An exact plan runs an allreduce or reduce-scatter of at least
// kExactPlanMinBytes (below, the general path's small plans, one-shot and
// the board, win on latency), or of any size when CHORUS_ALGO forces it
// (exact_ring); an other forced algorithm runs on the accumulator's words.
bool ExactCalls::fused(const OpDesc& op, const ExactLayout& l) const {
  if (op.coll != Collective::AllReduce && op.coll != Collective::ReduceScatter) return false;
  const plan::Algorithm* forced = tuner_->forced(op.coll);
  if (forced != nullptr && !forced->exact()) return false;
  if (forced == nullptr && op.count * dtypeSize(op.dtype) < kExactPlanMinBytes) return false;
  plan::Shape probe;
  probe.coll = op.coll;
  probe.nranks = nranks_;
  probe.count = op.count;
  probe.elem_size = static_cast<uint32_t>(dtypeSize(op.dtype));
  probe.exact_words = static_cast<uint32_t>(l.words);
  for (const plan::Algorithm* a : algos_)
    if (a->collective() == op.coll && a->supports(probe)) return true;
  return false;
}

const std::byte* ExactCalls::premulInput(const OpDesc& op, size_t i, uint64_t n_in, const Scalar* s) {
  Job& ex = jobs_[i];
  ex.staging.resize(n_in * dtypeSize(op.dtype));
  ex.pre[ex.npre++] = exec::LocalOp::scale(ex.staging.data(), op.send, n_in, op.dtype, s);
  return ex.staging.data();
}

std::array<std::byte*, 2> ExactCalls::convert(const OpDesc& op, size_t i, const std::byte* input, uint64_t in_elems,
                                              uint64_t out_elems) {
  Job& ex = jobs_[i];
  const size_t w = static_cast<size_t>(ex.layout.words);
  ex.in.resize(in_elems * w);
  ex.out.resize(out_elems * w);
  ex.pre[ex.npre++] = exec::LocalOp::toExact(ex.in.data(), input, in_elems, &ex.layout);
  ex.post[ex.npost++] = exec::LocalOp::fromExact(op.recv, ex.out.data(), out_elems, &ex.layout);
  return {reinterpret_cast<std::byte*>(ex.in.data()), reinterpret_cast<std::byte*>(ex.out.data())};
}

// Avg's sum divided once rounded (a plan over accumulator words, or an exact
// plan that rounds in its last steps, sums words, which cannot be divided).
void ExactCalls::average(const OpDesc& op, size_t i, uint64_t out_elems) {
  Job& ex = jobs_[i];
  if (ex.on && op.op == chorusAvg)
    ex.post[ex.npost++] = exec::LocalOp::divide(op.recv, out_elems, op.dtype, static_cast<uint64_t>(nranks_));
}

}  // namespace chorus::comm
