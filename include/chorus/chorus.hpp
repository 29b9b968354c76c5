// chorus — the C++20 API.
//
// A header-only layer over the C ABI (chorus.h): libchorus.so exports only the
// C functions, so this header carries no ABI of its own and works with any
// build of the library.  What it adds:
//  - RAII owners: Communicator, Stream, Group (and UniqueId as a value);
//  - typed buffers: collectives take std::span<T> and derive the chorus data
//    type from T (int8..uint64, float, double, bfloat16, float16, fp8);
//  - size checks: a span of the wrong size is an invalid-argument Status that
//    names the spans and their sizes, and the C library is never called;
//  - errors as values: every fallible call returns Status or Result<T>, which
//    carry the code and the library's message (chorusGetLastError).  Nothing
//    throws.
//
//   auto id = chorus::UniqueId::create().value();        // rank 0; share the bytes
//   auto comm = chorus::Communicator::initRank(n, id, r).value();
//   std::vector<float> x(1024, 1.0f);
//   if (auto st = comm.allReduce(std::span(x), chorus::RedOp::Sum).wait(); !st.ok())
//     std::fprintf(stderr, "%s\n", st.message().c_str());
//
// Threading follows chorus.h: a Communicator is used by one thread at a time,
// except abort() and asyncError(), which any thread may call.  Groups are per
// thread.
//
// Everything lives in chorus::cpp_v0, an inline namespace: users write
// chorus::Communicator, while the library's internal classes of the same
// names (namespace chorus, linked statically into tests and tools) get
// distinct symbols, so the two can never be merged by the linker.  Do not
// include this header and the library's internal headers in one file.
#pragma once

#include <chorus/chorus.h>
#include <chorus/sizes.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace chorus {
inline namespace cpp_v0 {

// ---- status ------------------------------------------------------------------

// The chorusResult_t codes.
enum class Code : int {
  Success = chorusSuccess,
  SystemError = chorusSystemError,
  InternalError = chorusInternalError,
  InvalidArgument = chorusInvalidArgument,
  InvalidUsage = chorusInvalidUsage,
  RemoteError = chorusRemoteError,
  InProgress = chorusInProgress,
  Timeout = chorusTimeout,
  Mismatch = chorusMismatch,
  Aborted = chorusAborted,
};

// The outcome of a call: a code and, on failure, a message that names the
// call, the argument or rank and the values (and usually a fix).
class [[nodiscard]] Status {
 public:
  Status() = default;  // success
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {
    if (code_ == Code::Success) message_.clear();
  }
  // The status of a C call that just returned r on this thread.  Reads this
  // thread's last error, which every failing chorus call sets, rather than a
  // communicator's, which may hold an older message.
  static Status fromC(chorusResult_t r) {
    if (r == chorusSuccess) return {};
    return Status(static_cast<Code>(r), chorusGetLastError(nullptr));
  }

  [[nodiscard]] bool ok() const { return code_ == Code::Success; }
  [[nodiscard]] Code code() const { return code_; }
  [[nodiscard]] const std::string& message() const { return message_; }
  // "invalid argument: chorusBroadcast: root=5 is out of range ...", or "no error".
  [[nodiscard]] std::string toString() const {
    std::string s = chorusGetErrorString(static_cast<chorusResult_t>(code_));
    if (!message_.empty()) s += ": " + message_;
    return s;
  }

 private:
  Code code_ = Code::Success;
  std::string message_;
};

// A value of T, or the Status saying why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  // Requires !status.ok(): an ok status without a value is turned into an
  // internal error rather than an empty success.
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = Status(Code::InternalError, "chorus::Result built from an ok Status without a value");
  }

  [[nodiscard]] bool ok() const { return value_.has_value(); }
  [[nodiscard]] const Status& status() const { return status_; }

  // Requires ok().  Calling it on an error is a broken precondition, treated
  // as an assertion: the message goes to stderr and the process aborts (as
  // Rust's unwrap), since this API does not throw.  Check ok() first where
  // failure is expected.
  T& value() & { return check(), *value_; }
  const T& value() const& { return check(), *value_; }
  T&& value() && { return check(), std::move(*value_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void check() const {
    if (!value_) {
      std::fprintf(stderr, "chorus: Result::value() called on an error: %s\n", status_.toString().c_str());
      std::abort();
    }
  }
  std::optional<T> value_;
  Status status_;
};

// ---- data types ----------------------------------------------------------------

enum class DataType : int {
  Int8 = chorusInt8,
  Uint8 = chorusUint8,
  Int32 = chorusInt32,
  Uint32 = chorusUint32,
  Int64 = chorusInt64,
  Uint64 = chorusUint64,
  Float16 = chorusFloat16,
  Float32 = chorusFloat32,
  Float64 = chorusFloat64,
  Bfloat16 = chorusBfloat16,
  Float8e4m3 = chorusFloat8e4m3,
  Float8e5m2 = chorusFloat8e5m2,
};

// The built-in reductions.  Values made by Communicator::createPreMulSum are
// also RedOps (>= chorusNumOps); they are valid only on their communicator.
enum class RedOp : int {
  Sum = chorusSum,
  Prod = chorusProd,
  Max = chorusMax,
  Min = chorusMin,
  Avg = chorusAvg,
};

// IEEE binary16 as storage: 2 bytes, conversions to and from float with
// rounding to nearest even (subnormals exact, overflow to infinity), the same
// rules as the library's kernels.
struct float16 {
  uint16_t bits = 0;

  constexpr float16() = default;
  constexpr explicit float16(float f) : bits(fromFloat(f)) {}
  static constexpr float16 fromBits(uint16_t b) {
    float16 h;
    h.bits = b;
    return h;
  }
  constexpr explicit operator float() const { return toFloat(bits); }
  friend constexpr bool operator==(float16 a, float16 b) { return a.bits == b.bits; }  // bitwise

  static constexpr uint16_t fromFloat(float f) {
    // After F. Giesen's float_to_half_fast3_rtne.
    const uint32_t x = std::bit_cast<uint32_t>(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7fffffffu;
    if (a >= 0x47800000u)  // >= 65536, inf or NaN
      return static_cast<uint16_t>(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (a < 0x38800000u) {  // below 2^-14: a half subnormal (or zero)
      // Adding 0.5 aligns the half's subnormal ulp (2^-24) with float's ulp
      // at 0.5, so the float adder does the rounding to nearest even.
      const float t = std::bit_cast<float>(a) + 0.5f;
      return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(t) - 0x3f000000u));
    }
    const uint32_t odd = (a >> 13) & 1u;
    a += 0xc8000000u + 0xfffu + odd;  // rebias 127 -> 15 (mod 2^32), round half to even
    return static_cast<uint16_t>(sign | (a >> 13));
  }
  static constexpr float toFloat(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
      const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
      return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(v));
    }
    if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0u));
    return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
  }
};

