// chorus._chorus: the Python binding of the C ABI (include/chorus/chorus.h).
//
// Buffers are never copied: NumPy arrays and anything else exposing the
// buffer protocol are read through it, CPU torch tensors through data_ptr()
// (so this module does not need torch to build or to import).  Every call
// that may block releases the GIL.  Errors become Python exceptions of the
// class matching the chorusResult_t, carrying chorus's own message.
//
// Threading contract (as chorus.h's): a Communicator may be used from one
// Python thread at a time; abort() and async_error() from any thread.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chorus/chorus.h>
#include <chorus/device.h>
#include <chorus/sizes.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// ---------------------------------------------------------------- errors

// One Python exception class per chorusResult_t, all deriving from Error
// (itself a RuntimeError).  Created at import, owned by the module object.
struct ErrorClasses {
  py::object base;
  py::object byCode[chorusNumResults];
};

ErrorClasses& errorClasses() {
  // Immutable after module init; a function-local static because pybind11's
  // exception translators are plain functions with no user data.
  static ErrorClasses classes;
  return classes;
}

// Thrown on the C++ side, translated to the Python class of its code.
struct ChorusError {
  chorusResult_t code;
  std::string message;
};

[[noreturn]] void raise(chorusResult_t code, chorusComm_t comm, std::string_view where) {
  std::string msg = chorusGetLastError(comm);
  if (msg.empty()) msg = chorusGetErrorString(code);
  throw ChorusError{code, std::string(where) + ": " + msg};
}

inline void check(chorusResult_t r, chorusComm_t comm, std::string_view where) {
  if (r != chorusSuccess) raise(r, comm, where);
}

// ---------------------------------------------------------------- buffers

// A borrowed view of a caller's contiguous CPU memory.  `owner` keeps the
// Python object alive for as long as the view is referenced (e.g. queued on
// a stream).
struct View {
  void* ptr = nullptr;
  size_t count = 0;  // elements
  chorusDataType_t dtype = chorusFloat32;
  py::object owner;
  // A pyopencl array (docs/device.md, "Python"): its buffer registered for
  // the call (ptr is the device address plus the array's offset), and its
  // queue, the stream's when the call names none.
  std::shared_ptr<void> device;  // deregisters the buffer when the last view goes
  py::object queue;
};

// A pyopencl.array.Array (the buffer, offset, dtype and queue of device data).
bool isClArray(py::handle obj) {
  const std::string mod = py::str(py::type::handle_of(obj).attr("__module__"));
  return mod.rfind("pyopencl", 0) == 0 && py::hasattr(obj, "base_data") && py::hasattr(obj, "queue") &&
         py::hasattr(obj, "offset") && py::hasattr(obj, "dtype");
}

std::optional<chorusDataType_t> dtypeFromBufferFormat(std::string_view fmt, ssize_t itemsize) {
  // Strip byte-order prefixes; chorus only runs on native-endian hosts.
  while (!fmt.empty() && (fmt.front() == '@' || fmt.front() == '=' || fmt.front() == '<' || fmt.front() == '!'))
    fmt.remove_prefix(1);
  if (fmt.size() != 1) return std::nullopt;
  const char c = fmt.front();
  const bool isSigned = c == 'b' || c == 'h' || c == 'i' || c == 'l' || c == 'q' || c == 'n';
  const bool isUnsigned = c == 'B' || c == 'H' || c == 'I' || c == 'L' || c == 'Q' || c == 'N' || c == '?';
  if (c == 'e') return chorusFloat16;
  if (c == 'f') return chorusFloat32;
  if (c == 'd') return chorusFloat64;
  if (isSigned || isUnsigned) {
    switch (itemsize) {
      case 1: return isSigned ? chorusInt8 : chorusUint8;
      case 4: return isSigned ? chorusInt32 : chorusUint32;
      case 8: return isSigned ? chorusInt64 : chorusUint64;
      default: return std::nullopt;
    }
  }
  return std::nullopt;
}

std::optional<chorusDataType_t> dtypeFromTorchName(std::string_view name) {
  struct Row { std::string_view name; chorusDataType_t dtype; };
  static constexpr Row kRows[] = {
      {"torch.int8", chorusInt8},       {"torch.uint8", chorusUint8},     {"torch.bool", chorusUint8},
      {"torch.int32", chorusInt32},     {"torch.int64", chorusInt64},     {"torch.float16", chorusFloat16},
      {"torch.float32", chorusFloat32}, {"torch.float64", chorusFloat64}, {"torch.bfloat16", chorusBfloat16},
  };
  for (const Row& r : kRows)
    if (r.name == name) return r.dtype;
  return std::nullopt;
}

bool isTorchTensor(py::handle obj) {
  return py::hasattr(obj, "data_ptr") && py::hasattr(obj, "is_contiguous") && py::hasattr(obj, "element_size");
}


View clViewOf(py::handle obj, const char* arg) {
  View v;
  v.owner = py::reinterpret_borrow<py::object>(obj);
  if (!obj.attr("flags").attr("c_contiguous").cast<bool>())
    throw py::value_error(std::string(arg) + ": the pyopencl array is not C-contiguous");
  py::object dt = obj.attr("dtype");
  const std::string ch = py::str(dt.attr("char"));
  auto d = dtypeFromBufferFormat(ch, dt.attr("itemsize").cast<ssize_t>());
  if (!d)
    throw py::type_error(std::string(arg) + ": pyopencl array dtype " + std::string(py::str(dt)) +
                         " is not supported (int8/uint8/int32/uint32/int64/uint64/float16/float32/float64)");
  py::object queue = obj.attr("queue");
  if (queue.is_none())
    throw py::value_error(std::string(arg) + ": the pyopencl array has no queue (the call runs on its queue)");
  void* mem = reinterpret_cast<void*>(obj.attr("base_data").attr("int_ptr").cast<uintptr_t>());
  void* dev = nullptr;
  check(chorusMemRegisterOpenCL(mem, &dev), nullptr, arg);
  v.device = std::shared_ptr<void>(dev, [](void* p) { (void)chorusMemDeregister(p); });
  v.ptr = static_cast<char*>(dev) + obj.attr("offset").cast<size_t>();
  v.count = obj.attr("size").cast<size_t>();
  v.dtype = *d;
  v.queue = queue;
  return v;
}

View viewOf(py::handle obj, const char* arg, bool writable) {
  if (isClArray(obj)) return clViewOf(obj, arg);
  View v;
  v.owner = py::reinterpret_borrow<py::object>(obj);
  if (isTorchTensor(obj)) {
    std::string device = py::str(obj.attr("device").attr("type"));
    if (device != "cpu")
      throw py::value_error(std::string(arg) + ": a tensor on device '" + device +
                            "'; chorus works on CPU memory (move it with .cpu())");
    if (!obj.attr("is_contiguous")().cast<bool>())
      throw py::value_error(std::string(arg) + ": the tensor is not contiguous (call .contiguous() first)");
    std::string name = py::str(obj.attr("dtype"));
    auto dt = dtypeFromTorchName(name);
    if (!dt)
      throw py::type_error(std::string(arg) + ": dtype " + name +
                           " is not supported (int8, uint8, bool, int32, int64, float16, bfloat16, float32, float64)");
    v.ptr = reinterpret_cast<void*>(obj.attr("data_ptr")().cast<uintptr_t>());
    v.count = obj.attr("numel")().cast<size_t>();
    v.dtype = *dt;
    return v;
  }
  if (!PyObject_CheckBuffer(obj.ptr()))
    throw py::type_error(std::string(arg) + ": expected a NumPy array, a CPU torch tensor or a buffer, got " +
                         std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  Py_buffer raw;
  int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &raw, flags) != 0) {
    PyErr_Clear();
    throw py::value_error(std::string(arg) + (writable ? ": the buffer is not a writable C-contiguous buffer"
                                                       : ": the buffer is not C-contiguous") +
                          " (use numpy.ascontiguousarray, or pass a writable array)");
  }
  auto dt = dtypeFromBufferFormat(raw.format ? raw.format : "B", raw.itemsize);
  v.ptr = raw.buf;
  v.count = raw.itemsize > 0 ? static_cast<size_t>(raw.len / raw.itemsize) : 0;
  std::string fmt = raw.format ? raw.format : "B";
  PyBuffer_Release(&raw);  // v.owner keeps the exporter, hence the memory, alive
  if (!dt)
    throw py::type_error(std::string(arg) + ": element format '" + fmt +
                         "' is not supported (int8/uint8/int32/uint32/int64/uint64/float16/float32/float64)");
  v.dtype = *dt;
  return v;
}

// A size rule of chorus/sizes.hpp (shared with chorus.hpp and the torch
// backend): "" or the message, raised as ValueError before any communication.
void requireSizes(const std::string& error) {
  if (!error.empty()) throw py::value_error(error);
}

