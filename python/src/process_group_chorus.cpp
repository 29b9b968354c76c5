// ProcessGroupChorus (see process_group_chorus.hpp) and its Python module,
// chorus._chorus_torch, kept in one translation unit because every file that
// includes torch's headers costs a minute of compile time.

#include "process_group_chorus.hpp"

#include <chorus/sizes.hpp>

#include <torch/csrc/utils/pybind.h>
#include <pybind11/chrono.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

namespace chorus_torch {
namespace {

constexpr const char* kUniqueIdKey = "chorus/unique_id";

// The profiler's name of each op, "chorus:" and the name gloo uses after
// "gloo:" (torch's tests look events up by "<backend>:<op>"; as gloo's, the
// coalesced ops are recorded as the op they coalesce).
const char* profilingTitle(c10d::OpType t) {
  switch (t) {
    case c10d::OpType::BROADCAST: return "chorus:broadcast";
    case c10d::OpType::ALLREDUCE: return "chorus:all_reduce";
    case c10d::OpType::ALLREDUCE_COALESCED: return "chorus:all_reduce";
    case c10d::OpType::REDUCE: return "chorus:reduce";
    case c10d::OpType::ALLGATHER: return "chorus:all_gather";
    case c10d::OpType::_ALLGATHER_BASE: return "chorus:all_gather_into_tensor";
    case c10d::OpType::ALLGATHER_COALESCED: return "chorus:all_gather";
    case c10d::OpType::GATHER: return "chorus:gather";
    case c10d::OpType::SCATTER: return "chorus:scatter";
    case c10d::OpType::REDUCE_SCATTER: return "chorus:reduce_scatter";
    case c10d::OpType::_REDUCE_SCATTER_BASE: return "chorus:reduce_scatter_tensor";
    case c10d::OpType::ALLTOALL_BASE: return "chorus:all_to_all";
    case c10d::OpType::ALLTOALL: return "chorus:all_to_all";
    case c10d::OpType::SEND: return "chorus:send";
    case c10d::OpType::RECV: return "chorus:recv";
    case c10d::OpType::RECVANYSOURCE: return "chorus:recvAnySource";
    case c10d::OpType::BARRIER: return "chorus:barrier";
    default: return nullptr;
  }
}

// A short name for this group's instance of the ledger keys: a hash of the
// unique id, which every rank of the group holds and no earlier group shares
// (a re-created group in the same store must not read stale counts).
std::string groupNonce(const chorusUniqueId& id) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char ch : id.internal) {
    h ^= static_cast<uint8_t>(ch);
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

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

void checkPeer(int peer, int rank, int size, const char* op) {
  if (peer < 0 || peer >= size)
    fail(std::string(op) + ": peer rank " + std::to_string(peer) + " is out of range for a group of " +
         std::to_string(size) + " ranks (0.." + std::to_string(size - 1) + ")");
  if (peer == rank) fail(std::string(op) + ": peer rank " + std::to_string(peer) + " is this rank");
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

ChorusWork::ChorusWork(int rank, c10d::OpType type, const std::vector<at::Tensor>& inputs,
                       std::vector<at::Tensor> outputs, std::shared_ptr<CommHandle> comm,
                       std::chrono::milliseconds defaultTimeout)
    : c10d::Work(rank, type, profilingTitle(type), c10::optional<std::vector<at::Tensor>>(inputs)),
      outputs_(std::move(outputs)),
      comm_(std::move(comm)),
      defaultTimeout_(defaultTimeout),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

c10::intrusive_ptr<c10::ivalue::Future> ChorusWork::getFuture() {
  std::lock_guard<std::mutex> l(futureMu_);
  futureHandedOut_ = true;
  return future_;
}

bool ChorusWork::completeIfNoFuture(std::exception_ptr error) {
  {
    // Held while completing, so that a getFuture() racing with it returns
    // the completed future (whose later callbacks run on their caller).
    std::lock_guard<std::mutex> l(futureMu_);
    if (futureHandedOut_) return false;
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
  }
  finish(error);
  return true;
}

void ChorusWork::complete(std::exception_ptr error) {
  // The future first: DDP chains its bucket callbacks on it.
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
}

int ChorusWork::sourceRank() const {
  if (opType_ != c10d::OpType::RECV && opType_ != c10d::OpType::RECVANYSOURCE)
    fail("sourceRank() (Work._source_rank()) is defined for recv work only, not " + c10d::opTypeToString(opType_));
  const int r = sourceRank_.load();
  if (r < 0) fail("sourceRank() (Work._source_rank()): the recv has not completed; call wait() first");
  return r;
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

// ---------------------------------------------------------------- SendLedger
//
// Why the Store.  chorus matches each receive to one named peer and has no
// probe, so "receive the next message from whichever peer sends" needs a
// channel that any rank can write and this rank can read without naming the
// writer.  Inside chorus that would be a transport-level receive matched
// against the first arrival from a set of peers (what gloo's transport
// does); the backend alone has the c10d Store.  The alternatives considered:
//  - posting a receive to every peer and cancelling the losers: chorus
//    cannot cancel a posted receive, and a communicator runs one operation at
//    a time, so the posts would run one after another, not race;
//  - a header message before every payload (a probe built from messages):
//    still needs a wait on several peers at once, the thing chorus lacks;
//  - a synchronous Store write per send: correct, but it puts a Store round
//    trip (tens of microseconds over TCP) on every send's latency.
// So senders count, a background thread publishes the counts, and only a
// receive from any source reads them.  Cost on the send path: a mutex-guarded
// increment; Store traffic: at most one write per destination per
// kPublishIntervalMs of sending.  The receive finds a peer within about one
// publish interval plus a Store round trip of its send.

SendLedger::SendLedger(c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank, int size)
    : store_(std::move(store)),
      prefix_(std::move(prefix)),
      rank_(rank),
      size_(size),
      received_(static_cast<size_t>(size)),
      seen_(static_cast<size_t>(size)),
      sent_(static_cast<size_t>(size)),
      published_(static_cast<size_t>(size)) {}

SendLedger::~SendLedger() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (publisher_.joinable()) publisher_.join();
}

std::string SendLedger::key(int dst, int src) const {
  return prefix_ + std::to_string(dst) + "/" + std::to_string(src);
}

void SendLedger::sent(int dst) {
  {
    std::lock_guard<std::mutex> l(mu_);
    ++sent_[static_cast<size_t>(dst)];
    dirty_ = true;
  }
  // Started by the first send, so that groups that never send have no thread.
  if (!publisher_.joinable()) {
    publisher_ = std::thread([this] { publishLoop(); });
  } else {
    cv_.notify_one();  // no system call unless the publisher sleeps
  }
}

void SendLedger::publishLoop() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || dirty_; });
    if (stop_) return;
    dirty_ = false;
    std::vector<uint64_t> now = sent_;
    l.unlock();
    for (size_t d = 0; d < now.size(); ++d) {
      if (now[d] == published_[d]) continue;
      const std::string k = key(static_cast<int>(d), rank_);
      const std::string v = std::to_string(now[d]);
      try {
        store_->set(k, std::vector<uint8_t>(v.begin(), v.end()));
      } catch (const std::exception& e) {
        // The receivers' timeouts report it: no count advances any more.
        l.lock();
        error_ = "writing '" + k + "' to the store failed: " + e.what();
        return;
      }
      published_[d] = now[d];
    }
    l.lock();
    // A burst of sends costs one write per destination per interval.
    cv_.wait_for(l, std::chrono::milliseconds(kPublishIntervalMs), [&] { return stop_; });
  }
}

