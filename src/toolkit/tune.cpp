#include "toolkit/tune.hpp"

#include <algorithm>
#include <utility>
#include <chrono>
#include <ctime>
#include <cstdlib>
#include <vector>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include <unistd.h>

#include "api/config.hpp"
#include "bootstrap/bootstrap.hpp"
#include "exec/board_runner.hpp"
#include "kernels/dtype.hpp"
#include "kernels/reduce.hpp"
#include "plan/plan.hpp"
#include "transport/registry.hpp"
#include "toolkit/bench.hpp"

namespace chorus::tools {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Status check(chorusResult_t r, chorusComm_t comm, const char* what) {
  if (r == chorusSuccess) return {};
  return makeError(r, "chorus-tune: {}: {}", what, chorusGetLastError(comm));
}

// Median over reps of one round of a collective: a ring allgather of `bytes`
// per rank (forced with chorusCommSetAlgo) is n - 1 rounds in which every rank
// sends one block and receives one, so (T - ω) / (n - 1) is a round of
// α + 2o + bytes·β as the cost model prices it, measured through the same
// executor and transports as the collectives themselves (a ping-pong of
// point-to-point calls measures a sleeping peer's wake-up instead).  In place
// (the rank's block already in its slot of the output): out of place the call
// also copies the rank's own block into the output, a copy per call that at
// n = 2 is one per round -- at 32 MiB, out of the caches, as long as the
// round's transfer itself, which read β_large half as fast as the
// allreduce's rounds move bytes (issue 35 item 3).
Result<double> ringRound(chorusComm_t comm, size_t bytes, int reps, int iters, double omega) {
  int n = 1, rank = 0;
  chorusCommCount(comm, &n);
  chorusCommUserRank(comm, &rank);
  std::vector<char> out(std::max<size_t>(bytes, 1) * static_cast<size_t>(n));
  const char* in = out.data() + static_cast<size_t>(rank) * bytes;
  std::vector<double> times;
  for (int rep = 0; rep < reps; ++rep) {
    CHORUS_RETURN_IF_ERROR(check(chorusBarrier(comm, nullptr), comm, "barrier"));
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i)
      CHORUS_RETURN_IF_ERROR(check(chorusAllGather(in, out.data(), bytes, chorusUint8, comm, nullptr), comm, "allgather"));
    double t = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
    CHORUS_RETURN_IF_ERROR(check(chorusAllReduce(&t, &t, 1, chorusFloat64, chorusMax, comm, nullptr), comm, "max"));
    times.push_back(std::max(0.0, t - omega) / std::max(1, n - 1));
  }
  return median(times);
}

// Median over reps of the time of one burst: rank 1 sends k 8-byte messages to
// rank 0 in one group, rank 0 receives them in one group and answers with one.
// The k messages are in flight together, so T(k) - T(1) is k - 1 times the
// CPU cost of a message, not k - 1 latencies.
Result<double> burst(chorusComm_t comm, int k, int reps, int iters) {
  int rank = 0;
  chorusCommUserRank(comm, &rank);
  std::vector<uint64_t> buf(static_cast<size_t>(k) + 1);
  auto group = [&](bool send, int peer, int count) -> Status {
    CHORUS_RETURN_IF_ERROR(check(chorusGroupStart(), comm, "group start"));
    for (int i = 0; i < count; ++i) {
      chorusResult_t r = send ? chorusSend(&buf[i], 1, chorusUint64, peer, comm, nullptr)
                              : chorusRecv(&buf[i], 1, chorusUint64, peer, comm, nullptr);
      if (r != chorusSuccess) {
        chorusGroupEnd();
        return check(r, comm, send ? "send" : "recv");
      }
    }
    return check(chorusGroupEnd(), comm, "group end");
  };
  std::vector<double> times;
  for (int rep = 0; rep < reps; ++rep) {
    CHORUS_RETURN_IF_ERROR(check(chorusBarrier(comm, nullptr), comm, "barrier"));
    auto t0 = Clock::now();
    for (int i = 0; i < iters && rank < 2; ++i) {
      CHORUS_RETURN_IF_ERROR(group(rank == 1, 1 - rank, k));
      CHORUS_RETURN_IF_ERROR(group(rank == 0, 1 - rank, 1));
    }
    double t = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
    CHORUS_RETURN_IF_ERROR(check(chorusAllReduce(&t, &t, 1, chorusFloat64, chorusMax, comm, nullptr), comm, "max"));
    times.push_back(t);
  }
  return median(times);
}

