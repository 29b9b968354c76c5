#include "comm/communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>

#include "clock/offset.hpp"
#include "comm/call_signature.hpp"
#include "comm/health.hpp"
#include "common/log.hpp"
#include "kernels/dtype.hpp"
#include "plan/canonical.hpp"
#include "transport/shm/shm.hpp"
#include "transport/tcp/tcp.hpp"

namespace chorus {

using plan::Collective;
using comm::Signature;
using comm::signatureOf;
using comm::describe;
using comm::differing;

namespace {

// Serialises access to a store client shared by a communicator and the
// communicators split from it (their inits may run on different threads).
class LockedStore final : public bootstrap::Store {
 public:
  explicit LockedStore(std::shared_ptr<bootstrap::Store> s) : s_(std::move(s)) {}
  Status set(std::string_view k, std::span<const std::byte> v) override {
    std::lock_guard l(mu_);
    return s_->set(k, v);
  }
  Result<bootstrap::Bytes> get(std::string_view k, std::chrono::milliseconds t) override {
    std::lock_guard l(mu_);
    return s_->get(k, t);
  }
  Result<int64_t> add(std::string_view k, int64_t d) override {
    std::lock_guard l(mu_);
    return s_->add(k, d);
  }
  Result<int64_t> serverTimeNs() override {
    std::lock_guard l(mu_);
    return s_->serverTimeNs();
  }

