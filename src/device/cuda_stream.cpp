// The CUDA stream (memory.hpp, makeCudaStream; docs/device.md, "CUDA"): a
// call's device buffers staged through pinned host memory around the
// unchanged host collective, in the order of the user's CUstream, over the
// driver API loaded at run time (cuda_driver.hpp).
//
// A call enqueues on the user's stream, after the stream's earlier work:
//   the copies of its inputs into pinned staging (cuMemcpyDtoHAsync),
//   an event (`ready`: the inputs are on the host),
//   a wait for its gate (cuStreamWaitValue32 on a pinned word: the GPU, not a
//   host thread, holds the stream's later work until the host part is done),
//   the copy of its output back (cuMemcpyHtoDAsync),
// and returns; the host part (PendingCall::run, on the communicator's device
// worker) waits for `ready`, runs the host call on the staging and opens the
// gate by storing its ticket in the word.  The stream's later commands then
// see the results, as after an NCCL call on that stream.
//
// Gates are tickets in a ring of pinned 32-bit words: gate t waits on word
// t % kWords for (int32_t)(word - t) >= 0, the driver's cyclic comparison,
// so a word is reused without being reset: opening t stores t, which never
// opens a later ticket of the same word (t + kWords) early, and never leaves
// an earlier one shut.  At most kMaxInFlight gates are shut at once (the
// back-pressure of enqueue), far fewer than kWords.
//
// An elementwise call of more than one chunk (CHORUS_DEVICE_CHUNK_BYTES;
// CHORUS_DEVICE_STAGING auto or pipeline) runs as pipelined chunks through a
// ring of three pinned slots, each chunk with its own event and gate, so the
// stream copies chunk k back and chunk k+2 in while chunk k+1's host part
// runs (enqueuePipelined); other calls, and every call under `whole`, stage
// whole buffers.
//
// Where the driver cannot wait on memory (cuStreamWaitValue32 refused when
// the stream is made: CUDA_ERROR_NOT_SUPPORTED on some devices and drivers),
// the stream is synchronous: the call waits for its inputs, runs the host
// part and enqueues the copy back before it returns (async() is false).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "device/cuda_driver.hpp"
#include "device/memory.hpp"

namespace chorus::device {

namespace {

std::atomic<bool> g_cuda_in_use{false};

// A buffer of the call: its device pointer and its allocation.
struct CudaBuf {
  CUdeviceptr ptr = 0;
  CUdeviceptr base = 0;  // the allocation's start (cuMemGetAddressRange)
  uint64_t bytes = 0;    // what the call touches from ptr
};

class CudaStreamImpl;

// One host part: wait for `ready`, run the host call, open the gate (or,
// on a synchronous stream, enqueue the write back).
struct CudaPart {
  CUevent ready = nullptr;
  std::byte* send = nullptr;
  std::byte* recv = nullptr;
  uint64_t count = 0;
  uint32_t gate = 0;  // its ticket; 0: no gate (a synchronous stream)
  bool gated = false;
  // Synchronous streams: the copy back after the host call.
  CUdeviceptr write_to = 0;
  const std::byte* write_from = nullptr;
  uint64_t write_bytes = 0;
};

class CudaPending final : public PendingCall {
 public:
  explicit CudaPending(CudaStreamImpl* s);
  ~CudaPending() override;
  Status run(const HostCall& host, bool late) override;
  std::vector<CudaPart> parts;

 private:
  CudaStreamImpl* s_;
};

// A group call's own staging (mapCall): freed once its copy back is done.
struct CudaMapped {
  void* pinned = nullptr;
  CUdeviceptr write_to = 0;
  std::byte* write_from = nullptr;
  uint64_t write_bytes = 0;
};

class CudaStreamImpl final : public DeviceStream {
 public:
  CudaStreamImpl(const CudaDriver& d, CUstream s, CUcontext ctx, const StagingOptions& o)
      : d_(d), s_(s), ctx_(ctx), opt_(o) {
    // Auto: pipelined chunks (a GPU's memory is its own: the copies are
    // real, and overlapping them with the wire is what pays).
    stats_.resolved = opt_.mode == Staging::Whole ? Staging::Whole : Staging::Pipeline;
  }