// α, β and o of the links the communicator's ranks use: o from a burst of 32
// point-to-point messages against one (their latencies overlap, so the
// difference is 31 o); a ring round of 8 bytes is α + 2o; β from the extra
// time of a cache-sized round (256 KiB) and β_large from a big one
// (o.big_bytes, beyond the caches).
Result<tune::LinkCost> measureLink(chorusComm_t comm, const TuneOptions& o, double omega) {
  tune::LinkCost l;
  constexpr size_t kMid = 256u << 10;
  CHORUS_RETURN_IF_ERROR(check(chorusCommSetAlgo(comm, "allgather:ring"), comm, "forcing the ring allgather"));
  CHORUS_ASSIGN_OR_RETURN(double small, ringRound(comm, 8, o.reps, 2000, omega));
  CHORUS_ASSIGN_OR_RETURN(double mid, ringRound(comm, kMid, o.reps, 100, omega));
  CHORUS_ASSIGN_OR_RETURN(double big, ringRound(comm, o.big_bytes, o.reps, 4, omega));
  CHORUS_RETURN_IF_ERROR(check(chorusCommSetAlgo(comm, ""), comm, "restoring the tuner"));
  constexpr int kBurst = 32;
  CHORUS_ASSIGN_OR_RETURN(double one, burst(comm, 1, o.reps, 1000));
  CHORUS_ASSIGN_OR_RETURN(double many, burst(comm, kBurst, o.reps, 1000));
  const double overhead = std::clamp((many - one) / (kBurst - 1), 0.0, small / 4);
  l.overhead = Seconds(overhead);
  l.alpha = Seconds(std::max(0.0, small - 2 * overhead));
  l.beta = SecondsPerByte(std::max(1e-12, (mid - small) / static_cast<double>(kMid)));
  l.beta_large = std::max(l.beta, SecondsPerByte((big - small) / static_cast<double>(o.big_bytes)));
  return l;
}

Result<chorusComm_t> initFromEnv(const Config& cfg);

// The configuration of a communicator of the job's ranks forced onto one
// transport (CHORUS_TRANSPORT=<name>); "" keeps the job's own.
Config transportConfig(const Config& job, const std::string& transport) {
  Config c = job;
  if (!transport.empty()) c.net.transport = transport;
  return c;
}

// Each calibration point warms up for 20 ms (this VM's cores run small calls 2x
// slower for the first milliseconds after idling) and is timed over >= 10 ms.
constexpr double kWarmupMs = 20, kMinTimeMs = 10;

