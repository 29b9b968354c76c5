// ProcessGroupChorus (see process_group_chorus.hpp) and its Python module,
// chorus._chorus_torch, kept in one translation unit because every file that
// includes torch's headers costs a minute of compile time.

#include "process_group_chorus.hpp"

#include <chorus/sizes.hpp>

#include <torch/csrc/utils/pybind.h>
#include <pybind11/chrono.h>

#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace chorus_torch {
namespace {

constexpr const char* kUniqueIdKey = "chorus/unique_id";

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("chorus backend: " + what); }

// Throws the communicator's (or this thread's) last chorus message.
void check(chorusResult_t r, chorusComm_t comm, const char* op) {
  if (r == chorusSuccess) return;
  std::string msg = chorusGetLastError(comm);
  if (msg.empty()) msg = chorusGetErrorString(r);
  fail(std::string(op) + " failed: " + msg + " [" + chorusGetErrorString(r) + "]");
}

chorusDataType_t toChorus(at::ScalarType t, const char* op) {
  switch (t) {
    case at::kChar: return chorusInt8;
    case at::kByte: return chorusUint8;
    case at::kBool: return chorusUint8;
    case at::kInt: return chorusInt32;
    case at::kLong: return chorusInt64;
    case at::kHalf: return chorusFloat16;
    case at::kFloat: return chorusFloat32;
    case at::kDouble: return chorusFloat64;
    case at::kBFloat16: return chorusBfloat16;
    default:
      fail(std::string(op) + ": dtype " + c10::toString(t) +
           " is not supported (int8, uint8, bool, int32, int64, float16, bfloat16, float32, float64)");
  }
}

void checkTensor(const at::Tensor& t, const char* op) {
  if (!t.device().is_cpu())
    fail(std::string(op) + ": tensor on " + t.device().str() + "; the chorus backend works on CPU tensors");
  if (!t.is_contiguous()) fail(std::string(op) + ": tensor is not contiguous (call .contiguous())");
  (void)toChorus(t.scalar_type(), op);
}

const at::Tensor& single(const std::vector<at::Tensor>& ts, const char* op) {
  if (ts.size() != 1)
    fail(std::string(op) + ": expected exactly one tensor per process, got " + std::to_string(ts.size()));
  checkTensor(ts[0], op);
  return ts[0];
}

void checkList(const std::vector<at::Tensor>& list, const at::Tensor& like, size_t n, const char* op) {
  if (list.size() != n)
    fail(std::string(op) + ": expected a list of " + std::to_string(n) + " tensors (one per rank), got " +
         std::to_string(list.size()));
  for (const at::Tensor& t : list) {
    checkTensor(t, op);
    if (t.scalar_type() != like.scalar_type() || t.numel() != like.numel())
      fail(std::string(op) + ": list tensor of " + std::to_string(t.numel()) + " x " +
           c10::toString(t.scalar_type()) + " does not match the input's " + std::to_string(like.numel()) + " x " +
           c10::toString(like.scalar_type()));
  }
}

at::Tensor flatten(const std::vector<at::Tensor>& list) {
  std::vector<at::Tensor> flat;
  flat.reserve(list.size());
  for (const at::Tensor& t : list) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& list) {
  int64_t off = 0;
  for (at::Tensor& t : list) {
    t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}

// A chorus reduction op for a torch ReduceOp on a dtype; destroys a
// PreMulSum op it created.  Worker thread only (it uses the communicator).
class RedOp {
 public:
  RedOp(const c10d::ReduceOp& op, at::ScalarType dtype, chorusComm_t comm) : comm_(comm) {
    const bool isBool = dtype == at::kBool;
    switch (op.op_) {
      case c10d::ReduceOp::SUM: op_ = isBool ? chorusMax : chorusSum; break;  // logical or, as NCCL's backend
      case c10d::ReduceOp::PRODUCT: op_ = isBool ? chorusMin : chorusProd; break;
      case c10d::ReduceOp::MIN: op_ = chorusMin; break;
      case c10d::ReduceOp::MAX: op_ = chorusMax; break;
      case c10d::ReduceOp::AVG:
        if (isBool) fail("ReduceOp.AVG on bool tensors is undefined");
        op_ = chorusAvg;
        break;
      case c10d::ReduceOp::PREMUL_SUM: {
        // Only torch's _make_nccl_premul_sum creates PREMUL_SUM, always with
        // this supplement type (ProcessGroupNCCL makes the same cast).
        auto* sup = static_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
        if (sup == nullptr) fail("ReduceOp.PREMUL_SUM without a factor");
        double factor = sup->tensor_factors.empty() ? sup->double_factor
                                                    : sup->tensor_factors.front().to(at::kCPU).item<double>();
        scalar_ = at::scalar_tensor(factor, at::TensorOptions().dtype(dtype));
        check(chorusRedOpCreatePreMulSum(&op_, scalar_.data_ptr(), toChorus(dtype, "PREMUL_SUM"),
                                         chorusScalarHostImmediate, comm),
              comm, "PREMUL_SUM");
        created_ = true;
        break;
      }
      default:
        fail("ReduceOp " + std::to_string(static_cast<int>(op.op_)) +
             " (BAND/BOR/BXOR) is not supported by chorus; use SUM, PRODUCT, MIN, MAX, AVG or PREMUL_SUM");
    }
  }
  ~RedOp() {
    if (created_) (void)chorusRedOpDestroy(op_, comm_);
  }
  RedOp(const RedOp&) = delete;
  RedOp& operator=(const RedOp&) = delete;
  chorusRedOp_t get() const { return op_; }

 private:
  chorusComm_t comm_;
  chorusRedOp_t op_ = chorusSum;
  at::Tensor scalar_;
  bool created_ = false;
};

}  // namespace

