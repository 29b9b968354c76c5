// chorus-bench dispatch | combine (toolkit/bench_ep.hpp).
#include "toolkit/bench_ep.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>

#include "common/wire_format.hpp"
#include "kernels/dtype.hpp"
#include "plan/ep_route.hpp"

namespace chorus::tools::bench {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

uint64_t key(uint64_t seed, int rank, size_t t, uint64_t salt) {
  return mix(mix(seed * 0x9e3779b97f4a7c15ull + salt) ^ (static_cast<uint64_t>(rank) << 40) ^ t);
}

Status apiError(chorusComm_t comm, int rank, const std::string& what, chorusResult_t r) {
  return Status(r, fmt::format("chorus-bench: rank {}: {} failed: {}: {}", rank, what, chorusGetErrorString(r),
                               chorusGetLastError(comm)));
}
#define EP_CALL(what, expr)                                                        \
  do {                                                                             \
    if (chorusResult_t r_ = (expr); r_ != chorusSuccess) return apiError(comm_, rank_, what, r_); \
  } while (0)

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::byte[], FreeDeleter>;

// Page-aligned and touched, so that no timed call pays the first page faults.
Result<Buffer> allocate(size_t bytes) {
  constexpr size_t kAlign = 4096;
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kAlign, rounded));
  if (p == nullptr) return systemError("chorus-bench: cannot allocate {} bytes (lower --tokens or --hidden)", rounded);
  std::memset(p, 0, rounded);
  return Buffer(p);
}

float load(const std::byte* p, chorusDataType_t d) {
  if (d == chorusBfloat16) {
    uint16_t b;
    std::memcpy(&b, p, 2);
    return kernels::bf16ToFloat(b);
  }
  float f;
  std::memcpy(&f, p, 4);
  return f;
}
void store(std::byte* p, chorusDataType_t d, float v) {
  if (d == chorusBfloat16) {
    const uint16_t b = kernels::floatToBf16(v);
    std::memcpy(p, &b, 2);
  } else {
    std::memcpy(p, &v, 4);
  }
}

// A received row: which rank's token, which of its top-k choices.
struct Origin {
  int src;
  size_t t;
  int j;
};

}  // namespace

const char* epFormName(EpForm f) { return f == EpForm::Ep ? "ep" : "alltoallv"; }

void epRoute(uint64_t seed, int rank, size_t t, int experts, int topk, int nhosts, int max_hosts, int32_t* ids) {
  plan::ep::uniformRoute(seed, rank, t, experts, topk, nhosts, max_hosts, ids);
}

float epWeight(uint64_t seed, int rank, size_t t, int j) {
  return static_cast<float>(1 + key(seed, rank, t * 64 + static_cast<size_t>(j), 2) % 8) / 8.0f;
}

float epValue(uint64_t seed, int rank, size_t t, size_t i) {
  const uint64_t h = key(seed, rank, t * 0x100000000ull + i / 16, 3);
  return static_cast<float>(static_cast<int>((h >> ((i % 16) * 4)) & 15) - 8);
}

namespace {

class EpBench {
 public:
  EpBench(const EpBenchOptions& o, chorusComm_t comm, std::FILE* out)
      : o_(o), comm_(comm), book_(o.bookkeeping != nullptr ? o.bookkeeping : comm), out_(out) {}