// Every algorithm of each collective in o.collectives, swept with
// chorus-bench's own loop (forced algorithm, checked output, slowest rank's
// mean) on a communicator whose tuner holds `base` without corrections, so the
// rows' predicted_us is the model alone; factor = median measured / model.
Result<std::vector<tune::Correction>> measureCorrections(chorusComm_t parent, const tune::CostProfile& base,
                                                         const TuneOptions& o, const std::string& transport) {
  tune::CostProfile plain = base;
  plain.corrections.clear();
  const std::string path = (std::filesystem::temp_directory_path() /
                            fmt::format("chorus-tune-{}-{}.json", ::getpid(), transport.empty() ? "job" : transport)).string();
  {
    std::ofstream f(path, std::ios::trunc);
    f << plain.toJson();
    if (!f) return systemError("chorus-tune: cannot write the temporary profile {}", path);
  }
  // A communicator split off the parent (same transports, no new rendezvous)
  // with the parent's configuration but for its profile, the temporary one,
  // which it reads when it is set up.
  int rank = 0;
  chorusCommUserRank(parent, &rank);
  Config cfg = transportConfig(o.config, transport);
  cfg.tune.profile_path = path;
  chorusComm_t comm = nullptr;
  const chorusResult_t made = api::commSplit(parent, 0, rank, cfg, &comm);
  std::error_code ec;
  std::filesystem::remove(path, ec);
  CHORUS_RETURN_IF_ERROR(check(made, parent, "splitting a calibration communicator"));
  struct Closer {
    chorusComm_t c;
    ~Closer() { chorusCommDestroy(c); }
  } closer{comm};
  int n = 1;
  chorusCommCount(comm, &n);
  const std::string link = api::commRouteKey(comm);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> sink(std::fopen("/dev/null", "w"), &std::fclose);
  if (!sink) return systemError("chorus-tune: cannot open /dev/null");

  // The built-in plans and those of CHORUS_PLAN_PATH: a loaded plan is
  // calibrated like any other.
  CHORUS_ASSIGN_OR_RETURN(const plan::Registry registry, plan::Registry::withPlans(cfg.tune.plan_paths));
  std::vector<tune::Correction> out;
  for (const std::string& name : o.collectives) {
    plan::Collective pc;
    CHORUS_ASSIGN_OR_RETURN(bench::Collective bc, bench::parseCollective(name));
    if (!plan::parseCollective(name, &pc)) return invalidArgument("chorus-tune: '{}' is not a priced collective", name);
    std::vector<std::string> algos;
    for (const plan::Algorithm* a : registry.forCollective(pc)) algos.emplace_back(a->name());
    if (algos.empty()) continue;
    // (algo, elements) -> measured times over the sweeps, and the model's time.
    std::map<std::pair<std::string, uint64_t>, std::pair<std::vector<double>, double>> points;
    for (int rep = 0; rep < o.correction_reps; ++rep) {
      // Two bands, so that small sizes are timed over many calls.
      const uint64_t split = 1u << 20;
      for (auto [lo, hi, iters, warmup] : {std::tuple<uint64_t, uint64_t, int, int>{16, split / 4, 50, 5},
                                           std::tuple<uint64_t, uint64_t, int, int>{split, o.max_bytes, 3, 1}}) {
        hi = std::min(hi, o.max_bytes);
        if (lo > hi) continue;
        bench::BenchOptions bo;
        bo.collective = bc;
        bo.sweep.min_bytes = lo;
        bo.sweep.max_bytes = hi;
        bo.sweep.step_factor = 4;
        bo.iters = iters;
        bo.warmup = warmup;
        bo.warmup_ms = kWarmupMs;
        bo.min_time_ms = kMinTimeMs;
        bo.check = rep == 0;
        bo.algos = algos;
        bo.in_place = false;
        bo.algo_spec = cfg.tune.algo_spec;
        std::vector<bench::Row> rows;
        bo.rows = &rows;
        CHORUS_ASSIGN_OR_RETURN(uint64_t wrong, bench::runBench(bo, comm, sink.get()));
        if (wrong != 0) return internalError("chorus-tune: {} gave {} wrong elements while calibrating", name, wrong);
        for (const bench::Row& r : rows) {
          const bench::Measurement& m = r.out_of_place;
          if (r.shape.count == 0 || !m.predicted_us || *m.predicted_us <= 0 || m.algo.empty()) continue;
          auto& slot = points[{m.algo, r.shape.count}];
          slot.first.push_back(m.time_us);
          slot.second = *m.predicted_us;
        }
      }
    }
    for (const std::string& a : algos) {
      tune::Correction c;
      c.collective = pc;
      c.algo = a;
      c.nranks = n;
      c.link = link;
      for (const auto& [key, val] : points) {
        if (key.first != a) continue;
        const double bytes = static_cast<double>(key.second) * sizeof(float);
        c.points.emplace_back(bytes, std::clamp(median(val.first) / val.second, 1e-3, 1e6));
      }
      std::sort(c.points.begin(), c.points.end());
      if (!c.points.empty()) out.push_back(std::move(c));
    }
  }
  return out;
}

// The corrections of this job's rank count on comm's transports, merged into p.
Status addCorrections(chorusComm_t comm, tune::CostProfile& p, const TuneOptions& o, const std::string& transport) {
  if (o.collectives.empty()) return {};
  CHORUS_ASSIGN_OR_RETURN(std::vector<tune::Correction> cs, measureCorrections(comm, p, o, transport));
  for (tune::Correction& c : cs) p.setCorrection(std::move(c));
  return {};
}