  // Pinned words for the gates, and the probe of cuStreamWaitValue32: a
  // wait that is already satisfied (word 0 >= ticket 0) costs the stream
  // nothing and tells whether the driver can wait on memory at all.
  Status init() {
    CudaCtxScope scope(d_, ctx_);
    void* p = nullptr;
    CHORUS_RETURN_IF_ERROR(d_.check(d_.cuMemHostAlloc(&p, kWords * sizeof(uint32_t),
                                                      kCuMemHostAllocPortable | kCuMemHostAllocDeviceMap),
                                    "cuMemHostAlloc (the stream's gate words)"));
    words_ = static_cast<uint32_t*>(p);
    std::memset(words_, 0, kWords * sizeof(uint32_t));
    CHORUS_RETURN_IF_ERROR(d_.check(d_.cuMemHostGetDevicePointer(&words_dev_, p, 0),
                                    "cuMemHostGetDevicePointer (the stream's gate words)"));
    CHORUS_RETURN_IF_ERROR(d_.check(d_.cuEventCreate(&last_, kCuEventDisableTiming), "cuEventCreate"));
    const CUresult r = d_.cuStreamWaitValue32(s_, words_dev_, 0, kCuStreamWaitValueGeq);
    can_wait_ = r == kCudaSuccess;
    if (!can_wait_) {
      stats_.resolved = Staging::Whole;
      opt_.async = false;
      wait_refused_ = d_.errorName(r);
    }
    return {};
  }

  ~CudaStreamImpl() override {
    {
      std::unique_lock l(mu_);
      cv_.wait(l, [&] { return pending_ == 0; });
    }
    CudaCtxScope scope(d_, ctx_);
    d_.cuStreamSynchronize(s_);
    reap(/*all=*/true);
    for (void* p : retired_staging_) d_.cuMemFreeHost(p);
    if (stage_ != nullptr) d_.cuMemFreeHost(stage_);
    if (last_ != nullptr) d_.cuEventDestroy(last_);
    if (words_ != nullptr) d_.cuMemFreeHost(words_);
  }

  Result<std::unique_ptr<PendingCall>> enqueue(const StagedCall& call) override {
    {
      // Back-pressure, as the OpenCL stream's (a launch queue's depth).
      std::unique_lock l(mu_);
      cv_.wait(l, [&] { return pending_ < kMaxInFlight; });
    }
    CudaCtxScope scope(d_, ctx_);
    CHORUS_ASSIGN_OR_RETURN(auto bufs, resolveCall(call));
    reap(false);
    ++stats_.calls;
    const auto& [in, out] = bufs;
    if (can_wait_ && stats_.resolved == Staging::Pipeline && pipelinable(call, in, out)) {
      ++stats_.pipelined_calls;
      auto p = std::make_unique<CudaPending>(this);
      CHORUS_RETURN_IF_ERROR(enqueuePipelined(call, in, out, *p));
      return std::unique_ptr<PendingCall>(std::move(p));
    }
    ++stats_.whole_calls;
    const Layout l = layout(call, in, out);
    CHORUS_RETURN_IF_ERROR(ensureStaging(l.total));
    auto p = std::make_unique<CudaPending>(this);
    CudaPart part;
    CHORUS_RETURN_IF_ERROR(copyIn(call, in, out, l, stage_));
    CHORUS_RETURN_IF_ERROR(d_.check(d_.cuEventCreate(&part.ready, kCuEventDisableTiming), "cuEventCreate"));
    p->parts.push_back(part);  // owns the event from here
    CudaPart& pp = p->parts.back();
    CHORUS_RETURN_IF_ERROR(d_.check(d_.cuEventRecord(pp.ready, s_), "cuEventRecord (the call's inputs)"));
    pp.send = in ? stage_ + l.send_at : nullptr;
    pp.recv = out ? stage_ + l.recv_at : nullptr;
    aliasUnused(call, pp.send, pp.recv);
    pp.count = call.count;
    const bool writes = out && call.recv_written;
    if (can_wait_) {
      CHORUS_ASSIGN_OR_RETURN(pp.gate, gateAfter());
      pp.gated = true;
      if (writes) CHORUS_RETURN_IF_ERROR(copyBack(out->ptr, stage_ + l.recv_at, call.recv_bytes));
      CHORUS_RETURN_IF_ERROR(d_.check(d_.cuEventRecord(last_, s_), "cuEventRecord (the call's end)"));
    } else if (writes) {
      pp.write_to = out->ptr;
      pp.write_from = stage_ + l.recv_at;
      pp.write_bytes = call.recv_bytes;
    }
    return std::unique_ptr<PendingCall>(std::move(p));
  }