 private:
  std::mutex mu_;
  std::shared_ptr<bootstrap::Store> s_;
};

// What each rank publishes at init.
struct RankInfo {
  uint32_t magic = 0x4348494e;  // "CHIN"
  int32_t nranks = 0;
  int32_t rank = 0;
  int32_t pid = 0;
  bootstrap::HostIdentity host;
};

uint64_t hash64(std::string_view s) { return std::hash<std::string_view>{}(s); }

kernels::BinOp binOpOf(chorusRedOp_t op) {
  switch (op) {
    case chorusProd: return kernels::BinOp::Prod;
    case chorusMax: return kernels::BinOp::Max;
    case chorusMin: return kernels::BinOp::Min;
    default: return kernels::BinOp::Sum;  // Sum, Avg, PreMulSum
  }
}

}  // namespace

size_t Communicator::CacheHash::operator()(const CacheKey& k) const {
  size_t h = std::hash<uint64_t>{}(k.count);
  auto mix = [&](uint64_t v) { h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  mix(k.coll | (uint64_t{k.inplace} << 8) | (uint64_t{static_cast<uint8_t>(k.kind)} << 9) |
      (uint64_t{k.elem_size} << 16));
  mix(static_cast<uint64_t>(k.root));
  mix(static_cast<uint64_t>(k.peer));
  mix(k.chunk);
  mix(reinterpret_cast<uintptr_t>(k.algo));
  mix(k.wire);
  return h;
}

namespace {
// A compressed call's wire format as one word of the program cache's key.
uint32_t wireKey(const std::optional<kernels::WireFormat>& w) {
  return w ? 1u + w->kind + (static_cast<uint32_t>(w->block) << 2) : 0u;
}
}  // namespace

namespace {

// The store servers of environment inits, by address; never released (the
// process's exit ends their threads).
struct SharedServers {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<bootstrap::StoreServer>> by_addr;
};
SharedServers& sharedServers() {
  static auto* s = new SharedServers;
  return *s;
}

}  // namespace

Result<std::unique_ptr<Communicator>> Communicator::init(int nranks, int rank, const bootstrap::UniqueId& id,
                                                         const Config& cfg, std::string_view prefix,
                                                         bool shared_server) {
  std::shared_ptr<bootstrap::StoreServer> server;
  if (rank == 0) {
    std::unique_lock<std::mutex> lock;
    std::shared_ptr<bootstrap::StoreServer>* slot = nullptr;
    if (shared_server) {
      SharedServers& ss = sharedServers();
      lock = std::unique_lock(ss.mu);
      slot = &ss.by_addr[id.root.toString()];
      server = *slot;
    }
    if (server == nullptr) {
      auto reserved = bootstrap::takeReservedListener(id.root);
      auto s = reserved ? bootstrap::StoreServer::start(std::move(*reserved), id.secret)
                        : bootstrap::StoreServer::start(id.root, id.secret);
      if (!s.isOk())
        return s.status().withContext(fmt::format("rank 0: starting the rendezvous store on {}: ", id.root.toString()));
      server = std::move(s.value());
      if (slot != nullptr) *slot = server;
    }
  }
  auto store = bootstrap::connectStore(id.root, id.secret, cfg.timeout);
  if (!store.isOk())
    return store.status().withContext(fmt::format("rank {}: connecting to the rendezvous store at {}: ", rank, id.root.toString()));
  std::unique_ptr<Communicator> c(new Communicator());
  c->rank_ = rank;
  c->nranks_ = nranks;
  CHORUS_RETURN_IF_ERROR(c->setup(id, cfg, std::make_shared<LockedStore>(store.value()), std::string(prefix), server));
  return c;
}

Status Communicator::setup(const bootstrap::UniqueId& id, const Config& cfg,
                           std::shared_ptr<bootstrap::Store> base, std::string prefix,
                           std::shared_ptr<bootstrap::StoreServer> server) {
  id_ = id;
  cfg_ = cfg;
  prefix_ = std::move(prefix);
  server_ = std::move(server);
  base_store_ = base;
  store_ = std::make_unique<bootstrap::PrefixStore>(base, prefix_);
  registry_ = plan::Registry::builtin();
  health_.bind(rank_, nranks_, cfg, store_.get());
  CHORUS_RETURN_IF_ERROR(comm::Health::makeFlightDir(cfg.flight.dir));

  RankInfo me;
  me.nranks = nranks_;
  me.rank = rank_;
  me.pid = static_cast<int32_t>(getpid());
  me.host = bootstrap::localHostIdentity(cfg.net.host_id);
  CHORUS_RETURN_IF_ERROR(store_->set(fmt::format("info/{}", rank_), bootstrap::toBytes(me)));
  std::vector<RankInfo> infos(nranks_);
  const auto join_start = std::chrono::steady_clock::now();
  for (int r = 0; r < nranks_; ++r) {
    auto got = store_->get(fmt::format("info/{}", r), cfg.timeout);
    if (!got.isOk() && got.status().code() == chorusTimeout) {
      // Say who is missing, not which store key: look at every rank's record.
      std::vector<int> missing;
      for (int q = 0; q < nranks_; ++q)
        if (!store_->get(fmt::format("info/{}", q), std::chrono::milliseconds(1)).isOk()) missing.push_back(q);
      std::string list;
      for (int q : missing) list += fmt::format("{}{}", list.empty() ? "" : ",", q);
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - join_start).count();
      return makeError(chorusTimeout,
                       "init: {} of {} ranks joined within {:.1f} s; rank(s) {} never reached the rendezvous store "
                       "({}) (did they start? do all ranks use the same unique id or CHORUS_MASTER_ADDR/PORT and "
                       "world size? can they reach that address?) [{}]",
                       nranks_ - static_cast<int>(missing.size()), nranks_, waited, list.empty() ? "?" : list,
                       server_ ? server_->address().toString() : id_.root.toString(), got.status().message());
    }
    CHORUS_ASSIGN_OR_RETURN(bootstrap::Bytes b, std::move(got));
    if (b.size() != sizeof(RankInfo)) return remoteError("init: rank {} published a malformed record ({} bytes)", r, b.size());
    std::memcpy(&infos[r], b.data(), sizeof(RankInfo));
    if (infos[r].magic != me.magic || infos[r].rank != r)
      return remoteError("init: rank {} published a malformed record", r);
    if (infos[r].nranks != nranks_)
      return invalidUsage(
          "init: rank {} was initialised with nranks={} but rank {} with nranks={} (do all ranks pass the same "
          "nranks to chorusCommInitRank / the same WORLD_SIZE?)",
          rank_, nranks_, r, infos[r].nranks);
  }

  std::vector<int> local, remote;
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_) continue;
    (infos[r].host == me.host && !cfg.net.force_tcp ? local : remote).push_back(r);
  }
  std::vector<transport::Transport*> routes(nranks_, nullptr);
  const std::string job_tag = fmt::format("{:016x}", hash64(id.secret.toHex() + id.root.toString() + prefix_));
  if (!local.empty()) {
    transport::ShmSetup s;
    s.rank = rank_;
    s.peers = local;
    int lowest = std::min(rank_, local.front());
    s.segment_prefix = fmt::format("/chorus-{}-{}", job_tag, lowest);
    s.ring_bytes = cfg.shm.ring_bytes;
    s.allow_cma = cfg.shm.cma;
    s.cma_bytes = cfg.shm.cma_bytes;
    s.spin = cfg.spin;
    s.timeout = cfg.timeout;
    bootstrap::PrefixStore host_store(base, prefix_ + fmt::format("h{}/", lowest));
    transport::Board* board = nullptr;
    auto t = transport::createShmTransport(s, host_store, &board);
    if (!t.isOk()) return t.status().withContext(fmt::format("init: rank {}: shared-memory transport: ", rank_));
    shm_ = std::move(t.value());
    for (int r : local) routes[r] = shm_.get();
    // The board serves calls of the whole communicator only when every peer
    // is on this host.
    if (remote.empty()) board_.attach(rank_, nranks_, board, cfg.timeout);
    comm::installWireMismatchText();
  }
  if (!remote.empty()) {
    transport::TcpSetup s;
    s.rank = rank_;
    s.peers = remote;
    s.comm_id = hash64(job_tag + "tcp");
    s.secret = id.secret;
    CHORUS_ASSIGN_OR_RETURN(s.bind_addr, net::chooseBindAddress(id.root, cfg.net.socket_ifname));
    s.sockets_per_peer = cfg.tcp.sockets;
    s.rendezvous_bytes = cfg.tcp.rendezvous_bytes;
    s.heartbeat_ms = cfg.tcp.heartbeat_ms;
    s.spin = cfg.spin;
    s.timeout = cfg.timeout;
    auto t = transport::createTcpTransport(s, *store_);
    if (!t.isOk()) return t.status().withContext(fmt::format("init: rank {}: TCP transport: ", rank_));
    tcp_ = std::move(t.value());
    for (int r : remote) routes[r] = tcp_.get();
  }
  executor_ = std::make_unique<exec::Executor>(rank_, std::move(routes));
  tune::Topology topo{nranks_, static_cast<int>(local.size()) + 1, remote.empty(), {}};
  std::vector<bootstrap::HostIdentity> hosts;
  hosts.reserve(infos.size());
  for (const RankInfo& o : infos) hosts.push_back(o.host);
  topo.host_of = bootstrap::hostIndices(hosts, cfg.net.force_tcp);
  for (const bootstrap::HostIdentity& h : hosts) topo.one_machine = topo.one_machine && h == me.host;
  CHORUS_ASSIGN_OR_RETURN(tune::CostProfile profile, tune::CostProfile::load(cfg.tune.profile_path));
  profile.board_bytes = exec::kBoardBytes;  // the one-shot calls the board runner takes
  auto tuner = tune::Tuner::create(registry_, topo, cfg.tune.algo_spec, cfg.tune.chunk_bytes, std::move(profile));
  if (!tuner.isOk()) return tuner.status();
  tuner_ = std::make_unique<tune::Tuner>(std::move(tuner.value()));
  if (!cfg.trace.dir.empty()) {
    // Ranks in different network namespaces of one machine are different
    // hosts to chorus (TCP between them): their trace names the namespace.
    bool netns_apart = false;
    for (const RankInfo& o : infos)
      netns_apart = netns_apart || (std::strncmp(o.host.hostname, me.host.hostname, sizeof me.host.hostname) == 0 &&
                                    o.host.netns_inode != me.host.netns_inode);
    std::string host_label = me.host.hostname;
    if (netns_apart) host_label += fmt::format("/netns{}", me.host.netns_inode);
    CHORUS_RETURN_IF_ERROR(openTrace(hash64(job_tag + "trace"), host_label));
    // Every trace timestamp is mapped onto rank 0's clock (clock/offset.hpp).
    if (nranks_ > 1) CHORUS_RETURN_IF_ERROR(syncClock(*store_, 32).status());
  }
  // The watchdog's own store connection before the last barrier: once a
  // rank is past "ready" it may finish and close the store (a job with no
  // collective, rank 0 hosting the store), so no rank may still be
  // connecting then (it failed init with "authentication failed: ... closed
  // the connection", seen once under load in Bench.ForcedAlgorithm...).
  // With tracing, the watchdog's thread also re-estimates the clock offset
  // every CHORUS_CLOCK_SYNC_S between probes.
  comm::Health::Resync resync;
  if (trace_ != nullptr && cfg_.trace.clock_sync_s > 0)
    resync = [this](bootstrap::Store& s) { return syncClock(s, 16).isOk(); };
  CHORUS_RETURN_IF_ERROR(health_.startWatchdog(id_, prefix_, std::move(resync),
                                               std::chrono::milliseconds(cfg_.trace.clock_sync_s * 1000LL)));
  return syncAll(*store_, "ready");
}