// bfloat16 as storage: the top half of a float, rounded to nearest even.
struct bfloat16 {
  uint16_t bits = 0;

  constexpr bfloat16() = default;
  constexpr explicit bfloat16(float f) : bits(fromFloat(f)) {}
  static constexpr bfloat16 fromBits(uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }
  constexpr explicit operator float() const { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }
  friend constexpr bool operator==(bfloat16 a, bfloat16 b) { return a.bits == b.bits; }  // bitwise

  static constexpr uint16_t fromFloat(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
    return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  }
};

// fp8 as storage only (bits); the library reduces them through fp32.  Convert
// with your framework's fp8 routines.
struct float8_e4m3 {
  uint8_t bits = 0;
  friend constexpr bool operator==(float8_e4m3 a, float8_e4m3 b) = default;
};
struct float8_e5m2 {
  uint8_t bits = 0;
  friend constexpr bool operator==(float8_e5m2 a, float8_e5m2 b) = default;
};

static_assert(sizeof(float16) == 2 && sizeof(bfloat16) == 2 && sizeof(float8_e4m3) == 1 && sizeof(float8_e5m2) == 1);
static_assert(float16::fromFloat(1.0f) == 0x3c00 && float16::fromFloat(65504.0f) == 0x7bff &&
              float16::fromFloat(65520.0f) == 0x7c00 && float16::toFloat(0x0001) == 5.9604644775390625e-8f);
static_assert(bfloat16::fromFloat(1.0f) == 0x3f80);

// DataTypeOf<T>::value: the chorus data type of elements of type T.  Defined
// for every integer type of 1, 4 or 8 bytes (char, long long ... included),
// float, double, the wrappers above and std::byte; not for bool or 2-byte
// integers, which chorus has no type for.
template <class T, class = void>
struct DataTypeOf {};

namespace detail {
template <class T>
constexpr DataType integerType() {
  constexpr bool s = std::is_signed_v<T>;
  if constexpr (sizeof(T) == 1) return s ? DataType::Int8 : DataType::Uint8;
  else if constexpr (sizeof(T) == 4) return s ? DataType::Int32 : DataType::Uint32;
  else return s ? DataType::Int64 : DataType::Uint64;
}
}  // namespace detail

template <class T>
struct DataTypeOf<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool> &&
                                      (sizeof(T) == 1 || sizeof(T) == 4 || sizeof(T) == 8)>>
    : std::integral_constant<DataType, detail::integerType<T>()> {};
template <> struct DataTypeOf<float> : std::integral_constant<DataType, DataType::Float32> {};
template <> struct DataTypeOf<double> : std::integral_constant<DataType, DataType::Float64> {};
template <> struct DataTypeOf<float16> : std::integral_constant<DataType, DataType::Float16> {};
template <> struct DataTypeOf<bfloat16> : std::integral_constant<DataType, DataType::Bfloat16> {};
template <> struct DataTypeOf<float8_e4m3> : std::integral_constant<DataType, DataType::Float8e4m3> {};
template <> struct DataTypeOf<float8_e5m2> : std::integral_constant<DataType, DataType::Float8e5m2> {};
template <> struct DataTypeOf<std::byte> : std::integral_constant<DataType, DataType::Uint8> {};

// An element type chorus can move and reduce (cv-qualifiers ignored).
template <class T>
concept Element = requires { DataTypeOf<std::remove_cv_t<T>>::value; };

template <Element T>
inline constexpr DataType dataTypeOf = DataTypeOf<std::remove_cv_t<T>>::value;

static_assert(dataTypeOf<int8_t> == DataType::Int8 && dataTypeOf<uint64_t> == DataType::Uint64 &&
              dataTypeOf<const long long> == DataType::Int64 && dataTypeOf<char32_t> == DataType::Uint32);

// ---- unique id -----------------------------------------------------------------

// Names a communicator's rendezvous.  One rank creates it and sends its
// bytes() to the others by any means (a file, MPI, a launcher's env); every
// rank passes an identical copy to Communicator::initRank.
class UniqueId {
 public:
  static constexpr size_t kBytes = CHORUS_UNIQUE_ID_BYTES;

  UniqueId() = default;  // all zeros: not a valid id until filled
  explicit UniqueId(const chorusUniqueId& id) : id_(id) {}
  // Reserves the rendezvous port for this process's rank 0.
  static Result<UniqueId> create() {
    UniqueId u;
    if (chorusResult_t r = chorusGetUniqueId(&u.id_); r != chorusSuccess) return Status::fromC(r);
    return u;
  }
  static UniqueId fromBytes(std::span<const std::byte, kBytes> b) {
    UniqueId u;
    std::memcpy(u.id_.internal, b.data(), kBytes);
    return u;
  }
  [[nodiscard]] std::span<const std::byte, kBytes> bytes() const {
    return std::span<const std::byte, kBytes>(reinterpret_cast<const std::byte*>(id_.internal), kBytes);
  }
  [[nodiscard]] const chorusUniqueId& native() const { return id_; }

 private:
  chorusUniqueId id_{};
};

// ---- streams and work ------------------------------------------------------------

// A FIFO of operations that communicators' progress threads execute in the
// background; calls issued on it return at once.  Owns its chorusStream_t;
// destruction first waits for the queued work.  Move-only.  Buffers given to
// calls on a stream must stay valid until synchronize() (or a Work's wait())
// returns.
class Stream {
 public:
  static Result<Stream> create() {
    chorusStream_t s = nullptr;
    if (chorusResult_t r = chorusStreamCreate(&s); r != chorusSuccess) return Status::fromC(r);
    return Stream(s);
  }
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { reset(); }

