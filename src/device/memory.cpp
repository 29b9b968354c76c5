// The device-buffer registry and the OpenCL stream (memory.hpp).
#include "device/memory.hpp"

#include <sys/mman.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <vector>

#include "device/cuda_driver.hpp"

#ifdef CHORUS_HAVE_OPENCL
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include <CL/cl_ext.h>  // CL_PLATFORM_NOT_FOUND_KHR (the ICD loader's "no platform")
#endif

namespace chorus::device {

const char* spaceName(Space s) {
  switch (s) {
    case Space::Host: return "host";
    case Space::OpenCL: return "opencl";
    case Space::Cuda: return "cuda";
  }
  return "?";
}

const char* stagingName(Staging s) {
  switch (s) {
    case Staging::Auto: return "auto";
    case Staging::Map: return "map";
    case Staging::Pipeline: return "pipeline";
    case Staging::Whole: return "whole";
  }
  return "?";
}

std::optional<Staging> parseStaging(std::string_view s) {
  for (Staging m : {Staging::Auto, Staging::Map, Staging::Pipeline, Staging::Whole})
    if (s == stagingName(m)) return m;
  return std::nullopt;
}

bool spaceBuilt(Space s) {
#ifdef CHORUS_HAVE_OPENCL
  if (s == Space::OpenCL) return true;
#endif
  return s != Space::OpenCL;
}

namespace {

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Registration> by_base;  // key: the device address
  std::atomic<size_t> count{0};
};
Registry& registry() {
  static Registry r;
  return r;
}

// A range of address space nothing else will ever be given: the device
// addresses of one buffer.  At least one page, so that an empty buffer has
// an address too.
Result<std::byte*> reserveRange(uint64_t bytes) {
  const uint64_t len = bytes == 0 ? 1 : bytes;
  void* p = ::mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return errnoError("chorusMemRegister: reserving the device address range", errno);
  return static_cast<std::byte*>(p);
}
void releaseRange(std::byte* base, uint64_t bytes) { ::munmap(base, bytes == 0 ? 1 : bytes); }

#ifdef CHORUS_HAVE_OPENCL
const char* clErrorName(cl_int e) {
  switch (e) {
    case CL_SUCCESS: return "CL_SUCCESS";
    case CL_INVALID_MEM_OBJECT: return "CL_INVALID_MEM_OBJECT";
    case CL_INVALID_COMMAND_QUEUE: return "CL_INVALID_COMMAND_QUEUE";
    case CL_INVALID_CONTEXT: return "CL_INVALID_CONTEXT";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_EVENT: return "CL_INVALID_EVENT";
    case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_INVALID_BUFFER_SIZE: return "CL_INVALID_BUFFER_SIZE";
    case CL_MAP_FAILURE: return "CL_MAP_FAILURE";
    case CL_PLATFORM_NOT_FOUND_KHR: return "CL_PLATFORM_NOT_FOUND_KHR";
    case CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST: return "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST";
    default: return "an OpenCL error";
  }
}
Status clFailed(const char* what, cl_int e) {
  return makeError(chorusSystemError, "{} failed: {} ({})", what, clErrorName(e), e);
}
#endif

}  // namespace

bool anyRegistered() { return registry().count.load(std::memory_order_relaxed) != 0; }

std::optional<Registration> find(const void* p) {
  Registry& r = registry();
  if (r.count.load(std::memory_order_acquire) == 0) return std::nullopt;
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard l(r.mu);
  auto it = r.by_base.upper_bound(a);
  if (it == r.by_base.begin()) return std::nullopt;
  --it;
  const Registration& reg = it->second;
  // The reserved range is max(bytes, 1) long: an empty buffer's address is its own.
  if (a - it->first < std::max<uint64_t>(reg.bytes, 1)) return reg;
  return std::nullopt;
}

std::string describe(const void* p) {
  if (auto reg = find(p))
    return fmt::format("an {} device address (offset {} of a buffer of {} bytes)", spaceName(reg->space),
                       static_cast<const std::byte*>(p) - reg->base, reg->bytes);
  return "host memory";
}

StageLayout stageLayout(const StagedCall& call, bool has_in, bool has_out, bool same, uint64_t in_at,
                        uint64_t out_at) {
  StageLayout l;
  l.unite = has_in && has_out && same && in_at < out_at + call.recv_bytes && out_at < in_at + call.send_bytes;
  if (l.unite) {
    l.lo = std::min(in_at, out_at);
    l.total = std::max(in_at + call.send_bytes, out_at + call.recv_bytes) - l.lo;
    l.send_at = in_at - l.lo;
    l.recv_at = out_at - l.lo;
  } else {
    l.recv_at = (call.send_bytes + 63) / 64 * 64;
    l.total = l.recv_at + call.recv_bytes;
  }
  return l;
}