// A communicator aborted on an error path and destroyed at the end of the
// scope (after a closing barrier on the success path).
class OwnedComm {
 public:
  explicit OwnedComm(chorusComm_t c) : c_(c) {}
  OwnedComm(OwnedComm&& o) noexcept : c_(std::exchange(o.c_, nullptr)), ok_(o.ok_) {}
  OwnedComm& operator=(OwnedComm&&) = delete;
  ~OwnedComm() {
    if (c_ == nullptr) return;
    if (!ok_) chorusCommAbort(c_);
    chorusCommDestroy(c_);
  }
  [[nodiscard]] chorusComm_t get() const { return c_; }
  Status finish() {
    ok_ = true;
    return check(chorusBarrier(c_, nullptr), c_, "the closing barrier");
  }

 private:
  chorusComm_t c_;
  bool ok_ = false;
};

// The communicator of the same ranks forced onto one transport: a fresh
// unique id from rank 0, broadcast over comm.  (A second
// chorusCommInitFromEnv would rendezvous on the job's master port again,
// where rank 0's first store may still answer.)
Result<OwnedComm> transportTwin(chorusComm_t comm, const Config& job, const std::string& transport) {
  int n = 0, rank = 0;
  chorusCommCount(comm, &n);
  chorusCommUserRank(comm, &rank);
  chorusUniqueId id{};
  if (rank == 0) CHORUS_RETURN_IF_ERROR(check(chorusGetUniqueId(&id), comm, "drawing a unique id"));
  CHORUS_RETURN_IF_ERROR(check(chorusBroadcast(&id, &id, sizeof id, chorusUint8, 0, comm, nullptr), comm,
                               "sending the unique id"));
  chorusComm_t tc = nullptr;
  if (chorusResult_t r = api::commInitRank(&tc, n, id, rank, transportConfig(job, transport)); r != chorusSuccess)
    return makeError(r, "chorus-tune: the {} communicator: {}", transport, chorusGetLastError(nullptr));
  return OwnedComm(tc);
}

Result<chorusComm_t> initFromEnv(const Config& cfg) {
  chorusComm_t comm = nullptr;
  chorusResult_t r = api::commInitFromEnv(&comm, cfg);
  if (r != chorusSuccess) return makeError(r, "chorus-tune: chorusCommInitFromEnv: {}", chorusGetLastError(nullptr));
  return comm;
}

}  // namespace