void requireSameDtype(const View& a, const View& b, const char* what) {
  if (a.dtype != b.dtype)
    throw py::type_error(std::string(what) + ": send and recv buffers have different dtypes (" +
                         std::to_string(a.dtype) + " vs " + std::to_string(b.dtype) + ")");
}

// Round-to-nearest-even conversions for PreMulSum scalars of 16-bit types.
uint16_t bfloat16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

uint16_t halfBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflows to inf
  if (absu < 0x38800000u) {  // subnormal half (or zero): scale by 2^24 and round
    float a;
    std::memcpy(&a, &absu, 4);
    const float scaled = a * 16777216.0f;
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u) - 0x38000000u;  // rebias exponent 127 -> 15
  return static_cast<uint16_t>(sign | (r >> 13));
}

// ---------------------------------------------------------------- streams

// A chorus stream plus the Python objects its queued operations point into.
// `pending` is cleared only after a successful or failed synchronisation, so
// the memory of every queued operation outlives it.
class Stream {
 public:
  Stream() { check(chorusStreamCreate(&s_), nullptr, "Stream()"); }
  // A stream of an OpenCL queue (a pyopencl.CommandQueue): calls on it take
  // pyopencl arrays and complete in the queue's order.
  static std::shared_ptr<Stream> opencl(py::object queue) {
    void* q = reinterpret_cast<void*>(queue.attr("int_ptr").cast<uintptr_t>());
    chorusStream_t s = nullptr;
    check(chorusStreamCreateOpenCL(&s, q), nullptr, "Stream.opencl");
    auto st = std::shared_ptr<Stream>(new Stream(s));
    st->keep(std::move(queue));
    return st;
  }
  ~Stream() {
    if (s_ != nullptr) {
      py::gil_scoped_release nogil;
      (void)chorusStreamDestroy(s_);
    }
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  chorusStream_t get() const { return s_; }
  void keep(py::object o) { pending_.push_back(std::move(o)); }

  void synchronize() {
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusStreamSynchronize(s_);
    }
    pending_.clear();
    check(r, nullptr, "Stream.synchronize");
  }

  bool query() {
    chorusResult_t r = chorusStreamQuery(s_);
    if (r == chorusInProgress) return false;
    pending_.clear();
    check(r, nullptr, "Stream.query");
    return true;
  }

  size_t pendingObjects() const { return pending_.size(); }

 private:
  explicit Stream(chorusStream_t s) : s_(s) {}
  chorusStream_t s_ = nullptr;
  std::vector<py::object> pending_;
};

// The handle an asynchronous call returns.  Streams are FIFOs, so waiting
// for the handle waits for its stream (and so for everything queued before
// the operation, and after it up to the moment of the wait).
class Handle {
 public:
  explicit Handle(std::shared_ptr<Stream> s) : stream_(std::move(s)) {}
  void wait() { stream_->synchronize(); }
  bool done() { return stream_->query(); }
  std::shared_ptr<Stream> stream() const { return stream_; }

 private:
  std::shared_ptr<Stream> stream_;
};

// ---------------------------------------------------------------- communicator

class UniqueId {
 public:
  UniqueId() { check(chorusGetUniqueId(&id_), nullptr, "UniqueId()"); }
  explicit UniqueId(const chorusUniqueId& id) : id_(id) {}
  static UniqueId fromBytes(const py::bytes& b) {
    std::string s = b;
    if (s.size() != CHORUS_UNIQUE_ID_BYTES)
      throw py::value_error("UniqueId.from_bytes: expected " + std::to_string(CHORUS_UNIQUE_ID_BYTES) +
                            " bytes, got " + std::to_string(s.size()));
    chorusUniqueId id;
    std::memcpy(id.internal, s.data(), CHORUS_UNIQUE_ID_BYTES);
    return UniqueId(id);
  }
  py::bytes toBytes() const { return py::bytes(id_.internal, CHORUS_UNIQUE_ID_BYTES); }
  const chorusUniqueId& get() const { return id_; }

 private:
  chorusUniqueId id_;
};

class Communicator {
 public:
  explicit Communicator(chorusComm_t c) : comm_(c) {}
  ~Communicator() { destroyNoThrow(); }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  static std::unique_ptr<Communicator> fromEnv() {
    chorusComm_t c = nullptr;
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusCommInitFromEnv(&c);
    }
    check(r, nullptr, "Communicator.from_env");
    return std::make_unique<Communicator>(c);
  }

  static std::unique_ptr<Communicator> fromUniqueId(int nranks, const UniqueId& id, int rank) {
    chorusComm_t c = nullptr;
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusCommInitRank(&c, nranks, id.get(), rank);
    }
    check(r, nullptr, "Communicator(nranks=" + std::to_string(nranks) + ", rank=" + std::to_string(rank) + ")");
    return std::make_unique<Communicator>(c);
  }

  chorusComm_t live(const char* where) const {
    if (comm_ == nullptr)
      throw ChorusError{chorusInvalidUsage, std::string(where) + ": the communicator was destroyed (close() called)"};
    return comm_;
  }

  int rank() const {
    int r = 0;
    check(chorusCommUserRank(live("rank"), &r), comm_, "rank");
    return r;
  }
  int size() const {
    int n = 0;
    check(chorusCommCount(live("size"), &n), comm_, "size");
    return n;
  }

  void destroy() {
    if (comm_ == nullptr) return;
    chorusComm_t c = std::exchange(comm_, nullptr);
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusCommDestroy(c);
    }
    check(r, nullptr, "close");
  }
  void destroyNoThrow() {
    if (comm_ == nullptr) return;
    chorusComm_t c = std::exchange(comm_, nullptr);
    (void)chorusCommDestroy(c);
  }

  void abort() { check(chorusCommAbort(live("abort")), comm_, "abort"); }
  void revoke() { check(chorusCommRevoke(live("revoke")), comm_, "revoke"); }

  // Fault tolerance (chorus.h): the survivors' new communicator; the grown
  // one with nnew joiners; a joiner's.
  std::unique_ptr<Communicator> shrink() {
    chorusComm_t out = nullptr, c = live("shrink");
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusCommShrink(c, CHORUS_SHRINK_DEFAULT, &out);
    }
    check(r, c, "shrink");
    return std::make_unique<Communicator>(out);
  }
  std::unique_ptr<Communicator> grow(int nnew) {
    chorusComm_t out = nullptr, c = live("grow");
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusCommGrow(c, nnew, &out);
    }
    check(r, c, "grow");
    return std::make_unique<Communicator>(out);
  }
  static std::unique_ptr<Communicator> join(const UniqueId& id) {
    chorusComm_t out = nullptr;
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusCommJoin(id.get(), &out);
    }
    check(r, nullptr, "Communicator.join");
    return std::make_unique<Communicator>(out);
  }

  chorusResult_t asyncError() const {
    chorusResult_t e = chorusSuccess;
    check(chorusCommGetAsyncError(live("async_error"), &e), comm_, "async_error");
    return e;
  }

  std::unique_ptr<Communicator> split(int color, int key) {
    chorusComm_t out = nullptr;
    chorusResult_t r;
    chorusComm_t c = live("split");
    {
      py::gil_scoped_release nogil;
      r = chorusCommSplit(c, color, key, &out);
    }
    check(r, c, "split");
    if (out == nullptr) return nullptr;
    return std::make_unique<Communicator>(out);
  }

  int createPreMulSum(py::object scalar, chorusDataType_t dtype) {
    // HostImmediate: the value is read now, so a Python float suffices.
    alignas(8) unsigned char bytes[8] = {};
    double d = scalar.cast<double>();
    switch (dtype) {
      case chorusFloat64: std::memcpy(bytes, &d, 8); break;
      case chorusFloat32: { float f = static_cast<float>(d); std::memcpy(bytes, &f, 4); break; }
      case chorusInt32: case chorusUint32: { int32_t i = static_cast<int32_t>(d); std::memcpy(bytes, &i, 4); break; }
      case chorusInt64: case chorusUint64: { int64_t i = static_cast<int64_t>(d); std::memcpy(bytes, &i, 8); break; }
      case chorusInt8: case chorusUint8: { int8_t i = static_cast<int8_t>(d); std::memcpy(bytes, &i, 1); break; }
      case chorusFloat16: { uint16_t h = halfBits(static_cast<float>(d)); std::memcpy(bytes, &h, 2); break; }
      case chorusBfloat16: { uint16_t h = bfloat16Bits(static_cast<float>(d)); std::memcpy(bytes, &h, 2); break; }
      default:
        throw py::type_error("premul_sum: fp8 scalars are not supported; scale an fp16/bf16/fp32 copy instead");
    }
    chorusRedOp_t op;
    check(chorusRedOpCreatePreMulSum(&op, bytes, dtype, chorusScalarHostImmediate, live("premul_sum")), comm_,
          "premul_sum");
    return static_cast<int>(op);
  }

  void destroyOp(int op) {
    check(chorusRedOpDestroy(static_cast<chorusRedOp_t>(op), live("destroy_op")), comm_, "destroy_op");
  }

  // Runs `call` with the GIL released; on a stream, records the buffers and
  // returns a Handle, else returns None.
  template <typename Fn>
  py::object run(const char* where, std::shared_ptr<Stream> stream, std::initializer_list<const View*> views,
                 Fn&& call) {
    chorusComm_t c = live(where);
    // pyopencl arrays without a stream: a stream of their queue for this
    // call, synchronised before returning (blocking, as host calls are).
    const View* dev = nullptr;
    for (const View* v : views)
      if (v->device) dev = v;
    if (dev != nullptr && !stream) {
      std::shared_ptr<Stream> tmp = Stream::opencl(dev->queue);
      chorusResult_t r;
      {
        py::gil_scoped_release nogil;
        r = call(c, tmp->get());
      }
      check(r, c, where);
      tmp->synchronize();
      return py::none();
    }
    chorusStream_t s = stream ? stream->get() : nullptr;
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = call(c, s);
    }
    check(r, c, where);
    if (!stream) return py::none();
    for (const View* v : views) stream->keep(v->owner);
    return py::cast(Handle(stream));
  }

 private:
  chorusComm_t comm_;
};