// ---------------------------------------------------------------- CommHandle

CommHandle::~CommHandle() {
  if (comm_ != nullptr) (void)chorusCommDestroy(comm_);
}

void CommHandle::abort() {
  if (!aborted_.exchange(true)) (void)chorusCommAbort(comm_);
}

// ---------------------------------------------------------------- ChorusWork

ChorusWork::ChorusWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                       std::shared_ptr<CommHandle> comm, std::chrono::milliseconds defaultTimeout)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      comm_(std::move(comm)),
      defaultTimeout_(defaultTimeout),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

void ChorusWork::complete(std::exception_ptr error) {
  // The future first: DDP chains its bucket callbacks on it.
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
}

bool ChorusWork::wait(std::chrono::milliseconds timeout) {
  const std::chrono::milliseconds limit = timeout > kNoTimeout ? timeout : defaultTimeout_;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, limit, [&] { return completed_; })) {
      lock.unlock();
      // The operation may still be writing its outputs, and its peers may be
      // gone: abort so that it, and everything queued after it, fails now.
      comm_->abort();
      fail(c10d::opTypeToString(opType_) + " on rank " + std::to_string(rank_) + " did not complete within " +
           std::to_string(limit.count()) +
           " ms; the communicator was aborted (a peer may have died or stopped calling collectives; raise the "
           "timeout of init_process_group if the work is just slow)");
    }
    if (exception_) std::rethrow_exception(exception_);
  }
  return true;
}

// ---------------------------------------------------------------- ProcessGroupChorus

ProcessGroupChorus::ProcessGroupChorus(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                       std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), timeout_(timeout) {
  chorusUniqueId id;
  if (rank == 0) {
    check(chorusGetUniqueId(&id), nullptr, "chorusGetUniqueId");
    store->set(kUniqueIdKey, std::vector<uint8_t>(id.internal, id.internal + CHORUS_UNIQUE_ID_BYTES));
  } else {
    std::vector<uint8_t> bytes = store->get(kUniqueIdKey);  // blocks up to the store's timeout
    if (bytes.size() != CHORUS_UNIQUE_ID_BYTES)
      fail("the store's '" + std::string(kUniqueIdKey) + "' holds " + std::to_string(bytes.size()) +
           " bytes, not a chorus unique id (" + std::to_string(CHORUS_UNIQUE_ID_BYTES) +
           "); is another backend using the same store prefix?");
    std::memcpy(id.internal, bytes.data(), CHORUS_UNIQUE_ID_BYTES);
  }
  chorusComm_t comm = nullptr;
  check(chorusCommInitRank(&comm, size, id, rank), nullptr, "chorusCommInitRank");
  comm_ = std::make_shared<CommHandle>(comm);
  init();
  worker_ = std::thread([this] { workerLoop(); });
}

ProcessGroupChorus::~ProcessGroupChorus() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (!worker_.joinable()) return;
  // The worker runs (or fails) what is still queued.  It may need the GIL to
  // free a tensor that Python also references, and Python may be dropping
  // the group right now while holding the GIL: release it for the join.
  if (PyGILState_Check() != 0) {
    pybind11::gil_scoped_release nogil;
    worker_.join();
  } else {
    worker_.join();
  }
}