  Status setUp() {
    EP_CALL("chorusCommCount", chorusCommCount(comm_, &n_));
    EP_CALL("chorusCommUserRank", chorusCommUserRank(comm_, &rank_));
    if (o_.iters < 1 || o_.warmup < 0 || o_.repeats < 1)
      return invalidArgument("chorus-bench: -n {} / -w {} / --repeats {}: need at least 1 iteration and 1 repeat",
                             o_.iters, o_.warmup, o_.repeats);
    if (o_.experts <= 0 || o_.experts % n_ != 0)
      return invalidArgument("chorus-bench: --experts {} must be a positive multiple of the {} ranks", o_.experts, n_);
    if (o_.topk < 1 || o_.topk > o_.experts)
      return invalidArgument("chorus-bench: --topk {} must be in 1..{}", o_.topk, o_.experts);
    if (o_.hidden == 0) return invalidArgument("chorus-bench: --hidden must be positive");
    L_ = o_.experts / n_;
    k_ = static_cast<size_t>(o_.topk);
    elem_ = o_.dtype == chorusBfloat16 ? 2 : 4;
    row_ = o_.hidden * elem_;
    chorusEpConfig_t cfg = CHORUS_EP_CONFIG_INITIALIZER;
    cfg.numExperts = o_.experts;
    cfg.topk = o_.topk;
    cfg.hidden = o_.hidden;
    cfg.datatype = o_.dtype;
    cfg.indexType = chorusInt32;
    cfg.maxHostsPerToken = o_.max_hosts;
    cfg.dispatchCompress = o_.compress;
    EP_CALL("chorusEpCreate", chorusEpCreate(&ep_, &cfg, comm_));
    int local = 0;
    EP_CALL("chorusEpGetInfo", chorusEpGetInfo(ep_, &nh_, &local));
    if (n_ % nh_ != 0)
      return invalidArgument("chorus-bench: the {} ranks are on {} hosts of unequal size; dispatch/combine's routing "
                             "needs equal hosts of consecutive ranks",
                             n_, nh_);
    if (o_.max_hosts > 0 && static_cast<int64_t>(o_.topk) > static_cast<int64_t>(std::min(o_.max_hosts, nh_)) * (o_.experts / nh_))
      return invalidArgument("chorus-bench: --topk {} experts do not fit on --max-hosts {} hosts of {} experts",
                             o_.topk, o_.max_hosts, o_.experts / nh_);
    // Every rank's routing (the reference needs its peers' too).
    ids_.assign(static_cast<size_t>(n_), std::vector<int32_t>(o_.tokens * k_));
    for (int r = 0; r < n_; ++r)
      for (size_t t = 0; t < o_.tokens; ++t)
        epRoute(o_.seed, r, t, o_.experts, o_.topk, nh_, o_.max_hosts, &ids_[static_cast<size_t>(r)][t * k_]);
    // This rank's tokens and weights.
    CHORUS_ASSIGN_OR_RETURN(x_, allocate(o_.tokens * row_));
    CHORUS_ASSIGN_OR_RETURN(out_buf_, allocate(o_.tokens * row_));
    for (size_t t = 0; t < o_.tokens; ++t)
      for (size_t i = 0; i < o_.hidden; ++i) store(x_.get() + t * row_ + i * elem_, o_.dtype, epValue(o_.seed, rank_, t, i));
    w_.resize(o_.tokens * k_);
    for (size_t t = 0; t < o_.tokens; ++t)
      for (size_t j = 0; j < k_; ++j) w_[t * k_ + j] = epWeight(o_.seed, rank_, t, static_cast<int>(j));
    // What this rank's experts receive, in recvX's order: expert-major, then
    // source rank, then the source's token.
    for (int e = 0; e < L_; ++e)
      for (int src = 0; src < n_; ++src)
        for (size_t t = 0; t < o_.tokens; ++t)
          for (size_t j = 0; j < k_; ++j)
            if (ids_[static_cast<size_t>(src)][t * k_ + j] == rank_ * L_ + e) origin_.push_back({src, t, static_cast<int>(j)});
    CHORUS_ASSIGN_OR_RETURN(recv_x_, allocate(origin_.size() * row_));
    recv_w_.assign(origin_.size(), 0.0f);
    netBytes();
    if (rank_ == 0 && !o_.json_path.empty()) {
      json_.open(o_.json_path, std::ios::out | std::ios::trunc);
      if (!json_) return systemError("chorus-bench: cannot open --json file '{}' for writing", o_.json_path);
    }
    print(fmt::format("# chorus-bench {}  nranks {}  hosts {}  tokens {}  hidden {}  experts {}  topk {}  "
                      "max-hosts {}  type {}  warmup iters: {} iters: {} repeats: {} validation: {} average: {}\n",
                      o_.combine ? "combine" : "dispatch", n_, nh_, o_.tokens, o_.hidden, o_.experts, o_.topk,
                      o_.max_hosts, typeName(), o_.warmup, o_.iters, o_.repeats, o_.check ? 1 : 0, o_.average));
    print(fmt::format("#\n# {:>10}  {:>8}  {:>5}  {:>9}  {:>6}  {:>9}  {:>6}  {:>6}  {:>8}  {:>6}\n", "size", "count",
                      "type", "form", "repeat", "time", "algbw", "netbw", "net", "#wrong"));
    print(fmt::format("# {:>10}  {:>8}  {:>5}  {:>9}  {:>6}  {:>9}  {:>6}  {:>6}  {:>8}  {:>6}\n", "(B)", "(tokens)",
                      "", "", "", "(us)", "(GB/s)", "(GB/s)", "(MB)", ""));
    return {};
  }