  void recordError(const Status& st) override {
    std::lock_guard l(mu_);
    if (error_.isOk() && !st.isOk()) error_ = st;
  }

  Status synchronize() override {
    CudaCtxScope scope(d_, ctx_);
    CHORUS_RETURN_IF_ERROR(d_.check(d_.cuStreamSynchronize(s_), "cuStreamSynchronize"));
    std::lock_guard l(mu_);
    return error_;
  }

  Status query() override {
    {
      std::lock_guard l(mu_);
      if (!error_.isOk()) return error_;
    }
    const CUresult r = d_.cuEventQuery(last_);
    if (r == kCudaErrorNotReady) return makeError(chorusInProgress, "the CUDA stream's last call is in flight");
    return d_.check(r, "cuEventQuery (the stream's last call)");
  }

  // CUDA orders by the user's stream itself (cuEventRecord there after the
  // call): no event is handed out.
  void* lastEvent() override { return nullptr; }
  [[nodiscard]] void* queue() const override { return s_; }
  [[nodiscard]] StagingStats stats() const override { return stats_; }
  [[nodiscard]] bool async() const override { return opt_.async; }
  [[nodiscard]] Space space() const override { return Space::Cuda; }

  // A group call: its own pinned staging (several calls of a group are in
  // flight at once), filled in stream order; blocking waits for it.
  Result<MappedCall> mapCall(const StagedCall& call, bool blocking) override {
    CudaCtxScope scope(d_, ctx_);
    CHORUS_ASSIGN_OR_RETURN(auto bufs, resolveCall(call));
    reap(false);
    ++stats_.calls;
    ++stats_.mapped_calls;
    const auto& [in, out] = bufs;
    const Layout l = layout(call, in, out);
    auto state = std::make_shared<CudaMapped>();
    CHORUS_RETURN_IF_ERROR(d_.check(d_.cuMemHostAlloc(&state->pinned, std::max<uint64_t>(l.total, 1),
                                                      kCuMemHostAllocPortable),
                                    "cuMemHostAlloc (a group call's staging)"));
    MappedCall m;
    m.state = state;
    auto* stage = static_cast<std::byte*>(state->pinned);
    Status st = copyIn(call, in, out, l, stage);
    CUevent ready = nullptr;
    if (st.isOk()) st = d_.check(d_.cuEventCreate(&ready, kCuEventDisableTiming), "cuEventCreate");
    if (st.isOk()) st = d_.check(d_.cuEventRecord(ready, s_), "cuEventRecord (a group call's inputs)");
    if (st.isOk() && blocking) st = d_.check(d_.cuEventSynchronize(ready), "cuEventSynchronize (a group call's inputs)");
    if (ready != nullptr && (blocking || !st.isOk())) {
      d_.cuEventDestroy(ready);
      ready = nullptr;
    }
    if (!st.isOk()) {
      retire(state->pinned);
      return st;
    }
    m.ready = ready;
    std::byte* send_host = in ? stage + l.send_at : nullptr;
    std::byte* recv_host = out ? stage + l.recv_at : nullptr;
    aliasUnused(call, send_host, recv_host);
    m.send = send_host;
    m.recv = recv_host;
    if (out && call.recv_written) {
      state->write_to = out->ptr;
      state->write_from = stage + l.recv_at;
      state->write_bytes = call.recv_bytes;
    }
    return m;
  }