  // Waits for every operation queued so far; returns the first error among them.
  Status synchronize() { return Status::fromC(chorusStreamSynchronize(s_)); }
  // ok when all queued work is done, Code::InProgress while some runs, or the error.
  Status query() {
    chorusResult_t r = chorusStreamQuery(s_);
    if (r == chorusInProgress) return Status(Code::InProgress, "operations are still queued on the stream");
    return Status::fromC(r);
  }
  [[nodiscard]] chorusStream_t native() const { return s_; }

 private:
  explicit Stream(chorusStream_t s) : s_(s) {}
  void reset() {
    // The destroy's synchronize result is dropped: a destructor cannot report
    // it.  Call synchronize() first to see errors.
    if (s_) (void)chorusStreamDestroy(s_);
    s_ = nullptr;
  }
  chorusStream_t s_ = nullptr;
};

// Where a call runs: on a Stream (asynchronous) or, by default, blocking on
// the caller's thread.  Converts implicitly from Stream&.
class StreamRef {
 public:
  StreamRef() = default;
  StreamRef(Stream& s) : s_(s.native()) {}  // NOLINT: implicit by design
  [[nodiscard]] chorusStream_t native() const { return s_; }

 private:
  chorusStream_t s_ = nullptr;
};

// The handle of an issued operation.
//  - Blocking call (no stream): the operation has finished; wait() returns its
//    outcome at once.
//  - Stream call: wait() synchronises the stream, so it waits for this
//    operation and for everything queued on the stream before it (and any
//    later work queued by then); the Stream must outlive the wait.
//  - Inside a Group: the operation runs when the group ends; the Work carries
//    only whether it was accepted, and Group::end() reports the outcome.
// A rejected call (bad argument) yields a Work whose wait() returns the error.
class [[nodiscard]] Work {
 public:
  Work() = default;
  explicit Work(Status st, chorusStream_t stream = nullptr) : status_(std::move(st)), stream_(stream) {}

  Status wait() {
    if (!status_.ok() || stream_ == nullptr) return status_;
    return Status::fromC(chorusStreamSynchronize(stream_));
  }
  // True once the operation (and what precedes it on its stream) is complete,
  // successfully or not; wait() then returns without blocking.
  [[nodiscard]] bool test() {
    if (!status_.ok() || stream_ == nullptr) return true;
    return chorusStreamQuery(stream_) != chorusInProgress;
  }

 private:
  Status status_;
  chorusStream_t stream_ = nullptr;
};

// ---- groups ----------------------------------------------------------------------

// Issues the calls made on this thread during its lifetime as one unit
// (chorusGroupStart/End): matching sends and receives complete in any order
// without deadlock.  end() issues the group and returns its outcome; if end()
// was not called the destructor ends the group and drops the outcome.  Groups
// may nest; the outermost end issues.  Not copyable or movable: it is a scope.
class Group {
 public:
  Group() { started_ = chorusGroupStart() == chorusSuccess; }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  ~Group() {
    if (started_ && !ended_) (void)chorusGroupEnd();
  }
  Status end() {
    if (!started_) return Status(Code::InvalidUsage, "chorus::Group::end: chorusGroupStart failed");
    if (ended_) return Status(Code::InvalidUsage, "chorus::Group::end: the group was already ended");
    ended_ = true;
    return Status::fromC(chorusGroupEnd());
  }

 private:
  bool started_ = false;
  bool ended_ = false;
};

// ---- communicator ------------------------------------------------------------------

// A set of ranks that run collectives together.  Owns its chorusComm_t:
// move-only; the destructor destroys it (waiting for queued work).  A
// moved-from or NOCOLOR-split Communicator is empty (valid() == false) and
// every call on it returns an InvalidUsage status.
//
// Collectives check span sizes before calling the library (counts are in
// elements of T); a mismatch yields a Work whose wait() returns an
// InvalidArgument status naming the spans and sizes.  Root, peer and op are
// checked by the library.  In-place: pass the same memory as send and recv
// (for gather-type calls, send = recv.subspan(rank() * send.size(), send.size())).
class Communicator {
 public:
  Communicator() = default;
  // Takes ownership of a handle from the C API (e.g. made by
  // chorusCommInitRank).  On failure (a NULL or dead handle) nothing is owned.
  static Result<Communicator> adopt(chorusComm_t comm) {
    int rank = 0, size = 0;
    if (chorusResult_t r = chorusCommUserRank(comm, &rank); r != chorusSuccess) return Status::fromC(r);
    if (chorusResult_t r = chorusCommCount(comm, &size); r != chorusSuccess) return Status::fromC(r);
    return Communicator(comm, rank, size);
  }
  // Collective over nranks ranks: each calls it with its rank and the same id.
  static Result<Communicator> initRank(int nranks, const UniqueId& id, int rank) {
    chorusComm_t c = nullptr;
    if (chorusResult_t r = chorusCommInitRank(&c, nranks, id.native(), rank); r != chorusSuccess)
      return Status::fromC(r);
    return Communicator(c, rank, nranks);
  }
  // From the launcher's environment (chorus-run, torchrun, Open MPI, Slurm).
  static Result<Communicator> fromEnv() {
    chorusComm_t c = nullptr;
    if (chorusResult_t r = chorusCommInitFromEnv(&c); r != chorusSuccess) return Status::fromC(r);
    return adoptOrDestroy(c);
  }

