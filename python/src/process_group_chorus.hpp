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
  ChorusWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::shared_ptr<CommHandle> comm,
             std::chrono::milliseconds defaultTimeout);

  // Throws chorus's error if the operation failed.  With timeout 0 it waits
  // up to the process group's timeout; on expiry it aborts the communicator
  // (its buffers may still be in use by a peer-less transfer) and throws.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // Worker thread only, once.
  void complete(std::exception_ptr error);

 private:
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<CommHandle> comm_;
  std::chrono::milliseconds defaultTimeout_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class ProcessGroupChorus : public c10d::ProcessGroup {
 public:
  // Blocks until every rank of the group has joined (or the store times out).
  ProcessGroupChorus(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout);
  ~ProcessGroupChorus() override;

  const std::string getBackendName() const override { return "chorus"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
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
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

  // Any thread: fails every queued and future operation of this group.
  void abort();

 private:
  using Task = std::function<void()>;  // runs on the worker, may throw

  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, std::vector<at::Tensor> outputs, Task task);
  void workerLoop();

  std::shared_ptr<CommHandle> comm_;
  std::chrono::milliseconds timeout_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<c10::intrusive_ptr<ChorusWork>, Task>> queue_;  // guarded by mu_
  bool stop_ = false;                                                    // guarded by mu_
  std::thread worker_;
};

}  // namespace chorus_torch