void ProcessGroupChorus::abort() {
  comm_->abort();
}

void ProcessGroupChorus::workerLoop() {
  for (;;) {
    std::pair<c10::intrusive_ptr<ChorusWork>, Task> item;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    try {
      item.second();
    } catch (...) {
      error = std::current_exception();
    }
    item.second = nullptr;  // drop the task's tensors before waking waiters
    item.first->complete(error);
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
                                                           Task task) {
  auto work = c10::make_intrusive<ChorusWork>(rank_, type, std::move(outputs), comm_, timeout_);
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.emplace_back(work, std::move(task));
  }
  cv_.notify_one();
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  at::Tensor t = single(tensors, "broadcast");
  const int root = static_cast<int>(opts.rootRank);
  chorusComm_t c = comm_->get();
  return enqueue(c10d::OpType::BROADCAST, tensors, [t, root, c] {
    check(chorusBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), toChorus(t.scalar_type(), "broadcast"), root, c,
                          nullptr),
          c, "broadcast");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  at::Tensor t = single(tensors, "allreduce");
  c10d::ReduceOp op = opts.reduceOp;
  chorusComm_t c = comm_->get();
  return enqueue(c10d::OpType::ALLREDUCE, tensors, [t, op, c] {
    RedOp rop(op, t.scalar_type(), c);
    check(chorusAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), toChorus(t.scalar_type(), "allreduce"), rop.get(),
                          c, nullptr),
          c, "allreduce");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                       const c10d::AllreduceCoalescedOptions& opts) {
  if (tensors.empty()) fail("allreduce_coalesced: no tensors");
  for (const at::Tensor& t : tensors) {
    checkTensor(t, "allreduce_coalesced");
    if (t.scalar_type() != tensors[0].scalar_type())
      fail("allreduce_coalesced: tensors of different dtypes (" + std::string(c10::toString(t.scalar_type())) +
           " and " + c10::toString(tensors[0].scalar_type()) + ") cannot be coalesced");
  }
  c10d::ReduceOp op = opts.reduceOp;
  chorusComm_t c = comm_->get();
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, tensors, [tensors, op, c]() mutable {
    // One collective on a packed copy: far cheaper than one per small tensor.
    at::Tensor flat = flatten(tensors);
    RedOp rop(op, flat.scalar_type(), c);
    check(chorusAllReduce(flat.data_ptr(), flat.data_ptr(), flat.numel(),
                          toChorus(flat.scalar_type(), "allreduce_coalesced"), rop.get(), c, nullptr),
          c, "allreduce_coalesced");
    unflatten(flat, tensors);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  at::Tensor t = single(tensors, "reduce");
  c10d::ReduceOp op = opts.reduceOp;
  const int root = static_cast<int>(opts.rootRank);
  chorusComm_t c = comm_->get();
  return enqueue(c10d::OpType::REDUCE, tensors, [t, op, root, c] {
    RedOp rop(op, t.scalar_type(), c);
    check(chorusReduce(t.data_ptr(), t.data_ptr(), t.numel(), toChorus(t.scalar_type(), "reduce"), rop.get(), root,
                       c, nullptr),
          c, "reduce");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions&) {
  at::Tensor in = single(inputs, "allgather");
  if (outputs.size() != 1) fail("allgather: expected one output list, got " + std::to_string(outputs.size()));
  checkList(outputs[0], in, static_cast<size_t>(size_), "allgather");
  std::vector<at::Tensor> outs = outputs[0];
  chorusComm_t c = comm_->get();
  const int n = size_;
  return enqueue(c10d::OpType::ALLGATHER, outs, [in, outs, n, c]() mutable {
    at::Tensor flat = at::empty({in.numel() * n}, in.options());
    check(chorusAllGather(in.data_ptr(), flat.data_ptr(), in.numel(), toChorus(in.scalar_type(), "allgather"), c,
                          nullptr),
          c, "allgather");
    unflatten(flat, outs);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::AllgatherOptions&) {
  checkTensor(input, "_allgather_base");
  checkTensor(output, "_allgather_base");
  if (output.scalar_type() != input.scalar_type()) fail("_allgather_base: output and input have different dtypes");
  if (std::string e = chorus::sizes::multiple("_allgather_base", "output.numel()", output.numel(), "input.numel()",
                                              input.numel(), size_);
      !e.empty())
    fail(e);
  at::Tensor in = input, out = output;
  chorusComm_t c = comm_->get();
  return enqueue(c10d::OpType::_ALLGATHER_BASE, {output}, [in, out, c] {
    check(chorusAllGather(in.data_ptr(), out.data_ptr(), in.numel(), toChorus(in.scalar_type(), "_allgather_base"),
                          c, nullptr),
          c, "_allgather_base");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  if (outputLists.size() != static_cast<size_t>(size_))
    fail("allgather_coalesced: expected " + std::to_string(size_) + " output lists, got " +
         std::to_string(outputLists.size()));
  if (inputs.empty()) fail("allgather_coalesced: no input tensors");
  for (const at::Tensor& t : inputs) {
    checkTensor(t, "allgather_coalesced");
    if (t.scalar_type() != inputs[0].scalar_type()) fail("allgather_coalesced: inputs of different dtypes");
  }
  for (const auto& list : outputLists) {
    if (list.size() != inputs.size()) fail("allgather_coalesced: an output list does not match the inputs");
    for (size_t i = 0; i < list.size(); ++i) {
      checkTensor(list[i], "allgather_coalesced");
      if (list[i].numel() != inputs[i].numel() || list[i].scalar_type() != inputs[i].scalar_type())
        fail("allgather_coalesced: output tensor " + std::to_string(i) + " does not match its input");
    }
  }
  std::vector<at::Tensor> all;
  for (const auto& list : outputLists) all.insert(all.end(), list.begin(), list.end());
  chorusComm_t c = comm_->get();
  const int n = size_;
  return enqueue(c10d::OpType::ALLGATHER_COALESCED, all, [inputs, all, n, c]() mutable {
    // Rank r's packed inputs land at r * packed, in the order of `all`.
    at::Tensor packed = flatten(inputs);
    at::Tensor flat = at::empty({packed.numel() * n}, packed.options());
    check(chorusAllGather(packed.data_ptr(), flat.data_ptr(), packed.numel(),
                          toChorus(packed.scalar_type(), "allgather_coalesced"), c, nullptr),
          c, "allgather_coalesced");
    unflatten(flat, all);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::GatherOptions& opts) {
  at::Tensor in = single(inputs, "gather");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    if (outputs.size() != 1) fail("gather: the root expects one output list, got " + std::to_string(outputs.size()));
    checkList(outputs[0], in, static_cast<size_t>(size_), "gather");
    outs = outputs[0];
  } else if (!outputs.empty() && !outputs[0].empty()) {
    fail("gather: only the root (" + std::to_string(root) + ") may pass output tensors");
  }
  chorusComm_t c = comm_->get();
  const int n = size_;
  const bool isRoot = rank_ == root;
  return enqueue(c10d::OpType::GATHER, outs, [in, outs, n, c, root, isRoot]() mutable {
    at::Tensor flat = isRoot ? at::empty({in.numel() * n}, in.options()) : at::Tensor();
    check(chorusGather(in.data_ptr(), isRoot ? flat.data_ptr() : nullptr, in.numel(),
                       toChorus(in.scalar_type(), "gather"), root, c, nullptr),
          c, "gather");
    if (isRoot) unflatten(flat, outs);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ScatterOptions& opts) {
  at::Tensor out = single(outputs, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> ins;
  if (rank_ == root) {
    if (inputs.size() != 1) fail("scatter: the root expects one input list, got " + std::to_string(inputs.size()));
    checkList(inputs[0], out, static_cast<size_t>(size_), "scatter");
    ins = inputs[0];
  } else if (!inputs.empty() && !inputs[0].empty()) {
    fail("scatter: only the root (" + std::to_string(root) + ") may pass input tensors");
  }
  chorusComm_t c = comm_->get();
  const bool isRoot = rank_ == root;
  return enqueue(c10d::OpType::SCATTER, outputs, [out, ins, c, root, isRoot] {
    at::Tensor flat = isRoot ? flatten(ins) : at::Tensor();
    check(chorusScatter(isRoot ? flat.data_ptr() : nullptr, out.data_ptr(), out.numel(),
                        toChorus(out.scalar_type(), "scatter"), root, c, nullptr),
          c, "scatter");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                                  const c10d::ReduceScatterOptions& opts) {
  at::Tensor out = single(outputs, "reduce_scatter");
  if (inputs.size() != 1) fail("reduce_scatter: expected one input list, got " + std::to_string(inputs.size()));
  checkList(inputs[0], out, static_cast<size_t>(size_), "reduce_scatter");
  std::vector<at::Tensor> ins = inputs[0];
  c10d::ReduceOp op = opts.reduceOp;
  chorusComm_t c = comm_->get();
  return enqueue(c10d::OpType::REDUCE_SCATTER, outputs, [out, ins, op, c] {
    at::Tensor flat = flatten(ins);
    RedOp rop(op, out.scalar_type(), c);
    check(chorusReduceScatter(flat.data_ptr(), out.data_ptr(), out.numel(),
                              toChorus(out.scalar_type(), "reduce_scatter"), rop.get(), c, nullptr),
          c, "reduce_scatter");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                        const c10d::ReduceScatterOptions& opts) {
  checkTensor(input, "_reduce_scatter_base");
  checkTensor(output, "_reduce_scatter_base");
  if (output.scalar_type() != input.scalar_type()) fail("_reduce_scatter_base: output and input have different dtypes");
  if (std::string e = chorus::sizes::multiple("_reduce_scatter_base", "input.numel()", input.numel(),
                                              "output.numel()", output.numel(), size_);
      !e.empty())
    fail(e);
  at::Tensor in = input, out = output;
  c10d::ReduceOp op = opts.reduceOp;
  chorusComm_t c = comm_->get();
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, [in, out, op, c] {
    RedOp rop(op, out.scalar_type(), c);
    check(chorusReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(),
                              toChorus(out.scalar_type(), "_reduce_scatter_base"), rop.get(), c, nullptr),
          c, "_reduce_scatter_base");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                 std::vector<int64_t>& outputSplitSizes,
                                                                 std::vector<int64_t>& inputSplitSizes,
                                                                 const c10d::AllToAllOptions&) {
  checkTensor(input, "alltoall_base");
  checkTensor(output, "alltoall_base");
  if (input.scalar_type() != output.scalar_type()) fail("alltoall_base: input and output dtypes differ");
  at::Tensor in = input, out = output;
  chorusComm_t c = comm_->get();
  const auto n = static_cast<size_t>(size_);
  if (outputSplitSizes.empty() && inputSplitSizes.empty()) {
    if (in.numel() % size_ != 0 || out.numel() != in.numel())
      fail("alltoall_base: without split sizes input and output must have the same numel, a multiple of "
           "world_size " + std::to_string(size_) + " (input " + std::to_string(in.numel()) + ", output " +
           std::to_string(out.numel()) + ")");
    return enqueue(c10d::OpType::ALLTOALL_BASE, {output}, [in, out, n, c] {
      check(chorusAllToAll(in.data_ptr(), out.data_ptr(), in.numel() / n, toChorus(in.scalar_type(), "alltoall_base"),
                           c, nullptr),
            c, "alltoall_base");
    });
  }
  // Split sizes count rows (dim 0); chorus counts elements.
  auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
    std::vector<size_t> cnt(n);
    const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
    const int64_t row = rows > 0 ? t.numel() / rows : 0;
    if (splits.empty()) {
      if (rows % size_ != 0) fail(std::string("alltoall_base: ") + which + " rows not divisible by world_size");
      for (auto& x : cnt) x = static_cast<size_t>(rows / size_ * row);
    } else {
      if (splits.size() != n)
        fail(std::string("alltoall_base: ") + which + " split sizes have " + std::to_string(splits.size()) +
             " entries, world_size is " + std::to_string(size_));
      if (std::accumulate(splits.begin(), splits.end(), int64_t{0}) != rows)
        fail(std::string("alltoall_base: ") + which + " split sizes do not sum to its dim 0 (" +
             std::to_string(rows) + ")");
      for (size_t i = 0; i < n; ++i) cnt[i] = static_cast<size_t>(splits[i] * row);
    }
    return cnt;
  };
  auto displs = [](const std::vector<size_t>& cnt) {
    std::vector<size_t> d(cnt.size());
    size_t off = 0;
    for (size_t i = 0; i < cnt.size(); ++i) { d[i] = off; off += cnt[i]; }
    return d;
  };
  std::vector<size_t> sc = counts(in, inputSplitSizes, "input"), rc = counts(out, outputSplitSizes, "output");
  std::vector<size_t> sd = displs(sc), rd = displs(rc);
  return enqueue(c10d::OpType::ALLTOALL_BASE, {output}, [in, out, sc, sd, rc, rd, c] {
    check(chorusAllToAllV(in.data_ptr(), sc.data(), sd.data(), out.data_ptr(), rc.data(), rd.data(),
                          toChorus(in.scalar_type(), "alltoall_base"), c, nullptr),
          c, "alltoall_base");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions&) {
  const auto n = static_cast<size_t>(size_);
  if (inputs.size() != n || outputs.size() != n)
    fail("alltoall: expected " + std::to_string(n) + " input and output tensors, got " +
         std::to_string(inputs.size()) + " and " + std::to_string(outputs.size()));
  std::vector<size_t> sc(n), rc(n), sd(n), rd(n);
  size_t so = 0, ro = 0;
  for (size_t i = 0; i < n; ++i) {
    checkTensor(inputs[i], "alltoall");
    checkTensor(outputs[i], "alltoall");
    if (inputs[i].scalar_type() != inputs[0].scalar_type() || outputs[i].scalar_type() != inputs[0].scalar_type())
      fail("alltoall: all tensors must have one dtype");
    sc[i] = inputs[i].numel();
    sd[i] = so;
    so += sc[i];
    rc[i] = outputs[i].numel();
    rd[i] = ro;
    ro += rc[i];
  }
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  chorusComm_t c = comm_->get();
  return enqueue(c10d::OpType::ALLTOALL, outputs, [ins, outs, sc, sd, rc, rd, ro, c]() mutable {
    at::Tensor flatIn = flatten(ins);
    at::Tensor flatOut = at::empty({static_cast<int64_t>(ro)}, flatIn.options());
    check(chorusAllToAllV(flatIn.data_ptr(), sc.data(), sd.data(), flatOut.data_ptr(), rc.data(), rd.data(),
                          toChorus(flatIn.scalar_type(), "alltoall"), c, nullptr),
          c, "alltoall");
    unflatten(flatOut, outs);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::send(std::vector<at::Tensor>& tensors, int dstRank, int /*tag*/) {
  // chorus matches point-to-point messages by order per peer pair; tags are
  // not carried, so two sends to one peer arrive in the order issued.
  at::Tensor t = single(tensors, "send");
  chorusComm_t c = comm_->get();
  return enqueue(c10d::OpType::SEND, tensors, [t, dstRank, c] {
    check(chorusSend(t.data_ptr(), t.numel(), toChorus(t.scalar_type(), "send"), dstRank, c, nullptr), c, "send");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::recv(std::vector<at::Tensor>& tensors, int srcRank, int /*tag*/) {
  at::Tensor t = single(tensors, "recv");
  chorusComm_t c = comm_->get();
  return enqueue(c10d::OpType::RECV, tensors, [t, srcRank, c] {
    check(chorusRecv(t.data_ptr(), t.numel(), toChorus(t.scalar_type(), "recv"), srcRank, c, nullptr), c, "recv");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::barrier(const c10d::BarrierOptions&) {
  chorusComm_t c = comm_->get();
  // The FIFO worker runs this after every earlier operation of the group,
  // so the barrier also orders them, as gloo's does.
  return enqueue(c10d::OpType::BARRIER, {}, [c] { check(chorusBarrier(c, nullptr), c, "barrier"); });
}

}  // namespace chorus_torch

namespace py = pybind11;

PYBIND11_MODULE(_chorus_torch, m) {
  m.doc() = "The c10d ProcessGroup of the 'chorus' torch.distributed backend; use chorus.torch.";
  // Registers c10d's Python types (Store, ProcessGroup) that the signatures use.
  py::module_::import("torch.distributed");
  m.def(
      "create_process_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout) {
        c10::intrusive_ptr<c10d::ProcessGroup> pg =
            c10::make_intrusive<chorus_torch::ProcessGroupChorus>(store, rank, size, timeout);
        return pg;
      },
      py::arg("store"), py::arg("rank"), py::arg("world_size"), py::arg("timeout"),
      py::call_guard<py::gil_scoped_release>(),
      "Creates the chorus ProcessGroup of `world_size` ranks, rendezvousing through `store`.\n"
      "Blocks until every rank has joined.");
  m.def(
      "abort",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
        auto* chorusPg = dynamic_cast<chorus_torch::ProcessGroupChorus*>(pg.get());
        if (chorusPg == nullptr) throw py::type_error("abort: not a chorus process group");
        chorusPg->abort();
      },
      py::arg("process_group"), "Aborts a chorus process group: every pending and future operation fails.");
}