  Communicator(Communicator&& o) noexcept
      : comm_(std::exchange(o.comm_, nullptr)), rank_(std::exchange(o.rank_, 0)), size_(std::exchange(o.size_, 0)) {}
  Communicator& operator=(Communicator&& o) noexcept {
    if (this != &o) {
      (void)destroy();
      comm_ = std::exchange(o.comm_, nullptr);
      rank_ = std::exchange(o.rank_, 0);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator() { (void)destroy(); }

  // Destroys now (after queued work) and reports the outcome; leaves this empty.
  Status destroy() {
    if (!comm_) return {};
    chorusComm_t c = std::exchange(comm_, nullptr);
    rank_ = size_ = 0;
    return Status::fromC(chorusCommDestroy(c));
  }

  [[nodiscard]] bool valid() const { return comm_ != nullptr; }
  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  [[nodiscard]] chorusComm_t native() const { return comm_; }
  // Gives up ownership of the handle (the caller must chorusCommDestroy it).
  [[nodiscard]] chorusComm_t release() {
    rank_ = size_ = 0;
    return std::exchange(comm_, nullptr);
  }

  // Collective over this communicator: ranks with the same color form a new
  // communicator, ordered by key (then old rank).  color < 0 gives an empty
  // Communicator (not an error).
  Result<Communicator> split(int color, int key) {
    if (!comm_) return empty("split");
    chorusComm_t c = nullptr;
    if (chorusResult_t r = chorusCommSplit(comm_, color, key, &c); r != chorusSuccess) return Status::fromC(r);
    if (c == nullptr) return Communicator();
    return adoptOrDestroy(c);
  }

  // Fails every pending and future operation; any thread may call it.  The
  // communicator must still be destroyed (the destructor does it).
  Status abort() {
    if (!comm_) return empty("abort");
    return Status::fromC(chorusCommAbort(comm_));
  }
  // The error that broke the communicator (e.g. a peer failed), or ok.  Any thread.
  Status asyncError() const {
    if (!comm_) return empty("asyncError");
    chorusResult_t e = chorusSuccess;
    if (chorusResult_t r = chorusCommGetAsyncError(comm_, &e); r != chorusSuccess) return Status::fromC(r);
    if (e == chorusSuccess) return {};
    return Status(static_cast<Code>(e), chorusGetLastError(comm_));
  }

  // A sum that first multiplies each input by scalar (e.g. 1/n for an
  // average of gradients); for calls on T only.  Destroy it with destroyRedOp.
  template <Element T>
  Result<RedOp> createPreMulSum(T scalar) {
    if (!comm_) return empty("createPreMulSum");
    chorusRedOp_t op{};
    std::remove_cv_t<T> s = scalar;
    if (chorusResult_t r = chorusRedOpCreatePreMulSum(&op, &s, cType<T>(), chorusScalarHostImmediate, comm_);
        r != chorusSuccess)
      return Status::fromC(r);
    return static_cast<RedOp>(op);
  }
  Status destroyRedOp(RedOp op) {
    if (!comm_) return empty("destroyRedOp");
    return Status::fromC(chorusRedOpDestroy(static_cast<chorusRedOp_t>(op), comm_));
  }

  // ---- collectives (T is deduced from the receive span) ----

  // recv[i] = op over ranks of send[i].  Requires send.size() == recv.size().
  template <Element T>
  Work allReduce(std::span<const std::type_identity_t<T>> send, std::span<T> recv, RedOp op, StreamRef s = {}) {
    if (Status st = pre("allReduce"); !st.ok()) return Work(std::move(st));
    if (send.size() != recv.size()) return sizeError("allReduce", "send", send.size(), "recv", recv.size());
    return issue(chorusAllReduce(send.data(), recv.data(), recv.size(), cType<T>(), cOp(op), comm_, s.native()), s);
  }
  template <Element T>
  Work allReduce(std::span<T> buf, RedOp op, StreamRef s = {}) {
    return allReduce<T>(buf, buf, op, s);
  }

  // recv = root's send.  send is read only at the root (may be empty
  // elsewhere); at the root send.size() == recv.size().
  template <Element T>
  Work broadcast(std::span<const std::type_identity_t<T>> send, std::span<T> recv, int root, StreamRef s = {}) {
    if (Status st = pre("broadcast"); !st.ok()) return Work(std::move(st));
    if (rank_ == root && send.size() != recv.size())
      return sizeError("broadcast (at the root)", "send", send.size(), "recv", recv.size());
    return issue(chorusBroadcast(send.data(), recv.data(), recv.size(), cType<T>(), root, comm_, s.native()), s);
  }
  template <Element T>
  Work broadcast(std::span<T> buf, int root, StreamRef s = {}) {
    return broadcast<T>(buf, buf, root, s);
  }

  // The root's recv = op over ranks of send.  recv is written only at the
  // root (may be empty elsewhere); at the root recv.size() == send.size().
  template <Element T>
  Work reduce(std::span<const std::type_identity_t<T>> send, std::span<T> recv, RedOp op, int root,
              StreamRef s = {}) {
    if (Status st = pre("reduce"); !st.ok()) return Work(std::move(st));
    if (rank_ == root && send.size() != recv.size())
      return sizeError("reduce (at the root)", "send", send.size(), "recv", recv.size());
    return issue(
        chorusReduce(send.data(), recv.data(), send.size(), cType<T>(), cOp(op), root, comm_, s.native()), s);
  }

  // recv = every rank's send, in rank order.  recv.size() == send.size() * size().
  template <Element T>
  Work allGather(std::span<const std::type_identity_t<T>> send, std::span<T> recv, StreamRef s = {}) {
    if (Status st = pre("allGather"); !st.ok()) return Work(std::move(st));
    if (!isMultiple(recv.size(), send.size()))
      return multipleError("allGather", "recv", recv.size(), "send", send.size());
    return issue(chorusAllGather(send.data(), recv.data(), send.size(), cType<T>(), comm_, s.native()), s);
  }

  // recv = block rank() of (op over ranks of send).  send.size() == recv.size() * size().
  template <Element T>
  Work reduceScatter(std::span<const std::type_identity_t<T>> send, std::span<T> recv, RedOp op, StreamRef s = {}) {
    if (Status st = pre("reduceScatter"); !st.ok()) return Work(std::move(st));
    if (!isMultiple(send.size(), recv.size()))
      return multipleError("reduceScatter", "send", send.size(), "recv", recv.size());
    return issue(
        chorusReduceScatter(send.data(), recv.data(), recv.size(), cType<T>(), cOp(op), comm_, s.native()), s);
  }

  // Block j of send goes to rank j, arriving as block rank() of its recv.
  // send.size() == recv.size(), a multiple of size() (blocks of size()-th).
  template <Element T>
  Work allToAll(std::span<const std::type_identity_t<T>> send, std::span<T> recv, StreamRef s = {}) {
    if (Status st = pre("allToAll"); !st.ok()) return Work(std::move(st));
    if (send.size() != recv.size()) return sizeError("allToAll", "send", send.size(), "recv", recv.size());
    if (std::string e = sizes::divisible("chorus::Communicator::allToAll", "send.size()", send.size(), size_); !e.empty())
      return Work(Status(Code::InvalidArgument, std::move(e) + " (each rank gets an equal block)"));
    return issue(chorusAllToAll(send.data(), recv.data(), recv.size() / static_cast<size_t>(size_), cType<T>(),
                                comm_, s.native()),
                 s);
  }

  // Rank i's send lands at recv[displs[i] .. + recvcounts[i]).  recvcounts and
  // displs have size() entries, recvcounts[rank()] == send.size(), and recv
  // covers every block.
  template <Element T>
  Work allGatherV(std::span<const std::type_identity_t<T>> send, std::span<T> recv,
                  std::span<const size_t> recvcounts, std::span<const size_t> displs, StreamRef s = {}) {
    if (Status st = pre("allGatherV"); !st.ok()) return Work(std::move(st));
    if (Status st = checkV("allGatherV", "recvcounts", recvcounts, "displs", displs, "recv", recv.size());
        !st.ok())
      return Work(std::move(st));
    if (recvcounts[static_cast<size_t>(rank_)] != send.size())
      return Work(Status(Code::InvalidArgument, "chorus::Communicator::allGatherV: send.size()=" +
                                                    std::to_string(send.size()) + " but recvcounts[" +
                                                    std::to_string(rank_) + "]=" +
                                                    std::to_string(recvcounts[static_cast<size_t>(rank_)]) +
                                                    " (they must be equal)"));
    return issue(chorusAllGatherV(send.data(), send.size(), recv.data(), recvcounts.data(), displs.data(),
                                  cType<T>(), comm_, s.native()),
                 s);
  }

  // send[sdispls[j] .. + sendcounts[j]) goes to rank j, arriving at its
  // recv[rdispls[rank()] .. + recvcounts[rank()]).  Every count/displacement
  // span has size() entries and each buffer covers its blocks.  Not in place.
  template <Element T>
  Work allToAllV(std::span<const std::type_identity_t<T>> send, std::span<const size_t> sendcounts,
                 std::span<const size_t> sdispls, std::span<T> recv, std::span<const size_t> recvcounts,
                 std::span<const size_t> rdispls, StreamRef s = {}) {
    if (Status st = pre("allToAllV"); !st.ok()) return Work(std::move(st));
    if (Status st = checkV("allToAllV", "sendcounts", sendcounts, "sdispls", sdispls, "send", send.size()); !st.ok())
      return Work(std::move(st));
    if (Status st = checkV("allToAllV", "recvcounts", recvcounts, "rdispls", rdispls, "recv", recv.size()); !st.ok())
      return Work(std::move(st));
    return issue(chorusAllToAllV(send.data(), sendcounts.data(), sdispls.data(), recv.data(), recvcounts.data(),
                                 rdispls.data(), cType<T>(), comm_, s.native()),
                 s);
  }

  // The root's recv = every rank's send in rank order.  recv is written only
  // at the root (may be empty elsewhere); there recv.size() == send.size() * size().
  template <Element T>
  Work gather(std::span<const std::type_identity_t<T>> send, std::span<T> recv, int root, StreamRef s = {}) {
    if (Status st = pre("gather"); !st.ok()) return Work(std::move(st));
    if (rank_ == root && !isMultiple(recv.size(), send.size()))
      return multipleError("gather (at the root)", "recv", recv.size(), "send", send.size());
    return issue(chorusGather(send.data(), recv.data(), send.size(), cType<T>(), root, comm_, s.native()), s);
  }

  // recv = block rank() of the root's send.  send is read only at the root
  // (may be empty elsewhere); there send.size() == recv.size() * size().
  template <Element T>
  Work scatter(std::span<const std::type_identity_t<T>> send, std::span<T> recv, int root, StreamRef s = {}) {
    if (Status st = pre("scatter"); !st.ok()) return Work(std::move(st));
    if (rank_ == root && !isMultiple(send.size(), recv.size()))
      return multipleError("scatter (at the root)", "send", send.size(), "recv", recv.size());
    return issue(chorusScatter(send.data(), recv.data(), recv.size(), cType<T>(), root, comm_, s.native()), s);
  }

  // Point to point.  The peer's matching recv must have the same size.  A
  // blocking send and recv between two ranks that both send first deadlock
  // unless inside a Group; a send to self needs a Group with its recv.
  template <class T>
    requires Element<T>
  Work send(std::span<T> buf, int peer, StreamRef s = {}) {
    if (Status st = pre("send"); !st.ok()) return Work(std::move(st));
    return issue(chorusSend(buf.data(), buf.size(), cType<T>(), peer, comm_, s.native()), s);
  }
  template <Element T>
  Work recv(std::span<T> buf, int peer, StreamRef s = {}) {
    if (Status st = pre("recv"); !st.ok()) return Work(std::move(st));
    return issue(chorusRecv(buf.data(), buf.size(), cType<T>(), peer, comm_, s.native()), s);
  }

  Work barrier(StreamRef s = {}) {
    if (Status st = pre("barrier"); !st.ok()) return Work(std::move(st));
    return issue(chorusBarrier(comm_, s.native()), s);
  }

  // A registered primitive by name (chorusPrimitive: collectives,
  // point-to-point and local work composed; complete when it returns).
  // args: start from CHORUS_PRIMITIVE_ARGS_INITIALIZER.
  Status primitive(const char* name, const chorusPrimitiveArgs_t& args, StreamRef s = {}) {
    if (Status st = pre("primitive"); !st.ok()) return st;
    return Status::fromC(chorusPrimitive(name, &args, comm_, s.native()));
  }

  // The MoE dispatch's communication ("alltoallv_dynamic"): send holds the
  // elements for rank 0, then rank 1, ... (sendcounts[j] for rank j,
  // size() entries); they arrive packed in rank order in recv, which must
  // have room for them all; recvcounts (size() entries) receives what came
  // from each rank.  No rank needs to know its receive counts in advance.
  template <Element T>
  Status allToAllVDynamic(std::span<const std::type_identity_t<T>> send, std::span<const size_t> sendcounts,
                          std::span<T> recv, std::span<size_t> recvcounts) {
    if (Status st = pre("allToAllVDynamic"); !st.ok()) return st;
    chorusPrimitiveArgs_t a = CHORUS_PRIMITIVE_ARGS_INITIALIZER;
    a.sendbuff = send.data();
    a.recvbuff = recv.data();
    a.count = recv.size();
    a.datatype = cType<T>();
    a.counts = sendcounts.data();
    a.ncounts = sendcounts.size();
    a.outCounts = recvcounts.data();
    a.nOutCounts = recvcounts.size();
    size_t total = 0;
    for (size_t c : sendcounts) total += c;
    if (total > send.size())
      return Status(Code::InvalidArgument, "chorus::Communicator::allToAllVDynamic: sendcounts add up to " +
                                               std::to_string(total) + " elements but send.size()=" +
                                               std::to_string(send.size()));
    return Status::fromC(chorusPrimitive("alltoallv_dynamic", &a, comm_, nullptr));
  }

 private:
  Communicator(chorusComm_t c, int rank, int size) : comm_(c), rank_(rank), size_(size) {}

  static Result<Communicator> adoptOrDestroy(chorusComm_t c) {
    auto r = adopt(c);
    if (!r.ok()) (void)chorusCommDestroy(c);
    return r;
  }

  template <class T>
  static constexpr chorusDataType_t cType() {
    return static_cast<chorusDataType_t>(dataTypeOf<T>);
  }
  static chorusRedOp_t cOp(RedOp op) { return static_cast<chorusRedOp_t>(op); }

  static Status empty(const char* fn) {
    return Status(Code::InvalidUsage, std::string("chorus::Communicator::") + fn +
                                          ": the communicator is empty (moved from, destroyed, or a NOCOLOR split)");
  }
  Status pre(const char* fn) const { return comm_ ? Status() : empty(fn); }

  // Inside a group a stream call is queued, not yet on the stream; waiting on
  // the stream after the group ends is still correct.
  static Work issue(chorusResult_t r, StreamRef s) {
    if (r != chorusSuccess) return Work(Status::fromC(r));
    return Work(Status(), s.native());
  }

  // The size rules are chorus/sizes.hpp's, shared with the Python module and
  // the torch backend.
  static Work sizeError(const char* fn, const char* a, size_t na, const char* b, size_t nb) {
    return Work(Status(Code::InvalidArgument, sizes::equal(std::string("chorus::Communicator::") + fn,
                                                           std::string(a) + ".size()", na, std::string(b) + ".size()", nb)));
  }
  // big == small * size(), checked without overflow.
  [[nodiscard]] bool isMultiple(size_t big, size_t small) const {
    return sizes::multiple("", "", big, "", small, size_).empty();
  }
  Work multipleError(const char* fn, const char* big, size_t nbig, const char* small, size_t nsmall) const {
    return Work(Status(Code::InvalidArgument,
                       sizes::multiple(std::string("chorus::Communicator::") + fn, std::string(big) + ".size()", nbig,
                                       std::string(small) + ".size()", nsmall, size_)));
  }
  // counts and displs have size() entries and every block lies inside a
  // buffer of buf elements.
  Status checkV(const char* fn, const char* cn, std::span<const size_t> counts, const char* dn,
                std::span<const size_t> displs, const char* bn, size_t buf) const {
    std::string e = sizes::vector(std::string("chorus::Communicator::") + fn, cn, counts.data(), counts.size(), dn,
                                  displs.data(), displs.size(), std::string(bn) + ".size()", buf, size_);
    if (!e.empty()) return Status(Code::InvalidArgument, std::move(e));
    return {};
  }

  chorusComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 0;
};

// MoE expert parallelism (chorus.h, "Expert parallelism"; docs/ep.md): the
// owner of a chorusEpHandle_t on a communicator.  T is the payload (float or
// bfloat16), I the router's id type (int32_t or int64_t).  Every call is
// collective and complete when it returns.  What the library can check it
// checks on every rank alike (bad ids, a receive that does not fit: refused
// on every rank); a span whose size contradicts the layout (x, out, ...) is
// refused here, on the calling rank only, as this header's other calls do.
//
//   auto ep = chorus::ExpertParallel<bfloat16, int64_t>::create(comm, 64, 8, 7168).value();
//   auto lay = ep.layout(topk_idx).value();            // topk_idx: tokens x 8
//   std::vector<bfloat16> rx(lay.numRecv * 7168);  std::vector<float> rw(lay.numRecv);
//   ep.dispatch(x, topk_weights, rx, rw);              // rx: grouped by local expert (lay.recvPerExpert)
//   ... experts: rx -> y ...
//   ep.combine(y, rw, out);                            // out: tokens x 7168, weighted sum
struct EpLayout {
  std::vector<size_t> tokensPerRank, tokensPerHost, tokensPerExpert, recvPerExpert;
  size_t numRecv = 0;  // rows dispatch writes (the sum of recvPerExpert)
};

template <class T, class I>
class ExpertParallel {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bfloat16>, "payload: float or bfloat16");
  static_assert(std::is_same_v<I, int32_t> || std::is_same_v<I, int64_t>, "ids: int32_t or int64_t");

 public:
  // Collective: every rank passes the same values.  maxHostsPerToken > 0:
  // node-limited routing (chorus.h, chorusEpConfig_t).
  // dispatchCompress: CHORUS_COMPRESS_OFF, _BF16 or _FP8 (dispatch's wire; fp8Block -1: 128).
  static Result<ExpertParallel> create(const Communicator& comm, int numExperts, int topk, size_t hidden,
                                       int maxHostsPerToken = 0, int dispatchCompress = CHORUS_COMPRESS_OFF,
                                       int fp8Block = -1, int lowLatencyMaxTokens = 0) {
    chorusEpConfig_t cfg = CHORUS_EP_CONFIG_INITIALIZER;
    cfg.numExperts = numExperts, cfg.topk = topk, cfg.hidden = hidden, cfg.maxHostsPerToken = maxHostsPerToken;
    cfg.dispatchCompress = dispatchCompress, cfg.fp8Block = fp8Block;
    cfg.lowLatencyMaxTokens = lowLatencyMaxTokens;
    cfg.datatype = static_cast<chorusDataType_t>(dataTypeOf<T>);
    cfg.indexType = static_cast<chorusDataType_t>(dataTypeOf<I>);
    chorusEpHandle_t h = nullptr;
    if (chorusResult_t r = chorusEpCreate(&h, &cfg, comm.native()); r != chorusSuccess) return Status::fromC(r);
    int hosts = 0, locals = 0;
    (void)chorusEpGetInfo(h, &hosts, &locals);
    ExpertParallel ep(h, comm.native(), comm.size(), topk, hidden, hosts, locals, numExperts);
    ep.ll_max_ = static_cast<size_t>(std::max(lowLatencyMaxTokens, 0));
    return ep;
  }
  ExpertParallel(ExpertParallel&& o) noexcept { *this = std::move(o); }
  ExpertParallel& operator=(ExpertParallel&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
      comm_ = o.comm_, nranks_ = o.nranks_, topk_ = o.topk_, hidden_ = o.hidden_, hosts_ = o.hosts_;
      locals_ = o.locals_, experts_ = o.experts_, tokens_ = o.tokens_, recv_ = o.recv_;
      ll_max_ = o.ll_max_, ll_tokens_ = o.ll_tokens_;
    }
    return *this;
  }
  ExpertParallel(const ExpertParallel&) = delete;
  ExpertParallel& operator=(const ExpertParallel&) = delete;
  ~ExpertParallel() { reset(); }