void aliasUnused(const StagedCall& call, std::byte*& send_host, std::byte*& recv_host) {
  if (send_host == nullptr && recv_host != nullptr && call.send == call.recv) send_host = recv_host;
  if (recv_host == nullptr && send_host != nullptr && call.recv == call.send) recv_host = send_host;
}

namespace {
uint64_t chunkElems(const StagedCall& call, uint64_t chunk_bytes) {
  return std::max<uint64_t>(1, chunk_bytes / std::max<uint64_t>(call.elem_bytes, 1));
}
}  // namespace

bool pipelinable(const StagedCall& call, uint64_t chunk_bytes, bool has_in, bool has_out, bool same, uint64_t in_at,
                 uint64_t out_at) {
  if (!call.elementwise || call.elem_bytes == 0 || call.recv_partial) return false;
  if (has_in && call.send_bytes != call.count * call.elem_bytes) return false;
  if (has_out && call.recv_bytes != call.count * call.elem_bytes) return false;
  if (call.count <= chunkElems(call, chunk_bytes)) return false;
  if (has_in && has_out && same && in_at != out_at && in_at < out_at + call.recv_bytes &&
      out_at < in_at + call.send_bytes)
    return false;
  return true;
}

ChunkRing chunkRing(const StagedCall& call, uint64_t chunk_bytes, bool out_of_place) {
  ChunkRing r;
  r.count = call.count;
  r.elem_bytes = call.elem_bytes;
  r.elems = chunkElems(call, chunk_bytes);
  r.nchunks = (call.count + r.elems - 1) / r.elems;
  r.chunk = r.elems * call.elem_bytes;
  r.recv_at = out_of_place ? (r.chunk + 63) / 64 * 64 : 0;
  r.slot = (r.recv_at + r.chunk + 63) / 64 * 64;
  return r;
}

Status spaceAvailable(Space s) {
  switch (s) {
    case Space::Host: return {};
    case Space::Cuda: return cudaDriver().status;
    case Space::OpenCL: {
#ifdef CHORUS_HAVE_OPENCL
      cl_uint n = 0;
      const cl_int e = clGetPlatformIDs(0, nullptr, &n);
      if (e == CL_PLATFORM_NOT_FOUND_KHR || (e == CL_SUCCESS && n == 0))
        return makeError(chorusSystemError,
                         "no OpenCL platform (the ICD loader finds none; Debian: pocl-opencl-icd, clinfo -l lists them)");
      if (e != CL_SUCCESS) return clFailed("clGetPlatformIDs", e);
      return {};
#else
      return makeError(chorusSystemError,
                       "OpenCL: this chorus was built without OpenCL (no OpenCL headers and loader at configure time; "
                       "Debian: ocl-icd-opencl-dev opencl-headers)");
#endif
    }
  }
  return invalidArgument("unknown memory space {}", static_cast<int>(s));
}

Result<void*> registerOpenCL(void* mem) {
#ifdef CHORUS_HAVE_OPENCL
  if (mem == nullptr) return invalidArgument("chorusMemRegisterOpenCL: clMem is NULL (pass a cl_mem from clCreateBuffer)");
  auto m = static_cast<cl_mem>(mem);
  cl_mem_object_type type = 0;
  cl_int e = clGetMemObjectInfo(m, CL_MEM_TYPE, sizeof type, &type, nullptr);
  if (e != CL_SUCCESS)
    return invalidArgument("chorusMemRegisterOpenCL: clMem={} is not an OpenCL memory object ({} from clGetMemObjectInfo)",
                           mem, clErrorName(e));
  if (type != CL_MEM_OBJECT_BUFFER)
    return invalidArgument("chorusMemRegisterOpenCL: clMem={} is an image or pipe, not a buffer (clCreateBuffer)", mem);
  size_t size = 0;
  cl_context ctx = nullptr;
  cl_mem parent = nullptr;
  if ((e = clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof size, &size, nullptr)) != CL_SUCCESS)
    return clFailed("clGetMemObjectInfo(CL_MEM_SIZE)", e);
  if ((e = clGetMemObjectInfo(m, CL_MEM_CONTEXT, sizeof ctx, &ctx, nullptr)) != CL_SUCCESS)
    return clFailed("clGetMemObjectInfo(CL_MEM_CONTEXT)", e);
  if ((e = clGetMemObjectInfo(m, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, nullptr)) != CL_SUCCESS)
    return clFailed("clGetMemObjectInfo(CL_MEM_ASSOCIATED_MEMOBJECT)", e);
  if (parent != nullptr)
    return invalidArgument("chorusMemRegisterOpenCL: clMem={} is a sub-buffer; register its parent and pass an offset",
                           mem);
  CHORUS_ASSIGN_OR_RETURN(std::byte * base, reserveRange(size));
  if ((e = clRetainMemObject(m)) != CL_SUCCESS) {
    releaseRange(base, size);
    return clFailed("clRetainMemObject", e);
  }
  Registration reg{Space::OpenCL, mem, ctx, base, size};
  Registry& r = registry();
  std::lock_guard l(r.mu);
  r.by_base.emplace(reinterpret_cast<uintptr_t>(base), reg);
  r.count.fetch_add(1, std::memory_order_release);
  return static_cast<void*>(base);
