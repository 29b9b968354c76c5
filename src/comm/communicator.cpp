#include "comm/communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <mutex>

#include "clock/offset.hpp"
#include "comm/wiring.hpp"
#include "common/dtype.hpp"
#include "plan/canonical.hpp"
#include "plan/plan_file.hpp"

namespace chorus {

using plan::Collective;

Result<std::unique_ptr<Communicator>> Communicator::init(int nranks, int rank, const bootstrap::UniqueId& id,
                                                         const Config& cfg, std::string_view prefix,
                                                         bool shared_server) {
  // The plans first: a plan file that fails its proof fails every rank
  // here, with the verifier's counter-example, before any rank waits for
  // another at the rendezvous (every rank reads the same files).
  CHORUS_ASSIGN_OR_RETURN(plan::Registry plans, plan::Registry::withPlans(cfg.tune.plan_paths));
  CHORUS_RETURN_IF_ERROR(plan::loadAlgoFiles(plans, cfg.tune.algo_spec));  // CHORUS_ALGO's coll:file:PATH
  CHORUS_ASSIGN_OR_RETURN(comm::Rendezvous rv, comm::joinRendezvous(rank, id, cfg, shared_server));
  std::unique_ptr<Communicator> c(new Communicator());
  c->rank_ = rank;
  c->nranks_ = nranks;
  c->registry_ = std::move(plans);
  c->registry_loaded_ = true;
  CHORUS_RETURN_IF_ERROR(c->setup(id, cfg, std::move(rv.store), std::string(prefix), std::move(rv.server)));
  return c;
}

std::string Communicator::routeKey() const {
  return tuner_ ? tune::routeKey(tuner_->topology().host_of, tuner_->topology().links) : std::string("shm");
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
  if (!registry_loaded_) {
    CHORUS_ASSIGN_OR_RETURN(registry_, plan::Registry::withPlans(cfg.tune.plan_paths));
  }
  CHORUS_RETURN_IF_ERROR(plan::loadAlgoFiles(registry_, cfg.tune.algo_spec));  // none left to load after init's
  registry_loaded_ = true;
  health_.bind(rank_, nranks_, cfg, store_.get());
  CHORUS_RETURN_IF_ERROR(comm::Health::makeFlightDir(cfg.flight.dir));
  CHORUS_ASSIGN_OR_RETURN(comm::Wiring w, comm::wire(rank_, nranks_, id, cfg, base, *store_, prefix_, server_.get()));
  transports_ = std::move(w.transports);
  transport_names_ = std::move(w.transport_names);
  board_.attach(rank_, nranks_, w.board, cfg.timeout);
  executor_ = std::make_unique<exec::Executor>(rank_, std::move(w.routes));
  CHORUS_ASSIGN_OR_RETURN(tune::CostProfile profile, tune::CostProfile::load(cfg.tune.profile_path));
  profile.board_bytes = exec::kBoardBytes;  // the one-shot calls the board runner takes
  auto tuner = tune::Tuner::create(registry_, w.topology, cfg.tune.algo_spec, cfg.tune.chunk_bytes, std::move(profile));
  if (!tuner.isOk()) return tuner.status();
  tuner_ = std::make_unique<tune::Tuner>(std::move(tuner.value()));
  if (!cfg.trace.dir.empty()) {
    CHORUS_RETURN_IF_ERROR(tracing_.open(cfg.trace.dir, rank_, nranks_, w.trace_id, w.host_label));
    executor_->setRecorder(tracing_.recorder());
    // Every trace timestamp is mapped onto rank 0's clock (clock/offset.hpp).
    if (nranks_ > 1) CHORUS_RETURN_IF_ERROR(syncClock(*store_, 32).status());
  }
  planner_.bind(rank_, nranks_, cfg_, tuner_.get(), executor_.get(), board_.runner(), tracing_.recorder());
  // The watchdog's own store connection before the last barrier: once a
  // rank is past "ready" it may finish and close the store (a job with no
  // collective, rank 0 hosting the store), so no rank may still be
  // connecting then (it failed init with "authentication failed: ... closed
  // the connection", seen once under load in Bench.ForcedAlgorithm...).
  // With tracing, the watchdog's thread also re-estimates the clock offset
  // every CHORUS_CLOCK_SYNC_S between probes.
  comm::Health::Resync resync;
  if (tracing_.on() && cfg_.trace.clock_sync_s > 0)
    resync = [this](bootstrap::Store& s) { return syncClock(s, 16).isOk(); };
  // A revoke notice another rank posted (chorusCommRevoke) breaks this
  // communicator too; the watchdog reads it while parked on the store.
  auto on_revoke = [this](int by) {
    abort(makeError(chorusRevoked, "rank {}: the communicator was revoked by rank {} (chorusCommRevoke)", rank_, by));
  };
  CHORUS_RETURN_IF_ERROR(health_.startWatchdog(id_, prefix_, std::move(resync),
                                               std::chrono::milliseconds(cfg_.trace.clock_sync_s * 1000LL),
                                               std::move(on_revoke)));
  return syncAll(*store_, "ready");
}

Result<int64_t> Communicator::syncClock(bootstrap::Store& store, int rounds) {
  return tracing_.syncClock(store, rounds);
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
  return planner_.validateOp(op, dtype);
}

Result<chorusRedOp_t> Communicator::createPreMulSum(const Scalar& s, const void* device_scalar) {
  return planner_.createPreMulSum(s, device_scalar);
}

Status Communicator::destroyRedOp(chorusRedOp_t op) { return planner_.destroyRedOp(op); }

Status Communicator::execute(std::span<OpDesc> ops) {
  if (tracing_.on()) tracing_.batchStarted();
  // Always on: the batch's signature travels in every message header and
  // board slot (call_signature.hpp); CHORUS_CHECK (and the first call) also
  // exchange it whole before moving any data.
  planner_.sign(ops, op_seq_);
  if (health_.wantsCheck()) {
    bool broke = false;
    if (Status st = health_.checkSignatures(planner_.signature(), op_seq_, *executor_, registry_, &broke); !st.isOk())
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

// The batch's jobs, bound by the planner, through the board when the batch
// is one call the board runner takes, else through the executor.
Status Communicator::executeBatch(std::span<OpDesc> ops) {
  size_t njobs = 0;
  CHORUS_RETURN_IF_ERROR(planner_.bindBatch(ops, &njobs));
  Status st;
  if (const exec::BoardProgram* bp = planner_.boardProgram(njobs)) {
    st = board_.run(*bp, planner_.boardJob(), planner_.signature(), planner_.boardBase());
  } else {
    if (board_.on() && planner_.signature().nops > 0)
      CHORUS_RETURN_IF_ERROR(board_.announce(planner_.signature(), planner_.boardBase()));
    st = executor_->run(planner_.layoutJobs(), cfg_.timeout);
  }
  if (tracing_.on()) tracing_.batchEnded(ops, njobs, planner_, nranks_, st.isOk());
  return st;  // an error: execute() explains and breaks the communicator
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
  for (const auto& t : transports_) {
    t->abort(st);
    // We are the executing thread: let the transport act on it now (TCP
    // tells its peers why and closes), not at the next call that may never come.
    (void)t->poll();
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
  for (const auto& t : transports_) t->abort(why);
  engine_.wake();
}

Status Communicator::submitOne(OpDesc& op, exec::Stream* stream) {
  if (tracing_.on()) op.enqueue_ns = clock::traceNowNs();
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
  if (tracing_.on()) {
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
                                                     bool inplace, const std::optional<WireFormat>& wire) {
  if (plan::variable(coll))
    return invalidArgument("predict: {} is not priced (the v-collectives depend on every rank's counts)",
                           plan::collectiveName(coll));
  // Serialised with execution: the tuner belongs to the executing thread.
  return engine_.whileIdle([&]() -> Result<Prediction> {
    const plan::Algorithm* algo = nullptr;
    CHORUS_ASSIGN_OR_RETURN(double t, planner_.predict(coll, count, dtype, inplace, wire, &algo));
    return Prediction{std::string(algo->name()), t};
  });
}

Status Communicator::setAlgorithms(std::string_view spec) {
  return engine_.whileIdle([&]() -> Status {
    CHORUS_RETURN_IF_ERROR(plan::loadAlgoFiles(registry_, spec));
    auto t = tune::Tuner::create(registry_, tuner_->topology(), spec, cfg_.tune.chunk_bytes, tuner_->profile());
    if (!t.isOk()) return t.status();
    *tuner_ = std::move(t.value());
    planner_.forgetChoice();  // the memo holds the previous choice
    cfg_.tune.algo_spec = std::string(spec);  // communicators split from this one inherit it
    return {};
  });
}

// ---- shrink -------------------------------------------------------------------

Result<std::vector<int>> parseMemberList(std::span<const std::byte> list, int nranks) {
  std::string_view text(reinterpret_cast<const char*>(list.data()), list.size());
  std::vector<int> members;
  if (text.empty()) return remoteError("empty (no surviving rank)");
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string_view::npos) j = text.size();
    std::string_view field = text.substr(i, j - i);
    int v = -1;
    auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
    if (field.empty() || field.size() > 10 || ec != std::errc() || end != field.data() + field.size() || v < 0 ||
        v >= nranks)
      return remoteError("'{}' is not a rank of 0..{} (field {})", field.substr(0, 16), nranks - 1, members.size());
    if (!members.empty() && v <= members.back())
      return remoteError("rank {} after rank {}: the list must be strictly increasing", v, members.back());
    members.push_back(v);
    i = j + 1;
  }
  return members;
}

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
  auto parsed = parseMemberList(list, nranks_);
  if (!parsed.isOk())
    return parsed.status().withContext(fmt::format("rank {}: shrink #{}: the store's member list: ", rank_, epoch));
  std::vector<int> members = std::move(*parsed);
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

// ---- revoke and grow ----------------------------------------------------------

// Local first (prompt even when the store is unreachable), then the notice
// that the other ranks' watchdogs are parked on: the next probe number
// (comm/health.cpp) with the value "revoke <rank>".
void Communicator::revoke() {
  abort(makeError(chorusRevoked, "rank {}: the communicator was revoked by rank {} (chorusCommRevoke)", rank_, rank_));
  auto k = store_->add("probe-count", 1);
  if (!k.isOk()) {
    log::warn("rank {}: revoke: cannot tell the other ranks through the store: {}", rank_, k.status().message());
    return;
  }
  if (Status st = store_->set(fmt::format("probe/{}", *k - 1), bootstrap::toBytes(fmt::format("revoke {}", rank_)));
      !st.isOk())
    log::warn("rank {}: revoke: cannot tell the other ranks through the store: {}", rank_, st.message());
}

std::string encodeGrowOffer(const GrowOffer& o) { return fmt::format("v1 {} {} {}", o.size, o.rank, o.prefix); }

Result<GrowOffer> parseGrowOffer(std::span<const std::byte> bytes) {
  std::string_view s(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  auto bad = [&](std::string_view why) {
    return remoteError("grow offer '{}' is malformed: {}", s.substr(0, 64), why);
  };
  if (!s.starts_with("v1 ")) return bad("not version 1");
  s.remove_prefix(3);
  GrowOffer o;
  auto number = [&](int& out, int lo, int hi) -> bool {
    auto sp = s.find(' ');
    if (sp == std::string_view::npos || sp == 0 || sp > 8) return false;
    auto [end, ec] = std::from_chars(s.data(), s.data() + sp, out);
    if (ec != std::errc() || end != s.data() + sp || out < lo || out > hi) return false;
    s.remove_prefix(sp + 1);
    return true;
  };
  if (!number(o.size, 2, 1 << 20)) return bad("the size is not in 2..1048576");
  if (!number(o.rank, 0, o.size - 1)) return bad("the rank is not in 0..size-1");
  if (s.empty() || s.size() > 256) return bad("the prefix is empty or longer than 256");
  for (char ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '/' && ch != '_' && ch != '-')
      return bad("the prefix has a character outside [A-Za-z0-9/_-]");
  o.prefix = std::string(s);
  return o;
}

// The root store (no prefix) holds one queue of joiners for the job: a
// joiner takes ticket t ("grow/joiners"), a grow's rank 0 reserves nnew
// tickets ("grow/reserved") and posts an offer for each ("grow/offer/<t>").
// Then the old ranks and the joiners set up the new communicator under its
// own prefix, as split and shrink do.
Result<std::unique_ptr<Communicator>> Communicator::grow(int nnew) {
  if (nnew < 1 || nranks_ + static_cast<int64_t>(nnew) > (1 << 20))
    return invalidArgument("grow: nnew={} must be >= 1 and leave at most 1048576 ranks", nnew);
  const int epoch = grow_seq_++;
  GrowOffer offer;
  offer.size = nranks_ + nnew;
  offer.prefix = fmt::format("{}grow{}/", prefix_, epoch);
  if (rank_ == 0) {
    CHORUS_ASSIGN_OR_RETURN(int64_t end, base_store_->add("grow/reserved", nnew));
    for (int i = 0; i < nnew; ++i) {
      offer.rank = nranks_ + i;
      CHORUS_RETURN_IF_ERROR(base_store_->set(fmt::format("grow/offer/{}", end - nnew + i),
                                              bootstrap::toBytes(encodeGrowOffer(offer))));
    }
  }
  std::unique_ptr<Communicator> c(new Communicator());
  c->nranks_ = offer.size;
  c->rank_ = rank_;
  CHORUS_RETURN_IF_ERROR(c->setup(id_, cfg_, base_store_, offer.prefix, server_));
  return c;
}

Result<std::unique_ptr<Communicator>> Communicator::join(const bootstrap::UniqueId& id, const Config& cfg) {
  CHORUS_ASSIGN_OR_RETURN(plan::Registry plans, plan::Registry::withPlans(cfg.tune.plan_paths));
  // Any rank but 0: a joiner connects to the store, it never runs it.
  CHORUS_ASSIGN_OR_RETURN(comm::Rendezvous rv, comm::joinRendezvous(-1, id, cfg, false));
  CHORUS_ASSIGN_OR_RETURN(int64_t ticket, rv.store->add("grow/joiners", 1));
  auto raw = rv.store->get(fmt::format("grow/offer/{}", ticket - 1), cfg.timeout);
  if (!raw.isOk())
    return raw.status().withContext(fmt::format(
        "join: no communicator grew to take joiner #{} (did the ranks call chorusCommGrow with enough room?): ",
        ticket - 1));
  CHORUS_ASSIGN_OR_RETURN(GrowOffer offer, parseGrowOffer(*raw));
  std::unique_ptr<Communicator> c(new Communicator());
  c->nranks_ = offer.size;
  c->rank_ = offer.rank;
  c->registry_ = std::move(plans);
  c->registry_loaded_ = true;
  CHORUS_RETURN_IF_ERROR(c->setup(id, cfg, std::move(rv.store), offer.prefix, nullptr));
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
