#include "comm/health.hpp"


#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <filesystem>

namespace chorus::comm {

using plan::Collective;

namespace {
// Where a rank that found a mismatch in operation seq leaves its message.
std::string verdictKey(uint64_t seq) { return fmt::format("verdict/{}", seq); }
}  // namespace

Health::~Health() { stopWatchdog(); }

Status Health::makeFlightDir(const std::string& dir) {
  if (dir.empty()) return {};
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    return invalidArgument("CHORUS_FLIGHT_DIR='{}' cannot be created: {}", dir,
                           ec ? ec.message() : std::string("it exists and is not a directory"));
  return {};
}

void Health::bind(int rank, int nranks, const Config& cfg, bootstrap::Store* store) {
  rank_ = rank;
  nranks_ = nranks;
  timeout_ = cfg.timeout;
  protect_ = cfg.net.wire_protect;
  check_ = cfg.check;
  flight_dir_ = cfg.flight.dir;
  store_ = store;
}

Status Health::startWatchdog(const bootstrap::UniqueId& id, const std::string& prefix, Resync resync,
                             std::chrono::milliseconds resync_period, std::function<void(int)> on_revoke) {
  on_revoke_ = std::move(on_revoke);
  if (nranks_ < 2) return {};
  auto ws = bootstrap::connectStore(id.root, id.secret, timeout_, protect_);
  if (!ws.isOk()) return ws.status().withContext(fmt::format("rank {}: watchdog store connection: ", rank_));
  watch_store_ = std::make_shared<bootstrap::PrefixStore>(ws.value(), prefix);
  watchdog_ = std::thread([this, resync = std::move(resync), resync_period] { watchdogLoop(resync, resync_period); });
  return {};
}

void Health::stopWatchdog() {
  if (!watchdog_.joinable()) return;  // never started, or stopped already
  watch_store_->interrupt();
  watchdog_.join();
}

// Parks on the store until some rank posts probe k, answers with this rank's
// flight summary, and waits for probe k+1.  A blocked GET costs nothing;
// stopWatchdog interrupts it.
void Health::watchdogLoop(const Resync& resync, std::chrono::milliseconds resync_period) {
  const auto period = resync ? resync_period : std::chrono::hours(24);
  for (uint64_t k = 0;; ++k) {
    bootstrap::Bytes value;
    for (;;) {
      auto probe = watch_store_->get(fmt::format("probe/{}", k), period);
      if (probe.isOk()) {
        value = std::move(*probe);
        break;
      }
      if (probe.status().code() != chorusTimeout) return;  // interrupted, or the store is gone
      if (resync && !resync(*watch_store_)) return;
    }
    // A revoke notice (Communicator::revoke): break this communicator; no
    // probe after it matters.
    if (std::string v = bootstrap::toString(value); v.starts_with("revoke ")) {
      int by = -1;
      auto [end, ec] = std::from_chars(v.data() + 7, v.data() + v.size(), by);
      if (ec != std::errc() || end != v.data() + v.size() || by < 0 || by >= nranks_) by = -1;
      if (on_revoke_) on_revoke_(by);
      return;
    }
    FlightSummary s = flight_.summary(rank_);
    if (!watch_store_->set(fmt::format("flight/{}/{}", k, rank_), bootstrap::toBytes(s)).isOk()) return;
  }
}

// The mismatch another rank reported for operation seq or, having finished
// it (a root that only sent), for one of its next two; "" when none did.
std::string Health::peerVerdict(uint64_t seq) {
  for (uint64_t s = seq; s < seq + 3; ++s)
    if (auto v = store_->get(verdictKey(s), std::chrono::milliseconds(1)); v.isOk())
      return bootstrap::toString(v.value());
  return {};
}

Status Health::explainTimeout(const Status& st, const FlightEntry& stuck) {
  auto k = store_->add("probe-count", 1);
  if (!k.isOk()) return st;
  const uint64_t probe = static_cast<uint64_t>(k.value() - 1);
  if (!store_->set(fmt::format("probe/{}", probe), bootstrap::toBytes(std::string_view("1"))).isOk()) return st;
  // Every rank's watchdog answers at once unless the rank is dead or cut off.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  std::vector<FlightSummary> sums(nranks_);
  for (int r = 0; r < nranks_; ++r) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    auto b = store_->get(fmt::format("flight/{}/{}", probe, r), std::max(left, std::chrono::milliseconds(1)));
    if (b.isOk() && b->size() == sizeof(FlightSummary)) std::memcpy(&sums[r], b->data(), sizeof(FlightSummary));
    if (sums[r].magic != FlightSummary{}.magic) sums[r] = FlightSummary{};
  }
  // Ranks whose operation of some number has other arguments than this
  // rank's of that number (ranks that disagree on a root may all wait to
  // receive, so no message tells): a mismatch.  Compared against this rank's
  // recorder, so a peer that finished the disputed call and went on is caught too.
  const std::vector<FlightEntry> history = flight_.snapshot();
  auto mineOf = [&](uint64_t seq) -> const FlightEntry* {
    for (const FlightEntry& e : history)
      if (e.seq == seq) return &e;
    return nullptr;
  };
  std::string diffs;
  for (int r = 0; r < nranks_; ++r) {
    const FlightSummary& s = sums[r];
    if (r == rank_ || s.rank < 0) continue;
    for (int which = 0; which < 2; ++which) {
      if (which == 0 ? !s.has_current : !s.has_last) continue;
      const FlightEntry& e = which == 0 ? s.current : s.last;
      const FlightEntry* m = mineOf(e.seq);
      if (m == nullptr) continue;
      // As signatures (the flight record has no op): the root counts where
      // both are in the same rooted collective.
      const bool roots = e.coll == m->coll && comm::rooted(static_cast<Collective>(m->coll));
      auto asSignature = [&](const FlightEntry& x) {
        Signature g;
        g.seq = x.seq;
        g.coll = x.coll;
        g.dtype = x.dtype;
        g.count = x.count;
        g.root = roots ? x.root : 0;
        return g;
      };
      const Signature theirs = asSignature(e), mine = asSignature(*m);
      if (!(theirs == mine))
        diffs += fmt::format("; rank {} {} {} root={} where this rank {} {} root={} (differs in {})", r,
                             which == 0 ? "is in" : "completed", describeEntry(e), e.root,
                             m->state == FlightEntry::Done ? "completed" : "is in", describeEntry(*m), m->root,
                             differing(theirs, mine));
    }
  }
  if (!diffs.empty()) {
    Status v = makeError(chorusMismatch,
                         "rank {}: collective mismatch, found when {} timed out after {} ms{} (are all ranks calling "
                         "the same collectives with the same count, dtype, op and root?)",
                         rank_, describeEntry(stuck), timeout_.count(), diffs);
    // For the ranks whose probe this rank no longer answers once it is gone.
    (void)store_->set(verdictKey(stuck.seq), bootstrap::toBytes(std::string_view(v.message())));
    return v;
  }
  if (std::string why = peerVerdict(stuck.seq); !why.empty())
    return makeError(chorusMismatch, "rank {}: {} timed out after {} ms; another rank found why: {}", rank_,
                     describeEntry(stuck), timeout_.count(), why);
  return makeError(st.code(), "rank {}: {} timed out after {} ms: {} [{}]", rank_, describeEntry(stuck),
                   timeout_.count(), diagnoseHang(stuck, sums), st.message());
}