#else
  (void)mem;
  return spaceAvailable(Space::OpenCL).withContext("chorusMemRegisterOpenCL: ");
#endif
}

Status deregister(void* address) {
  Registry& r = registry();
  Registration reg;
  {
    std::lock_guard l(r.mu);
    auto it = r.by_base.find(reinterpret_cast<uintptr_t>(address));
    if (it == r.by_base.end())
      return invalidArgument("chorusMemDeregister: devPtr={} is not the address of a registered device buffer "
                             "(the value chorusMemRegisterOpenCL returned)",
                             address);
    reg = it->second;
    r.by_base.erase(it);
    r.count.fetch_sub(1, std::memory_order_release);
  }
  releaseRange(reg.base, reg.bytes);
#ifdef CHORUS_HAVE_OPENCL
  if (reg.space == Space::OpenCL) clReleaseMemObject(static_cast<cl_mem>(reg.handle));
#endif
  return {};
}

#ifdef CHORUS_HAVE_OPENCL
namespace {

// Where a call's buffer lies: registration and byte offset, checked.
struct Resolved {
  Registration reg;
  uint64_t offset = 0;
};

Result<Resolved> resolve(const char* fn, const char* arg, const void* p, uint64_t bytes, cl_context ctx) {
  auto reg = find(p);
  if (!reg)
    return invalidArgument("{}: {}={} is not in a registered OpenCL buffer, but the call is on an OpenCL stream "
                           "(a host pointer? register the cl_mem with chorusMemRegisterOpenCL and pass its device "
                           "address plus the byte offset)",
                           fn, arg, p);
  const uint64_t off = static_cast<uint64_t>(static_cast<const std::byte*>(p) - reg->base);
  if (reg->space != Space::OpenCL)
    return invalidArgument("{}: {}={} is {} memory, but the call is on an OpenCL stream", fn, arg, p,
                           spaceName(reg->space));
  if (bytes > reg->bytes - off)
    return invalidArgument("{}: {}: {} bytes at offset {} pass the end of its OpenCL buffer of {} bytes (CL_MEM_SIZE)",
                           fn, arg, bytes, off, reg->bytes);
  if (reg->context != ctx)
    return invalidArgument("{}: {}={} is a buffer of OpenCL context {}, but the stream's queue belongs to context {}",
                           fn, arg, p, reg->context, static_cast<void*>(ctx));
  return Resolved{*reg, off};
}

// Whether the device's memory is the host's (CPUs, integrated GPUs): mapping a
// buffer then hands out the buffer itself, with no copy.
bool hostUnified(cl_command_queue q) {
  cl_device_id dev = nullptr;
  if (clGetCommandQueueInfo(q, CL_QUEUE_DEVICE, sizeof dev, &dev, nullptr) != CL_SUCCESS) return false;
  cl_bool unified = CL_FALSE;
  if (clGetDeviceInfo(dev, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof unified, &unified, nullptr) != CL_SUCCESS)
    return false;
  return unified == CL_TRUE;
}

class ClStreamImpl;

// One host part of a pending call: wait for `ready` (the part's inputs are on
// the host), run the host call on send/recv, complete `gate` (the user event
// the part's write-back or unmap waits for).
struct Part {
  cl_event ready = nullptr;
  std::byte* send = nullptr;
  std::byte* recv = nullptr;
  uint64_t count = 0;
  cl_event gate = nullptr;
};

class PendingImpl final : public PendingCall {
 public:
  explicit PendingImpl(ClStreamImpl* s);
  ~PendingImpl() override;
  Status run(const HostCall& host, bool late) override {
    Status st;
    for (Part& p : parts) {
      const bool was_ok = st.isOk();
      if (st.isOk() && p.ready != nullptr) {
        const cl_int e = clWaitForEvents(1, &p.ready);
        if (e != CL_SUCCESS) st = clFailed("clWaitForEvents (the call's inputs on the host)", e);
      }
      if (st.isOk()) st = host(p.send, p.recv, p.count);
      if (late && was_ok && !st.isOk()) recordOnStream(st);  // before the gate opens
      open(p);
    }
    return st;
  }
  // Releases the queue's commands behind the part (after a failure too: the
  // queue must not stall; the outputs are then undefined).
  static void open(Part& p) {
    if (p.gate != nullptr) {
      clSetUserEventStatus(p.gate, CL_COMPLETE);
      clReleaseEvent(p.gate);
      p.gate = nullptr;
    }
    if (p.ready != nullptr) {
      clReleaseEvent(p.ready);
      p.ready = nullptr;
    }
  }
  // A new part's gate (a user event of the stream's context).
  Result<cl_event> addPart(cl_context ctx, cl_event ready, std::byte* send, std::byte* recv, uint64_t count) {
    parts.push_back(Part{ready, send, recv, count, nullptr});
    cl_int e = CL_SUCCESS;
    cl_event gate = clCreateUserEvent(ctx, &e);
    if (e != CL_SUCCESS) return clFailed("clCreateUserEvent", e);
    parts.back().gate = gate;
    return gate;
  }
  std::vector<Part> parts;

