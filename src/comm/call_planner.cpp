#include "comm/call_planner.hpp"

#include <algorithm>
#include <cstring>
#include <functional>

#include "common/dtype.hpp"
#include "plan/canonical.hpp"

namespace chorus::comm {

using plan::Collective;

namespace {

// A compressed call's wire format as one word of the program cache's key.
uint32_t wireKey(const std::optional<WireFormat>& w) {
  return w ? 1u + w->kind + (static_cast<uint32_t>(w->block) << 2) : 0u;
}

}  // namespace

size_t CallPlanner::CacheHash::operator()(const CacheKey& k) const {
  size_t h = std::hash<uint64_t>{}(k.count);
  auto mix = [&](uint64_t v) { h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  mix(k.coll | (uint64_t{k.inplace} << 8) | (uint64_t{static_cast<uint8_t>(k.kind)} << 9) |
      (uint64_t{k.elem_size} << 16));
  mix(static_cast<uint64_t>(k.root));
  mix(static_cast<uint64_t>(k.peer));
  mix(k.chunk);
  mix(reinterpret_cast<uintptr_t>(k.algo));
  mix(k.wire | (uint64_t{k.scaling} << 32) | (uint64_t{k.exact_words} << 40));
  return h;
}

void CallPlanner::bind(int rank, int nranks, const Config& cfg, tune::Tuner* tuner, exec::Executor* executor,
                       exec::BoardRunner* runner, trace::Recorder* trace) {
  rank_ = rank;
  nranks_ = nranks;
  repro_ = cfg.reproducible;
  timeout_ = cfg.timeout;
  tuner_ = tuner;
  red_ops_.bind(nranks, cfg.reproducible);
  exact_.bind(rank, nranks, cfg.timeout, tuner, executor);
  executor_ = executor;
  board_runner_ = runner;
  trace_ = trace;
}

CallPlanner::ReproPath CallPlanner::reproPath(const OpDesc& op) const {
  if (repro_ == Reproducible::Off || !op.reduces() || !isFloatType(op.dtype))
    return ReproPath::Plain;  // integer reductions do not depend on the order
  const bool sums = op.op == chorusSum || op.op == chorusAvg || op.op >= chorusNumOps;
  return repro_ == Reproducible::Exact && sums ? ReproPath::Exact : ReproPath::Canonical;
}

// The plan shape of an operation: its collective, counts (exact: in
// accumulator words), canonical mode, the host layout, and whether the call
// is in place (NCCL's aliasing conventions per collective).
plan::Shape CallPlanner::shapeOf(const OpDesc& op, bool canonical, uint64_t words, size_t es) const {
  plan::Shape sh;
  sh.coll = op.coll;
  sh.nranks = nranks_;
  sh.count = op.count * words;
  sh.elem_size = static_cast<uint32_t>(es);
  sh.canonical = canonical;
  sh.root = op.root;
  sh.counts = op.counts;
  sh.displs = op.displs;
  sh.counts2 = op.counts2;
  sh.displs2 = op.displs2;
  sh.hosts = tuner_->topology().host_of;
  sh.wire = op.wire;
  sh.scaling = scalingOf(op, reproPath(op) == ReproPath::Exact);
  // In place by the collective's layout (plan::InPlace, NCCL's conventions).
  auto* sp = static_cast<const std::byte*>(op.send);
  auto* rp = static_cast<std::byte*>(op.recv);
  const plan::CollectiveFacts& f = plan::facts(op.coll);
  if (op.pointToPoint() || (f.inplace_at_root && rank_ != op.root)) return sh;
  const auto slot = [&] { return plan::inplaceSlot(op.coll, rank_, op.count, op.displs) * es; };
  switch (f.inplace_rule) {
    case plan::InPlace::None: break;
    case plan::InPlace::Same: sh.inplace = sp != nullptr && sp == rp; break;
    case plan::InPlace::InputInOutput: sh.inplace = sp != nullptr && sp == rp + slot(); break;
    case plan::InPlace::OutputInInput: sh.inplace = rp != nullptr && rp == sp + slot(); break;
  }
  return sh;
}

// The plan and this rank's program for job i: the last call's again when this
// one equals it (no tuner or cache lookup), else the tuner's choice (under
// canonical, a plan that combines in the canonical tree), its program from the
// cache or expanded into it; v-collectives are expanded per call.
Result<const plan::Program*> CallPlanner::programFor(const OpDesc& op, size_t i, plan::Shape& sh, ReproPath path,
                                                      chorusDataType_t plan_dtype, const plan::Algorithm** algo_out) {
  const size_t es = sh.elem_size;
  const plan::Algorithm* algo = nullptr;
  uint64_t chunk = 0;
  const bool v = plan::variable(op.coll);
  const plan::Program* prog = nullptr;
  const bool memo = !v && i == 0;
  if (memo && last_.valid && last_.dtype == op.dtype && last_.path == static_cast<uint8_t>(path) &&
      last_.key.coll == static_cast<uint8_t>(op.coll) && last_.key.inplace == sh.inplace &&
      last_.key.kind == op.kind && last_.key.elem_size == es && last_.key.root == op.root &&
      last_.key.peer == op.peer && last_.key.count == sh.count && last_.key.wire == wireKey(sh.wire) &&
      last_.key.scaling == static_cast<uint8_t>(sh.scaling) && last_.key.exact_words == sh.exact_words) {
    algo = last_.key.algo;
    chunk = last_.key.chunk;
    sh.chunk_elems = chunk;
    prog = last_.prog;
  } else if (!op.pointToPoint()) {
    CHORUS_ASSIGN_OR_RETURN(tune::Choice ch, tuner_->choose(sh, plan_dtype));
    // Canonical: the tuner's plan when it combines in the canonical tree,
    // else the canonical plan of the collective (docs/algorithms.md).
    algo = sh.canonical ? plan::canonicalPlanFor(ch.algo, sh) : ch.algo;
    chunk = es ? std::max<uint64_t>(1, ch.chunk_bytes / es) : 0;
    sh.chunk_elems = chunk;
  }
  *algo_out = algo;
  if (prog != nullptr) return prog;  // memoised above
  auto build = [&](plan::Program* out) {
    if (op.pointToPoint()) {
      plan::ProgramBuilder b;
      b.reset(rank_);
      if (op.kind == OpKind::Send)
        b.send(op.peer, plan::in(0, op.count));
      else
        b.recv(op.peer, plan::out(0, op.count));
      b.finish(out);
    } else {
      plan::expand(*algo, sh, rank_, out);
    }
  };
  if (v) {
    if (uncached_.size() <= i) uncached_.resize(i + 1);
    if (!uncached_[i]) uncached_[i] = std::make_unique<plan::Program>();
    build(uncached_[i].get());
    return uncached_[i].get();
  }
  CacheKey key{static_cast<uint8_t>(op.coll), sh.inplace, op.kind, static_cast<uint32_t>(es), op.root, op.peer,
               sh.count, chunk, algo, sh.canonical, wireKey(sh.wire), static_cast<uint8_t>(sh.scaling),
               sh.exact_words};
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    auto p = std::make_unique<plan::Program>();
    build(p.get());
    it = cache_.emplace(key, std::move(p)).first;
  }
  prog = it->second.get();
  if (memo) last_ = {key, op.dtype, true, prog, static_cast<uint8_t>(path)};
  return prog;
}

// CHORUS_TRACE: job i's algorithm name and the tuner's prediction for it
// (memoised per program).
void CallPlanner::traceJob(const OpDesc& op, size_t i, const plan::Algorithm* algo, const plan::Program* prog,
                            const plan::Shape& sh) {
  if (trace_algo_.size() <= i) {
    trace_algo_.resize(i + 1);
    trace_pred_.resize(i + 1);
  }
  trace_algo_[i] = trace_->algoId(algo ? algo->name() : plan::pointToPointName(op.direction()));
  trace_pred_[i] = -1;
  const bool v = plan::variable(op.coll);
  if (algo != nullptr && !v) {
    auto [it, fresh] = trace_pred_cache_.try_emplace(prog, -1);
    if (fresh) {
      auto t = tuner_->price(*algo, sh, op.dtype);
      if (t.isOk()) it->second = static_cast<int64_t>(t.value() * 1e9);
    }
    trace_pred_[i] = it->second;
  }
}

// Job i of the batch: its shape, plan and program, its buffers (PreMulSum's
// scaled input, exact's accumulators), reduction and executor job, with the
// local work around the plan that exact calls describe (its prologue and
// epilogue: scaling, conversions, rounding, Avg's division).
Status CallPlanner::prepare(OpDesc& op, size_t i) {
  const ReproPath path = reproPath(op);
  CHORUS_RETURN_IF_ERROR(exact_.begin(op, i, path == ReproPath::Exact, batch_wire_));
  ExactCalls::Job& ex = exact_[i];  // reserved by bindBatch
  // Exact over converted buffers: the plan moves and sums the accumulators'
  // int64 words.  An exact plan moves the call's own type and converts in
  // its steps (Shape::exact_words).
  const bool words_plan = ex.on && !ex.fused;
  const uint64_t words = words_plan ? static_cast<uint64_t>(ex.layout.words) : 1;
  const chorusDataType_t plan_dtype = words_plan ? chorusInt64 : op.dtype;
  const size_t es = dtypeSize(plan_dtype);
  plan::Shape sh = shapeOf(op, path == ReproPath::Canonical, words, es);
  if (ex.fused) sh.exact_words = static_cast<uint32_t>(ex.layout.words);
  auto* sp = static_cast<const std::byte*>(op.send);
  auto* rp = static_cast<std::byte*>(op.recv);
  // PreMulSum's scalar: the plan's Scale step reads it from the job; exact
  // scales a staged copy of the input before converting it.
  const bool premul = op.op >= chorusNumOps && op.reduces();
  if (premul) scalars_[i] = red_ops_.scalarOf(op);
  const std::byte* staged =
      ex.on && premul ? exact_.premulInput(op, i, sh.inputElems(rank_) / words, &scalars_[i]) : nullptr;
  // Exact has separate accumulators in and out, and a staged input is apart
  // from the output.
  if (words_plan || staged != nullptr) sh.inplace = false;
  const plan::Algorithm* algo = nullptr;
  CHORUS_ASSIGN_OR_RETURN(const plan::Program* prog, programFor(op, i, sh, path, plan_dtype, &algo));

  job_bufs_[i] = {const_cast<std::byte*>(staged != nullptr ? staged : sp), rp, nullptr};
  if (words_plan) {
    // In place too, the send buffer is the whole input (the output lies in it).
    const uint64_t in_elems = sh.inputElems(rank_) / words;
    const auto acc = exact_.convert(op, i, staged != nullptr ? staged : sp, in_elems, sh.outputElems(rank_) / words);
    job_bufs_[i] = {acc[0], acc[1], nullptr};
  }
  exact_.average(op, i, sh.outputElems(rank_) / words);
  // The reduction: exact calls sum int64 accumulator words (an exact plan's
  // wire too); the others combine the plan's type with the op.
  jobs_[i] = exec::Job{.program = prog,
                       .elem_size = es ? es : 1,
                       .reduce_dtype = ex.on ? chorusInt64 : plan_dtype,
                       .reduce_op = ex.on ? BinOp::Sum : binOpOf(op.op),
                       .trace_seq = op.trace_seq,
                       .sig = op.pointToPoint() ? kPointToPointWire : batch_wire_,
                       .scalar = premul && !ex.on ? &scalars_[i] : nullptr,
                       .exact = ex.fused ? &ex.layout : nullptr,
                       .prologue = ex.prologue(),
                       .epilogue = ex.epilogue()};
  if (trace_) traceJob(op, i, algo, prog, sh);
  // Wire bytes after the scratch, 8-byte aligned (an exact plan's words).
  scratch_offsets_[i] = exec::wireOffset(prog->scratch_elems, es ? es : 1) + prog->wire_bytes;
  if (i == 0 && prog != board_decided_) decideBoard(algo, prog, sh, es);
  return {};
}

// Whether job 0 runs through the board: decided once per program (a cached
// program stands for one algorithm and shape; the v-collectives' reused ones
// never take the board).
void CallPlanner::decideBoard(const plan::Algorithm* algo, const plan::Program* prog, const plan::Shape& sh,
                              size_t es) {
  board_decided_ = prog;
  board_prog_ = board_runner_ != nullptr && algo != nullptr && algo->oneShot() &&
                        exec::boardBytes(sh) <= exec::kBoardBytes
                    ? board_runner_->programFor(*algo, sh, *prog, es ? es : 1)
                    : nullptr;
}

Result<double> CallPlanner::predict(Collective coll, size_t count, chorusDataType_t dtype, bool inplace,
                                   const std::optional<WireFormat>& wire, const plan::Algorithm** algo_out) {
  plan::Shape sh;
  sh.coll = coll;
  sh.nranks = nranks_;
  sh.count = count;
  sh.elem_size = static_cast<uint32_t>(dtypeSize(dtype));
  sh.inplace = inplace;
  sh.hosts = tuner_->topology().host_of;
  sh.wire = wire;
  CHORUS_ASSIGN_OR_RETURN(tune::Choice ch, tuner_->choose(sh, dtype));
  sh.chunk_elems = sh.elem_size ? std::max<uint64_t>(1, ch.chunk_bytes / sh.elem_size) : 0;
  // Canonical mode runs a canonical plan for float reductions (prepare()).
  sh.canonical = repro_ == Reproducible::Canonical && plan::reduces(coll) && isFloatType(dtype);
  const plan::Algorithm* algo = sh.canonical ? plan::canonicalPlanFor(ch.algo, sh) : ch.algo;
  *algo_out = algo;
  return tuner_->price(*algo, sh, dtype);
}

void CallPlanner::sign(std::span<const OpDesc> ops, uint64_t seq) {
  static const OpDesc kNone{};
  const OpDesc& o0 = ops.empty() ? kNone : ops.front();
  const bool same = ops.size() == 1 && last_shape_.valid && !o0.pointToPoint() && o0.coll == last_shape_.coll &&
                    o0.count == last_shape_.count && o0.dtype == last_shape_.dtype && o0.op == last_shape_.op &&
                    o0.root == last_shape_.root;
  if (same) {
    batch_sig_.seq = seq;
  } else {
    batch_sig_ = signatureOf(ops, seq);
    wire_base_ = wireBase(batch_sig_);
    board_base_ = comm::boardBase(batch_sig_);
    last_shape_.valid = ops.size() == 1 && !o0.pointToPoint() && !plan::variable(o0.coll);
    last_shape_.coll = o0.coll;
    last_shape_.count = o0.count;
    last_shape_.dtype = o0.dtype;
    last_shape_.op = o0.op;
    last_shape_.root = o0.root;
  }
  batch_wire_ = wireAt(wire_base_, seq);
}

Status CallPlanner::bindBatch(std::span<OpDesc> ops, size_t* njobs) {
  const size_t n = ops.size();
  jobs_.resize(n);
  job_bufs_.resize(n);
  scalars_.resize(n);  // jobs point into it: sized before any is bound
  scratch_offsets_.resize(n);
  exact_.reserve(n);  // jobs point into it: sized before any is bound

  // Sends to and receives from self are matched in issue order and copied.
  std::vector<size_t> self_sends, self_recvs;
  for (size_t i = 0; i < n; ++i) {
    if (ops[i].pointToPoint() && ops[i].peer == rank_) (ops[i].kind == OpKind::Send ? self_sends : self_recvs).push_back(i);
  }
  if (self_sends.size() != self_recvs.size())
    return invalidUsage("rank {}: {} send(s) to self but {} receive(s) from self in one group (each needs its twin)",
                        rank_, self_sends.size(), self_recvs.size());
  for (size_t k = 0; k < self_sends.size(); ++k) {
    const OpDesc& s = ops[self_sends[k]];
    const OpDesc& r = ops[self_recvs[k]];
    const size_t sb = s.count * dtypeSize(s.dtype), rb = r.count * dtypeSize(r.dtype);
    if (sb != rb) return makeError(chorusMismatch, "rank {}: send to self of {} bytes but receive from self of {} bytes", rank_, sb, rb);
    if (sb) std::memmove(r.recv, s.send, sb);
  }

  size_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    if (ops[i].pointToPoint() && ops[i].peer == rank_) continue;
    if (m != i) ops[m] = ops[i];  // compact: jobs_ index == ops index
    CHORUS_RETURN_IF_ERROR(prepare(ops[m], m));
    ++m;
  }
  jobs_.resize(m);
  *njobs = m;
  return {};
}

// The board runner keeps its own scratch, if the program needs any.
const exec::Job& CallPlanner::boardJob() {
  jobs_[0].buffers = job_bufs_[0];
  return jobs_[0];
}

// Each job's scratch (and its compressed wire bytes after it) at a 64-byte
// aligned offset of the one buffer.
std::span<const exec::Job> CallPlanner::layoutJobs() {
  const size_t njobs = jobs_.size();
  size_t total = 0;
  for (size_t i = 0; i < njobs; ++i) {
    size_t need = (scratch_offsets_[i] + 63) & ~size_t{63};
    scratch_offsets_[i] = total;
    total += need;
  }
  if (scratch_.size() < total) scratch_.resize(total);
  for (size_t i = 0; i < njobs; ++i) {
    job_bufs_[i][2] = scratch_.data() + scratch_offsets_[i];
    jobs_[i].buffers = job_bufs_[i];
    jobs_[i].wire = job_bufs_[i][2] + exec::wireOffset(jobs_[i].program->scratch_elems, jobs_[i].elem_size);
  }
  return jobs_;
}

}  // namespace chorus::comm