int SendLedger::pendingPeer(std::chrono::milliseconds timeout, const CommHandle& comm) {
  if (size_ < 2) fail("recv from any source: the group has one rank, no peer can send to it");
  const auto start = std::chrono::steady_clock::now();
  std::chrono::microseconds pause(20);
  for (;;) {
    for (int i = 0; i < size_; ++i) {
      const int p = (nextPeer_ + i) % size_;
      if (p == rank_) continue;
      const auto up = static_cast<size_t>(p);
      if (seen_[up] <= received_[up]) {
        const std::string k = key(rank_, p);
        if (store_->check({k})) {
          std::vector<uint8_t> v = store_->get(k);
          seen_[up] = std::stoull(std::string(v.begin(), v.end()));
        }
      }
      if (seen_[up] > received_[up]) {
        nextPeer_ = (p + 1) % size_;  // the next any-source receive asks the others first
        return p;
      }
    }
    if (comm.aborted()) fail("recv from any source on rank " + std::to_string(rank_) + ": the group was aborted");
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited >= timeout) {
      std::string counts;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        counts += (counts.empty() ? "" : ", ") + std::string("rank ") + std::to_string(p) + ": " +
                  std::to_string(received_[static_cast<size_t>(p)]) + " received / " +
                  std::to_string(seen_[static_cast<size_t>(p)]) + " sent";
      }
      fail("recv from any source on rank " + std::to_string(rank_) + ": no peer has sent it a message within " +
           std::to_string(timeout.count()) + " ms (timeout; " + counts + ")");
    }
    std::this_thread::sleep_for(
        std::min<std::chrono::microseconds>(pause, std::chrono::duration_cast<std::chrono::microseconds>(timeout - waited)));
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::microseconds(2000));
  }
}

// ---------------------------------------------------------------- ProcessGroupChorus

ProcessGroupChorus::ProcessGroupChorus(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                       std::chrono::milliseconds timeout, int reproducible)
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
  chorusConfig_t config = CHORUS_CONFIG_INITIALIZER;
  config.reproducible = reproducible;
  check(chorusCommInitRankConfig(&comm, size, id, rank, &config), nullptr, "chorusCommInitRankConfig");
  comm_ = std::make_shared<CommHandle>(comm);
  id_ = id;
  start(store, "chorus/p2p/" + groupNonce(id) + "/");
}

namespace {
int commRank(chorusComm_t c) {
  int r = -1;
  check(chorusCommUserRank(c, &r), c, "chorusCommUserRank");
  return r;
}
int commSize(chorusComm_t c) {
  int n = 0;
  check(chorusCommCount(c, &n), c, "chorusCommCount");
  return n;
}
}  // namespace