Status Communicator::openTrace(uint64_t comm_id, const std::string& host) {
  trace::Header h;
  h.rank = rank_;
  h.nranks = nranks_;
  h.pid = static_cast<int32_t>(getpid());
  h.comm_id = comm_id;
  h.open_ns = clock::traceNowNs();
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  h.open_unix_ns = static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  h.host = host;
  auto r = trace::Recorder::open(cfg_.trace.dir, h);
  if (!r.isOk()) return r.status().withContext(fmt::format("rank {}: ", rank_));
  trace_ = std::move(r.value());
  executor_->setRecorder(trace_.get());
  return {};
}

Result<int64_t> Communicator::syncClock(bootstrap::Store& store, int rounds) {
  std::vector<clock::Exchange> xs;
  xs.reserve(static_cast<size_t>(rounds));
  for (int i = 0; i < rounds; ++i) {
    clock::Exchange x;
    x.t1 = clock::traceNowNs();
    CHORUS_ASSIGN_OR_RETURN(int64_t server, store.serverTimeNs());
    x.t4 = clock::traceNowNs();
    x.t2 = x.t3 = server;  // the server stamps once, between receiving and answering
    xs.push_back(x);
  }
  const clock::OffsetEstimate e = clock::estimateOffset(xs);
  clock_offset_ns_.store(e.offset_ns, std::memory_order_relaxed);
  if (trace_) trace_->clock({xs.back().t4, e.offset_ns, e.rtt_ns, e.bound_ns});
  return e.offset_ns;
}

// A store barrier after which the rank that owns the store server (rank 0 of
// the root communicator, and every communicator split from it there) may
// destroy it: the owner also waits until every rank has left the barrier,
// i.e. has read its last reply from the server.
Status Communicator::syncAll(bootstrap::Store& store, std::string_view name) {
  CHORUS_RETURN_IF_ERROR(bootstrap::storeBarrier(store, name, nranks_, cfg_.timeout));
  CHORUS_ASSIGN_OR_RETURN(int64_t left, store.add(fmt::format("{}/left", name), 1));
  if (left == nranks_) return store.set(fmt::format("{}/left-all", name), bootstrap::toBytes(std::string_view("1")));
  if (server_ != nullptr) return store.get(fmt::format("{}/left-all", name), cfg_.timeout).status();
  return {};
}

Communicator::Communicator() : engine_(&Communicator::runQueued, this) {}

Communicator::~Communicator() {
  drain();
  health_.stopWatchdog();
  engine_.stop();
}

// ---- operations ---------------------------------------------------------------

Status Communicator::validateOp(chorusRedOp_t op, chorusDataType_t dtype) const {
  // Exact mode: integers are exact already (a wrapping sum, product, max or
  // min does not depend on the order), so asking for an exact accumulator
  // there is a mistake, and an exact product would need unbounded width.
  if (cfg_.reproducible == Reproducible::Exact) {
    if (!kernels::isFloatType(dtype))
      return invalidArgument("datatype={} under CHORUS_REPRODUCIBLE=exact: exact mode needs a floating-point type "
                             "(supported: chorusFloat32, chorusBfloat16, chorusFloat16, chorusFloat8e4m3, "
                             "chorusFloat8e5m2, chorusFloat64; integer reductions are order-independent already: use "
                             "CHORUS_REPRODUCIBLE=off or canonical)",
                             kernels::isValidDtype(dtype) ? kernels::dtypeName(dtype) : std::string_view("?"));
    if (op == chorusProd)
      return invalidArgument("op=chorusProd under CHORUS_REPRODUCIBLE=exact: exact mode supports chorusSum, chorusAvg, "
                             "PreMulSum ops (exactly summed) and chorusMax, chorusMin (exact already); use "
                             "CHORUS_REPRODUCIBLE=canonical for a reproducible product");
    CHORUS_RETURN_IF_ERROR(kernels::exactLayout(dtype, nranks_).status());
  }
  if (static_cast<int>(op) >= 0 && op < chorusNumOps) return {};
  size_t idx = static_cast<size_t>(op) - chorusNumOps;
  if (static_cast<int>(op) < 0 || idx >= premul_.size() || !premul_[idx].live)
    return invalidArgument("op={} is not a valid reduction op (use chorusSum/Prod/Max/Min/Avg or one made by "
                           "chorusRedOpCreatePreMulSum on this communicator)",
                           static_cast<int>(op));
  if (premul_[idx].scalar.dtype != dtype)
    return invalidArgument("op={} was created for {} but the call uses {}", static_cast<int>(op),
                           kernels::dtypeName(premul_[idx].scalar.dtype), kernels::dtypeName(dtype));
  return {};
}

Result<chorusRedOp_t> Communicator::createPreMulSum(const kernels::Scalar& s, const void* device_scalar) {
  for (size_t i = 0; i < premul_.size(); ++i)
    if (!premul_[i].live) {
      premul_[i] = {s, device_scalar, true};
      return static_cast<chorusRedOp_t>(chorusNumOps + i);
    }
  premul_.push_back({s, device_scalar, true});
  return static_cast<chorusRedOp_t>(chorusNumOps + premul_.size() - 1);
}