 private:
  void recordOnStream(const Status& st);
  ClStreamImpl* s_;
};

class ClStreamImpl final : public DeviceStream {
 public:
  ClStreamImpl(cl_command_queue q, cl_context ctx, const StagingOptions& o) : q_(q), ctx_(ctx), opt_(o) {
    clRetainCommandQueue(q_);
    resolved_ = opt_.mode != Staging::Auto ? opt_.mode : hostUnified(q_) ? Staging::Map : Staging::Pipeline;
    stats_.resolved = resolved_;
  }
  ~ClStreamImpl() override {
    {
      std::unique_lock l(mu_);
      cv_.wait(l, [&] { return pending_ == 0; });
    }
    clFinish(q_);
    if (last_) clReleaseEvent(last_);
    releaseStaging();
    clReleaseCommandQueue(q_);
  }

  // The call's device buffers (none where it has no bytes), each checked
  // against its cl_mem.
  using CallBuffers = std::pair<std::optional<Resolved>, std::optional<Resolved>>;
  Result<CallBuffers> resolveCall(const StagedCall& call) const {
    CallBuffers b;
    if (call.send_bytes > 0) {
      CHORUS_ASSIGN_OR_RETURN(b.first, resolve(call.fn, "sendbuff", call.send, call.send_bytes, ctx_));
    }
    if (call.recv_bytes > 0) {
      CHORUS_ASSIGN_OR_RETURN(b.second, resolve(call.fn, "recvbuff", call.recv, call.recv_bytes, ctx_));
    }
    return b;
  }

  Result<std::unique_ptr<PendingCall>> enqueue(const StagedCall& call) override {
    CHORUS_ASSIGN_OR_RETURN(auto bufs, resolveCall(call));
    {
      // Back-pressure: at most kMaxInFlight calls whose host parts have not
      // run (a launch queue's depth, as CUDA's), so a loop of calls cannot
      // grow the queue and the worker's FIFO without bound.  A caller that
      // holds its queue (a user event) and issues more than that many calls
      // waits here until it releases it, as a full CUDA launch queue blocks.
      // (No speed effect could be measured at load 7: 1, 4, 64 and unbounded
      // gave 26-239 us per 8 B call, all within the noise.)
      std::unique_lock l(mu_);
      cv_.wait(l, [&] { return pending_ < kMaxInFlight; });
    }
    const std::optional<Resolved>& in = bufs.first;
    const std::optional<Resolved>& out = bufs.second;
    auto p = std::make_unique<PendingImpl>(this);
    Status st;
    ++stats_.calls;
    if (resolved_ == Staging::Map) {
      ++stats_.mapped_calls;
      st = enqueueMapped(call, in, out, *p);
    } else if (resolved_ == Staging::Pipeline && pipelinable(call, in, out)) {
      ++stats_.pipelined_calls;
      st = enqueuePipelined(call, in, out, *p);
    } else {
      ++stats_.whole_calls;
      st = enqueueWhole(call, in, out, *p);
    }
    clFlush(q_);
    if (!st.isOk()) return st;  // p's gates open: what was enqueued drains
    return std::unique_ptr<PendingCall>(std::move(p));
  }

  void recordError(const Status& st) override {
    std::lock_guard l(mu_);
    if (error_.isOk() && !st.isOk()) error_ = st;
  }

  Status synchronize() override {
    const cl_int e = clFinish(q_);
    if (e != CL_SUCCESS) return clFailed("clFinish", e);
    std::lock_guard l(mu_);
    return error_;
  }

  Status query() override {
    {
      std::lock_guard l(mu_);
      if (!error_.isOk()) return error_;
    }
    if (last_ == nullptr) return {};
    cl_int status = CL_COMPLETE;
    const cl_int e = clGetEventInfo(last_, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr);
    if (e != CL_SUCCESS) return clFailed("clGetEventInfo", e);
    if (status < 0) return clFailed("the stream's last copy back", status);
    if (status != CL_COMPLETE) return makeError(chorusInProgress, "the OpenCL stream's last call is in flight");
    return {};
  }