ProcessGroupChorus::ProcessGroupChorus(const c10::intrusive_ptr<c10d::Store>& store, chorusComm_t comm,
                                       const chorusUniqueId& id, std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(commRank(comm), commSize(comm)), timeout_(timeout) {
  comm_ = std::make_shared<CommHandle>(comm);
  id_ = id;
  // A fresh prefix for the any-source receive's counts, from rank 0: the old
  // group's counts (and a joiner's ignorance of them) must not leak in.
  std::array<uint64_t, 2> nonce{};
  if (rank_ == 0) {
    std::random_device rd;
    nonce = {(uint64_t{rd()} << 32) | rd(), (uint64_t{rd()} << 32) | rd()};
  }
  check(chorusBroadcast(nonce.data(), nonce.data(), nonce.size(), chorusUint64, 0, comm, nullptr), comm,
        "reconfigure (agreeing on the group's key prefix)");
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(nonce[0]),
                static_cast<unsigned long long>(nonce[1]));
  start(store, "chorus/p2p/" + groupNonce(id) + "/" + buf + "/");
}

void ProcessGroupChorus::start(const c10::intrusive_ptr<c10d::Store>& store, const std::string& ledgerPrefix) {
  store_ = store;
  ledger_ = std::make_unique<SendLedger>(store, ledgerPrefix, rank_, size_);
  completer_ = std::make_unique<Completer>();
  init();
  worker_ = std::thread([this] { workerLoop(); });
}

void ProcessGroupChorus::revoke() {
  check(chorusCommRevoke(comm_->get()), comm_->get(), "revoke");
}

void ProcessGroupChorus::waitIdle() {
  std::unique_lock<std::mutex> l(mu_);
  if (coalescing_) fail("reconfigure while coalescing (batch_isend_irecv): end the batch first");
  idleCv_.wait(l, [&] { return queue_.empty() && !busy_; });
}

c10::intrusive_ptr<ProcessGroupChorus> ProcessGroupChorus::shrink() {
  waitIdle();
  chorusComm_t nc = nullptr;
  check(chorusCommShrink(comm_->get(), CHORUS_SHRINK_DEFAULT, &nc), comm_->get(), "shrink");
  return c10::make_intrusive<ProcessGroupChorus>(store_, nc, id_, timeout_);
}

c10::intrusive_ptr<ProcessGroupChorus> ProcessGroupChorus::grow(int nnew) {
  if (nnew < 1) fail("grow: nnew=" + std::to_string(nnew) + " must be at least 1");
  waitIdle();
  chorusComm_t nc = nullptr;
  check(chorusCommGrow(comm_->get(), nnew, &nc), comm_->get(), "grow");
  return c10::make_intrusive<ProcessGroupChorus>(store_, nc, id_, timeout_);
}

c10::intrusive_ptr<ProcessGroupChorus> ProcessGroupChorus::join(const c10::intrusive_ptr<c10d::Store>& store,
                                                                const chorusUniqueId& id,
                                                                std::chrono::milliseconds timeout) {
  chorusComm_t nc = nullptr;
  check(chorusCommJoin(id, &nc), nullptr, "join");
  return c10::make_intrusive<ProcessGroupChorus>(store, nc, id, timeout);
}

ProcessGroupChorus::~ProcessGroupChorus() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  // The worker runs (or fails) what is still queued, then the completer
  // completes what it was handed.  Either may need the GIL (to free a tensor
  // that Python also references, or to run a Python callback), and Python
  // may be dropping the group right now while holding the GIL: release it.
  auto drain = [this] {
    if (worker_.joinable()) worker_.join();
    completer_.reset();
  };
  if (PyGILState_Check() != 0) {
    pybind11::gil_scoped_release nogil;
    drain();
  } else {
    drain();
  }
}

// ---------------------------------------------------------------- Completer

Completer::~Completer() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (auto& t : threads) t.join();
}

void Completer::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back(std::move(fn));
    // Every queued completion needs a thread of its own that is free now.
    if (idle_ < static_cast<int>(queue_.size())) threads_.emplace_back([this] { loop(); });
  }
  cv_.notify_one();
}

void Completer::loop() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    ++idle_;
    cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
    --idle_;
    if (queue_.empty()) return;  // stopping and drained
    std::function<void()> fn = std::move(queue_.front());
    queue_.pop_front();
    l.unlock();
    fn();  // ChorusWork::complete: Future callbacks report their own errors
    fn = nullptr;
    l.lock();
  }
}

void ProcessGroupChorus::abort() {
  comm_->abort();
}

void ProcessGroupChorus::workerLoop() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    run(item);
    {
      std::lock_guard<std::mutex> l(mu_);
      busy_ = false;
    }
    idleCv_.notify_all();
  }
}