Status Communicator::destroyRedOp(chorusRedOp_t op) {
  size_t idx = static_cast<size_t>(op) - chorusNumOps;
  if (op < chorusNumOps || idx >= premul_.size() || !premul_[idx].live)
    return invalidArgument("op={} is not a reduction op created by chorusRedOpCreatePreMulSum", static_cast<int>(op));
  premul_[idx].live = false;
  return {};
}

Communicator::ReproPath Communicator::reproPath(const OpDesc& op) const {
  if (cfg_.reproducible == Reproducible::Off || !op.reduces() || !kernels::isFloatType(op.dtype))
    return ReproPath::Plain;  // integer reductions do not depend on the order
  const bool sums = op.op == chorusSum || op.op == chorusAvg || op.op >= chorusNumOps;
  return cfg_.reproducible == Reproducible::Exact && sums ? ReproPath::Exact : ReproPath::Canonical;
}

// The plan shape of an operation: its collective, counts (exact: in
// accumulator words), canonical mode, the host layout, and whether the call
// is in place (NCCL's aliasing conventions per collective).
plan::Shape Communicator::shapeOf(const OpDesc& op, bool canonical, uint64_t words, size_t es) const {
  plan::Shape sh;
  sh.coll = op.coll;
  sh.nranks = nranks_;
  sh.count = op.count * words;
  sh.elem_size = static_cast<uint32_t>(es);
  sh.canonical = canonical;
  sh.root = op.root;
  sh.counts = op.counts;
  sh.displs = op.displs;
  sh.counts2 = op.counts2;
  sh.displs2 = op.displs2;
  sh.hosts = tuner_->topology().host_of;
  sh.wire = op.wire;
  auto* sp = static_cast<const std::byte*>(op.send);
  auto* rp = static_cast<std::byte*>(op.recv);
  const uint64_t r = static_cast<uint64_t>(rank_);
  switch (op.coll) {
    case Collective::AllGather: sh.inplace = sp != nullptr && sp == rp + r * op.count * es; break;
    case Collective::AllGatherV: sh.inplace = sp != nullptr && sp == rp + op.displs[r] * es; break;
    case Collective::ReduceScatter: sh.inplace = rp != nullptr && rp == sp + r * op.count * es; break;
    case Collective::Gather: sh.inplace = rank_ == op.root && sp != nullptr && sp == rp + r * op.count * es; break;
    case Collective::Scatter: sh.inplace = rank_ == op.root && rp != nullptr && rp == sp + r * op.count * es; break;
    case Collective::Barrier: break;
    default: sh.inplace = !op.pointToPoint() && sp != nullptr && sp == rp; break;
  }
  return sh;
}

// The plan and this rank's program for job i: the last call's again when this
// one equals it (no tuner or cache lookup), else the tuner's choice (under
// canonical, a plan that combines in the canonical tree), its program from the
// cache or expanded into it; v-collectives are expanded per call.
Result<const plan::Program*> Communicator::programFor(const OpDesc& op, size_t i, plan::Shape& sh, ReproPath path,
                                                      chorusDataType_t plan_dtype, const plan::Algorithm** algo_out) {
  const size_t es = sh.elem_size;
  const plan::Algorithm* algo = nullptr;
  uint64_t chunk = 0;
  const bool v = op.coll == Collective::AllGatherV || op.coll == Collective::AllToAllV;
  const plan::Program* prog = nullptr;
  const bool memo = !v && i == 0;
  if (memo && last_.valid && last_.dtype == op.dtype && last_.path == static_cast<uint8_t>(path) &&
      last_.key.coll == static_cast<uint8_t>(op.coll) && last_.key.inplace == sh.inplace &&
      last_.key.kind == op.kind && last_.key.elem_size == es && last_.key.root == op.root &&
      last_.key.peer == op.peer && last_.key.count == sh.count && last_.key.wire == wireKey(sh.wire)) {
    algo = last_.key.algo;
    chunk = last_.key.chunk;
    sh.chunk_elems = chunk;
    prog = last_.prog;
  } else if (!op.pointToPoint()) {
    CHORUS_ASSIGN_OR_RETURN(tune::Choice ch, tuner_->choose(sh, plan_dtype));
    // Canonical: the tuner's plan when it combines in the canonical tree,
    // else the canonical plan of the collective (docs/algorithms.md).
    algo = sh.canonical ? plan::canonicalPlanFor(ch.algo, sh) : ch.algo;
    chunk = es ? std::max<uint64_t>(1, ch.chunk_bytes / es) : 0;
    sh.chunk_elems = chunk;
  }
  *algo_out = algo;
  if (prog != nullptr) return prog;  // memoised above
  auto build = [&](plan::Program* out) {
    if (op.pointToPoint()) {
      plan::ProgramBuilder b;
      b.reset(rank_);
      if (op.kind == OpKind::Send)
        b.send(op.peer, plan::in(0, op.count));
      else
        b.recv(op.peer, plan::out(0, op.count));
      b.finish(out);
    } else {
      plan::expand(*algo, sh, rank_, out);
    }
  };
  if (v) {
    if (uncached_.size() <= i) uncached_.resize(i + 1);
    if (!uncached_[i]) uncached_[i] = std::make_unique<plan::Program>();
    build(uncached_[i].get());
    return uncached_[i].get();
  }
  CacheKey key{static_cast<uint8_t>(op.coll), sh.inplace, op.kind, static_cast<uint32_t>(es), op.root, op.peer,
               sh.count, chunk, algo, sh.canonical, wireKey(sh.wire)};
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    auto p = std::make_unique<plan::Program>();
    build(p.get());
    it = cache_.emplace(key, std::move(p)).first;
  }
  prog = it->second.get();
  if (memo) last_ = {key, op.dtype, true, prog, static_cast<uint8_t>(path)};
  return prog;
}