  Status run() {
    std::vector<std::vector<double>> times(o_.forms.size());
    for (int rep = 0; rep < o_.repeats; ++rep) {
      // Paired: every form at each repeat, the order alternating so that
      // neither always runs first.
      for (size_t f = 0; f < o_.forms.size(); ++f) {
        const size_t which = rep % 2 == 0 ? f : o_.forms.size() - 1 - f;
        const EpForm form = o_.forms[which];
        if (form == EpForm::AllToAllV && o_.compress != CHORUS_COMPRESS_OFF) {
          if (rep == 0) print("# alltoallv: not measured with a compressed dispatch (it moves the datatype)\n");
          continue;
        }
        CHORUS_ASSIGN_OR_RETURN(const double s, measure(form, rep == 0 && o_.check, rep));
        times[which].push_back(s);
      }
    }
    if (o_.forms.size() == 2 && !times[0].empty() && times[0].size() == times[1].size()) {
      std::vector<double> ratio;
      for (size_t i = 0; i < times[0].size(); ++i) ratio.push_back(times[1][i] / times[0][i]);
      std::vector<double> sorted = ratio;
      std::sort(sorted.begin(), sorted.end());
      std::string list;
      for (double r : ratio) list += fmt::format(" {:.2f}", r);
      const size_t m = sorted.size();
      const double median = m % 2 == 1 ? sorted[m / 2] : (sorted[m / 2 - 1] + sorted[m / 2]) / 2;
      print(fmt::format("# {} time alltoallv / ep per repeat:{}  median {:.2f}\n", o_.combine ? "combine" : "dispatch",
                        list, median));
    }
    print(fmt::format("# Out of bounds values : {} {}\n#\n", wrong_total_, wrong_total_ == 0 ? "OK" : "FAILED"));
    return {};
  }

  uint64_t wrong() const { return wrong_total_; }
  ~EpBench() {
    if (ep_ != nullptr) (void)chorusEpDestroy(ep_);
  }

 private:
  const char* typeName() const {
    if (o_.compress == CHORUS_COMPRESS_FP8) return "fp8";
    return o_.dtype == chorusBfloat16 ? "bf16" : "float";
  }

  void print(const std::string& s) const {
    if (rank_ != 0) return;
    std::fputs(s.c_str(), out_);
    std::fflush(out_);
  }

