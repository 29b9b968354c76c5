// The device-buffer registry and the OpenCL stream (memory.hpp).
#include "device/memory.hpp"

#include <sys/mman.h>

#include <atomic>
#include <map>
#include <mutex>

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

class ClStreamImpl final : public ClStream {
 public:
  ClStreamImpl(cl_command_queue q, cl_context ctx) : q_(q), ctx_(ctx) { clRetainCommandQueue(q_); }
  ~ClStreamImpl() override {
    (void)waitLast();
    if (last_) clReleaseEvent(last_);
    releaseStaging();
    clReleaseCommandQueue(q_);
  }

  Status run(const StagedCall& call, const HostCall& host) override {
    std::optional<Resolved> in, out;
    if (call.send_bytes > 0) {
      CHORUS_ASSIGN_OR_RETURN(in, resolve(call.fn, "sendbuff", call.send, call.send_bytes, ctx_));
    }
    if (call.recv_bytes > 0) {
      CHORUS_ASSIGN_OR_RETURN(out, resolve(call.fn, "recvbuff", call.recv, call.recv_bytes, ctx_));
    }
    // Host staging.  Buffers that overlap in one cl_mem are staged as their
    // union, so that the host pointers keep the device addresses' relation
    // (in-place calls stay in place); otherwise each gets its own range.
    uint64_t send_at = 0, recv_at = 0, read_from = 0, total = 0;
    const bool unite = in && out && in->reg.handle == out->reg.handle && in->offset < out->offset + call.recv_bytes &&
                       out->offset < in->offset + call.send_bytes;
    if (unite) {
      const uint64_t lo = std::min(in->offset, out->offset);
      total = std::max(in->offset + call.send_bytes, out->offset + call.recv_bytes) - lo;
      send_at = in->offset - lo;
      recv_at = out->offset - lo;
    } else {
      recv_at = (call.send_bytes + 63) / 64 * 64;
      total = recv_at + call.recv_bytes;
    }
    read_from = send_at;
    // The previous call's write-back reads the staging until its event completes.
    CHORUS_RETURN_IF_ERROR(waitLast());
    CHORUS_RETURN_IF_ERROR(ensureStaging(total));
    cl_int e = CL_SUCCESS;
    if (in) {
      // In queue order: after the queue's earlier commands (the producer of the input).
      e = clEnqueueReadBuffer(q_, static_cast<cl_mem>(in->reg.handle), CL_TRUE, in->offset, call.send_bytes,
                              stage_ + read_from, 0, nullptr, nullptr);
      if (e != CL_SUCCESS) return clFailed("clEnqueueReadBuffer (sendbuff into host staging)", e);
    }
    // A buffer the call does not use on this rank (a broadcast's sendbuff off
    // the root, a reduce's recvbuff) is passed on only as the other one's
    // alias, so that the host call still sees an in-place call as in place.
    std::byte* send_host = in ? stage_ + send_at : nullptr;
    std::byte* recv_host = out ? stage_ + recv_at : nullptr;
    if (!in && out && call.send == call.recv) send_host = recv_host;
    if (!out && in && call.recv == call.send) recv_host = send_host;
    CHORUS_RETURN_IF_ERROR(host(send_host, recv_host));
    if (out && call.recv_written) {
      cl_event ev = nullptr;
      e = clEnqueueWriteBuffer(q_, static_cast<cl_mem>(out->reg.handle), CL_FALSE, out->offset, call.recv_bytes,
                               stage_ + recv_at, 0, nullptr, &ev);
      if (e != CL_SUCCESS) return clFailed("clEnqueueWriteBuffer (host staging into recvbuff)", e);
      setLast(ev);
      clFlush(q_);
    } else {
      // Nothing to write back: a marker gives the call its place in the queue.
      cl_event ev = nullptr;
      e = clEnqueueMarkerWithWaitList(q_, 0, nullptr, &ev);
      if (e != CL_SUCCESS) return clFailed("clEnqueueMarkerWithWaitList", e);
      setLast(ev);
    }
    return {};
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

 private:
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
  cl_event last_ = nullptr;
  cl_mem pinned_ = nullptr;
  std::byte* stage_ = nullptr;
  uint64_t cap_ = 0;
};

}  // namespace
#endif

Result<std::unique_ptr<ClStream>> makeClStream(void* queue) {
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
  return std::unique_ptr<ClStream>(new ClStreamImpl(q, ctx));
#else
  (void)queue;
  return spaceAvailable(Space::OpenCL).withContext("chorusStreamCreateOpenCL: ");
#endif
}

}  // namespace chorus::device