// PreMulSum scales the input first: in place when the input is the output
// itself (`stage` false), else into job i's staging buffer.  Returns the
// input the plan reads.
const std::byte* Communicator::premulInput(const OpDesc& op, size_t i, uint64_t n_in, bool stage) {
  auto* sp = static_cast<const std::byte*>(op.send);
  auto* rp = static_cast<std::byte*>(op.recv);
  const PreMulSumOp& pm = premul_[static_cast<size_t>(op.op) - chorusNumOps];
  kernels::Scalar s = pm.scalar;
  if (pm.device_scalar) std::memcpy(s.bytes, pm.device_scalar, kernels::dtypeSize(op.dtype));  // es: exact's words
  if (!stage) {
    kernels::scale(rp, rp, n_in, op.dtype, s);
    return sp;
  }
  if (staging_.size() <= i) staging_.resize(i + 1);
  const size_t ues = kernels::dtypeSize(op.dtype);
  if (staging_[i].size() < n_in * ues) staging_[i].resize(n_in * ues);
  kernels::scale(staging_[i].data(), sp, n_in, op.dtype, s);
  return staging_[i].data();
}

// CHORUS_TRACE: job i's algorithm name and the tuner's prediction for it
// (memoised per program).
void Communicator::traceJob(const OpDesc& op, size_t i, const plan::Algorithm* algo, const plan::Program* prog,
                            const plan::Shape& sh) {
  if (trace_algo_.size() <= i) {
    trace_algo_.resize(i + 1);
    trace_pred_.resize(i + 1);
  }
  trace_algo_[i] = trace_->algoId(algo ? algo->name() : plan::pointToPointName(op.direction()));
  trace_pred_[i] = -1;
  const bool v = op.coll == Collective::AllGatherV || op.coll == Collective::AllToAllV;
  if (algo != nullptr && !v) {
    auto [it, fresh] = trace_pred_cache_.try_emplace(prog, -1);
    if (fresh) {
      auto t = tuner_->price(*algo, sh, op.dtype);
      if (t.isOk()) it->second = static_cast<int64_t>(t.value() * 1e9);
    }
    trace_pred_[i] = it->second;
  }
}

// Job i of the batch: its shape, plan and program, its buffers (PreMulSum's
// scaled input, exact's accumulators), reducer and executor job.
Status Communicator::prepare(OpDesc& op, size_t i) {
  const ReproPath path = reproPath(op);
  if (exact_.size() <= i) exact_.resize(i + 1);
  ExactJob& ex = exact_[i];
  ex.on = path == ReproPath::Exact;
  // Exact: the plan moves and sums the accumulators' int64 words.
  if (ex.on) {
    CHORUS_ASSIGN_OR_RETURN(ex.layout, exactLayoutFor(op));
  }
  const uint64_t words = ex.on ? static_cast<uint64_t>(ex.layout.words) : 1;
  const chorusDataType_t plan_dtype = ex.on ? chorusInt64 : op.dtype;
  const size_t es = kernels::dtypeSize(plan_dtype);
  plan::Shape sh = shapeOf(op, path == ReproPath::Canonical, words, es);
  auto* sp = static_cast<const std::byte*>(op.send);
  auto* rp = static_cast<std::byte*>(op.recv);
  // PreMulSum stages its scaled input unless the input is the output itself,
  // which makes the call out of place; exact has separate accumulators in and out.
  const bool premul = op.op >= chorusNumOps && op.reduces();
  const bool stage = premul && !(sh.inplace && sp == rp);
  if (stage || ex.on) sh.inplace = false;
  const plan::Algorithm* algo = nullptr;
  CHORUS_ASSIGN_OR_RETURN(const plan::Program* prog, programFor(op, i, sh, path, plan_dtype, &algo));

  const std::byte* input = premul ? premulInput(op, i, sh.inputElems(rank_) / words, stage) : sp;
  job_bufs_[i] = {const_cast<std::byte*>(input), rp, nullptr};
  if (ex.on) {
    // In place too, `input` is the whole input (the output lies in it).
    bindExact(i, input, sh.inputElems(rank_) / words, sh.outputElems(rank_) / words);
  }
  if (const kernels::BinOp bop = ex.on ? kernels::BinOp::Sum : binOpOf(op.op);
      !reducers_[i].valid() || reducers_[i].dtype() != plan_dtype || reducers_[i].op() != bop)
    reducers_[i] = kernels::Reducer(plan_dtype, bop);
  jobs_[i] = exec::Job{prog, {}, es ? es : 1, &reducers_[i], op.trace_seq,
                       op.pointToPoint() ? comm::kPointToPointWire : batch_wire_};
  if (trace_) traceJob(op, i, algo, prog, sh);
  scratch_offsets_[i] = prog->scratch_elems * (es ? es : 1) + prog->wire_bytes;  // wire bytes after the scratch
  // Whether job 0 runs through the board: decided once per program (a
  // cached program stands for one algorithm and shape; the v-collectives'
  // reused ones never take the board).
  if (i == 0 && prog != board_decided_) {
    board_decided_ = prog;
    board_prog_ = board_.runner() != nullptr && algo != nullptr && algo->oneShot() &&
                          exec::boardBytes(sh) <= exec::kBoardBytes
                      ? board_.runner()->programFor(*algo, sh, *prog, es ? es : 1)
                      : nullptr;
  }
  return {};
}

