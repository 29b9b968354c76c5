// ProcessGroupChorus: the torch.distributed ("c10d") backend "chorus", for
// torch 1.13, whose backends derive from c10d::ProcessGroup.
//
// Every operation is queued, in the caller's program order, to one worker
// thread per process group, which runs it with blocking chorus calls; the
// returned Work completes (or fails with chorus's message) when it has run.
// One FIFO keeps chorus's contract that operations on a communicator match
// across ranks in issue order, and that a communicator is used by one thread.
//
// Bootstrap: rank 0 of the group creates a chorusUniqueId and publishes it in
// the c10d Store that init_process_group / new_group hands the backend; the
// other ranks read it from there.  No extra port or variable is needed.
//
// Receive from any source (torch's recv without src) has no chorus call:
// chorus matches a receive to one named peer.  The backend builds it from the
// Store, the one channel every rank can write and read (see SendLedger).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chorus/chorus.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace chorus_torch {

// The communicator, shared by the group and its Work objects so that a Work
// whose wait() times out can abort it even after the group is gone.
class CommHandle {
 public:
  explicit CommHandle(chorusComm_t c) : comm_(c) {}
  ~CommHandle();
  CommHandle(const CommHandle&) = delete;
  CommHandle& operator=(const CommHandle&) = delete;

  chorusComm_t get() const { return comm_; }
  // Any thread.  Makes every pending and future call on the comm fail.
  void abort();
  bool aborted() const { return aborted_.load(); }

 private:
  chorusComm_t comm_;
  std::atomic<bool> aborted_{false};
};

class ChorusWork : public c10d::Work {
 public:
  // `inputs` are what the profiler records as the op's input shapes (a
  // RecordFunction named "chorus:<op>", as gloo records "gloo:<op>", that
  // ends when the work completes).
  ChorusWork(int rank, c10d::OpType type, const std::vector<at::Tensor>& inputs, std::vector<at::Tensor> outputs,
             std::shared_ptr<CommHandle> comm, std::chrono::milliseconds defaultTimeout);

  // Throws chorus's error if the operation failed.  With timeout 0 it waits
  // up to the op's timeout (the per-call option, else the process group's);
  // on expiry it aborts the communicator (its buffers may still be in use by
  // a peer-less transfer) and throws.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  std::vector<at::Tensor> result() override { return outputs_; }
  // Completes with the output tensors (DDP's reducer and communication hooks
  // chain on it) or with the op's error.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // The peer a recv (from a given or any source) received from, once it has
  // completed; throws for other ops, as torch's own backends do.
  int sourceRank() const override;

  // Completes the future, then the work.  Once, on any thread.
  void complete(std::exception_ptr error);
  // Worker thread: complete() now if no one has the future yet (so no
  // callback can run on the worker) and return true; else return false, and
  // the caller must complete() it on another thread.
  bool completeIfNoFuture(std::exception_ptr error);
  // Worker thread only, before complete().
  void setSourceRank(int rank) { sourceRank_.store(rank); }
  // The op's timeout (its per-call option, else the group's).
  std::chrono::milliseconds timeout() const { return defaultTimeout_; }

 private:
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<CommHandle> comm_;
  std::chrono::milliseconds defaultTimeout_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::mutex futureMu_;
  bool futureHandedOut_ = false;  // guarded by futureMu_
  std::atomic<int> sourceRank_{-1};
};

// Completes works whose future someone holds.  A future's callbacks run on
// the thread that completes it, and a callback may issue another op of the
// group and wait for it (PowerSGD's hook does, twice per bucket): on the
// worker that would wait for the worker itself.  So those completions run
// here, each on an idle thread, a new one when every thread is busy (a
// callback blocked on a later op holds its thread until that op, which
// another thread completes, is done).
class Completer {
 public:
  Completer() = default;
  ~Completer();  // runs what is queued, then joins
  Completer(const Completer&) = delete;
  Completer& operator=(const Completer&) = delete;
  void post(std::function<void()> fn);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  int idle_ = 0;                             // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::vector<std::thread> threads_;         // guarded by mu_
};

// The Store side of receive-from-any-source (see the .cpp for why this design).
//
// Every send of the group counts, per destination, the messages this rank
// has sent it; a background thread publishes the counts in the Store
// ("chorus/p2p/<group nonce>/<dst>/<src>" = decimal count).  The sender's only
// work is an increment and, when the publisher sleeps, a wake-up; Store
// traffic happens off the critical path, at most one write per destination
// per kPublishIntervalMs while sends continue, none while they do not.
// A receive from any source compares each peer's published count with the
// number of messages it has itself received from that peer (by any recv):
// a peer whose count is larger has a message pending, which a plain chorus
// receive from that peer then matches, because chorus delivers each pair's
// messages in order.  It polls the Store only while no peer qualifies.
class SendLedger {
 public:
  SendLedger(c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank, int size);
  ~SendLedger();
  SendLedger(const SendLedger&) = delete;
  SendLedger& operator=(const SendLedger&) = delete;

  // Worker thread, just before each chorusSend to dst.
  void sent(int dst);
  // Worker thread, after each completed receive from src.
  void received(int src) { ++received_[src]; }
  // Worker thread: a peer with a message pending for this rank, waiting up to
  // `timeout` (polling the Store with backoff); throws on timeout (naming the
  // counts it saw) or when the communicator is aborted.
  int pendingPeer(std::chrono::milliseconds timeout, const CommHandle& comm);

  static constexpr int kPublishIntervalMs = 1;