void Health::dumpFlight() const {
  const std::string& dir = flight_dir_;
  if (dir.empty()) return;
  const std::string path = fmt::format("{}/flight-rank{}-pid{}.json", dir, rank_, getpid());
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    const std::string j = flightJson(rank_, nranks_, flight_.snapshot());
    std::fwrite(j.data(), 1, j.size(), f);
    std::fclose(f);
  }
}

Status Health::checkSignatures(const Signature& mine, uint64_t seq, exec::Executor& executor,
                               const plan::Registry& registry, bool* broke) {
  if (mine.nops == 0) return {};  // point-to-point only: nothing all ranks share
  checked_once_ = true;
  const size_t sz = sizeof(Signature);
  if (sig_program_.steps.empty() && nranks_ > 1) {
    plan::Shape sh;
    sh.coll = Collective::AllGather;
    sh.nranks = nranks_;
    sh.count = sz;
    sh.elem_size = 1;
    const plan::Algorithm* bruck = registry.find(Collective::AllGather, "bruck");
    if (bruck == nullptr) bruck = registry.find(Collective::AllGather, "ring");
    plan::expand(*bruck, sh, rank_, &sig_program_);
  }
  sig_buf_.resize(sz * (nranks_ + 1));
  std::memcpy(sig_buf_.data() + sz * nranks_, &mine, sz);
  std::array<std::byte*, 3> bufs = {sig_buf_.data() + sz * nranks_, sig_buf_.data(), nullptr};
  std::vector<std::byte> scratch(sig_program_.scratch_elems);
  bufs[2] = scratch.data();
  const exec::Job job{.program = &sig_program_, .buffers = bufs, .elem_size = 1,
                      .trace_seq = (uint64_t{1} << 62) | seq};  // trace: a signature check
  if (nranks_ > 1) {
    Status st = executor.run(std::span<const exec::Job>(&job, 1), timeout_);
    if (!st.isOk()) {
      *broke = true;
      return st;
    }
  }
  std::vector<Signature> all(nranks_);
  for (int r = 0; r < nranks_; ++r) std::memcpy(&all[r], sig_buf_.data() + sz * r, sz);
  all[rank_] = mine;
  // Report against rank 0's call (the same text on every rank).
  std::string diffs;
  int ndiff = 0;
  for (int r = 1; r < nranks_; ++r) {
    if (all[r] == all[0]) continue;
    if (++ndiff <= 4)
      diffs += fmt::format("; rank {} called {} (differs in {})", r, describe(all[r]), differing(all[r], all[0]));
  }
  if (ndiff == 0) return {};
  if (ndiff > 4) diffs += fmt::format("; and {} more rank(s)", ndiff - 4);
  return makeError(chorusMismatch,
                   "rank {}: collective mismatch: rank 0 called {}{} (are all ranks calling the same collectives "
                   "in the same order with the same count, dtype, op and root?)",
                   rank_, describe(all[0]), diffs);
}