void ProcessGroupChorus::run(Item& item) {
  std::exception_ptr error;
  if (!item.grouped) {
    running_ = item.ops[0].first.get();
    try {
      item.ops[0].second();
    } catch (...) {
      error = std::current_exception();
    }
  } else {
    // Inside a group the calls only record; chorusGroupEnd runs them all.
    // A call that fails to record still ends the group (this thread's group
    // state must not stay open), and then the whole batch fails.
    check(chorusGroupStart(), comm_->get(), "batch_isend_irecv (group start)");
    for (auto& op : item.ops) {
      running_ = op.first.get();
      try {
        op.second();
      } catch (...) {
        error = std::current_exception();
        break;
      }
    }
    const chorusResult_t r = chorusGroupEnd();
    if (!error && r != chorusSuccess) {
      try {
        check(r, comm_->get(), "batch_isend_irecv");
      } catch (...) {
        error = std::current_exception();
      }
    }
  }
  running_ = nullptr;
  for (auto& op : item.ops) op.second = nullptr;  // drop the tasks' tensors before waking waiters
  for (auto& op : item.ops) {
    if (op.first->completeIfNoFuture(error)) continue;
    completer_->post([work = op.first, error] { work->complete(error); });
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
                                                           Task task, std::chrono::milliseconds timeout,
                                                           const std::vector<at::Tensor>* inputs) {
  if (timeout != c10d::kUnsetTimeout && timeout.count() <= 0)
    fail(c10d::opTypeToString(type) + ": timeout " + std::to_string(timeout.count()) +
         " ms: a per-call timeout must be positive (or unset, for the group's " + std::to_string(timeout_.count()) +
         " ms)");
  const std::vector<at::Tensor> profiled = inputs != nullptr ? *inputs : outputs;  // before outputs moves
  auto work = c10::make_intrusive<ChorusWork>(rank_, type, profiled, std::move(outputs), comm_,
                                              timeout == c10d::kUnsetTimeout ? timeout_ : timeout);
  {
    std::lock_guard<std::mutex> l(mu_);
    if (coalescing_) {
      // Only sends and receives record without running: a collective's task
      // also unpacks its result after the call, which in a group would read
      // it before it arrived.
      if (type != c10d::OpType::SEND && type != c10d::OpType::RECV)
        fail(c10d::opTypeToString(type) +
             " while coalescing (batch_isend_irecv): only send and recv from a given source can be batched");
      coalesced_.ops.emplace_back(work, std::move(task));
      return work;
    }
    Item item;
    item.ops.emplace_back(work, std::move(task));
    queue_.push_back(std::move(item));
  }
  cv_.notify_one();
  return work;
}

void ProcessGroupChorus::startCoalescing() {
  std::lock_guard<std::mutex> l(mu_);
  if (coalescing_) fail("_start_coalescing: already coalescing (call _end_coalescing first)");
  coalescing_ = true;
  coalesced_ = Item();
  coalesced_.grouped = true;
}

void ProcessGroupChorus::endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>& /*reqs*/) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!coalescing_) fail("_end_coalescing without _start_coalescing");
    coalescing_ = false;
    if (coalesced_.ops.empty()) return;
    queue_.push_back(std::move(coalesced_));
    coalesced_ = Item();
  }
  cv_.notify_one();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  at::Tensor t = single(tensors, "broadcast");
  const int root = static_cast<int>(opts.rootRank);
  chorusComm_t c = comm_->get();
  return enqueue(
      c10d::OpType::BROADCAST, tensors,
      [t, root, c] {
        check(chorusBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), toChorus(t.scalar_type(), "broadcast"), root, c,
                              nullptr),
              c, "broadcast");
      },
      opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].is_sparse()) return sparseAllreduce(tensors[0], opts);
  at::Tensor t = single(tensors, "allreduce");
  c10d::ReduceOp op = opts.reduceOp;
  chorusComm_t c = comm_->get();
  return enqueue(
      c10d::OpType::ALLREDUCE, tensors,
      [t, op, c] {
        RedOp rop(op, t.scalar_type(), c);
        check(chorusAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), toChorus(t.scalar_type(), "allreduce"),
                              rop.get(), c, nullptr),
              c, "allreduce");
      },
      opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::compressedAllreduce(const at::Tensor& t, int compress,
                                                                       int fp8_block, bool average) {
  checkTensor(t, "compressed_allreduce");
  chorusComm_t c = comm_->get();
  return enqueue(c10d::OpType::ALLREDUCE, {t}, [t, c, compress, fp8_block, average] {
    chorusCallOptions_t o = CHORUS_CALL_OPTIONS_INITIALIZER;
    o.compress = compress;
    o.fp8Block = fp8_block;
    // chorus refuses what it cannot compress (a dtype other than float32),
    // naming it: the hook never falls back to an uncompressed call silently.
    check(chorusAllReduceEx(t.data_ptr(), t.data_ptr(), t.numel(), toChorus(t.scalar_type(), "compressed_allreduce"),
                            average ? chorusAvg : chorusSum, c, nullptr, &o),
          c, "compressed_allreduce");
  });
}