  void* lastEvent() override {
    if (last_ == nullptr) return nullptr;
    clRetainEvent(last_);
    return last_;
  }
  [[nodiscard]] void* queue() const override { return q_; }
  [[nodiscard]] StagingStats stats() const override { return stats_; }
  [[nodiscard]] bool async() const override { return opt_.async; }
  [[nodiscard]] Space space() const override { return Space::OpenCL; }

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
  using Layout = StageLayout;
  static Layout layout(const StagedCall& call, const std::optional<Resolved>& in, const std::optional<Resolved>& out) {
    return stageLayout(call, in.has_value(), out.has_value(), in && out && in->reg.handle == out->reg.handle,
                       in ? in->offset : 0, out ? out->offset : 0);
  }

  // A marker: with a wait list, the call's place in the queue (nothing is
  // written back; the stream's last event); without, an event that completes
  // once the queue's earlier commands have.
  Result<cl_event> marker(cl_event after) {
    cl_event ev = nullptr;
    const cl_int e = clEnqueueMarkerWithWaitList(q_, after ? 1 : 0, after ? &after : nullptr, &ev);
    if (e != CL_SUCCESS) return clFailed("clEnqueueMarkerWithWaitList", e);
    return ev;
  }
  Status markLast(cl_event after) {
    CHORUS_ASSIGN_OR_RETURN(cl_event ev, marker(after));
    setLast(ev);
    return {};
  }

  // Staging::Map.  The buffers are mapped (overlapping ones as their union;
  // non-blocking, the last map's event says they are on the host), the host
  // part runs on the mapped memory, and the unmaps wait for its gate: the
  // last unmap's event is the call's.  On a device whose memory is the
  // host's a map is the buffer itself: no byte is copied.
  Status enqueueMapped(const StagedCall& call, const std::optional<Resolved>& in, const std::optional<Resolved>& out,
                       PendingImpl& p) {
    MappedCall m;
    cl_event ready = nullptr;
    Status st = mapResolved(call, in, out, m, false, &ready);
    if (!st.isOk()) {
      if (ready) clReleaseEvent(ready);
      (void)unmapAfter(m, nullptr);
      return st;
    }
    auto gate = p.addPart(ctx_, ready, static_cast<std::byte*>(const_cast<void*>(m.send)),
                          static_cast<std::byte*>(m.recv), call.count);
    if (!gate.isOk()) {
      (void)unmapAfter(m, nullptr);
      return gate.status();
    }
    return unmapAfter(m, *gate);
  }

 public:
  Result<MappedCall> mapCall(const StagedCall& call, bool blocking) override {
    CHORUS_ASSIGN_OR_RETURN(auto bufs, resolveCall(call));
    const std::optional<Resolved>& in = bufs.first;
    const std::optional<Resolved>& out = bufs.second;
    ++stats_.calls;
    ++stats_.mapped_calls;
    MappedCall m;
    cl_event ready = nullptr;
    Status st = mapResolved(call, in, out, m, blocking, blocking ? nullptr : &ready);
    m.ready = ready;
    clFlush(q_);
    if (!st.isOk()) {
      (void)unmapCall(m, nullptr);
      return st;
    }
    return m;
  }

  Status waitMapped(MappedCall& m) override {
    if (m.ready == nullptr) return {};
    auto ev = static_cast<cl_event>(m.ready);
    const cl_int e = clWaitForEvents(1, &ev);
    clReleaseEvent(ev);
    m.ready = nullptr;
    if (e != CL_SUCCESS) return clFailed("clWaitForEvents (a group call's maps)", e);
    return {};
  }

  Status unmapCall(MappedCall& m, void* gate) override {
    if (m.ready != nullptr) {
      clReleaseEvent(static_cast<cl_event>(m.ready));
      m.ready = nullptr;
    }
    return unmapAfter(m, static_cast<cl_event>(gate));
  }

  Result<void*> makeGate() override {
    cl_int e = CL_SUCCESS;
    cl_event gate = clCreateUserEvent(ctx_, &e);
    if (e != CL_SUCCESS) return clFailed("clCreateUserEvent", e);
    pendingBorn();
    return static_cast<void*>(gate);
  }
  void openGate(void* gate) override {
    auto ev = static_cast<cl_event>(gate);
    clSetUserEventStatus(ev, CL_COMPLETE);
    clReleaseEvent(ev);
    pendingGone();
  }

 private:
  // Enqueues the unmaps of m, each after `gate` when there is one; the last
  // one's event (or a marker's) is the stream's.
  Status unmapAfter(MappedCall& m, cl_event gate) {
    Status st;
    cl_event ev = nullptr;
    for (const auto& [mem, ptr] : m.maps) {
      if (ev) clReleaseEvent(ev);
      ev = nullptr;
      const cl_int e =
          clEnqueueUnmapMemObject(q_, static_cast<cl_mem>(mem), ptr, gate ? 1 : 0, gate ? &gate : nullptr, &ev);
      if (e != CL_SUCCESS && st.isOk()) st = clFailed("clEnqueueUnmapMemObject", e);
    }
    m.maps.clear();
    if (ev) {
      setLast(ev);
      clFlush(q_);
    } else if (st.isOk()) {
      st = markLast(gate);
    }
    return st;
  }