  // The bytes that cross host boundaries, the busiest host's (out or in),
  // for each form: ep's wire rows (plan::ep::dispatchRowBytes; combine the
  // datatype's rows), alltoallv's rows and weights.  chorus-sim ep prices
  // the same from the library's routing code.
  void netBytes() {
    const int per = n_ / nh_;
    auto host = [&](int r) { return r / per; };
    const size_t payload = o_.compress == CHORUS_COMPRESS_FP8
                               ? wireBytes(WireFormat{WireFormat::Fp8E4m3, kFp8DefaultBlock}, o_.hidden)
                               : o_.compress == CHORUS_COMPRESS_BF16 ? 2 * o_.hidden : row_;
    const size_t wire_row = plan::ep::dispatchRowBytes(payload, k_);
    std::vector<double> ep_out(static_cast<size_t>(nh_)), ep_in(ep_out), a_out(ep_out), a_in(ep_out);
    for (int r = 0; r < n_; ++r)
      for (size_t t = 0; t < o_.tokens; ++t) {
        std::vector<int> dst_ranks, dst_hosts;
        for (size_t j = 0; j < k_; ++j) {
          const int q = ids_[static_cast<size_t>(r)][t * k_ + j] / L_;
          dst_ranks.push_back(q);
          dst_hosts.push_back(host(q));
          if (host(q) != host(r)) {
            a_out[static_cast<size_t>(host(r))] += 1;
            a_in[static_cast<size_t>(host(q))] += 1;
          }
        }
        std::vector<int>& copies = o_.max_hosts > 0 ? dst_hosts : dst_ranks;
        std::sort(copies.begin(), copies.end());
        copies.erase(std::unique(copies.begin(), copies.end()), copies.end());
        for (int c : copies) {
          const int h = o_.max_hosts > 0 ? c : host(c);
          if (h == host(r)) continue;
          ep_out[static_cast<size_t>(host(r))] += 1;
          ep_in[static_cast<size_t>(h)] += 1;
        }
      }
    const double ep_row = o_.combine ? static_cast<double>(row_) : static_cast<double>(wire_row);
    const double a2a_row = o_.combine ? static_cast<double>(row_) : static_cast<double>(row_ + sizeof(float));
    for (int h = 0; h < nh_; ++h) {
      net_ep_ = std::max(net_ep_, std::max(ep_out[static_cast<size_t>(h)], ep_in[static_cast<size_t>(h)]) * ep_row);
      net_a2a_ = std::max(net_a2a_, std::max(a_out[static_cast<size_t>(h)], a_in[static_cast<size_t>(h)]) * a2a_row);
    }
  }

  // ---- ep: the library's calls ----
  Status epDispatch() {
    size_t num_recv = 0;
    EP_CALL("chorusEpLayout", chorusEpLayout(ep_, ids_[static_cast<size_t>(rank_)].data(), o_.tokens, nullptr, nullptr,
                                             nullptr, nullptr, &num_recv, comm_, nullptr));
    if (num_recv != origin_.size())
      return internalError("chorus-bench: rank {}: the layout announces {} rows, the reference {}", rank_, num_recv,
                           origin_.size());
    EP_CALL("chorusEpDispatch", chorusEpDispatch(ep_, x_.get(), w_.data(), recv_x_.get(), recv_w_.data(),
                                                 origin_.size(), comm_, nullptr));
    return {};
  }
  Status epCombine() {
    EP_CALL("chorusEpCombine", chorusEpCombine(ep_, recv_x_.get(), recv_w_.data(), out_buf_.get(), comm_, nullptr));
    return {};
  }

  // ---- alltoallv: the same exchange as a framework writes it ----
  struct A2a {
    std::vector<uint64_t> sc, rc;         // rows per (rank, local expert), sent and received
    std::vector<size_t> scount, sdispl, rcount, rdispl;  // rows per rank
    std::vector<size_t> pos;              // (t, j) -> its row in the send buffer
    Buffer send, recv;
    std::vector<float> wsend, wrecv;
    size_t sent = 0, received = 0;
  };

  Status a2aPrepare(A2a& a) {
    a.sent = o_.tokens * k_;
    a.received = origin_.size();
    CHORUS_ASSIGN_OR_RETURN(a.send, allocate(a.sent * row_));
    CHORUS_ASSIGN_OR_RETURN(a.recv, allocate(a.received * row_));
    a.wsend.assign(a.sent, 0);
    a.wrecv.assign(a.received, 0);
    a.pos.assign(a.sent, 0);
    return {};
  }