std::vector<size_t> toSizes(const std::vector<long long>& v, const char* arg) {
  std::vector<size_t> out;
  out.reserve(v.size());
  for (long long x : v) {
    if (x < 0) throw py::value_error(std::string(arg) + ": negative entry " + std::to_string(x));
    out.push_back(static_cast<size_t>(x));
  }
  return out;
}

std::vector<size_t> packedDispls(const std::vector<size_t>& counts) {
  std::vector<size_t> d(counts.size());
  size_t off = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    d[i] = off;
    off += counts[i];
  }
  return d;
}

// Group nesting as a context manager: `with chorus.group(): ...`.
struct GroupGuard {
  void enter() { check(chorusGroupStart(), nullptr, "group"); }
  void exit(py::object excType, py::object, py::object) {
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusGroupEnd();
    }
    // Never mask the exception raised inside the block.
    if (excType.is_none()) check(r, nullptr, "group end");
  }
};

}  // namespace

// ---------------------------------------------------------------- expert parallelism

// chorusEpHandle_t on a Communicator (chorus.h, "Expert parallelism").  Every
// method is collective and blocking (the GIL released while it runs).
class ExpertParallel {
 public:
  ExpertParallel(py::object comm, int numExperts, int topk, size_t hidden, const std::string& dtype,
                 const std::string& indexDtype, int maxHostsPerToken, const std::string& dispatchCompress, int fp8Block,
                 int lowLatencyMaxTokens)
      : comm_obj_(std::move(comm)), topk_(topk), hidden_(hidden) {
    comm_ = comm_obj_.cast<Communicator&>().live("ExpertParallel");
    chorusEpConfig_t cfg = CHORUS_EP_CONFIG_INITIALIZER;
    cfg.numExperts = numExperts, cfg.topk = topk, cfg.hidden = hidden, cfg.maxHostsPerToken = maxHostsPerToken;
    cfg.datatype = dtypeArg(dtype, "dtype");
    cfg.indexType = dtypeArg(indexDtype, "index_dtype");
    if (dispatchCompress == "off") cfg.dispatchCompress = CHORUS_COMPRESS_OFF;
    else if (dispatchCompress == "bf16") cfg.dispatchCompress = CHORUS_COMPRESS_BF16;
    else if (dispatchCompress == "fp8") cfg.dispatchCompress = CHORUS_COMPRESS_FP8;
    else throw py::value_error("dispatch_compress='" + dispatchCompress + "': 'off', 'bf16' or 'fp8'");
    cfg.fp8Block = fp8Block;
    cfg.lowLatencyMaxTokens = lowLatencyMaxTokens;
    dtype_ = cfg.datatype, itype_ = cfg.indexType;
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusEpCreate(&h_, &cfg, comm_);
    }
    check(r, comm_, "ExpertParallel");
    chorusEpGetInfo(h_, &hosts_, &locals_);
    int n = 0;
    chorusCommCount(comm_, &n);
    ll_rows_ = static_cast<size_t>(locals_) * static_cast<size_t>(n) * static_cast<size_t>(std::max(lowLatencyMaxTokens, 0));
  }
  ~ExpertParallel() {
    if (h_ != nullptr) chorusEpDestroy(h_);
  }
  ExpertParallel(const ExpertParallel&) = delete;
  ExpertParallel& operator=(const ExpertParallel&) = delete;

  py::dict layout(py::object topkIdx) {
    View v = viewOf(topkIdx, "topk_idx", false);
    if (v.dtype != itype_) throw py::type_error("layout: topk_idx's dtype is not the handle's index_dtype");
    if (v.count % static_cast<size_t>(topk_) != 0)
      throw py::value_error("layout: topk_idx has " + std::to_string(v.count) + " elements, not a multiple of topk=" +
                            std::to_string(topk_));
    int n = 0;
    chorusCommCount(comm_, &n);
    const size_t tokens = v.count / static_cast<size_t>(topk_);
    std::vector<size_t> pr(static_cast<size_t>(n)), ph(static_cast<size_t>(hosts_)),
        pe(static_cast<size_t>(locals_ * n)), rpe(static_cast<size_t>(locals_));
    size_t nrecv = 0;
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusEpLayout(h_, v.ptr, tokens, pr.data(), ph.data(), pe.data(), rpe.data(), &nrecv, comm_, nullptr);
    }
    check(r, comm_, "ExpertParallel.layout");
    tokens_ = tokens, recv_ = nrecv;
    py::dict d;
    d["tokens_per_rank"] = pr, d["tokens_per_host"] = ph, d["tokens_per_expert"] = pe;
    d["recv_per_expert"] = rpe, d["num_recv"] = nrecv;
    return d;
  }

  std::vector<size_t> sendOrder() const {
    size_t n = 0;
    check(chorusEpSendOrder(h_, nullptr, 0, &n), comm_, "ExpertParallel.send_order");
    std::vector<size_t> o(n);
    check(chorusEpSendOrder(h_, o.data(), o.size(), nullptr), comm_, "ExpertParallel.send_order");
    return o;
  }

  // What dispatch and dispatch_fp8 take alike: the tokens x (tokens x
  // hidden), the gate's weights (tokens x topk, float32, optional) and the
  // receive weights (float32, optional: they bound the rows received).
  // checkRecv checks the call's own receive buffers, after x.
  struct DispatchIn {
    View x;
    std::optional<View> w, recv_w;
    size_t rows = SIZE_MAX;  // the receive weights' rows
    [[nodiscard]] const float* weights() const { return w ? static_cast<const float*>(w->ptr) : nullptr; }
    [[nodiscard]] float* recvWeights() const { return recv_w ? static_cast<float*>(recv_w->ptr) : nullptr; }
  };
  template <class CheckRecv>
  DispatchIn dispatchIn(const char* call, py::object x, py::object topkWeights, py::object recvWeights,
                        CheckRecv checkRecv) {
    DispatchIn in;
    in.x = viewOf(x, "x", false);
    payload(in.x, "x");
    checkRecv();
    requireSizes(chorus::sizes::equal(call, "x.size", in.x.count, "tokens*hidden", tokens_ * hidden_));
    if (!topkWeights.is_none()) {
      in.w = viewOf(topkWeights, "topk_weights", false);
      f32(*in.w, "topk_weights");
      requireSizes(chorus::sizes::equal(call, "topk_weights.size", in.w->count, "tokens*topk", tokens_ * topk_));
    }
    if (!recvWeights.is_none()) {
      in.recv_w = viewOf(recvWeights, "recv_weights", true);
      f32(*in.recv_w, "recv_weights");
      in.rows = in.recv_w->count;
    }
    return in;
  }

  void dispatch(py::object x, py::object topkWeights, py::object recvX, py::object recvWeights) {
    View rv = viewOf(recvX, "recv_x", true);
    DispatchIn in = dispatchIn("dispatch", x, topkWeights, recvWeights, [&] { payload(rv, "recv_x"); });
    const size_t cap = std::min(rv.count / hidden_, in.rows);
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusEpDispatch(h_, in.x.ptr, in.weights(), rv.ptr, in.recvWeights(), cap, comm_, nullptr);
    }
    check(r, comm_, "ExpertParallel.dispatch");
  }

  // chorusEpDispatchFp8: recv_codes (uint8, rows x hidden) and recv_scales
  // (float32, rows x hidden / block) receive the fp8 wire as it came.
  void dispatchFp8(py::object x, py::object topkWeights, py::object recvCodes, py::object recvScales,
                   py::object recvWeights) {
    View cv = viewOf(recvCodes, "recv_codes", true), sv = viewOf(recvScales, "recv_scales", true);
    DispatchIn in = dispatchIn("dispatch_fp8", x, topkWeights, recvWeights, [&] {
      f32(sv, "recv_scales");
      if (cv.dtype != chorusUint8 && cv.dtype != chorusInt8 && cv.dtype != chorusFloat8e4m3)
        throw py::type_error("recv_codes: must be uint8 (the e4m3 codes' bytes)");
    });
    const size_t cap = std::min(cv.count / hidden_, in.rows);
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusEpDispatchFp8(h_, in.x.ptr, in.weights(), static_cast<uint8_t*>(cv.ptr), static_cast<float*>(sv.ptr),
                              sv.count, in.recvWeights(), cap, comm_, nullptr);
    }
    check(r, comm_, "ExpertParallel.dispatch_fp8");
  }

  void combine(py::object y, py::object weights, py::object out) {
    View yv = viewOf(y, "expert_out", false), ov = viewOf(out, "out", true);
    payload(yv, "expert_out"), payload(ov, "out");
    requireSizes(chorus::sizes::equal("combine", "expert_out.size", yv.count, "num_recv*hidden", recv_ * hidden_));
    requireSizes(chorus::sizes::equal("combine", "out.size", ov.count, "tokens*hidden", tokens_ * hidden_));
    std::optional<View> wv;
    if (!weights.is_none()) {
      wv = viewOf(weights, "weights", false);
      f32(*wv, "weights");
      requireSizes(chorus::sizes::equal("combine", "weights.size", wv->count, "num_recv", recv_));
    }
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusEpCombine(h_, yv.ptr, wv ? static_cast<const float*>(wv->ptr) : nullptr, ov.ptr, comm_, nullptr);
    }
    check(r, comm_, "ExpertParallel.combine");
  }

  void returnTopk(py::object rowValues, py::object topkValues) {
    View rv = viewOf(rowValues, "row_values", false), tv = viewOf(topkValues, "topk_values", true);
    f32(rv, "row_values"), f32(tv, "topk_values");
    requireSizes(chorus::sizes::equal("return_topk", "row_values.size", rv.count, "num_recv", recv_));
    requireSizes(chorus::sizes::equal("return_topk", "topk_values.size", tv.count, "tokens*topk", tokens_ * topk_));
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusEpReturnTopk(h_, static_cast<const float*>(rv.ptr), static_cast<float*>(tv.ptr), comm_, nullptr);
    }
    check(r, comm_, "ExpertParallel.return_topk");
  }

  // Low-latency mode (chorusEpLowLatencyDispatch/Combine): no layout.
  void lowLatencyDispatch(py::object topkIdx, py::object x, py::object topkWeights, py::object recvX,
                          py::object recvWeights, py::object recvCount) {
    View iv = viewOf(topkIdx, "topk_idx", false), xv = viewOf(x, "x", false), rv = viewOf(recvX, "recv_x", true);
    View cv = viewOf(recvCount, "recv_count", true);
    if (iv.dtype != itype_) throw py::type_error("low_latency_dispatch: topk_idx's dtype is not the handle's index_dtype");
    payload(xv, "x"), payload(rv, "recv_x");
    if (cv.dtype != chorusInt64 && cv.dtype != chorusUint64) throw py::type_error("recv_count: must be int64");
    if (iv.count % static_cast<size_t>(topk_) != 0)
      throw py::value_error("low_latency_dispatch: topk_idx has " + std::to_string(iv.count) +
                            " elements, not a multiple of topk=" + std::to_string(topk_));
    const size_t tokens = iv.count / static_cast<size_t>(topk_);
    requireSizes(chorus::sizes::equal("low_latency_dispatch", "x.size", xv.count, "tokens*hidden", tokens * hidden_));
    requireSizes(chorus::sizes::equal("low_latency_dispatch", "recv_x.size", rv.count, "low_latency_rows*hidden",
                                      ll_rows_ * hidden_));
    requireSizes(chorus::sizes::equal("low_latency_dispatch", "recv_count.size", cv.count, "num_local_experts",
                                      static_cast<size_t>(locals_)));
    std::optional<View> wv, rwv;
    if (!topkWeights.is_none()) {
      wv = viewOf(topkWeights, "topk_weights", false);
      f32(*wv, "topk_weights");
      requireSizes(chorus::sizes::equal("low_latency_dispatch", "topk_weights.size", wv->count, "tokens*topk", tokens * topk_));
    }
    if (!recvWeights.is_none()) {
      rwv = viewOf(recvWeights, "recv_weights", true);
      f32(*rwv, "recv_weights");
      requireSizes(chorus::sizes::equal("low_latency_dispatch", "recv_weights.size", rwv->count, "low_latency_rows", ll_rows_));
    }
    static_assert(sizeof(size_t) == sizeof(int64_t));
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusEpLowLatencyDispatch(h_, iv.ptr, tokens, xv.ptr, wv ? static_cast<const float*>(wv->ptr) : nullptr, rv.ptr,
                                     rwv ? static_cast<float*>(rwv->ptr) : nullptr, static_cast<size_t*>(cv.ptr), comm_,
                                     nullptr);
    }
    ll_tokens_ = r == chorusSuccess ? tokens : 0;
    check(r, comm_, "ExpertParallel.low_latency_dispatch");
  }

  void lowLatencyCombine(py::object y, py::object weights, py::object out) {
    View yv = viewOf(y, "expert_out", false), ov = viewOf(out, "out", true);
    payload(yv, "expert_out"), payload(ov, "out");
    requireSizes(chorus::sizes::equal("low_latency_combine", "expert_out.size", yv.count, "low_latency_rows*hidden",
                                      ll_rows_ * hidden_));
    requireSizes(chorus::sizes::equal("low_latency_combine", "out.size", ov.count, "tokens*hidden", ll_tokens_ * hidden_));
    std::optional<View> wv;
    if (!weights.is_none()) {
      wv = viewOf(weights, "weights", false);
      f32(*wv, "weights");
      requireSizes(chorus::sizes::equal("low_latency_combine", "weights.size", wv->count, "low_latency_rows", ll_rows_));
    }
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusEpLowLatencyCombine(h_, yv.ptr, wv ? static_cast<const float*>(wv->ptr) : nullptr, ov.ptr, comm_, nullptr);
    }
    check(r, comm_, "ExpertParallel.low_latency_combine");
  }

  int numLocalExperts() const { return locals_; }
  int numHosts() const { return hosts_; }
  size_t lowLatencyRows() const { return ll_rows_; }

 private:
  static chorusDataType_t dtypeArg(const std::string& s, const char* arg) {
    if (s == "float32") return chorusFloat32;
    if (s == "bfloat16") return chorusBfloat16;
    if (s == "int32") return chorusInt32;
    if (s == "int64") return chorusInt64;
    // Anything else goes to the library, which names what it accepts.
    (void)arg;
    return chorusUint8;
  }
  void payload(const View& v, const char* arg) const {
    if (v.dtype != dtype_) throw py::type_error(std::string(arg) + ": dtype is not the handle's dtype");
  }
  static void f32(const View& v, const char* arg) {
    if (v.dtype != chorusFloat32) throw py::type_error(std::string(arg) + ": must be float32");
  }

  py::object comm_obj_;  // keeps the Communicator alive
  chorusComm_t comm_ = nullptr;
  chorusEpHandle_t h_ = nullptr;
  chorusDataType_t dtype_ = chorusFloat32, itype_ = chorusInt64;
  int topk_ = 1;
  size_t hidden_ = 1;
  int hosts_ = 1, locals_ = 0;
  size_t tokens_ = 0, recv_ = 0;
  size_t ll_rows_ = 0, ll_tokens_ = 0;  // low-latency: recvX's rows, the last dispatch's tokens
};