  // blocking: the last map waits (in queue order) for the buffers; else
  // *ready receives its event (a marker's where nothing is mapped).
  Status mapResolved(const StagedCall& call, const std::optional<Resolved>& in, const std::optional<Resolved>& out,
                     MappedCall& m, bool blocking, cl_event* ready) {
    const Layout l = layout(call, in, out);
    auto map = [&](const Resolved& r, uint64_t off, uint64_t bytes, cl_map_flags flags,
                   bool last) -> Result<std::byte*> {
      cl_int e = CL_SUCCESS;
      auto mem = static_cast<cl_mem>(r.reg.handle);
      void* p = clEnqueueMapBuffer(q_, mem, last && blocking ? CL_TRUE : CL_FALSE, flags, off, bytes, 0, nullptr,
                                   last && !blocking ? ready : nullptr, &e);
      if (e != CL_SUCCESS) return clFailed("clEnqueueMapBuffer (a device buffer of the call)", e);
      m.maps.emplace_back(mem, p);
      return static_cast<std::byte*>(p);
    };
    // What the host may find in recvbuff: written whole, the device's bytes
    // need not be read (a discrete device then copies nothing to the host).
    const bool out_whole = out && call.recv_written && !call.recv_partial;
    const cl_map_flags out_flags = out_whole ? CL_MAP_WRITE_INVALIDATE_REGION : (CL_MAP_READ | CL_MAP_WRITE);
    std::byte *send_host = nullptr, *recv_host = nullptr;
    if (l.unite) {
      CHORUS_ASSIGN_OR_RETURN(std::byte * p, map(*in, l.lo, l.total, CL_MAP_READ | CL_MAP_WRITE, true));
      send_host = p + l.send_at;
      recv_host = p + l.recv_at;
    } else {
      if (in) {
        CHORUS_ASSIGN_OR_RETURN(send_host, map(*in, in->offset, call.send_bytes, CL_MAP_READ, !out));
      }
      if (out) {
        CHORUS_ASSIGN_OR_RETURN(recv_host, map(*out, out->offset, call.recv_bytes, out_flags, true));
      }
    }
    if (!blocking && m.maps.empty()) {
      CHORUS_ASSIGN_OR_RETURN(*ready, marker(nullptr));
    }
    aliasUnused(call, send_host, recv_host);
    m.send = send_host;
    m.recv = recv_host;
    return {};
  }

  // Staging::Whole: one read of the input into pinned staging (its event:
  // the part's inputs are there), the host part, one write of the output
  // behind the part's gate.  The staging is the stream's: the next call's
  // reads into it follow this call's write in queue order, and its host part
  // runs after this one's.
  Status enqueueWhole(const StagedCall& call, const std::optional<Resolved>& in, const std::optional<Resolved>& out,
                      PendingImpl& p) {
    const Layout l = layout(call, in, out);
    CHORUS_RETURN_IF_ERROR(ensureStaging(l.total));
    cl_int e = CL_SUCCESS;
    cl_event ready = nullptr;
    if (l.unite) {
      // One read of the union: the input, and the output's bytes the call leaves.
      e = clEnqueueReadBuffer(q_, static_cast<cl_mem>(in->reg.handle), CL_FALSE, l.lo, l.total, stage_, 0, nullptr,
                              &ready);
      if (e != CL_SUCCESS) return clFailed("clEnqueueReadBuffer (sendbuff into host staging)", e);
    } else {
      // In queue order: after the queue's earlier commands (the producer of the input).
      if (out && call.recv_partial) {
        e = clEnqueueReadBuffer(q_, static_cast<cl_mem>(out->reg.handle), CL_FALSE, out->offset, call.recv_bytes,
                                stage_ + l.recv_at, 0, nullptr, in ? nullptr : &ready);
        if (e != CL_SUCCESS) return clFailed("clEnqueueReadBuffer (recvbuff into host staging)", e);
      }
      if (in) {
        e = clEnqueueReadBuffer(q_, static_cast<cl_mem>(in->reg.handle), CL_FALSE, in->offset, call.send_bytes,
                                stage_ + l.send_at, 0, nullptr, &ready);
        if (e != CL_SUCCESS) return clFailed("clEnqueueReadBuffer (sendbuff into host staging)", e);
      }
    }
    if (ready == nullptr) {
      // Nothing read: the host part writes the staging once the previous
      // call's write out of it is done.
      CHORUS_ASSIGN_OR_RETURN(ready, marker(nullptr));
    }
    std::byte* send_host = in ? stage_ + l.send_at : nullptr;
    std::byte* recv_host = out ? stage_ + l.recv_at : nullptr;
    aliasUnused(call, send_host, recv_host);
    CHORUS_ASSIGN_OR_RETURN(cl_event gate, p.addPart(ctx_, ready, send_host, recv_host, call.count));
    if (out && call.recv_written) {
      cl_event ev = nullptr;
      e = clEnqueueWriteBuffer(q_, static_cast<cl_mem>(out->reg.handle), CL_FALSE, out->offset, call.recv_bytes,
                               stage_ + l.recv_at, 1, &gate, &ev);
      if (e != CL_SUCCESS) return clFailed("clEnqueueWriteBuffer (host staging into recvbuff)", e);
      setLast(ev);
      return {};
    }
    return markLast(gate);
  }