// The α-β-γ figures: per-call overhead, the shared-memory link (on comm),
// and the reduction rates of this process's core.
static Status measureFigures(chorusComm_t comm, const TuneOptions& o, tune::CostProfile* p) {
  int rank = 0;
  chorusCommUserRank(comm, &rank);
  // Per-call overhead: an 8-byte allreduce on a communicator of one rank.
  chorusComm_t self = nullptr;
  CHORUS_RETURN_IF_ERROR(check(chorusCommSplit(comm, rank, 0, &self), comm, "split"));
  std::vector<double> oh;
  double x = 1;
  for (int rep = 0; rep < o.reps; ++rep) {
    auto t0 = Clock::now();
    for (int i = 0; i < 20000; ++i)
      CHORUS_RETURN_IF_ERROR(check(chorusAllReduce(&x, &x, 1, chorusFloat64, chorusSum, self, nullptr), self, "allreduce"));
    oh.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / 20000);
  }
  p->op_overhead = Seconds(median(oh));
  chorusCommDestroy(self);
  const double omega = p->op_overhead.value();

  // The job's own communicator measures its transport's link when one
  // transport serves it all (shared memory on one host); the others are
  // measured on communicators forced onto them (measureProfile).
  if (const std::string key = api::commRouteKey(comm); key.find('+') == std::string::npos) {
    CHORUS_ASSIGN_OR_RETURN(p->links[key], measureLink(comm, o, omega));
  }


  // Reduction throughput per data type (bytes of one operand per second), on
  // operands that stay in the cache, as a pipelined slice's do.
  const size_t bytes = 256u << 10;
  std::vector<std::byte> a(bytes), b(bytes);
  for (int d = 0; d < chorusNumTypes; ++d) {
    const auto dt = static_cast<chorusDataType_t>(d);
    const size_t count = bytes / kernels::dtypeSize(dt);
    for (size_t i = 0; i < count; ++i) {
      kernels::storeFromDouble(a.data() + i * kernels::dtypeSize(dt), dt, static_cast<double>(i % 7));
      kernels::storeFromDouble(b.data() + i * kernels::dtypeSize(dt), dt, 1.0);
    }
    kernels::Reducer red(dt, kernels::BinOp::Sum);
    std::vector<double> t;
    for (int rep = 0; rep < o.reps; ++rep) {
      auto t0 = Clock::now();
      red(a.data(), a.data(), b.data(), count);
      t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    p->gamma[d] = Seconds(median(t)) / Bytes(static_cast<double>(bytes));
  }
  {
    // Out of the caches: fp32 over 64 MiB operands (twice cache_size's cap).
    const size_t big = 64u << 20;
    const size_t count = big / sizeof(float);
    std::vector<float> x(count, 1.0f), y(count, 2.0f);
    kernels::Reducer red(chorusFloat32, kernels::BinOp::Sum);
    std::vector<double> t;
    for (int rep = 0; rep < std::min(o.reps, 5); ++rep) {
      auto t0 = Clock::now();
      red(x.data(), x.data(), y.data(), count);
      t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    p->reduce_mem = Seconds(median(t)) / Bytes(static_cast<double>(big));
  }
  {
    // The effective cache: every local rank at once reduces fp32 operands
    // whose footprint on the host (input and output of every rank) is the
    // nominal last-level cache; the slowest rank's rate, between the in- and
    // out-of-cache ones, says how much of it the model may count as cache
    // (tune::effectiveCacheBytes).  On this kind of VM the rate there is
    // already a third of the way to memory speed (docs/performance.md).
    int n = 1;
    chorusCommCount(comm, &n);
    const Bytes nominal = tune::CostProfile{}.cache_size;
    const size_t count = std::max<size_t>(1024, static_cast<size_t>(nominal.value()) / (2 * sizeof(float) * n));
    std::vector<float> x(count, 1.0f), y(count, 2.0f);
    kernels::Reducer red(chorusFloat32, kernels::BinOp::Sum);
    red(y.data(), y.data(), x.data(), count);  // pages in, caches warm
    std::vector<double> t;
    for (int rep = 0; rep < std::max(3, o.reps); ++rep) {
      CHORUS_RETURN_IF_ERROR(check(chorusBarrier(comm, nullptr), comm, "barrier"));
      auto t0 = Clock::now();
      for (int i = 0; i < 4; ++i) red(y.data(), y.data(), x.data(), count);
      double dt = std::chrono::duration<double>(Clock::now() - t0).count() / 4;
      CHORUS_RETURN_IF_ERROR(check(chorusAllReduce(&dt, &dt, 1, chorusFloat64, chorusMax, comm, nullptr), comm, "max"));
      t.push_back(dt);
    }
    const double rate = static_cast<double>(count * sizeof(float)) / median(t);
    p->cache_size = tune::effectiveCacheBytes(nominal, rate, 1 / p->gamma[chorusFloat32].value(), 1 / p->reduce_mem.value());
  }

  // The board: the whole fixed cost of a call from an 8-byte one-shot
  // allreduce of all ranks (every rank publishes and reads every peer's
  // slot), the cost of a byte read from a peer's slot from a full slot's
  // (exec::kBoardBytes) against that; the two alternate, so both see the
  // machine in the same state.
  {
    CHORUS_RETURN_IF_ERROR(check(chorusCommSetAlgo(comm, "allreduce:oneshot"), comm, "forcing the one-shot allreduce"));
    int n = 1;
    chorusCommCount(comm, &n);
    constexpr size_t kFull = exec::kBoardBytes / sizeof(double);
    std::vector<double> full(kFull, 1.0);
    auto timed = [&](double* buf, size_t count, int iters) -> Result<double> {
      CHORUS_RETURN_IF_ERROR(check(chorusBarrier(comm, nullptr), comm, "barrier"));
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i)
        CHORUS_RETURN_IF_ERROR(check(chorusAllReduce(buf, buf, count, chorusFloat64, chorusMax, comm, nullptr), comm, "allreduce"));
      double t = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
      CHORUS_RETURN_IF_ERROR(check(chorusAllReduce(&t, &t, 1, chorusFloat64, chorusMax, comm, nullptr), comm, "max"));
      return t;
    };
    std::vector<double> small, per_byte;
    for (int rep = 0; rep < o.reps; ++rep) {
      CHORUS_ASSIGN_OR_RETURN(double t1, timed(&x, 1, 20000));
      CHORUS_ASSIGN_OR_RETURN(double tf, timed(full.data(), kFull, 5000));
      small.push_back(t1);
      per_byte.push_back((tf - t1) / (static_cast<double>(n - 1) * exec::kBoardBytes) - p->gamma[chorusFloat64].value());
    }
    CHORUS_RETURN_IF_ERROR(check(chorusCommSetAlgo(comm, ""), comm, "restoring the tuner"));
    p->board_call = Seconds(median(small));
    p->board_beta = SecondsPerByte(std::max(1e-12, median(per_byte)));
  }

  return {};
}