// The accumulator layout of an exact call: the ranks first agree on the
// exponents their inputs span (a max-allreduce of two integers, run here
// before the call's own plan, in the same order on every rank), so the
// accumulator carries only those bits.  PreMulSum's inputs are scaled later
// (prepare): it takes the type's full layout.
Result<kernels::ExactLayout> Communicator::exactLayoutFor(const OpDesc& op) {
  if (op.op >= chorusNumOps) return kernels::exactLayout(op.dtype, nranks_);  // validateOp checked it
  const uint64_t in_elems = op.coll == Collective::ReduceScatter ? op.count * static_cast<uint64_t>(nranks_) : op.count;
  std::array<int64_t, 2> range{};  // {hi, -lo}: both agreed by max
  kernels::exactRange(op.dtype, op.send, in_elems, &range[0], &range[1]);
  if (nranks_ > 1) {
    if (range_prog_.steps.empty()) {
      plan::Shape sh;
      sh.coll = Collective::AllReduce;
      sh.nranks = nranks_;
      sh.count = 2;
      sh.elem_size = 8;
      sh.inplace = true;
      sh.hosts = tuner_->topology().host_of;
      CHORUS_ASSIGN_OR_RETURN(tune::Choice ch, tuner_->choose(sh, chorusInt64));
      plan::expand(*ch.algo, sh, rank_, &range_prog_);
      range_reducer_ = kernels::Reducer(chorusInt64, kernels::BinOp::Max);
    }
    range_scratch_.resize(range_prog_.scratch_elems * 8);
    auto* buf = reinterpret_cast<std::byte*>(range.data());
    std::array<std::byte*, 3> bufs = {buf, buf, range_scratch_.data()};
    // Traced as a step of the call's own number, like a signature check's.
    exec::Job job{&range_prog_, bufs, 8, &range_reducer_, (uint64_t{1} << 62) | op.trace_seq, batch_wire_};
    CHORUS_RETURN_IF_ERROR(executor_->run(std::span<const exec::Job>(&job, 1), cfg_.timeout));
  }
  return kernels::exactLayout(op.dtype, nranks_, -range[1], range[0]);
}

void Communicator::bindExact(size_t i, const std::byte* input, uint64_t in_elems, uint64_t out_elems) {
  ExactJob& ex = exact_[i];
  const size_t w = static_cast<size_t>(ex.layout.words);
  ex.in.resize(in_elems * w);
  ex.out.resize(out_elems * w);
  ex.out_elems = out_elems;
  kernels::toExact(ex.layout, ex.in.data(), input, in_elems);
  job_bufs_[i] = {reinterpret_cast<std::byte*>(ex.in.data()), reinterpret_cast<std::byte*>(ex.out.data()), nullptr};
}

void Communicator::finishExact(size_t i, const OpDesc& op) {
  const ExactJob& ex = exact_[i];
  if (!ex.on || ex.out_elems == 0) return;
  kernels::fromExact(ex.layout, op.recv, ex.out.data(), ex.out_elems);
}

Status Communicator::execute(std::span<OpDesc> ops) {
  if (trace_) batch_start_ns_ = clock::traceNowNs();  // the rank's arrival
  // Always on: the batch's signature travels in every message header and
  // board slot (call_signature.hpp); CHORUS_CHECK (and the first call) also
  // exchange it whole before moving any data.
  // A loop of equal calls (the common case) hashes its signature once.
  static const OpDesc kNone{};
  const OpDesc& o0 = ops.empty() ? kNone : ops.front();
  const bool same = ops.size() == 1 && last_shape_.valid && !o0.pointToPoint() && o0.coll == last_shape_.coll &&
                    o0.count == last_shape_.count && o0.dtype == last_shape_.dtype && o0.op == last_shape_.op &&
                    o0.root == last_shape_.root;
  if (same) {
    batch_sig_.seq = op_seq_;
  } else {
    batch_sig_ = signatureOf(ops, op_seq_);
    wire_base_ = comm::wireBase(batch_sig_);
    board_base_ = comm::boardBase(batch_sig_);
    last_shape_.valid = ops.size() == 1 && !o0.pointToPoint() && o0.coll != Collective::AllGatherV &&
                        o0.coll != Collective::AllToAllV;
    last_shape_.coll = o0.coll;
    last_shape_.count = o0.count;
    last_shape_.dtype = o0.dtype;
    last_shape_.op = o0.op;
    last_shape_.root = o0.root;
  }
  batch_wire_ = comm::wireAt(wire_base_, op_seq_);
  if (health_.wantsCheck()) {
    bool broke = false;
    if (Status st = health_.checkSignatures(batch_sig_, op_seq_, *executor_, registry_, &broke); !st.isOk())
      return broke ? fail(st) : st;
  }
  const uint64_t first_seq = op_seq_;
  const FlightEntry stuck = health_.begin(ops, &op_seq_, &p2p_seq_);
  Status st = executeBatch(ops);
  const bool breaks = !st.isOk() && st.code() != chorusInvalidArgument && st.code() != chorusInvalidUsage;
  st = health_.conclude(std::move(st), breaks, first_seq, op_seq_, stuck);
  if (breaks) {
    st = fail(st);
    health_.dumpFlight();
  }
  return st;
}