  [[nodiscard]] chorusEpHandle_t native() const { return h_; }
  [[nodiscard]] int numLocalExperts() const { return locals_; }
  [[nodiscard]] int numHosts() const { return hosts_; }

  // topkIdx: tokens x topk ids.  Also exchanges the counts (collective).
  Result<EpLayout> layout(std::span<const I> topkIdx, StreamRef s = {}) {
    if (topkIdx.size() % static_cast<size_t>(topk_) != 0)
      return Status(Code::InvalidArgument, "chorus::ExpertParallel::layout: topkIdx.size()=" + std::to_string(topkIdx.size()) +
                                               " is not a multiple of topk=" + std::to_string(topk_));
    EpLayout l;
    l.tokensPerRank.resize(static_cast<size_t>(nranks_));
    l.tokensPerHost.resize(static_cast<size_t>(hosts_));
    l.tokensPerExpert.resize(static_cast<size_t>(experts_));
    l.recvPerExpert.resize(static_cast<size_t>(locals_));
    const size_t tokens = topkIdx.size() / static_cast<size_t>(topk_);
    if (chorusResult_t r = chorusEpLayout(h_, topkIdx.data(), tokens, l.tokensPerRank.data(), l.tokensPerHost.data(),
                                          l.tokensPerExpert.data(), l.recvPerExpert.data(), &l.numRecv, comm_, s.native());
        r != chorusSuccess)
      return Status::fromC(r);
    tokens_ = tokens, recv_ = l.numRecv;
    return l;
  }
  // The last layout's send order (token indices, rank-major).
  Result<std::vector<size_t>> sendOrder() const {
    size_t n = 0;
    if (chorusResult_t r = chorusEpSendOrder(h_, nullptr, 0, &n); r != chorusSuccess) return Status::fromC(r);
    std::vector<size_t> o(n);
    if (chorusResult_t r = chorusEpSendOrder(h_, o.data(), o.size(), nullptr); r != chorusSuccess) return Status::fromC(r);
    return o;
  }
  // x: tokens x hidden; topkWeights: tokens x topk or empty (all 1);
  // recvX: room for rows of hidden (its rows are the capacity, checked on
  // every rank); recvWeights: empty, or as many rows as recvX.
  Status dispatch(std::span<const std::type_identity_t<T>> x, std::span<const float> topkWeights, std::span<T> recvX,
                  std::span<float> recvWeights = {}, StreamRef s = {}) {
    if (x.size() != tokens_ * hidden_) return sizeError("dispatch", "x", x.size(), tokens_ * hidden_);
    if (!topkWeights.empty() && topkWeights.size() != tokens_ * static_cast<size_t>(topk_))
      return sizeError("dispatch", "topkWeights", topkWeights.size(), tokens_ * static_cast<size_t>(topk_));
    size_t cap = recvX.size() / hidden_;
    if (!recvWeights.empty()) cap = std::min(cap, recvWeights.size());
    return Status::fromC(chorusEpDispatch(h_, x.data(), topkWeights.empty() ? nullptr : topkWeights.data(), recvX.data(),
                                          recvWeights.empty() ? nullptr : recvWeights.data(), cap, comm_, s.native()));
  }
  // dispatch handing the experts the fp8 wire (chorusEpDispatchFp8; the
  // handle made with dispatchCompress = CHORUS_COMPRESS_FP8, hidden a
  // multiple of the block): recvCodes holds rows of hidden e4m3 codes (its
  // rows are the capacity), recvScales hidden / block float32 per row.
  Status dispatchFp8(std::span<const std::type_identity_t<T>> x, std::span<const float> topkWeights,
                     std::span<uint8_t> recvCodes, std::span<float> recvScales, std::span<float> recvWeights = {},
                     StreamRef s = {}) {
    if (x.size() != tokens_ * hidden_) return sizeError("dispatchFp8", "x", x.size(), tokens_ * hidden_);
    if (!topkWeights.empty() && topkWeights.size() != tokens_ * static_cast<size_t>(topk_))
      return sizeError("dispatchFp8", "topkWeights", topkWeights.size(), tokens_ * static_cast<size_t>(topk_));
    size_t cap = recvCodes.size() / hidden_;
    if (!recvWeights.empty()) cap = std::min(cap, recvWeights.size());
    return Status::fromC(chorusEpDispatchFp8(h_, x.data(), topkWeights.empty() ? nullptr : topkWeights.data(),
                                             recvCodes.data(), recvScales.data(), recvScales.size(),
                                             recvWeights.empty() ? nullptr : recvWeights.data(), cap, comm_, s.native()));
  }
  // expertOut: numRecv x hidden (rows as dispatch's recvX); weights: numRecv
  // or empty (all 1); out: tokens x hidden.
  Status combine(std::span<const std::type_identity_t<T>> expertOut, std::span<const float> weights, std::span<T> out,
                 StreamRef s = {}) {
    if (expertOut.size() < recv_ * hidden_) return sizeError("combine", "expertOut", expertOut.size(), recv_ * hidden_);
    if (!weights.empty() && weights.size() < recv_) return sizeError("combine", "weights", weights.size(), recv_);
    if (out.size() != tokens_ * hidden_) return sizeError("combine", "out", out.size(), tokens_ * hidden_);
    return Status::fromC(chorusEpCombine(h_, expertOut.data(), weights.empty() ? nullptr : weights.data(), out.data(),
                                         comm_, s.native()));
  }
  // rowValues: numRecv; topkValues: tokens x topk.
  Status returnTopk(std::span<const float> rowValues, std::span<float> topkValues, StreamRef s = {}) {
    if (rowValues.size() < recv_) return sizeError("returnTopk", "rowValues", rowValues.size(), recv_);
    if (topkValues.size() != tokens_ * static_cast<size_t>(topk_))
      return sizeError("returnTopk", "topkValues", topkValues.size(), tokens_ * static_cast<size_t>(topk_));
    return Status::fromC(chorusEpReturnTopk(h_, rowValues.data(), topkValues.data(), comm_, s.native()));
  }