  bool pipelinable(const StagedCall& call, const std::optional<Resolved>& in,
                   const std::optional<Resolved>& out) const {
    return device::pipelinable(call, opt_.chunk_bytes, in.has_value(), out.has_value(),
                               in && out && in->reg.handle == out->reg.handle, in ? in->offset : 0,
                               out ? out->offset : 0);
  }

  // Staging::Pipeline.  Chunk k is a part of its own: its input is read
  // (non-blocking, with an event) into slot k % kSlots of a ring of pinned
  // chunks, and its write back waits for its gate.  All of it is enqueued at
  // once, in the order R0 R1 W0 R2 W1 R3 ...: with kAhead reads ahead, chunk
  // k+1's input is on the host when chunk k's host part ends, and the write of
  // chunk k and the read of chunk k+2 run on the queue while chunk k+1's host
  // part runs (its wire transfers and reductions).  A read into a slot waits
  // for the gate of the slot's previous chunk (its host part is done with
  // it); where nothing is read (a broadcast off the root), a marker in the
  // read's place says when the slot's previous write is done.
  static constexpr uint64_t kAhead = ChunkRing::kAhead;
  static constexpr uint64_t kSlots = ChunkRing::kSlots;
  Status enqueuePipelined(const StagedCall& call, const std::optional<Resolved>& in,
                          const std::optional<Resolved>& out, PendingImpl& p) {
    const uint64_t es = call.elem_bytes;
    const bool inplace = in && out && in->reg.handle == out->reg.handle && in->offset == out->offset;
    const ChunkRing ring = chunkRing(call, opt_.chunk_bytes, in && out && !inplace);
    const uint64_t nchunks = ring.nchunks, chunk = ring.chunk, recv_at = ring.recv_at;
    CHORUS_RETURN_IF_ERROR(ensureStaging(ring.total()));
    std::vector<cl_event> ready(nchunks, nullptr), gates(nchunks, nullptr);
    auto bytesOf = [&](uint64_t k) { return ring.bytes(k); };
    auto slotOf = [&](uint64_t k) { return stage_ + ring.slotOffset(k); };
    auto read = [&](uint64_t k) -> Status {
      cl_event after = k >= kSlots ? gates[k - kSlots] : nullptr;
      if (!in) {
        CHORUS_ASSIGN_OR_RETURN(ready[k], marker(after));
        return {};
      }
      const cl_int e = clEnqueueReadBuffer(q_, static_cast<cl_mem>(in->reg.handle), CL_FALSE, in->offset + k * chunk,
                                           bytesOf(k), slotOf(k), after ? 1 : 0, after ? &after : nullptr, &ready[k]);
      if (e != CL_SUCCESS) return clFailed("clEnqueueReadBuffer (a chunk of sendbuff)", e);
      return {};
    };
    for (uint64_t k = 0; k < std::min(kAhead, nchunks); ++k) CHORUS_RETURN_IF_ERROR(read(k));
    cl_event last_write = nullptr;
    Status st;
    for (uint64_t k = 0; k < nchunks && st.isOk(); ++k) {
      std::byte* s = slotOf(k);
      std::byte* send_host = in ? s : nullptr;
      std::byte* recv_host = out ? s + recv_at : nullptr;
      aliasUnused(call, send_host, recv_host);
      auto gate = p.addPart(ctx_, ready[k], send_host, recv_host, bytesOf(k) / es);
      ready[k] = nullptr;  // the part holds it
      if (!gate.isOk()) {
        st = gate.status();
        break;
      }
      gates[k] = *gate;
      if (out && call.recv_written) {
        if (last_write) clReleaseEvent(last_write);
        last_write = nullptr;
        const cl_int e = clEnqueueWriteBuffer(q_, static_cast<cl_mem>(out->reg.handle), CL_FALSE,
                                              out->offset + k * chunk, bytesOf(k), s + recv_at, 1, &gates[k],
                                              &last_write);
        if (e != CL_SUCCESS) st = clFailed("clEnqueueWriteBuffer (a chunk into recvbuff)", e);
      }
      if (st.isOk() && k + kAhead < nchunks) st = read(k + kAhead);
    }
    for (cl_event r : ready)
      if (r) clReleaseEvent(r);
    stats_.chunks += nchunks;
    if (!st.isOk()) {
      if (last_write) clReleaseEvent(last_write);
      return st;
    }
    if (last_write) {
      setLast(last_write);
      return {};
    }
    return markLast(gates[nchunks - 1]);
  }

