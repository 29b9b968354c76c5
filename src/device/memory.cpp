// The device-buffer registry and the OpenCL stream (memory.hpp).
#include "device/memory.hpp"

#include <sys/mman.h>

#include <atomic>
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

// Releases the events it holds.
struct Events {
  std::vector<cl_event> ev;
  ~Events() {
    for (cl_event e : ev)
      if (e) clReleaseEvent(e);
  }
};

class ClStreamImpl final : public ClStream {
 public:
  ClStreamImpl(cl_command_queue q, cl_context ctx, const StagingOptions& o) : q_(q), ctx_(ctx), opt_(o) {
    clRetainCommandQueue(q_);
    resolved_ = opt_.mode != Staging::Auto ? opt_.mode : hostUnified(q_) ? Staging::Map : Staging::Pipeline;
    stats_.resolved = resolved_;
  }
  ~ClStreamImpl() override {
    (void)waitLast();
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

  Status run(const StagedCall& call, const HostCall& host) override {
    CHORUS_ASSIGN_OR_RETURN(auto bufs, resolveCall(call));
    const std::optional<Resolved>& in = bufs.first;
    const std::optional<Resolved>& out = bufs.second;
    ++stats_.calls;
    if (resolved_ == Staging::Map) {
      ++stats_.mapped_calls;
      return runMapped(call, in, out, host);
    }
    if (resolved_ == Staging::Pipeline && pipelinable(call, in, out)) {
      ++stats_.pipelined_calls;
      return runPipelined(call, in, out, host);
    }
    ++stats_.whole_calls;
    return runWhole(call, in, out, host);
  }

  Status synchronize() override {
    const cl_int e = clFinish(q_);
    if (e != CL_SUCCESS) return clFailed("clFinish", e);
    return {};
  }

  Status query() override {
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

 private:
  // Where the host call sees the two buffers: overlapping buffers of one
  // cl_mem are one region (their union), so the host pointers keep the device
  // addresses' relation (in-place calls stay in place); otherwise each buffer
  // is a region of its own.
  struct Layout {
    bool unite = false;
    uint64_t lo = 0, total = 0;  // unite: the union's offset in the cl_mem and length
    uint64_t send_at = 0, recv_at = 0;  // offsets of the buffers in the host region(s)
  };
  static Layout layout(const StagedCall& call, const std::optional<Resolved>& in, const std::optional<Resolved>& out) {
    Layout l;
    l.unite = in && out && in->reg.handle == out->reg.handle && in->offset < out->offset + call.recv_bytes &&
              out->offset < in->offset + call.send_bytes;
    if (l.unite) {
      l.lo = std::min(in->offset, out->offset);
      l.total = std::max(in->offset + call.send_bytes, out->offset + call.recv_bytes) - l.lo;
      l.send_at = in->offset - l.lo;
      l.recv_at = out->offset - l.lo;
    } else {
      l.recv_at = (call.send_bytes + 63) / 64 * 64;
      l.total = l.recv_at + call.recv_bytes;
    }
    return l;
  }

  // A buffer the call does not use on this rank (a broadcast's sendbuff off
  // the root, a reduce's recvbuff) is passed on only as the other one's
  // alias, so that the host call still sees an in-place call as in place.
  static void aliasUnused(const StagedCall& call, std::byte*& send_host, std::byte*& recv_host) {
    if (send_host == nullptr && recv_host != nullptr && call.send == call.recv) send_host = recv_host;
    if (recv_host == nullptr && send_host != nullptr && call.recv == call.send) recv_host = send_host;
  }
  static Status callHost(const StagedCall& call, const HostCall& host, std::byte* send_host, std::byte* recv_host,
                         uint64_t count) {
    aliasUnused(call, send_host, recv_host);
    return host(send_host, recv_host, count);
  }

  // Nothing written back: a marker gives the call its place in the queue.
  Status markLast() {
    cl_event ev = nullptr;
    const cl_int e = clEnqueueMarkerWithWaitList(q_, 0, nullptr, &ev);
    if (e != CL_SUCCESS) return clFailed("clEnqueueMarkerWithWaitList", e);
    setLast(ev);
    return {};
  }

  // Staging::Map.  The buffers are mapped (overlapping ones as their union),
  // the host call runs on the mapped memory, and the unmaps are enqueued:
  // the last unmap's event is the call's.  On a device whose memory is the
  // host's a map is the buffer itself: no byte is copied.  One wait per call
  // (the last map, in queue order after the queue's earlier commands).
  Status runMapped(const StagedCall& call, const std::optional<Resolved>& in, const std::optional<Resolved>& out,
                   const HostCall& host) {
    MappedCall m;
    Status st = mapResolved(call, in, out, m);
    if (st.isOk()) st = host(m.send, m.recv, call.count);
    const Status un = unmapCall(m);
    return st.isOk() ? un : st;
  }

 public:
  Result<MappedCall> mapCall(const StagedCall& call) override {
    CHORUS_ASSIGN_OR_RETURN(auto bufs, resolveCall(call));
    const std::optional<Resolved>& in = bufs.first;
    const std::optional<Resolved>& out = bufs.second;
    ++stats_.calls;
    ++stats_.mapped_calls;
    MappedCall m;
    Status st = mapResolved(call, in, out, m);
    if (!st.isOk()) {
      (void)unmapCall(m);
      return st;
    }
    return m;
  }

  Status unmapCall(MappedCall& m) override {
    Status st;
    cl_event ev = nullptr;
    for (const auto& [mem, ptr] : m.maps) {
      if (ev) clReleaseEvent(ev);
      ev = nullptr;
      const cl_int e = clEnqueueUnmapMemObject(q_, static_cast<cl_mem>(mem), ptr, 0, nullptr, &ev);
      if (e != CL_SUCCESS && st.isOk()) st = clFailed("clEnqueueUnmapMemObject", e);
    }
    m.maps.clear();
    if (ev) {
      setLast(ev);
      clFlush(q_);
    } else if (st.isOk()) {
      st = markLast();
    }
    return st;
  }

 private:
  Status mapResolved(const StagedCall& call, const std::optional<Resolved>& in, const std::optional<Resolved>& out,
                     MappedCall& m) {
    const Layout l = layout(call, in, out);
    auto map = [&](const Resolved& r, uint64_t off, uint64_t bytes, cl_map_flags flags,
                   bool last) -> Result<std::byte*> {
      cl_int e = CL_SUCCESS;
      auto mem = static_cast<cl_mem>(r.reg.handle);
      void* p = clEnqueueMapBuffer(q_, mem, last ? CL_TRUE : CL_FALSE, flags, off, bytes, 0, nullptr, nullptr, &e);
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
    aliasUnused(call, send_host, recv_host);
    m.send = send_host;
    m.recv = recv_host;
    return {};
  }

  // Staging::Whole: one blocking read of the input into pinned staging, the
  // host call, one non-blocking write of the output.
  Status runWhole(const StagedCall& call, const std::optional<Resolved>& in, const std::optional<Resolved>& out,
                  const HostCall& host) {
    const Layout l = layout(call, in, out);
    // The previous call's write-back reads the staging until its event
    // completes.  A call that reads its input first need not wait for it: the
    // queue is in order, so the blocking read below returns after it (one
    // wait per call, not two); a call without input writes the staging at once.
    if (!in || l.total > cap_) CHORUS_RETURN_IF_ERROR(waitLast());
    CHORUS_RETURN_IF_ERROR(ensureStaging(l.total));
    cl_int e = CL_SUCCESS;
    if (l.unite) {
      // One read of the union: the input, and the output's bytes the call leaves.
      e = clEnqueueReadBuffer(q_, static_cast<cl_mem>(in->reg.handle), CL_TRUE, l.lo, l.total, stage_, 0, nullptr,
                              nullptr);
      if (e != CL_SUCCESS) return clFailed("clEnqueueReadBuffer (sendbuff into host staging)", e);
    } else {
      // In queue order: after the queue's earlier commands (the producer of the input).
      if (out && call.recv_partial) {
        e = clEnqueueReadBuffer(q_, static_cast<cl_mem>(out->reg.handle), in ? CL_FALSE : CL_TRUE, out->offset,
                                call.recv_bytes, stage_ + l.recv_at, 0, nullptr, nullptr);
        if (e != CL_SUCCESS) return clFailed("clEnqueueReadBuffer (recvbuff into host staging)", e);
      }
      if (in) {
        e = clEnqueueReadBuffer(q_, static_cast<cl_mem>(in->reg.handle), CL_TRUE, in->offset, call.send_bytes,
                                stage_ + l.send_at, 0, nullptr, nullptr);
        if (e != CL_SUCCESS) return clFailed("clEnqueueReadBuffer (sendbuff into host staging)", e);
      }
    }
    CHORUS_RETURN_IF_ERROR(callHost(call, host, in ? stage_ + l.send_at : nullptr, out ? stage_ + l.recv_at : nullptr,
                                    call.count));
    if (out && call.recv_written) {
      cl_event ev = nullptr;
      e = clEnqueueWriteBuffer(q_, static_cast<cl_mem>(out->reg.handle), CL_FALSE, out->offset, call.recv_bytes,
                               stage_ + l.recv_at, 0, nullptr, &ev);
      if (e != CL_SUCCESS) return clFailed("clEnqueueWriteBuffer (host staging into recvbuff)", e);
      setLast(ev);
      clFlush(q_);
      return {};
    }
    return markLast();
  }

  // An elementwise call of at least two chunks whose buffers are the same
  // (in place) or disjoint.
  bool pipelinable(const StagedCall& call, const std::optional<Resolved>& in,
                   const std::optional<Resolved>& out) const {
    if (!call.elementwise || call.elem_bytes == 0 || call.recv_partial) return false;
    if (in && call.send_bytes != call.count * call.elem_bytes) return false;
    if (out && call.recv_bytes != call.count * call.elem_bytes) return false;
    if (call.count <= chunkElems(call)) return false;
    if (in && out && in->reg.handle == out->reg.handle && in->offset != out->offset &&
        in->offset < out->offset + call.recv_bytes && out->offset < in->offset + call.send_bytes)
      return false;
    return true;
  }
  uint64_t chunkElems(const StagedCall& call) const {
    return std::max<uint64_t>(1, opt_.chunk_bytes / std::max<uint64_t>(call.elem_bytes, 1));
  }

  // Staging::Pipeline.  Chunk k's input is read (non-blocking, with an
  // event) into slot k % kSlots of a ring of pinned chunks while earlier
  // chunks run: with kAhead reads in flight, the read of chunk k+1.. overlaps
  // chunk k's host call (its wire transfers and reductions), and the write of
  // chunk k-1 back into the device buffer, enqueued right after its host call,
  // overlaps it too.  The queue is in order, so a slot's next read follows
  // its previous write; where no read orders them (a broadcast off the root)
  // the host waits for the slot's previous write before reusing it.
  static constexpr uint64_t kAhead = 2;
  static constexpr uint64_t kSlots = kAhead + 1;
  Status runPipelined(const StagedCall& call, const std::optional<Resolved>& in, const std::optional<Resolved>& out,
                      const HostCall& host) {
    const uint64_t es = call.elem_bytes;
    const uint64_t ce = chunkElems(call);
    const uint64_t nchunks = (call.count + ce - 1) / ce;
    const bool inplace = in && out && in->reg.handle == out->reg.handle && in->offset == out->offset;
    const uint64_t chunk = ce * es;
    const uint64_t recv_at = in && out && !inplace ? (chunk + 63) / 64 * 64 : 0;
    const uint64_t slot = (recv_at + chunk + 63) / 64 * 64;
    // As runWhole: with an input, the reads (in queue order) follow the
    // previous call's writes out of the staging.
    if (!in || slot * kSlots > cap_) CHORUS_RETURN_IF_ERROR(waitLast());
    CHORUS_RETURN_IF_ERROR(ensureStaging(slot * kSlots));
    Events reads, writes;
    reads.ev.assign(nchunks, nullptr);
    writes.ev.assign(nchunks, nullptr);
    auto bytesOf = [&](uint64_t k) { return std::min(ce, call.count - k * ce) * es; };
    auto slotOf = [&](uint64_t k) { return stage_ + (k % kSlots) * slot; };
    auto read = [&](uint64_t k) -> Status {
      if (!in) return {};
      const cl_int e = clEnqueueReadBuffer(q_, static_cast<cl_mem>(in->reg.handle), CL_FALSE, in->offset + k * chunk,
                                           bytesOf(k), slotOf(k), 0, nullptr, &reads.ev[k]);
      if (e != CL_SUCCESS) return clFailed("clEnqueueReadBuffer (a chunk of sendbuff)", e);
      return {};
    };
    Status st;
    for (uint64_t k = 0; k < std::min(kAhead, nchunks) && st.isOk(); ++k) st = read(k);
    clFlush(q_);
    for (uint64_t k = 0; k < nchunks && st.isOk(); ++k) {
      cl_int e = CL_SUCCESS;
      if (reads.ev[k]) {
        e = clWaitForEvents(1, &reads.ev[k]);
      } else if (k >= kSlots && writes.ev[k - kSlots]) {
        e = clWaitForEvents(1, &writes.ev[k - kSlots]);
      }
      if (e != CL_SUCCESS) {
        st = clFailed("clWaitForEvents (a chunk's copy)", e);
        break;
      }
      std::byte* s = slotOf(k);
      st = callHost(call, host, in ? s : nullptr, out ? s + recv_at : nullptr, bytesOf(k) / es);
      if (!st.isOk()) break;
      if (out && call.recv_written) {
        e = clEnqueueWriteBuffer(q_, static_cast<cl_mem>(out->reg.handle), CL_FALSE, out->offset + k * chunk,
                                 bytesOf(k), s + recv_at, 0, nullptr, &writes.ev[k]);
        if (e != CL_SUCCESS) {
          st = clFailed("clEnqueueWriteBuffer (a chunk into recvbuff)", e);
          break;
        }
      }
      if (k + kAhead < nchunks) st = read(k + kAhead);
      clFlush(q_);
    }
    stats_.chunks += nchunks;
    if (!st.isOk()) {
      // The staging stays busy until the enqueued copies are done.
      (void)synchronize();
      return st;
    }
    if (out && call.recv_written && writes.ev[nchunks - 1]) {
      clRetainEvent(writes.ev[nchunks - 1]);
      setLast(writes.ev[nchunks - 1]);
      return {};
    }
    return markLast();
  }

  void setLast(cl_event ev) {
    if (last_) clReleaseEvent(last_);
    last_ = ev;
  }
  Status waitLast() {
    if (last_ == nullptr) return {};
    const cl_int e = clWaitForEvents(1, &last_);
    if (e != CL_SUCCESS) return clFailed("clWaitForEvents (the previous call's copy back)", e);
    return {};
  }
  // Pinned staging: a buffer the implementation allocates in host memory
  // (CL_MEM_ALLOC_HOST_PTR), mapped once for the stream's life.
  Status ensureStaging(uint64_t bytes) {
    if (bytes <= cap_) return {};
    releaseStaging();
    uint64_t cap = 64 * 1024;
    while (cap < bytes) cap *= 2;
    cl_int e = CL_SUCCESS;
    pinned_ = clCreateBuffer(ctx_, CL_MEM_ALLOC_HOST_PTR | CL_MEM_READ_WRITE, cap, nullptr, &e);
    if (e != CL_SUCCESS) return clFailed("clCreateBuffer (host staging)", e);
    void* p = clEnqueueMapBuffer(q_, pinned_, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, cap, 0, nullptr, nullptr, &e);
    if (e != CL_SUCCESS) {
      clReleaseMemObject(pinned_);
      pinned_ = nullptr;
      return clFailed("clEnqueueMapBuffer (host staging)", e);
    }
    stage_ = static_cast<std::byte*>(p);
    cap_ = cap;
    return {};
  }
  void releaseStaging() {
    if (pinned_ == nullptr) return;
    cl_event ev = nullptr;
    if (clEnqueueUnmapMemObject(q_, pinned_, stage_, 0, nullptr, &ev) == CL_SUCCESS && ev) {
      clWaitForEvents(1, &ev);
      clReleaseEvent(ev);
    }
    clReleaseMemObject(pinned_);
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
};

}  // namespace
#endif

Result<std::unique_ptr<ClStream>> makeClStream(void* queue, const StagingOptions& options) {
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
  return std::unique_ptr<ClStream>(new ClStreamImpl(q, ctx, options));
#else
  (void)queue;
  (void)options;
  return spaceAvailable(Space::OpenCL).withContext("chorusStreamCreateOpenCL: ");
#endif
}

}  // namespace chorus::device