  // Low-latency mode (create(..., lowLatencyMaxTokens = M > 0); chorus.h,
  // chorusEpLowLatencyDispatch): no layout call.  topkIdx: tokens x topk
  // (tokens <= M on every rank, or every rank fails); x: tokens x hidden;
  // topkWeights: tokens x topk or empty.  recvX: lowLatencyRows() rows of
  // hidden, expert e's at [e x size x M, + recvCount[e]); recvWeights: empty
  // or lowLatencyRows(); recvCount: numLocalExperts().
  [[nodiscard]] size_t lowLatencyRows() const { return static_cast<size_t>(locals_) * static_cast<size_t>(nranks_) * ll_max_; }
  Status lowLatencyDispatch(std::span<const std::type_identity_t<I>> topkIdx, std::span<const std::type_identity_t<T>> x,
                            std::span<const float> topkWeights, std::span<T> recvX, std::span<float> recvWeights,
                            std::span<size_t> recvCount, StreamRef s = {}) {
    const auto k = static_cast<size_t>(topk_);
    if (topkIdx.size() % k != 0)
      return Status(Code::InvalidArgument, "chorus::ExpertParallel::lowLatencyDispatch: topkIdx.size()=" +
                                               std::to_string(topkIdx.size()) + " is not a multiple of topk=" + std::to_string(topk_));
    const size_t tokens = topkIdx.size() / k;
    if (x.size() != tokens * hidden_) return sizeError("lowLatencyDispatch", "x", x.size(), tokens * hidden_);
    if (!topkWeights.empty() && topkWeights.size() != tokens * k)
      return sizeError("lowLatencyDispatch", "topkWeights", topkWeights.size(), tokens * k);
    if (recvX.size() != lowLatencyRows() * hidden_)
      return sizeError("lowLatencyDispatch", "recvX", recvX.size(), lowLatencyRows() * hidden_);
    if (!recvWeights.empty() && recvWeights.size() != lowLatencyRows())
      return sizeError("lowLatencyDispatch", "recvWeights", recvWeights.size(), lowLatencyRows());
    if (recvCount.size() != static_cast<size_t>(locals_))
      return sizeError("lowLatencyDispatch", "recvCount", recvCount.size(), static_cast<size_t>(locals_));
    chorusResult_t r = chorusEpLowLatencyDispatch(h_, topkIdx.data(), tokens, x.data(),
                                                  topkWeights.empty() ? nullptr : topkWeights.data(), recvX.data(),
                                                  recvWeights.empty() ? nullptr : recvWeights.data(), recvCount.data(),
                                                  comm_, s.native());
    ll_tokens_ = r == chorusSuccess ? tokens : 0;
    return Status::fromC(r);
  }
  // Undoes the last lowLatencyDispatch: expertOut and weights (may be empty)
  // in recvX's layout; out: that dispatch's tokens x hidden.
  Status lowLatencyCombine(std::span<const std::type_identity_t<T>> expertOut, std::span<const float> weights,
                           std::span<T> out, StreamRef s = {}) {
    if (expertOut.size() != lowLatencyRows() * hidden_)
      return sizeError("lowLatencyCombine", "expertOut", expertOut.size(), lowLatencyRows() * hidden_);
    if (!weights.empty() && weights.size() != lowLatencyRows())
      return sizeError("lowLatencyCombine", "weights", weights.size(), lowLatencyRows());
    if (out.size() != ll_tokens_ * hidden_) return sizeError("lowLatencyCombine", "out", out.size(), ll_tokens_ * hidden_);
    return Status::fromC(chorusEpLowLatencyCombine(h_, expertOut.data(), weights.empty() ? nullptr : weights.data(),
                                                   out.data(), comm_, s.native()));
  }

 private:
  ExpertParallel(chorusEpHandle_t h, chorusComm_t c, int nranks, int topk, size_t hidden, int hosts, int locals, int experts)
      : h_(h), comm_(c), nranks_(nranks), topk_(topk), hidden_(hidden), hosts_(hosts), locals_(locals), experts_(experts) {}
  void reset() {
    if (h_ != nullptr) (void)chorusEpDestroy(h_);
    h_ = nullptr;
  }
  static Status sizeError(const char* fn, const char* what, size_t got, size_t want) {
    return Status(Code::InvalidArgument, std::string("chorus::ExpertParallel::") + fn + ": " + what + ".size()=" +
                                             std::to_string(got) + " but the layout needs " + std::to_string(want));
  }

  chorusEpHandle_t h_ = nullptr;
  chorusComm_t comm_ = nullptr;
  int nranks_ = 0, topk_ = 1;
  size_t hidden_ = 1;
  int hosts_ = 1, locals_ = 0, experts_ = 0;
  size_t tokens_ = 0, recv_ = 0;
  size_t ll_max_ = 0, ll_tokens_ = 0;  // low-latency mode: M, and the last dispatch's tokens
};

}  // namespace cpp_v0
}  // namespace chorus