  Status waitMapped(MappedCall& m) override {
    if (m.ready == nullptr) return {};
    CudaCtxScope scope(d_, ctx_);
    auto ev = static_cast<CUevent>(m.ready);
    Status st = d_.check(d_.cuEventSynchronize(ev), "cuEventSynchronize (a group call's inputs)");
    d_.cuEventDestroy(ev);
    m.ready = nullptr;
    return st;
  }

  // The copy back of a group call, after `gate` (a makeGate ticket) when
  // given; its staging is freed once the copy is done.
  Status unmapCall(MappedCall& m, void* gate) override {
    CudaCtxScope scope(d_, ctx_);
    if (m.ready != nullptr) {
      d_.cuEventDestroy(static_cast<CUevent>(m.ready));
      m.ready = nullptr;
    }
    auto state = std::static_pointer_cast<CudaMapped>(m.state);
    m.state.reset();
    if (!state) return {};
    Status st;
    if (gate != nullptr) st = waitGate(ticketOf(gate));
    if (st.isOk() && state->write_bytes > 0) st = copyBack(state->write_to, state->write_from, state->write_bytes);
    if (st.isOk()) st = d_.check(d_.cuEventRecord(last_, s_), "cuEventRecord (the call's end)");
    retire(state->pinned);
    return st;
  }

  Result<void*> makeGate() override {
    if (!can_wait_)
      return makeError(chorusSystemError, "the CUDA stream cannot wait on memory (cuStreamWaitValue32: {})",
                       wait_refused_);
    pendingBorn();
    return gateOf(nextTicket());
  }
  void openGate(void* gate) override {
    open(ticketOf(gate));
    pendingGone();
  }

  // For CudaPending.
  const CudaDriver& driver() const { return d_; }
  CUcontext context() const { return ctx_; }
  void open(uint32_t ticket) { __atomic_store_n(&words_[ticket % kWords], ticket, __ATOMIC_RELEASE); }
  Status copyBack(CUdeviceptr to, const std::byte* from, uint64_t bytes) {
    return d_.check(d_.cuMemcpyHtoDAsync(to, from, bytes, s_), "cuMemcpyHtoDAsync (host staging into recvbuff)");
  }
  Status recordLast() { return d_.check(d_.cuEventRecord(last_, s_), "cuEventRecord (the call's end)"); }
  void pendingBorn() {
    std::lock_guard l(mu_);
    ++pending_;
  }
  void pendingGone() {
    std::lock_guard l(mu_);
    --pending_;
    cv_.notify_all();
  }

 private:
  static constexpr uint64_t kWords = 4096;
  static constexpr uint64_t kMaxInFlight = 64;

  static void* gateOf(uint32_t ticket) { return reinterpret_cast<void*>(uintptr_t{ticket}); }
  static uint32_t ticketOf(void* gate) { return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(gate)); }
  // Tickets start at 1 and skip 0 on wrapping (a gate of 0 is "none").
  uint32_t nextTicket() {
    std::lock_guard l(mu_);
    if (++ticket_ == 0) ++ticket_;
    return ticket_;
  }
  Status waitGate(uint32_t ticket) {
    return d_.check(d_.cuStreamWaitValue32(s_, words_dev_ + (ticket % kWords) * sizeof(uint32_t), ticket,
                                           kCuStreamWaitValueGeq),
                    "cuStreamWaitValue32 (the call's gate)");
  }
  Result<uint32_t> gateAfter() {
    const uint32_t t = nextTicket();
    CHORUS_RETURN_IF_ERROR(waitGate(t));
    return t;
  }

