#include "trace/record.hpp"

#include "plan/plan.hpp"

#include <sys/stat.h>
#include <time.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

namespace chorus::trace {
namespace {

constexpr size_t kOpPayload = 8 + 1 + 1 + 2 + 1 + 4 + 8 + 8 + 8 * 4;
constexpr size_t kStepPayload = 8 + 1 + 4 + 8 + 8 + 8;
constexpr size_t kClockPayload = 8 * 4;
constexpr size_t kMaxAlgoName = 64;
constexpr size_t kMaxHost = 64;
constexpr int32_t kMaxRanks = 1 << 22;  // a reader allocates per rank: bound what a file can claim
// Times and offsets lie within +-2^60 ns (36 years), so a reader's sums and
// differences of a few of them cannot overflow int64.
constexpr int64_t kMaxTime = int64_t{1} << 60;
bool timeOk(int64_t t) { return t >= -kMaxTime && t <= kMaxTime; }

// Version 1 counted send/recv as collective 10 ("sendrecv", the algorithm's
// name saying which side) and barrier as 11.
uint8_t versionOneKind(uint8_t coll, std::string_view algo) {
  if (coll == 10) return algo == "send" ? kOpSend : kOpRecv;
  if (coll == 11) return static_cast<uint8_t>(plan::Collective::Barrier);
  return coll;
}

void put(std::vector<std::byte>& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<std::byte>(v >> (8 * i)));
}
void putRecordHead(std::vector<std::byte>& out, Kind k, size_t len) {
  out.push_back(static_cast<std::byte>(k));
  out.push_back(std::byte{0});
  put(out, len, 2);
}

// A cursor over untrusted bytes: every read checks the bounds first.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> b) : b_(b) {}
  [[nodiscard]] size_t left() const { return b_.size() - off_; }
  [[nodiscard]] size_t offset() const { return off_; }
  uint64_t u(int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = v << 8 | std::to_integer<uint64_t>(b_[off_ + i]);
    off_ += n;
    return v;
  }
  int64_t i64() { return static_cast<int64_t>(u(8)); }
  int32_t i32() { return static_cast<int32_t>(static_cast<uint32_t>(u(4))); }
  std::string str(size_t n) {
    std::string s(reinterpret_cast<const char*>(b_.data() + off_), n);
    off_ += n;
    return s;
  }

 private:
  std::span<const std::byte> b_;
  size_t off_ = 0;
};

}  // namespace

uint64_t algBytes(uint8_t coll, uint64_t count, size_t elem_size, int nranks, std::span<const size_t> vcounts) {
  if (isPointToPoint(coll)) return count * elem_size;
  if (coll >= plan::kNumCollectives) return 0;  // from a trace file: no kind this reader knows
  const plan::CollectiveFacts& f = plan::facts(static_cast<plan::Collective>(coll));
  if (f.busbw == plan::BusBw::Zero) return 0;
  if (f.variable) {
    uint64_t sum = 0;
    for (size_t c : vcounts) sum += c;
    return sum * elem_size;
  }
  return count * elem_size * (f.alg_per_rank ? static_cast<uint64_t>(nranks) : 1);
}

double busBwFactor(uint8_t coll, int nranks) {
  // `coll` comes from a trace file: a value outside the enum has no factor.
  if (isPointToPoint(coll)) return 1;
  return coll < plan::kNumCollectives ? plan::busBwFactor(static_cast<plan::Collective>(coll), nranks) : 0;
}

Result<std::unique_ptr<Recorder>> Recorder::open(const std::string& dir, const Header& h) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    return makeError(chorusSystemError, "CHORUS_TRACE: cannot create directory '{}': {}", dir, std::strerror(errno));
  std::unique_ptr<Recorder> r(new Recorder());
  r->path_ = fmt::format("{}/chorus-{:016x}-rank{}.trace", dir, h.comm_id, h.rank);
  r->f_ = std::fopen(r->path_.c_str(), "wb");
  if (r->f_ == nullptr)
    return makeError(chorusSystemError, "CHORUS_TRACE: cannot create '{}': {}", r->path_, std::strerror(errno));
  r->buf_.reserve(kFlushBytes + 4096);
  auto& out = r->buf_;
  out.insert(out.end(), reinterpret_cast<const std::byte*>(kMagic), reinterpret_cast<const std::byte*>(kMagic) + 8);
  put(out, h.version, 4);
  put(out, static_cast<uint32_t>(h.rank), 4);
  put(out, static_cast<uint32_t>(h.nranks), 4);
  put(out, static_cast<uint32_t>(h.pid), 4);
  put(out, h.comm_id, 8);
  put(out, static_cast<uint64_t>(h.open_ns), 8);
  put(out, static_cast<uint64_t>(h.open_unix_ns), 8);
  const std::string host = h.host.substr(0, kMaxHost);
  out.push_back(static_cast<std::byte>(host.size()));
  for (char c : host) out.push_back(static_cast<std::byte>(c));
  r->algos_.emplace("", 0);
  r->flush();  // the header reaches the file even if the process dies early
  return r;
}

