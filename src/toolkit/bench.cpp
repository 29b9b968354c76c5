#include "toolkit/bench.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstring>

#include "kernels/dtype.hpp"

namespace chorus::tools::bench {
namespace {

// The collectives chorus-bench runs: every kind of plan::kCollectiveFacts but
// the v-variants (nccl-tests has none: their counts are not one size), and
// sendrecv.
constexpr std::array<Collective, 10> kAll = {
    Collective::AllReduce, Collective::Broadcast, Collective::Reduce,   Collective::AllGather, Collective::ReduceScatter,
    Collective::AllToAll,  Collective::Gather,    Collective::Scatter, Collective::SendRecv,  Collective::Barrier,
};

constexpr std::array<std::string_view, chorusNumOps> kOpNames = {"sum", "prod", "max", "min", "avg"};

bool isSignedInt(chorusDataType_t d) { return d == chorusInt8 || d == chorusInt32 || d == chorusInt64; }
bool isInt(chorusDataType_t d) { return !kernels::isFloatType(d); }

// Largest code range whose values the type stores exactly (a prime, so
// hash % range spreads well): used when no arithmetic happens on the values.
uint32_t exactRange(chorusDataType_t d) {
  switch (d) {
    case chorusInt8: return 127;
    case chorusUint8: return 251;
    case chorusBfloat16: return 251;
    case chorusFloat8e4m3: return 17;
    case chorusFloat8e5m2: return 7;
    default: return 1021;
  }
}

// Code range for sums: small enough that sums over many ranks stay exact (or
// nearly) in the narrow float types.  Integers wrap exactly, so any range works.
uint32_t sumRange(chorusDataType_t d) {
  switch (d) {
    case chorusFloat16: return 13;
    case chorusBfloat16: return 5;
    case chorusFloat8e4m3:
    case chorusFloat8e5m2: return 3;
    default: return exactRange(d);
  }
}

// Unit roundoff-ish precision of the type (2^-mantissa bits).
double precision(chorusDataType_t d) {
  switch (d) {
    case chorusFloat64: return 0x1p-52;
    case chorusFloat32: return 0x1p-23;
    case chorusFloat16: return 0x1p-10;
    case chorusBfloat16: return 0x1p-7;
    case chorusFloat8e4m3: return 0x1p-3;
    case chorusFloat8e5m2: return 0x1p-2;
    default: return 0;
  }
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// Integer arithmetic in the type's width, as the kernels wrap.
uint64_t wrapBits(uint64_t v, chorusDataType_t d) {
  size_t bits = 8 * kernels::dtypeSize(d);
  return bits >= 64 ? v : v & ((uint64_t{1} << bits) - 1);
}
int64_t signExtend(uint64_t v, chorusDataType_t d) {
  size_t bits = 8 * kernels::dtypeSize(d);
  if (bits >= 64) return static_cast<int64_t>(v);
  uint64_t sign = uint64_t{1} << (bits - 1);
  return static_cast<int64_t>((v ^ sign) - sign);
}
double intAsDouble(uint64_t wrapped, chorusDataType_t d) {
  return isSignedInt(d) ? static_cast<double>(signExtend(wrapped, d)) : static_cast<double>(wrapped);
}

}  // namespace

// sendrecv as nccl-tests counts it: one buffer in and one out of `count`
// elements, algbw = busbw (each rank's link carries the message once).
constexpr plan::CollectiveFacts kSendRecvFacts = {"sendrecv", false, false, false, false,
                                                  false,      false, false, plan::BusBw::One};

std::optional<plan::Collective> planCollective(Collective c) {
  switch (c) {
    case Collective::AllReduce: return plan::Collective::AllReduce;
    case Collective::Broadcast: return plan::Collective::Broadcast;
    case Collective::Reduce: return plan::Collective::Reduce;
    case Collective::AllGather: return plan::Collective::AllGather;
    case Collective::ReduceScatter: return plan::Collective::ReduceScatter;
    case Collective::AllToAll: return plan::Collective::AllToAll;
    case Collective::Gather: return plan::Collective::Gather;
    case Collective::Scatter: return plan::Collective::Scatter;
    case Collective::Barrier: return plan::Collective::Barrier;
    case Collective::SendRecv: break;
  }
  return std::nullopt;
}
const plan::CollectiveFacts& facts(Collective c) {
  const std::optional<plan::Collective> pc = planCollective(c);
  return pc ? plan::facts(*pc) : kSendRecvFacts;
}
std::string_view collectiveName(Collective c) { return facts(c).name; }
double busBwFactor(Collective c, int64_t nranks) {
  const std::optional<plan::Collective> pc = planCollective(c);
  return pc ? plan::busBwFactor(*pc, nranks) : 1;
}

std::span<const Collective> allCollectives() { return kAll; }
bool takesOp(Collective c) { return facts(c).reduces; }
bool takesRoot(Collective c) { return facts(c).rooted; }
bool hasInPlace(Collective c) { return facts(c).in_place; }

Result<Collective> parseCollective(std::string_view name) {
  for (Collective c : kAll)
    if (collectiveName(c) == name) return c;
  std::string names;
  for (Collective c : kAll) names += fmt::format("{}{}", names.empty() ? "" : "|", collectiveName(c));
  return invalidArgument("unknown collective '{}' (expected one of {})", name, names);
}

std::string_view opName(chorusRedOp_t op) {
  auto i = static_cast<size_t>(op);
  return i < kOpNames.size() ? kOpNames[i] : std::string_view("premulsum");
}

Result<chorusRedOp_t> parseOp(std::string_view name) {
  for (size_t i = 0; i < kOpNames.size(); ++i)
    if (kOpNames[i] == name) return static_cast<chorusRedOp_t>(i);
  return invalidArgument("unknown reduction op '{}' (expected sum, prod, max, min or avg)", name);
}

Result<std::vector<uint64_t>> sizeSweep(const SweepOptions& o) {
  if (o.min_bytes > o.max_bytes)
    return invalidArgument("minimum size {} B (-b) is larger than the maximum {} B (-e)", o.min_bytes, o.max_bytes);
  const bool multiply = o.step_factor > 1;
  if (!multiply && o.step_bytes == 0 && o.min_bytes != o.max_bytes)
    return invalidArgument("the sweep never grows: give -f > 1 or -i > 0");
  if (multiply && o.min_bytes == 0)
    return invalidArgument("-b 0 with -f {} never grows: start at 1 byte or more", o.step_factor);
  std::vector<uint64_t> sizes;
  for (uint64_t s = o.min_bytes; s <= o.max_bytes;) {
    sizes.push_back(s);
    uint64_t next = multiply ? static_cast<uint64_t>(static_cast<double>(s) * o.step_factor) : s + o.step_bytes;
    if (next <= s) break;  // a factor too close to 1 for integers, or overflow
    s = next;
  }
  return sizes;
}

Shape shapeFor(Collective c, uint64_t bytes, size_t elem_size, int nranks) {
  const plan::CollectiveFacts& f = facts(c);
  if (f.busbw == plan::BusBw::Zero || f.variable) return {};  // barrier (no data); the v-variants are not benched
  const size_t count = static_cast<size_t>(bytes / elem_size);
  const size_t n = static_cast<size_t>(nranks);
  const size_t align = 16 / elem_size;  // per-rank blocks are whole 16-byte units
  // The call's count: the whole vector, or the per-rank block (nccl-tests'
  // getCollByteCount) of the gather, scatter and all-to-all types.
  const size_t c0 = f.alg_per_rank ? (count / n) & ~(align - 1) : count;
  Shape s{0, c0, f.input_per_rank ? c0 * n : c0, f.output_per_rank ? c0 * n : c0};
  s.bytes = std::max(s.send_count, s.recv_count) * elem_size;
  return s;
}

uint64_t algBytes(Collective c, const Shape& s, size_t elem_size, int nranks) {
  const plan::CollectiveFacts& f = facts(c);
  if (f.busbw == plan::BusBw::Zero) return 0;
  return s.count * elem_size * (f.alg_per_rank ? static_cast<uint64_t>(nranks) : 1);
}

Bandwidth bandwidth(Collective c, const Shape& s, size_t elem_size, int nranks, double seconds) {
  if (seconds <= 0) return {};
  double alg = static_cast<double>(algBytes(c, s, elem_size, nranks)) / 1e9 / seconds;
  return {alg, alg * busBwFactor(c, nranks)};
}

Pattern::Pattern(chorusDataType_t dtype, std::optional<chorusRedOp_t> op, int nranks)
    : dtype_(dtype), op_(op), nranks_(nranks) {
  if (!op) {
    range_ = exactRange(dtype);
  } else if (*op == chorusProd) {
    range_ = 3;  // codes 1 and 2
  } else if (*op == chorusMax || *op == chorusMin) {
    range_ = exactRange(dtype);
  } else if (*op == chorusAvg && isInt(dtype)) {
    range_ = 5;  // keep the sum from wrapping before the division
  } else {
    range_ = sumRange(dtype);
  }
  value_.resize(range_);
  for (uint32_t c = 0; c < range_; ++c) {
    alignas(8) unsigned char buf[8] = {};
    kernels::storeFromDouble(buf, dtype, c);
    value_[c] = kernels::loadAsDouble(buf, dtype);
  }
}

uint32_t Pattern::code(int rank, uint64_t index) const {
  if (op_ == chorusProd) {
    // At most ceil(n/8) factors of 2 per element, so products stay small.
    return (static_cast<uint64_t>(rank) + index * 3 + index / 8) % 8 == 0 ? 2 : 1;
  }
  uint64_t h = mix(index * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(rank + 1) * 0xc2b2ae3d27d4eb4full);
  return static_cast<uint32_t>(h % range_);
}

double Pattern::input(int rank, uint64_t index) const { return value_[code(rank, index)]; }

double Pattern::reduced(uint64_t index) const {
  const chorusRedOp_t op = op_.value_or(chorusSum);
  if (op == chorusMax || op == chorusMin) {
    double acc = input(0, index);
    for (int r = 1; r < nranks_; ++r)
      acc = op == chorusMax ? std::max(acc, input(r, index)) : std::min(acc, input(r, index));
    return acc;
  }
  if (isInt(dtype_)) {
    uint64_t acc = op == chorusProd ? 1 : 0;
    for (int r = 0; r < nranks_; ++r) {
      auto v = static_cast<uint64_t>(static_cast<int64_t>(input(r, index)));
      acc = wrapBits(op == chorusProd ? acc * v : acc + v, dtype_);
    }
    if (op != chorusAvg) return intAsDouble(acc, dtype_);
    if (isSignedInt(dtype_)) return static_cast<double>(signExtend(acc, dtype_) / nranks_);  // C truncation
    return static_cast<double>(acc / static_cast<uint64_t>(nranks_));
  }
  double acc = op == chorusProd ? 1 : 0;
  for (int r = 0; r < nranks_; ++r) acc = op == chorusProd ? acc * input(r, index) : acc + input(r, index);
  return op == chorusAvg ? acc / nranks_ : acc;
}

void Pattern::fill(void* buf, int rank, size_t count) const {
  auto* p = static_cast<unsigned char*>(buf);
  const size_t elem = kernels::dtypeSize(dtype_);
  // Store each code's bytes once, then copy: filling hundreds of MB through
  // storeFromDouble per element would dominate a check run.
  std::vector<std::array<unsigned char, 8>> bytes(range_);
  for (uint32_t c = 0; c < range_; ++c) kernels::storeFromDouble(bytes[c].data(), dtype_, value_[c]);
  for (size_t i = 0; i < count; ++i) std::memcpy(p + i * elem, bytes[code(rank, i)].data(), elem);
}

bool Pattern::matches(double got, double expected) const {
  const bool arithmetic = op_ && *op_ != chorusMax && *op_ != chorusMin;
  if (!arithmetic || isInt(dtype_)) return got == expected;
  // Each of the n-1 combining steps and the final division (avg) rounds once.
  double tol = precision(dtype_) * (nranks_ + 2) * std::max(1.0, std::fabs(expected));
  return std::fabs(got - expected) <= tol;
}

size_t outputCount(Collective c, const Shape& s) {
  // The receive buffer holds the per-rank block n times, or the whole vector.
  return facts(c).output_per_rank ? s.recv_count : s.count;
}

std::optional<double> expectedOutput(Collective c, const Pattern& p, const Shape& s, int root, int rank, size_t k) {
  const int n = p.nranks();
  const uint64_t count = s.count;
  const uint64_t r = static_cast<uint64_t>(rank);
  switch (c) {
    case Collective::AllReduce: return p.reduced(k);
    case Collective::Broadcast: return p.input(root, k);
    case Collective::Reduce:
      if (rank != root) return std::nullopt;
      return p.reduced(k);
    case Collective::AllGather: return p.input(static_cast<int>(k / count), k % count);
    case Collective::ReduceScatter: return p.reduced(r * count + k);
    case Collective::AllToAll: return p.input(static_cast<int>(k / count), r * count + k % count);
    case Collective::Gather:
      if (rank != root) return std::nullopt;
      return p.input(static_cast<int>(k / count), k % count);
    case Collective::Scatter: return p.input(root, r * count + k);
    case Collective::SendRecv: return p.input((rank + n - 1) % n, k);
    case Collective::Barrier: return std::nullopt;
  }
  return std::nullopt;
}

size_t countWrong(Collective c, const Pattern& p, const Shape& s, int root, int rank, const void* out) {
  if ((c == Collective::Reduce || c == Collective::Gather) && rank != root) return 0;
  const auto* bytes = static_cast<const unsigned char*>(out);
  const size_t elem = kernels::dtypeSize(p.dtype());
  size_t wrong = 0;
  const size_t n = outputCount(c, s);
  for (size_t k = 0; k < n; ++k) {
    std::optional<double> want = expectedOutput(c, p, s, root, rank, k);
    if (!want) continue;
    if (!p.matches(kernels::loadAsDouble(bytes + k * elem, p.dtype()), *want)) ++wrong;
  }
  return wrong;
}

std::string algoFor(std::string_view chorus_algo, Collective c) {
  auto trim = [](std::string_view s) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
    return s;
  };
  while (!chorus_algo.empty()) {
    size_t end = chorus_algo.find(';');
    std::string_view entry = chorus_algo.substr(0, end);
    chorus_algo = end == std::string_view::npos ? std::string_view() : chorus_algo.substr(end + 1);
    size_t colon = entry.find(':');
    if (colon == std::string_view::npos) continue;
    if (trim(entry.substr(0, colon)) == collectiveName(c)) return std::string(trim(entry.substr(colon + 1)));
  }
  return "auto";
}

std::string withAlgo(std::string_view chorus_algo, Collective c, std::string_view algo) {
  std::string out;
  while (!chorus_algo.empty()) {
    size_t end = chorus_algo.find(';');
    std::string_view entry = chorus_algo.substr(0, end);
    chorus_algo = end == std::string_view::npos ? std::string_view() : chorus_algo.substr(end + 1);
    if (entry.empty() || algoFor(entry, c) != "auto") continue;  // empty, or the entry being replaced
    out.append(entry).push_back(';');
  }
  return fmt::format("{}{}:{}", out, collectiveName(c), algo);
}

std::string formatTime(double us) {
  if (us >= 10000.0) return fmt::format("{:7.0f}", us);
  if (us >= 100.0) return fmt::format("{:7.1f}", us);
  return fmt::format("{:7.2f}", us);
}

std::string formatHeader() {
  std::string h = "#\n";
  h += fmt::format("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place\n",
                   "", "", "", "", "");
  h += fmt::format("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}", "size", "count", "type", "redop", "root");
  for (int i = 0; i < 2; ++i) h += fmt::format("  {:>7}  {:>6}  {:>6} {:>6}", "time", "algbw", "busbw", "#wrong");
  h += fmt::format("  {:>18}  {:>8}", "algo", "predict");
  h += "\n";
  h += fmt::format("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}", "(B)", "(elements)", "", "", "");
  for (int i = 0; i < 2; ++i) h += fmt::format("  {:>7}  {:>6}  {:>6}  {:>5}", "(us)", "(GB/s)", "(GB/s)", "");
  h += fmt::format("  {:>18}  {:>8}", "(out-of-place)", "(us)");
  h += "\n";
  return h;
}

std::string formatRow(const Row& r) {
  auto block = [](const std::optional<Measurement>& m) {
    if (!m) return fmt::format("  {:>7}  {:>6}  {:>6}  {:>5}", "N/A", "N/A", "N/A", "N/A");
    std::string wrong = m->wrong ? std::to_string(*m->wrong) : "N/A";
    return fmt::format("  {}  {:6.2f}  {:6.2f}  {:>5}", formatTime(m->time_us), m->bw.algbw_gbps, m->bw.busbw_gbps,
                       wrong);
  };
  std::string s = fmt::format("{:>12}  {:>12}  {:>8}  {:>6}  {:>6}", r.shape.bytes, r.shape.count,
                              kernels::dtypeName(r.dtype), r.op ? opName(*r.op) : "none", r.root.value_or(-1));
  s += block(r.out_of_place);
  s += block(r.in_place);
  const Measurement& m = r.out_of_place;
  s += fmt::format("  {:>18}  {:>8}", m.algo.empty() ? "-" : m.algo,
                   m.predicted_us ? formatTime(*m.predicted_us) : std::string("-"));
  s += "\n";
  return s;
}

std::string formatFooter(uint64_t wrong_total, double avg_busbw_gbps) {
  return fmt::format("# {:<20} : {} {}\n# {:<20} : {:g}\n#\n", "Out of bounds values", wrong_total,
                     wrong_total ? "FAILED" : "OK", "Avg bus bandwidth", avg_busbw_gbps);
}

nlohmann::json rowJson(const Row& r, bool in_place, int nranks, std::string_view algo) {
  const Measurement& m = in_place ? *r.in_place : r.out_of_place;
  nlohmann::json j;
  j["collective"] = collectiveName(r.collective);
  j["bytes"] = r.shape.bytes;
  j["count"] = r.shape.count;
  j["dtype"] = kernels::dtypeName(r.dtype);
  j["op"] = r.op ? opName(*r.op) : "none";
  j["root"] = r.root.value_or(-1);
  j["nranks"] = nranks;
  j["algo"] = m.algo.empty() ? std::string(algo) : m.algo;
  j["inplace"] = in_place;
  j["time_us"] = m.time_us;
  j["algbw_gbps"] = m.bw.algbw_gbps;
  j["busbw_gbps"] = m.bw.busbw_gbps;
  j["wrong"] = m.wrong ? nlohmann::json(*m.wrong) : nlohmann::json(nullptr);
  j["predicted_us"] = m.predicted_us ? nlohmann::json(*m.predicted_us) : nlohmann::json(nullptr);
  return j;
}

}  // namespace chorus::tools::bench