  // The call's buffers: device memory of the stream's context, each within
  // its allocation.
  Result<CudaBuf> resolve(const char* fn, const char* arg, const void* p, uint64_t bytes) const {
    const auto ptr = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p));
    unsigned type = 0;
    if (d_.cuPointerGetAttribute(&type, kCuPointerAttributeMemoryType, ptr) != kCudaSuccess)
      return invalidArgument("{}: {}={} is not memory the CUDA driver knows, but the call is on a CUDA stream (a host "
                             "pointer? pass device memory from cuMemAlloc)",
                             fn, arg, p);
    if (type != kCuMemoryTypeDevice && type != kCuMemoryTypeUnified)
      return invalidArgument("{}: {}={} is page-locked host memory (cuMemHostAlloc), but the call is on a CUDA stream: "
                             "pass device memory from cuMemAlloc",
                             fn, arg, p);
    CUcontext owner = nullptr;
    if (d_.cuPointerGetAttribute(&owner, kCuPointerAttributeContext, ptr) == kCudaSuccess && owner != ctx_)
      return invalidArgument("{}: {}={} is memory of CUDA context {}, but the stream belongs to context {}", fn, arg,
                             p, static_cast<void*>(owner), static_cast<void*>(ctx_));
    CUdeviceptr base = 0;
    size_t size = 0;
    CHORUS_RETURN_IF_ERROR(d_.check(d_.cuMemGetAddressRange(&base, &size, ptr), "cuMemGetAddressRange"));
    const uint64_t off = ptr - base;
    if (bytes > size - off)
      return invalidArgument("{}: {}: {} bytes at offset {} pass the end of its CUDA allocation of {} bytes", fn, arg,
                             bytes, off, size);
    return CudaBuf{ptr, base, bytes};
  }
  using CallBuffers = std::pair<std::optional<CudaBuf>, std::optional<CudaBuf>>;
  Result<CallBuffers> resolveCall(const StagedCall& call) const {
    CallBuffers b;
    if (call.send_bytes > 0) {
      CHORUS_ASSIGN_OR_RETURN(b.first, resolve(call.fn, "sendbuff", call.send, call.send_bytes));
    }
    if (call.recv_bytes > 0) {
      CHORUS_ASSIGN_OR_RETURN(b.second, resolve(call.fn, "recvbuff", call.recv, call.recv_bytes));
    }
    return b;
  }

  // Overlapping buffers are staged as their union (addresses of the unified
  // address space: overlapping ones lie in one allocation).
  using Layout = StageLayout;
  static Layout layout(const StagedCall& call, const std::optional<CudaBuf>& in, const std::optional<CudaBuf>& out) {
    return stageLayout(call, in.has_value(), out.has_value(), true, in ? in->ptr : 0, out ? out->ptr : 0);
  }

  bool pipelinable(const StagedCall& call, const std::optional<CudaBuf>& in,
                   const std::optional<CudaBuf>& out) const {
    return device::pipelinable(call, opt_.chunk_bytes, in.has_value(), out.has_value(), true, in ? in->ptr : 0,
                               out ? out->ptr : 0);
  }

  // Pipelined chunks, as the OpenCL stream's `pipeline` (memory.cpp): chunk
  // k is a part of its own, its input copied into slot k % kSlots of a ring
  // of pinned chunks, an event recorded after the copy, its gate, its copy
  // back.  On the one stream the order is R0 R1 | G0 W0 R2 | G1 W1 R3 ...:
  // while chunk k+1's host part runs, the stream copies chunk k back and
  // chunk k+2 in; a read into a slot follows the copy back of the slot's
  // previous chunk in stream order, and a host part writes its slot only
  // after its own read (its event), so no slot is reused early.
  static constexpr uint64_t kAhead = ChunkRing::kAhead;
  Status enqueuePipelined(const StagedCall& call, const std::optional<CudaBuf>& in,
                          const std::optional<CudaBuf>& out, CudaPending& p) {
    const uint64_t es = call.elem_bytes;
    const bool inplace = in && out && in->ptr == out->ptr;
    const ChunkRing ring = chunkRing(call, opt_.chunk_bytes, in && out && !inplace);
    const uint64_t nchunks = ring.nchunks, chunk = ring.chunk, recv_at = ring.recv_at;
    CHORUS_RETURN_IF_ERROR(ensureStaging(ring.total()));
    auto bytesOf = [&](uint64_t k) { return ring.bytes(k); };
    auto slotOf = [&](uint64_t k) { return stage_ + ring.slotOffset(k); };
    // Chunk k's read and its event, held by part k from the start (the
    // pending call's destructor releases what an error leaves).
    p.parts.resize(nchunks);
    auto read = [&](uint64_t k) -> Status {
      if (in)
        CHORUS_RETURN_IF_ERROR(d_.check(d_.cuMemcpyDtoHAsync(slotOf(k), in->ptr + k * chunk, bytesOf(k), s_),
                                        "cuMemcpyDtoHAsync (a chunk of sendbuff)"));
      CHORUS_RETURN_IF_ERROR(d_.check(d_.cuEventCreate(&p.parts[k].ready, kCuEventDisableTiming), "cuEventCreate"));
      return d_.check(d_.cuEventRecord(p.parts[k].ready, s_), "cuEventRecord (a chunk's input)");
    };
    for (uint64_t k = 0; k < std::min(kAhead, nchunks); ++k) CHORUS_RETURN_IF_ERROR(read(k));
    for (uint64_t k = 0; k < nchunks; ++k) {
      CudaPart& part = p.parts[k];
      std::byte* s = slotOf(k);
      part.send = in ? s : nullptr;
      part.recv = out ? s + recv_at : nullptr;
      aliasUnused(call, part.send, part.recv);
      part.count = bytesOf(k) / es;
      CHORUS_ASSIGN_OR_RETURN(part.gate, gateAfter());
      part.gated = true;
      if (out && call.recv_written)
        CHORUS_RETURN_IF_ERROR(d_.check(d_.cuMemcpyHtoDAsync(out->ptr + k * chunk, s + recv_at, bytesOf(k), s_),
                                        "cuMemcpyHtoDAsync (a chunk into recvbuff)"));
      if (k + kAhead < nchunks) CHORUS_RETURN_IF_ERROR(read(k + kAhead));
    }
    stats_.chunks += nchunks;
    return recordLast();
  }

  // The copies into `stage`, in stream order: the input, and the output's
  // bytes the call leaves (a v-collective's gaps) where it writes only parts.
  Status copyIn(const StagedCall& call, const std::optional<CudaBuf>& in, const std::optional<CudaBuf>& out,
                const Layout& l, std::byte* stage) {
    if (l.unite)
      return d_.check(d_.cuMemcpyDtoHAsync(stage, l.lo, l.total, s_), "cuMemcpyDtoHAsync (sendbuff into host staging)");
    if (out && call.recv_partial)
      CHORUS_RETURN_IF_ERROR(d_.check(d_.cuMemcpyDtoHAsync(stage + l.recv_at, out->ptr, call.recv_bytes, s_),
                                      "cuMemcpyDtoHAsync (recvbuff into host staging)"));
    if (in)
      CHORUS_RETURN_IF_ERROR(d_.check(d_.cuMemcpyDtoHAsync(stage + l.send_at, in->ptr, call.send_bytes, s_),
                                      "cuMemcpyDtoHAsync (sendbuff into host staging)"));
    return {};
  }

  // The stream's staging, grown by doubling: a smaller one may still be
  // copied from by enqueued work, so it is kept until the stream goes.
  Status ensureStaging(uint64_t bytes) {
    if (bytes <= cap_ && stage_ != nullptr) return {};
    uint64_t cap = 64 * 1024;
    while (cap < bytes) cap *= 2;
    void* p = nullptr;
    CHORUS_RETURN_IF_ERROR(
        d_.check(d_.cuMemHostAlloc(&p, cap, kCuMemHostAllocPortable), "cuMemHostAlloc (host staging)"));
    if (stage_ != nullptr) retired_staging_.push_back(stage_);
    stage_ = static_cast<std::byte*>(p);
    cap_ = cap;
    return {};
  }

  // A group call's staging, freed once the stream passed its last use.
  void retire(void* pinned) {
    CUevent ev = nullptr;
    if (d_.cuEventCreate(&ev, kCuEventDisableTiming) == kCudaSuccess && d_.cuEventRecord(ev, s_) == kCudaSuccess) {
      retired_.emplace_back(pinned, ev);
      return;
    }
    if (ev != nullptr) d_.cuEventDestroy(ev);
    d_.cuStreamSynchronize(s_);
    d_.cuMemFreeHost(pinned);
  }
  void reap(bool all) {
    std::erase_if(retired_, [&](const std::pair<void*, CUevent>& r) {
      if (!all && d_.cuEventQuery(r.second) != kCudaSuccess) return false;
      d_.cuEventDestroy(r.second);
      d_.cuMemFreeHost(r.first);
      return true;
    });
  }

  const CudaDriver& d_;
  CUstream s_;
  CUcontext ctx_;
  StagingOptions opt_;
  StagingStats stats_;
  bool can_wait_ = false;
  std::string wait_refused_;
  uint32_t* words_ = nullptr;
  CUdeviceptr words_dev_ = 0;
  uint32_t ticket_ = 0;
  CUevent last_ = nullptr;
  std::byte* stage_ = nullptr;
  uint64_t cap_ = 0;
  std::vector<void*> retired_staging_;
  std::vector<std::pair<void*, CUevent>> retired_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t pending_ = 0;
  Status error_;
};

