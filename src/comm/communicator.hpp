// The Communicator: ranks, peers, transports, the algorithm registry and the
// tuner, and the engine that executes operations in issue order.
//
// Execution: every operation (or group of operations) becomes a batch that
// the engine (comm/engine.hpp) runs in issue order, on the caller's thread
// when it is idle, else on the communicator's progress thread.
//
// Threading: one user thread at a time per communicator (as NCCL); abort()
// and asyncError() from any thread.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/store.hpp"
#include "comm/board_calls.hpp"
#include "comm/call_signature.hpp"
#include "comm/engine.hpp"
#include "comm/flight.hpp"
#include "comm/health.hpp"
#include "comm/op.hpp"
#include "common/config.hpp"
#include "common/status.hpp"
#include "exec/board_runner.hpp"
#include "exec/executor.hpp"
#include "exec/stream.hpp"
#include "kernels/exact.hpp"
#include "kernels/quantize.hpp"
#include "kernels/reduce.hpp"
#include "plan/plan.hpp"
#include "transport/transport.hpp"
#include "trace/record.hpp"
#include "tune/tuner.hpp"

namespace chorus {

class Communicator {
 public:
  // Collective over all nranks ranks.  Rank 0 runs the store server for
  // root (adopting the listener reserved by chorusGetUniqueId when there is
  // one).
  // From the environment (shared_server): rank 0's store server for an
  // address outlives the communicator and serves every later environment init
  // in the process, each under its own key prefix ("w/", "w1/", ...), so a
  // job may destroy and re-create its world communicator (the n-th init of
  // every rank meets the n-th of the others) without a rank meeting a store
  // that is shutting down.
  static Result<std::unique_ptr<Communicator>> init(int nranks, int rank, const bootstrap::UniqueId& id,
                                                    const Config& cfg, std::string_view prefix = "w/",
                                                    bool shared_server = false);
  ~Communicator();

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return nranks_; }
  [[nodiscard]] const Config& config() const { return cfg_; }

  // Runs ops as one unit: now on this thread (stream == nullptr) or queued on stream.
  Status submit(std::vector<OpDesc> ops, exec::Stream* stream);
  Status submitOne(OpDesc& op, exec::Stream* stream);

  // Collective over this communicator.  color < 0: *out = nullptr.
  // cfg: the new communicator's configuration; nullptr = this one's.
  Result<std::unique_ptr<Communicator>> split(int color, int key, const Config* cfg = nullptr);
  // Collective over the surviving ranks: a new communicator of the ranks that
  // joined the agreement (see chorusCommShrink).
  Result<std::unique_ptr<Communicator>> shrink(std::chrono::milliseconds window);

  // The tuner's choice for a call of this shape and its predicted time.
  struct Prediction {
    std::string algo;
    double seconds = 0;
  };
  Result<Prediction> predict(plan::Collective coll, size_t count, chorusDataType_t dtype, bool inplace);
  // Replaces the CHORUS_ALGO overrides (same syntax; "" = the cost model
  // decides) for later calls; every rank must set the same (chorusCommSetAlgo).
  Status setAlgorithms(std::string_view spec);

  void abort(const Status& why);
  // The error that broke the communicator (or ok).
  Status asyncError() const;
  // Waits for queued work, then stops the progress thread.
  void drain();

  Result<chorusRedOp_t> createPreMulSum(const kernels::Scalar& s, const void* device_scalar);
  Status destroyRedOp(chorusRedOp_t op);
  Status validateOp(chorusRedOp_t op, chorusDataType_t dtype) const;

  std::string& lastError() { return last_error_; }

  // The latest estimate of rank 0's trace clock minus this rank's (0 before
  // any estimate; estimates are made with CHORUS_TRACE).
  [[nodiscard]] int64_t clockOffsetNs() const { return clock_offset_ns_.load(std::memory_order_relaxed); }
  // Estimates it now over the store connection (rounds exchanges, the
  // minimum-round-trip filter of clock/offset.hpp) and records it in the trace.
  Result<int64_t> syncClock(bootstrap::Store& store, int rounds);

 private:
  Communicator();
  // The engine's progress thread runs a queued batch here.
  static Status runQueued(void* self, std::span<OpDesc> ops);
  Status setup(const bootstrap::UniqueId& id, const Config& cfg, std::shared_ptr<bootstrap::Store> base,
               std::string prefix, std::shared_ptr<bootstrap::StoreServer> server);
  Status syncAll(bootstrap::Store& store, std::string_view name);
  Status execute(std::span<OpDesc> ops);
  Status executeBatch(std::span<OpDesc> ops);
  Status prepare(OpDesc& op, size_t index);
  Status fail(Status st);
  Status openTrace(uint64_t comm_id, const std::string& host);
  void traceOps(std::span<const OpDesc> ops, size_t n, int64_t start_ns, bool ok);