FlightEntry Health::begin(std::span<OpDesc> ops, uint64_t* op_seq, uint64_t* p2p_seq) {
  const uint64_t first_seq = *op_seq;
  FlightEntry stuck;
  for (OpDesc& o : ops) {
    if (o.pointToPoint()) {
      o.trace_seq = (uint64_t{1} << 63) | (*p2p_seq)++;
      continue;
    }
    o.trace_seq = *op_seq;
    if (*op_seq == first_seq) {
      stuck.seq = *op_seq;
      stuck.coll = static_cast<uint8_t>(o.coll);
      stuck.dtype = o.dtype;
      stuck.count = o.count;
      stuck.root = o.root;
    }
    flight_.start((*op_seq)++, static_cast<uint8_t>(o.coll), o.dtype, o.count, o.root);
  }
  return stuck;
}

Status Health::conclude(Status st, bool breaks, uint64_t first_seq, uint64_t op_seq, const FlightEntry& stuck) {
  // Ask the other ranks where they are while they are still waiting (and
  // this rank still shows as in the operation); the caller then breaks the
  // communicator, which releases them.
  if (breaks && st.code() == chorusTimeout && op_seq > first_seq) st = explainTimeout(st, stuck);
  // Say which operation the failure hit (the transport's message names the
  // peer and its address; the flight number ties it to every rank's view).
  if (breaks && st.code() != chorusTimeout) {
    const bool p2p_only = op_seq == first_seq;
    st = st.withContext(p2p_only ? fmt::format("rank {}: in a group of sends/receives: ", rank_)
                                 : fmt::format("rank {}: in {}: ", rank_, describeEntry(stuck)));
  }
  for (uint64_t s = first_seq; s < op_seq; ++s) flight_.finish(s, st.isOk());
  // A mismatch found here is the verdict for ranks that only time out in
  // the same call (explainTimeout reads it): this rank may be gone by then.
  if (st.code() == chorusMismatch && op_seq > first_seq)
    (void)store_->set(verdictKey(first_seq), bootstrap::toBytes(std::string_view(st.message())));
  return st;
}

}  // namespace chorus::comm