CudaPending::CudaPending(CudaStreamImpl* s) : s_(s) { s_->pendingBorn(); }

CudaPending::~CudaPending() {
  // Never run (or run and failed): the gates open, so the stream drains.
  for (CudaPart& p : parts) {
    if (p.gated) s_->open(p.gate);
    if (p.ready != nullptr) s_->driver().cuEventDestroy(p.ready);
  }
  s_->pendingGone();
}

Status CudaPending::run(const HostCall& host, bool late) {
  const CudaDriver& d = s_->driver();
  CudaCtxScope scope(d, s_->context());
  Status st;
  for (CudaPart& p : parts) {
    const bool was_ok = st.isOk();
    if (st.isOk() && p.ready != nullptr) st = d.check(d.cuEventSynchronize(p.ready), "cuEventSynchronize (the call's inputs)");
    if (st.isOk()) st = host(p.send, p.recv, p.count);
    if (late && was_ok && !st.isOk()) s_->recordError(st);  // before the gate opens
    if (p.gated) {
      s_->open(p.gate);
      p.gated = false;
    } else if (st.isOk()) {
      // A synchronous stream: the copy back follows the host call.
      if (p.write_bytes > 0) st = s_->copyBack(p.write_to, p.write_from, p.write_bytes);
      if (st.isOk()) st = s_->recordLast();
    }
    if (p.ready != nullptr) {
      d.cuEventDestroy(p.ready);
      p.ready = nullptr;
    }
  }
  return st;
}

}  // namespace