// ---------------------------------------------------------------- KV transfer engine

size_t elementBytes(chorusDataType_t t) {
  switch (t) {
    case chorusInt8: case chorusUint8: case chorusFloat8e4m3: case chorusFloat8e5m2: return 1;
    case chorusFloat16: case chorusBfloat16: return 2;
    case chorusInt32: case chorusUint32: case chorusFloat32: return 4;
    default: return 8;
  }
}

// chorus.KvAgent: the C API's chorusKv* calls (docs/kv.md).  Registered
// buffers are kept alive by the agent until deregistered or closed.
class KvAgent {
 public:
  KvAgent(const std::string& name, const UniqueId& store, bool serveStore) {
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusKvAgentCreate(&agent_, name.c_str(), store.get(), serveStore ? 1 : 0);
    }
    check(r, nullptr, "KvAgent(" + name + ")");
  }
  ~KvAgent() { closeNoThrow(); }
  KvAgent(const KvAgent&) = delete;
  KvAgent& operator=(const KvAgent&) = delete;

  void close() {
    closeNoThrow();
  }

  uint32_t registerBuffer(py::object buf, const std::string& access) {
    int acc = 0;
    if (access.find('r') != std::string::npos) acc |= CHORUS_KV_READ;
    if (access.find('w') != std::string::npos) acc |= CHORUS_KV_WRITE;
    if (acc == 0 || access.find_first_not_of("rw") != std::string::npos)
      throw py::value_error("KvAgent.register: access='" + access + "' must be 'r', 'w' or 'rw'");
    View v = viewOf(buf, "KvAgent.register(buffer)", true);
    uint32_t region = 0;
    check(chorusKvRegister(live(), v.ptr, v.count * elementBytes(v.dtype), acc, &region), nullptr,
          "KvAgent.register");
    kept_[region] = std::move(buf);
    return region;
  }

  void deregister(uint32_t region) {
    check(chorusKvDeregister(live(), region), nullptr, "KvAgent.deregister");
    kept_.erase(region);
  }

  py::bytes metadata() {
    size_t size = 0;
    check(chorusKvGetMetadata(live(), nullptr, 0, &size), nullptr, "KvAgent.metadata");
    std::string blob(size, '\0');
    check(chorusKvGetMetadata(live(), blob.data(), blob.size(), &size), nullptr, "KvAgent.metadata");
    blob.resize(size);
    return py::bytes(blob);
  }

  void publish() { check(chorusKvPublishMetadata(live()), nullptr, "KvAgent.publish"); }

  std::string loadRemote(const py::bytes& blob) {
    std::string b = blob;
    char name[80] = {};
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusKvLoadRemote(live(), b.data(), b.size(), name, sizeof name);
    }
    check(r, nullptr, "KvAgent.load_remote");
    return name;
  }

  void connect(const std::string& peer, int timeoutMs) {
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusKvConnect(live(), peer.c_str(), timeoutMs);
    }
    check(r, nullptr, "KvAgent.connect(" + peer + ")");
  }

  void disconnect(const std::string& peer) {
    check(chorusKvDisconnect(live(), peer.c_str()), nullptr, "KvAgent.disconnect(" + peer + ")");
  }

  uint64_t post(bool write, const std::string& peer, const std::vector<std::tuple<uint32_t, uint64_t, uint32_t, uint64_t, uint64_t>>& descs,
                py::object notify) {
    std::vector<chorusKvDesc_t> d(descs.size());
    for (size_t i = 0; i < descs.size(); ++i) {
      d[i].localRegion = std::get<0>(descs[i]);
      d[i].localOffset = std::get<1>(descs[i]);
      d[i].remoteRegion = std::get<2>(descs[i]);
      d[i].remoteOffset = std::get<3>(descs[i]);
      d[i].bytes = std::get<4>(descs[i]);
    }
    const bool note = !notify.is_none();
    const uint64_t value = note ? notify.cast<uint64_t>() : 0;
    uint64_t xfer = 0;
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = write ? chorusKvPostWrite(live(), peer.c_str(), d.data(), d.size(), note ? 1 : 0, value, &xfer)
                : chorusKvPostRead(live(), peer.c_str(), d.data(), d.size(), note ? 1 : 0, value, &xfer);
    }
    check(r, nullptr, write ? "KvAgent.write" : "KvAgent.read");
    return xfer;
  }

  void progress() {
    py::gil_scoped_release nogil;
    chorusResult_t r = chorusKvProgress(live());
    if (r != chorusSuccess) {
      py::gil_scoped_acquire gil;
      raise(r, nullptr, "KvAgent.progress");
    }
  }

  // "done", "pending" or "cancelled"; a failed transfer raises.
  std::string test(uint64_t xfer) { return state(chorusKvTest(live(), xfer), "KvAgent.test"); }

  std::string wait(uint64_t xfer, int timeoutMs) {
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusKvWait(live(), xfer, timeoutMs);
    }
    return state(r, "KvAgent.wait");
  }

  void cancel(uint64_t xfer) { check(chorusKvCancel(live(), xfer), nullptr, "KvAgent.cancel"); }
  void release(uint64_t xfer) { check(chorusKvRelease(live(), xfer), nullptr, "KvAgent.release"); }

  py::object notification() {
    char name[80] = {};
    uint64_t value = 0;
    int got = 0;
    check(chorusKvGetNotif(live(), name, sizeof name, &value, &got), nullptr, "KvAgent.notification");
    if (!got) return py::none();
    return py::make_tuple(std::string(name), value);
  }

 private:
  chorusKvAgent_t live() const {
    if (agent_ == nullptr) throw py::value_error("KvAgent: the agent was closed");
    return agent_;
  }
  static std::string state(chorusResult_t r, const char* where) {
    if (r == chorusSuccess) return "done";
    if (r == chorusInProgress) return "pending";
    if (r == chorusAborted) return "cancelled";
    raise(r, nullptr, where);
  }
  void closeNoThrow() {
    if (agent_ == nullptr) return;
    chorusKvAgent_t a = agent_;
    agent_ = nullptr;
    {
      py::gil_scoped_release nogil;
      (void)chorusKvAgentDestroy(a);
    }
    kept_.clear();  // the memory outlives every access: the agent is gone
  }

  chorusKvAgent_t agent_ = nullptr;
  std::map<uint32_t, py::object> kept_;
};

