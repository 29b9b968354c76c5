#include "exec/executor.hpp"

#include <algorithm>
#include <cstring>

#include "clock/offset.hpp"
#include "kernels/exact.hpp"
#include "kernels/quantize.hpp"
#include "kernels/reduce.hpp"

namespace chorus::exec {

using plan::StepOp;
static_assert(static_cast<int>(trace::StepKind::DequantizeReduce) == static_cast<int>(StepOp::DequantizeReduce) &&
                  static_cast<int>(trace::StepKind::Quantize) == static_cast<int>(StepOp::Quantize) &&
                  static_cast<int>(trace::StepKind::Divide) == static_cast<int>(StepOp::Divide) &&
                  static_cast<int>(trace::StepKind::EncodeAdd) == static_cast<int>(StepOp::EncodeAdd),
              "trace records carry plan::StepOp values");
using Clock = std::chrono::steady_clock;

Executor::Executor(int rank, std::vector<transport::Transport*> routes) : rank_(rank), routes_(std::move(routes)) {
  for (auto* t : routes_)
    if (t && std::find(transports_.begin(), transports_.end(), t) == transports_.end()) transports_.push_back(t);
  sendq_.resize(routes_.size());
  recvq_.resize(routes_.size());
}

void Executor::abort() {
  aborted_.store(true, std::memory_order_release);
  for (auto* t : transports_) t->wake();
}

namespace {
std::byte* addr(const Job& j, const plan::Region& r) {
  if (r.buf == plan::Buf::Wire) return j.wire + r.offset;  // bytes
  return j.buffers[static_cast<size_t>(r.buf)] + r.offset * j.elem_size;
}
float* floats(const Job& j, const plan::Region& r) { return reinterpret_cast<float*>(addr(j, r)); }

// A compressed plan's local step (plan.hpp, StepOp::Quantize ...): the data
// is fp32, the format the program's.
void runQuantStep(const Job& j, const plan::Step& s) {
  const kernels::WireFormat& fmt = *j.program->wire;
  switch (s.op) {
    case StepOp::Quantize: kernels::quantize(fmt, floats(j, s.src), s.src.count, addr(j, s.dst)); break;
    case StepOp::Dequantize: kernels::dequantize(fmt, addr(j, s.src), s.dst.count, floats(j, s.dst)); break;
    case StepOp::DequantizeReduce:
      // dst = accum + decoded: start from the accumulator (often dst itself).
      if (addr(j, s.dst) != addr(j, s.src)) std::memmove(addr(j, s.dst), addr(j, s.src), s.dst.count * 4);
      kernels::dequantizeAdd(fmt, addr(j, s.src2), s.dst.count, floats(j, s.dst));
      break;
    default: break;
  }
}

// An exact plan's local step (plan.hpp, StepOp::Encode, StepOp::Decode): the
// data is the call's float type, the wire holds its accumulator words.
Status runExactStep(const Job& j, const plan::Step& s) {
  const kernels::ExactLayout* l = j.exact;
  if (l == nullptr || static_cast<uint32_t>(l->words) != j.program->exact_words)
    return internalError("an exact plan's step in a job without its accumulator layout");
  if (s.op == StepOp::Encode) {
    if (s.src.count) kernels::toExact(*l, reinterpret_cast<int64_t*>(addr(j, s.dst)), addr(j, s.src), s.src.count);
  } else if (s.op == StepOp::DecodeAdd) {
    if (s.dst.count == 0) return {};
    if (s.src2.buf == plan::Buf::Wire)
      kernels::fromExactAdd(*l, addr(j, s.dst), addr(j, s.src), reinterpret_cast<const int64_t*>(addr(j, s.src2)),
                            s.dst.count);
    else
      kernels::fromExactSum(*l, addr(j, s.dst), addr(j, s.src), addr(j, s.src2), s.dst.count);
  } else if (s.op == StepOp::EncodeAdd) {
    if (s.src.count)
      kernels::toExactSum(*l, reinterpret_cast<int64_t*>(addr(j, s.dst)), addr(j, s.src), addr(j, s.src2), s.src.count);
  } else if (s.dst.count) {
    kernels::fromExact(*l, addr(j, s.dst), reinterpret_cast<const int64_t*>(addr(j, s.src)), s.dst.count);
  }
  return {};
}

// The op's arithmetic (plan.hpp, StepOp::Scale, StepOp::Divide), in the
// call's type: the scalar's for Scale, the job's reduce_dtype for Divide.
Status runScalingStep(const Job& j, const plan::Step& s) {
  if (s.dst.count == 0) return {};
  if (s.op == StepOp::Scale) {
    if (j.scalar == nullptr) return internalError("a Scale step in a job without a PreMulSum scalar");
    kernels::scale(addr(j, s.dst), addr(j, s.src), s.dst.count, j.scalar->dtype, *j.scalar);
    return {};
  }
  if (j.program->divisor == 0) return internalError("a Divide step in a program without a divisor");
  kernels::divide(addr(j, s.dst), addr(j, s.dst), s.dst.count, j.reduce_dtype, j.program->divisor);
  return {};
}
}  // namespace

void Executor::markReady(uint32_t g) {
  const StepRef ref = refs_[g];
  const plan::Step& s = jobs_[ref.job].program->steps[ref.step];
  ready_[g] = 1;
  if (plan::isLocal(s.op)) local_ready_.push_back(g);
}

void Executor::traceStep(uint32_t g, int64_t start_ns, int64_t end_ns) {
  const StepRef ref = refs_[g];
  const Job& j = jobs_[ref.job];
  const plan::Step& s = j.program->steps[ref.step];
  trace::StepRecord r;
  r.seq = j.trace_seq;
  r.kind = static_cast<uint8_t>(s.op);
  r.peer = s.peer;
  const bool by_src =
      s.op == StepOp::Send || s.op == StepOp::Quantize || s.op == StepOp::Encode || s.op == StepOp::EncodeAdd;
  r.bytes = plan::regionBytes(by_src ? s.src : s.dst, j.elem_size);
  r.start_ns = start_ns;
  r.end_ns = end_ns;
  rec_->step(r);
}

Status Executor::runLocal(uint32_t g) {
  const StepRef ref = refs_[g];
  const Job& j = jobs_[ref.job];
  const plan::Step& s = j.program->steps[ref.step];
  const int64_t t0 = rec_ ? clock::traceNowNs() : 0;
  if (s.op == StepOp::Copy) {
    if (s.dst.count) std::memmove(addr(j, s.dst), addr(j, s.src), s.dst.count * j.elem_size);
  } else if (s.op == StepOp::Scale || s.op == StepOp::Divide) {
    CHORUS_RETURN_IF_ERROR(runScalingStep(j, s));
  } else if (s.op == StepOp::Encode || s.op == StepOp::Decode || s.op == StepOp::DecodeAdd ||
             s.op == StepOp::EncodeAdd) {
    CHORUS_RETURN_IF_ERROR(runExactStep(j, s));
  } else if (s.op != StepOp::Reduce) {
    runQuantStep(j, s);
  } else {
    if (s.dst.count) (*reducers_[ref.job])(addr(j, s.dst), addr(j, s.src), addr(j, s.src2), s.dst.count);
  }
  if (rec_) traceStep(g, t0, clock::traceNowNs());
  return complete(g);
}

Status Executor::post(uint32_t g) {
  const StepRef ref = refs_[g];
  const Job& j = jobs_[ref.job];
  const plan::Step& s = j.program->steps[ref.step];
  transport::Transport* t = routes_[s.peer];
  transport::Request* req = &requests_[g];
  req->state.store(transport::Request::Posted, std::memory_order_relaxed);
  req->sig = j.sig;
  if (rec_) t_posted_[g] = clock::traceNowNs();
  Status st;
  if (s.op == StepOp::Send) {
    st = t->postSend(s.peer, addr(j, s.src), plan::regionBytes(s.src, j.elem_size), req);
  } else {
    transport::RecvTarget& tg = targets_[g];
    tg.dst = addr(j, s.dst);
    tg.bytes = plan::regionBytes(s.dst, j.elem_size);
    tg.accum = s.op == StepOp::RecvReduce ? addr(j, s.src) : nullptr;
    tg.reducer = s.op == StepOp::RecvReduce ? reducers_[ref.job] : nullptr;
    st = t->postRecv(s.peer, tg, req);
  }
  if (st.isOk() && s.op == StepOp::Send) CHORUS_RETURN_IF_ERROR(releaseGated(g));
  return st;
}

// The receives after `send` in its job's program order, up to the next send,
// were waiting for it to be posted (run()).
Status Executor::releaseGated(uint32_t send) {
  const uint32_t job = refs_[send].job;
  const plan::Program& p = *jobs_[job].program;
  for (uint32_t g = send + 1; g < refs_.size() && refs_[g].job == job; ++g) {
    const plan::Step& s = p.steps[refs_[g].step];
    if (s.op == StepOp::Send) break;
    if (s.op != StepOp::Recv && s.op != StepOp::RecvReduce) continue;
    if (--pending_[g] != 0) continue;
    markReady(g);
    CHORUS_RETURN_IF_ERROR(tryPost(recvq_[s.peer]));
  }
  return {};
}

Status Executor::tryPost(PeerQueue& q) {
  while (q.posted < q.order.size() && ready_[q.order[q.posted]]) CHORUS_RETURN_IF_ERROR(post(q.order[q.posted++]));
  return {};
}

Status Executor::complete(uint32_t g) {
  ++done_;
  ready_[g] = 2;  // finished
  const StepRef ref = refs_[g];
  const plan::Program& p = *jobs_[ref.job].program;
  const uint32_t base = job_base_[ref.job];
  for (uint32_t succ : p.succOf(ref.step)) {
    const uint32_t sg = base + succ;
    if (--pending_[sg] == 0) {
      markReady(sg);
      const plan::Step& s = p.steps[succ];
      if (s.op == StepOp::Send) CHORUS_RETURN_IF_ERROR(tryPost(sendq_[s.peer]));
      if (s.op == StepOp::Recv || s.op == StepOp::RecvReduce) CHORUS_RETURN_IF_ERROR(tryPost(recvq_[s.peer]));
    }
  }
  return {};
}

Status Executor::reap(PeerQueue& q, bool* progressed) {
  // Requests of one peer and direction usually finish in order; scan the
  // posted window and advance past the finished prefix.
  for (size_t i = q.finished; i < q.posted; ++i) {
    const uint32_t g = q.order[i];
    transport::Request& req = requests_[g];
    const uint32_t state = req.state.load(std::memory_order_acquire);
    if (state == transport::Request::Failed) return req.status;
    if (state != transport::Request::Done) continue;
    req.state.store(transport::Request::Idle, std::memory_order_relaxed);
    if (rec_) traceStep(g, t_posted_[g], clock::traceNowNs());
    *progressed = true;
    if (i == q.finished) ++q.finished;
    CHORUS_RETURN_IF_ERROR(complete(g));
  }
  // Skip entries finished out of order earlier.
  while (q.finished < q.posted &&
         requests_[q.order[q.finished]].state.load(std::memory_order_relaxed) == transport::Request::Idle)
    ++q.finished;
  return {};
}

std::string Executor::describePending() const {
  std::string out;
  int shown = 0;
  for (size_t g = 0; g < refs_.size() && shown < 4; ++g) {
    if (ready_[g] == 2) continue;
    const StepRef ref = refs_[g];
    const plan::Step& s = jobs_[ref.job].program->steps[ref.step];
    if (s.op == StepOp::Send || s.op == StepOp::Recv || s.op == StepOp::RecvReduce) {
      const bool posted = requests_[g].state.load() == transport::Request::Posted;
      out += fmt::format("{}{} {} rank {} ({} bytes){}", shown ? "; " : "", s.op == StepOp::Send ? "send to" : "receive from",
                         "", s.peer, plan::regionBytes(s.op == StepOp::Send ? s.src : s.dst, jobs_[ref.job].elem_size),
                         posted ? " in flight" : " waiting for earlier steps");
      ++shown;
    }
  }
  return out;
}

Status Executor::run(std::span<const Job> jobs, std::chrono::milliseconds timeout) {
  for (const Job& j : jobs) runLocalOps(j.prologue);
  CHORUS_RETURN_IF_ERROR(runSteps(jobs, timeout));
  for (const Job& j : jobs) runLocalOps(j.epilogue);
  return {};
}

Status Executor::runSteps(std::span<const Job> jobs, std::chrono::milliseconds timeout) {
  jobs_ = jobs;
  // Number the steps of all jobs globally; each job's reduction kernel.
  job_base_.clear();
  refs_.clear();
  reducers_.resize(jobs.size());
  for (uint32_t j = 0; j < jobs.size(); ++j) {
    reducers_[j] = reducerFor(jobs[j].reduce_dtype, jobs[j].reduce_op);
    if (reducers_[j] == nullptr)
      return internalError("job {}: no reduction kernel for datatype {} and op {}", j,
                           static_cast<int>(jobs[j].reduce_dtype), static_cast<int>(jobs[j].reduce_op));
    job_base_.push_back(static_cast<uint32_t>(refs_.size()));
    for (uint32_t i = 0; i < jobs[j].program->size(); ++i) refs_.push_back({j, i});
  }
  const size_t total = refs_.size();
  if (total == 0) return {};
  if (request_capacity_ < total) {
    request_capacity_ = std::max(total, request_capacity_ * 2);
    requests_ = std::make_unique<transport::Request[]>(request_capacity_);
    targets_.resize(request_capacity_);
  }
  pending_.assign(total, 0);
  ready_.assign(total, 0);
  if (rec_ && t_posted_.size() < total) t_posted_.resize(total);
  local_ready_.clear();
  for (int p : active_peers_) {
    sendq_[p].order.clear();
    recvq_[p].order.clear();
    sendq_[p].posted = sendq_[p].finished = recvq_[p].posted = recvq_[p].finished = 0;
  }
  active_peers_.clear();
  done_ = 0;

  bool after_send = false;
  for (uint32_t g = 0; g < total; ++g) {
    const StepRef ref = refs_[g];
    const plan::Program& p = *jobs[ref.job].program;
    const plan::Step& s = p.steps[ref.step];
    pending_[g] = static_cast<uint32_t>(p.depsOf(ref.step).size());
    // A receive after a send of its job waits for the last such send to be
    // posted (executor.hpp); releaseGated() counts that down.
    if (ref.step == 0) after_send = false;
    if (s.op == StepOp::Send) after_send = true;
    if ((s.op == StepOp::Recv || s.op == StepOp::RecvReduce) && after_send) ++pending_[g];
    if (s.op == StepOp::Send || s.op == StepOp::Recv || s.op == StepOp::RecvReduce) {
      if (s.peer < 0 || static_cast<size_t>(s.peer) >= routes_.size() || routes_[s.peer] == nullptr)
        return internalError("step {} names peer {} that this rank ({}) has no transport to", ref.step, s.peer, rank_);
      PeerQueue& q = s.op == StepOp::Send ? sendq_[s.peer] : recvq_[s.peer];
      if (sendq_[s.peer].order.empty() && recvq_[s.peer].order.empty()) active_peers_.push_back(s.peer);
      q.order.push_back(g);
    }
    requests_[g].state.store(transport::Request::Idle, std::memory_order_relaxed);
  }
  for (uint32_t g = 0; g < total; ++g)
    if (pending_[g] == 0) markReady(g);
  for (int p : active_peers_) {
    CHORUS_RETURN_IF_ERROR(tryPost(sendq_[p]));
    CHORUS_RETURN_IF_ERROR(tryPost(recvq_[p]));
  }

  // The timeout runs from the end of the first wait in the transport (at
  // most 100 ms late): a call whose messages arrive during that wait, which
  // is most small calls, never reads the clock here.
  Clock::time_point deadline{};
  uint64_t idle_turns = 0;
  while (done_ < total) {
    bool progressed = false;
    while (!local_ready_.empty()) {
      uint32_t g = local_ready_.back();
      local_ready_.pop_back();
      CHORUS_RETURN_IF_ERROR(runLocal(g));
      progressed = true;
    }
    if (done_ == total) break;
    for (auto* t : transports_) {
      auto r = t->poll();
      if (!r.isOk()) return r.status();
      progressed = progressed || r.value();
    }
    for (int p : active_peers_) {
      CHORUS_RETURN_IF_ERROR(reap(sendq_[p], &progressed));
      CHORUS_RETURN_IF_ERROR(reap(recvq_[p], &progressed));
    }
    if (progressed || !local_ready_.empty()) continue;
    if (aborted()) return makeError(chorusAborted, "the communicator was aborted");
    // Nothing moved: check the clock now and then, and block in the transport.
    if (idle_turns++ > 0) {
      const auto now = Clock::now();
      if (idle_turns == 2) deadline = now + timeout;
      if (now >= deadline)
        return makeError(chorusTimeout, "rank {}: operation timed out after {} ms; pending: {}", rank_, timeout.count(),
                         describePending());
    }
    if (transports_.size() == 1) {
      transports_[0]->wait(std::chrono::milliseconds(100));
    } else {
      // Several transports (shm + tcp): bounded waits on each in turn.
      for (auto* t : transports_) t->wait(std::chrono::microseconds(200));
    }
  }
  return {};
}

}  // namespace chorus::exec