  Status a2aDispatch(A2a& a) {
    const auto n = static_cast<size_t>(n_);
    const auto L = static_cast<size_t>(L_);
    const std::vector<int32_t>& ids = ids_[static_cast<size_t>(rank_)];
    // Counts per (rank, local expert) = per global expert; exchanged first.
    a.sc.assign(n * L, 0);
    a.rc.assign(n * L, 0);
    for (int32_t e : ids) a.sc[static_cast<size_t>(e)] += 1;
    EP_CALL("chorusAllToAll (counts)", chorusAllToAll(a.sc.data(), a.rc.data(), L, chorusUint64, comm_, nullptr));
    // Permute: one row per (token, expert), sorted by expert (rank-major),
    // then token.
    std::vector<size_t> off(n * L + 1, 0);
    for (size_t e = 0; e < n * L; ++e) off[e + 1] = off[e] + a.sc[e];
    a.scount.assign(n, 0), a.sdispl.assign(n, 0), a.rcount.assign(n, 0), a.rdispl.assign(n, 0);
    size_t received = 0;
    for (size_t p = 0; p < n; ++p) {
      a.sdispl[p] = off[p * L] * o_.hidden;
      a.scount[p] = (off[(p + 1) * L] - off[p * L]) * o_.hidden;
      size_t rows = 0;
      for (size_t e = 0; e < L; ++e) rows += a.rc[p * L + e];
      a.rdispl[p] = received * o_.hidden;
      a.rcount[p] = rows * o_.hidden;
      received += rows;
    }
    if (received != a.received)
      return internalError("chorus-bench: rank {}: peers announce {} rows, the reference {}", rank_, received,
                           a.received);
    for (size_t t = 0; t < o_.tokens; ++t)
      for (size_t j = 0; j < k_; ++j) {
        const size_t at = off[static_cast<size_t>(ids[t * k_ + j])]++;
        a.pos[t * k_ + j] = at;
        std::memcpy(a.send.get() + at * row_, x_.get() + t * row_, row_);
        a.wsend[at] = w_[t * k_ + j];
      }
    EP_CALL("chorusAllToAllV (rows)", chorusAllToAllV(a.send.get(), a.scount.data(), a.sdispl.data(), a.recv.get(),
                                                      a.rcount.data(), a.rdispl.data(), o_.dtype, comm_, nullptr));
    std::vector<size_t> ws(n), wsd(n), wr(n), wrd(n);
    for (size_t p = 0; p < n; ++p)
      ws[p] = a.scount[p] / o_.hidden, wsd[p] = a.sdispl[p] / o_.hidden, wr[p] = a.rcount[p] / o_.hidden,
      wrd[p] = a.rdispl[p] / o_.hidden;
    EP_CALL("chorusAllToAllV (weights)", chorusAllToAllV(a.wsend.data(), ws.data(), wsd.data(), a.wrecv.data(),
                                                         wr.data(), wrd.data(), chorusFloat32, comm_, nullptr));
    // Sort the received blocks (source-major, then expert) into expert-major.
    blocks(a, [&](size_t from, size_t to, size_t rows) {
      std::memcpy(recv_x_.get() + to * row_, a.recv.get() + from * row_, rows * row_);
      std::copy_n(&a.wrecv[from], rows, &recv_w_[to]);
    });
    return {};
  }

  // For each (source, local expert) block of rows: its first row in the
  // source-major receive buffer, in expert-major recvX, and its rows.
  template <class F>
  void blocks(const A2a& a, F f) const {
    const auto n = static_cast<size_t>(n_);
    const auto L = static_cast<size_t>(L_);
    std::vector<size_t> expert_start(L + 1, 0);
    for (size_t e = 0; e < L; ++e) {
      size_t rows = 0;
      for (size_t p = 0; p < n; ++p) rows += a.rc[p * L + e];
      expert_start[e + 1] = expert_start[e] + rows;
    }
    std::vector<size_t> fill(expert_start.begin(), expert_start.end() - 1);
    size_t from = 0;
    for (size_t p = 0; p < n; ++p)
      for (size_t e = 0; e < L; ++e) {
        const size_t rows = a.rc[p * L + e];
        f(from, fill[e], rows);
        fill[e] += rows;
        from += rows;
      }
  }

