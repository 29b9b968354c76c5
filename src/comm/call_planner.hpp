// The call planner: a batch of operations → each operation's plan shape →
// the tuner's plan → this rank's program (memoised for a loop of equal calls,
// else from the program cache) → a bound executor job (buffers, reduction,
// message word), with the batch's scratch laid out in one reused buffer.
// Also the batch's signature (call_signature.hpp).  The modes live beside it:
// the reduction ops and their arithmetic as plan steps (red_ops.hpp,
// plan::Scaling), CHORUS_REPRODUCIBLE=exact's agreement, conversions and
// rounding (exact_calls.hpp), canonical plans (plan/canonical.hpp) and
// compressed plans (the shape's wire format, plan/compressed.cpp).
//
// Everything here runs on the thread executing the communicator's batches;
// steady-state calls do not allocate.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "comm/call_signature.hpp"
#include "comm/exact_calls.hpp"
#include "comm/op.hpp"
#include "comm/red_ops.hpp"
#include "common/config.hpp"
#include "common/reduction.hpp"
#include "common/status.hpp"
#include "common/wire_format.hpp"
#include "exec/board_runner.hpp"
#include "exec/executor.hpp"
#include "plan/plan.hpp"
#include "trace/record.hpp"
#include "tune/tuner.hpp"

namespace chorus::comm {

class CallPlanner {
 public:
  // executor: runs exact calls' exponent-range agreement; runner: the board's
  // (nullptr when the board is off); trace: CHORUS_TRACE's recorder or nullptr.
  void bind(int rank, int nranks, const Config& cfg, tune::Tuner* tuner, exec::Executor* executor,
            exec::BoardRunner* runner, trace::Recorder* trace);

  // The reduction ops made with chorusRedOpCreatePreMulSum, and whether op
  // may reduce dtype on this communicator.
  Result<chorusRedOp_t> createPreMulSum(const Scalar& s, const void* device_scalar) {
    return red_ops_.createPreMulSum(s, device_scalar);
  }
  Status destroyRedOp(chorusRedOp_t op) { return red_ops_.destroy(op); }
  Status validateOp(chorusRedOp_t op, chorusDataType_t dtype) const { return red_ops_.validate(op, dtype); }

  // The batch's signature under sequence number seq, and its message word.
  // A loop of equal calls (the common case) hashes its signature once.
  void sign(std::span<const OpDesc> ops, uint64_t seq);
  [[nodiscard]] const Signature& signature() const { return batch_sig_; }
  [[nodiscard]] uint64_t boardBase() const { return board_base_; }

  // Binds the batch's jobs: sends to and receives from self copied (matched
  // in issue order), every other operation planned into a job; the ops are
  // compacted so that job i is ops[i].  *njobs: how many.
  Status bindBatch(std::span<OpDesc> ops, size_t* njobs);
  // Job 0's program compiled for the board runner when the batch is that one
  // job and runs through the board (else nullptr), and the job.
  [[nodiscard]] const exec::BoardProgram* boardProgram(size_t njobs) const {
    return njobs == 1 ? board_prog_ : nullptr;
  }
  const exec::Job& boardJob();
  // The jobs with their scratch laid out in the shared buffer.
  std::span<const exec::Job> layoutJobs();
  // The plan a single call of this shape would run (*algo) and the tuner's
  // prediction of its time in seconds; `wire`: the call's compression.
  Result<double> predict(plan::Collective coll, size_t count, chorusDataType_t dtype, bool inplace,
                         const std::optional<WireFormat>& wire, const plan::Algorithm** algo);
  // The tuner changed: the memoised choice is stale.
  void forgetChoice() { last_.valid = false; }

  // CHORUS_TRACE: job i's algorithm and predicted time (ns, < 0 none).
  [[nodiscard]] uint16_t traceAlgo(size_t i) const { return trace_algo_[i]; }
  [[nodiscard]] int64_t tracePredicted(size_t i) const { return trace_pred_[i]; }