  int rank_ = 0, nranks_ = 1;
  Config cfg_;
  bootstrap::UniqueId id_;
  std::string prefix_;
  std::shared_ptr<bootstrap::StoreServer> server_;  // rank 0 of the root communicator
  std::shared_ptr<bootstrap::Store> base_store_;
  std::unique_ptr<bootstrap::Store> store_;
  int split_seq_ = 0;
  int shrink_seq_ = 0;
  uint64_t op_seq_ = 0;  // collectives issued on this communicator (the "#N" in messages)
  comm::Health health_;  // signature check, flight recorder, watchdog, timeout diagnosis

  std::unique_ptr<transport::Transport> shm_, tcp_;
  // The board's protocol when every peer is on this host (else off), and
  // job 0's program compiled for its runner when the batch runs through the
  // board (else nullptr).
  comm::BoardCalls board_;
  const exec::BoardProgram* board_prog_ = nullptr;
  const plan::Program* board_decided_ = nullptr;  // the program board_prog_ was decided for
  // The running batch's signature and its message word (call_signature.hpp).
  comm::Signature batch_sig_;
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
  std::unique_ptr<exec::Executor> executor_;
  plan::Registry registry_;
  std::unique_ptr<tune::Tuner> tuner_;

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
  // CHORUS_REPRODUCIBLE: how a call runs.  Plain: as chosen; Canonical: a
  // plan that combines in the canonical tree (plan/canonical.hpp); Exact:
  // the exact accumulator (kernels/exact.hpp) summed as int64 words by any
  // plan, rounded once into the output.
  enum class ReproPath : uint8_t { Plain, Canonical, Exact };
  [[nodiscard]] ReproPath reproPath(const OpDesc& op) const;
  // prepare()'s parts: the plan shape, the plan and program, PreMulSum's
  // scaled input, the trace's algorithm and prediction.
  [[nodiscard]] plan::Shape shapeOf(const OpDesc& op, bool canonical, uint64_t words, size_t es) const;
  Result<const plan::Program*> programFor(const OpDesc& op, size_t i, plan::Shape& sh, ReproPath path,
                                          chorusDataType_t plan_dtype, const plan::Algorithm** algo_out);
  const std::byte* premulInput(const OpDesc& op, size_t i, uint64_t n_in, bool stage);
  void traceJob(const OpDesc& op, size_t i, const plan::Algorithm* algo, const plan::Program* prog,
                const plan::Shape& sh);
  // Exact: converts this job's input into its accumulator and binds the
  // accumulators as the job's buffers; finishExact rounds the result.
  void bindExact(size_t i, const std::byte* input, uint64_t in_elems, uint64_t out_elems);
  void finishExact(size_t i, const OpDesc& op);
  Result<kernels::ExactLayout> exactLayoutFor(const OpDesc& op);
  plan::Program range_prog_;  // the exponent-range agreement of exact calls (2 int64, max)
  kernels::Reducer range_reducer_;
  std::vector<std::byte> range_scratch_;
  struct ExactJob {
    bool on = false;
    kernels::ExactLayout layout;
    std::vector<int64_t> in, out;
    uint64_t out_elems = 0;
  };
  std::vector<ExactJob> exact_;  // per job of the current batch
  std::vector<std::unique_ptr<plan::Program>> uncached_;  // v-collectives, reused
  std::vector<exec::Job> jobs_;
  std::vector<std::array<std::byte*, 3>> job_bufs_;
  std::vector<kernels::Reducer> reducers_;
  std::vector<size_t> scratch_offsets_;
  std::vector<std::byte> scratch_;
  std::vector<std::vector<std::byte>> staging_;  // PreMulSum pre-scaled inputs
  std::vector<PreMulSumOp> premul_;

  // Tracing (CHORUS_TRACE).
  std::unique_ptr<trace::Recorder> trace_;
  std::vector<uint16_t> trace_algo_;  // per job of the current batch
  std::vector<int64_t> trace_pred_;   // per job: predicted ns, < 0 none
  std::unordered_map<const plan::Program*, int64_t> trace_pred_cache_;
  uint64_t p2p_seq_ = 0;
  int64_t batch_start_ns_ = 0;
  std::atomic<int64_t> clock_offset_ns_{0};

  comm::Engine engine_;

  mutable std::mutex err_mu_;
  Status error_;  // sticky: set when the communicator breaks
  std::atomic<bool> broken_{false};
  std::string last_error_;
};

}  // namespace chorus