std::vector<std::string> disagreeingFigures(const tune::CostProfile& a, const tune::CostProfile& b, double agree) {
  std::vector<std::pair<std::string, std::pair<double, double>>> figs = {
      {"op_overhead_us", {toUs(a.op_overhead), toUs(b.op_overhead)}},
      {"board_call_us", {toUs(a.board_call), toUs(b.board_call)}},
      {"reduce_gbps.float32", {toGbytePerS(a.gamma[chorusFloat32]), toGbytePerS(b.gamma[chorusFloat32])}},
  };
  // Figures that are optional in a profile (0: not measured) are compared
  // only when both passes have them.
  const SecondsPerByte none;
  if (a.board_beta > none && b.board_beta > none)
    figs.push_back({"board_bandwidth_gbps", {toGbytePerS(a.board_beta), toGbytePerS(b.board_beta)}});
  if (a.reduce_mem > none && b.reduce_mem > none)
    figs.push_back({"reduce_mem_gbps", {toGbytePerS(a.reduce_mem), toGbytePerS(b.reduce_mem)}});
  figs.push_back({"cache_mib", {a.cache_size.value() / (1 << 20), b.cache_size.value() / (1 << 20)}});
  // Each transport both profiles have figures for: α and β; a host-local
  // one (its o is measured from the same ring rounds) also o and β_large.
  for (const auto& [name, la] : a.links) {
    auto it = b.links.find(name);
    if (it == b.links.end()) continue;
    const tune::LinkCost& lb = it->second;
    figs.push_back({name + ".alpha_us", {toUs(la.alpha), toUs(lb.alpha)}});
    figs.push_back({name + ".bandwidth_gbps", {toGbytePerS(la.beta), toGbytePerS(lb.beta)}});
    if (name == "shm") {
      figs.push_back({name + ".overhead_us", {toUs(la.overhead), toUs(lb.overhead)}});
      if (la.beta_large > none && lb.beta_large > none)
        figs.push_back({name + ".bandwidth_large_gbps", {toGbytePerS(la.beta_large), toGbytePerS(lb.beta_large)}});
    }
  }
  std::vector<std::string> out;
  for (const auto& [name, v] : figs) {
    const double lo = std::min(v.first, v.second), hi = std::max(v.first, v.second);
    if (!(lo > 0) || hi / lo - 1 > agree)
      out.push_back(fmt::format("{} {:.4g} -> {:.4g} ({:+.0f} %)", name, v.first, v.second,
                                v.first > 0 ? 100 * (v.second / v.first - 1) : 0.0));
  }
  return out;
}

namespace {
std::string utcNow() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}
}  // namespace