Status Communicator::executeBatch(std::span<OpDesc> ops) {
  const size_t n = ops.size();
  jobs_.resize(n);
  job_bufs_.resize(n);
  reducers_.resize(n);
  scratch_offsets_.resize(n);

  // Sends to and receives from self are matched in issue order and copied.
  std::vector<size_t> self_sends, self_recvs;
  for (size_t i = 0; i < n; ++i) {
    if (ops[i].pointToPoint() && ops[i].peer == rank_) (ops[i].kind == OpKind::Send ? self_sends : self_recvs).push_back(i);
  }
  if (self_sends.size() != self_recvs.size())
    return invalidUsage("rank {}: {} send(s) to self but {} receive(s) from self in one group (each needs its twin)",
                        rank_, self_sends.size(), self_recvs.size());
  for (size_t k = 0; k < self_sends.size(); ++k) {
    const OpDesc& s = ops[self_sends[k]];
    const OpDesc& r = ops[self_recvs[k]];
    const size_t sb = s.count * kernels::dtypeSize(s.dtype), rb = r.count * kernels::dtypeSize(r.dtype);
    if (sb != rb) return makeError(chorusMismatch, "rank {}: send to self of {} bytes but receive from self of {} bytes", rank_, sb, rb);
    if (sb) std::memmove(r.recv, s.send, sb);
  }

  size_t njobs = 0;
  for (size_t i = 0; i < n; ++i) {
    if (ops[i].pointToPoint() && ops[i].peer == rank_) continue;
    if (njobs != i) ops[njobs] = ops[i];  // compact: jobs_ index == ops index
    CHORUS_RETURN_IF_ERROR(prepare(ops[njobs], njobs));
    ++njobs;
  }
  jobs_.resize(njobs);
  Status st;
  if (njobs == 1 && board_prog_ != nullptr) {  // the runner's scratch, if the program needs any
    jobs_[0].buffers = job_bufs_[0];
    st = board_.run(*board_prog_, jobs_[0], batch_sig_, board_base_);
  } else {
    // On one host every collective call publishes its signature on the
    // board, so a rank whose call runs through the board (a small one)
    // notices a peer that is in another call here.
    if (board_.on() && batch_sig_.nops > 0) CHORUS_RETURN_IF_ERROR(board_.announce(batch_sig_, board_base_));
    size_t total = 0;
    for (size_t i = 0; i < njobs; ++i) {
      size_t need = (scratch_offsets_[i] + 63) & ~size_t{63};
      scratch_offsets_[i] = total;
      total += need;
    }
    if (scratch_.size() < total) scratch_.resize(total);
    for (size_t i = 0; i < njobs; ++i) {
      job_bufs_[i][2] = scratch_.data() + scratch_offsets_[i];
      jobs_[i].buffers = job_bufs_[i];
      jobs_[i].wire = job_bufs_[i][2] + jobs_[i].program->scratch_elems * jobs_[i].elem_size;
    }
    st = executor_->run(jobs_, cfg_.timeout);
  }
  if (trace_) traceOps(ops, njobs, batch_start_ns_, st.isOk());
  if (!st.isOk()) return st;  // execute() explains and breaks the communicator

  // Exact: round the accumulators once into the outputs.
  for (size_t i = 0; i < njobs; ++i) finishExact(i, ops[i]);
  // Avg: the sum divided by the number of ranks, where the result lives.
  for (size_t i = 0; i < njobs; ++i) {
    const OpDesc& op = ops[i];
    if (op.op != chorusAvg || !op.reduces()) continue;
    if (op.coll == Collective::Reduce && rank_ != op.root) continue;
    kernels::divide(op.recv, op.recv, op.count, op.dtype, static_cast<uint64_t>(nranks_));
  }
  return {};
}

// The batch's operations in the trace: one record each, with the batch's
// start (the rank's arrival) and end.
void Communicator::traceOps(std::span<const OpDesc> ops, size_t n, int64_t start_ns, bool ok) {
  const int64_t end_ns = clock::traceNowNs();
  for (size_t i = 0; i < n; ++i) {
    const OpDesc& o = ops[i];
    trace::OpRecord r;
    r.seq = o.trace_seq;
    r.coll = o.kind == OpKind::Send   ? trace::kOpSend
             : o.kind == OpKind::Recv ? trace::kOpRecv
                                      : static_cast<uint8_t>(o.coll);
    r.dtype = static_cast<uint8_t>(o.dtype);
    r.algo = trace_algo_[i];
    r.ok = ok ? 1 : 0;
    if (o.pointToPoint())
      r.peer = o.peer;
    else
      r.root = o.root;
    r.count = o.count;
    r.bytes = trace::algBytes(r.coll, o.count, kernels::dtypeSize(o.dtype), nranks_, o.counts);
    r.enqueue_ns = o.enqueue_ns ? o.enqueue_ns : start_ns;
    r.start_ns = start_ns;
    r.end_ns = end_ns;
    r.predicted_ns = trace_pred_[i];
    trace_->op(r);
  }
  if (!ok) trace_->flush();
}

// An error in the middle of moving data leaves peers mid-message: the
// communicator is broken for good.  Its transports are aborted so that the
// peers learn it now (and fail) instead of waiting for messages that will not
// come or reading buffers that are about to be freed.
Status Communicator::fail(Status st) {
  if (st.isOk()) return st;
  {
    std::lock_guard l(err_mu_);
    if (!error_.isOk()) return st;
    error_ = st;
    broken_.store(true, std::memory_order_release);
  }
  if (shm_) shm_->abort(st);
  if (tcp_) {
    tcp_->abort(st);
    // We are the executing thread: let the transport act on it now (it tells
    // its peers why and closes), not at the next call that may never come.
    (void)tcp_->poll();
  }
  return st;
}

Status Communicator::asyncError() const {
  std::lock_guard l(err_mu_);
  return error_;
}

void Communicator::abort(const Status& why) {
  {
    std::lock_guard l(err_mu_);
    if (error_.isOk()) error_ = why;
    broken_.store(true, std::memory_order_release);
  }
  if (executor_) executor_->abort();
  if (shm_) shm_->abort(why);
  if (tcp_) tcp_->abort(why);
  engine_.wake();
}

Status Communicator::submitOne(OpDesc& op, exec::Stream* stream) {
  if (trace_) op.enqueue_ns = clock::traceNowNs();
  if (stream == nullptr && !broken_.load(std::memory_order_acquire)) {
    Status st;
    if (engine_.tryRunHere([&] { return execute(std::span<OpDesc>(&op, 1)); }, &st)) return st;
  }
  std::vector<OpDesc> ops;
  ops.push_back(op);
  return submit(std::move(ops), stream);
}

Status Communicator::submit(std::vector<OpDesc> ops, exec::Stream* stream) {
  if (broken_.load(std::memory_order_acquire)) return asyncError();
  if (trace_) {
    const int64_t now = clock::traceNowNs();
    for (OpDesc& o : ops)
      if (o.enqueue_ns == 0) o.enqueue_ns = now;
  }
  if (stream != nullptr) {
    engine_.enqueue(std::move(ops), stream);
    return {};
  }
  return engine_.runOrWait(ops, [&] { return execute(ops); });
}

Status Communicator::runQueued(void* self, std::span<OpDesc> ops) {
  auto* c = static_cast<Communicator*>(self);
  return c->broken_.load(std::memory_order_acquire) ? c->asyncError() : c->execute(ops);
}

void Communicator::drain() { engine_.drain(); }