  Status a2aCombine(A2a& a) {
    // The expert outputs (recvX: identity experts) back to source-major.
    blocks(a, [&](size_t from, size_t to, size_t rows) {
      std::memcpy(a.recv.get() + from * row_, recv_x_.get() + to * row_, rows * row_);
    });
    EP_CALL("chorusAllToAllV (combine)", chorusAllToAllV(a.recv.get(), a.rcount.data(), a.rdispl.data(), a.send.get(),
                                                         a.scount.data(), a.sdispl.data(), o_.dtype, comm_, nullptr));
    // Home: each token's rows weighted and summed in float32, rounded once.
    std::vector<float> acc(o_.hidden);
    for (size_t t = 0; t < o_.tokens; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (size_t j = 0; j < k_; ++j) {
        const std::byte* row = a.send.get() + a.pos[t * k_ + j] * row_;
        const float w = w_[t * k_ + j];
        for (size_t i = 0; i < o_.hidden; ++i) acc[i] += w * load(row + i * elem_, o_.dtype);
      }
      for (size_t i = 0; i < o_.hidden; ++i) store(out_buf_.get() + t * row_ + i * elem_, o_.dtype, acc[i]);
    }
    return {};
  }

  // ---- the check ----
  double tolerance(double expected, int roundings) const {
    const double p = o_.compress == CHORUS_COMPRESS_FP8 ? 0x1p-3 : o_.dtype == chorusBfloat16 ? 0x1p-7 : 0x1p-22;
    return p * roundings * std::max(1.0, std::fabs(expected));
  }

  uint64_t countWrongDispatch() const {
    uint64_t wrong = 0;
    for (size_t r = 0; r < origin_.size(); ++r) {
      const Origin& g = origin_[r];
      if (recv_w_[r] != epWeight(o_.seed, g.src, g.t, g.j)) ++wrong;
      for (size_t i = 0; i < o_.hidden; ++i) {
        const double want = epValue(o_.seed, g.src, g.t, i);
        if (std::fabs(load(recv_x_.get() + r * row_ + i * elem_, o_.dtype) - want) > tolerance(want, 1)) ++wrong;
      }
    }
    return wrong;
  }

  uint64_t countWrongCombine() const {
    uint64_t wrong = 0;
    for (size_t t = 0; t < o_.tokens; ++t) {
      double wsum = 0;
      for (size_t j = 0; j < k_; ++j) wsum += w_[t * k_ + j];
      for (size_t i = 0; i < o_.hidden; ++i) {
        const double want = epValue(o_.seed, rank_, t, i) * wsum;
        // Partials rounded per rank, per host and at home, each a sum of up to k terms.
        if (std::fabs(load(out_buf_.get() + t * row_ + i * elem_, o_.dtype) - want) >
            tolerance(std::fabs(epValue(o_.seed, rank_, t, i)) * wsum, static_cast<int>(k_) + 3))
          ++wrong;
      }
    }
    return wrong;
  }

