#include "comm/flight.hpp"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <map>
#include <thread>
#include <nlohmann/json.hpp>

#include "common/dtype.hpp"
#include "plan/plan.hpp"

namespace chorus {

namespace {
// The coarse wall clock (the kernel's last tick, a few ms old at most): the
// recorder says when an operation started and ended for a hang report, and
// reads it twice per operation; CLOCK_REALTIME costs ~24 ns a read on this
// VM, the coarse one a few.
int64_t nowNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME_COARSE, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}
}  // namespace

FlightEntry FlightRecorder::load(const Slot& s) const {
  uint64_t w[kWords];
  for (size_t i = 0; i < kWords; ++i) w[i] = s[i].load(std::memory_order_relaxed);
  FlightEntry e;
  std::memcpy(&e, w, sizeof e);
  return e;
}

// Writes entry e into slot s, and sets the number of entries to `next`,
// inside one odd-version section.
void FlightRecorder::store(Slot& s, const FlightEntry& e, uint64_t next) {
  uint64_t w[kWords];
  std::memcpy(w, &e, sizeof e);
  const uint64_t v = version_.load(std::memory_order_relaxed);
  version_.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // readers see odd before any new word
  for (size_t i = 0; i < kWords; ++i) s[i].store(w[i], std::memory_order_relaxed);
  next_.store(next, std::memory_order_relaxed);
  version_.store(v + 2, std::memory_order_release);
}

void FlightRecorder::start(uint64_t seq, uint8_t coll, int32_t dtype, uint64_t count, int32_t root) {
  FlightEntry e;
  e.seq = seq;
  e.coll = coll;
  e.state = FlightEntry::Running;
  e.dtype = dtype;
  e.count = count;
  e.root = root;
  e.start_ns = nowNs();
  const uint64_t n = next_.load(std::memory_order_relaxed);
  store(ring_[n % kSize], e, n + 1);
  last_ = e;
}

void FlightRecorder::finish(uint64_t seq, bool ok) {
  const uint64_t n = next_.load(std::memory_order_relaxed);
  // Usually the entry just started: the writer's own copy of it.
  if (n > 0 && last_.seq == seq && last_.state == FlightEntry::Running) {
    last_.state = ok ? FlightEntry::Done : FlightEntry::Failed;
    last_.end_ns = nowNs();
    // Only the words holding `state` and `end_ns` change.
    constexpr size_t kStateWord = offsetof(FlightEntry, state) / sizeof(uint64_t);
    constexpr size_t kEndWord = offsetof(FlightEntry, end_ns) / sizeof(uint64_t);
    uint64_t w[kWords];
    std::memcpy(w, &last_, sizeof last_);
    Slot& slot = ring_[(n - 1) % kSize];
    const uint64_t v = version_.load(std::memory_order_relaxed);
    version_.store(v + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    slot[kStateWord].store(w[kStateWord], std::memory_order_relaxed);
    slot[kEndWord].store(w[kEndWord], std::memory_order_relaxed);
    version_.store(v + 2, std::memory_order_release);
    return;
  }
  for (uint64_t k = 0; k < std::min<uint64_t>(n, kSize); ++k) {
    Slot& slot = ring_[(n - 1 - k) % kSize];
    FlightEntry e = load(slot);
    if (e.seq == seq && e.state == FlightEntry::Running) {
      e.state = ok ? FlightEntry::Done : FlightEntry::Failed;
      e.end_ns = nowNs();
      store(slot, e, n);
      return;
    }
  }
}

std::vector<FlightEntry> FlightRecorder::snapshot() const {
  std::vector<FlightEntry> v;
  // The writer holds the version odd for a few stores; a reader that keeps
  // meeting changes (a busy writer) yields now and then and gives up after
  // ~100,000 tries with nothing rather than a torn list: this is a
  // diagnostic, read when the writer is stuck.
  for (int attempt = 0; attempt < 100000; ++attempt) {
    if (attempt % 64 == 63) std::this_thread::yield();
    const uint64_t v1 = version_.load(std::memory_order_acquire);
    if (v1 & 1) continue;
    const uint64_t next = next_.load(std::memory_order_relaxed);
    const uint64_t n = std::min<uint64_t>(next, kSize);
    v.clear();
    for (uint64_t k = 0; k < n; ++k) v.push_back(load(ring_[(next - n + k) % kSize]));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (version_.load(std::memory_order_relaxed) == v1) return v;
  }
  return {};
}

FlightSummary FlightRecorder::summary(int rank) const {
  FlightSummary s;
  s.rank = rank;
  s.pid = static_cast<int32_t>(getpid());
  for (const FlightEntry& e : snapshot()) {
    // A failed operation breaks the communicator: it is where the rank
    // stopped, so it stays "current" (a rank that just timed out in an
    // allgather is in that allgather, not in no collective).
    if (e.state == FlightEntry::Running || e.state == FlightEntry::Failed) {
      s.current = e;
      s.has_current = 1;
    } else if (e.state == FlightEntry::Done) {
      s.last = e;
      s.has_last = 1;
    }
  }
  return s;
}

std::string describeEntry(const FlightEntry& e) {
  const auto c = static_cast<plan::Collective>(e.coll);
  std::string d = fmt::format("{} #{}", plan::collectiveName(c), e.seq);
  if (c != plan::Collective::Barrier)
    d += fmt::format(" (count={} {})", e.count, dtypeName(static_cast<chorusDataType_t>(e.dtype)));
  return d;
}

namespace {
std::string rankList(const std::vector<int>& r) {
  std::string s;
  for (size_t i = 0; i < r.size(); ++i) s += fmt::format("{}{}", i ? "," : "", r[i]);
  return s;
}
}  // namespace

std::string diagnoseHang(const FlightEntry& stuck, const std::vector<FlightSummary>& ranks, bool offline) {
  std::vector<int> waiting, gave_up, silent;
  std::vector<std::string> elsewhere;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const FlightSummary& s = ranks[r];
    const int rank = static_cast<int>(r);
    if (s.rank < 0) {
      silent.push_back(rank);
      continue;
    }
    if (s.has_current && s.current.seq == stuck.seq && s.current.coll == stuck.coll) {
      (s.current.state == FlightEntry::Failed ? gave_up : waiting).push_back(rank);
      continue;
    }
    std::string where = fmt::format("rank {} ", rank);
    where += s.has_last ? fmt::format("last completed {}", describeEntry(s.last)) : "completed nothing yet";
    where += !s.has_current ? std::string(" and is in no collective")
             : s.current.state == FlightEntry::Failed ? fmt::format(" and failed in {}", describeEntry(s.current))
                                                      : fmt::format(" and is in {}", describeEntry(s.current));
    elsewhere.push_back(where);
  }
  std::string msg;
  if (!waiting.empty()) msg += fmt::format("ranks {} are waiting in it", rankList(waiting));
  if (!gave_up.empty())
    msg += fmt::format("{}ranks {} stopped in it (timed out or aborted)", msg.empty() ? "" : "; ", rankList(gave_up));
  for (const auto& e : elsewhere) msg += (msg.empty() ? "" : "; ") + e;
  if (!silent.empty()) {
    if (offline)
      for (int r : silent)
        msg += fmt::format("{}rank {}: no flight record (did it start? did it die before it could write one?)",
                           msg.empty() ? "" : "; ", r);
    else
      msg += fmt::format("{}rank(s) {} did not answer (dead, or unreachable)", msg.empty() ? "" : "; ", rankList(silent));
  }
  return msg;
}