 private:
  // CHORUS_REPRODUCIBLE: how a call runs.  Plain: as chosen; Canonical: a
  // plan that combines in the canonical tree (plan/canonical.hpp); Exact:
  // the exact accumulator (common/exact_layout.hpp) summed as int64 words by any
  // plan, rounded once into the output.
  enum class ReproPath : uint8_t { Plain, Canonical, Exact };
  [[nodiscard]] ReproPath reproPath(const OpDesc& op) const;
  Status prepare(OpDesc& op, size_t i);
  // prepare()'s parts: the plan shape, the plan and program, the input the
  // plan reads, the trace's algorithm and prediction, and
  // whether job 0 runs through the board.
  [[nodiscard]] plan::Shape shapeOf(const OpDesc& op, bool canonical, uint64_t words, size_t es) const;
  Result<const plan::Program*> programFor(const OpDesc& op, size_t i, plan::Shape& sh, ReproPath path,
                                          chorusDataType_t plan_dtype, const plan::Algorithm** algo_out);
  void traceJob(const OpDesc& op, size_t i, const plan::Algorithm* algo, const plan::Program* prog,
                const plan::Shape& sh);
  void decideBoard(const plan::Algorithm* algo, const plan::Program* prog, const plan::Shape& sh, size_t es);

  int rank_ = 0, nranks_ = 1;
  Reproducible repro_ = Reproducible::Off;
  std::chrono::milliseconds timeout_{0};
  tune::Tuner* tuner_ = nullptr;
  exec::Executor* executor_ = nullptr;
  exec::BoardRunner* board_runner_ = nullptr;
  trace::Recorder* trace_ = nullptr;
  RedOps red_ops_;     // the PreMulSum ops and which op may reduce which type
  ExactCalls exact_;   // CHORUS_REPRODUCIBLE=exact's agreement, conversions and rounding

  // The running batch's signature and its message word (call_signature.hpp).
  Signature batch_sig_;
  uint64_t batch_wire_ = 0;
  uint64_t wire_base_ = 0, board_base_ = 0;  // batch_sig_'s words without their call bits
  struct {
    bool valid = false;
    plan::Collective coll{};
    size_t count = 0;
    chorusDataType_t dtype{};
    chorusRedOp_t op{};
    int root = 0;
  } last_shape_;  // the single collective batch_sig_ was hashed for

  // Program cache and per-call scratch, reused so steady-state calls do not allocate.
  struct CacheKey {
    uint8_t coll;
    bool inplace;
    OpKind kind;
    uint32_t elem_size;
    int root;
    int peer;
    uint64_t count;
    uint64_t chunk;
    const plan::Algorithm* algo;
    bool canonical;  // Shape::canonical (the one-shot plans differ)
    uint32_t wire;   // compressed calls: wireKey(Shape::wire); 0 uncompressed
    uint8_t scaling;  // Shape::scaling (PreMulSum, Avg add steps)
    uint32_t exact_words;  // Shape::exact_words (an exact plan's words per element); 0 else
    bool operator==(const CacheKey&) const = default;
  };
  struct CacheHash {
    size_t operator()(const CacheKey& k) const;
  };
  std::unordered_map<CacheKey, std::unique_ptr<plan::Program>, CacheHash> cache_;
  // The last single operation's choice and program (prepare()): a loop of
  // equal calls skips the tuner's and the cache's hash lookups.
  struct LastPrepared {
    CacheKey key{};
    chorusDataType_t dtype{};
    bool valid = false;
    const plan::Program* prog = nullptr;
    uint8_t path = 0;  // ReproPath of the call
  } last_;
  // Job 0's program compiled for the board runner (else nullptr), and the
  // program that was decided for.
  const exec::BoardProgram* board_prog_ = nullptr;
  const plan::Program* board_decided_ = nullptr;
  std::vector<std::unique_ptr<plan::Program>> uncached_;  // v-collectives, reused
  std::vector<exec::Job> jobs_;
  std::vector<std::array<std::byte*, 3>> job_bufs_;
  std::vector<size_t> scratch_offsets_;
  std::vector<std::byte> scratch_;
  std::vector<Scalar> scalars_;  // per job: PreMulSum's scalar (exec::Job::scalar)
  std::vector<uint16_t> trace_algo_;  // per job of the current batch
  std::vector<int64_t> trace_pred_;   // per job: predicted ns, < 0 none
  std::unordered_map<const plan::Program*, int64_t> trace_pred_cache_;
};

}  // namespace chorus::comm