bool cudaInUse() { return g_cuda_in_use.load(std::memory_order_relaxed); }

unsigned cudaMemoryType(const void* p) {
  if (!cudaInUse() || p == nullptr) return 0;
  const CudaDriver& d = cudaDriver();
  unsigned type = 0;
  if (d.cuPointerGetAttribute(&type, kCuPointerAttributeMemoryType,
                              static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p))) != kCudaSuccess)
    return 0;
  return type;
}

Result<std::unique_ptr<DeviceStream>> makeCudaStream(void* cu_stream, const StagingOptions& options) {
  const CudaDriver& d = cudaDriver();
  if (!d.status.isOk()) return d.status.withContext("chorusStreamCreateCuda: ");
  if (options.mode == Staging::Map)
    return invalidArgument("chorusStreamCreateCuda: CHORUS_DEVICE_STAGING=map: a CUDA stream stages through pinned "
                           "host memory (auto or pipeline: chunks; whole; docs/device.md, \"CUDA\")");
  if (options.chunk_bytes == 0) return invalidArgument("chorusStreamCreateCuda: a staging chunk of 0 bytes");
  auto s = static_cast<CUstream>(cu_stream);
  CUcontext ctx = nullptr;
  const CUresult r = d.cuStreamGetCtx(s, &ctx);
  if (r != kCudaSuccess || ctx == nullptr)
    return invalidArgument("chorusStreamCreateCuda: cuStream={} is not a stream of a CUDA context ({}; NULL names the "
                           "legacy default stream of the calling thread's current context)",
                           cu_stream, r != kCudaSuccess ? d.errorName(r) : "no current context");
  auto impl = std::make_unique<CudaStreamImpl>(d, s, ctx, options);
  CHORUS_RETURN_IF_ERROR(impl->init().withContext("chorusStreamCreateCuda: "));
  g_cuda_in_use.store(true, std::memory_order_relaxed);
  return std::unique_ptr<DeviceStream>(std::move(impl));
}

}  // namespace chorus::device