// As gloo does it: every rank's coalesced indices and values are gathered
// (padded to the largest nnz: on main at the time of writing, chorus's
// always-on signature check rejects an allgather_v whose ranks send
// different counts), and every rank sums them in rank order, so
// every rank computes the same tensor.  The result replaces the input
// (copy_, which takes the sum's number of non-zeros).
c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::sparseAllreduce(const at::Tensor& t,
                                                                   const c10d::AllreduceOptions& opts) {
  if (!t.device().is_cpu())
    fail("allreduce: sparse tensor on " + t.device().str() + "; the chorus backend works on CPU tensors");
  if (t.layout() != at::kSparse)
    fail("allreduce: sparse layout " + c10::str(t.layout()) + " is not supported (COO tensors only)");
  if (opts.reduceOp.op_ != c10d::ReduceOp::SUM)
    fail("allreduce of a sparse tensor: ReduceOp " + std::to_string(static_cast<int>(opts.reduceOp.op_)) +
         " is not supported; only SUM is defined for sparse tensors (as in gloo)");
  const chorusDataType_t vtype = toChorus(t.scalar_type(), "allreduce (sparse values)");
  at::Tensor tensor = t;
  chorusComm_t c = comm_->get();
  const int n = size_;
  return enqueue(
      c10d::OpType::ALLREDUCE, {t},
      [tensor, vtype, c, n]() mutable {
        const auto un = static_cast<size_t>(n);
        at::Tensor in = tensor.coalesce();
        at::Tensor idx = in._indices().contiguous();  // [sparse_dim, nnz], int64
        at::Tensor val = in._values().contiguous();   // [nnz, dense sizes...]
        const int64_t dim = in.dim(), sparseDim = in.sparse_dim();
        // 1. The ranks must agree on the shape.
        int64_t meta[3] = {dim, sparseDim, in._nnz()};
        std::vector<int64_t> metas(3 * un);
        check(chorusAllGather(meta, metas.data(), 3, chorusInt64, c, nullptr), c, "allreduce (sparse: shapes)");
        for (size_t r = 0; r < un; ++r)
          if (metas[3 * r] != dim || metas[3 * r + 1] != sparseDim)
            fail("allreduce (sparse): rank " + std::to_string(r) + " has a " + std::to_string(metas[3 * r]) +
                 "-d tensor with " + std::to_string(metas[3 * r + 1]) + " sparse dims, this rank a " +
                 std::to_string(dim) + "-d one with " + std::to_string(sparseDim));
        std::vector<int64_t> size(in.sizes().begin(), in.sizes().end());
        std::vector<int64_t> sizes(static_cast<size_t>(dim) * un);
        check(chorusAllGather(size.data(), sizes.data(), static_cast<size_t>(dim), chorusInt64, c, nullptr), c,
              "allreduce (sparse: sizes)");
        for (size_t r = 0; r < un; ++r)
          if (!std::equal(size.begin(), size.end(), sizes.begin() + static_cast<ptrdiff_t>(r * size.size())))
            fail("allreduce (sparse): rank " + std::to_string(r) + "'s tensor has sizes " +
                 c10::str(at::IntArrayRef(sizes.data() + r * size.size(), size.size())) + ", this rank's " +
                 c10::str(in.sizes()));
        // 2. Indices and values of every rank, in rank order, padded to the
        // largest nnz so that one allgather of equal counts carries them.
        int64_t maxNnz = 0;
        for (size_t r = 0; r < un; ++r) maxNnz = std::max(maxNnz, metas[3 * r + 2]);
        std::vector<int64_t> vshape(val.sizes().begin(), val.sizes().end());
        std::vector<at::Tensor> is, vs;
        if (maxNnz > 0) {
          at::Tensor idxPad = at::zeros({sparseDim, maxNnz}, idx.options());
          idxPad.narrow(1, 0, in._nnz()).copy_(idx);
          vshape[0] = maxNnz;
          at::Tensor valPad = at::zeros(vshape, val.options());
          valPad.narrow(0, 0, in._nnz()).copy_(val);
          at::Tensor allIdx = at::empty({n, sparseDim, maxNnz}, idx.options());
          std::vector<int64_t> allShape{n};
          allShape.insert(allShape.end(), vshape.begin(), vshape.end());
          at::Tensor allVal = at::empty(allShape, val.options());
          check(chorusAllGather(idxPad.data_ptr(), allIdx.data_ptr(), static_cast<size_t>(idxPad.numel()),
                                chorusInt64, c, nullptr),
                c, "allreduce (sparse: indices)");
          check(chorusAllGather(valPad.data_ptr(), allVal.data_ptr(), static_cast<size_t>(valPad.numel()), vtype, c,
                                nullptr),
                c, "allreduce (sparse: values)");
          for (size_t r = 0; r < un; ++r) {
            const int64_t nnz = metas[3 * r + 2];
            is.push_back(allIdx[static_cast<int64_t>(r)].narrow(1, 0, nnz));
            vs.push_back(allVal[static_cast<int64_t>(r)].narrow(0, 0, nnz));
          }
        } else {
          is.push_back(idx);
          vs.push_back(val);
        }
        // 3. The sum, the same on every rank.
        at::Tensor sum = at::sparse_coo_tensor(at::cat(is, 1), at::cat(vs, 0), in.sizes(), in.options()).coalesce();
        tensor.copy_(sum);
      },
      opts.timeout);
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
  return enqueue(
      c10d::OpType::ALLREDUCE_COALESCED, tensors,
      [tensors, op, c]() mutable {
        // One collective on a packed copy: far cheaper than one per small tensor.
        at::Tensor flat = flatten(tensors);
        RedOp rop(op, flat.scalar_type(), c);
        check(chorusAllReduce(flat.data_ptr(), flat.data_ptr(), flat.numel(),
                              toChorus(flat.scalar_type(), "allreduce_coalesced"), rop.get(), c, nullptr),
              c, "allreduce_coalesced");
        unflatten(flat, tensors);
      },
      opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  at::Tensor t = single(tensors, "reduce");
  c10d::ReduceOp op = opts.reduceOp;
  const int root = static_cast<int>(opts.rootRank);
  chorusComm_t c = comm_->get();
  return enqueue(
      c10d::OpType::REDUCE, tensors,
      [t, op, root, c] {
        RedOp rop(op, t.scalar_type(), c);
        check(chorusReduce(t.data_ptr(), t.data_ptr(), t.numel(), toChorus(t.scalar_type(), "reduce"), rop.get(),
                           root, c, nullptr),
              c, "reduce");
      },
      opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  at::Tensor in = single(inputs, "allgather");
  if (outputs.size() != 1) fail("allgather: expected one output list, got " + std::to_string(outputs.size()));
  checkList(outputs[0], in, static_cast<size_t>(size_), "allgather");
  std::vector<at::Tensor> outs = outputs[0];
  chorusComm_t c = comm_->get();
  const int n = size_;
  return enqueue(
      c10d::OpType::ALLGATHER, outs,
      [in, outs, n, c]() mutable {
        at::Tensor flat = at::empty({in.numel() * n}, in.options());
        check(chorusAllGather(in.data_ptr(), flat.data_ptr(), in.numel(), toChorus(in.scalar_type(), "allgather"),
                              c, nullptr),
              c, "allgather");
        unflatten(flat, outs);
      },
      opts.timeout, &inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::AllgatherOptions& opts) {
  checkTensor(input, "_allgather_base");
  checkTensor(output, "_allgather_base");
  if (output.scalar_type() != input.scalar_type()) fail("_allgather_base: output and input have different dtypes");
  if (std::string e = chorus::sizes::multiple("_allgather_base", "output.numel()", output.numel(), "input.numel()",
                                              input.numel(), size_);
      !e.empty())
    fail(e);
  at::Tensor in = input, out = output;
  chorusComm_t c = comm_->get();
  const std::vector<at::Tensor> profiled{input};
  return enqueue(
      c10d::OpType::_ALLGATHER_BASE, {output},
      [in, out, c] {
        check(chorusAllGather(in.data_ptr(), out.data_ptr(), in.numel(),
                              toChorus(in.scalar_type(), "_allgather_base"), c, nullptr),
              c, "_allgather_base");
      },
      opts.timeout, &profiled);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
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
  return enqueue(
      c10d::OpType::ALLGATHER_COALESCED, all,
      [inputs, all, n, c]() mutable {
        // Rank r's packed inputs land at r * packed, in the order of `all`.
        at::Tensor packed = flatten(inputs);
        at::Tensor flat = at::empty({packed.numel() * n}, packed.options());
        check(chorusAllGather(packed.data_ptr(), flat.data_ptr(), packed.numel(),
                              toChorus(packed.scalar_type(), "allgather_coalesced"), c, nullptr),
              c, "allgather_coalesced");
        unflatten(flat, all);
      },
      opts.timeout, &inputs);
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
  return enqueue(
      c10d::OpType::GATHER, outs,
      [in, outs, n, c, root, isRoot]() mutable {
        at::Tensor flat = isRoot ? at::empty({in.numel() * n}, in.options()) : at::Tensor();
        check(chorusGather(in.data_ptr(), isRoot ? flat.data_ptr() : nullptr, in.numel(),
                           toChorus(in.scalar_type(), "gather"), root, c, nullptr),
              c, "gather");
        if (isRoot) unflatten(flat, outs);
      },
      opts.timeout, &inputs);
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
  return enqueue(
      c10d::OpType::SCATTER, outputs,
      [out, ins, c, root, isRoot] {
        at::Tensor flat = isRoot ? flatten(ins) : at::Tensor();
        check(chorusScatter(isRoot ? flat.data_ptr() : nullptr, out.data_ptr(), out.numel(),
                            toChorus(out.scalar_type(), "scatter"), root, c, nullptr),
              c, "scatter");
      },
      opts.timeout, &ins);
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
  return enqueue(
      c10d::OpType::REDUCE_SCATTER, outputs,
      [out, ins, op, c] {
        at::Tensor flat = flatten(ins);
        RedOp rop(op, out.scalar_type(), c);
        check(chorusReduceScatter(flat.data_ptr(), out.data_ptr(), out.numel(),
                                  toChorus(out.scalar_type(), "reduce_scatter"), rop.get(), c, nullptr),
              c, "reduce_scatter");
      },
      opts.timeout, &ins);
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
  const std::vector<at::Tensor> profiled{input};
  return enqueue(
      c10d::OpType::_REDUCE_SCATTER_BASE, {output},
      [in, out, op, c] {
        RedOp rop(op, out.scalar_type(), c);
        check(chorusReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(),
                                  toChorus(out.scalar_type(), "_reduce_scatter_base"), rop.get(), c, nullptr),
              c, "_reduce_scatter_base");
      },
      opts.timeout, &profiled);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                 std::vector<int64_t>& outputSplitSizes,
                                                                 std::vector<int64_t>& inputSplitSizes,
                                                                 const c10d::AllToAllOptions& opts) {
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
    const std::vector<at::Tensor> profiled{input};
    return enqueue(
        c10d::OpType::ALLTOALL_BASE, {output},
        [in, out, n, c] {
          check(chorusAllToAll(in.data_ptr(), out.data_ptr(), in.numel() / n,
                               toChorus(in.scalar_type(), "alltoall_base"), c, nullptr),
                c, "alltoall_base");
        },
        opts.timeout, &profiled);
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
  const std::vector<at::Tensor> profiled{input};
  return enqueue(
      c10d::OpType::ALLTOALL_BASE, {output},
      [in, out, sc, sd, rc, rd, c] {
        check(chorusAllToAllV(in.data_ptr(), sc.data(), sd.data(), out.data_ptr(), rc.data(), rd.data(),
                              toChorus(in.scalar_type(), "alltoall_base"), c, nullptr),
              c, "alltoall_base");
      },
      opts.timeout, &profiled);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
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
  return enqueue(
      c10d::OpType::ALLTOALL, outputs,
      [ins, outs, sc, sd, rc, rd, ro, c]() mutable {
        at::Tensor flatIn = flatten(ins);
        at::Tensor flatOut = at::empty({static_cast<int64_t>(ro)}, flatIn.options());
        check(chorusAllToAllV(flatIn.data_ptr(), sc.data(), sd.data(), flatOut.data_ptr(), rc.data(), rd.data(),
                              toChorus(flatIn.scalar_type(), "alltoall"), c, nullptr),
              c, "alltoall");
        unflatten(flatOut, outs);
      },
      opts.timeout, &ins);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::send(std::vector<at::Tensor>& tensors, int dstRank, int /*tag*/) {
  // chorus matches point-to-point messages by order per peer pair; tags are
  // not carried, so two sends to one peer arrive in the order issued.
  at::Tensor t = single(tensors, "send");
  checkPeer(dstRank, rank_, size_, "send");
  chorusComm_t c = comm_->get();
  return enqueue(c10d::OpType::SEND, tensors, [this, t, dstRank, c] {
    // Counted before the send: a large send may wait for its receiver, which
    // may be a receive from any source that waits for this count.
    ledger_->sent(dstRank);
    check(chorusSend(t.data_ptr(), t.numel(), toChorus(t.scalar_type(), "send"), dstRank, c, nullptr), c, "send");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::recv(std::vector<at::Tensor>& tensors, int srcRank, int /*tag*/) {
  at::Tensor t = single(tensors, "recv");
  checkPeer(srcRank, rank_, size_, "recv");
  chorusComm_t c = comm_->get();
  return enqueue(c10d::OpType::RECV, tensors, [this, t, srcRank, c] {
    check(chorusRecv(t.data_ptr(), t.numel(), toChorus(t.scalar_type(), "recv"), srcRank, c, nullptr), c, "recv");
    ledger_->received(srcRank);
    running_->setSourceRank(srcRank);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::recvAnysource(std::vector<at::Tensor>& tensors, int /*tag*/) {
  at::Tensor t = single(tensors, "recv (any source)");
  chorusComm_t c = comm_->get();
  return enqueue(c10d::OpType::RECVANYSOURCE, tensors, [this, t, c] {
    // The Store names a peer whose message is pending (SendLedger); the
    // receive from it then matches that message, chorus keeping each pair's
    // messages in order.
    const int src = ledger_->pendingPeer(running_->timeout(), *comm_);
    check(chorusRecv(t.data_ptr(), t.numel(), toChorus(t.scalar_type(), "recv"), src, c, nullptr), c,
          "recv (any source)");
    ledger_->received(src);
    running_->setSourceRank(src);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::barrier(const c10d::BarrierOptions& opts) {
  chorusComm_t c = comm_->get();
  // The FIFO worker runs this after every earlier operation of the group,
  // so the barrier also orders them, as gloo's does.  opts.timeout (set from
  // Python through BarrierOptions) bounds this call's wait instead of the
  // group's timeout.
  return enqueue(
      c10d::OpType::BARRIER, {}, [c] { check(chorusBarrier(c, nullptr), c, "barrier"); }, opts.timeout);
}

}  // namespace chorus_torch

namespace py = pybind11;

PYBIND11_MODULE(_chorus_torch, m) {
  m.doc() = "The c10d ProcessGroup of the 'chorus' torch.distributed backend; use chorus.torch.";
  // Registers c10d's Python types (Store, ProcessGroup) that the signatures use.
  py::module_::import("torch.distributed");
  m.def(
      "create_process_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
         int reproducible) {
        c10::intrusive_ptr<c10d::ProcessGroup> pg =
            c10::make_intrusive<chorus_torch::ProcessGroupChorus>(store, rank, size, timeout, reproducible);
        return pg;
      },
      py::arg("store"), py::arg("rank"), py::arg("world_size"), py::arg("timeout"), py::arg("reproducible") = -1,
      py::call_guard<py::gil_scoped_release>(),
      "Creates the chorus ProcessGroup of `world_size` ranks, rendezvousing through `store`.\n"
      "Blocks until every rank has joined.  reproducible: -1 (CHORUS_REPRODUCIBLE), 0 off, 1 canonical, 2 exact.");
  m.def(
      "abort",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
        auto* chorusPg = dynamic_cast<chorus_torch::ProcessGroupChorus*>(pg.get());
        if (chorusPg == nullptr) throw py::type_error("abort: not a chorus process group");
        chorusPg->abort();
      },
      py::arg("process_group"), "Aborts a chorus process group: every pending and future operation fails.");
  auto asChorus = [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const char* op) {
    auto* chorusPg = dynamic_cast<chorus_torch::ProcessGroupChorus*>(pg.get());
    if (chorusPg == nullptr) throw py::type_error(std::string(op) + ": not a chorus process group");
    return chorusPg;
  };
  m.def(
      "supports_reconfigure",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
        auto* chorusPg = dynamic_cast<chorus_torch::ProcessGroupChorus*>(pg.get());
        return chorusPg != nullptr && chorusPg->supportsReconfigure();
      },
      py::arg("process_group"), "Whether the group can be revoked, shrunk and grown (every chorus group can).");
  m.def(
      "revoke", [asChorus](const c10::intrusive_ptr<c10d::ProcessGroup>& pg) { asChorus(pg, "revoke")->revoke(); },
      py::arg("process_group"), py::call_guard<py::gil_scoped_release>(),
      "Revokes the group on every rank: in-flight and later operations fail with chorusRevoked.");
  m.def(
      "shrink",
      [asChorus](const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
        c10::intrusive_ptr<c10d::ProcessGroup> out = asChorus(pg, "shrink")->shrink();
        return out;
      },
      py::arg("process_group"), py::call_guard<py::gil_scoped_release>(),
      "The group of the ranks still alive (collective over the survivors).");
  m.def(
      "grow",
      [asChorus](const c10::intrusive_ptr<c10d::ProcessGroup>& pg, int nnew) {
        c10::intrusive_ptr<c10d::ProcessGroup> out = asChorus(pg, "grow")->grow(nnew);
        return out;
      },
      py::arg("process_group"), py::arg("nnew"), py::call_guard<py::gil_scoped_release>(),
      "The group of this group's ranks followed by nnew processes that call join().");
  m.def(
      "join",
      [](const c10::intrusive_ptr<c10d::Store>& store, const py::bytes& uid, std::chrono::milliseconds timeout) {
        std::string raw = uid;
        if (raw.size() != CHORUS_UNIQUE_ID_BYTES)
          throw py::value_error("join: the unique id has " + std::to_string(raw.size()) + " bytes, not " +
                                std::to_string(CHORUS_UNIQUE_ID_BYTES));
        chorusUniqueId id;
        std::memcpy(id.internal, raw.data(), CHORUS_UNIQUE_ID_BYTES);
        py::gil_scoped_release nogil;
        c10::intrusive_ptr<c10d::ProcessGroup> out = chorus_torch::ProcessGroupChorus::join(store, id, timeout);
        return out;
      },
      py::arg("store"), py::arg("unique_id"), py::arg("timeout"),
      "Joins the group whose unique_id is given when its ranks grow; returns the grown group.");
  m.def(
      "unique_id",
      [asChorus](const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
        const chorusUniqueId& id = asChorus(pg, "unique_id")->uniqueId();
        return py::bytes(id.internal, CHORUS_UNIQUE_ID_BYTES);
      },
      py::arg("process_group"), "The unique id a process joining this group's job needs.");
  m.def(
      "compressed_allreduce",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const at::Tensor& tensor, int compress, int fp8_block,
         bool average) {
        auto* chorusPg = dynamic_cast<chorus_torch::ProcessGroupChorus*>(pg.get());
        if (chorusPg == nullptr) throw py::type_error("compressed_allreduce: not a chorus process group");
        return chorusPg->compressedAllreduce(tensor, compress, fp8_block, average);
      },
      py::arg("process_group"), py::arg("tensor"), py::arg("compress"), py::arg("fp8_block") = -1,
      py::arg("average") = true, py::call_guard<py::gil_scoped_release>(),
      "Allreduces a float32 tensor in place with a compressed wire format (compress: 1 bf16, 2 fp8; fp8_block "
      "32..1024 or -1 for 128); average: divide by the world size.  Returns the Work.");
}