  // ---- measuring ----
  Result<double> measure(EpForm form, bool check, int rep) {
    A2a a;
    if (form == EpForm::AllToAllV) CHORUS_RETURN_IF_ERROR(a2aPrepare(a));
    auto dispatch = [&]() { return form == EpForm::Ep ? epDispatch() : a2aDispatch(a); };
    auto combine = [&]() { return form == EpForm::Ep ? epCombine() : a2aCombine(a); };
    auto once = [&]() { return o_.combine ? combine() : dispatch(); };
    std::fill(recv_w_.begin(), recv_w_.end(), -1.0f);
    std::memset(recv_x_.get(), 0xff, origin_.size() * row_);
    std::memset(out_buf_.get(), 0xff, o_.tokens * row_);
    CHORUS_RETURN_IF_ERROR(dispatch());  // combine undoes a dispatch; dispatch's own check
    std::optional<uint64_t> wrong;
    if (check) {
      double w = static_cast<double>(countWrongDispatch());
      if (o_.combine) {
        CHORUS_RETURN_IF_ERROR(combine());
        w = static_cast<double>(countWrongCombine());
      }
      EP_CALL("summing the wrong-element counts", chorusAllReduce(&w, &w, 1, chorusFloat64, chorusSum, book_, nullptr));
      wrong = static_cast<uint64_t>(w);
      wrong_total_ += *wrong;
    }
    for (int i = 0; i < o_.warmup; ++i) CHORUS_RETURN_IF_ERROR(once());
    EP_CALL("the barrier before timing", chorusBarrier(book_, nullptr));
    const auto t0 = Clock::now();
    for (int i = 0; i < o_.iters; ++i) CHORUS_RETURN_IF_ERROR(once());
    double seconds = std::chrono::duration<double>(Clock::now() - t0).count() / o_.iters;
    if (o_.average == 0 && rank_ != 0) seconds = 0;
    const chorusRedOp_t how = o_.average == 2 ? chorusMin : o_.average == 3 ? chorusMax : chorusSum;
    EP_CALL("reducing the timings", chorusAllReduce(&seconds, &seconds, 1, chorusFloat64, how, book_, nullptr));
    if (o_.average == 1) seconds /= n_;

    const double logical = static_cast<double>(o_.tokens * k_ * row_);
    const double net = form == EpForm::Ep ? net_ep_ : net_a2a_;
    print(fmt::format("  {:>10}  {:>8}  {:>5}  {:>9}  {:>6}  {:>9.0f}  {:>6.3f}  {:>6.3f}  {:>8.1f}  {:>6}\n",
                      o_.tokens * row_, o_.tokens, typeName(), epFormName(form), rep, seconds * 1e6,
                      logical / seconds / 1e9, net / seconds / 1e9, net / 1e6,
                      wrong ? fmt::format("{}", *wrong) : std::string("N/A")));
    if (json_.is_open()) {
      json_ << fmt::format(
          "{{\"op\":\"{}\",\"form\":\"{}\",\"repeat\":{},\"nranks\":{},\"hosts\":{},\"tokens\":{},\"hidden\":{},"
          "\"experts\":{},\"topk\":{},\"max_hosts\":{},\"type\":\"{}\",\"time_us\":{:.1f},\"algbw_gbps\":{:.4f},"
          "\"netbw_gbps\":{:.4f},\"net_bytes\":{:.0f},\"wrong\":{}}}\n",
          o_.combine ? "combine" : "dispatch", epFormName(form), rep, n_, nh_, o_.tokens, o_.hidden, o_.experts,
          o_.topk, o_.max_hosts, typeName(), seconds * 1e6, logical / seconds / 1e9, net / seconds / 1e9, net,
          wrong ? fmt::format("{}", *wrong) : std::string("null"));
      json_.flush();
    }
    return seconds;
  }

  const EpBenchOptions& o_;
  const chorusComm_t comm_;
  const chorusComm_t book_;
  std::FILE* const out_;
  int n_ = 0, rank_ = 0, nh_ = 1, L_ = 1;
  size_t k_ = 1, elem_ = 2, row_ = 0;
  chorusEpHandle_t ep_ = nullptr;
  std::vector<std::vector<int32_t>> ids_;
  Buffer x_, out_buf_, recv_x_;
  std::vector<float> w_, recv_w_;
  std::vector<Origin> origin_;
  double net_ep_ = 0, net_a2a_ = 0;
  uint64_t wrong_total_ = 0;
  std::ofstream json_;
};

}  // namespace

Result<uint64_t> runEpBench(const EpBenchOptions& o, chorusComm_t comm, std::FILE* out) {
  EpBench b(o, comm, out);
  CHORUS_RETURN_IF_ERROR(b.setUp());
  CHORUS_RETURN_IF_ERROR(b.run());
  return b.wrong();
}

}  // namespace chorus::tools::bench