Recorder::~Recorder() {
  flush();
  if (f_) std::fclose(f_);
}

uint16_t Recorder::algoId(std::string_view name) {
  if (name.size() > kMaxAlgoName) name = name.substr(0, kMaxAlgoName);
  auto it = algos_.find(std::string(name));
  if (it != algos_.end()) return it->second;
  const auto id = static_cast<uint16_t>(algos_.size());
  algos_.emplace(std::string(name), id);
  putRecordHead(buf_, Kind::Algo, 2 + name.size());
  put(buf_, id, 2);
  for (char c : name) buf_.push_back(static_cast<std::byte>(c));
  return id;
}

void Recorder::op(const OpRecord& r) {
  putRecordHead(buf_, Kind::Op, kOpPayload);
  put(buf_, r.seq, 8);
  buf_.push_back(static_cast<std::byte>(r.coll));
  buf_.push_back(static_cast<std::byte>(r.dtype));
  put(buf_, r.algo, 2);
  buf_.push_back(static_cast<std::byte>(r.ok));
  put(buf_, static_cast<uint32_t>(isPointToPoint(r.coll) ? r.peer : r.root), 4);
  put(buf_, r.count, 8);
  put(buf_, r.bytes, 8);
  put(buf_, static_cast<uint64_t>(r.enqueue_ns), 8);
  put(buf_, static_cast<uint64_t>(r.start_ns), 8);
  put(buf_, static_cast<uint64_t>(r.end_ns), 8);
  put(buf_, static_cast<uint64_t>(r.predicted_ns), 8);
  maybeFlush();
}

void Recorder::step(const StepRecord& r) {
  putRecordHead(buf_, Kind::Step, kStepPayload);
  put(buf_, r.seq, 8);
  buf_.push_back(static_cast<std::byte>(r.kind));
  put(buf_, static_cast<uint32_t>(r.peer), 4);
  put(buf_, r.bytes, 8);
  put(buf_, static_cast<uint64_t>(r.start_ns), 8);
  put(buf_, static_cast<uint64_t>(r.end_ns), 8);
  maybeFlush();
}

void Recorder::clock(const ClockRecord& r) {
  std::lock_guard l(clock_mu_);
  clock_pending_.push_back(r);
}

void Recorder::flush() {
  // Clock records go out in their own small write: the watchdog thread adds
  // them while the executing thread fills buf_.
  std::vector<ClockRecord> clocks;
  {
    std::lock_guard l(clock_mu_);
    clocks.swap(clock_pending_);
  }
  std::lock_guard fl(file_mu_);
  if (f_ == nullptr) return;
  if (!buf_.empty()) {
    std::fwrite(buf_.data(), 1, buf_.size(), f_);
    buf_.clear();
  }
  if (!clocks.empty()) {
    std::vector<std::byte> c;
    for (const ClockRecord& r : clocks) {
      putRecordHead(c, Kind::Clock, kClockPayload);
      put(c, static_cast<uint64_t>(r.local_ns), 8);
      put(c, static_cast<uint64_t>(r.offset_ns), 8);
      put(c, static_cast<uint64_t>(r.rtt_ns), 8);
      put(c, static_cast<uint64_t>(r.bound_ns), 8);
    }
    std::fwrite(c.data(), 1, c.size(), f_);
  }
  std::fflush(f_);
}

