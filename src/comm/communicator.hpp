// The Communicator: a facade over its collaborators, each in its own file:
//   wiring.hpp       set-up: the rendezvous, the rank records, the routes
//   engine.hpp       batches in issue order: the caller's thread or the
//                    progress thread
//   call_planner.hpp operation → plan → cached program → bound job
//   board_calls.hpp  the board's protocol on one-host communicators
//   health.hpp       signature check, flight recorder, watchdog, timeouts
//   tracing.hpp      CHORUS_TRACE's records and clock offset
// What is left here: ranks, split, shrink, abort and breaking, and the order
// in which a batch visits the collaborators (execute()).
//
// Threading: one user thread at a time per communicator (as NCCL); abort()
// and asyncError() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/store.hpp"
#include "comm/board_calls.hpp"
#include "comm/call_planner.hpp"
#include "comm/engine.hpp"
#include "comm/health.hpp"
#include "comm/op.hpp"
#include "comm/tracing.hpp"
#include "common/config.hpp"
#include "common/status.hpp"
#include "exec/executor.hpp"
#include "exec/stream.hpp"
#include "common/reduction.hpp"
#include "plan/plan.hpp"
#include "transport/transport.hpp"
#include "tune/tuner.hpp"

namespace chorus {

// The shrink agreement's member list as the store holds it ("0,2,3"): parsed
// against nranks -- decimal ranks in 0..nranks-1, strictly increasing, at
// least one -- because the store's bytes come from the network.
Result<std::vector<int>> parseMemberList(std::span<const std::byte> list, int nranks);

// A grow's offer to one joining process (chorusCommGrow / chorusCommJoin),
// as the root store holds it: "v1 <size> <rank> <prefix>".  Parsed with
// bounds (size 2..2^20, rank in range, a key prefix of [A-Za-z0-9/_-],
// 1..256 characters) because the store's bytes come from the network.
struct GrowOffer {
  int size = 0;
  int rank = 0;
  std::string prefix;
};
std::string encodeGrowOffer(const GrowOffer& o);
Result<GrowOffer> parseGrowOffer(std::span<const std::byte> bytes);

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
  // The host group of every rank (equal values: one host; the tuner's
  // topology, from the ranks' host identities and CHORUS_HOST_ID).
  [[nodiscard]] const std::vector<int>& hostOf() const { return tuner_->topology().host_of; }
  // The registered transports this rank's peers go through, in preference
  // order, and the route key of the whole communicator (tune::routeKey: what
  // keys chorus-tune's corrections: "shm", "tcp", "shm+tcp", ...).
  [[nodiscard]] const std::vector<std::string>& transportNames() const { return transport_names_; }
  [[nodiscard]] std::string routeKey() const;

  // Runs ops as one unit: now on this thread (stream == nullptr) or queued on stream.
  Status submit(std::vector<OpDesc> ops, exec::Stream* stream);
  Status submitOne(OpDesc& op, exec::Stream* stream);

  // Collective over this communicator.  color < 0: *out = nullptr.
  // cfg: the new communicator's configuration; nullptr = this one's.
  Result<std::unique_ptr<Communicator>> split(int color, int key, const Config* cfg = nullptr);
  // Collective over the surviving ranks: a new communicator of the ranks that
  // joined the agreement (see chorusCommShrink).
  Result<std::unique_ptr<Communicator>> shrink(std::chrono::milliseconds window);
  // Breaks this communicator on every rank: here at once, on the others when
  // their watchdogs read the notice from the store (see chorusCommRevoke).
  // Any thread.
  void revoke();
  // Collective over this communicator's ranks and nnew processes calling
  // join(): a communicator of this one's ranks (same numbers) followed by the
  // joiners in the order they arrived (see chorusCommGrow).
  Result<std::unique_ptr<Communicator>> grow(int nnew);
  static Result<std::unique_ptr<Communicator>> join(const bootstrap::UniqueId& id, const Config& cfg);

  // The tuner's choice for a call of this shape (compressed to `wire`, as
  // the API resolved the call's compression) and its predicted time.
  struct Prediction {
    std::string algo;
    double seconds = 0;
  };
  Result<Prediction> predict(plan::Collective coll, size_t count, chorusDataType_t dtype, bool inplace,
                             const std::optional<WireFormat>& wire = std::nullopt);
  // Replaces the CHORUS_ALGO overrides (same syntax; "" = the cost model
  // decides) for later calls; every rank must set the same (chorusCommSetAlgo).
  Status setAlgorithms(std::string_view spec);

  void abort(const Status& why);
  // The error that broke the communicator (or ok).
  Status asyncError() const;
  // Waits for queued work, then stops the progress thread.
  void drain();

  Result<chorusRedOp_t> createPreMulSum(const Scalar& s, const void* device_scalar);
  Status destroyRedOp(chorusRedOp_t op);
  Status validateOp(chorusRedOp_t op, chorusDataType_t dtype) const;

  std::string& lastError() { return last_error_; }

  // The latest estimate of rank 0's trace clock minus this rank's (0 before
  // any estimate; estimates are made with CHORUS_TRACE).
  [[nodiscard]] int64_t clockOffsetNs() const { return tracing_.clockOffsetNs(); }
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
  Status fail(Status st);

  int rank_ = 0, nranks_ = 1;
  Config cfg_;
  bootstrap::UniqueId id_;
  std::string prefix_;
  std::shared_ptr<bootstrap::StoreServer> server_;  // rank 0 of the root communicator
  std::shared_ptr<bootstrap::Store> base_store_;
  std::unique_ptr<bootstrap::Store> store_;
  int split_seq_ = 0;
  int shrink_seq_ = 0;
  int grow_seq_ = 0;
  uint64_t op_seq_ = 0;   // collectives issued on this communicator (the "#N" in messages)
  uint64_t p2p_seq_ = 0;  // sends and receives issued (numbered apart)
  comm::Health health_;

  std::vector<std::unique_ptr<transport::Transport>> transports_;  // the registry's choice, in preference order
  std::vector<std::string> transport_names_;
  comm::BoardCalls board_;
  std::unique_ptr<exec::Executor> executor_;
  plan::Registry registry_;
  bool registry_loaded_ = false;  // init loads (and proves) the plans before the rendezvous
  std::unique_ptr<tune::Tuner> tuner_;
  comm::CallPlanner planner_;
  comm::Tracing tracing_;
  comm::Engine engine_;

  mutable std::mutex err_mu_;
  Status error_;  // sticky: set when the communicator breaks
  std::atomic<bool> broken_{false};
  std::string last_error_;
};

}  // namespace chorus