Result<tune::CostProfile> measureProfile(const TuneOptions& o) {
  // --append: the figures come from the existing profile; only corrections are measured.
  const bool figures = !o.base;
  tune::CostProfile p = o.base.value_or(tune::CostProfile{});
  p.source = "chorus-tune";
  CHORUS_ASSIGN_OR_RETURN(chorusComm_t made, initFromEnv(o.config));
  OwnedComm shm(made);
  int n = 0, rank = 0;
  chorusCommCount(shm.get(), &n);
  chorusCommUserRank(shm.get(), &rank);
  if (n < 2) return invalidUsage("chorus-tune needs at least 2 ranks (run it with --np 2)");
  // A communicator forced onto each other transport to measure: the ranks
  // decide together whether it reaches them all (a transport that serves
  // only some peers would mix routes).
  const std::string own = api::commRouteKey(shm.get());
  std::vector<std::pair<std::string, OwnedComm>> twins;
  for (const std::string& name : o.transports) {
    if (name == own) continue;
    CHORUS_ASSIGN_OR_RETURN(OwnedComm t, transportTwin(shm.get(), o.config, name));
    const std::vector<std::string> used = api::commTransports(t.get());
    double alone = used.size() == 1 && used[0] == name ? 1 : 0;
    CHORUS_RETURN_IF_ERROR(check(chorusAllReduce(&alone, &alone, 1, chorusFloat64, chorusMin, shm.get(), nullptr),
                                 shm.get(), "agreeing on the transports"));
    if (alone > 0) {
      CHORUS_RETURN_IF_ERROR(t.finish());
      twins.emplace_back(name, std::move(t));
    } else {
      if (rank == 0) fmt::print(stderr, "chorus-tune: transport {} does not reach every rank of this job: not measured\n", name);
      CHORUS_RETURN_IF_ERROR(t.finish());
    }
  }
  if (figures) {
    // Passes until two in a row agree on every figure on every rank (the
    // ranks decide together: each pass is collective).
    p.measured_at = utcNow();
    std::optional<tune::CostProfile> prev;
    for (int pass = 1; pass <= std::max(1, o.max_passes); ++pass) {
      tune::CostProfile cur = p;
      CHORUS_RETURN_IF_ERROR(measureFigures(shm.get(), o, &cur));
      for (auto& [name, twin] : twins) {
        CHORUS_ASSIGN_OR_RETURN(cur.links[name], measureLink(twin.get(), o, cur.op_overhead.value()));
      }
      p.passes = pass;
      std::vector<std::string> moved = prev ? disagreeingFigures(*prev, cur, o.agree) : std::vector<std::string>{};
      double any = prev && !moved.empty() ? 1 : 0;
      CHORUS_RETURN_IF_ERROR(check(chorusAllReduce(&any, &any, 1, chorusFloat64, chorusMax, shm.get(), nullptr), shm.get(),
                                   "the passes' agreement"));
      const int keep_passes = p.passes;
      const std::string when = p.measured_at;
      p = cur, p.passes = keep_passes, p.measured_at = when;
      p.unstable = any > 0 ? moved : std::vector<std::string>{};
      if (o.max_passes <= 1 || (prev && any == 0)) break;
      prev = std::move(cur);
    }
    if (rank == 0 && o.max_passes > 1) {
      if (!p.unstable.empty() || p.passes < 2)
        fmt::print(stderr, "chorus-tune: unstable machine: after {} passes the figures still moved more than {:.0f} %{}{}\n",
                   p.passes, 100 * o.agree, p.unstable.empty() ? " (on another rank)" : ": ",
                   fmt::join(p.unstable, ", "));
      else
        fmt::print(stderr, "chorus-tune: the figures of passes {} and {} agree within {:.0f} %\n", p.passes - 1, p.passes,
                   100 * o.agree);
    }
  }
  CHORUS_RETURN_IF_ERROR(addCorrections(shm.get(), p, o, ""));
  for (auto& [name, twin] : twins) {
    CHORUS_RETURN_IF_ERROR(addCorrections(twin.get(), p, o, name));
    CHORUS_RETURN_IF_ERROR(twin.finish());
  }
  CHORUS_RETURN_IF_ERROR(shm.finish());
  return p;
}

}  // namespace chorus::tools