Result<TraceFile> parseTrace(std::span<const std::byte> bytes) {
  TraceFile t;
  Reader r(bytes);
  constexpr size_t kFixed = 8 + 4 * 4 + 8 * 3 + 1;
  if (r.left() < kFixed || std::memcmp(bytes.data(), kMagic, 8) != 0)
    return invalidArgument("not a chorus trace (bad magic or a header shorter than {} bytes)", kFixed);
  (void)r.str(8);
  t.header.version = static_cast<uint32_t>(r.u(4));
  if (t.header.version != kVersion && t.header.version != 1)
    return invalidArgument("trace version {} is not supported (this reader knows versions 1 and {})", t.header.version,
                           kVersion);
  t.header.rank = r.i32();
  t.header.nranks = r.i32();
  t.header.pid = r.i32();
  t.header.comm_id = r.u(8);
  t.header.open_ns = r.i64();
  t.header.open_unix_ns = r.i64();
  const size_t hostlen = r.u(1);
  if (hostlen > kMaxHost || r.left() < hostlen) return invalidArgument("trace header: host name of {} bytes", hostlen);
  t.header.host = r.str(hostlen);
  if (t.header.nranks < 1 || t.header.nranks > kMaxRanks || t.header.rank < 0 || t.header.rank >= t.header.nranks)
    return invalidArgument("trace header: rank {} of {} ranks", t.header.rank, t.header.nranks);
  t.algos.push_back("");
  while (r.left() > 0) {
    if (r.left() < 4) {
      t.truncated = true;
      break;
    }
    const size_t at = r.offset();
    const auto kind = static_cast<Kind>(r.u(1));
    (void)r.u(1);
    const size_t len = r.u(2);
    if (r.left() < len) {
      t.truncated = true;
      break;
    }
    auto bad = [&](size_t want) {
      return invalidArgument("trace record at offset {}: kind {} with {} payload bytes (expected {})", at,
                             static_cast<int>(kind), len, want);
    };
    switch (kind) {
      case Kind::Algo: {
        if (len < 3 || len > 2 + kMaxAlgoName) return bad(2 + kMaxAlgoName);
        const auto id = static_cast<uint16_t>(r.u(2));
        if (id != t.algos.size())
          return invalidArgument("trace record at offset {}: algorithm id {} out of order (next is {})", at, id,
                                 t.algos.size());
        t.algos.push_back(r.str(len - 2));
        break;
      }
      case Kind::Op: {
        if (len != kOpPayload) return bad(kOpPayload);
        OpRecord o;
        o.seq = r.u(8);
        o.coll = static_cast<uint8_t>(r.u(1));
        o.dtype = static_cast<uint8_t>(r.u(1));
        o.algo = static_cast<uint16_t>(r.u(2));
        o.ok = static_cast<uint8_t>(r.u(1));
        const int32_t root_or_peer = r.i32();
        o.count = r.u(8);
        o.bytes = r.u(8);
        o.enqueue_ns = r.i64();
        o.start_ns = r.i64();
        o.end_ns = r.i64();
        o.predicted_ns = r.i64();
        if (!timeOk(o.enqueue_ns) || !timeOk(o.start_ns) || !timeOk(o.end_ns) || !timeOk(o.predicted_ns))
          return invalidArgument("trace record at offset {}: a time outside +-2^60 ns", at);
        if (o.algo >= t.algos.size())
          return invalidArgument("trace record at offset {}: op names algorithm {} before it was defined", at, o.algo);
        if (t.header.version == 1) o.coll = versionOneKind(o.coll, t.algos[o.algo]);
        (isPointToPoint(o.coll) ? o.peer : o.root) = root_or_peer;
        t.ops.push_back(o);
        break;
      }
      case Kind::Step: {
        if (len != kStepPayload) return bad(kStepPayload);
        StepRecord s;
        s.seq = r.u(8);
        s.kind = static_cast<uint8_t>(r.u(1));
        s.peer = r.i32();
        s.bytes = r.u(8);
        s.start_ns = r.i64();
        s.end_ns = r.i64();
        if (!timeOk(s.start_ns) || !timeOk(s.end_ns))
          return invalidArgument("trace record at offset {}: a time outside +-2^60 ns", at);
        if (s.kind > static_cast<uint8_t>(StepKind::EncodeAdd))
          return invalidArgument("trace record at offset {}: step kind {}", at, s.kind);
        if (s.kind <= static_cast<uint8_t>(StepKind::RecvReduce) && (s.peer < 0 || s.peer >= t.header.nranks))
          return invalidArgument("trace record at offset {}: peer {} of {} ranks", at, s.peer, t.header.nranks);
        t.steps.push_back(s);
        break;
      }
      case Kind::Clock: {
        if (len != kClockPayload) return bad(kClockPayload);
        ClockRecord c;
        c.local_ns = r.i64();
        c.offset_ns = r.i64();
        c.rtt_ns = r.i64();
        c.bound_ns = r.i64();
        if (!timeOk(c.local_ns) || !timeOk(c.offset_ns) || !timeOk(c.rtt_ns) || !timeOk(c.bound_ns))
          return invalidArgument("trace record at offset {}: a time outside +-2^60 ns", at);
        t.clocks.push_back(c);
        break;
      }
      default:
        (void)r.str(len);  // a kind from a later version: skip it
        break;
    }
  }
  return t;
}

Result<TraceFile> readTraceFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return makeError(chorusSystemError, "cannot open trace file '{}'", path);
  std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto t = parseTrace(std::as_bytes(std::span(data)));
  if (!t.isOk()) return t.status().withContext(fmt::format("{}: ", path));
  t->path = path;
  return t;
}

}  // namespace chorus::trace