 private:
  std::string key(int dst, int src) const;
  void publishLoop();

  c10::intrusive_ptr<c10d::Store> store_;
  const std::string prefix_;
  const int rank_;
  const int size_;

  // Receiver side: worker thread only.
  std::vector<uint64_t> received_;
  std::vector<uint64_t> seen_;  // the peers' last published counts to this rank
  int nextPeer_ = 0;            // round-robin start, so no peer starves another

  // Sender side.
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> sent_;       // guarded by mu_
  std::vector<uint64_t> published_;  // publisher thread only
  bool dirty_ = false;               // guarded by mu_
  bool stop_ = false;                // guarded by mu_
  std::string error_;                // guarded by mu_: the Store write that failed
  std::thread publisher_;
};

class ProcessGroupChorus : public c10d::ProcessGroup {
 public:
  // Blocks until every rank of the group has joined (or the store times out).
  // reproducible: chorusConfig_t.reproducible (-1: CHORUS_REPRODUCIBLE, else
  // a CHORUS_REPRODUCIBLE_* mode).
  ProcessGroupChorus(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout, int reproducible = -1);
  ~ProcessGroupChorus() override;

  const std::string getBackendName() const override { return "chorus"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  // chorus.torch.compressed_allreduce_hook: an fp32 allreduce (sum, or the
  // average) whose wire format is CHORUS_COMPRESS_BF16 or _FP8 with fp8Block
  // (chorusAllReduceEx), in place.
  c10::intrusive_ptr<c10d::Work> compressedAllreduce(const at::Tensor& t, int compress, int fp8_block, bool average);
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

  // batch_isend_irecv: the sends and receives issued between these two run
  // as one chorus group (chorusGroupStart/End), so that they complete in any
  // order without deadlock, as the batch's contract is; their works complete
  // together.
  void startCoalescing() override;
  void endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>& reqs) override;

  // Any thread: fails every queued and future operation of this group.
  void abort();

  // ---- Surviving a failure (chorusCommRevoke / Shrink / Grow / Join).  torch
  // 1.13's ProcessGroup fixes its rank and size at construction, so a
  // reconfiguration yields a new group over the new communicator; newer
  // torch's supportsReconfigure()/reconfigure() map onto these
  // (chorus.torch.reconfigure installs the new group in place of this one).
  bool supportsReconfigure() const { return true; }
  // Any thread: every rank's in-flight and later operations on this group
  // fail promptly with chorusRevoked (chorusCommRevoke).
  void revoke();
  // Every surviving rank, after a failure (and usually a revoke): waits until
  // this group's queue has drained (every queued op fails fast once revoked),
  // then returns the group of the ranks still alive, renumbered in order.
  c10::intrusive_ptr<ProcessGroupChorus> shrink();
  // Every rank of a healthy group, while `nnew` new processes call join():
  // the group of this group's ranks followed by the joiners.
  c10::intrusive_ptr<ProcessGroupChorus> grow(int nnew);
  // A new process: joins the group whose root unique id is `id` (see
  // uniqueId()) when its ranks grow; `store` is a torch Store with the same
  // keys as theirs (the any-source receive's counts live there).
  static c10::intrusive_ptr<ProcessGroupChorus> join(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const chorusUniqueId& id, std::chrono::milliseconds timeout);
  // The unique id a joiner needs: that of the job's first communicator.
  const chorusUniqueId& uniqueId() const { return id_; }

  // Adopts a communicator made by shrink/grow/join (collective over its
  // ranks: they agree on a fresh key prefix for the any-source receive).
  ProcessGroupChorus(const c10::intrusive_ptr<c10d::Store>& store, chorusComm_t comm, const chorusUniqueId& id,
                     std::chrono::milliseconds timeout);

 private:
  using Task = std::function<void()>;  // runs on the worker, may throw

  // Queues task.  timeout: the op's per-call option (kUnsetTimeout: the
  // group's).  inputs: the profiler's input tensors (default: outputs).
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, std::vector<at::Tensor> outputs, Task task,
                                         std::chrono::milliseconds timeout = c10d::kUnsetTimeout,
                                         const std::vector<at::Tensor>* inputs = nullptr);
  c10::intrusive_ptr<c10d::Work> sparseAllreduce(const at::Tensor& t, const c10d::AllreduceOptions& opts);
  void workerLoop();

  std::shared_ptr<CommHandle> comm_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<SendLedger> ledger_;  // used by the worker thread only
  std::unique_ptr<Completer> completer_;
  ChorusWork* running_ = nullptr;       // worker thread only: the work whose task runs

  // One queue entry: one op, or a coalesced batch run as one chorus group.
  struct Item {
    std::vector<std::pair<c10::intrusive_ptr<ChorusWork>, Task>> ops;
    bool grouped = false;
  };
  void run(Item& item);
  // Waits until no op is queued or running (they fail fast after a revoke).
  void waitIdle();
  void start(const c10::intrusive_ptr<c10d::Store>& store, const std::string& ledgerPrefix);

  c10::intrusive_ptr<c10d::Store> store_;
  chorusUniqueId id_{};

  std::mutex mu_;
  std::condition_variable idleCv_;
  bool busy_ = false;       // guarded by mu_: the worker runs an item
  std::condition_variable cv_;
  std::deque<Item> queue_;  // guarded by mu_
  bool stop_ = false;       // guarded by mu_
  bool coalescing_ = false; // guarded by mu_
  Item coalesced_;          // guarded by mu_: the batch being coalesced
  std::thread worker_;
};

}  // namespace chorus_torch