PYBIND11_MODULE(_chorus, m) {
  m.doc() = "Low-level binding of the chorus C API; use the `chorus` package.";

  // ---- enums
  py::enum_<chorusResult_t>(m, "Result", "chorusResult_t: the outcome of a chorus call.")
      .value("Success", chorusSuccess)
      .value("SystemError", chorusSystemError)
      .value("InternalError", chorusInternalError)
      .value("InvalidArgument", chorusInvalidArgument)
      .value("InvalidUsage", chorusInvalidUsage)
      .value("RemoteError", chorusRemoteError)
      .value("InProgress", chorusInProgress)
      .value("Timeout", chorusTimeout)
      .value("Mismatch", chorusMismatch)
      .value("Aborted", chorusAborted)
      .value("Revoked", chorusRevoked);
  py::enum_<chorusDataType_t>(m, "DataType", "chorusDataType_t: element types chorus reduces and moves.")
      .value("int8", chorusInt8)
      .value("uint8", chorusUint8)
      .value("int32", chorusInt32)
      .value("uint32", chorusUint32)
      .value("int64", chorusInt64)
      .value("uint64", chorusUint64)
      .value("float16", chorusFloat16)
      .value("float32", chorusFloat32)
      .value("float64", chorusFloat64)
      .value("bfloat16", chorusBfloat16)
      .value("float8e4m3", chorusFloat8e4m3)
      .value("float8e5m2", chorusFloat8e5m2);
  m.attr("SUM") = static_cast<int>(chorusSum);
  m.attr("PROD") = static_cast<int>(chorusProd);
  m.attr("MAX") = static_cast<int>(chorusMax);
  m.attr("MIN") = static_cast<int>(chorusMin);
  m.attr("AVG") = static_cast<int>(chorusAvg);

  // ---- exceptions
  ErrorClasses& ec = errorClasses();
  ec.base = py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "chorus.Error", "A chorus call failed; `code` is the chorus.Result, str() is chorus's message.",
      PyExc_RuntimeError, nullptr));
  m.attr("Error") = ec.base;
  struct Sub { chorusResult_t code; const char* name; PyObject* extra; const char* doc; };
  const Sub subs[] = {
      {chorusSystemError, "SystemError", PyExc_OSError, "An OS call failed (socket, shm, mmap ...)."},
      {chorusInternalError, "InternalError", nullptr, "A bug in chorus; please report it."},
      {chorusInvalidArgument, "InvalidArgumentError", PyExc_ValueError, "A bad pointer, count, dtype, op, root or peer."},
      {chorusInvalidUsage, "InvalidUsageError", nullptr, "A call not allowed now (destroyed communicator, group nesting ...)."},
      {chorusRemoteError, "RemoteError", PyExc_ConnectionError, "A peer failed or disconnected."},
      {chorusInProgress, "InProgressError", nullptr, "An asynchronous operation has not completed yet."},
      {chorusTimeout, "TimeoutError", PyExc_TimeoutError, "An operation did not complete within its timeout."},
      {chorusMismatch, "MismatchError", nullptr, "Ranks called different operations, counts or types."},
      {chorusAborted, "AbortedError", nullptr, "The communicator was aborted."},
      {chorusRevoked, "RevokedError", nullptr, "A rank revoked the communicator (revoke); shrink it."},
  };
  ec.byCode[chorusSuccess] = ec.base;
  for (const Sub& s : subs) {
    py::tuple bases = s.extra ? py::make_tuple(ec.base, py::handle(s.extra)) : py::make_tuple(ec.base);
    std::string qual = std::string("chorus.") + s.name;
    ec.byCode[s.code] = py::reinterpret_steal<py::object>(
        PyErr_NewExceptionWithDoc(qual.c_str(), s.doc, bases.ptr(), nullptr));
    m.attr(s.name) = ec.byCode[s.code];
  }
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ChorusError& e) {
      ErrorClasses& classes = errorClasses();
      py::object cls = (e.code > 0 && e.code < chorusNumResults) ? classes.byCode[e.code] : classes.base;
      if (!cls) cls = classes.base;
      py::object inst = cls(e.message);
      inst.attr("code") = py::cast(e.code);
      PyErr_SetObject(cls.ptr(), inst.ptr());
    }
  });

  // ---- library
  m.def("version", [] {
    int v = 0;
    check(chorusGetVersion(&v), nullptr, "version");
    return v;
  }, "chorus's version as MAJOR*10000 + MINOR*100 + PATCH.");
  m.def("error_string", [](chorusResult_t r) { return std::string(chorusGetErrorString(r)); },
        "The fixed description of a chorus.Result.");

  py::class_<UniqueId>(m, "UniqueId",
                       "The rendezvous token: one rank creates it (UniqueId()), ships bytes(uid) to the others\n"
                       "(any channel), which rebuild it with UniqueId.from_bytes.")
      .def(py::init<>(), "Creates a fresh id; this process then hosts the rendezvous.")
      .def_static("from_bytes", &UniqueId::fromBytes, py::arg("data"), "Rebuilds an id from its bytes.")
      .def("__bytes__", &UniqueId::toBytes);

  py::class_<Stream, std::shared_ptr<Stream>>(m, "Stream",
      "A FIFO of operations run in the background by communicators' progress engines.\n"
      "Buffers passed to calls on a stream are kept alive until the stream is synchronised.")
      .def(py::init<>())
      .def_static("opencl", &Stream::opencl, py::arg("queue"),
                  "Stream.opencl(queue): a stream of a pyopencl.CommandQueue (in order); calls on it take\n"
                  "pyopencl.array.Array buffers, return at once and complete in the queue's order (docs/device.md).")
      .def("synchronize", &Stream::synchronize,
           "Waits for every operation queued on the stream; raises the first error among them.")
      .def("query", &Stream::query, "True when all queued work is done; raises its error if it failed.")
      .def_property_readonly("pending_objects", &Stream::pendingObjects,
                             "How many Python buffers the stream keeps alive until synchronised.");

  py::class_<Handle>(m, "Handle", "The result of an operation issued on a stream.")
      .def("wait", &Handle::wait, "Waits for the operation (and its stream's earlier work); raises its error.")
      .def("done", &Handle::done, "True when the operation has completed; raises its error if it failed.")
      .def_property_readonly("stream", &Handle::stream);

  py::class_<GroupGuard>(m, "_Group")
      .def(py::init<>())
      .def("__enter__", [](GroupGuard& g) { g.enter(); return &g; }, py::return_value_policy::reference)
      .def("__exit__", &GroupGuard::exit);
  m.def("group_start", [] { check(chorusGroupStart(), nullptr, "group_start"); });
  m.def("group_end", [] {
    chorusResult_t r;
    {
      py::gil_scoped_release nogil;
      r = chorusGroupEnd();
    }
    check(r, nullptr, "group_end");
  });

  using SP = std::shared_ptr<Stream>;
  py::class_<Communicator>(m, "Communicator",
      "A group of ranks running collectives.  Create with Communicator.from_env() or\n"
      "Communicator.from_unique_id(); use as a context manager to close it.\n"
      "Buffers: C-contiguous NumPy arrays (or buffer-protocol objects) and CPU torch tensors, never copied.")
      .def_static("from_env", &Communicator::fromEnv,
                  "Joins the job described by the environment (chorus-run, torchrun, Open MPI or Slurm variables;\n"
                  "see `chorus-run --print-env`).  Blocks until every rank has joined.")
      .def_static("from_unique_id", &Communicator::fromUniqueId, py::arg("nranks"), py::arg("unique_id"),
                  py::arg("rank"),
                  "Joins the communicator of `nranks` ranks named by `unique_id` as `rank`; blocks until all joined.")
      .def_property_readonly("rank", &Communicator::rank, "This process's rank, 0..size-1.")
      .def_property_readonly("size", &Communicator::size, "The number of ranks.")
      .def("close", &Communicator::destroy,
           "Destroys the communicator after its queued work (chorusCommDestroy); later calls raise.")
      .def("abort", &Communicator::abort,
           "Aborts: pending and later operations fail, peers see the failure.  Any thread.")
      .def("revoke", &Communicator::revoke,
           "Breaks the communicator on every rank (chorusCommRevoke): their pending and later operations raise\n"
           "RevokedError, so survivors stop waiting for a dead rank and can shrink().  Any thread.")
      .def("shrink", &Communicator::shrink,
           "Collective over the surviving ranks: a new communicator without the dead ones (chorusCommShrink).")
      .def("grow", &Communicator::grow, py::arg("nnew"),
           "Collective with `nnew` processes calling Communicator.join(unique_id): a new communicator of these\n"
           "ranks (same numbers) followed by the joiners (chorusCommGrow).")
      .def_static("join", &Communicator::join, py::arg("unique_id"),
                  "Joins a communicator that grows (chorusCommJoin), through the job's first unique id.")
      .def("async_error", &Communicator::asyncError,
           "The communicator's asynchronous error as a Result (Success when none).  Any thread.")
      .def("split", &Communicator::split, py::arg("color"), py::arg("key"),
           "Collective: ranks with equal color form a new communicator, ordered by key; color < 0 returns None.")
      .def("premul_sum", &Communicator::createPreMulSum, py::arg("scalar"), py::arg("dtype"),
           "A reduction op summing scalar * x, for buffers of `dtype` (a DataType); free it with destroy_op.")
      .def("destroy_op", &Communicator::destroyOp, py::arg("op"), "Frees an op made by premul_sum.")
      .def("all_reduce",
           [](Communicator& c, py::object send, py::object recv, int op, SP stream) {
             View s = viewOf(send, "send", recv.is_none());
             View r = recv.is_none() ? s : viewOf(recv, "recv", true);
             requireSameDtype(s, r, "all_reduce");
             requireSizes(chorus::sizes::equal("all_reduce", "recv.size", r.count, "send.size", s.count));
             return c.run("all_reduce", stream, {&s, &r}, [&](chorusComm_t cm, chorusStream_t st) {
               return chorusAllReduce(s.ptr, r.ptr, s.count, s.dtype, static_cast<chorusRedOp_t>(op), cm, st);
             });
           },
           py::arg("send"), py::arg("recv") = py::none(), py::arg("op") = 0, py::arg("stream") = SP(),
           "all_reduce(send, recv=None, op=Op.SUM, stream=None): reduces `send` across ranks into `recv` (in place when\nrecv is None).  Blocking without a stream; with one, returns a Handle at once.")
      .def("broadcast",
           [](Communicator& c, py::object buf, int root, py::object recv, SP stream) {
             View s = viewOf(buf, "buf", recv.is_none());
             View r = recv.is_none() ? s : viewOf(recv, "recv", true);
             requireSameDtype(s, r, "broadcast");
             if (c.rank() == root) requireSizes(chorus::sizes::equal("broadcast (at the root)", "recv.size", r.count, "buf.size", s.count));
             return c.run("broadcast", stream, {&s, &r}, [&](chorusComm_t cm, chorusStream_t st) {
               return chorusBroadcast(s.ptr, r.ptr, r.count, r.dtype, root, cm, st);
             });
           },
           py::arg("buf"), py::arg("root"), py::arg("recv") = py::none(), py::arg("stream") = SP(),
           "broadcast(buf, root, recv=None, stream=None): copies root's `buf` to every rank's `buf` (or `recv`).")
      .def("reduce",
           [](Communicator& c, py::object send, py::object recv, int op, int root, SP stream) {
             View s = viewOf(send, "send", recv.is_none());
             View r = recv.is_none() ? s : viewOf(recv, "recv", true);
             requireSameDtype(s, r, "reduce");
             if (c.rank() == root) requireSizes(chorus::sizes::equal("reduce (at the root)", "recv.size", r.count, "send.size", s.count));
             return c.run("reduce", stream, {&s, &r}, [&](chorusComm_t cm, chorusStream_t st) {
               return chorusReduce(s.ptr, r.ptr, s.count, s.dtype, static_cast<chorusRedOp_t>(op), root, cm, st);
             });
           },
           py::arg("send"), py::arg("recv") = py::none(), py::arg("op") = 0, py::arg("root") = 0,
           py::arg("stream") = SP(),
           "reduce(send, recv=None, op=Op.SUM, root=0, stream=None): reduces into `recv` (or `send`) on `root` only.")
      .def("all_gather",
           [](Communicator& c, py::object send, py::object recv, SP stream) {
             View s = viewOf(send, "send", false);
             View r = viewOf(recv, "recv", true);
             requireSameDtype(s, r, "all_gather");
             requireSizes(chorus::sizes::multiple("all_gather", "recv.size", r.count, "send.size", s.count, c.size()));
             return c.run("all_gather", stream, {&s, &r}, [&](chorusComm_t cm, chorusStream_t st) {
               return chorusAllGather(s.ptr, r.ptr, s.count, s.dtype, cm, st);
             });
           },
           py::arg("send"), py::arg("recv"), py::arg("stream") = SP(),
           "all_gather(send, recv, stream=None): recv (size * len(send) elements) receives every rank's send, in rank order.")
      .def("reduce_scatter",
           [](Communicator& c, py::object send, py::object recv, int op, SP stream) {
             View s = viewOf(send, "send", false);
             View r = viewOf(recv, "recv", true);
             requireSameDtype(s, r, "reduce_scatter");
             requireSizes(chorus::sizes::multiple("reduce_scatter", "send.size", s.count, "recv.size", r.count, c.size()));
             return c.run("reduce_scatter", stream, {&s, &r}, [&](chorusComm_t cm, chorusStream_t st) {
               return chorusReduceScatter(s.ptr, r.ptr, r.count, s.dtype, static_cast<chorusRedOp_t>(op), cm, st);
             });
           },
           py::arg("send"), py::arg("recv"), py::arg("op") = 0, py::arg("stream") = SP(),
           "reduce_scatter(send, recv, op=Op.SUM, stream=None): reduces send (size * len(recv) elements); rank r gets block r.")
      .def("all_to_all",
           [](Communicator& c, py::object send, py::object recv, SP stream) {
             View s = viewOf(send, "send", false);
             View r = viewOf(recv, "recv", true);
             requireSameDtype(s, r, "all_to_all");
             int n = c.size();
             requireSizes(chorus::sizes::equal("all_to_all", "recv.size", r.count, "send.size", s.count));
             requireSizes(chorus::sizes::divisible("all_to_all", "send.size", s.count, n));
             size_t per = s.count / static_cast<size_t>(n);
             return c.run("all_to_all", stream, {&s, &r}, [&](chorusComm_t cm, chorusStream_t st) {
               return chorusAllToAll(s.ptr, r.ptr, per, s.dtype, cm, st);
             });
           },
           py::arg("send"), py::arg("recv"), py::arg("stream") = SP(),
           "all_to_all(send, recv, stream=None): block d of send (len(send)/size elements) goes to rank d, which stores it\nas its block r.")
      .def("all_gather_v",
           [](Communicator& c, py::object send, py::object recv, std::vector<long long> counts,
              std::optional<std::vector<long long>> displs, SP stream) {
             View s = viewOf(send, "send", false);
             View r = viewOf(recv, "recv", true);
             requireSameDtype(s, r, "all_gather_v");
             auto rc = std::make_shared<std::vector<size_t>>(toSizes(counts, "counts"));
             auto rd = std::make_shared<std::vector<size_t>>(displs ? toSizes(*displs, "displs") : packedDispls(*rc));
             requireSizes(chorus::sizes::vector("all_gather_v", "counts", rc->data(), rc->size(), "displs", rd->data(),
                                        rd->size(), "recv.size", r.count, c.size()));
             const auto me = static_cast<size_t>(c.rank());
             requireSizes(chorus::sizes::equal("all_gather_v", "send.size", s.count, "counts[" + std::to_string(me) + "]",
                                       (*rc)[me]));
             py::object out = c.run("all_gather_v", stream, {&s, &r}, [&](chorusComm_t cm, chorusStream_t st) {
               return chorusAllGatherV(s.ptr, s.count, r.ptr, rc->data(), rd->data(), s.dtype, cm, st);
             });
             if (stream) stream->keep(py::capsule(new std::pair(rc, rd), [](void* p) {
               delete static_cast<std::pair<std::shared_ptr<std::vector<size_t>>, std::shared_ptr<std::vector<size_t>>>*>(p);
             }));
             return out;
           },
           py::arg("send"), py::arg("recv"), py::arg("counts"), py::arg("displs") = py::none(),
           py::arg("stream") = SP(),
           "all_gather_v(send, recv, counts, displs=None, stream=None): rank r contributes counts[r] elements, placed at\ndispls[r] of recv (packed in rank order by default).")
      .def("all_to_all_v",
           [](Communicator& c, py::object send, std::vector<long long> sendCounts, py::object recv,
              std::vector<long long> recvCounts, std::optional<std::vector<long long>> sdispls,
              std::optional<std::vector<long long>> rdispls, SP stream) {
             View s = viewOf(send, "send", false);
             View r = viewOf(recv, "recv", true);
             requireSameDtype(s, r, "all_to_all_v");
             using Vec = std::vector<size_t>;
             auto arrays = std::make_shared<std::array<Vec, 4>>();
             (*arrays)[0] = toSizes(sendCounts, "send_counts");
             (*arrays)[1] = sdispls ? toSizes(*sdispls, "sdispls") : packedDispls((*arrays)[0]);
             (*arrays)[2] = toSizes(recvCounts, "recv_counts");
             (*arrays)[3] = rdispls ? toSizes(*rdispls, "rdispls") : packedDispls((*arrays)[2]);
             {
               const auto& a = *arrays;
               requireSizes(chorus::sizes::vector("all_to_all_v", "send_counts", a[0].data(), a[0].size(), "sdispls",
                                          a[1].data(), a[1].size(), "send.size", s.count, c.size()));
               requireSizes(chorus::sizes::vector("all_to_all_v", "recv_counts", a[2].data(), a[2].size(), "rdispls",
                                          a[3].data(), a[3].size(), "recv.size", r.count, c.size()));
             }
             py::object out = c.run("all_to_all_v", stream, {&s, &r}, [&](chorusComm_t cm, chorusStream_t st) {
               auto& a = *arrays;
               return chorusAllToAllV(s.ptr, a[0].data(), a[1].data(), r.ptr, a[2].data(), a[3].data(), s.dtype, cm,
                                      st);
             });
             if (stream) stream->keep(py::capsule(new std::shared_ptr<std::array<Vec, 4>>(arrays), [](void* p) {
               delete static_cast<std::shared_ptr<std::array<Vec, 4>>*>(p);
             }));
             return out;
           },
           py::arg("send"), py::arg("send_counts"), py::arg("recv"), py::arg("recv_counts"),
           py::arg("sdispls") = py::none(), py::arg("rdispls") = py::none(), py::arg("stream") = SP(),
           "all_to_all_v(send, send_counts, recv, recv_counts, sdispls=None, rdispls=None, stream=None): per-peer counts\nand displacements in elements (packed by default).")
      .def("gather",
           [](Communicator& c, py::object send, py::object recv, int root, SP stream) {
             View s = viewOf(send, "send", false);
             View r = recv.is_none() ? s : viewOf(recv, "recv", true);
             if (!recv.is_none()) requireSameDtype(s, r, "gather");
             if (c.rank() == root) {
               if (recv.is_none()) throw py::value_error("gather: recv is required at the root (rank " + std::to_string(root) + ")");
               requireSizes(chorus::sizes::multiple("gather (at the root)", "recv.size", r.count, "send.size", s.count, c.size()));
             }
             void* rp = recv.is_none() ? nullptr : r.ptr;
             return c.run("gather", stream, {&s, &r}, [&](chorusComm_t cm, chorusStream_t st) {
               return chorusGather(s.ptr, rp, s.count, s.dtype, root, cm, st);
             });
           },
           py::arg("send"), py::arg("recv") = py::none(), py::arg("root") = 0, py::arg("stream") = SP(),
           "gather(send, recv=None, root=0, stream=None): root's recv (size * len(send) elements) receives every rank's send.")
      .def("scatter",
           [](Communicator& c, py::object send, py::object recv, int root, SP stream) {
             View r = viewOf(recv, "recv", true);
             View s = send.is_none() ? r : viewOf(send, "send", false);
             if (!send.is_none()) requireSameDtype(s, r, "scatter");
             if (c.rank() == root) {
               if (send.is_none()) throw py::value_error("scatter: send is required at the root (rank " + std::to_string(root) + ")");
               requireSizes(chorus::sizes::multiple("scatter (at the root)", "send.size", s.count, "recv.size", r.count, c.size()));
             }
             const void* sp = send.is_none() ? nullptr : s.ptr;
             return c.run("scatter", stream, {&s, &r}, [&](chorusComm_t cm, chorusStream_t st) {
               return chorusScatter(sp, r.ptr, r.count, r.dtype, root, cm, st);
             });
           },
           py::arg("send"), py::arg("recv"), py::arg("root") = 0, py::arg("stream") = SP(),
           "scatter(send, recv, root=0, stream=None): block r of root's send (size * len(recv) elements) goes to rank r's recv;\nsend may be None on other ranks.")
      .def("send",
           [](Communicator& c, py::object buf, int peer, SP stream) {
             View s = viewOf(buf, "buf", false);
             return c.run("send", stream, {&s}, [&](chorusComm_t cm, chorusStream_t st) {
               return chorusSend(s.ptr, s.count, s.dtype, peer, cm, st);
             });
           },
           py::arg("buf"), py::arg("peer"), py::arg("stream") = SP(),
           "send(buf, peer, stream=None): sends buf to peer; matched with peer's recv in issue order (no tags).")
      .def("recv",
           [](Communicator& c, py::object buf, int peer, SP stream) {
             View r = viewOf(buf, "buf", true);
             return c.run("recv", stream, {&r}, [&](chorusComm_t cm, chorusStream_t st) {
               return chorusRecv(r.ptr, r.count, r.dtype, peer, cm, st);
             });
           },
           py::arg("buf"), py::arg("peer"), py::arg("stream") = SP(),
           "recv(buf, peer, stream=None): receives into buf from peer.")
      .def("barrier",
           [](Communicator& c, SP stream) {
             return c.run("barrier", stream, {}, [&](chorusComm_t cm, chorusStream_t st) {
               return chorusBarrier(cm, st);
             });
           },
           py::arg("stream") = SP(),
           "barrier(stream=None): returns when every rank has entered it.");

  py::class_<ExpertParallel>(m, "ExpertParallel",
      "MoE dispatch and combine over a Communicator (chorus.h, 'Expert parallelism'; docs/ep.md).\n"
      "ExpertParallel(comm, num_experts, topk, hidden, dtype='bfloat16', index_dtype='int64',\n"
      "max_hosts_per_token=0, dispatch_compress='off', fp8_block=-1): collective; expert e lives on rank e // (num_experts // size).  Every method is\n"
      "collective and blocking; buffers are CPU torch tensors or NumPy arrays, never copied.")
      .def(py::init<py::object, int, int, size_t, const std::string&, const std::string&, int, const std::string&, int, int>(),
           py::arg("comm"), py::arg("num_experts"), py::arg("topk"), py::arg("hidden"), py::arg("dtype") = "bfloat16",
           py::arg("index_dtype") = "int64", py::arg("max_hosts_per_token") = 0, py::arg("dispatch_compress") = "off",
           py::arg("fp8_block") = -1, py::arg("low_latency_max_tokens") = 0)
      .def_property_readonly("low_latency_rows", &ExpertParallel::lowLatencyRows,
           "Rows of low_latency_dispatch's recv_x: num_local_experts x size x low_latency_max_tokens.")
      .def("low_latency_dispatch", &ExpertParallel::lowLatencyDispatch, py::arg("topk_idx"), py::arg("x"),
           py::arg("topk_weights"), py::arg("recv_x"), py::arg("recv_weights"), py::arg("recv_count"),
           "low_latency_dispatch(topk_idx, x, topk_weights, recv_x, recv_weights, recv_count): decode's dispatch\n"
           "(low_latency_max_tokens > 0): no layout; expert e's rows land at e x size x M in recv_x\n"
           "(low_latency_rows x hidden), recv_count (num_local_experts int64) says how many.")
      .def("low_latency_combine", &ExpertParallel::lowLatencyCombine, py::arg("expert_out"), py::arg("weights"),
           py::arg("out"),
           "low_latency_combine(expert_out, weights, out): undoes the last low_latency_dispatch (rows in its\n"
           "recv_x layout); out: its tokens x hidden, the same bits as combine.")
      .def_property_readonly("num_local_experts", &ExpertParallel::numLocalExperts)
      .def_property_readonly("num_hosts", &ExpertParallel::numHosts)
      .def("layout", &ExpertParallel::layout, py::arg("topk_idx"),
           "layout(topk_idx) -> dict(tokens_per_rank, tokens_per_host, tokens_per_expert, recv_per_expert, num_recv):\n"
           "topk_idx is tokens x topk; also exchanges the counts.")
      .def("send_order", &ExpertParallel::sendOrder, "The last layout's send order (token indices, rank-major).")
      .def("dispatch", &ExpertParallel::dispatch, py::arg("x"), py::arg("topk_weights"), py::arg("recv_x"),
           py::arg("recv_weights") = py::none(),
           "dispatch(x, topk_weights, recv_x, recv_weights=None): recv_x (num_recv x hidden) receives the tokens\n"
           "grouped by local expert; recv_weights (num_recv float32) their gate weights.")
      .def("dispatch_fp8", &ExpertParallel::dispatchFp8, py::arg("x"), py::arg("topk_weights"), py::arg("recv_codes"),
           py::arg("recv_scales"), py::arg("recv_weights") = py::none(),
           "dispatch_fp8(x, topk_weights, recv_codes, recv_scales, recv_weights=None): dispatch_compress='fp8' only;\n"
           "recv_codes (uint8, num_recv x hidden) receives the e4m3 codes, recv_scales (float32, num_recv x\n"
           "hidden / fp8_block) their per-block scales, as the sender quantized them (DeepEP's fp8 recv_x).")
      .def("combine", &ExpertParallel::combine, py::arg("expert_out"), py::arg("weights"), py::arg("out"),
           "combine(expert_out, weights, out): out (tokens x hidden) = the weighted sum of the token's expert rows,\n"
           "in chorus.h's fixed order; weights None: all 1.")
      .def("return_topk", &ExpertParallel::returnTopk, py::arg("row_values"), py::arg("topk_values"),
           "return_topk(row_values, topk_values): per-row float32 values back to their (token, k) (tokens x topk).");

  py::class_<KvAgent>(m, "KvAgent",
      "A KV-cache transfer agent (chorus.h, 'KV-cache transfer engine'; docs/kv.md).\n"
      "KvAgent(name, store_id, serve_store=False): store_id is a UniqueId whose process (the one with\n"
      "serve_store=True) runs the store that agents meet through.  Registered buffers (NumPy arrays, CPU\n"
      "tensors) are kept alive until deregistered or closed.  Transfers move on the agent's own progress thread "
      "(CHORUS_KV_PROGRESS=thread, the default; test, wait and notification only read its state) or, with "
      "CHORUS_KV_PROGRESS=caller, only inside the agent's calls (progress, test, wait, notification).")
      .def(py::init<const std::string&, const UniqueId&, bool>(), py::arg("name"), py::arg("store_id"),
           py::arg("serve_store") = false)
      .def("close", &KvAgent::close, "Destroys the agent (its pairs and regions); later calls raise.")
      .def("__enter__", [](KvAgent& a) -> KvAgent& { return a; }, py::return_value_policy::reference)
      .def("__exit__", [](KvAgent& a, py::args) { a.close(); })
      .def("register", &KvAgent::registerBuffer, py::arg("buffer"), py::arg("access") = "rw",
           "register(buffer, access='rw') -> region index; access 'r' (peers read), 'w' (peers write) or 'rw'.")
      .def("deregister", &KvAgent::deregister, py::arg("region"))
      .def("metadata", &KvAgent::metadata, "This agent's metadata blob (name, instance, regions).")
      .def("publish", &KvAgent::publish, "Puts the metadata in the store, for connect() by name.")
      .def("load_remote", &KvAgent::loadRemote, py::arg("blob"),
           "Loads a peer's blob (validated); the first load sets up the pair, with the peer loading ours.  Returns its name.")
      .def("connect", &KvAgent::connect, py::arg("peer"), py::arg("timeout_ms") = 30000,
           "load_remote of the blob `peer` published, waiting up to timeout_ms.")
      .def("disconnect", &KvAgent::disconnect, py::arg("peer"))
      .def("write", [](KvAgent& a, const std::string& peer, const std::vector<std::tuple<uint32_t, uint64_t, uint32_t, uint64_t, uint64_t>>& d,
                       py::object notify) { return a.post(true, peer, d, std::move(notify)); },
           py::arg("peer"), py::arg("descs"), py::arg("notify") = py::none(),
           "write(peer, descs, notify=None) -> transfer id: descs are (local_region, local_offset, remote_region,\n"
           "remote_offset, bytes); notify: a value the peer gets once every descriptor landed.")
      .def("read", [](KvAgent& a, const std::string& peer, const std::vector<std::tuple<uint32_t, uint64_t, uint32_t, uint64_t, uint64_t>>& d,
                      py::object notify) { return a.post(false, peer, d, std::move(notify)); },
           py::arg("peer"), py::arg("descs"), py::arg("notify") = py::none(),
           "read(peer, descs, notify=None) -> transfer id: the peer's bytes into ours.")
      .def("progress", &KvAgent::progress,
           "Drives the agent's transports once (CHORUS_KV_PROGRESS=caller); nothing with its progress thread.")
      .def("test", &KvAgent::test, py::arg("xfer"), "'done', 'pending' or 'cancelled'; a failed transfer raises.")
      .def("wait", &KvAgent::wait, py::arg("xfer"), py::arg("timeout_ms") = 30000,
           "Waits until the transfer is no longer pending: 'done' or 'cancelled'; raises on failure or timeout.")
      .def("cancel", &KvAgent::cancel, py::arg("xfer"))
      .def("release", &KvAgent::release, py::arg("xfer"), "Forgets a finished transfer.")
      .def("notification", &KvAgent::notification, "The oldest notification as (peer, value), or None.");
}