Result<Communicator::Prediction> Communicator::predict(plan::Collective coll, size_t count, chorusDataType_t dtype,
                                                     bool inplace) {
  if (coll == Collective::AllGatherV || coll == Collective::AllToAllV)
    return invalidArgument("predict: {} is not priced (the v-collectives depend on every rank's counts)",
                           plan::collectiveName(coll));
  plan::Shape sh;
  sh.coll = coll;
  sh.nranks = nranks_;
  sh.count = count;
  sh.elem_size = static_cast<uint32_t>(kernels::dtypeSize(dtype));
  sh.inplace = inplace;
  sh.hosts = tuner_->topology().host_of;
  // Serialised with execution: the tuner belongs to the executing thread.
  return engine_.whileIdle([&]() -> Result<Prediction> {
    CHORUS_ASSIGN_OR_RETURN(tune::Choice ch, tuner_->choose(sh, dtype));
    sh.chunk_elems = sh.elem_size ? std::max<uint64_t>(1, ch.chunk_bytes / sh.elem_size) : 0;
    // Canonical mode runs a canonical plan for float reductions (prepare()).
    sh.canonical = cfg_.reproducible == Reproducible::Canonical && plan::reduces(coll) && kernels::isFloatType(dtype);
    const plan::Algorithm* algo = sh.canonical ? plan::canonicalPlanFor(ch.algo, sh) : ch.algo;
    CHORUS_ASSIGN_OR_RETURN(double t, tuner_->price(*algo, sh, dtype));
    return Prediction{std::string(algo->name()), t};
  });
}

Status Communicator::setAlgorithms(std::string_view spec) {
  return engine_.whileIdle([&]() -> Status {
    auto t = tune::Tuner::create(registry_, tuner_->topology(), spec, cfg_.tune.chunk_bytes, tuner_->profile());
    if (!t.isOk()) return t.status();
    *tuner_ = std::move(t.value());
    last_.valid = false;  // the memo holds the previous choice
    cfg_.tune.algo_spec = std::string(spec);  // communicators split from this one inherit it
    return {};
  });
}

// ---- shrink -------------------------------------------------------------------

// Agreement through the store, which every survivor can still reach: the
// first rank to arrive leads; it waits until every rank not known to be dead
// has joined, or the window passes, and publishes the members; everyone takes
// that list, so all survivors agree even if they noticed the failure at
// different times.  A latecomer finds itself missing and fails.
Result<std::unique_ptr<Communicator>> Communicator::shrink(std::chrono::milliseconds window) {
  const int epoch = shrink_seq_++;
  const std::string base = fmt::format("shrink{}/", epoch);
  CHORUS_ASSIGN_OR_RETURN(int64_t order, store_->add(base + "count", 1));
  CHORUS_RETURN_IF_ERROR(store_->set(fmt::format("{}alive/{}", base, rank_), bootstrap::toBytes(std::string_view("1"))));
  if (order == 1) {
    // The leader: wait for the others, within the window.
    const auto deadline = std::chrono::steady_clock::now() + window;
    std::string members;
    for (int r = 0; r < nranks_; ++r) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      auto got = store_->get(fmt::format("{}alive/{}", base, r), std::max(left, std::chrono::milliseconds(1)));
      if (got.isOk()) members += fmt::format("{}{}", members.empty() ? "" : ",", r);
    }
    CHORUS_RETURN_IF_ERROR(store_->set(base + "members", bootstrap::toBytes(members)));
  }
  CHORUS_ASSIGN_OR_RETURN(bootstrap::Bytes list, store_->get(base + "members", window * 2 + cfg_.timeout));
  std::vector<int> members;
  for (size_t i = 0; i < list.size();) {
    size_t j = i;
    int v = 0;
    while (j < list.size() && static_cast<char>(list[j]) != ',') v = v * 10 + (static_cast<char>(list[j++]) - '0');
    members.push_back(v);
    i = j + 1;
  }
  auto me = std::find(members.begin(), members.end(), rank_);
  if (me == members.end())
    return makeError(chorusRemoteError,
                     "rank {}: shrink #{}: the surviving ranks agreed on {} without this rank (it joined after the "
                     "agreement window; CHORUS_SHRINK_WINDOW_MS={})",
                     rank_, epoch, bootstrap::toString(list), window.count());
  std::unique_ptr<Communicator> c(new Communicator());
  c->nranks_ = static_cast<int>(members.size());
  c->rank_ = static_cast<int>(me - members.begin());
  CHORUS_RETURN_IF_ERROR(c->setup(id_, cfg_, base_store_, prefix_ + base, server_));
  return c;
}

// ---- split --------------------------------------------------------------------

Result<std::unique_ptr<Communicator>> Communicator::split(int color, int key, const Config* cfg) {
  std::vector<int32_t> all(3 * static_cast<size_t>(nranks_));
  int32_t mine[3] = {color < 0 ? -1 : color, key, rank_};
  OpDesc op;
  op.coll = Collective::AllGather;
  op.send = mine;
  op.recv = all.data();
  op.count = 3;
  op.dtype = chorusInt32;
  CHORUS_RETURN_IF_ERROR(submitOne(op, nullptr));
  const int seq = split_seq_++;
  // Every rank of the parent waits for every new communicator's set-up (they
  // use the parent's store, which the parent's rank 0 may hold).
  const std::string done = fmt::format("split{}-done", seq);
  if (color < 0) {
    CHORUS_RETURN_IF_ERROR(syncAll(*store_, done));
    return std::unique_ptr<Communicator>();
  }
  std::vector<std::pair<int, int>> members;  // (key, parent rank)
  for (int r = 0; r < nranks_; ++r)
    if (all[3 * r] == color) members.push_back({all[3 * r + 1], all[3 * r + 2]});
  std::sort(members.begin(), members.end());
  std::unique_ptr<Communicator> c(new Communicator());
  c->nranks_ = static_cast<int>(members.size());
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].second == rank_) c->rank_ = static_cast<int>(i);
  CHORUS_RETURN_IF_ERROR(c->setup(id_, cfg != nullptr ? *cfg : cfg_, base_store_,
                                  prefix_ + fmt::format("s{}c{}/", seq, color), server_));
  CHORUS_RETURN_IF_ERROR(syncAll(*store_, done));
  return c;
}

}  // namespace chorus
