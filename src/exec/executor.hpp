// The executor: runs this rank's programs over the transports.
//
// A Job is one program bound to buffers.  run() executes a batch of jobs as
// one dependency graph (a group is several jobs): a step starts as soon as the
// steps it depends on are done — there is no barrier per round — and messages
// to or from one peer are posted in program order (jobs in batch order), which
// is what the FIFO matching rule of plan.hpp needs.  One ordering goes beyond
// the data: a receive is posted only once the last send before it in its
// job's program order has been posted (receives before a job's first send
// post at once).  In an exchange round (recursive doubling/halving,
// Rabenseifner) a partner already a round ahead then finds this rank's next
// receive not yet posted: its data waits in the kernel's receive buffer,
// bounded by the TCP window, instead of being read — and its flow fed at a
// full share of this host's link — while this round's data is still arriving.
// Posting every receive up front let the rounds overlap on the wire and
// stretched each round's critical flow (docs/simulator.md, "Real runs": a
// recursive-doubling allgather of 16 MiB on 4 hosts, 155-177 -> 112-138 ms).
// Program order is a valid serial execution (plan.hpp), so this posts no
// step later than running the program in order would: it cannot deadlock a
// plan.  Local copies and
// reductions run on the calling thread between transport polls, so
// reductions overlap with transfers in flight.  A job's prologue and
// epilogue (local_ops.hpp: the local work of a call that is not a step of
// its plan) run before the batch's first step and after its last.
//
// Threading: one thread at a time calls run() (the communicator's executing
// thread).  abort() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <span>
#include <vector>

#include "common/exact_layout.hpp"
#include "common/reduction.hpp"
#include "common/status.hpp"
#include "exec/local_ops.hpp"
#include "plan/plan.hpp"
#include "trace/record.hpp"
#include "transport/transport.hpp"

namespace chorus::exec {

struct Job {
  const plan::Program* program = nullptr;
  // Base address of each buffer a region may name (index = Buf value).
  std::span<std::byte* const> buffers;
  size_t elem_size = 1;
  // RecvReduce and Reduce steps combine elements of reduce_dtype with
  // reduce_op (the kernel from reducerFor's table, looked up once per run);
  // Divide steps divide elements of reduce_dtype.
  chorusDataType_t reduce_dtype = chorusFloat32;
  BinOp reduce_op = BinOp::Sum;
  uint64_t trace_seq = 0;  // the operation's number in trace records
  uint64_t sig = 0;        // the call's message signature (transport::Request::sig)
  // A compressed plan's wire bytes (plan::Buf::Wire, program->wire_bytes).
  std::byte* wire = nullptr;
  // PreMulSum: the op's scalar, which Scale steps multiply by (read by the
  // communicator before the call when it lives in device memory).
  const Scalar* scalar = nullptr;
  // An exact plan (program->exact_words): the call's agreed accumulator
  // layout, which Encode and Decode steps convert with.
  const ExactLayout* exact = nullptr;
  // Local work on whole buffers around the program (local_ops.hpp): the
  // prologue runs before the batch's first step, the epilogue after its
  // last (CHORUS_REPRODUCIBLE=exact's conversions, scan and Avg division).
  std::span<const LocalOp> prologue, epilogue;
};

// Where a job's wire bytes start in its scratch allocation: after the
// program's scratch, 8-byte aligned (an exact plan's int64 words).
constexpr size_t wireOffset(uint64_t scratch_elems, size_t elem_size) {
  return (static_cast<size_t>(scratch_elems) * elem_size + 7) & ~size_t{7};
}

class Executor {
 public:
  // routes[peer] is the transport serving that peer (nullptr for self).
  Executor(int rank, std::vector<transport::Transport*> routes);

  // Runs the jobs to completion, or until an error, a timeout, or abort.
  // On error the communicator must be considered broken (peers may be
  // mid-message); the Status names the step and peer.
  Status run(std::span<const Job> jobs, std::chrono::milliseconds timeout);

  // Makes a current or later run() return chorusAborted.  Any thread.
  void abort();
  [[nodiscard]] bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  // With a recorder, every step's start and end are recorded (CHORUS_TRACE):
  // a transfer from when it is posted to when its completion is seen, a
  // local copy or reduction around its run.  nullptr: off (the default).
  void setRecorder(trace::Recorder* r) { rec_ = r; }

 private:
  struct StepRef {
    uint32_t job;
    uint32_t step;
  };
  struct PeerQueue {
    std::vector<uint32_t> order;  // global step ids, program order
    size_t posted = 0;            // next to post
    size_t finished = 0;          // all before this are finished
  };

  Status runSteps(std::span<const Job> jobs, std::chrono::milliseconds timeout);
  void markReady(uint32_t g);
  void traceStep(uint32_t g, int64_t start_ns, int64_t end_ns);
  Status post(uint32_t g);
  Status runLocal(uint32_t g);
  Status tryPost(PeerQueue& q);
  Status complete(uint32_t g);
  Status reap(PeerQueue& q, bool* progressed);
  Status releaseGated(uint32_t send);
  [[nodiscard]] std::string describePending() const;

  int rank_;
  std::vector<transport::Transport*> routes_;
  std::vector<transport::Transport*> transports_;  // distinct, non-null
  std::atomic<bool> aborted_{false};

  // Per-run state, kept between runs so steady-state calls do not allocate.
  std::span<const Job> jobs_;
  std::vector<const kernels::Reducer*> reducers_;  // per job (Job::reduce_dtype, reduce_op)
  std::vector<StepRef> refs_;
  std::vector<uint32_t> job_base_;
  std::vector<uint32_t> pending_;
  std::vector<uint8_t> ready_;
  std::vector<uint32_t> local_ready_;
  std::vector<PeerQueue> sendq_, recvq_;
  std::vector<int> active_peers_;
  std::unique_ptr<transport::Request[]> requests_;
  size_t request_capacity_ = 0;
  std::vector<transport::RecvTarget> targets_;
  size_t done_ = 0;
  trace::Recorder* rec_ = nullptr;
  std::vector<int64_t> t_posted_;  // with a recorder: when each transfer step was posted
};

}  // namespace chorus::exec