  void setLast(cl_event ev) {
    if (last_) clReleaseEvent(last_);
    last_ = ev;
  }
  // Pinned staging: a buffer the implementation allocates in host memory
  // (CL_MEM_ALLOC_HOST_PTR), mapped once for the stream's life.  Grown by
  // doubling; a smaller one it replaces may still be read or written by
  // enqueued calls, so it is kept until the stream goes.
  Status ensureStaging(uint64_t bytes) {
    if (bytes <= cap_) return {};
    if (pinned_ != nullptr) retired_.emplace_back(pinned_, stage_);
    pinned_ = nullptr;
    stage_ = nullptr;
    uint64_t cap = 64 * 1024;
    while (cap < bytes) cap *= 2;
    cl_int e = CL_SUCCESS;
    cl_mem mem = clCreateBuffer(ctx_, CL_MEM_ALLOC_HOST_PTR | CL_MEM_READ_WRITE, cap, nullptr, &e);
    if (e != CL_SUCCESS) return clFailed("clCreateBuffer (host staging)", e);
    // Non-blocking: the host touches the staging only after a part's `ready`,
    // a later command of the queue than this map.
    void* p = clEnqueueMapBuffer(q_, mem, CL_FALSE, CL_MAP_READ | CL_MAP_WRITE, 0, cap, 0, nullptr, nullptr, &e);
    if (e != CL_SUCCESS) {
      clReleaseMemObject(mem);
      return clFailed("clEnqueueMapBuffer (host staging)", e);
    }
    pinned_ = mem;
    stage_ = static_cast<std::byte*>(p);
    cap_ = cap;
    return {};
  }
  void releaseStaging() {
    if (pinned_ != nullptr) retired_.emplace_back(pinned_, stage_);
    for (auto [mem, ptr] : retired_) {
      cl_event ev = nullptr;
      if (clEnqueueUnmapMemObject(q_, mem, ptr, 0, nullptr, &ev) == CL_SUCCESS && ev) {
        clWaitForEvents(1, &ev);
        clReleaseEvent(ev);
      }
      clReleaseMemObject(mem);
    }
    retired_.clear();
    pinned_ = nullptr;
    stage_ = nullptr;
    cap_ = 0;
  }

  cl_command_queue q_;
  cl_context ctx_;
  StagingOptions opt_;
  Staging resolved_ = Staging::Whole;
  StagingStats stats_;
  cl_event last_ = nullptr;
  cl_mem pinned_ = nullptr;
  std::byte* stage_ = nullptr;
  uint64_t cap_ = 0;
  std::vector<std::pair<cl_mem, std::byte*>> retired_;
  static constexpr uint64_t kMaxInFlight = 64;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t pending_ = 0;  // PendingCalls alive
  Status error_;          // recordError's first
};

PendingImpl::PendingImpl(ClStreamImpl* s) : s_(s) { s_->pendingBorn(); }

void PendingImpl::recordOnStream(const Status& st) { s_->recordError(st); }
PendingImpl::~PendingImpl() {
  for (Part& p : parts) open(p);
  s_->pendingGone();
}

}  // namespace
#endif

Result<std::unique_ptr<DeviceStream>> makeClStream(void* queue, const StagingOptions& options) {
#ifdef CHORUS_HAVE_OPENCL
  if (queue == nullptr) return invalidArgument("chorusStreamCreateOpenCL: clQueue is NULL (pass a cl_command_queue)");
  auto q = static_cast<cl_command_queue>(queue);
  cl_context ctx = nullptr;
  cl_int e = clGetCommandQueueInfo(q, CL_QUEUE_CONTEXT, sizeof ctx, &ctx, nullptr);
  if (e != CL_SUCCESS)
    return invalidArgument("chorusStreamCreateOpenCL: clQueue={} is not an OpenCL command queue ({})", queue,
                           clErrorName(e));
  cl_command_queue_properties props = 0;
  if ((e = clGetCommandQueueInfo(q, CL_QUEUE_PROPERTIES, sizeof props, &props, nullptr)) != CL_SUCCESS)
    return clFailed("clGetCommandQueueInfo(CL_QUEUE_PROPERTIES)", e);
  if ((props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0)
    return invalidArgument("chorusStreamCreateOpenCL: clQueue={} is an out-of-order queue; a stream needs an in-order "
                           "queue (its calls complete in queue order)",
                           queue);
  if (options.chunk_bytes == 0) return invalidArgument("chorusStreamCreateOpenCL: a staging chunk of 0 bytes");
  return std::unique_ptr<DeviceStream>(new ClStreamImpl(q, ctx, options));
#else
  (void)queue;
  (void)options;
  return spaceAvailable(Space::OpenCL).withContext("chorusStreamCreateOpenCL: ");
#endif
}

}  // namespace chorus::device