std::string flightJson(int rank, int nranks, const std::vector<FlightEntry>& entries) {
  nlohmann::json j;
  j["rank"] = rank;
  j["nranks"] = nranks;
  j["pid"] = getpid();
  j["ops"] = nlohmann::json::array();
  for (const FlightEntry& e : entries) {
    static const char* states[] = {"?", "running", "done", "failed"};
    j["ops"].push_back({{"seq", e.seq},
                        {"collective", plan::collectiveName(static_cast<plan::Collective>(e.coll))},
                        {"state", states[e.state < 4 ? e.state : 0]},
                        {"dtype", dtypeName(static_cast<chorusDataType_t>(e.dtype))},
                        {"count", e.count},
                        {"root", e.root},
                        {"start_ns", e.start_ns},
                        {"end_ns", e.end_ns}});
  }
  return j.dump(1) + "\n";
}

Result<FlightSummary> summaryFromJson(const std::string& text, int* nranks) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalidArgument("flight record is not a JSON object");
  if (!j.contains("rank") || !j["rank"].is_number_integer()) return invalidArgument("flight record lacks 'rank'");
  if (!j.contains("ops") || !j["ops"].is_array()) return invalidArgument("flight record lacks 'ops'");
  FlightSummary s;
  s.rank = j["rank"].get<int>();
  if (nranks && j.contains("nranks") && j["nranks"].is_number_integer()) *nranks = j["nranks"].get<int>();
  for (const auto& op : j["ops"]) {
    FlightEntry e;
    plan::Collective c;
    if (!op.contains("collective") || !op["collective"].is_string() ||
        !plan::parseCollective(op["collective"].get<std::string>(), &c))
      return invalidArgument("flight record of rank {}: bad 'collective'", s.rank);
    e.coll = static_cast<uint8_t>(c);
    e.seq = op.value("seq", uint64_t{0});
    e.count = op.value("count", uint64_t{0});
    chorusDataType_t d = chorusFloat32;
    parseDtype(op.value("dtype", std::string("float32")), &d);
    e.dtype = d;
    const std::string st = op.value("state", std::string());
    e.state = st == "running" ? FlightEntry::Running : st == "done" ? FlightEntry::Done : FlightEntry::Failed;
    if (e.state == FlightEntry::Running || e.state == FlightEntry::Failed) {  // as summary()
      s.current = e;
      s.has_current = 1;
    } else if (e.state == FlightEntry::Done) {
      s.last = e;
      s.has_last = 1;
    }
  }
  return s;
}

}  // namespace chorus
